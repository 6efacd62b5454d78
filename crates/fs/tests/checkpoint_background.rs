//! Checkpoints run outside the commit path (issue 11: "incremental checkpoints, never
//! stop-the-world ... a writer waits only when the journal is full"). With a checkpoint's
//! page write held at the device, a create and its `fsync` complete; with the journal
//! full, commits wait for the checkpoint (bounded back-pressure) and then proceed, and
//! every acknowledged transaction survives a crash.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{dyns, quiet, sims};
use stripefs::{Checkpoints, CreateParams, Fs, Ino, MkfsOptions, MountOptions, SyncScope};
use stripefs_target::{CrashMode, GateTarget, IoOp, SimTarget, Target};

const WAIT: Duration = Duration::from_secs(20);

fn background() -> MountOptions {
    MountOptions {
        checkpoints: Checkpoints::Background,
        ..quiet()
    }
}

/// mkfs on `s` with a `journal`-byte journal; gates over every target.
fn gated(s: &[Arc<SimTarget>], journal: Option<u64>) -> Vec<Arc<GateTarget>> {
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 65536,
        journal_bytes: journal,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(s), &opts).expect("mkfs");
    s.iter()
        .map(|t| Arc::new(GateTarget::new(Arc::clone(t) as Arc<dyn Target>)))
        .collect()
}

fn as_targets(g: &[Arc<GateTarget>]) -> Vec<Arc<dyn Target>> {
    g.iter().map(|t| Arc::clone(t) as Arc<dyn Target>).collect()
}

/// Holds the next plain write on every target: with only metadata operations running,
/// those are the checkpoint's page writes (the journal is written with FUA).
fn hold_page_writes(g: &[Arc<GateTarget>]) {
    for t in g {
        t.hold_next(|op| matches!(op, IoOp::Write { .. }));
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

fn create_synced(fs: &Fs, name: &str) {
    let f = fs
        .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    fs.fsync(f.ino, SyncScope::All)
        .unwrap_or_else(|e| panic!("fsync {name}: {e}"));
}

fn count_entries(fs: &Fs) -> usize {
    fs.readdir(Ino::ROOT).expect("readdir").len()
}

#[test]
fn a_commit_proceeds_while_a_checkpoint_writes_its_pages() {
    let s = sims(2, 64 << 20);
    let g = gated(&s, None);
    let (fs, _) = Fs::mount(as_targets(&g), background()).expect("mount");
    let fs = Arc::new(fs);
    for i in 0..300 {
        create_synced(&fs, &format!("f{i}"));
    }
    hold_page_writes(&g);
    let ckpt = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || fs.checkpoint())
    };
    wait_until("a checkpoint page write is held", || {
        g.iter().any(|t| t.is_holding())
    });
    let (tx, rx) = mpsc::channel();
    let writer = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || {
            create_synced(&fs, "late");
            tx.send(()).unwrap();
        })
    };
    let done = rx.recv_timeout(WAIT);
    let still_held = g.iter().any(|t| t.is_holding());
    for t in &g {
        t.release();
    }
    writer.join().unwrap();
    ckpt.join().unwrap().expect("the held checkpoint completes");
    assert!(
        done.is_ok() && still_held,
        "create + fsync did not complete while the checkpoint's page write was held"
    );
    let fs = Arc::into_inner(fs).expect("one owner");
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("remount");
    assert_eq!(count_entries(&fs), 301, "every file");
    fs.unmount().unwrap();
}

/// A 64 KiB journal and a checkpoint held at the device: commits fill the journal, then
/// wait (they do not fail, and nothing is lost); once the device lets the checkpoint
/// through they go on, and after a crash every acknowledged file is there.
#[test]
fn a_full_journal_makes_commits_wait_for_the_checkpoint() {
    let s = sims(2, 64 << 20);
    let g = gated(&s, Some(64 << 10));
    let (fs, _) = Fs::mount(as_targets(&g), background()).expect("mount");
    let fs = Arc::new(fs);
    hold_page_writes(&g);
    const FILES: usize = 1500;
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (fs, made) = (Arc::clone(&fs), Arc::clone(&made));
        thread::spawn(move || {
            for i in 0..FILES {
                create_synced(&fs, &format!("file-with-a-longer-name-{i:05}"));
                made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    wait_until("a commit waits for room in the journal", || {
        fs.status().journal_full_waits > 0
    });
    // The writer is stuck behind the held checkpoint, not failing.
    let stuck = made.load(std::sync::atomic::Ordering::SeqCst);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        made.load(std::sync::atomic::Ordering::SeqCst),
        stuck,
        "a commit went on with the journal full"
    );
    assert!(stuck < FILES, "the journal never filled");
    for t in &g {
        t.release();
    }
    writer.join().expect("every create and fsync succeeds");
    let st = fs.status();
    assert!(st.checkpoints >= 2, "{} checkpoints", st.checkpoints);
    let fs = Arc::into_inner(fs).expect("one owner");
    fs.debug_stop_background();
    std::mem::forget(fs); // a crash: no unmount
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("remount after the crash");
    assert_eq!(count_entries(&fs), FILES, "every acknowledged file");
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {});
    drop(fs);
    assert!(report.expect("fsck").is_clean());
}

/// A commit that finds the journal full while the checkpointer's checkpoint is writing
/// waits for that checkpoint only: its tail move leaves room, so the commit does not
/// apply the rest of the queue and write a second checkpoint itself (which, at a
/// million files, was the 9-15 s `fsync` of BENCHMARKS.md).
#[test]
fn a_full_journal_waits_for_the_running_checkpoint_only() {
    let s = sims(2, 64 << 20);
    let g = gated(&s, Some(256 << 10));
    let (fs, _) = Fs::mount(as_targets(&g), background()).expect("mount");
    let fs = Arc::new(fs);
    hold_page_writes(&g);
    // The writer pauses at half a journal (past the checkpointer's wake-up, short of
    // full) until the checkpointer's page write is held, then fills the journal and
    // stops after the first commit that waited for room.
    let writer = {
        let (fs, g) = (Arc::clone(&fs), g.clone());
        thread::spawn(move || {
            for i in 0..5000 {
                create_synced(&fs, &format!("file-with-a-longer-name-{i:05}"));
                let st = fs.status();
                if st.journal_full_waits > 0 {
                    return st;
                }
                if st.journal.head - st.journal.tail >= st.journal_units / 2 {
                    wait_until("the checkpointer writes its pages", || {
                        g.iter().any(|t| t.is_holding())
                    });
                }
            }
            panic!("the journal never filled");
        })
    };
    wait_until("a commit waits for room in the journal", || {
        fs.status().journal_full_waits > 0
    });
    for t in &g {
        t.release();
    }
    let st = writer.join().expect("every create and fsync succeeds");
    assert_eq!(
        st.journal_full_waits, 1,
        "one commit found the journal full"
    );
    assert_eq!(
        st.journal_full_checkpoints, 0,
        "the waiting commit wrote a checkpoint of its own"
    );
    let fs = Arc::into_inner(fs).expect("one owner");
    fs.unmount().expect("unmount");
}

/// Regression for the 10-million-file run (decisions.md, 125): an unmount's checkpoint
/// applied the whole apply queue at once and pinned every tree page it dirtied until its
/// single write (367-398 MiB at the two unmounts against 220 MiB during the creates). With
/// the checkpointer stopped so the queue grows to tens of thousands of records, the
/// unmount must keep its pinned pages within the page cache budget: it writes a
/// checkpoint whenever they pass half of it, then the last one; and all files survive.
#[test]
fn an_unmount_applying_a_long_queue_keeps_its_pinned_pages_within_meta_cache() {
    const CACHE: u64 = 4 << 20;
    const DIRS: usize = 200;
    const FILES: usize = 30_000;
    let s = sims(2, 128 << 20);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 65536,
        journal_bytes: Some(48 << 20),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).expect("mkfs");
    let o = MountOptions {
        meta_cache: stripefs::MetaCacheBytes(CACHE),
        inode_cache: Some(stripefs::InodeBound(1 << 20)),
        ..background()
    };
    let (fs, _) = Fs::mount(dyns(&s), o.clone()).expect("mount");
    fs.debug_stop_background();
    let dirs = common::root_dirs(&fs, DIRS);
    for i in 0..FILES {
        fs.create(
            dirs[i % DIRS],
            format!("f{i}").as_ref(),
            CreateParams::with_perm(0o644),
        )
        .expect("create");
        if i % 1000 == 999 {
            fs.sync().expect("sync"); // a commit: the transaction joins the apply queue
        }
    }
    let queued = fs.status().journal_queued_records;
    assert!(
        queued >= FILES / 2,
        "the queue holds most creates: {queued} records"
    );
    fs.unmount().expect("unmount");
    let peak = fs.status().meta_pinned_peak_bytes;
    assert!(
        peak <= CACHE,
        "the unmount pinned {peak} bytes of tree pages, past the {CACHE}-byte meta_cache"
    );
    let (fs, _) = Fs::mount(dyns(&s), o).expect("mount again");
    let n: usize = dirs_entries(&fs, DIRS);
    assert_eq!(n, FILES, "every file survives the unmount");
    fs.unmount().expect("unmount");
}

fn dirs_entries(fs: &Fs, dirs: usize) -> usize {
    (0..dirs)
        .map(|d| {
            let ino = fs
                .lookup(Ino::ROOT, format!("d{d}").as_ref())
                .expect("lookup")
                .ino;
            fs.readdir(ino).expect("readdir").len()
        })
        .sum()
}

//! Entry changes read the pages they look up before they take the metadata lock
//! (issue 11, "no global lock is held across a metadata page read"): a create, link,
//! unlink or rename in a directory whose entry leaf is not cached reads it ahead, so a
//! change of another file, which needs the lock, does not wait for that read. Every
//! page read the change's thread makes is held in turn, and each must leave the lock
//! free.
mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{dyns, quiet, sims};
use stripefs::{CreateParams, Fs, Ino, MkfsOptions, SetAttr};
use stripefs_target::{GateTarget, IoOp, Target};

const ENTRIES: u64 = 1500;

/// A file system with a directory `d` of `ENTRIES` entries (their leaves far from the
/// root's), unmounted; remounted through gates, with file `r` in the root resident.
fn setup() -> (Arc<Fs>, Vec<Arc<GateTarget>>, Ino, Ino) {
    let s = sims(2, 64 << 20);
    let m = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &m).unwrap();
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    for n in 0..ENTRIES {
        let name = format!("entry-{n}");
        fs.create(d, name.as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
    }
    fs.create(Ino::ROOT, "r".as_ref(), CreateParams::with_perm(0o600))
        .unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let gates: Vec<Arc<GateTarget>> = s
        .iter()
        .map(|t| Arc::new(GateTarget::new(Arc::clone(t) as Arc<dyn Target>)))
        .collect();
    let targets = gates
        .iter()
        .map(|g| Arc::clone(g) as Arc<dyn Target>)
        .collect();
    let fs = Arc::new(Fs::mount(targets, quiet()).unwrap().0);
    let r = fs.lookup(Ino::ROOT, "r".as_ref()).unwrap().ino;
    fs.getattr(r).unwrap();
    let d = fs.lookup(Ino::ROOT, "d".as_ref()).unwrap().ino;
    (fs, gates, d, r)
}

/// Runs `change` with each page read it makes held at the device in turn (the change's
/// own thread's reads: the checkpointer's pass); while each is held, a chmod of the
/// resident file `r` (which takes the metadata lock) must complete, so no read of the
/// change is made under the lock.
fn chmod_passes_every_held_read(what: &str, change: impl FnOnce(&Fs, Ino) + Send + 'static) {
    let (fs, gates, d, r) = setup();
    let (go, wait) = mpsc::channel::<()>();
    let changer = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || {
            wait.recv().unwrap();
            change(&fs, d);
        })
    };
    let me = changer.thread().id();
    let its_reads =
        move |op: &IoOp| matches!(op, IoOp::Read { .. }) && thread::current().id() == me;
    for g in &gates {
        g.hold_next(its_reads);
    }
    go.send(()).unwrap();
    let mut held = 0;
    let mut mode = 0o640;
    loop {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !gates.iter().any(|g| g.is_holding()) && !changer.is_finished() {
            assert!(
                Instant::now() < deadline,
                "{what}: neither reads nor finishes"
            );
            thread::sleep(Duration::from_millis(1));
        }
        if !gates.iter().any(|g| g.is_holding()) {
            break;
        }
        held += 1;
        let (tx, rx) = mpsc::channel();
        {
            let fs = Arc::clone(&fs);
            thread::spawn(move || {
                let chmod = SetAttr {
                    mode: Some(mode),
                    ..SetAttr::default()
                };
                tx.send(fs.setattr(r, &chmod).map(|a| a.mode & 0o7777))
                    .unwrap();
            });
        }
        let Ok(done) = rx.recv_timeout(Duration::from_secs(20)) else {
            gates.iter().for_each(|g| g.release());
            panic!("{what}: a chmod of another file waited for the change's held page read {held}");
        };
        assert_eq!(done.unwrap(), mode);
        mode ^= 0o004;
        for g in gates.iter().filter(|g| g.is_holding()) {
            g.release_and_hold_next(its_reads);
        }
    }
    gates.iter().for_each(|g| g.release());
    changer.join().unwrap();
    assert!(held > 0, "{what}: reads a metadata page");
    fs.unmount().unwrap();
}

#[test]
fn a_create_reads_its_entry_leaf_before_the_metadata_lock() {
    // Eight names: where a name lands depends on the file system's random uuid (the
    // name hash), and one name's leaves were already cached in about 1 run of 13
    // (no read to hold, `held == 0`); eight make that vanishingly rare.
    chmod_passes_every_held_read("create", |fs, d| {
        for k in 0..8 {
            let name = format!("entry-new-{k}");
            fs.create(d, name.as_ref(), CreateParams::with_perm(0o644))
                .unwrap();
            assert!(fs.lookup(d, name.as_ref()).is_ok());
        }
    });
}

#[test]
fn an_unlink_reads_its_entry_leaf_and_inode_before_the_metadata_lock() {
    chmod_passes_every_held_read("unlink", |fs, d| {
        fs.unlink(d, "entry-700".as_ref()).unwrap();
        assert!(fs.lookup(d, "entry-700".as_ref()).is_err());
    });
}

#[test]
fn a_rename_reads_both_entry_leaves_before_the_metadata_lock() {
    chmod_passes_every_held_read("rename", |fs, d| {
        fs.rename(
            d,
            "entry-900".as_ref(),
            d,
            "entry-900-renamed".as_ref(),
            stripefs::RenameMode::Replace,
        )
        .unwrap();
        assert!(fs.lookup(d, "entry-900-renamed".as_ref()).is_ok());
    });
}

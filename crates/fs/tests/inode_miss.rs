//! An inode missing from core is read from the metadata trees without the metadata lock
//! (`docs/design/metadata.md`, "Inode misses"): a miss in one place does not stall
//! operations on other files, and a read that raced a change is never kept.
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{dyns, quiet, sims};
use stripefs::{
    Checkpoints, CreateParams, Fs, FsError, Ino, InodeBound, MkfsOptions, SetAttr, XattrMode,
};
use stripefs_target::{GateTarget, IoOp, Target};

const FILES: u64 = 1200;

fn name(n: u64) -> String {
    format!("f{n}")
}

/// Perm bits file `n` is given.
fn perm_of(n: u64) -> u16 {
    0o600 | (n % 64) as u16
}

#[test]
fn a_stat_completes_while_another_files_miss_is_reading() {
    let s = sims(2, 64 << 20);
    let m = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &m).unwrap();
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let inos: Vec<Ino> = (0..FILES)
        .map(|n| {
            fs.create(
                Ino::ROOT,
                name(n).as_ref(),
                CreateParams::with_perm(perm_of(n)),
            )
            .unwrap()
            .ino
        })
        .collect();
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
    // The root directory and the first file in core; the last file is not, and its
    // inode's leaf is far from the first's (1200 inode items span many leaves).
    let first = fs.lookup(Ino::ROOT, name(0).as_ref()).unwrap();
    assert_eq!(first.ino, inos[0]);
    let last = inos[FILES as usize - 1];
    for g in &gates {
        g.hold_next(|op| matches!(op, IoOp::Read { .. }));
    }
    let missing = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || fs.getattr(last))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !gates.iter().any(|g| g.is_holding()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the miss of the last file reads a metadata page"
        );
        thread::sleep(Duration::from_millis(1));
    }
    // That miss is now inside its page read. Operations on resident files must not
    // wait for it.
    let (tx, rx) = mpsc::channel();
    {
        let fs = Arc::clone(&fs);
        let ino = inos[0];
        thread::spawn(move || {
            let a = fs.getattr(ino).map(|a| (a.ino, (a.mode & 0o7777) as u16));
            let b = fs
                .lookup(Ino::ROOT, name(0).as_ref())
                .map(|a| (a.ino, (a.mode & 0o7777) as u16));
            tx.send((a, b)).unwrap();
        });
    }
    let done = rx.recv_timeout(Duration::from_secs(20));
    let still_held = gates.iter().any(|g| g.is_holding());
    gates.iter().for_each(|g| g.release());
    let (a, b) = done.expect(
        "a stat and a lookup of a resident file completed while another file's miss was \
         held in its page read",
    );
    assert!(still_held, "the held read was still in progress");
    assert_eq!(a.unwrap(), (inos[0], perm_of(0)));
    assert_eq!(b.unwrap(), (inos[0], perm_of(0)));
    let got = missing.join().unwrap().unwrap();
    assert_eq!(
        (got.ino, (got.mode & 0o7777) as u16),
        (last, perm_of(FILES - 1))
    );
    fs.unmount().unwrap();
}

/// A read made without the lock that saw the trees before a change is not kept: the
/// reader's scan of an inode with three batches of items is held at the device in its last
/// batch (the first, with the attributes, already read) while the inode is read by
/// another call, changed, checkpointed and evicted; released, the read is stale and must
/// be discarded (the epoch moved), or the old attributes would come back.
#[test]
fn a_read_that_raced_a_change_and_an_eviction_is_not_kept() {
    const XATTRS: u64 = 1200;
    let s = sims(2, 64 << 20);
    let m = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &m).unwrap();
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let y = fs
        .create(Ino::ROOT, "y".as_ref(), CreateParams::with_perm(0o644))
        .unwrap()
        .ino;
    let x = fs
        .create(Ino::ROOT, "x".as_ref(), CreateParams::with_perm(0o640))
        .unwrap()
        .ino;
    for i in 0..XATTRS {
        let n = format!("user.{i}");
        fs.setxattr(x, n.as_ref(), &i.to_le_bytes(), XattrMode::Any)
            .unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let gates: Vec<Arc<GateTarget>> = s
        .iter()
        .map(|t| Arc::new(GateTarget::new(Arc::clone(t) as Arc<dyn Target>)))
        .collect();
    let targets: Vec<Arc<dyn Target>> = gates
        .iter()
        .map(|g| Arc::clone(g) as Arc<dyn Target>)
        .collect();
    // The reads a cold stat of x makes after a stat of y, in order: the last one is a
    // leaf of x's last batch of items (a dry run on an identical, fresh mount).
    let last_read = {
        let fs = Fs::mount(targets.clone(), quiet()).unwrap().0;
        fs.getattr(y).unwrap();
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        for (t, g) in gates.iter().enumerate() {
            let seen = Arc::clone(&seen);
            g.hold_next(move |op| {
                if let IoOp::Read { offset, .. } = op {
                    seen.lock().push((t, *offset));
                }
                false
            });
        }
        assert_eq!(fs.getattr(x).unwrap().mode & 0o7777, 0o640);
        gates.iter().for_each(|g| g.release());
        fs.unmount().unwrap();
        let seen = seen.lock();
        assert!(seen.len() >= 3, "x's items span several leaves: {seen:?}");
        *seen.last().unwrap()
    };
    let fs = Arc::new(Fs::mount(targets, quiet()).unwrap().0);
    fs.getattr(y).unwrap();
    let (t, at) = last_read;
    gates[t].hold_next(move |op| matches!(op, IoOp::Read { offset, .. } if *offset == at));
    let reader = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || fs.getattr(x).map(|a| a.mode & 0o7777))
    };
    assert!(
        gates[t].wait_held(Duration::from_secs(60)),
        "the reader's last leaf read was held"
    );
    // The reader has x's attributes from its first batch. Change them, apply them to the
    // trees and evict x, while that read is held.
    let (tx, rx) = mpsc::channel();
    {
        let fs = Arc::clone(&fs);
        thread::spawn(move || {
            let set = SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            };
            let r = fs.setattr(x, &set).and_then(|_| fs.checkpoint()).map(|()| {
                fs.debug_evict_inodes();
                fs.debug_evict_inodes();
                fs.status().meta_inodes
            });
            tx.send(r).unwrap();
        });
    }
    let changed = rx.recv_timeout(Duration::from_secs(20));
    gates[t].release();
    let resident = changed
        .expect("the change completed while another thread's read of x was held")
        .unwrap();
    assert_eq!(resident, 0, "x left core while the reader's read was held");
    let read = reader.join().unwrap().unwrap();
    assert!(
        read == 0o640 || read == 0o600,
        "the reader saw a mode x had: {read:o}"
    );
    assert_eq!(
        fs.getattr(x).unwrap().mode & 0o7777,
        0o600,
        "x's mode after the change (a stale read kept would bring back 0o640)"
    );
    assert!(fs.status().meta_inode_stale_reads >= 1);
    fs.unmount().unwrap();
}

/// What the oracle knows of one file: its perm bits, owner and the value of `user.v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    perm: u16,
    uid: u32,
    xattr: u64,
}

/// Misses race changes, the background checkpointer applying them to the trees and
/// sweeps evicting inodes, under an in-core bound of 2 inodes: reader threads look up and
/// stat every file constantly while the main thread changes files one at a time and
/// checks, after each change, every file against the oracle. A read made without the lock
/// that saw the trees before a change was applied, kept by mistake, shows up as an old
/// value (and as a reader's value the oracle never held).
#[test]
fn misses_racing_changes_checkpoints_and_sweeps_read_what_the_oracle_holds() {
    const N: u64 = 24;
    const ROUNDS: u64 = 250;
    let s = sims(2, 64 << 20);
    let m = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &m).unwrap();
    let mut o = quiet();
    o.checkpoints = Checkpoints::Background;
    o.inode_cache = Some(InodeBound(2));
    let fs = Fs::mount(dyns(&s), o).unwrap().0;
    let dir = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let mut oracle: Vec<Known> = Vec::new();
    let mut inos = Vec::new();
    for n in 0..N {
        let a = fs
            .create(dir, name(n).as_ref(), CreateParams::with_perm(perm_of(n)))
            .unwrap();
        fs.setxattr(
            a.ino,
            "user.v".as_ref(),
            &0u64.to_le_bytes(),
            XattrMode::Any,
        )
        .unwrap();
        inos.push(a.ino);
        oracle.push(Known {
            perm: perm_of(n),
            uid: 0,
            xattr: 0,
        });
    }
    fs.checkpoint().unwrap();
    // The creates pinned every inode at the sweeps so far, which then set the next one
    // past twice what they kept: sweep now, so that sweeps come every few loads.
    assert!(fs.debug_evict_inodes() > 0, "inodes leave core");
    // Every value a file ever had: a reader may see any of them (it races the change),
    // never one the file never had.
    let versions: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let check = |n: u64, a: &Known, oracle: &Known| -> Result<(), String> {
        if a != oracle {
            return Err(format!("file {n}: read {a:?}, oracle {oracle:?}"));
        }
        Ok(())
    };
    let read = |fs: &Fs, n: u64, ino: Ino| -> Result<Known, FsError> {
        let a = fs.lookup(dir, name(n).as_ref())?;
        assert_eq!(a.ino, ino, "file {n} names its inode");
        let b = fs.getattr(ino)?;
        let x = fs.getxattr(ino, "user.v".as_ref())?;
        let xattr = u64::from_le_bytes(x.try_into().expect("8 bytes"));
        Ok(Known {
            perm: (b.mode & 0o7777) as u16,
            uid: b.uid,
            xattr,
        })
    };
    thread::scope(|sc| {
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (fs, inos, versions, stop, reads) = (&fs, &inos, &versions, &stop, &reads);
                sc.spawn(move || -> Result<(), String> {
                    let mut n = r;
                    while !stop.load(Ordering::Acquire) {
                        n = (n + 7) % N;
                        let k = read(fs, n, inos[n as usize]).map_err(|e| e.to_string())?;
                        // The version begun by the time the read ended: what was read
                        // is at most that. The fields are changed one call after the
                        // other, so each is checked on its own.
                        let v = versions[n as usize].load(Ordering::Acquire);
                        let had = |f: &dyn Fn(&Known) -> u64| {
                            (0..=v).any(|w| f(&k) == f(&value_of(n, w)))
                        };
                        let ok = had(&|k| u64::from(k.perm))
                            && had(&|k| u64::from(k.uid))
                            && had(&|k| k.xattr);
                        if !ok {
                            return Err(format!("file {n}: read {k:?}, never held (version {v})"));
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        // Readers stop when the main thread ends, a panic included.
        let _stop = StopOnDrop(&stop);
        let mut failure = None;
        'rounds: for round in 1..=ROUNDS {
            let n = round % N;
            let ino = inos[n as usize];
            let v = versions[n as usize].load(Ordering::Relaxed) + 1;
            let want = value_of(n, v);
            let set = SetAttr {
                mode: Some(u32::from(want.perm)),
                uid: Some(want.uid),
                ..SetAttr::default()
            };
            // Begun before the change: a reader that sees the new values sees the version.
            versions[n as usize].store(v, Ordering::Release);
            let changed = fs.setattr(ino, &set).and_then(|_| {
                fs.setxattr(
                    ino,
                    "user.v".as_ref(),
                    &want.xattr.to_le_bytes(),
                    XattrMode::Any,
                )
            });
            if let Err(e) = changed {
                failure = Some(format!("round {round}: change of file {n}: {e}"));
                break;
            }
            oracle[n as usize] = want;
            if round % 5 == 0 {
                // Applies the journal to the trees and writes them: changed inodes may
                // leave core at the next sweep.
                if let Err(e) = fs.checkpoint() {
                    failure = Some(format!("round {round}: checkpoint: {e}"));
                    break;
                }
            }
            for m in 0..N {
                let got = read(&fs, m, inos[m as usize]).map_err(|e| format!("read: {e}"));
                if let Err(e) = got.and_then(|got| check(m, &got, &oracle[m as usize])) {
                    failure = Some(format!("after round {round}: {e}"));
                    break 'rounds;
                }
            }
        }
        stop.store(true, Ordering::Release);
        for r in readers {
            if let Err(e) = r.join().unwrap() {
                failure.get_or_insert(format!("reader: {e}"));
            }
        }
        if let Some(f) = failure {
            panic!("{f}");
        }
    });
    let st = fs.status();
    eprintln!(
        "{} reader reads; inodes read from the trees {}, stale reads discarded {}, evicted {}",
        reads.load(Ordering::Relaxed),
        st.meta_inode_loads,
        st.meta_inode_stale_reads,
        st.meta_inodes_evicted
    );
    assert!(
        st.meta_inodes_evicted > N && st.meta_inode_loads > N,
        "inodes left core and were read back: {st:?}"
    );
    fs.unmount().unwrap();
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The value file `n` holds at version `v` (version 0: as created).
fn value_of(n: u64, v: u64) -> Known {
    if v == 0 {
        return Known {
            perm: perm_of(n),
            uid: 0,
            xattr: 0,
        };
    }
    Known {
        perm: 0o400 | ((n * 7 + v) % 0o400) as u16,
        uid: (n * 131 + v * 17) as u32,
        xattr: n << 32 | v,
    }
}

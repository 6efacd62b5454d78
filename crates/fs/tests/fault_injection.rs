//! Fault test: EIO and ENOSPC injected at every fault point in turn (the Nth hit of any
//! point, N = 1, 2, 3 ... until the workload completes). The failing call must report the
//! error; afterwards the file system is either poisoned (every later call fails) or fully
//! usable; journal, checkpoint and flush failures must poison; after a crash and remount
//! fsck is clean and everything synced before the failure reads back exactly.
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use stripefs::{faults, CreateParams, Fs, FsError, Ino, MkfsOptions, MountOptions, RenameMode};
use stripefs_target::fault::{Persistence, PointMatch};
use stripefs_target::{CrashMode, FaultInjector, FaultKind, FaultPoint, Rng, SimTarget};

/// Names and contents as of the last successful `sync`.
type Synced = BTreeMap<String, Vec<u8>>;

struct Outcome {
    failed: Option<FsError>,
    synced: Synced,
    /// Names changed after the last successful sync (their state is not determined).
    changed: Vec<String>,
}

fn faulty_sims(faults: &Arc<FaultInjector>) -> Vec<Arc<SimTarget>> {
    (0..3)
        .map(|i| {
            Arc::new(
                SimTarget::from_image(&format!("sim{i}"), vec![GARBAGE; 6 << 20], 512)
                    .with_faults(i, Arc::clone(faults)),
            )
        })
        .collect()
}

/// A deterministic workload; stops at the first error.
fn workload(fs: &Fs) -> Outcome {
    let mut rng = Rng::new(7);
    let mut model: BTreeMap<String, (Ino, Vec<u8>)> = BTreeMap::new();
    let mut out = Outcome {
        failed: None,
        synced: Synced::new(),
        changed: Vec::new(),
    };
    for step in 0..60 {
        let name = format!("f{}", rng.below(5));
        let r: Result<(), FsError> = (|| {
            match (step % 7, model.get(&name).cloned()) {
                (_, None) => {
                    out.changed.push(name.clone());
                    let a = fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))?;
                    model.insert(name.clone(), (a.ino, Vec::new()));
                }
                (0..=2, Some((ino, mut c))) => {
                    out.changed.push(name.clone());
                    let off = rng.below(c.len() as u64 + 9000);
                    let len = rng.range(1, 30_000);
                    let s = rng.next_u64();
                    let n = fs.write_at(ino, off, &pattern(s, off, len as usize))? as u64;
                    if (c.len() as u64) < off + n {
                        c.resize((off + n) as usize, 0);
                    }
                    c[off as usize..(off + n) as usize]
                        .copy_from_slice(&pattern(s, off, n as usize));
                    model.insert(name.clone(), (ino, c));
                    if n < len {
                        // A short write is how write(2) reports a failure after progress.
                        return Err(FsError::NoSpace(format!("short write: {n} of {len} bytes")));
                    }
                }
                (3, Some((ino, _))) => {
                    let mut buf = vec![0u8; 40_000];
                    fs.read_at(ino, 0, &mut buf)?;
                }
                (4, Some((ino, mut c))) => {
                    out.changed.push(name.clone());
                    let n = rng.below(c.len() as u64 + 1);
                    fs.set_len(ino, n)?;
                    c.truncate(n as usize);
                    model.insert(name.clone(), (ino, c));
                }
                (5, Some(v)) => {
                    let to = format!("f{}", rng.below(5));
                    if to != name {
                        out.changed.push(name.clone());
                        out.changed.push(to.clone());
                        fs.rename(
                            Ino::ROOT,
                            name.as_ref(),
                            Ino::ROOT,
                            to.as_ref(),
                            RenameMode::Replace,
                        )?;
                        model.remove(&name);
                        model.insert(to, v);
                    }
                }
                (_, Some(_)) => {
                    fs.sync()?;
                    out.synced = model
                        .iter()
                        .map(|(k, (_, c))| (k.clone(), c.clone()))
                        .collect();
                    out.changed.clear();
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            out.failed = Some(e);
            return out;
        }
    }
    out
}

fn must_poison(p: FaultPoint) -> bool {
    matches!(
        p,
        FaultPoint::TargetFlush(_)
            | faults::JOURNAL_WRITE
            | faults::JOURNAL_FLUSH
            | faults::CHECKPOINT_WRITE
    )
}

fn one_run(kind: FaultKind, nth: u64) -> bool {
    let faults = Arc::new(FaultInjector::new());
    let sims = faulty_sims(&faults);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&sims), &opts).unwrap();
    let (fs, _) = Fs::mount(
        dyns(&sims),
        MountOptions {
            faults: Some(Arc::clone(&faults)),
            ..quiet()
        },
    )
    .unwrap();
    faults.arm(PointMatch::Any, nth, kind, Persistence::Once);
    let out = workload(&fs);
    let fired = faults.fired();
    faults.disarm();
    if std::env::var_os("FAULT_DEBUG").is_some() {
        eprintln!("nth {nth}: fired {fired:?} failed {:?}", out.failed);
    }
    let Some(err) = out.failed else {
        assert!(
            fired.is_empty(),
            "{kind:?} at {fired:?} (hit {nth}) went unreported"
        );
        return false;
    };
    let point = *fired
        .first()
        .unwrap_or_else(|| panic!("call failed ({err}) but no fault fired"));
    // The allocator's fault point means "this target is full" whatever the armed kind.
    let want = match (kind, point) {
        (FaultKind::Enospc, _) | (_, faults::ALLOC) => libc::ENOSPC,
        _ => libc::EIO,
    };
    assert!(
        err.errno() == want || matches!(err, FsError::Poisoned(_)),
        "fault {kind:?} at {point} reported as {err} (errno {})",
        err.errno()
    );
    if must_poison(point) {
        assert!(
            fs.is_poisoned(),
            "{kind:?} at {point} did not poison the file system"
        );
    }
    if fs.is_poisoned() {
        let e = fs
            .create(Ino::ROOT, "after".as_ref(), CreateParams::with_perm(0o644))
            .unwrap_err();
        assert!(
            matches!(e, FsError::Poisoned(_)),
            "poisoned file system accepted a call: {e}"
        );
    } else {
        // Whatever the fault dropped (a failed writeback, a failed direct write, a refused
        // allocation) returned its reservations and allocations exactly once.
        fs.check_space_accounting()
            .unwrap_or_else(|e| panic!("after {kind:?} at {point} (hit {nth}): {e}"));
        let a = fs
            .create(Ino::ROOT, "after".as_ref(), CreateParams::with_perm(0o644))
            .expect("still usable");
        fs.write_at(a.ino, 0, b"still works")
            .expect("write after recovered fault");
        fs.fsync(a.ino, stripefs::SyncScope::All)
            .expect("fsync after recovered fault");
    }
    std::mem::forget(fs);
    for s in &sims {
        s.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(
        dyns(&sims),
        MountOptions {
            faults: None,
            ..quiet()
        },
    )
    .unwrap_or_else(|e| panic!("remount after {kind:?} at {point} (hit {nth}) failed: {e}"));
    for (name, content) in &out.synced {
        if out.changed.contains(name) {
            continue;
        }
        let a = fs
            .lookup(Ino::ROOT, name.as_ref())
            .unwrap_or_else(|e| panic!("synced {name} lost after fault at {point}: {e}"));
        let mut buf = vec![0u8; a.size as usize];
        fs.read_at(a.ino, 0, &mut buf).unwrap();
        assert!(
            buf == *content,
            "synced {name} differs after fault at {point} (hit {nth})"
        );
    }
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&sims), &mut |_| {}).unwrap();
    assert!(
        r.is_clean(),
        "fsck after {kind:?} at {point} (hit {nth}): {:?}",
        r.problems
    );
    true
}

fn sweep(kind: FaultKind) -> u64 {
    let mut n = 1;
    while one_run(kind, n) {
        n += 1;
        assert!(n < 5000, "workload never completes");
    }
    n - 1
}

#[test]
fn eio_at_every_point() {
    let points = sweep(FaultKind::Eio);
    eprintln!("EIO injected at {points} points");
    assert!(points > 50);
}

#[test]
fn enospc_at_every_point() {
    let points = sweep(FaultKind::Enospc);
    eprintln!("ENOSPC injected at {points} points");
    assert!(points > 50);
}

#[test]
fn full_target_gives_enospc_and_stays_usable() {
    let s = sims(2, 4 << 20);
    let fs = fresh(&s, 4096, 65536);
    let a = fs
        .create(Ino::ROOT, "big".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let chunk = vec![0x5Au8; 256 << 10];
    let mut off = 0u64;
    let err = loop {
        // The last write that fits may be short (metadata pages share the data area).
        match fs.write_at(a.ino, off, &chunk) {
            Ok(n) => off += n as u64,
            Err(e) => break e,
        }
        assert!(off < 64 << 20, "never ran out of space");
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(!fs.is_poisoned());
    assert_eq!(
        fs.getattr(a.ino).unwrap().size,
        off,
        "failed write left the size alone"
    );
    fs.unlink(Ino::ROOT, "big".as_ref()).unwrap();
    fs.sync().unwrap();
    let b = fs
        .create(Ino::ROOT, "again".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    fs.write_at(b.ino, 0, &chunk)
        .expect("space freed by the unlink is reusable after commit");
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn injected_alloc_enospc_is_not_fatal() {
    let faults = Arc::new(FaultInjector::new());
    let s = sims(2, 4 << 20);
    Fs::mkfs(&dyns(&s), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(
        dyns(&s),
        MountOptions {
            faults: Some(Arc::clone(&faults)),
            ..quiet()
        },
    )
    .unwrap();
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    faults.arm(
        PointMatch::Exact(faults::ALLOC),
        1,
        FaultKind::Enospc,
        Persistence::Once,
    );
    let e = fs.write_at(a.ino, 0, b"x").unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    fs.write_at(a.ino, 0, b"x")
        .expect("next allocation succeeds");
    fs.unmount().unwrap();
}

/// A writeback error reaches every handle that was open when it happened, once; a handle
/// opened later does not inherit it; the file system is not shut down for it.
#[test]
fn writeback_error_is_reported_once_per_handle() {
    let faults = Arc::new(FaultInjector::new());
    let sims = faulty_sims(&faults);
    Fs::mkfs(&dyns(&sims), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(
        dyns(&sims),
        MountOptions {
            faults: Some(Arc::clone(&faults)),
            ..quiet()
        },
    )
    .unwrap();
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let h1 = fs.open_file(f.ino).unwrap();
    let h2 = fs.open_file(f.ino).unwrap();
    fs.write_at(f.ino, 0, &[1u8; 8192]).unwrap();
    faults.arm(
        PointMatch::AnyTargetWrite,
        1,
        FaultKind::Eio,
        Persistence::Once,
    );
    let e = h1.sync_all().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert_eq!(
        faults.fired(),
        vec![FaultPoint::TargetWrite(faults.fired()[0].target_index())]
    );
    fs.check_space_accounting()
        .expect("the failed writeback returned its space");
    h1.sync_all().expect("already reported to this handle");
    let e = h2.sync_data().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "the other handle is told too");
    h2.sync_all().expect("once per handle");
    let h3 = fs.open_file(f.ino).unwrap();
    h3.sync_all()
        .expect("a handle opened after the error does not inherit it");
    assert!(!fs.is_poisoned());
    // New data after the error is written and synced normally.
    fs.write_at(f.ino, 0, &[2u8; 4096]).unwrap();
    h3.sync_all().unwrap();
    drop((h1, h2, h3));
    fs.unmount().unwrap();
}

//! Entry changes read the pages they look up before they take the metadata lock
//! (issue 11, "no global lock is held across a metadata page read"): a create, link,
//! unlink or rename in a directory whose entry leaf is not cached reads it ahead, so a
//! change of another file, which needs the lock, does not wait for that read.
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

/// Runs `change` with the next metadata read held at the device; while it is held, a
/// chmod of the resident file `r` (which takes the metadata lock) must complete.
fn chmod_passes_a_held_read(what: &str, change: impl FnOnce(&Fs, Ino) + Send + 'static) {
    let (fs, gates, d, r) = setup();
    for g in &gates {
        g.hold_next(|op| matches!(op, IoOp::Read { .. }));
    }
    let changer = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || change(&fs, d))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !gates.iter().any(|g| g.is_holding()) {
        assert!(Instant::now() < deadline, "{what}: reads a metadata page");
        thread::sleep(Duration::from_millis(1));
    }
    let (tx, rx) = mpsc::channel();
    {
        let fs = Arc::clone(&fs);
        thread::spawn(move || {
            let chmod = SetAttr {
                mode: Some(0o640),
                ..SetAttr::default()
            };
            tx.send(fs.setattr(r, &chmod).map(|a| a.mode & 0o7777))
                .unwrap();
        });
    }
    let done = rx.recv_timeout(Duration::from_secs(20));
    let still_held = gates.iter().any(|g| g.is_holding());
    gates.iter().for_each(|g| g.release());
    let mode = done.unwrap_or_else(|_| {
        panic!("{what}: a chmod of another file waited for the change's held page read")
    });
    assert!(still_held, "{what}: the held read was still in progress");
    assert_eq!(mode.unwrap(), 0o640);
    changer.join().unwrap();
    fs.unmount().unwrap();
}

#[test]
fn a_create_reads_its_entry_leaf_before_the_metadata_lock() {
    chmod_passes_a_held_read("create", |fs, d| {
        fs.create(d, "entry-new".as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
        assert!(fs.lookup(d, "entry-new".as_ref()).is_ok());
    });
}

#[test]
fn an_unlink_reads_its_entry_leaf_and_inode_before_the_metadata_lock() {
    chmod_passes_a_held_read("unlink", |fs, d| {
        fs.unlink(d, "entry-700".as_ref()).unwrap();
        assert!(fs.lookup(d, "entry-700".as_ref()).is_err());
    });
}

#[test]
fn a_rename_reads_both_entry_leaves_before_the_metadata_lock() {
    chmod_passes_a_held_read("rename", |fs, d| {
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

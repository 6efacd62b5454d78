//! Replay of a journal that changes the same files again and again (decisions.md, 135):
//! the checks' partial model is kept from one read-ahead window to the next while it is
//! within the in-core inode bound, so each file is read from the trees once, not once
//! per window; past the bound it is let go after each window, as before. And the keys
//! an earlier window read ahead are not read ahead again.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{
    CreateParams, FileKind, Fs, Ino, InodeBound, MetaCacheBytes, MountOptions, SetAttr,
};
use stripefs_target::SimTarget;

/// Files changed in every transaction: 1,201 read-ahead keys (an inode item and an
/// orphan key each, and the counter), past the 256-key window of the smallest cache, so
/// every transaction is a window of its own.
const FILES: u64 = 600;
/// Transactions (each a `chmod` of every file, then a `sync`).
const ROUNDS: u32 = 5;
const TARGET_BYTES: u64 = 64 << 20;
/// The smallest cache (64 pages): a window of 256 keys.
const SMALL_CACHE: u64 = 64 * 4096;

fn mode(round: u32) -> u32 {
    0o600 | (round % 8) << 3
}

/// The durable images of a crash after `ROUNDS` rounds, with no checkpoint since the
/// files were created.
fn crashed() -> Vec<Vec<u8>> {
    let s = sims(2, TARGET_BYTES);
    let fs = fresh(&s, 4096, 4096);
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let inos: Vec<Ino> = (0..FILES)
        .map(|n| {
            let name = format!("f{n}");
            let p = CreateParams::with_perm(0o644);
            fs.mknod(d, name.as_ref(), FileKind::Fifo, p).unwrap().ino
        })
        .collect();
    fs.unmount().unwrap();
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    for round in 0..ROUNDS {
        for ino in &inos {
            let set = SetAttr {
                mode: Some(mode(round)),
                ..SetAttr::default()
            };
            fs.setattr(*ino, &set).unwrap();
        }
        fs.sync().unwrap();
    }
    assert_eq!(fs.status().checkpoints, 0, "the journal holds every round");
    std::mem::forget(fs); // a crash: no unmount
    s.iter().map(|t| t.durable_image()).collect()
}

/// Mounts the images with the smallest cache and `inodes` as the in-core bound; checks
/// every file came back with the last round's mode; returns the mount's report.
fn replay(images: &[Vec<u8>], inodes: usize) -> stripefs::MountReport {
    let s: Vec<Arc<SimTarget>> = images
        .iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("sim{i}"), img.clone(), 512)))
        .collect();
    let opts = MountOptions {
        meta_cache: MetaCacheBytes(SMALL_CACHE),
        inode_cache: Some(InodeBound(inodes)),
        ..quiet()
    };
    let (fs, report) = Fs::mount(dyns(&s), opts).unwrap();
    assert!(report.replayed_txns >= u64::from(ROUNDS), "{report:?}");
    let d = fs.lookup(Ino::ROOT, "d".as_ref()).unwrap().ino;
    for n in 0..FILES {
        let a = fs.lookup(d, format!("f{n}").as_ref()).unwrap();
        assert_eq!(a.mode & 0o777, mode(ROUNDS - 1), "f{n} lost its last chmod");
    }
    fs.unmount().unwrap();
    report
}

#[test]
fn a_working_set_within_the_inode_bound_is_read_once() {
    let images = crashed();
    let report = replay(&images, 4096);
    // The files once each, and the directory and root if a record names them.
    assert!(
        report.replay_inode_reads <= FILES + 2,
        "replay read {} inodes for {FILES} files changed in {ROUNDS} windows",
        report.replay_inode_reads
    );
    // Their keys read ahead once too (an inode item and an orphan key each, the
    // counter): the first window's; later windows name no new key (decisions.md, 138).
    let keys = 2 * FILES + 1;
    assert!(
        report.replay_keys_read_ahead <= keys + 4,
        "replay read ahead {} keys for {ROUNDS} windows of the same {keys}",
        report.replay_keys_read_ahead
    );
}

#[test]
fn past_the_inode_bound_the_checks_let_go_after_each_window() {
    let images = crashed();
    let bound = 100;
    let report = replay(&images, bound);
    assert!(
        report.replay_inode_reads >= FILES * u64::from(ROUNDS),
        "replay read {} inodes: the partial model was kept past its bound",
        report.replay_inode_reads
    );
    // One window's files past the bound, at most.
    assert!(
        report.replay_peak_inodes <= bound as u64 + FILES + 2,
        "{report:?}"
    );
}

/// The largest bound `-o inode_cache` takes: the replay's bounds on what it keeps
/// saturate instead of overflowing (a reviewer's reproducer: a debug build panicked).
#[test]
fn the_largest_inode_bound_replays() {
    let images = crashed();
    let report = replay(&images, usize::MAX);
    assert!(report.replay_inode_reads <= FILES + 2, "{report:?}");
}

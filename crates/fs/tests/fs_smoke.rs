//! End-to-end basics: create, write, read back, survive unmount and remount.
mod common;

use common::*;
use stripefs::{CreateParams, Fs, Ino};

#[test]
fn write_read_remount() {
    let s = sims(3, 32 << 20);
    let fs = fresh(&s, 4096, 65536);
    let a = fs
        .create(Ino::ROOT, "a".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let data = pattern(1, 1000, 300_000);
    fs.write_at(a.ino, 1000, &data).unwrap();
    let mut back = vec![0u8; 301_000];
    assert_eq!(fs.read_at(a.ino, 0, &mut back).unwrap(), 301_000);
    assert!(back[..1000].iter().all(|&b| b == 0));
    assert_eq!(&back[1000..], &data[..]);
    fs.fsync(a.ino, false).unwrap();
    fs.unmount().unwrap();
    let (fs, rep) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert_eq!(
        rep.replayed_txns, 0,
        "clean unmount leaves nothing to replay"
    );
    let a2 = fs.lookup(Ino::ROOT, "a".as_ref()).unwrap();
    assert_eq!(a2.size, 301_000);
    let mut back2 = vec![0u8; 301_000];
    fs.read_at(a2.ino, 0, &mut back2).unwrap();
    assert_eq!(back, back2);
    fs.unmount().unwrap();
}

#[test]
fn fsync_survives_crash_via_journal_replay() {
    let s = sims(2, 32 << 20);
    let fs = fresh(&s, 1024, 8192);
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o600))
        .unwrap();
    fs.write_at(a.ino, 0, &pattern(2, 0, 50_000)).unwrap();
    fs.fsync(a.ino, false).unwrap();
    let b = fs
        .create(
            Ino::ROOT,
            "unsynced".as_ref(),
            CreateParams::with_perm(0o600),
        )
        .unwrap();
    fs.write_at(b.ino, 0, b"lost").unwrap();
    std::mem::forget(fs); // no unmount, no drop-time commit: a crash
    for t in &s {
        t.crash(stripefs_target::CrashMode::DropUnflushed);
    }
    let (fs, rep) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert!(rep.replayed_txns >= 1);
    let a2 = fs.lookup(Ino::ROOT, "f".as_ref()).unwrap();
    let mut back = vec![0u8; 50_000];
    fs.read_at(a2.ino, 0, &mut back).unwrap();
    assert_eq!(back, pattern(2, 0, 50_000));
    assert!(fs.lookup(Ino::ROOT, "unsynced".as_ref()).is_err());
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

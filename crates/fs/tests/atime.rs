//! Access times under each mount option (`relatime`, `strictatime`, `noatime`,
//! `nodiratime`, `lazytime`), for reads in process (issue 9, item 10). The same through
//! the kernel is in the FUSE mount tests.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{
    AtimePolicy, AtimeUpdate, AtimeWrite, CreateParams, DirAtime, Fs, Ino, MkfsOptions,
    MountOptions, SetAttr, TimeSet, Timespec,
};
use stripefs_target::{CrashMode, SimTarget};

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

fn opts(atime: AtimePolicy) -> MountOptions {
    MountOptions { atime, ..quiet() }
}

fn mounted(atime: AtimePolicy) -> (Vec<Arc<SimTarget>>, Fs) {
    let s = sims(2, 16 << 20);
    Fs::mkfs(&dyns(&s), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(dyns(&s), opts(atime)).unwrap();
    (s, fs)
}

fn ago(secs: i64) -> Timespec {
    let now = stripefs::time_now();
    Timespec {
        sec: now.sec - secs,
        nsec: now.nsec,
    }
}

/// Sets all three times of `ino` (access `a`, modification `m`, change `m`) in the past.
fn set_times(fs: &Fs, ino: Ino, a: Timespec, m: Timespec) {
    let s = SetAttr {
        atime: Some(TimeSet::At(a)),
        mtime: Some(TimeSet::At(m)),
        ctime: Some(m),
        ..SetAttr::default()
    };
    fs.setattr(ino, &s).unwrap();
}

/// A file with data, its access time an hour ago and after its other times.
fn file(fs: &Fs, name: &str) -> Ino {
    let f = fs
        .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    fs.write_at(f.ino, 0, &[5u8; 8192]).unwrap();
    set_times(fs, f.ino, ago(HOUR), ago(2 * HOUR));
    f.ino
}

fn read(fs: &Fs, ino: Ino) {
    let mut buf = [0u8; 100];
    assert_eq!(fs.read_at(ino, 0, &mut buf).unwrap(), 100);
}

fn atime(fs: &Fs, ino: Ino) -> Timespec {
    fs.getattr(ino).unwrap().atime
}

/// Whether reading `ino` moves its access time.
fn read_updates(fs: &Fs, ino: Ino) -> bool {
    let before = atime(fs, ino);
    read(fs, ino);
    atime(fs, ino) != before
}

/// A directory with an entry, its access time an hour ago and after its other times.
fn dir(fs: &Fs, name: &str) -> Ino {
    let d = fs
        .mkdir(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o755))
        .unwrap();
    fs.create(d.ino, "x".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    set_times(fs, d.ino, ago(HOUR), ago(2 * HOUR));
    d.ino
}

fn list_updates(fs: &Fs, ino: Ino) -> bool {
    let before = atime(fs, ino);
    assert!(!fs.readdir(ino).unwrap().is_empty());
    atime(fs, ino) != before
}

#[test]
fn relatime_updates_after_a_change_or_a_day() {
    let (_s, fs) = mounted(AtimePolicy::default());
    let f = file(&fs, "f");
    assert!(!read_updates(&fs, f), "read since the last change: kept");
    fs.write_at(f, 0, b"new").unwrap();
    assert!(read_updates(&fs, f), "a read after a modification updates");
    assert!(atime(&fs, f) >= fs.getattr(f).unwrap().mtime);
    assert!(!read_updates(&fs, f), "and only the first");
    set_times(&fs, f, ago(2 * DAY), ago(3 * DAY));
    assert!(read_updates(&fs, f), "a day-old access time is updated");
    // ctime counts too (chmod).
    set_times(&fs, f, ago(HOUR), ago(2 * HOUR));
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(f, &chmod).unwrap();
    assert!(read_updates(&fs, f));
    // Directories: a listing after an entry changed.
    let d = dir(&fs, "d");
    assert!(!list_updates(&fs, d));
    fs.create(d, "y".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    fs.unlink(d, "y".as_ref()).unwrap();
    assert!(list_updates(&fs, d));
    // Written through the journal: survives a crash after sync.
    let want = atime(&fs, f);
    fs.sync().unwrap();
    std::mem::forget(fs);
    for t in &_s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&_s), quiet()).unwrap();
    assert_eq!(atime(&fs, f), want);
    fs.unmount().unwrap();
}

#[test]
fn strictatime_updates_on_every_access() {
    let (_s, fs) = mounted(AtimePolicy {
        update: AtimeUpdate::Strict,
        ..AtimePolicy::default()
    });
    let f = file(&fs, "f");
    assert!(read_updates(&fs, f));
    set_times(&fs, f, ago(HOUR), ago(2 * HOUR));
    let mut buf = vec![0u8; 4096];
    fs.read_direct(f, 0, &mut buf).unwrap();
    assert!(atime(&fs, f) > ago(60), "a direct read is an access");
    let d = dir(&fs, "d");
    assert!(list_updates(&fs, d));
    let l = fs
        .symlink(
            Ino::ROOT,
            "l".as_ref(),
            "f".as_ref(),
            CreateParams::with_perm(0o777),
        )
        .unwrap();
    set_times(&fs, l.ino, ago(HOUR), ago(2 * HOUR));
    fs.readlink(l.ino).unwrap();
    assert!(atime(&fs, l.ino) > ago(60), "readlink is an access");
    fs.unmount().unwrap();
}

#[test]
fn noatime_never_updates() {
    let (_s, fs) = mounted(AtimePolicy {
        update: AtimeUpdate::Never,
        ..AtimePolicy::default()
    });
    let f = file(&fs, "f");
    fs.write_at(f, 0, b"new").unwrap();
    assert!(!read_updates(&fs, f));
    set_times(&fs, f, ago(2 * DAY), ago(3 * DAY));
    assert!(!read_updates(&fs, f));
    let d = dir(&fs, "d");
    fs.create(d, "y".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    assert!(!list_updates(&fs, d));
    fs.unmount().unwrap();
}

#[test]
fn nodiratime_spares_directories_only() {
    for update in [AtimeUpdate::Strict, AtimeUpdate::Relative] {
        let (_s, fs) = mounted(AtimePolicy {
            update,
            dirs: DirAtime::Skip,
            ..AtimePolicy::default()
        });
        let d = dir(&fs, "d");
        fs.create(d, "y".as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
        assert!(!list_updates(&fs, d), "{update:?}");
        let f = file(&fs, "f");
        fs.write_at(f, 0, b"new").unwrap();
        assert!(read_updates(&fs, f), "{update:?}");
        fs.unmount().unwrap();
    }
}

/// Under lazytime an update is seen at once but written only by fsync, sync, unmount or
/// the inode's next other change; a crash loses it otherwise.
#[test]
fn lazytime_keeps_updates_in_memory_until_written() {
    let lazy = AtimePolicy {
        update: AtimeUpdate::Strict,
        write: AtimeWrite::Lazy,
        ..AtimePolicy::default()
    };
    let (s, fs) = mounted(lazy);
    let [kept, fsynced, changed, unmounted] =
        ["kept", "fsynced", "changed", "unmounted"].map(|n| file(&fs, n));
    let old = atime(&fs, kept);
    fs.sync().unwrap();
    for f in [kept, fsynced, changed] {
        assert!(read_updates(&fs, f));
    }
    let new_kept = atime(&fs, kept);
    fs.fsync(fsynced, stripefs::SyncScope::All).unwrap();
    let want_fsynced = atime(&fs, fsynced);
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(changed, &chmod).unwrap();
    let want_changed = atime(&fs, changed);
    fs.checkpoint().unwrap(); // Commits what was logged, not what is kept.
                              // An explicit time replaces a kept one.
    let d = dir(&fs, "d");
    assert!(list_updates(&fs, d));
    let t = ago(5 * DAY);
    set_times(&fs, d, t, ago(6 * DAY));
    assert_eq!(atime(&fs, d), t);
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), opts(lazy)).unwrap();
    assert_eq!(atime(&fs, kept), old, "a crash loses an unwritten update");
    assert_ne!(old, new_kept);
    assert_eq!(atime(&fs, fsynced), want_fsynced, "fsync writes it");
    assert_eq!(
        atime(&fs, changed),
        want_changed,
        "the next change writes it"
    );
    assert!(read_updates(&fs, unmounted));
    let want = atime(&fs, unmounted);
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s), opts(lazy)).unwrap();
    assert_eq!(atime(&fs, unmounted), want, "unmount writes it");
    // A day-old on-disk time is written at once.
    set_times(&fs, kept, ago(2 * DAY), ago(3 * DAY));
    fs.sync().unwrap();
    assert!(read_updates(&fs, kept));
    let want = atime(&fs, kept);
    fs.checkpoint().unwrap();
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), opts(lazy)).unwrap();
    assert_eq!(atime(&fs, kept), want);
    fs.unmount().unwrap();
}

/// A read-only file system writes no access time; switching to read-only writes the
/// lazily kept ones first.
#[test]
fn read_only_updates_nothing() {
    let lazy = AtimePolicy {
        update: AtimeUpdate::Strict,
        write: AtimeWrite::Lazy,
        ..AtimePolicy::default()
    };
    let (s, fs) = mounted(lazy);
    let f = file(&fs, "f");
    let d = dir(&fs, "d");
    assert!(read_updates(&fs, f));
    let kept = atime(&fs, f);
    fs.set_access(stripefs::Access::ReadOnly).unwrap();
    assert!(!read_updates(&fs, f));
    assert!(!list_updates(&fs, d));
    fs.set_access(stripefs::Access::ReadWrite).unwrap();
    assert!(read_updates(&fs, f), "read-write again");
    fs.set_access(stripefs::Access::ReadOnly).unwrap();
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), opts(lazy)).unwrap();
    assert_ne!(atime(&fs, f), kept);
    assert!(atime(&fs, f) > kept, "written by the switch to read-only");
    fs.unmount().unwrap();
}

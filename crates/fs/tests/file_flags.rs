//! Attribute flags (`FS_IOC_GETFLAGS`/`SETFLAGS`): `FS_NOCOW_FL` with btrfs's rules, the
//! `datacow` mount option and directory inheritance, every other bit refused.
mod common;

use common::*;
use stripefs::{CreateParams, DataCow, FileFlags, FileKind, Fs, Ino};

fn p() -> CreateParams {
    CreateParams::with_perm(0o644)
}

fn mount(s: &[std::sync::Arc<stripefs_target::SimTarget>], datacow: DataCow) -> Fs {
    let mut o = quiet();
    o.datacow = datacow;
    Fs::mount(dyns(s), o).expect("mount").0
}

#[test]
fn nocow_follows_datacow_and_the_directory() {
    let s = sims(2, 16 << 20);
    fresh(&s, 4096, 65536).unmount().unwrap();
    // datacow=off (the default): every new regular file is NOCOW, directories are not.
    assert_eq!(stripefs::MountOptions::default().datacow, DataCow::Off);
    let fs = mount(&s, DataCow::Off);
    let r = Ino::ROOT;
    let f = fs.create(r, "off".as_ref(), p()).unwrap().ino;
    let d = fs.mkdir(r, "d".as_ref(), p()).unwrap().ino;
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NOCOW);
    assert_eq!(fs.file_flags(d).unwrap(), FileFlags::NONE);
    assert_eq!(fs.file_flags(r).unwrap(), FileFlags::NONE);
    fs.unmount().unwrap();
    // datacow=on: new files are copy on write unless their directory is NOCOW; files
    // made before keep their flag.
    let fs = mount(&s, DataCow::On);
    let on = fs.create(r, "on".as_ref(), p()).unwrap().ino;
    assert_eq!(fs.file_flags(on).unwrap(), FileFlags::NONE);
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NOCOW);
    fs.set_file_flags(d, FileFlags::NOCOW).unwrap();
    let inner = fs.create(d, "f".as_ref(), p()).unwrap().ino;
    let sub = fs.mkdir(d, "sub".as_ref(), p()).unwrap().ino;
    let deep = fs.create(sub, "g".as_ref(), p()).unwrap().ino;
    let fifo = fs.mknod(d, "p".as_ref(), FileKind::Fifo, p()).unwrap().ino;
    for i in [inner, sub, deep] {
        assert_eq!(fs.file_flags(i).unwrap(), FileFlags::NOCOW, "{i}");
    }
    assert_eq!(fs.file_flags(fifo).unwrap(), FileFlags::NONE);
    // Clearing the directory's flag changes only what is created next.
    fs.set_file_flags(d, FileFlags::NONE).unwrap();
    let later = fs.create(d, "h".as_ref(), p()).unwrap().ino;
    assert_eq!(fs.file_flags(later).unwrap(), FileFlags::NONE);
    assert_eq!(fs.file_flags(inner).unwrap(), FileFlags::NOCOW);
    fs.unmount().unwrap();
    // Persisted: a remount (either option) reads the same flags back.
    let fs = mount(&s, DataCow::Off);
    for (i, want) in [
        (f, FileFlags::NOCOW),
        (on, FileFlags::NONE),
        (inner, FileFlags::NOCOW),
        (sub, FileFlags::NOCOW),
        (d, FileFlags::NONE),
        (later, FileFlags::NONE),
    ] {
        assert_eq!(fs.file_flags(i).unwrap(), want, "{i}");
    }
    fs.unmount().unwrap();
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn nocow_changes_only_on_empty_files() {
    let s = sims(2, 16 << 20);
    fresh(&s, 4096, 65536).unmount().unwrap();
    let fs = mount(&s, DataCow::On);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap().ino;
    fs.set_file_flags(f, FileFlags::NOCOW).unwrap();
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NOCOW);
    fs.set_file_flags(f, FileFlags::NONE).unwrap();
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NONE);
    // Data not yet written back counts: the size is what matters.
    fs.write_at(f, 0, b"x").unwrap();
    let before = fs.getattr(f).unwrap().ctime;
    std::thread::sleep(std::time::Duration::from_millis(2));
    fs.set_file_flags(f, FileFlags::NOCOW).unwrap();
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NONE, "kept, as btrfs");
    assert!(fs.getattr(f).unwrap().ctime > before, "ctime changes");
    // Truncated to 0 it may change again.
    fs.set_len(f, 0).unwrap();
    fs.set_file_flags(f, FileFlags::NOCOW).unwrap();
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NOCOW);
    fs.unmount().unwrap();
}

#[test]
fn other_flags_are_not_supported() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap().ino;
    let fifo = fs
        .mknod(Ino::ROOT, "p".as_ref(), FileKind::Fifo, p())
        .unwrap()
        .ino;
    const FS_IMMUTABLE_FL: u32 = 0x10;
    const FS_APPEND_FL: u32 = 0x20;
    for bits in [FS_IMMUTABLE_FL, FS_APPEND_FL | FileFlags::NOCOW.0, 1 << 31] {
        let e = fs.set_file_flags(f, FileFlags(bits)).unwrap_err();
        assert_eq!(e.errno(), libc::EOPNOTSUPP, "{bits:#x}: {e}");
    }
    assert_eq!(fs.file_flags(f).unwrap(), FileFlags::NOCOW, "unchanged");
    let e = fs.set_file_flags(fifo, FileFlags::NOCOW).unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
    fs.set_file_flags(fifo, FileFlags::NONE).unwrap();
    fs.unmount().unwrap();
}

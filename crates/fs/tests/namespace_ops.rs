//! Namespace semantics and their errno: directories, rename rules, links, symlinks, special
//! files, attributes, extended attributes, statfs, and orphans across a crash.
mod common;

use common::*;
use stripefs::{
    CreateParams, FileKind, Fs, FsError, Ino, RenameMode, SetAttr, TimeSet, Timespec, XattrMode,
};
use stripefs_target::CrashMode;

fn p() -> CreateParams {
    CreateParams::with_perm(0o644)
}

#[track_caller]
fn errno<T: std::fmt::Debug>(r: Result<T, FsError>) -> i32 {
    r.expect_err("expected an error").errno()
}

#[test]
fn directories_and_rename_rules() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let r = Ino::ROOT;
    let a = fs.mkdir(r, "a".as_ref(), p()).unwrap();
    let b = fs.mkdir(a.ino, "b".as_ref(), p()).unwrap();
    let f = fs.create(b.ino, "f".as_ref(), p()).unwrap();
    assert_eq!(fs.getattr(r).unwrap().nlink, 3);
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 3);
    assert_eq!(errno(fs.mkdir(r, "a".as_ref(), p())), libc::EEXIST);
    assert_eq!(errno(fs.rmdir(r, "a".as_ref())), libc::ENOTEMPTY);
    assert_eq!(errno(fs.unlink(r, "a".as_ref())), libc::EISDIR);
    assert_eq!(errno(fs.rmdir(b.ino, "f".as_ref())), libc::ENOTDIR);
    assert_eq!(errno(fs.create(f.ino, "x".as_ref(), p())), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(r, "nope".as_ref())), libc::ENOENT);
    assert_eq!(
        errno(fs.create(r, "x".repeat(256).as_ref(), p())),
        libc::ENAMETOOLONG
    );
    // A directory cannot move under itself.
    assert_eq!(
        errno(fs.rename(r, "a".as_ref(), b.ino, "a2".as_ref(), RenameMode::Replace)),
        libc::EINVAL
    );
    // Move b up to the root: link counts follow.
    fs.rename(a.ino, "b".as_ref(), r, "b".as_ref(), RenameMode::Replace)
        .unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(fs.getattr(r).unwrap().nlink, 4);
    assert_eq!(fs.lookup(b.ino, "..".as_ref()).unwrap().ino, r);
    // Replace an empty directory with a directory; a file cannot replace a directory.
    assert_eq!(
        errno(fs.rename(b.ino, "f".as_ref(), r, "a".as_ref(), RenameMode::Replace)),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs.rename(r, "a".as_ref(), b.ino, "f".as_ref(), RenameMode::Replace)),
        libc::ENOTDIR
    );
    fs.rename(r, "b".as_ref(), r, "a".as_ref(), RenameMode::NoReplace)
        .map(|()| panic!("noreplace replaced"))
        .unwrap_or_else(|e| assert_eq!(e.errno(), libc::EEXIST));
    assert_eq!(
        errno(fs.rename(r, "a".as_ref(), r, "b".as_ref(), RenameMode::Replace)),
        libc::ENOTEMPTY,
        "b holds f"
    );
    fs.rename(b.ino, "f".as_ref(), r, "f".as_ref(), RenameMode::Replace)
        .unwrap();
    fs.rename(r, "b".as_ref(), r, "a".as_ref(), RenameMode::Replace)
        .unwrap();
    assert_eq!(
        errno(fs.getattr(a.ino)),
        libc::ESTALE,
        "the replaced directory is gone"
    );
    assert_eq!(fs.getattr(r).unwrap().nlink, 3);
    // Exchange swaps a file and a directory atomically.
    fs.rename(r, "f".as_ref(), r, "a".as_ref(), RenameMode::Exchange)
        .unwrap();
    assert_eq!(fs.lookup(r, "a".as_ref()).unwrap().kind, FileKind::Regular);
    assert_eq!(fs.lookup(r, "f".as_ref()).unwrap().ino, b.ino);
    fs.unmount().unwrap();
    let rep = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
}

#[test]
fn links_symlinks_special_files() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let r = Ino::ROOT;
    let f = fs.create(r, "f".as_ref(), p()).unwrap();
    fs.write_at(f.ino, 0, b"hello").unwrap();
    fs.link(f.ino, r, "g".as_ref()).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    assert_eq!(
        errno(fs.link(r, r, "d".as_ref())),
        libc::EPERM,
        "no hard links to directories"
    );
    fs.unlink(r, "f".as_ref()).unwrap();
    let mut buf = [0u8; 5];
    fs.read_at(f.ino, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    let l = fs.symlink(r, "l".as_ref(), "g".as_ref(), p()).unwrap();
    assert_eq!(l.kind, FileKind::Symlink);
    assert_eq!(l.size, 1);
    assert_eq!(fs.readlink(l.ino).unwrap(), b"g");
    assert_eq!(
        fs.resolve("/l".as_ref(), stripefs::Follow::Yes).unwrap(),
        f.ino
    );
    assert_eq!(errno(fs.readlink(f.ino)), libc::EINVAL);
    let fifo = fs.mknod(r, "p".as_ref(), FileKind::Fifo, p()).unwrap();
    assert_eq!(fifo.mode & 0o170000, 0o010000);
    assert_eq!(errno(fs.write_at(fifo.ino, 0, b"x")), libc::EINVAL);
    let dev = fs
        .mknod(
            r,
            "c".as_ref(),
            FileKind::CharDevice,
            CreateParams {
                rdev: 0x0501,
                ..p()
            },
        )
        .unwrap();
    assert_eq!(fs.getattr(dev.ino).unwrap().rdev, 0x0501);
    let names: Vec<Vec<u8>> = fs.readdir(r).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(
        names,
        vec![b"c".to_vec(), b"g".to_vec(), b"l".to_vec(), b"p".to_vec()]
    );
    fs.unmount().unwrap();
}

#[test]
fn attributes_xattrs_statfs() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs
        .create(
            Ino::ROOT,
            "f".as_ref(),
            CreateParams {
                uid: 7,
                gid: 8,
                ..p()
            },
        )
        .unwrap();
    assert_eq!((f.uid, f.gid, f.mode), (7, 8, 0o100644));
    let t = Timespec {
        sec: 1_000_000_000,
        nsec: 123_456_789,
    };
    let set = SetAttr {
        mode: Some(0o4711),
        uid: Some(9),
        atime: Some(TimeSet::At(t)),
        mtime: Some(TimeSet::At(t)),
        size: Some(10_000),
        ..SetAttr::default()
    };
    let a = fs.setattr(f.ino, &set).unwrap();
    assert_eq!(
        (a.mode, a.uid, a.gid, a.size, a.mtime, a.atime),
        (0o104711, 9, 8, 10_000, t, t)
    );
    // A change of owner that drops set-ID bits does it in the same record; a mode given
    // beside it wins.
    let chown = SetAttr {
        uid: Some(10),
        kill_setid: Some(stripefs::SgidDrop::IfGroupExecutable),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(f.ino, &chown).unwrap().mode, 0o100711);
    let both = SetAttr {
        mode: Some(0o6755),
        kill_setid: Some(stripefs::SgidDrop::Always),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(f.ino, &both).unwrap().mode, 0o106755);
    let back = SetAttr {
        mode: Some(0o4711),
        uid: Some(9),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(f.ino, &back).unwrap().mode, 0o104711);
    assert!(a.ctime > t);
    let before = fs.statfs().unwrap();
    fs.write_at(f.ino, 0, &vec![1u8; 1 << 20]).unwrap();
    let after = fs.statfs().unwrap();
    // Speculative preallocation beyond EOF is counted honestly: statfs and st_blocks agree
    // on everything the file holds (1 MiB of delayed data plus its preallocation).
    let used = before.blocks_free - after.blocks_free;
    assert!(used >= 256, "{used}");
    assert_eq!(
        fs.getattr(f.ino).unwrap().blocks,
        used * 8,
        "st_blocks (512-byte units) matches statfs"
    );
    let x = |n: &str| std::ffi::OsString::from(n);
    fs.setxattr(f.ino, &x("user.a"), b"1", XattrMode::Create)
        .unwrap();
    assert_eq!(
        errno(fs.setxattr(f.ino, &x("user.a"), b"2", XattrMode::Create)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.setxattr(f.ino, &x("user.b"), b"2", XattrMode::Replace)),
        libc::ENODATA
    );
    fs.setxattr(f.ino, &x("user.a"), b"22", XattrMode::Replace)
        .unwrap();
    assert_eq!(fs.getxattr(f.ino, &x("user.a")).unwrap(), b"22");
    assert_eq!(
        errno(fs.setxattr(f.ino, &x(&"n".repeat(256)), b"", XattrMode::Any)),
        libc::ERANGE
    );
    assert_eq!(
        errno(fs.setxattr(f.ino, &x("user.big"), &vec![0; 65537], XattrMode::Any)),
        libc::E2BIG
    );
    assert_eq!(fs.listxattr(f.ino).unwrap(), vec![b"user.a".to_vec()]);
    fs.removexattr(f.ino, &x("user.a")).unwrap();
    assert_eq!(errno(fs.getxattr(f.ino, &x("user.a"))), libc::ENODATA);
    fs.setxattr(f.ino, &x("user.keep"), b"v", XattrMode::Any)
        .unwrap();
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let a2 = fs.getattr(f.ino).unwrap();
    assert_eq!((a2.mode, a2.atime, a2.size), (0o104711, t, 1 << 20));
    assert!(a2.mtime > t, "the write after setattr moved mtime");
    assert_eq!(fs.getxattr(f.ino, &x("user.keep")).unwrap(), b"v");
    assert_eq!(
        errno(fs.fallocate(f.ino, stripefs::FallocMode::CollapseRange, 0, 4096)),
        libc::EOPNOTSUPP
    );
    fs.unmount().unwrap();
}

#[test]
fn unlinked_open_file_survives_until_close_and_crash_frees_it() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let free0 = fs.statfs().unwrap().blocks_free;
    let f = fs.create(Ino::ROOT, "tmp".as_ref(), p()).unwrap();
    let h = fs.open_file(f.ino).unwrap();
    h.write_at(0, &vec![3u8; 2 << 20]).unwrap();
    let free_before = fs.statfs().unwrap().blocks_free;
    fs.unlink(Ino::ROOT, "tmp".as_ref()).unwrap();
    h.sync_all().unwrap();
    let mut buf = vec![0u8; 100];
    assert_eq!(
        h.read_at(0, &mut buf).unwrap(),
        100,
        "readable until the last close"
    );
    assert!(
        fs.statfs().unwrap().blocks_free <= free_before,
        "space held while open"
    );
    // Crash with the file open: recovery must free the orphan.
    std::mem::forget(h);
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, rep) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert_eq!(rep.orphans_freed, 1);
    assert_eq!(
        fs.statfs().unwrap().blocks_free,
        free0,
        "the orphan's blocks (and preallocation) are free again"
    );
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    // And without a crash: the last close frees it.
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let g = fs.create(Ino::ROOT, "g".as_ref(), p()).unwrap();
    fs.write_at(g.ino, 0, &vec![1u8; 1 << 20]).unwrap();
    let h = fs.open_file(g.ino).unwrap();
    fs.unlink(Ino::ROOT, "g".as_ref()).unwrap();
    drop(h);
    assert_eq!(errno(fs.getattr(g.ino)), libc::ESTALE);
    fs.unmount().unwrap();
}

/// An open directory outlives `rmdir` (and a rename over it) with link count 0 and takes
/// no new entries; a crash with it open frees it at the next mount (issue 9, item 9).
#[test]
fn removed_open_directory_stays_until_close_and_takes_no_entries() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let top = fs.mkdir(Ino::ROOT, "top".as_ref(), p()).unwrap();
    let d = fs.mkdir(top.ino, "d".as_ref(), p()).unwrap();
    let h = fs.open(d.ino).unwrap();
    fs.rmdir(top.ino, "d".as_ref()).unwrap();
    let a = fs.getattr(d.ino).unwrap();
    assert_eq!((a.kind, a.nlink), (FileKind::Directory, 0));
    assert!(fs.readdir(d.ino).unwrap().is_empty());
    assert_eq!(errno(fs.create(d.ino, "f".as_ref(), p())), libc::ENOENT);
    assert_eq!(errno(fs.mkdir(d.ino, "s".as_ref(), p())), libc::ENOENT);
    let sym = fs.symlink(d.ino, "l".as_ref(), "x".as_ref(), p());
    assert_eq!(errno(sym), libc::ENOENT);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap();
    assert_eq!(errno(fs.link(f.ino, d.ino, "f".as_ref())), libc::ENOENT);
    let mv = fs.rename(
        Ino::ROOT,
        "f".as_ref(),
        d.ino,
        "f".as_ref(),
        RenameMode::Replace,
    );
    assert_eq!(errno(mv), libc::ENOENT);
    assert_eq!(fs.getattr(top.ino).unwrap().nlink, 2);
    fs.release(h).unwrap();
    assert_eq!(errno(fs.getattr(d.ino)), libc::ESTALE);

    // Renamed over while open: the same, and the parent's count is right.
    let a = fs.mkdir(top.ino, "a".as_ref(), p()).unwrap();
    let b = fs.mkdir(top.ino, "b".as_ref(), p()).unwrap();
    let hb = fs.open(b.ino).unwrap();
    fs.rename(
        top.ino,
        "a".as_ref(),
        top.ino,
        "b".as_ref(),
        RenameMode::Replace,
    )
    .unwrap();
    assert_eq!(fs.getattr(b.ino).unwrap().nlink, 0);
    assert_eq!(fs.getattr(top.ino).unwrap().nlink, 3);
    assert_eq!(fs.lookup(top.ino, "b".as_ref()).unwrap().ino, a.ino);
    assert_eq!(errno(fs.mkdir(b.ino, "s".as_ref(), p())), libc::ENOENT);
    // Its old parent goes too; then a crash with it still open.
    fs.rmdir(top.ino, "b".as_ref()).unwrap();
    fs.rmdir(Ino::ROOT, "top".as_ref()).unwrap();
    fs.sync().unwrap();
    let _still_open = hb;
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, rep) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert_eq!(rep.orphans_freed, 1);
    assert_eq!(errno(fs.getattr(b.ino)), libc::ESTALE);
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// In a set-group-ID directory new entries take the directory's group and new
/// subdirectories inherit the bit; elsewhere the creator's group stands (issue 9, item 8).
#[test]
fn setgid_directory_passes_its_group_on() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let by = |perm: u16| CreateParams {
        uid: 7,
        gid: 8,
        ..CreateParams::with_perm(perm)
    };
    let pd = fs.mkdir(Ino::ROOT, "p".as_ref(), p()).unwrap();
    let own = SetAttr {
        uid: Some(100),
        gid: Some(100),
        mode: Some(0o2755),
        ..SetAttr::default()
    };
    fs.setattr(pd.ino, &own).unwrap();
    let sub = fs.mkdir(pd.ino, "sub".as_ref(), by(0o755)).unwrap();
    assert_eq!((sub.uid, sub.gid, sub.mode), (7, 100, 0o42755));
    let file = fs.create(pd.ino, "file".as_ref(), by(0o644)).unwrap();
    assert_eq!((file.uid, file.gid, file.mode), (7, 100, 0o100644));
    let fifo = fs
        .mknod(pd.ino, "fifo".as_ref(), FileKind::Fifo, by(0o600))
        .unwrap();
    assert_eq!(fifo.gid, 100);
    let link = fs
        .symlink(pd.ino, "l".as_ref(), "file".as_ref(), by(0o777))
        .unwrap();
    assert_eq!(link.gid, 100);
    // Inherited again one level down, and kept across a remount.
    let deeper = fs.mkdir(sub.ino, "deeper".as_ref(), by(0o700)).unwrap();
    assert_eq!((deeper.gid, deeper.mode), (100, 0o42700));
    // A plain directory leaves the creator's group.
    let plain = fs.mkdir(Ino::ROOT, "plain".as_ref(), by(0o755)).unwrap();
    let f2 = fs.create(plain.ino, "f".as_ref(), by(0o2755)).unwrap();
    assert_eq!(
        (plain.gid, plain.mode, f2.gid, f2.mode),
        (8, 0o40755, 8, 0o102755)
    );
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let a = fs.getattr(deeper.ino).unwrap();
    assert_eq!((a.gid, a.mode), (100, 0o42700));
    fs.unmount().unwrap();
}

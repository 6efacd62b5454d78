//! `chattr +C`/`-C` and `lsattr` (e2fsprogs) through the kernel's FUSE mount: the kernel
//! turns them into its own `FS_IOC_GETFLAGS`/`SETFLAGS` ioctls to the daemon, answered by
//! `Fs::file_flags`/`set_file_flags` (`docs/design/reflink.md` "No copy on write").
//! Needs root and `/dev/fuse`.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use stripefs::{DataCow, FileFlags, Fs, MkfsOptions, MountOptions};
use stripefs_fuse::serve;

#[allow(dead_code, reason = "the helpers other mount tests use")]
mod common;
use common::{file_targets, serve_options};

struct Scratch {
    dir: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let m = CString::new(self.dir.join("mnt").as_os_str().as_bytes()).unwrap();
        // SAFETY: `m` is a valid C string; a lazy unmount of a path we own.
        unsafe { libc::umount2(m.as_ptr(), libc::MNT_DETACH) };
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs a tool; its exit status and what it printed (stdout, then stderr).
fn run(cmd: &str, args: &[&str], p: &Path) -> (bool, String) {
    let out = Command::new(cmd).args(args).arg(p).output().unwrap();
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

/// The flag letters `lsattr -d` shows for `p` (the first word of its line).
fn lsattr(p: &Path) -> String {
    let (ok, out) = run("lsattr", &["-d"], p);
    assert!(ok, "lsattr {}: {out}", p.display());
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn has_c(p: &Path) -> bool {
    lsattr(p).contains('C')
}

#[test]
fn chattr_and_lsattr_set_and_show_nocow() {
    let dir = std::env::temp_dir().join(format!("stripefs-fuse-attr-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("mnt")).unwrap();
    let scratch = Scratch { dir };
    let targets = || file_targets(&scratch.dir, 2, 64 << 20);
    Fs::mkfs(&targets(), &MkfsOptions::default()).unwrap();
    let opts = MountOptions {
        datacow: DataCow::On,
        ..MountOptions::default()
    };
    let (fs, _) = Fs::mount(targets(), opts).unwrap();
    let fs = Arc::new(fs);
    let mnt = scratch.dir.join("mnt");
    let m = serve(fs.clone(), &mnt, &serve_options()).unwrap();

    // An empty file: +C and -C both take, as lsattr and the library see.
    let f = mnt.join("f");
    fs::write(&f, b"").unwrap();
    assert!(!has_c(&f), "datacow=on: a new file is copy on write");
    let (ok, out) = run("chattr", &["+C"], &f);
    assert!(ok, "chattr +C: {out}");
    // e2fsprogs 1.47's 22 letters: C is the 16th (what `stripefs io lsattr` prints too).
    assert_eq!(lsattr(&f), "---------------C------");
    let ino = fs.resolve(Path::new("/f"), stripefs::Follow::Yes).unwrap();
    assert_eq!(fs.file_flags(ino).unwrap(), FileFlags::NOCOW);
    let (ok, out) = run("chattr", &["-C"], &f);
    assert!(ok, "chattr -C: {out}");
    assert!(!has_c(&f));
    // A file with data keeps its flag; chattr succeeds (btrfs).
    fs::write(&f, b"data").unwrap();
    let (ok, out) = run("chattr", &["+C"], &f);
    assert!(ok, "chattr +C on a full file: {out}");
    assert!(!has_c(&f), "kept");
    // A directory: set freely, inherited by what is created in it.
    let d = mnt.join("d");
    fs::create_dir(&d).unwrap();
    let (ok, out) = run("chattr", &["+C"], &d);
    assert!(ok, "chattr +C dir: {out}");
    assert!(has_c(&d));
    fs::write(d.join("g"), b"x").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    assert!(has_c(&d.join("g")) && has_c(&d.join("sub")));
    // Letters this file system does not keep are refused, and change nothing.
    let (ok, out) = run("chattr", &["+A"], &d);
    assert!(!ok, "chattr +A must fail: {out}");
    assert!(out.contains("Operation not supported"), "{out}");
    assert!(has_c(&d));
    // The flags are the inode's, read back by the library under the mount.
    let g = fs
        .resolve(Path::new("/d/g"), stripefs::Follow::Yes)
        .unwrap();
    assert_eq!(fs.file_flags(g).unwrap(), FileFlags::NOCOW);
    let u = m.unmounter();
    let mut tries = 0;
    loop {
        match u.unmount() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    }
    m.join().unwrap();
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    let r = stripefs::fsck::fsck(targets(), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

//! `cp` through the kernel's FUSE mount shares blocks (`FUSE_COPY_FILE_RANGE` answered
//! by cloning, `docs/design/reflink.md`): a large copy takes no new space (`statfs`), and
//! each copy keeps its own contents after both are modified. Needs root and `/dev/fuse`.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use stripefs::{Fs, MkfsOptions, MountOptions};
use stripefs_fuse::serve;

#[allow(dead_code, reason = "the helpers other mount tests use")]
mod common;
use common::{file_targets, serve_options};

const FILE: u64 = 128 << 20;

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

/// Free blocks of the mounted file system (`f_bfree`) and its block size.
fn free(p: &Path) -> (u64, u64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_bfree, st.f_frsize)
}

/// Byte `i` of the source file.
fn byte(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn check(p: &Path, patches: &[(u64, u8)], what: &str) {
    let f = fs::File::open(p).unwrap();
    assert_eq!(f.metadata().unwrap().len(), FILE, "{what}: size");
    let mut buf = vec![0u8; 8 << 20];
    let mut off = 0;
    while off < FILE {
        f.read_exact_at(&mut buf, off).unwrap();
        for (i, b) in buf.iter().enumerate() {
            let at = off + i as u64;
            let want = patches
                .iter()
                .find(|(o, _)| (*o..*o + 4096).contains(&at))
                .map_or(byte(at), |(_, v)| *v);
            assert_eq!(*b, want, "{what}: byte {at}");
        }
        off += buf.len() as u64;
    }
}

#[test]
fn cp_of_a_large_file_shares_blocks_and_each_copy_keeps_its_writes() {
    let dir = std::env::temp_dir().join(format!("stripefs-fuse-reflink-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("mnt")).unwrap();
    let scratch = Scratch { dir };
    let targets = || file_targets(&scratch.dir, 3, 192 << 20);
    Fs::mkfs(&targets(), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(targets(), MountOptions::default()).unwrap();
    let fs = Arc::new(fs);
    let mnt = scratch.dir.join("mnt");
    let m = serve(fs.clone(), &mnt, &serve_options()).unwrap();

    let (src, dst) = (mnt.join("src"), mnt.join("dst"));
    {
        let mut f = fs::File::create(&src).unwrap();
        let mut chunk = vec![0u8; 4 << 20];
        let mut off = 0;
        while off < FILE {
            for (i, b) in chunk.iter_mut().enumerate() {
                *b = byte(off + i as u64);
            }
            f.write_all(&chunk).unwrap();
            off += chunk.len() as u64;
        }
        f.sync_all().unwrap();
    }
    let (before, bsize) = free(&mnt);
    let out = Command::new("cp").arg(&src).arg(&dst).output().unwrap();
    assert!(
        out.status.success(),
        "cp: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = fs::File::open(&dst).unwrap();
    d.sync_all().unwrap();
    drop(d);
    let (after, _) = free(&mnt);
    let used = before.saturating_sub(after) * bsize;
    assert!(
        used < FILE / 100,
        "cp of {FILE} bytes used {used} bytes of space: not shared"
    );
    assert!(
        fs.shared_blocks() * bsize >= FILE - 4096,
        "{} blocks shared",
        fs.shared_blocks()
    );

    // Modify each copy in other places; both keep their own contents.
    let src_patches = [(0u64, 0x11u8), (FILE / 2 + 4096, 0x22)];
    let dst_patches = [(4096u64, 0x33u8), (FILE - 4096, 0x44)];
    for (p, patches) in [(&src, &src_patches), (&dst, &dst_patches)] {
        let f = OpenOptions::new().write(true).open(p).unwrap();
        for (o, v) in patches {
            f.write_all_at(&[*v; 4096], *o).unwrap();
        }
        f.sync_all().unwrap();
    }
    check(&src, &src_patches, "source");
    check(&dst, &dst_patches, "copy");
    fs.check_refcounts().unwrap();

    // EBUSY for a moment after a close (deferred fput): retry for up to 2 s.
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

/// Runs fio with the common verify options plus `args` on `file`; its success and output.
fn fio(file: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("fio")
        .arg(format!("--filename={}", file.display()))
        .args([
            "--ioengine=psync",
            "--size=16m",
            "--verify=crc32c",
            "--minimal",
        ])
        .args(args)
        .output()
        .unwrap();
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

/// Issue 12: fio verify on a file and its clone. A file written with fio's verify
/// pattern is copied with `cp` (`copy_file_range`, shared blocks); the copy verifies;
/// then each is overwritten at random (direct on one, buffered on the other) and
/// verified, and each still verifies its own pattern after the other's writes.
#[test]
fn fio_verify_on_a_file_and_its_clone() {
    let dir = std::env::temp_dir().join(format!("stripefs-fuse-fio-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("mnt")).unwrap();
    let scratch = Scratch { dir };
    let targets = || file_targets(&scratch.dir, 3, 64 << 20);
    Fs::mkfs(&targets(), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(targets(), MountOptions::default()).unwrap();
    let fs = Arc::new(fs);
    let mnt = scratch.dir.join("mnt");
    let m = serve(fs.clone(), &mnt, &serve_options()).unwrap();
    let (src, dst) = (mnt.join("src"), mnt.join("dst"));
    let seq = ["--name=a", "--rw=write", "--bs=64k"];
    let b = [
        "--name=b",
        "--rw=randwrite",
        "--bs=4k",
        "--io_size=4m",
        "--randseed=11",
        "--direct=1",
    ];
    let c = [
        "--name=c",
        "--rw=randwrite",
        "--bs=16k",
        "--io_size=4m",
        "--randseed=22",
    ];
    fn only<'a>(j: &[&'a str]) -> Vec<&'a str> {
        [j, &["--verify_only"]].concat()
    }
    let (ok, out) = fio(&src, &seq);
    assert!(ok, "fio write+verify src: {out}");
    let cp = Command::new("cp").arg(&src).arg(&dst).output().unwrap();
    assert!(cp.status.success(), "cp: {cp:?}");
    assert!(fs.shared_blocks() > 0, "cp shared blocks");
    let (ok, out) = fio(&dst, &only(&seq));
    assert!(ok, "the clone verifies as the source: {out}");
    let (ok, out) = fio(&dst, &b);
    assert!(ok, "fio direct overwrite+verify of the clone: {out}");
    let (ok, out) = fio(&src, &only(&seq));
    assert!(ok, "the source is untouched by the clone's writes: {out}");
    let (ok, out) = fio(&src, &c);
    assert!(ok, "fio buffered overwrite+verify of the source: {out}");
    let (ok, out) = fio(&dst, &only(&b));
    assert!(ok, "the clone keeps its writes after the source's: {out}");
    // The check can fail: the clone no longer holds the source's pattern everywhere.
    let (ok, _) = fio(&dst, &only(&seq));
    assert!(!ok, "fio verify must notice the clone's overwrites");
    fs.check_refcounts().unwrap();
    fs.check_space_accounting().unwrap();
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

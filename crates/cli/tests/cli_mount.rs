//! `stripefs mount` / `stripefs umount` as a user runs them: a background daemon, a clean
//! unmount, a refused second mount, and a daemon killed with SIGKILL.
//! Needs root and `/dev/fuse` (CI has both; see the README).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stripefs"))
}

/// `-o transport=` of the mounts here: `STRIPEFS_FUSE_TRANSPORT`, else `dev`, as in the
/// fuse crate's mount tests (the default, `auto`, would follow whatever the host's
/// `enable_uring` is, which other tests switch on).
fn transport_args() -> [String; 2] {
    let t = std::env::var("STRIPEFS_FUSE_TRANSPORT").unwrap_or_else(|_| "dev".into());
    ["-o".into(), format!("transport={t}")]
}

fn run(cmd: &mut Command) -> (i32, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    )
}

struct Setup {
    dir: PathBuf,
    targets: Vec<String>,
}

impl Setup {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("stripefs-mnt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("m")).unwrap();
        let targets: Vec<String> = (0..3)
            .map(|i| dir.join(format!("t{i}")).display().to_string())
            .collect();
        let (rc, out) = run(bin()
            .args(["mkfs", "-s", "64m", "--no-prezero"])
            .args(&targets));
        assert_eq!(rc, 0, "{out}");
        Self { dir, targets }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.join("m")
    }

    /// The transport option, the targets and the mount point.
    fn mount_args(&self) -> Vec<String> {
        let mut a = transport_args().to_vec();
        a.extend(self.targets_and_mnt());
        a
    }

    fn targets_and_mnt(&self) -> Vec<String> {
        let mut a = self.targets.clone();
        a.push(self.mnt().display().to_string());
        a
    }

    fn fsck(&self) -> (i32, String) {
        run(bin().arg("fsck").args(&self.targets))
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        lazy_umount(&self.mnt());
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn lazy_umount(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; detaching a mount this test made.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

fn wait_mounted(p: &Path, child: &mut Child) {
    let start = Instant::now();
    let want = p.to_str().unwrap().to_string();
    loop {
        let m = fs::read_to_string("/proc/self/mounts").unwrap();
        if m.lines()
            .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
        {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "daemon exited early");
        assert!(start.elapsed() < Duration::from_secs(60), "not mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn background_mount_umount_and_a_refused_second_mount() {
    let s = Setup::new("bg");
    let (rc, out) = run(bin().arg("mount").args(s.mount_args()));
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("stripefs umount"), "{out}");
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(s.mnt().join("f"), &data).unwrap();
    // Requests the daemon logs (fuser warns about unimplemented ioctls) after `mount`
    // has exited must not kill it: its stderr was a pipe to `mount` (found by stress-ng).
    let f = File::open(s.mnt().join("f")).unwrap();
    for _ in 0..50 {
        let mut flags = 0i32;
        // SAFETY: FS_IOC_GETFLAGS writes one int into `flags`.
        unsafe {
            libc::ioctl(
                std::os::unix::io::AsRawFd::as_raw_fd(&f),
                0x8008_6601,
                &mut flags,
            )
        };
    }
    drop(f);
    assert_eq!(fs::read(s.mnt().join("f")).unwrap(), data);
    // Same targets again: refused with a reason, and the first mount is untouched.
    fs::create_dir_all(s.dir.join("m2")).unwrap();
    let mut again = s.targets.clone();
    again.push(s.dir.join("m2").display().to_string());
    let (rc, out) = run(bin().arg("mount").args(transport_args()).args(&again));
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("in use by a stripefs mount"), "{out}");
    // So is a second engine through `io`, with the targets named in another order.
    let mut reversed = s.targets.clone();
    reversed.reverse();
    let (rc, out) = run(bin().args(["io", "-c", "ls /"]).args(&reversed));
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("in use by a stripefs mount"), "{out}");
    // Not fsynced: a clean unmount still writes it back and checkpoints before returning.
    let (rc, out) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = s.fsck();
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("clean"), "{out}");
    let (rc, out) = run(bin()
        .args(["io", "-c", "open /f", "-c", "stat"])
        .args(&s.targets));
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("2000000"), "{out}");
}

#[test]
fn sigkill_loses_only_what_was_never_fsynced() {
    let s = Setup::new("kill");
    let mut daemon = bin()
        .arg("mount")
        .arg("-f")
        .args(s.mount_args())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_mounted(&s.mnt(), &mut daemon);
    let synced: Vec<u8> = (0..1_500_000u32).map(|i| (i % 241) as u8).collect();
    let mut f = File::create(s.mnt().join("synced")).unwrap();
    f.write_all(&synced).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(s.mnt().join("unsynced"), b"may be lost").unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    lazy_umount(&s.mnt());

    // The next mount recovers from the journal; the fsynced file is intact.
    let (rc, out) = run(bin().arg("mount").args(s.mount_args()));
    assert_eq!(rc, 0, "{out}");
    assert_eq!(fs::read(s.mnt().join("synced")).unwrap(), synced);
    let (rc, out) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = s.fsck();
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("clean"), "{out}");
}

/// A plain `umount2(2)`, retried while `EBUSY`: a child another test thread is forking
/// holds copies of this process's descriptors (a file just written) until it execs.
fn umount_retrying_ebusy(mnt: &CString) {
    for _ in 0..100 {
        // SAFETY: a valid C string naming a mount this test made.
        if unsafe { libc::umount2(mnt.as_ptr(), 0) } == 0 {
            return;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("still busy after 2 s");
}

/// `mount -t fuse.stripefs` as `mount(8)` runs it (the helper, by its name) prints
/// nothing, and a mount right after a plain `umount2(2)` (what `umount(8)`, systemd and
/// scripts do; it returns before the daemon's final checkpoint) waits for the daemon to
/// release the targets instead of failing with "in use" (issue 9, item 11).
#[test]
fn helper_is_silent_and_mount_after_plain_umount_waits_for_the_old_daemon() {
    let s = Setup::new("loop");
    let helper = s.dir.join("mount.fuse.stripefs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stripefs"), &helper).unwrap();
    let source = s.targets.join(":");
    let mnt = CString::new(s.mnt().as_os_str().as_bytes()).unwrap();
    let payload = vec![7u8; 4 << 20];
    for round in 0..10 {
        let out = Command::new(&helper)
            .arg(&source)
            .arg(s.mnt())
            .args(["-o", "rw"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout.is_empty(),
            "the helper talked: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Dirty data makes the daemon's final writeback and checkpoint take a while.
        fs::write(s.mnt().join(format!("f{round}")), &payload).unwrap();
        umount_retrying_ebusy(&mnt);
    }
    // fsck waits the same way for the last daemon, then finds every round's file.
    let (rc, out) = s.fsck();
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = run(bin().args(["io", "-c", "ls /"]).args(&s.targets));
    assert_eq!(rc, 0, "{out}");
    for round in 0..10 {
        assert!(out.contains(&format!("f{round}")), "{out}");
    }
}

/// Waits until the target files' modification times have not changed for 1 s (at least
/// 2 s, at most 60 s).
fn wait_targets_quiet(targets: &[String]) {
    let stamp = || -> Vec<std::time::SystemTime> {
        targets
            .iter()
            .map(|t| fs::metadata(t).unwrap().modified().unwrap())
            .collect()
    };
    let start = Instant::now();
    let (mut last, mut since) = (stamp(), Instant::now());
    while start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        let now = stamp();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_secs(1)
            && start.elapsed() >= Duration::from_secs(2)
        {
            return;
        }
    }
    panic!("the targets kept changing for 60 s after remounting read-only");
}

fn remount_syscall(mnt: &Path, flags: libc::c_ulong) -> std::io::Result<()> {
    let c = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings; a remount takes no data.
    let rc = unsafe {
        libc::mount(
            c.as_ptr(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn superblock_read_only(mnt: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
        .expect("mounted");
    let sb = line.split(" - ").nth(1).unwrap();
    sb.split(' ').nth(2).unwrap().split(',').any(|o| o == "ro")
}

/// `mount -o remount,ro` and back (issue 9, item 14): through the helper (which waits
/// until the daemon has checkpointed) and as a bare `mount(2)` (what `mount(8)` does
/// itself for type `fuse`, which the daemon notices on its own). Proof that the daemon
/// wrote back and checkpointed: after SIGKILL nothing is replayed and the never-fsynced
/// data is there.
#[test]
fn remount_read_only_and_back() {
    let s = Setup::new("remount");
    let mut daemon = bin()
        .arg("mount")
        .arg("-f")
        .args(s.mount_args())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_mounted(&s.mnt(), &mut daemon);
    let helper = s.dir.join("mount.fuse.stripefs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stripefs"), &helper).unwrap();
    let helper_remount = |opts: &str| {
        Command::new(&helper)
            .arg(s.targets.join(":"))
            .arg(s.mnt())
            .args(["-o", opts])
            .output()
            .unwrap()
    };
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 249) as u8).collect();
    fs::write(s.mnt().join("f"), &data).unwrap(); // never fsynced

    // Refused while a file is open for writing, as for a kernel file system.
    let w = fs::OpenOptions::new()
        .append(true)
        .open(s.mnt().join("f"))
        .unwrap();
    let out = helper_remount("remount,ro");
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("open for writing"), "{msg}");
    drop(w);

    let out = helper_remount("remount,ro");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "the helper talked");
    assert!(superblock_read_only(&s.mnt()));
    let e = fs::write(s.mnt().join("g"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(fs::read(s.mnt().join("f")).unwrap(), data);

    // Back to read-write by a bare mount(2): the very next change is accepted.
    remount_syscall(&s.mnt(), 0).unwrap();
    assert!(!superblock_read_only(&s.mnt()));
    fs::write(s.mnt().join("g"), b"yes").unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(s.mnt().join("f"))
        .unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);

    // Read-only again by a bare mount(2): the daemon follows by itself.
    remount_syscall(&s.mnt(), libc::MS_RDONLY).unwrap();
    // It does so asynchronously (an fsync of the root would wait, but would also make
    // the daemon follow, which is not what this step tests): wait until the targets
    // have not changed for a second, at least 2 s and at most 60 s after the remount.
    wait_targets_quiet(&s.targets);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    lazy_umount(&s.mnt());
    let (rc, out) = run(bin()
        .args([
            "io", "-c", "open /f", "-c", "stat", "-c", "open /g", "-c", "stat",
        ])
        .args(&s.targets));
    assert_eq!(rc, 0, "{out}");
    assert!(!out.contains("recovered"), "{out}");
    assert!(out.contains("1000004"), "{out}");
    let (rc, out) = s.fsck();
    assert_eq!(rc, 0, "{out}");
}

/// `stripefs mount` returns only once the daemon serves requests, and a log line the
/// daemon writes after `mount` has exited never kills it. Under io_uring the mount
/// shows in `/proc/mounts` before the rings are registered; `mount` used to return then,
/// and the daemon's "FUSE transport" line (`STRIPEFS_LOG=info`) went to the pipe of the
/// exited `mount`: tracing-subscriber reports a failed write with `eprintln!`, which
/// panicked the main thread, and the first request failed with `ECANCELED`,
/// `ECONNABORTED` or `ENOTCONN` (8 mounts in 15 by hand).
#[test]
fn mount_returns_serving_and_survives_its_logs() {
    // FUSE over io_uring where the kernel has it (its registration widens the window).
    let param = "/sys/module/fuse/parameters/enable_uring";
    if fs::read_to_string(param).is_ok_and(|v| v.trim() != "Y") {
        let _ = fs::write(param, "Y");
    }
    let s = Setup::new("ready");
    for round in 0..12 {
        let (rc, out) = run(bin()
            .env("STRIPEFS_LOG", "info")
            .args(["mount", "-o", "transport=auto"])
            .args(s.targets_and_mnt()));
        assert_eq!(rc, 0, "{out}");
        let d = s.mnt().join(format!("d{round}"));
        if let Err(e) = fs::create_dir(&d) {
            panic!("round {round}: the first request after mount failed: {e}");
        }
        let (rc, out) = run(bin().arg("umount").arg(s.mnt()));
        assert_eq!(rc, 0, "round {round}: {out}");
    }
}

/// `stripefs scrub MOUNTPOINT`: the daemon verifies every checksummed block through its
/// scrub ioctl, reports a damaged one by file and offset, and refuses anything but the
/// mount's root.
#[test]
fn online_scrub_reports_a_damaged_block_through_the_mount() {
    let s = Setup::new("scrub");
    let (rc, out) = run(bin().arg("io").args(&s.targets).args([
        "-o",
        "datacow=on",
        "-c",
        "open -f /c",
        "-c",
        "pwrite -S 0x63 0 512k",
        "-c",
        "fsync",
        "-c",
        "stat",
        "-c",
        "bmap",
    ]));
    assert_eq!(rc, 0, "{out}");
    let ino = stat_ino(&out);
    let (tgt, at) = locate(&out, 4096);
    let scrub_mounted = |extra: &[&str]| {
        let (rc, out) = run(bin().arg("mount").args(s.mount_args()));
        assert_eq!(rc, 0, "{out}");
        fs::create_dir_all(s.mnt().join("d")).unwrap();
        let (sub_rc, sub_out) = run(bin().arg("scrub").arg(s.mnt().join("d")));
        let got = run(bin().arg("scrub").args(extra).arg(s.mnt()));
        let (rc, out) = run(bin().arg("umount").arg(s.mnt()));
        assert_eq!(rc, 0, "{out}");
        assert_eq!(sub_rc, 8, "{sub_out}");
        assert!(
            sub_out.contains("not the root of a stripefs mount"),
            "{sub_out}"
        );
        got
    };
    let (rc, out) = scrub_mounted(&["--rate", "64"]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("128 checksummed blocks (524288 bytes) verified: clean"),
        "{out}"
    );
    // Flip a byte of the file's second block (file offset 4096) while unmounted.
    flip_byte(&s.targets[tgt], at + 100);
    let (rc, out) = scrub_mounted(&[]);
    assert_eq!(rc, 1, "{out}");
    let want = format!(
        "mismatch: inode {ino} offset 4096 (target {tgt} block {})",
        at / 4096
    );
    assert!(out.contains(&want), "{want} in {out}");
    assert_eq!(out.matches("mismatch:").count(), 1, "{out}");
    assert!(out.contains("verified: 1 mismatches"), "{out}");
}

/// The inode number `stripefs io`'s `stat` printed in `out`.
fn stat_ino(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("stat.ino = "))
        .expect("stat.ino")
        .trim()
        .parse()
        .unwrap()
}

/// Where file offset `off` lives, from `stripefs io`'s `bmap` lines in `out`
/// (" N: [F..G]: target T [A..B]", 512-byte units): (target index, byte offset on it).
fn locate(out: &str, off: u64) -> (usize, u64) {
    for l in out.lines().filter(|l| l.contains(": target ")) {
        let num = |s: &str| -> u64 { s.trim().parse().unwrap() };
        let (file, rest) = l.split_once("]: target ").unwrap();
        let (f, g) = file.rsplit_once('[').unwrap().1.split_once("..").unwrap();
        let (t, phys) = rest.split_once(" [").unwrap();
        let a = phys.split_once("..").unwrap().0;
        let (from, to) = (num(f) * 512, (num(g) + 1) * 512);
        if (from..to).contains(&off) {
            return (num(t) as usize, num(a) * 512 + off - from);
        }
    }
    panic!("offset {off} is not mapped in {out}");
}

/// Flips bits of one byte of a target file, as bit rot would (the file system is not
/// mounted).
fn flip_byte(target: &str, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(target)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, at).unwrap();
    f.sync_all().unwrap();
}

/// A foreground daemon (`stripefs mount -f`) logging to `log`; `stripefs umount` ends it.
fn mount_logged(s: &Setup, opts: &str, log: &Path) -> Child {
    let mut child = bin()
        .args(["mount", "-f", "-o", opts])
        .args(s.mount_args())
        .stdout(Stdio::null())
        .stderr(File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_mounted(&s.mnt(), &mut child);
    child
}

fn umount_logged(s: &Setup, mut child: Child) {
    let (rc, out) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(rc, 0, "{out}");
    assert!(child.wait().unwrap().success());
}

/// `len` bytes at `off` of `path`, read with `O_DIRECT` into an aligned buffer.
fn read_direct(path: &Path, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut buf = vec![0u8; len + 4096];
    let skip = buf.as_ptr().align_offset(4096);
    let n = f.read_at(&mut buf[skip..skip + len], off)?;
    Ok(buf[skip..skip + n].to_vec())
}

fn is_eio(r: &std::io::Result<impl std::fmt::Debug>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

/// The bytes of file `i` (distinct per file and per block, so a block read from the
/// wrong place shows).
fn pattern(i: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j / 4096) as u8 ^ (j % 251) as u8 ^ i.wrapping_mul(37))
        .collect()
}

/// Guards issue 12's promise that a damaged data block of a copy-on-write file never
/// reaches a reader through the mount: one byte flipped on a target under a file written
/// through the mount fails, with `EIO`, a buffered read of the block, the sequential read
/// whose readahead reaches it and an `O_DIRECT` read; every other block outside the
/// damaged block's folio (the page cache reads whole folios, at most 64 KiB) and the
/// other files read their bytes; the daemon's log names the block; the online scrub
/// reports it. Each path runs on a fresh mount, so no cache answers for the target.
#[test]
fn a_damaged_block_fails_every_read_path_through_the_mount() {
    damaged_block_through_the_mount("datacow=on");
}

fn damaged_block_through_the_mount(opts: &str) {
    const FILE: usize = 256 << 10;
    const BAD: u64 = 160 << 10;
    const FOLIO: u64 = 64 << 10;
    let s = Setup::new("damaged");
    let log = s.dir.join("daemon.log");
    let files: Vec<PathBuf> = (0..3).map(|i| s.mnt().join(format!("f{i}"))).collect();
    let daemon = mount_logged(&s, opts, &log);
    for (i, p) in files.iter().enumerate() {
        let mut f = File::create(p).unwrap();
        f.write_all(&pattern(i as u8, FILE)).unwrap();
        f.sync_all().unwrap();
    }
    umount_logged(&s, daemon);
    let (rc, out) = run(bin()
        .args(["io", "-c", "open /f1", "-c", "stat", "-c", "bmap"])
        .args(&s.targets));
    assert_eq!(rc, 0, "{out}");
    let ino = stat_ino(&out);
    let (tgt, at) = locate(&out, BAD);
    flip_byte(&s.targets[tgt], at + 100);
    let want = pattern(1, FILE);
    let blk = |off: u64| &want[off as usize..off as usize + 4096];

    // A buffered read of the damaged block; the daemon logs it.
    let daemon = mount_logged(&s, opts, &log);
    let f = File::open(&files[1]).unwrap();
    let mut b = [0u8; 4096];
    let r = std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, BAD);
    let differ: Vec<_> = (0..4096).filter(|&j| b[j] != blk(BAD)[j]).collect();
    assert!(
        is_eio(&r),
        "buffered read of the damaged block: {r:?}, bytes differing at {differ:?}"
    );
    drop(f);
    umount_logged(&s, daemon);
    let logged = fs::read_to_string(&log).unwrap();
    let line = format!(
        "data checksum mismatch: inode {ino} offset {BAD}, target {tgt} ({}) block {}",
        s.targets[tgt],
        at / 4096
    );
    assert!(
        logged.contains(&line),
        "{line} in the daemon's log:\n{logged}"
    );

    // Sequential 4 KiB reads from the start: readahead (the kernel's, then the
    // daemon's) reaches the damaged block before the reader does; the blocks before its
    // folio read fine, the reader meets EIO in its folio, not after the damaged block.
    let daemon = mount_logged(&s, opts, &log);
    let mut f = File::open(&files[1]).unwrap();
    let mut off = 0u64;
    let failed_at = loop {
        let mut b = [0u8; 4096];
        match std::io::Read::read_exact(&mut f, &mut b) {
            Ok(()) => assert_eq!(&b[..], blk(off), "block at {off}"),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "at {off}: {e}");
                break off;
            }
        }
        off += 4096;
        assert!(off < FILE as u64, "the whole file read without an error");
    };
    assert!(
        (BAD & !(FOLIO - 1)..=BAD).contains(&failed_at),
        "sequential read failed at {failed_at}"
    );
    drop(f);
    umount_logged(&s, daemon);

    // O_DIRECT: the damaged block, alone or in a longer read, fails; its neighbours in
    // the same folio read fine (a direct read fails only where it covers the block).
    let daemon = mount_logged(&s, opts, &log);
    let r = read_direct(&files[1], BAD, 4096);
    assert!(is_eio(&r), "O_DIRECT read of the damaged block: {r:?}");
    let r = read_direct(&files[1], BAD - 4096, 3 * 4096);
    assert!(is_eio(&r), "O_DIRECT read across the damaged block: {r:?}");
    for near in [BAD - 4096, BAD + 4096] {
        let got = read_direct(&files[1], near, 4096).unwrap();
        assert_eq!(&got[..], blk(near), "O_DIRECT read at {near}");
    }
    // Every block outside the damaged folio, buffered, and the other files.
    let f = File::open(&files[1]).unwrap();
    for off in (0..FILE as u64).step_by(4096) {
        if off & !(FOLIO - 1) != BAD & !(FOLIO - 1) {
            let mut b = [0u8; 4096];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, off).unwrap();
            assert_eq!(&b[..], blk(off), "buffered read at {off}");
        }
    }
    drop(f);
    for i in [0, 2] {
        assert_eq!(fs::read(&files[i]).unwrap(), pattern(i as u8, FILE), "f{i}");
    }
    // The online scrub reports the block, and only it.
    let (rc, out) = run(bin().arg("scrub").arg(s.mnt()));
    assert_eq!(rc, 1, "{out}");
    let want = format!(
        "mismatch: inode {ino} offset {BAD} (target {tgt} block {})",
        at / 4096
    );
    assert!(out.contains(&want), "{want} in {out}");
    assert_eq!(out.matches("mismatch:").count(), 1, "{out}");
    umount_logged(&s, daemon);
}

/// `stripefs add-target MOUNTPOINT PATH`: the daemon opens and adds the target, new files
/// written through the mount stripe over it, a subdirectory and a second add of the same
/// path are refused; after the unmount fsck needs the new target and finds it clean.
#[test]
fn add_target_grows_a_mounted_file_system() {
    let s = Setup::new("add");
    let new = s.dir.join("t3");
    fs::File::create(&new).unwrap().set_len(64 << 20).unwrap();
    let (rc, out) = run(bin().arg("mount").args(s.mount_args()));
    assert_eq!(rc, 0, "{out}");
    fs::write(s.mnt().join("before"), pattern(1, 300_000)).unwrap();
    fs::create_dir_all(s.mnt().join("d")).unwrap();
    let (sub_rc, sub_out) = run(bin().arg("add-target").arg(s.mnt().join("d")).arg(&new));
    let (rc, out) = run(bin().arg("add-target").arg(s.mnt()).arg(&new));
    let (again_rc, again_out) = run(bin().arg("add-target").arg(s.mnt()).arg(&new));
    for i in 0..8u8 {
        fs::write(s.mnt().join(format!("after{i}")), pattern(i, 200_000)).unwrap();
    }
    assert_eq!(
        fs::read(s.mnt().join("before")).unwrap(),
        pattern(1, 300_000)
    );
    let (urc, uout) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(urc, 0, "{uout}");
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("target 3:"), "{out}");
    assert_ne!(sub_rc, 0, "{sub_out}");
    assert!(
        sub_out.contains("not the root of a stripefs mount"),
        "{sub_out}"
    );
    assert_ne!(again_rc, 0, "{again_out}");
    assert!(again_out.contains("add-target refused"), "{again_out}");
    let mut all = s.targets.clone();
    all.push(new.display().to_string());
    let (rc, out) = run(bin().arg("fsck").args(&all));
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = s.fsck();
    assert_ne!(rc, 0, "{out}");
    assert!(
        out.contains("target index 3") && out.contains("give its path"),
        "{out}"
    );
    let (rc, out) = run(bin().arg("inspect").args(&all));
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("targets: 4 (3 from mkfs, 1 added by add-target)"),
        "{out}"
    );
}

/// `stripefs evacuate MOUNTPOINT TARGET`: moves every block off target 2 of a mounted
/// file system through the daemon's ioctl; data reads back, fsck is clean after the
/// unmount; target 0 and a subdirectory are refused with a message.
#[test]
fn evacuate_empties_a_target_of_a_mounted_file_system() {
    let s = Setup::new("evac");
    let (rc, out) = run(bin().arg("mount").args(s.mount_args()));
    assert_eq!(rc, 0, "{out}");
    for i in 0..6u8 {
        fs::write(s.mnt().join(format!("f{i}")), pattern(i, 700_000)).unwrap();
    }
    fs::create_dir_all(s.mnt().join("d")).unwrap();
    let (sub_rc, sub_out) = run(bin().arg("evacuate").arg(s.mnt().join("d")).arg("2"));
    let (zero_rc, zero_out) = run(bin().arg("evacuate").arg(s.mnt()).arg("0"));
    let (rc, out) = run(bin().arg("evacuate").arg(s.mnt()).arg("2"));
    fs::write(s.mnt().join("after"), pattern(9, 500_000)).unwrap();
    for i in 0..6u8 {
        assert_eq!(
            fs::read(s.mnt().join(format!("f{i}"))).unwrap(),
            pattern(i, 700_000),
            "f{i} after the evacuation"
        );
    }
    let (urc, uout) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(urc, 0, "{uout}");
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("target 2 evacuated:"), "{out}");
    assert_ne!(sub_rc, 0, "{sub_out}");
    assert!(
        sub_out.contains("not the root of a stripefs mount"),
        "{sub_out}"
    );
    assert_ne!(zero_rc, 0, "{zero_out}");
    assert!(
        zero_out.contains("target 0 cannot be evacuated"),
        "{zero_out}"
    );
    let (rc, out) = s.fsck();
    assert_eq!(rc, 0, "{out}");
}

/// `stripefs remove-target MOUNTPOINT TARGET`: evacuates target 2 of a mounted file
/// system and retires it; the file system then mounts, reads and passes fsck without
/// that disk, and `inspect` names it retired. Before, a writable member's absence is
/// refused by name.
#[test]
fn remove_target_takes_a_disk_out_of_a_mounted_file_system() {
    let s = Setup::new("remove");
    let (rc, out) = run(bin().arg("mount").args(s.mount_args()));
    assert_eq!(rc, 0, "{out}");
    for i in 0..6u8 {
        fs::write(s.mnt().join(format!("f{i}")), pattern(i, 700_000)).unwrap();
    }
    let (rc, out) = run(bin().arg("remove-target").arg(s.mnt()).arg("2"));
    let (again_rc, again_out) = run(bin().arg("remove-target").arg(s.mnt()).arg("2"));
    let (urc, uout) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(urc, 0, "{uout}");
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("target 2 evacuated:"), "{out}");
    assert!(out.contains("target 2 retired"), "{out}");
    assert_ne!(again_rc, 0, "{again_out}");
    let two = &s.targets[..2];
    let mut args: Vec<String> = two.to_vec();
    args.push(s.mnt().display().to_string());
    let (rc, out) = run(bin().arg("mount").args(transport_args()).args(&args));
    assert_eq!(rc, 0, "mount without target 2: {out}");
    for i in 0..6u8 {
        assert_eq!(
            fs::read(s.mnt().join(format!("f{i}"))).unwrap(),
            pattern(i, 700_000),
            "f{i} without target 2"
        );
    }
    let (urc, uout) = run(bin().arg("umount").arg(s.mnt()));
    assert_eq!(urc, 0, "{uout}");
    let (rc, out) = run(bin().arg("fsck").args(two));
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = run(bin().arg("inspect").args(two));
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("target 2: index 2 (not given) (retired)"),
        "{out}"
    );
    // Target 1 is a writable member: without it the mount is refused by name.
    let (rc, out) = run(bin().arg("fsck").arg(&s.targets[0]));
    assert_ne!(rc, 0, "{out}");
    assert!(out.contains("missing target index 1"), "{out}");
}

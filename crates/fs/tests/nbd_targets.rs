//! The file system over NBD targets served by nbdkit on Unix sockets: a round trip over
//! four targets, server errors (nbdkit's `error` filter), servers that stop answering
//! (`pause` and `delay` filters) and a server killed in the middle of writes. What must
//! hold: every I/O either succeeds with the right data or fails with `EIO` (all-or-error),
//! nothing hangs, and nothing acknowledged by fsync is lost across a server restart.
//!
//! Needs Debian's `nbdkit` (`scripts/run-tests` installs it); fails without it.
mod common;
#[path = "nbdkit/mod.rs"]
mod nbdkit;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, quiet};
use nbdkit::{open, servers, Scratch, Server};
use stripefs::{CreateParams, Fs, Ino, MkfsOptions};
use stripefs_target::{Rng, Target};

const MIB: u64 = 1 << 20;

/// Aborts the test process if the test runs longer than `secs`: a hang is a failure.
fn watchdog(name: &'static str, secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        eprintln!("{name}: still running after {secs} s: hung");
        std::process::abort();
    });
}

fn mkfs(targets: &[Arc<dyn Target>]) {
    Fs::mkfs(targets, &MkfsOptions::default()).expect("mkfs");
}

fn create(fs: &Fs, name: &str) -> Ino {
    fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .expect("create")
        .ino
}

fn read_all(fs: &Fs, ino: Ino, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    let n = fs.read_at(ino, 0, &mut buf).expect("read");
    assert_eq!(n as u64, len);
    buf
}

#[test]
fn mkfs_mount_write_verify_over_four_nbd_targets() {
    watchdog("round trip", 300);
    let dir = Scratch::new("nbd-rt");
    let srv = servers(&dir.0, 4, &["memory", "128M"]);
    let targets = open(&srv, Duration::from_secs(30));
    mkfs(&targets);
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("mount");
    let a = create(&fs, "buffered");
    let b = create(&fs, "direct");
    for i in 0..12u64 {
        fs.write_at(a, i * MIB, &pattern(1, i * MIB, MIB as usize))
            .unwrap();
        fs.write_direct(b, i * MIB, &pattern(2, i * MIB, MIB as usize))
            .unwrap();
    }
    fs.open_file(a).unwrap().sync_all().unwrap();
    fs.unmount().unwrap();
    // The old targets hold the exports' locks until dropped (`NbdTarget::open`).
    drop((fs, targets));
    // Fresh connections, as another client process would have.
    let targets = open(&srv, Duration::from_secs(30));
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("remount");
    assert!(read_all(&fs, a, 12 * MIB) == pattern(1, 0, 12 * MIB as usize));
    let mut buf = vec![0u8; (12 * MIB) as usize];
    fs.read_direct(b, 0, &mut buf).unwrap();
    assert!(buf == pattern(2, 0, 12 * MIB as usize));
    fs.unmount().unwrap();
    let report = stripefs::fsck::fsck(targets, &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Per 4 KiB block of the test file: the seed of its known content, or unknown after a
/// failed write.
struct Blocks(Vec<Option<u64>>);

impl Blocks {
    fn set(&mut self, off: u64, len: u64, v: Option<u64>) {
        for b in &mut self.0[(off / 4096) as usize..((off + len) / 4096) as usize] {
            *b = v;
        }
    }

    /// Compares `got` (read at `off`) with every block whose content is known.
    fn check(&self, off: u64, got: &[u8], what: &str) {
        for (i, chunk) in got.chunks(4096).enumerate() {
            let at = off + i as u64 * 4096;
            if let Some(seed) = self.0[(at / 4096) as usize] {
                assert!(
                    chunk == &pattern(seed, at, 4096)[..],
                    "{what}: block at {at} is neither what was written nor an error"
                );
            }
        }
    }
}

#[test]
fn server_errors_are_all_or_error_and_never_hang() {
    watchdog("error filter", 300);
    let dir = Scratch::new("nbd-err");
    let flag = dir.0.join("inject");
    let flag_arg = format!("error-file={}", flag.display());
    let srv = servers(
        &dir.0,
        4,
        &[
            "--filter=error",
            "memory",
            "64M",
            "error-rate=20%",
            &flag_arg,
        ],
    );
    let targets = open(&srv, Duration::from_secs(30));
    mkfs(&targets);
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("mount");
    const FILE: u64 = 8 * MIB;
    let ino = create(&fs, "f");
    fs.write_direct(ino, 0, &pattern(0, 0, FILE as usize))
        .unwrap();
    fs.open_file(ino).unwrap().sync_all().unwrap();
    let mut blocks = Blocks(vec![Some(0); (FILE / 4096) as usize]);
    std::fs::write(&flag, b"").unwrap();
    let mut rng = Rng::new(14);
    let (mut ok, mut failed) = (0, 0);
    for seed in 1..=300u64 {
        let len = (1 + rng.below(64)) * 4096;
        let off = rng.below((FILE - len) / 4096 + 1) * 4096;
        if rng.one_in(2) {
            match fs.write_direct(ino, off, &pattern(seed, off, len as usize)) {
                Ok(n) => {
                    assert_eq!(n as u64, len, "a direct write is all or error");
                    blocks.set(off, len, Some(seed));
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(e.errno(), libc::EIO, "{e}");
                    blocks.set(off, len, None);
                    failed += 1;
                }
            }
        } else {
            let mut buf = vec![0u8; len as usize];
            match fs.read_direct(ino, off, &mut buf) {
                Ok(n) => {
                    assert_eq!(n as u64, len, "a direct read is all or error");
                    blocks.check(off, &buf, "read under errors");
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(e.errno(), libc::EIO, "{e}");
                    failed += 1;
                }
            }
        }
    }
    assert!(
        ok > 20 && failed > 20,
        "ok {ok} failed {failed}: errors were not injected as planned"
    );
    std::fs::remove_file(&flag).unwrap();
    let mut buf = vec![0u8; FILE as usize];
    fs.read_direct(ino, 0, &mut buf).unwrap();
    blocks.check(0, &buf, "read after errors stopped");
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("remount");
    fs.read_direct(ino, 0, &mut buf).unwrap();
    blocks.check(0, &buf, "read after remount");
    fs.unmount().unwrap();
    let report = stripefs::fsck::fsck(targets, &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Sends a command to nbdkit's pause filter and waits for its echo.
fn pause_ctl(sock: &std::path::Path, cmd: u8) {
    let mut s = UnixStream::connect(sock).expect("pause control socket");
    s.write_all(&[cmd]).unwrap();
    let mut r = [0u8; 1];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[0], cmd.to_ascii_uppercase());
}

#[test]
fn a_server_that_stops_answering_gives_eio_not_a_hang() {
    watchdog("pause filter", 300);
    let dir = Scratch::new("nbd-pause");
    let ctl = |i: usize| dir.0.join(format!("ctl{i}"));
    let ctl_arg = format!("pause-control={}/ctl{{i}}", dir.0.display());
    let srv = servers(&dir.0, 4, &["--filter=pause", "memory", "64M", &ctl_arg]);
    let targets = open(&srv, Duration::from_millis(500));
    mkfs(&targets);
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("mount");
    let ino = create(&fs, "f");
    fs.write_direct(ino, 0, &pattern(1, 0, 8 * MIB as usize))
        .unwrap();
    fs.open_file(ino).unwrap().sync_all().unwrap();
    pause_ctl(&ctl(2), b'p');
    let start = Instant::now();
    let e = fs
        .write_direct(ino, 0, &pattern(2, 0, 8 * MIB as usize))
        .unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    let mut buf = vec![0u8; (8 * MIB) as usize];
    let e = fs.read_direct(ino, 0, &mut buf).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "timeouts took {:?}",
        start.elapsed()
    );
    // I/O that does not touch the paused target still works meanwhile (stripe unit
    // 1 MiB over 4 targets: [0, 1 MiB) lives on target 0).
    let mut one = vec![0u8; MIB as usize];
    fs.read_direct(ino, 0, &mut one).unwrap();
    pause_ctl(&ctl(2), b'r');
    // The server answers again: the file system carries on.
    fs.write_direct(ino, 0, &pattern(3, 0, 8 * MIB as usize))
        .unwrap();
    fs.read_direct(ino, 0, &mut buf).unwrap();
    assert!(buf == pattern(3, 0, 8 * MIB as usize));
    fs.unmount().unwrap();
}

#[test]
fn mount_fails_naming_the_uri_of_a_server_that_does_not_answer() {
    watchdog("delay filter", 300);
    let dir = Scratch::new("nbd-delay");
    let imgs: Vec<String> = (0..2)
        .map(|i| {
            let p = dir.0.join(format!("img{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(64 * MIB)
                .unwrap();
            format!("file={}", p.display())
        })
        .collect();
    let fast: Vec<Server> = (0..2)
        .map(|i| Server::start(&dir.0, &format!("t{i}"), &["file", &imgs[i]]))
        .collect();
    mkfs(&open(&fast, Duration::from_secs(30)));
    drop(fast);
    let slow = Server::start(
        &dir.0,
        "t1",
        &["--filter=delay", "file", &imgs[1], "rdelay=3", "wdelay=3"],
    );
    let t0 = Server::start(&dir.0, "t0", &["file", &imgs[0]]);
    let servers = [t0, slow];
    let start = Instant::now();
    let Err(e) = Fs::mount(open(&servers, Duration::from_millis(300)), quiet()) else {
        panic!("mount over a server that does not answer succeeded");
    };
    let msg = e.to_string();
    assert!(msg.contains(&servers[1].uri()), "{msg}");
    assert_eq!(e.errno(), libc::EIO, "{msg}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn server_killed_mid_write_loses_nothing_fsynced() {
    watchdog("killed server", 300);
    let dir = Scratch::new("nbd-kill");
    let file_arg = format!("file={}/img{{i}}", dir.0.display());
    for i in 0..4 {
        std::fs::File::create(dir.0.join(format!("img{i}")))
            .unwrap()
            .set_len(64 * MIB)
            .unwrap();
    }
    let mut srv = servers(&dir.0, 4, &["file", &file_arg]);
    let targets = open(&srv, Duration::from_secs(2));
    mkfs(&targets);
    let (fs, _) = Fs::mount(targets, quiet()).expect("mount");
    let (synced, failed, stop) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicBool::new(false),
    );
    let wait_for = |what: &str, n: &AtomicUsize, at_least: usize| {
        let start = Instant::now();
        while n.load(Ordering::SeqCst) < at_least {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "waited too long for {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let acked = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut acked = Vec::new();
            let mut k = 0u64;
            while !stop.load(Ordering::SeqCst) {
                k += 1;
                let len = (64 + (k * 37) % 900) as usize * 1024;
                let name = format!("f{k}");
                let Ok(a) = fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
                else {
                    failed.fetch_add(1, Ordering::SeqCst);
                    continue;
                };
                let res = fs
                    .write_at(a.ino, 0, &pattern(k, 0, len))
                    .and_then(|_| fs.open_file(a.ino)?.sync_all());
                match res {
                    Ok(()) => {
                        acked.push((k, len));
                        synced.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => {
                        assert!(
                            [libc::EIO, libc::EROFS].contains(&e.errno()),
                            "unexpected error {e}"
                        );
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            acked
        });
        // Kill while writes are flowing, keep the server down until they fail, restart.
        wait_for("fsynced files", &synced, 5);
        srv[1].kill();
        wait_for("a failure after the kill", &failed, 1);
        std::thread::sleep(Duration::from_millis(200));
        srv[1].restart();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap()
    });
    assert!(!acked.is_empty(), "nothing was fsynced before the kill");
    let _ = fs.unmount();
    drop(fs);
    let targets = open(&srv, Duration::from_secs(30));
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("remount after the restart");
    for &(k, len) in &acked {
        let ino = fs
            .lookup(Ino::ROOT, format!("f{k}").as_ref())
            .unwrap_or_else(|e| panic!("fsynced file f{k} lost: {e}"))
            .ino;
        assert!(
            read_all(&fs, ino, len as u64) == pattern(k, 0, len),
            "fsynced file f{k} changed"
        );
    }
    fs.unmount().unwrap();
    let report = stripefs::fsck::fsck(targets, &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

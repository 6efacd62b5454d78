//! `NbdTarget` against Debian's `nbdkit` on Unix sockets: the protocol, requests in flight,
//! multi-conn, and the failure semantics (server errors, slow servers, a killed server).
//!
//! The FUA tests put a recording proxy ([`nbd_proxy`]) between the client and nbdkit to
//! see the requests and flags on the wire.
//!
//! These tests need `nbdkit` (Debian package `nbdkit`; `scripts/run-tests` installs it) and
//! fail, rather than skip, when it is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nbd_proxy::{Proxy, Wire, CMD_FLAG_FUA, CMD_FLUSH, CMD_WRITE, TF_SEND_FLUSH, TF_SEND_FUA};
use stripefs_target::{
    Batch, FuaSupport, IoBuf, IoOp, NbdOptions, NbdTarget, Target, TargetErrorKind,
};

mod nbd_proxy;

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "stripefs-nbd-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        Self(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An nbdkit server on a Unix socket, killed on drop.
struct Server {
    child: Child,
    sock: PathBuf,
}

fn nbdkit_path() -> &'static str {
    let ok = Command::new("nbdkit")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "nbdkit is not installed: these tests need it (apt-get install nbdkit; scripts/run-tests installs it)"
    );
    "nbdkit"
}

impl Server {
    /// Starts `nbdkit [filters] plugin args` serving on `dir/name.sock`.
    fn start(dir: &Path, name: &str, args: &[&str]) -> Self {
        let sock = dir.join(format!("{name}.sock"));
        let pid = dir.join(format!("{name}.pid"));
        let _ = std::fs::remove_file(&pid);
        let child = Command::new(nbdkit_path())
            .arg("-f")
            .arg("--exit-with-parent")
            .arg("-U")
            .arg(&sock)
            .arg("-P")
            .arg(&pid)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("start nbdkit");
        let start = Instant::now();
        while !pid.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, sock }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.sock);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn opts(timeout_ms: u64) -> NbdOptions {
    NbdOptions {
        timeout: Duration::from_millis(timeout_ms),
        ..NbdOptions::default()
    }
}

fn pattern(seed: u64, len: usize) -> IoBuf {
    let mut b = IoBuf::zeroed(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (seed as usize * 31 + i * 7 + (i >> 9)) as u8 | 1;
    }
    b
}

#[test]
fn many_requests_in_flight_split_and_read_back() {
    let dir = Scratch::new();
    // The policy filter advertises block sizes, so the client must split 1 MiB requests
    // into 64 KiB pieces and use 4 KiB sectors.
    let srv = Server::start(
        &dir.0,
        "s",
        &[
            "--filter=blocksize-policy",
            "memory",
            "64M",
            "blocksize-minimum=4096",
            "blocksize-preferred=4096",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ],
    );
    let t = NbdTarget::open(&srv.uri(), opts(10_000)).unwrap();
    assert_eq!(t.info().sector_size, 4096);
    assert_eq!(t.info().size_bytes, 64 << 20);
    assert_eq!(t.max_payload(), 65536);
    let batch = Batch::new();
    for i in 0..32u64 {
        // Two buffers per write, so pieces straddle buffer boundaries.
        let (a, b) = (pattern(i, 300 * 1024), pattern(i + 100, 724 * 1024));
        batch.submit(
            &t,
            IoOp::Write {
                offset: i << 20,
                bufs: vec![a, b],
            },
        );
    }
    assert!(batch.wait().iter().all(|d| d.result.is_ok()));
    t.flush_sync().unwrap();
    let batch = Batch::new();
    for i in 0..32u64 {
        batch.submit(
            &t,
            IoOp::Read {
                offset: i << 20,
                bufs: vec![IoBuf::zeroed(100 * 1024), IoBuf::zeroed(924 * 1024)],
            },
        );
    }
    for (i, d) in batch.wait().into_iter().enumerate() {
        d.result.unwrap();
        let got: Vec<u8> = d.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        let mut want = pattern(i as u64, 300 * 1024).to_vec();
        want.extend_from_slice(&pattern(i as u64 + 100, 724 * 1024));
        assert!(got == want, "write {i} read back differently");
    }
    // All-zero writes go as WRITE_ZEROES; discards as TRIM; both read back as zeros here.
    t.write_sync(0, IoBuf::zeroed(1 << 20)).unwrap();
    assert!(t.read_sync(0, 1 << 20).unwrap().iter().all(|&b| b == 0));
    let e = t.read_sync(64 << 20, 4096).unwrap_err();
    assert!(matches!(e.kind, TargetErrorKind::OutOfRange { .. }), "{e}");
    let e = t.read_sync(512, 4096).unwrap_err();
    assert!(matches!(e.kind, TargetErrorKind::Misaligned { .. }), "{e}");
}

#[test]
fn multi_conn_spreads_requests_and_flush_covers_them() {
    let dir = Scratch::new();
    let srv = Server::start(&dir.0, "s", &["memory", "32M"]);
    let o = NbdOptions {
        connections: 3,
        ..opts(10_000)
    };
    let t = NbdTarget::open(&srv.uri(), o).unwrap();
    assert_eq!(
        t.connections(),
        3,
        "nbdkit's memory plugin advertises multi-conn"
    );
    let batch = Batch::new();
    for i in 0..64u64 {
        batch.submit(
            &t,
            IoOp::Write {
                offset: i * 65536,
                bufs: vec![pattern(i, 65536)],
            },
        );
    }
    assert!(batch.wait().iter().all(|d| d.result.is_ok()));
    t.flush_sync().unwrap();
    for i in [0u64, 31, 63] {
        assert!(t.read_sync(i * 65536, 65536).unwrap()[..] == pattern(i, 65536)[..]);
    }
}

/// An export open here is locked on this machine: a second open fails before connecting,
/// naming the URI and the holder; after the first is dropped it opens.
#[test]
fn a_second_open_of_an_export_fails_naming_the_holder() {
    let dir = Scratch::new();
    let srv = Server::start(&dir.0, "s", &["memory", "32M"]);
    let t = NbdTarget::open(&srv.uri(), opts(10_000)).unwrap();
    let e = NbdTarget::open(&srv.uri(), opts(10_000)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&srv.uri()) && msg.contains("in use by this process"),
        "{msg}"
    );
    assert_eq!(e.errno(), libc::EBUSY);
    drop(t);
    NbdTarget::open(&srv.uri(), opts(10_000)).expect("the lock goes with the target");
}

#[test]
fn unreachable_server_names_the_uri() {
    let dir = Scratch::new();
    let uri = format!("nbd+unix:///x?socket={}/nobody.sock", dir.0.display());
    let e = NbdTarget::open(&uri, opts(1000)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&uri) && msg.contains("cannot connect"),
        "{msg}"
    );
    assert_eq!(e.errno(), libc::EIO);
    let e = NbdTarget::open("nbd+unix:///x", opts(1000)).unwrap_err();
    assert!(e.to_string().contains("socket"), "{e}");
}

#[test]
fn server_errors_fail_exactly_the_affected_requests() {
    let dir = Scratch::new();
    let srv = Server::start(
        &dir.0,
        "s",
        &[
            "--filter=error",
            "memory",
            "16M",
            "error-pwrite-rate=100%",
            "error-pwrite=EIO",
        ],
    );
    let t = NbdTarget::open(&srv.uri(), opts(10_000)).unwrap();
    let batch = Batch::new();
    for i in 0..8u64 {
        batch.submit(
            &t,
            IoOp::Read {
                offset: i * 4096,
                bufs: vec![IoBuf::zeroed(4096)],
            },
        );
        batch.submit(
            &t,
            IoOp::Write {
                offset: i * 4096,
                bufs: vec![pattern(i, 4096)],
            },
        );
    }
    for (i, d) in batch.wait().into_iter().enumerate() {
        if i % 2 == 0 {
            d.result.unwrap();
        } else {
            let e = d.result.unwrap_err();
            assert_eq!(e.errno(), libc::EIO, "{e}");
        }
    }
    // The connection survives server errors.
    t.read_sync(0, 4096).unwrap();
}

#[test]
fn slow_server_times_out_the_slow_requests_only() {
    let dir = Scratch::new();
    let srv = Server::start(
        &dir.0,
        "s",
        &["--filter=delay", "memory", "16M", "rdelay=3"],
    );
    let t = NbdTarget::open(&srv.uri(), opts(400)).unwrap();
    let start = Instant::now();
    let batch = Batch::new();
    batch.submit(
        &t,
        IoOp::Read {
            offset: 0,
            bufs: vec![IoBuf::zeroed(4096)],
        },
    );
    batch.submit(
        &t,
        IoOp::Write {
            offset: 8192,
            bufs: vec![pattern(1, 4096)],
        },
    );
    let done = batch.wait();
    let took = start.elapsed();
    let e = done[0].result.as_ref().unwrap_err();
    assert!(matches!(e.kind, TargetErrorKind::TimedOut { .. }), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    done[1].result.as_ref().unwrap();
    assert!(
        took < Duration::from_secs(2),
        "took {took:?}: timed out late"
    );
    // The late reply is read and dropped; the connection keeps working.
    std::thread::sleep(Duration::from_secs(3));
    t.write_sync(0, pattern(2, 4096)).unwrap();
    t.flush_sync().unwrap();
}

#[test]
fn killed_server_fails_in_flight_io_then_reconnects() {
    let dir = Scratch::new();
    let img = dir.0.join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let file_arg = format!("file={}", img.display());
    let serve = |dir: &Path| {
        Server::start(
            dir,
            "s",
            &["--filter=delay", "file", &file_arg, "wdelay=200ms"],
        )
    };
    let mut srv = serve(&dir.0);
    let t = NbdTarget::open(&srv.uri(), opts(5_000)).unwrap();
    t.write_sync(0, pattern(1, 4096)).unwrap();
    t.flush_sync().unwrap();
    // Writes in flight when the server dies fail with EIO; none hangs.
    let batch = Batch::new();
    for i in 1..16u64 {
        batch.submit(
            &t,
            IoOp::Write {
                offset: i * 4096,
                bufs: vec![pattern(i, 4096)],
            },
        );
    }
    std::thread::sleep(Duration::from_millis(50));
    srv.kill();
    let start = Instant::now();
    for d in batch.wait() {
        let e = d.result.unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "{e}");
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    // Server down: the next I/O fails at once, naming the failure.
    let e = t.read_sync(0, 4096).unwrap_err();
    assert!(e.to_string().contains("reconnect"), "{e}");
    // Server back: after the back-off the target reconnects by itself.
    let _srv = serve(&dir.0);
    let start = Instant::now();
    let got = loop {
        match t.read_sync(0, 4096) {
            Ok(b) => break b,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "no reconnection: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert!(
        got[..] == pattern(1, 4096)[..],
        "flushed data survived the restart"
    );
}

#[test]
fn flush_fails_after_a_lost_connection_with_unflushed_writes() {
    let dir = Scratch::new();
    let mut srv = Server::start(&dir.0, "s", &["memory", "16M"]);
    let t = NbdTarget::open(&srv.uri(), opts(5_000)).unwrap();
    t.write_sync(0, pattern(1, 4096)).unwrap();
    t.flush_sync().unwrap();
    t.write_sync(4096, pattern(2, 4096)).unwrap();
    srv.kill();
    // The memory server restarted empty: the acknowledged write is gone.
    let _srv = Server::start(&dir.0, "s", &["memory", "16M"]);
    let start = Instant::now();
    loop {
        match t.read_sync(0, 4096) {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "no reconnection: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let e = t.flush_sync().unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("may not be durable"), "{e}");
    // And it stays failed: a failed flush never turns into a later success.
    t.write_sync(8192, pattern(3, 4096)).unwrap();
    assert!(t.flush_sync().is_err());
}

#[test]
fn a_server_without_a_write_cache_loses_nothing_to_a_reconnection() {
    let dir = Scratch::new();
    let img = dir.0.join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    // An eval-plugin server with pread/pwrite only: it advertises no flush, so an
    // acknowledged write is durable and a lost connection puts nothing at risk.
    let i = img.display();
    let args = [
        "eval".to_string(),
        "get_size=echo 1048576".to_string(),
        format!("pread=dd if={i} skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none"),
        format!("pwrite=dd of={i} seek=$4 oflag=seek_bytes conv=notrunc status=none"),
    ];
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut srv = Server::start(&dir.0, "s", &a);
    let t = NbdTarget::open(&srv.uri(), opts(10_000)).unwrap();
    assert!(!t.supports_flush());
    t.write_sync(0, pattern(5, 4096)).unwrap();
    srv.kill();
    let srv = Server::start(&dir.0, "s", &a);
    let start = Instant::now();
    let got = loop {
        match t.read_sync(0, 4096) {
            Ok(b) => break b,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "no reconnection: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert!(got[..] == pattern(5, 4096)[..]);
    t.flush_sync().unwrap();
    drop(srv);
}

/// The requests on the wire, in order: command, flags, offset, length.
fn requests(wire: &[Wire]) -> Vec<(u16, u16, u64, u32)> {
    wire.iter()
        .filter_map(|w| match *w {
            Wire::Request {
                cmd,
                flags,
                offset,
                len,
                ..
            } => Some((cmd, flags, offset, len)),
            Wire::Reply { .. } => None,
        })
        .collect()
}

#[test]
fn fua_write_carries_the_fua_flag_when_the_server_advertises_it() {
    let dir = Scratch::new();
    let srv = Server::start(&dir.0, "s", &["memory", "16M"]);
    let proxy = Proxy::start(&dir.0.join("p.sock"), &srv.sock, 0, None);
    let t = NbdTarget::open(&proxy.uri(), opts(10_000)).unwrap();
    assert_ne!(
        proxy.export_flags() & TF_SEND_FUA,
        0,
        "nbdkit's memory plugin advertises FUA"
    );
    assert!(t.supports_fua());
    assert_eq!(t.info().fua, FuaSupport::Native);
    t.write_fua_sync(8192, pattern(1, 8192)).unwrap();
    t.write_sync(0, pattern(2, 4096)).unwrap();
    // One FUA write and no flush; a plain write carries no FUA flag.
    assert_eq!(
        requests(&proxy.wire()),
        [
            (CMD_WRITE, CMD_FLAG_FUA, 8192, 8192),
            (CMD_WRITE, 0, 0, 4096)
        ]
    );
    assert!(t.read_sync(8192, 8192).unwrap()[..] == pattern(1, 8192)[..]);
}

#[test]
fn fua_write_is_a_write_then_a_flush_when_the_server_lacks_fua() {
    let dir = Scratch::new();
    // nbdkit's fua filter in its default mode (`fuamode=none`) hides the plugin's FUA
    // support but keeps flush.
    let srv = Server::start(&dir.0, "s", &["--filter=fua", "memory", "16M"]);
    let proxy = Proxy::start(&dir.0.join("p.sock"), &srv.sock, 0, None);
    // A slow flush reply: a FUA write that returned before it would be visible below.
    proxy.set_flush_reply_delay(Duration::from_millis(300));
    let t = NbdTarget::open(&proxy.uri(), opts(10_000)).unwrap();
    let flags = proxy.export_flags();
    assert_eq!(flags & TF_SEND_FUA, 0, "the fua filter hides FUA");
    assert_ne!(flags & TF_SEND_FLUSH, 0, "the memory plugin has flush");
    assert!(!t.supports_fua());
    assert_eq!(t.info().fua, FuaSupport::Emulated);
    t.write_fua_sync(8192, pattern(1, 8192)).unwrap();
    let wire = proxy.wire();
    let find = |want: &dyn Fn(&Wire) -> bool, what: &str| {
        wire.iter().position(want).unwrap_or_else(|| {
            panic!("no {what} on the wire when the FUA write returned: {wire:?}")
        })
    };
    let write_req = find(
        &|w| {
            matches!(
                w,
                Wire::Request {
                    cmd: CMD_WRITE,
                    flags: 0,
                    offset: 8192,
                    len: 8192,
                    ..
                }
            )
        },
        "plain write of the FUA write's range",
    );
    let write_reply = find(
        &|w| {
            matches!(
                w,
                Wire::Reply {
                    cmd: CMD_WRITE,
                    error: 0,
                    ..
                }
            )
        },
        "write reply",
    );
    let flush_req = find(
        &|w| matches!(w, Wire::Request { cmd: CMD_FLUSH, .. }),
        "flush",
    );
    let flush_reply = find(
        &|w| {
            matches!(
                w,
                Wire::Reply {
                    cmd: CMD_FLUSH,
                    error: 0,
                    ..
                }
            )
        },
        "flush reply",
    );
    // The flush is sent after the write completed (so it covers it), and the FUA write
    // completes only after the flush did.
    assert!(
        write_req < write_reply && write_reply < flush_req && flush_req < flush_reply,
        "{wire:?}"
    );
    assert_eq!(requests(&wire).len(), 2, "{wire:?}");
    assert!(t.read_sync(8192, 8192).unwrap()[..] == pattern(1, 8192)[..]);
}

//! The `stripefs` binary on NBD targets named by URI (nbdkit on Unix sockets): mkfs, io,
//! fsck, inspect and `bench -w w3-striped-dio --target URI`, and the error for a server
//! that is not there. Needs Debian's `nbdkit` (`scripts/run-tests` installs it); fails
//! without it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stripefs"))
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let d =
            std::env::temp_dir().join(format!("stripefs-cli-nbd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` nbdkit memory servers; returns them and their URIs.
fn serve(dir: &Path, n: usize, size: &str) -> (Servers, Vec<String>) {
    let mut servers = Servers(Vec::new());
    let mut uris = Vec::new();
    for i in 0..n {
        let sock = dir.join(format!("t{i}.sock"));
        let pid = dir.join(format!("t{i}.pid"));
        let child = Command::new("nbdkit")
            .args(["-f", "--exit-with-parent", "-U"])
            .arg(&sock)
            .arg("-P")
            .arg(&pid)
            .args(["memory", size])
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run nbdkit ({e}): apt-get install nbdkit (scripts/run-tests does)")
            });
        servers.0.push(child);
        let start = Instant::now();
        while !pid.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        uris.push(format!("nbd+unix:///?socket={}", sock.display()));
    }
    (servers, uris)
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let o = cmd.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn commands_accept_nbd_uris() {
    let d = Scratch::new("cmds");
    let (_servers, u) = serve(&d.0, 3, "128M");
    let (rc, out, err) = run(bin().arg("mkfs").args(&u));
    assert_eq!(rc, 0, "{out}{err}");
    assert!(out.contains(&u[2]), "mkfs names the URI targets: {out}");
    let (rc, out, err) = run(bin()
        .args(["io", "-o", "nbd_timeout=10,nbd_conns=2"])
        .args(["-c", "open -f /a", "-c", "pwrite -S 7 0 6m", "-c", "fsync"])
        .args(&u));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, err) = run(bin().args(["io", "-c", "open /a", "-c", "stat"]).args(&u));
    assert_eq!(rc, 0, "{out}{err}");
    assert!(out.contains("stat.size = 6291456"), "{out}");
    let (rc, out, err) = run(bin().arg("fsck").args(&u));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, err) = run(bin().arg("inspect").args(&u));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, _, err) = run(bin()
        .args(["io", "-o", "nbd_timeout=0", "-c", "sync"])
        .args(&u));
    assert_ne!(rc, 0);
    assert!(err.contains("nbd_timeout"), "{err}");
}

#[test]
fn an_absent_server_is_named_in_the_error() {
    let d = Scratch::new("absent");
    let uri = format!("nbd+unix:///x?socket={}/nobody.sock", d.0.display());
    for cmd in ["mkfs", "fsck"] {
        let (rc, _, err) = run(bin().arg(cmd).arg(&uri));
        assert_ne!(rc, 0);
        assert!(
            err.contains(&uri) && err.contains("cannot connect"),
            "{cmd}: {err}"
        );
    }
}

#[test]
fn bench_w3_runs_on_nbd_targets() {
    let d = Scratch::new("bench");
    let (_servers, u) = serve(&d.0, 2, "256M");
    let mut cmd = bin();
    cmd.args([
        "bench",
        "-w",
        "w3-striped-dio",
        "--counts",
        "1,2",
        "--sizes",
        "4m",
    ]);
    cmd.args(["--runs", "1", "--json", "--dir"])
        .arg(d.0.join("unused"));
    for t in &u {
        cmd.arg("--target").arg(t);
    }
    let (rc, out, err) = run(&mut cmd);
    assert_eq!(rc, 0, "{out}{err}");
    assert!(
        out.contains("\"targets\":2") && out.contains("\"parallel\""),
        "{out}"
    );
    assert!(
        !d.0.join("unused").join("bench-t0").exists(),
        "no files were made"
    );
    let (rc, _, err) = run(bin()
        .args(["bench", "-w", "w3-striped-dio", "--counts", "4", "--target"])
        .arg(&u[0]));
    assert_ne!(rc, 0);
    assert!(err.contains("only 1 --target"), "{err}");
}

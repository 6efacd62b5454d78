//! nbdkit servers on Unix sockets for the tests that run the file system over NBD
//! targets. Needs Debian's `nbdkit` (`scripts/run-tests` installs it); a missing nbdkit
//! fails the test with a message saying so, it is never skipped.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stripefs_target::{NbdOptions, NbdTarget, Target};

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "stripefs-{tag}-{}-{}",
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

/// One nbdkit process serving on `sock`; killed on drop.
pub struct Server {
    child: Option<Child>,
    pub sock: PathBuf,
    pid: PathBuf,
    args: Vec<String>,
}

impl Server {
    /// Starts `nbdkit ARGS` (filters, plugin, plugin parameters) on `dir/NAME.sock`.
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Self {
        let mut s = Self {
            child: None,
            sock: dir.join(format!("{name}.sock")),
            pid: dir.join(format!("{name}.pid")),
            args: args.iter().map(|a| (*a).to_string()).collect(),
        };
        s.restart();
        s
    }

    /// (Re)starts the process with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.pid);
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("--exit-with-parent")
            .arg("-U")
            .arg(&self.sock)
            .arg("-P")
            .arg(&self.pid)
            .args(&self.args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run nbdkit ({e}): the NBD tests need it (apt-get install nbdkit; scripts/run-tests installs it)")
            });
        self.child = Some(child);
        let start = Instant::now();
        while !self.pid.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `kill -9`, as a crashing server machine.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `n` servers `dir/tI.sock`, each `nbdkit ARGS` where `{i}` in an argument becomes I.
pub fn servers(dir: &Path, n: usize, args: &[&str]) -> Vec<Server> {
    (0..n)
        .map(|i| {
            let a: Vec<String> = args
                .iter()
                .map(|s| s.replace("{i}", &i.to_string()))
                .collect();
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            Server::start(dir, &format!("t{i}"), &a)
        })
        .collect()
}

/// Opens every server's export as a target with the given request timeout.
pub fn open(servers: &[Server], timeout: Duration) -> Vec<Arc<dyn Target>> {
    servers
        .iter()
        .map(|s| {
            let o = NbdOptions {
                timeout,
                ..NbdOptions::default()
            };
            Arc::new(NbdTarget::open(&s.uri(), o).expect("open NBD target")) as Arc<dyn Target>
        })
        .collect()
}

//! The exclusive advisory lock (`flock`) held on every target that is open, so that two
//! engines never run on the same targets, whatever order they were named in.
//!
//! [`FileTarget::open`](crate::FileTarget::open) locks the file or device it opened and
//! [`NbdTarget::open`](crate::NbdTarget::open) a lock file named after the server address
//! and export in the temporary directory (it excludes engines on this machine only: the
//! protocol has no lock of its own); each lock lives as long as its target. A second open
//! fails with [`TargetErrorKind::InUse`], naming the holder (after a short grace for
//! another thread's fork, see [`FORK_GRACE`]). [`TargetLock`] takes
//! the same lock without opening a target, for a command that checks or waits for it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{NbdUri, OpKind, TargetError, TargetErrorKind};

/// Whether taking a lock waits for its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    /// Fail at once with [`TargetErrorKind::InUse`].
    No,
    /// Wait as long as it takes.
    Forever,
}

/// A target's lock held without the target open (released when dropped).
#[derive(Debug)]
pub struct TargetLock {
    _file: File,
}

impl TargetLock {
    /// Takes the lock of the target named `name`: a file or device path, or an NBD URI
    /// (see [`NbdUri::looks_like_uri`]).
    ///
    /// # Errors
    /// `InUse` naming the holder (only with [`LockWait::No`]); the file or the NBD lock
    /// file cannot be opened; a malformed URI.
    pub fn take(name: &str, wait: LockWait) -> Result<Self, TargetError> {
        let target: Arc<str> = Arc::from(name);
        let file = if NbdUri::looks_like_uri(name) {
            let uri = NbdUri::parse(name).map_err(|e| {
                TargetError::new(
                    target.clone(),
                    OpKind::Open,
                    0,
                    TargetErrorKind::Unusable(e),
                )
            })?;
            nbd_lock_file(&uri)
        } else {
            File::open(name)
        }
        .map_err(|e| os_error(&target, &e))?;
        lock(&file, &target, wait)?;
        Ok(Self { _file: file })
    }
}

/// How long [`LockWait::No`] still tries: a thread of this process forking shares every
/// descriptor with the child until it execs, so a target closed and opened again
/// meanwhile finds its own lock held for that long (seen in the multi-threaded tests).
const FORK_GRACE: Duration = Duration::from_secs(1);

/// Locks `file`, the open target named `target`, exclusively.
pub(crate) fn lock(file: &File, target: &Arc<str>, wait: LockWait) -> Result<(), TargetError> {
    let op = match wait {
        LockWait::No => libc::LOCK_EX | libc::LOCK_NB,
        LockWait::Forever => libc::LOCK_EX,
    };
    let deadline = Instant::now() + FORK_GRACE;
    loop {
        // SAFETY: flock on a descriptor `file` owns.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Some(libc::EWOULDBLOCK) => {
                let holder = holder(file);
                return Err(TargetError::new(
                    target.clone(),
                    OpKind::Open,
                    0,
                    TargetErrorKind::InUse { holder },
                ));
            }
            _ => return Err(os_error(target, &e)),
        }
    }
}

fn os_error(target: &Arc<str>, e: &io::Error) -> TargetError {
    TargetError::from_errno(
        target.clone(),
        OpKind::Open,
        0,
        e.raw_os_error().unwrap_or(libc::EIO),
    )
}

/// The lock file standing for an NBD export: named after a hash (FNV-1a, stable across
/// builds and runs) of its normalised address and export.
pub(crate) fn nbd_lock_file(uri: &NbdUri) -> io::Result<File> {
    let key = format!("{:?}\0{}", uri.addr, uri.export);
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let dir = std::env::temp_dir().join("stripefs-locks");
    std::fs::create_dir_all(&dir)?;
    let path: PathBuf = dir.join(format!("nbd-{hash:016x}.lock"));
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// Who holds the `flock` on `file`'s inode, from `/proc/locks`: "process PID (NAME)", or
/// "this process" for another open of the same target here, or a plain "another process"
/// when `/proc` does not say.
fn holder(file: &File) -> String {
    let me = std::process::id();
    let pid = file.metadata().ok().and_then(|m| {
        let dev = m.dev();
        let (maj, min) = (libc::major(dev), libc::minor(dev));
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(&locks, maj, min, m.ino())
    });
    match pid {
        Some(p) if p == me => "this process (the target is already open here)".into(),
        Some(p) => {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            match comm.trim() {
                "" => format!("process {p}"),
                name => format!("process {p} ({name})"),
            }
        }
        None => "another process".into(),
    }
}

/// The pid of a `FLOCK` lock on inode `ino` of device `maj:min` in `/proc/locks` text
/// (`1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`; the device in hex).
fn flock_holder(locks: &str, maj: u32, min: u32, ino: u64) -> Option<u32> {
    let want = format!("{maj:02x}:{min:02x}:{ino}");
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Blocked waiters are listed as "1: -> FLOCK ..."; only the holder counts.
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::flock_holder;

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let text = "1: POSIX  ADVISORY  WRITE 11 08:01:77 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4242 fd:02:1234 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 5151 fd:02:1234 0 EOF\n";
        assert_eq!(flock_holder(text, 0xfd, 2, 1234), Some(4242));
        assert_eq!(
            flock_holder(text, 8, 1, 77),
            None,
            "a POSIX lock is not ours"
        );
        assert_eq!(flock_holder(text, 0xfd, 2, 99), None);
    }
}

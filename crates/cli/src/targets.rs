//! Opening targets named on the command line.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stripefs_target::{FileTarget, FileTargetOptions, Target};

/// Opens every path as a file target (must exist).
///
/// # Errors
/// The first target that cannot be opened, with the reason.
pub fn open_all(paths: &[PathBuf]) -> Result<Vec<Arc<dyn Target>>, String> {
    paths.iter().map(|p| open_one(p, None)).collect()
}

/// Opens one target, creating a regular file of `create_size` if it is missing.
///
/// # Errors
/// A sentence naming the target.
pub fn open_one(p: &Path, create_size: Option<u64>) -> Result<Arc<dyn Target>, String> {
    let opts = FileTargetOptions {
        create_size,
        ..FileTargetOptions::default()
    };
    let t = FileTarget::open(p, opts)
        .map_err(|e| format!("cannot open target {}: {}", p.display(), e.kind))?;
    Ok(Arc::new(t))
}

/// What [`lock_targets`] does when another process holds a target's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    /// Wait as long as it takes (`stripefs umount` waiting for its own daemon).
    Forever,
    /// Refuse at once while a mount visible here serves the target; otherwise the holder
    /// is a daemon finishing its unmount (after a plain `umount`, which returns before
    /// the final checkpoint) or a command that is about to end: wait for it, up to
    /// [`RELEASE_WAIT`], as a kernel mount waits for the old superblock to go.
    WhileReleasing,
}

/// How long [`LockWait::WhileReleasing`] waits for a holder that is not a mount.
pub const RELEASE_WAIT: Duration = Duration::from_secs(30);

const POLL: Duration = Duration::from_millis(10);

/// Takes the exclusive advisory lock that every command using the engine holds on each
/// target (`stripefs mount` for the daemon's lifetime), so that two engines never run on
/// the same targets, whatever order they were named in.
///
/// # Errors
/// The targets are in use (see [`LockWait`]), or a file cannot be opened.
pub fn lock_targets(paths: &[PathBuf], wait: LockWait) -> Result<Vec<File>, String> {
    paths.iter().map(|p| lock_one(p, wait)).collect()
}

fn lock_one(path: &Path, wait: LockWait) -> Result<File, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    if wait == LockWait::Forever {
        return flock(&f, libc::LOCK_EX)
            .map(|()| f)
            .map_err(|e| format!("cannot lock {}: {e}", path.display()));
    }
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        match flock(&f, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => return Ok(f),
            Err(e) if e.raw_os_error() != Some(libc::EWOULDBLOCK) => {
                return Err(format!("cannot lock {}: {e}", path.display()))
            }
            Err(_) => {}
        }
        if let Some(mp) = mounted_at(path) {
            return Err(format!(
                "{} is in use by a stripefs mount (at {}); unmount it first",
                path.display(),
                mp.display()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} is still in use after {} s, by no mount: a stripefs daemon still \
                 writing back after its unmount, or a stripefs command; try again when it \
                 has exited",
                path.display(),
                RELEASE_WAIT.as_secs()
            ));
        }
        std::thread::sleep(POLL);
    }
}

fn flock(f: &File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The mount point of a FUSE mount whose source (targets joined by `:`) names `target`.
fn mounted_at(target: &Path) -> Option<PathBuf> {
    let want = std::fs::canonicalize(target).ok()?;
    stripefs_fuse::fuse_mounts()
        .into_iter()
        .find(|(source, _)| {
            source
                .split(':')
                .any(|t| std::fs::canonicalize(t).is_ok_and(|t| t == want))
        })
        .map(|(_, mp)| mp)
}

//! Opening targets named on the command line.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Takes the exclusive advisory lock that every command using the engine holds on each
/// target (`stripefs mount` for the daemon's lifetime), so that two engines never run on
/// the same targets, whatever order they were named in. `wait` blocks until the holder
/// is gone.
///
/// # Errors
/// The targets are in use (without `wait`), or a file cannot be opened.
pub fn lock_targets(paths: &[PathBuf], wait: bool) -> Result<Vec<File>, String> {
    paths.iter().map(|p| lock_one(p, wait)).collect()
}

fn lock_one(path: &Path, wait: bool) -> Result<File, String> {
    let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let op = libc::LOCK_EX | if wait { 0 } else { libc::LOCK_NB };
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            format!(
                "{} is in use by a stripefs mount or command; unmount it or wait for it first",
                path.display()
            )
        } else {
            format!("cannot lock {}: {e}", path.display())
        });
    }
    Ok(f)
}

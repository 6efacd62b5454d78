//! One private ioctl on the root directory of a stripefs mount: the channel of online
//! scrub, `add-target` and `evacuate` (the daemon answers on the root only, for root only).

use std::os::unix::io::AsRawFd;
use std::path::Path;

/// A refused or failed ioctl: its errno, and a sentence naming the mount point for the
/// two answers every channel shares (not a stripefs mount's root; not root).
#[derive(Debug)]
pub struct IoctlError {
    pub errno: Option<i32>,
    pub message: String,
}

impl From<IoctlError> for String {
    fn from(e: IoctlError) -> String {
        e.message
    }
}

/// Runs command `cmd` on `dir` (the opened mount point `mnt`) with the request in `b`;
/// the reply replaces it. `what` names the command in the "needs root" message.
///
/// # Errors
/// The ioctl's errno, worded.
pub fn call(
    dir: &std::fs::File,
    mnt: &Path,
    cmd: u32,
    b: &mut [u8],
    what: &str,
) -> Result<(), IoctlError> {
    // SAFETY: every channel's command has `b.len()` in its size field, so the kernel
    // copies exactly that many bytes in and out of `b`, which lives across the call.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), libc::c_ulong::from(cmd), b.as_mut_ptr()) };
    if rc >= 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    let errno = e.raw_os_error();
    let message = match errno {
        Some(libc::ENOTTY) => format!(
            "{}: not the root of a stripefs mount (or its daemon is older): {e}",
            mnt.display()
        ),
        Some(libc::EPERM) => format!("{}: {what} needs root: {e}", mnt.display()),
        _ => e.to_string(),
    };
    Err(IoctlError { errno, message })
}

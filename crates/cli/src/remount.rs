//! `stripefs remount` (and `mount -t fuse.stripefs -o remount,...`, which the helper turns
//! into it): switch a mounted file system between read-write and read-only.
//!
//! The kernel does not forward a remount to a FUSE daemon; it flips its superblock's
//! read-only flag (after writing its dirty pages to the daemon, and refusing with `EBUSY`
//! while a file is open for writing). The daemon follows that flag on its own
//! (`stripefs_fuse` watches the mount table), so a plain `mount -o remount,ro M`, which
//! `mount(8)` performs itself for type `fuse`, works too. This command does the same
//! `mount(2)` and then `fsync`s the mount's root, which the daemon answers only once the
//! engine has followed: read-only, written back and checkpointed (`decisions.md` 26).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

/// Switch a stripefs mount between read-write and read-only.
#[derive(Debug, clap::Args)]
pub struct RemountArgs {
    /// `ro` or `rw`, and the generic flags nosuid, nodev, noexec, sync, dirsync and their
    /// opposites. Other mount options keep their mount-time values (they are checked).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    mountpoint: PathBuf,
}

/// Flags `remount` changes: (word, flag, set or clear).
const FLAGS: &[(&str, libc::c_ulong, Change)] = &[
    ("ro", libc::MS_RDONLY, Change::Set),
    ("rw", libc::MS_RDONLY, Change::Clear),
    ("nosuid", libc::MS_NOSUID, Change::Set),
    ("suid", libc::MS_NOSUID, Change::Clear),
    ("nodev", libc::MS_NODEV, Change::Set),
    ("dev", libc::MS_NODEV, Change::Clear),
    ("noexec", libc::MS_NOEXEC, Change::Set),
    ("exec", libc::MS_NOEXEC, Change::Clear),
    ("sync", libc::MS_SYNCHRONOUS, Change::Set),
    ("async", libc::MS_SYNCHRONOUS, Change::Clear),
    ("dirsync", libc::MS_DIRSYNC, Change::Set),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Set,
    Clear,
}

/// Flags kept from the current mount unless named: a remount without them would clear
/// them (the kernel keeps only the atime flags).
const KEPT: &[(libc::c_ulong, libc::c_ulong)] = &[
    (libc::ST_RDONLY, libc::MS_RDONLY),
    (libc::ST_NOSUID, libc::MS_NOSUID),
    (libc::ST_NODEV, libc::MS_NODEV),
    (libc::ST_NOEXEC, libc::MS_NOEXEC),
    (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
];

/// The `mount(2)` flags for remounting a mount whose `statvfs` flags are `current` with
/// `options`.
fn remount_flags(current: libc::c_ulong, options: &[String]) -> Result<libc::c_ulong, String> {
    let mut flags = KEPT
        .iter()
        .filter(|(st, _)| current & st != 0)
        .fold(libc::MS_REMOUNT, |f, (_, ms)| f | ms);
    let mut others = Vec::new();
    for word in options
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty() && *s != "remount")
    {
        match FLAGS.iter().find(|(w, _, _)| *w == word) {
            Some((_, f, Change::Set)) => flags |= f,
            Some((_, f, Change::Clear)) => flags &= !f,
            None => others.push(word.to_string()),
        }
    }
    // Everything else was fixed at mount time; it must still be a valid mount option.
    let (engine, _) = crate::mount::split_options(&others)?;
    crate::mount_opts::parse(&engine)?;
    Ok(flags)
}

/// Runs `stripefs remount`.
pub fn run(a: &RemountArgs) -> Result<i32, String> {
    let mp = std::fs::canonicalize(&a.mountpoint)
        .map_err(|e| format!("{}: {e}", a.mountpoint.display()))?;
    if stripefs_fuse::mount_source(&mp).is_none() {
        return Err(format!("{} is not a FUSE mount", mp.display()));
    }
    let c = CString::new(mp.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statvfs fills the zeroed struct; `c` is a valid C string.
    let current = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return Err(format!(
                "cannot stat {}: {}",
                mp.display(),
                std::io::Error::last_os_error()
            ));
        }
        st.f_flag
    };
    let flags = remount_flags(current, &a.options)?;
    // SAFETY: valid C strings; no data for a remount.
    let rc = unsafe {
        libc::mount(
            c.as_ptr(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        let why = if e.raw_os_error() == Some(libc::EBUSY) && flags & libc::MS_RDONLY != 0 {
            " (a file is open for writing)".to_string()
        } else {
            String::new()
        };
        return Err(format!("cannot remount {}: {e}{why}", mp.display()));
    }
    // Answered once the daemon has followed the remount (see the module documentation).
    let root = std::fs::File::open(&mp).map_err(|e| format!("{}: {e}", mp.display()))?;
    // SAFETY: fsync on a descriptor we own.
    if unsafe { libc::fsync(root.as_raw_fd()) } != 0 {
        return Err(format!(
            "remounted {}, but the daemon could not follow (write back and checkpoint): {}",
            mp.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_keep_what_is_not_named() {
        let o = |s: &str| vec![s.to_string()];
        let nosuid_nodev = libc::ST_NOSUID | libc::ST_NODEV;
        assert_eq!(
            remount_flags(nosuid_nodev, &o("remount,ro")).unwrap(),
            libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV
        );
        assert_eq!(
            remount_flags(libc::ST_RDONLY | libc::ST_NOSUID, &o("remount,rw,suid")).unwrap(),
            libc::MS_REMOUNT
        );
        // Mount-time options are checked, not changed.
        assert_eq!(
            remount_flags(0, &o("remount,ro,threads=4,defaults")).unwrap(),
            libc::MS_REMOUNT | libc::MS_RDONLY
        );
        assert!(remount_flags(0, &o("remount,bogus"))
            .unwrap_err()
            .contains("unknown mount option"));
    }
}

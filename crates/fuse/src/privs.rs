//! Set-ID bits under `FUSE_HANDLE_KILLPRIV_V2`.
//!
//! With that capability the kernel no longer strips set-user-ID and set-group-ID itself
//! (and in return stops asking for `security.capability` before every write): the server
//! drops them on write, truncate and chown, as the VFS would. The kernel says so for a
//! write (`FUSE_WRITE_KILL_SUIDGID`); for truncate and `O_TRUNC` it sets flags that fuser
//! does not pass on, so the caller's `CAP_FSETID` is read from `/proc`, and only when the
//! file has a set-ID bit at all. A caller that cannot be looked up (it exited) counts as
//! unprivileged: the bits go, the safe side.

use std::fs;

/// `CAP_FSETID`, from `linux/capability.h`.
const CAP_FSETID: u32 = 4;

/// One field of `/proc/PID/status`.
fn status_field(pid: u32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// Whether process `pid` holds `CAP_FSETID` in its effective set.
pub(crate) fn has_fsetid(pid: u32) -> bool {
    status_field(pid, "CapEff")
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_FSETID) != 0)
}

/// Whether the caller (`pid`, file-system group `fsgid`) is in group `gid` or holds
/// `CAP_FSETID`: the VFS's `in_group_or_capable`, which decides whether chown keeps the
/// set-group-ID bit of a file that is not group-executable.
pub(crate) fn in_group_or_capable(pid: u32, fsgid: u32, gid: u32) -> bool {
    fsgid == gid
        || status_field(pid, "Groups").is_some_and(|g| {
            g.split_whitespace()
                .any(|x| x.parse::<u32>().ok() == Some(gid))
        })
        || has_fsetid(pid)
}

/// Permission bits of a new non-directory asked for with `perm` in a directory with
/// `dir_perm`: in a set-group-ID directory the file takes the directory's group, and a
/// group-executable set-group-ID file keeps the bit only if `in_group_or_capable` says
/// the creator is in that group or holds `CAP_FSETID` (the VFS's `mode_strip_sgid`).
/// The check is asked only when it can matter.
pub(crate) fn new_file_perm(
    perm: u16,
    dir_perm: u16,
    in_group_or_capable: impl FnOnce() -> bool,
) -> u16 {
    const SGID: u16 = 0o2000;
    const XGRP: u16 = 0o0010;
    if perm & (SGID | XGRP) != SGID | XGRP || dir_perm & SGID == 0 || in_group_or_capable() {
        return perm;
    }
    perm & !SGID
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_file_in_setgid_directory_loses_sgid_unless_in_group() {
        let never = || -> bool { panic!("asked although it cannot matter") };
        assert_eq!(new_file_perm(0o2755, 0o2775, || false), 0o0755);
        assert_eq!(new_file_perm(0o2755, 0o2775, || true), 0o2755);
        assert_eq!(
            new_file_perm(0o2745, 0o2775, never),
            0o2745,
            "not group-executable"
        );
        assert_eq!(
            new_file_perm(0o2755, 0o0775, never),
            0o2755,
            "not a setgid dir"
        );
        assert_eq!(new_file_perm(0o0755, 0o2775, never), 0o0755);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let text = fs::read_to_string("/proc/self/status").unwrap();
        let eff = text
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap();
        assert_eq!(has_fsetid(me), eff & (1 << CAP_FSETID) != 0);
        // SAFETY: plain system call without arguments.
        let gid = unsafe { libc::getegid() };
        assert!(in_group_or_capable(me, gid, gid));
        assert!(!has_fsetid(u32::MAX), "a missing process is unprivileged");
    }
}

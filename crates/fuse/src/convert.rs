//! Conversions between the library's types and FUSE's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use stripefs::{Attr, FallocMode, FileKind, Timespec};

pub(crate) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// The file kind named by the `S_IFMT` bits of `mode`.
pub(crate) fn kind_of_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => FileKind::Regular,
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => return None,
    })
}

/// Permission bits (with set-id and sticky) of `mode`.
pub(crate) fn perm(mode: u32) -> u16 {
    // Masked to 12 bits, so the conversion cannot fail.
    u16::try_from(mode & 0o7777).unwrap_or(0)
}

pub(crate) fn system_time(t: Timespec) -> SystemTime {
    // `sec` is the floor; `nsec` always counts forward from it.
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    let base = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
    };
    base.and_then(|b| b.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

pub(crate) fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let mut sec = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let mut nsec = d.subsec_nanos();
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timespec { sec, nsec }
        }
    }
}

pub(crate) fn attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.kind),
        perm: perm(a.mode),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: u32::try_from(a.rdev).unwrap_or(u32::MAX),
        blksize: a.blksize,
        flags: 0,
    }
}

/// The library's mode for a `fallocate(2)` mode word; `None` for combinations Linux
/// defines but stripefs does not implement, or does not know.
pub(crate) fn falloc_mode(mode: i32) -> Option<FallocMode> {
    const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
    Some(match mode {
        0 => FallocMode::Allocate,
        KEEP => FallocMode::KeepSize,
        m if m == libc::FALLOC_FL_PUNCH_HOLE | KEEP => FallocMode::PunchHole,
        libc::FALLOC_FL_ZERO_RANGE => FallocMode::ZeroRange { keep_size: false },
        m if m == libc::FALLOC_FL_ZERO_RANGE | KEEP => FallocMode::ZeroRange { keep_size: true },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for (sec, nsec) in [(0, 0), (1_700_000_000, 123), (-1, 500_000_000), (-5, 0)] {
            let t = Timespec { sec, nsec };
            assert_eq!(timespec(system_time(t)), t, "{sec}.{nsec}");
        }
    }

    #[test]
    fn fallocate_modes_map_or_are_refused() {
        assert_eq!(falloc_mode(0), Some(FallocMode::Allocate));
        assert_eq!(
            falloc_mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE),
            Some(FallocMode::PunchHole)
        );
        // Punch without KEEP_SIZE is invalid on Linux; collapse is not implemented.
        assert_eq!(falloc_mode(libc::FALLOC_FL_PUNCH_HOLE), None);
        assert_eq!(falloc_mode(libc::FALLOC_FL_COLLAPSE_RANGE), None);
    }

    #[test]
    fn mode_bits_name_kinds() {
        assert_eq!(kind_of_mode(libc::S_IFIFO | 0o644), Some(FileKind::Fifo));
        assert_eq!(kind_of_mode(0o644), Some(FileKind::Regular));
        assert_eq!(perm(libc::S_IFREG | 0o4755), 0o4755);
    }
}

/// The attribute-flag ioctl a command number is, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagsIoctl {
    /// `FS_IOC_GETFLAGS`.
    Get,
    /// `FS_IOC_SETFLAGS`.
    Set,
    /// `FS_IOC_FSGETXATTR` (`struct fsxattr` out).
    FsxGet,
    /// `FS_IOC_FSSETXATTR` (`struct fsxattr` in).
    FsxSet,
}

/// `sizeof(struct fsxattr)`: five `u32` and 8 bytes of padding.
pub(crate) const FSXATTR_BYTES: u32 = 28;

/// `FS_IOC_GETFLAGS`/`SETFLAGS` as `_IOR`/`_IOW('f', 1|2, long)` on 64-bit, and their
/// 32-bit forms (`FS_IOC32_*`, `int`): the kernel sends the former; the size in the
/// command is not the size of the value (always an `int`). `FS_IOC_FSGETXATTR` and
/// `FSSETXATTR` are `_IOR`/`_IOW('X', 31|32, struct fsxattr)`.
pub(crate) fn flags_ioctl(cmd: u32) -> Option<FlagsIoctl> {
    match cmd {
        0x8008_6601 | 0x8004_6601 => Some(FlagsIoctl::Get),
        0x4008_6602 | 0x4004_6602 => Some(FlagsIoctl::Set),
        0x801c_581f => Some(FlagsIoctl::FsxGet),
        0x401c_5820 => Some(FlagsIoctl::FsxSet),
        _ => None,
    }
}

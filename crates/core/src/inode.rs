//! Inodes: attributes, striping layout, per-object extent maps, directory entries,
//! symlink targets and extended attributes.

use std::collections::BTreeMap;

use crate::extent::ExtentMap;
use crate::layout::StripeLayout;
use crate::Ino;

/// Longest file name, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Longest extended-attribute name, in bytes.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended-attribute value, in bytes.
pub const XATTR_VALUE_MAX: usize = 65536;
/// Most extended-attribute bytes (names plus values) on one inode.
pub const XATTR_TOTAL_MAX: usize = 256 * 1024;

/// The type of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// On-disk code.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            FileKind::Regular => 1,
            FileKind::Directory => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDevice => 6,
            FileKind::BlockDevice => 7,
        }
    }

    /// Decodes an on-disk code.
    #[must_use]
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDevice,
            7 => FileKind::BlockDevice,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of `st_mode`.
    #[must_use]
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => 0o100_000,
            FileKind::Directory => 0o040_000,
            FileKind::Symlink => 0o120_000,
            FileKind::Fifo => 0o010_000,
            FileKind::Socket => 0o140_000,
            FileKind::CharDevice => 0o020_000,
            FileKind::BlockDevice => 0o060_000,
        }
    }
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// A wall-clock reading taken by the caller (this crate reads no clock: the runtime passes
/// times in).
impl From<std::time::SystemTime> for Timespec {
    fn from(t: std::time::SystemTime) -> Self {
        let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Self {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        }
    }
}

/// Everything about an inode except its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeAttrs {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// File size in bytes (regular files and symlinks).
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    /// Device number for character and block devices.
    pub rdev: u64,
    /// Parent directory (directories only; `Ino(0)` otherwise).
    pub parent: Ino,
    /// Striping (regular files only; count 0 otherwise).
    pub layout: StripeLayout,
    /// Inode flag bits: [`FLAG_PREALLOC`], [`FLAG_NOCOW`]; the others are reserved (0).
    pub flags: u32,
}

/// Inode flag: the file has explicit preallocation beyond EOF (`fallocate KEEP_SIZE`), so
/// speculative preallocation is never trimmed from it (XFS's `PREALLOC` flag).
pub const FLAG_PREALLOC: u32 = 1;

/// Inode flag: no copy on write (btrfs's `NODATACOW`, `chattr +C`, `FS_NOCOW_FL`). On a
/// regular file: its data is written in place and carries no checksums; set or cleared
/// only while the file is empty. On a directory: new regular files and directories in it
/// get the flag.
pub const FLAG_NOCOW: u32 = 1 << 1;

/// Every flag bit defined; the rest are reserved.
pub const FLAGS_KNOWN: u32 = FLAG_PREALLOC | FLAG_NOCOW;

impl InodeAttrs {
    /// Whether the file's data is copy on write (and, once checksums exist, checksummed):
    /// its [`FLAG_NOCOW`] is clear. The one question writeback and the checksum code ask.
    #[must_use]
    pub fn datacow(&self) -> bool {
        self.flags & FLAG_NOCOW == 0
    }

    /// `st_mode`: type bits plus permission bits.
    #[must_use]
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm)
    }
}

/// A directory entry's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FileKind,
}

/// An inode and everything it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub attrs: InodeAttrs,
    /// One extent map per stripe object (regular files).
    pub objects: Vec<ExtentMap>,
    /// Directory entries by name (directories).
    pub entries: BTreeMap<Vec<u8>, DirEntry>,
    /// Symlink target (symlinks).
    pub symlink: Vec<u8>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Inode {
    /// A new inode with `attrs` and empty contents.
    #[must_use]
    pub fn new(attrs: InodeAttrs) -> Self {
        let objects = if attrs.kind == FileKind::Regular {
            (0..attrs.layout.count).map(|_| ExtentMap::new()).collect()
        } else {
            Vec::new()
        };
        Self {
            attrs,
            objects,
            entries: BTreeMap::new(),
            symlink: Vec::new(),
            xattrs: BTreeMap::new(),
        }
    }

    /// Blocks allocated to the file across all objects.
    #[must_use]
    pub fn allocated_blocks(&self) -> u64 {
        self.objects.iter().map(ExtentMap::mapped_blocks).sum()
    }

    /// Total bytes of extended attribute names and values.
    #[must_use]
    pub fn xattr_bytes(&self) -> usize {
        self.xattrs.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

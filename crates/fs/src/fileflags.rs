//! Per-file attribute flags as Linux's `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` carry them
//! (`chattr`, `lsattr`): only `FS_NOCOW_FL` (`C`) exists here, kept as
//! [`FLAG_NOCOW`] in the inode (`docs/design/reflink.md` "No copy on write").

use stripefs_core::inode::{FileKind, FLAG_NOCOW};
use stripefs_core::record::Record;
use stripefs_core::Ino;

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::namespace::inode;

/// A file's attribute flags in Linux's `FS_*_FL` bit values (the `int` of
/// `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileFlags(pub u32);

impl FileFlags {
    /// No flags.
    pub const NONE: FileFlags = FileFlags(0);
    /// `FS_NOCOW_FL` (`chattr +C`): no copy on write.
    pub const NOCOW: FileFlags = FileFlags(0x0080_0000);
    /// Every bit this file system keeps; [`Fs::set_file_flags`] refuses the others.
    pub const SUPPORTED: FileFlags = Self::NOCOW;

    /// Whether every bit of `other` is set.
    #[must_use]
    pub fn contains(self, other: FileFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags with `other`'s bits set.
    #[must_use]
    pub fn with(self, other: FileFlags) -> FileFlags {
        FileFlags(self.0 | other.0)
    }

    /// These flags with `other`'s bits cleared.
    #[must_use]
    pub fn without(self, other: FileFlags) -> FileFlags {
        FileFlags(self.0 & !other.0)
    }

    /// The `FS_*_FL` view of an inode's flag bits.
    pub(crate) fn of_inode(bits: u32) -> FileFlags {
        if bits & FLAG_NOCOW != 0 {
            Self::NOCOW
        } else {
            Self::NONE
        }
    }
}

/// The flag bits a new inode of `kind` starts with: a regular file is NOCOW when the
/// mount says `datacow=off` or its directory is NOCOW; a directory inherits its
/// parent's NOCOW (btrfs's rules: `nodatacow` applies to new regular files, a
/// directory's flag to everything created in it). Other kinds never carry it.
pub(crate) fn new_inode_flags(kind: FileKind, parent_flags: u32, datacow: crate::DataCow) -> u32 {
    let inherited = parent_flags & FLAG_NOCOW;
    match kind {
        FileKind::Regular if datacow == crate::DataCow::Off => FLAG_NOCOW,
        FileKind::Regular | FileKind::Directory => inherited,
        _ => 0,
    }
}

impl Fs {
    /// The attribute flags of `ino` (`FS_IOC_GETFLAGS`, `lsattr`).
    ///
    /// # Errors
    /// `Stale`; `Io`/`Corrupted` if the inode cannot be read.
    pub fn file_flags(&self, ino: Ino) -> Result<FileFlags> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        Ok(FileFlags::of_inode(inode(&m, ino)?.attrs.flags))
    }

    /// Sets the attribute flags of `ino` (`FS_IOC_SETFLAGS`, `chattr`), with btrfs's
    /// semantics for `FS_NOCOW_FL`: on a directory it is set and cleared freely (new files
    /// in it inherit it); on a regular file it changes only while the file is empty (size
    /// 0) and is otherwise left as it is without an error, so the flag always tells how the
    /// file's data was written. Any other `FS_*_FL` bit is `NotSupported` (`EOPNOTSUPP`,
    /// as btrfs and ext4 answer bits they do not know), and so is `NOCOW` on an inode that
    /// is neither a file nor a directory. ctime changes on every successful call.
    ///
    /// # Errors
    /// `NotSupported` as above; `ReadOnly`; `Stale`; `NoSpace` when the journal is full.
    pub fn set_file_flags(&self, ino: Ino, flags: FileFlags) -> Result<()> {
        let unknown = flags.without(FileFlags::SUPPORTED);
        if unknown != FileFlags::NONE {
            return Err(FsError::NotSupported(format!(
                "attribute flags {:#x} (only No_COW, {:#x}, is kept)",
                unknown.0,
                FileFlags::NOCOW.0
            )));
        }
        self.inner.check()?;
        let _change = self.begin_change()?;
        // The inode lock orders this against writes, truncates and clones of the file, so
        // "empty" cannot change between the test and the record.
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        lock.dio.drain();
        let mut m = self.inner.meta_with(&[ino])?;
        let mut a = inode(&m, ino)?.attrs.clone();
        let nocow = flags.contains(FileFlags::NOCOW);
        match a.kind {
            FileKind::Directory => {}
            FileKind::Regular => {
                let empty = m.size_of(ino).ok_or(FsError::Stale(ino.0))? == 0;
                if !empty {
                    return self.touch_ctime(&mut m, a);
                }
            }
            _ if nocow => {
                return Err(FsError::NotSupported(format!(
                    "No_COW on a {:?} (files and directories only)",
                    a.kind
                )))
            }
            _ => {}
        }
        if nocow {
            a.flags |= FLAG_NOCOW;
        } else {
            a.flags &= !FLAG_NOCOW;
        }
        self.touch_ctime(&mut m, a)
    }

    fn touch_ctime(
        &self,
        m: &mut crate::inner::MetaCore,
        mut a: stripefs_core::inode::InodeAttrs,
    ) -> Result<()> {
        a.ctime = crate::clock::time_now();
        self.inner.log_all(m, vec![Record::InodeSet(a)])
    }
}

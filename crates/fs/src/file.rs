//! `File`: an open regular file, released when dropped.

use stripefs_core::Ino;

use crate::error::Result;
use crate::fs::Fs;
use crate::types::{Attr, FallocMode};

/// An open file. Keeps an unlinked file alive until dropped.
#[derive(Debug)]
pub struct File {
    fs: Fs,
    ino: Ino,
    fh: crate::types::Fh,
}

impl Fs {
    /// Opens inode `ino`.
    ///
    /// # Errors
    /// `Stale` if it does not exist; `Poisoned`.
    pub fn open_file(&self, ino: Ino) -> Result<File> {
        let fh = self.open(ino)?;
        Ok(File {
            fs: self.clone(),
            ino,
            fh,
        })
    }
}

impl File {
    /// The inode number.
    #[must_use]
    pub fn ino(&self) -> Ino {
        self.ino
    }

    /// See [`Fs::read_at`].
    ///
    /// # Errors
    /// As [`Fs::read_at`].
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.fs.read_at(self.ino, off, buf)
    }

    /// See [`Fs::write_at`].
    ///
    /// # Errors
    /// As [`Fs::write_at`].
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<usize> {
        self.fs.write_at(self.ino, off, data)
    }

    /// See [`Fs::set_len`].
    ///
    /// # Errors
    /// As [`Fs::set_len`].
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.fs.set_len(self.ino, size)
    }

    /// See [`Fs::fallocate`].
    ///
    /// # Errors
    /// As [`Fs::fallocate`].
    pub fn fallocate(&self, mode: FallocMode, off: u64, len: u64) -> Result<()> {
        self.fs.fallocate(self.ino, mode, off, len)
    }

    /// `fsync`.
    ///
    /// # Errors
    /// As [`Fs::fsync`].
    pub fn sync_all(&self) -> Result<()> {
        self.fs.fsync_handle(self.fh, false)
    }

    /// `fdatasync`.
    ///
    /// # Errors
    /// As [`Fs::fsync`].
    pub fn sync_data(&self) -> Result<()> {
        self.fs.fsync_handle(self.fh, true)
    }

    /// `fstat`.
    ///
    /// # Errors
    /// As [`Fs::getattr`].
    pub fn stat(&self) -> Result<Attr> {
        self.fs.getattr(self.ino)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if let Err(e) = self.fs.release(self.fh) {
            tracing::warn!(ino = self.ino.0, error = %e, "release failed");
        }
    }
}

//! I/O through an open handle, and `File`, an open regular file released when dropped.
//!
//! `O_DIRECT` is a property of the handle ([`OpenMode`]): [`Fs::write`] and [`Fs::read`]
//! are the one write and the one read entry of a front end, dispatching on it (the FUSE
//! server and `stripefs io` keep no flag of their own). The direct path answers from the
//! I/O completion; the cached path answers before returning.

use std::sync::Arc;

use stripefs_core::Ino;
use stripefs_iomap::direct::Answer;

use crate::error::Result;
use crate::fs::Fs;
use crate::types::{Attr, FallocMode, Fh, OpenMode, SyncScope, WriteOrigin};

/// An open file. Keeps an unlinked file alive until dropped.
#[derive(Debug)]
pub struct File {
    fs: Fs,
    ino: Ino,
    fh: Fh,
    mode: OpenMode,
}

impl Fs {
    /// Opens inode `ino`.
    ///
    /// # Errors
    /// `Stale` if it does not exist; `Poisoned`.
    pub fn open_file(&self, ino: Ino) -> Result<File> {
        self.open_file_with(ino, OpenMode::Cached)
    }

    /// Opens inode `ino` for I/O in `mode`.
    ///
    /// # Errors
    /// `Stale` if it does not exist; `Poisoned`.
    pub fn open_file_with(&self, ino: Ino, mode: OpenMode) -> Result<File> {
        let fh = self.open_with(ino, mode)?;
        Ok(File {
            fs: self.clone(),
            ino,
            fh,
            mode,
        })
    }

    /// Writes `data` at `off` through handle `fh`: the direct path for an `O_DIRECT`
    /// handle (unless the data is the page cache's, `WriteOrigin::PageCache`), the page
    /// cache otherwise. `done` gets the bytes written or the error (`Invalid` for an
    /// unknown handle) exactly once: for a direct write, on a target completion thread
    /// when it runs under the shared lock, else before this returns (as
    /// [`Fs::write_direct`]); for a cached write, before this returns (as
    /// [`Fs::write_at`]). `data` is copied before this returns.
    pub fn write<F>(&self, fh: Fh, off: u64, data: &[u8], origin: WriteOrigin, done: F)
    where
        F: FnOnce(Result<usize>) + Send + 'static,
    {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return done(Err(e)),
        };
        match (h.mode, origin) {
            (OpenMode::Direct, WriteOrigin::Caller) => {
                self.submit_write_direct(h.ino, off, data, done);
            }
            (OpenMode::Cached, _) | (OpenMode::Direct, WriteOrigin::PageCache) => {
                done(self.write_at(h.ino, off, data));
            }
        }
    }

    /// Reads up to `len` bytes at `off` through handle `fh`, by its mode; `done` gets the
    /// bytes read (fewer at EOF) or the error exactly once: for a direct read on a target
    /// completion thread (as [`Fs::read_direct`]), for a cached one before this returns
    /// (as [`Fs::read_at`]).
    pub fn read<F>(&self, fh: Fh, off: u64, len: usize, done: F)
    where
        F: FnOnce(Result<Vec<u8>>) + Send + 'static,
    {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return done(Err(e)),
        };
        match h.mode {
            OpenMode::Direct => self.submit_read_direct(h.ino, off, len, done),
            OpenMode::Cached => {
                let mut buf = vec![0u8; len];
                done(self.read_at(h.ino, off, &mut buf).map(|n| {
                    buf.truncate(n);
                    buf
                }));
            }
        }
    }

    /// [`Fs::read`] into `buf`, waiting (no copy through an intermediate vector).
    ///
    /// # Errors
    /// As [`Fs::read_at`] or [`Fs::read_direct`].
    pub(crate) fn read_into(&self, fh: Fh, off: u64, buf: &mut [u8]) -> Result<usize> {
        let h = self.handle(fh)?;
        match h.mode {
            OpenMode::Direct => self.read_direct(h.ino, off, buf),
            OpenMode::Cached => self.read_at(h.ino, off, buf),
        }
    }
}

impl File {
    /// The inode number.
    #[must_use]
    pub fn ino(&self) -> Ino {
        self.ino
    }

    /// The handle's I/O mode.
    #[must_use]
    pub fn mode(&self) -> OpenMode {
        self.mode
    }

    /// The handle number.
    #[must_use]
    pub fn fh(&self) -> Fh {
        self.fh
    }

    /// Reads by the handle's mode, waiting, into `buf` (as [`Fs::read`] without an
    /// intermediate vector).
    ///
    /// # Errors
    /// As [`Fs::read_at`] or [`Fs::read_direct`].
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.fs.read_into(self.fh, off, buf)
    }

    /// Writes by the handle's mode: [`Fs::write`] and a wait for its answer.
    ///
    /// # Errors
    /// As [`Fs::write_at`] or [`Fs::write_direct`].
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<usize> {
        let answer = Arc::new(Answer::default());
        let put = Arc::clone(&answer);
        self.fs
            .write(self.fh, off, data, WriteOrigin::Caller, move |r| put.put(r));
        answer.wait()
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
        self.fs.fsync_handle(self.fh, SyncScope::All)
    }

    /// `fdatasync`.
    ///
    /// # Errors
    /// As [`Fs::fsync`].
    pub fn sync_data(&self) -> Result<()> {
        self.fs.fsync_handle(self.fh, SyncScope::Data)
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

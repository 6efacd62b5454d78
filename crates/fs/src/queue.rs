//! Asynchronous direct I/O: [`Fs::submit_write_direct`] and [`Fs::submit_read_direct`]
//! start an I/O and call back on completion (a server answers its client from there),
//! and the queue-depth API built on them: one thread keeps many direct I/Os in
//! flight (submit now, reap later), as fio's `iodepth` or io_uring do.
//!
//! A write that can run under the shared lock is submitted and returns at once; its
//! completion (unwritten conversion included) runs on the targets' completion threads,
//! and the in-flight direct-I/O counter keeps exclusive operations (truncate, fallocate,
//! exclusive direct writes) waiting until it is done (I-000-5). A write that needs the
//! exclusive lock (allocation, sub-block zeroing, EOF) runs synchronously inside the
//! submission, as Linux's `IOMAP_DIO_FORCE_WAIT`, and calls back before returning.
//! The last release of a file waits for its queued I/O before freeing anything.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use stripefs_core::Ino;

use stripefs_iomap::direct::{submit_read_piece, submit_write_piece, write_lock_for, DioLock};
use stripefs_iomap::{iterate, IomapOp};
use stripefs_target::Batch;

use crate::direct::{first_error, DIO_WINDOW_BYTES};
use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::mapping::FileMapper;

/// A finished queued I/O.
#[derive(Debug)]
pub struct DioCompletion {
    /// The caller's tag from submission.
    pub tag: u64,
    /// Bytes transferred, or the error.
    pub result: Result<usize>,
    /// The bytes read (reads only).
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
struct QState {
    done: VecDeque<DioCompletion>,
    /// Submitted and not yet reaped (io_uring's notion of queue depth).
    unreaped: usize,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<QState>,
    cv: Condvar,
}

impl Shared {
    fn push(&self, c: DioCompletion) {
        let mut st = self.state.lock();
        st.done.push_back(c);
        self.cv.notify_all();
    }
}

/// A submission/completion queue for direct I/O.
#[derive(Debug)]
pub struct DioQueue {
    fs: Fs,
    shared: Arc<Shared>,
}

impl Fs {
    /// A new, empty direct-I/O queue.
    #[must_use]
    pub fn dio_queue(&self) -> DioQueue {
        DioQueue {
            fs: self.clone(),
            shared: Arc::default(),
        }
    }
}

impl DioQueue {
    /// I/Os submitted and not yet reaped (completed or not): the queue depth in use.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.shared.state.lock().unreaped
    }

    /// Waits until at least `min` completions are available (or every submitted I/O has
    /// completed) and returns all available ones.
    pub fn reap(&self, min: usize) -> Vec<DioCompletion> {
        let mut st = self.shared.state.lock();
        while st.done.len() < min.min(st.unreaped) {
            self.shared.cv.wait(&mut st);
        }
        let out: Vec<DioCompletion> = st.done.drain(..).collect();
        st.unreaped -= out.len();
        out
    }

    fn start(&self) {
        self.shared.state.lock().unreaped += 1;
    }

    /// Queues a direct write of `data` at `off` (sector multiples). Errors that stop the
    /// submission itself (alignment, poisoned) are returned here; I/O errors arrive as
    /// completions.
    ///
    /// # Errors
    /// `Invalid` for misalignment; `Poisoned`.
    pub fn submit_write(&self, tag: u64, ino: Ino, off: u64, data: &[u8]) -> Result<()> {
        self.fs.inner.check()?;
        self.fs.check_dio_alignment(off, data.len())?;
        self.start();
        let q = Arc::clone(&self.shared);
        self.fs.submit_write_direct(ino, off, data, move |result| {
            q.push(DioCompletion {
                tag,
                result,
                data: Vec::new(),
            });
        });
        Ok(())
    }

    /// Queues a direct read of `len` bytes at `off` (sector multiples).
    ///
    /// # Errors
    /// `Invalid` for misalignment; `Poisoned`.
    pub fn submit_read(&self, tag: u64, ino: Ino, off: u64, len: usize) -> Result<()> {
        self.fs.inner.check()?;
        self.fs.check_dio_alignment(off, len)?;
        self.start();
        let q = Arc::clone(&self.shared);
        self.fs.submit_read_direct(ino, off, len, move |r| {
            let (result, data) = match r {
                Ok(data) => (Ok(data.len()), data),
                Err(e) => (Err(e), Vec::new()),
            };
            q.push(DioCompletion { tag, result, data });
        });
        Ok(())
    }
}

impl Fs {
    /// Starts a direct write of `data` at `off` (as [`Fs::write_direct`]) and returns
    /// without waiting when it can run under the shared lock; `done` gets the result
    /// exactly once, on a target completion thread, or on this thread before returning
    /// when the write runs synchronously (exclusive lock, more than one window) or could
    /// not start. `data` is copied before this returns.
    pub fn submit_write_direct<F>(&self, ino: Ino, off: u64, data: &[u8], done: F)
    where
        F: FnOnce(Result<usize>) + Send + 'static,
    {
        let change = match self.begin_change() {
            Ok(g) => g,
            Err(e) => return done(Err(e)),
        };
        let io = self.inner.io_lock(ino);
        let shared = io.read();
        let mapper = match self.shared_write_mapper(ino, off, data.len()) {
            Ok(Some(m)) => m,
            Ok(None) => {
                drop((shared, change));
                return done(self.write_direct(ino, off, data));
            }
            Err(e) => {
                drop(shared);
                return done(Err(e));
            }
        };
        if let Err(e) = self.touch_mtime(ino) {
            drop((mapper, shared));
            return done(Err(e));
        }
        self.inner.dio_shared.fetch_add(1, Ordering::Relaxed);
        let len = data.len() as u64;
        let bs = self.inner.geo.block_size.bytes_u64();
        // From here on `done` runs from the batch's completion.
        io.dio_begin();
        let batch = Batch::new();
        let mut ends = Vec::new();
        let walked = iterate(&mapper, off, len, IomapOp::Write, |map, p, n| {
            let src = &data[(p - off) as usize..(p - off + n) as usize];
            ends.push(submit_write_piece(&mapper, &batch, map, p, src, bs));
            Ok(n)
        });
        self.inner
            .dio_pieces
            .fetch_add(batch.submitted() as u64, Ordering::Relaxed);
        // In flight (`dio_begin`) from here: a switch to read-only drains it.
        drop((shared, change));
        let (fs, io) = (self.clone(), Arc::clone(&io));
        batch.finish_with(move |completed| {
            let r = walked
                .map_err(FsError::from)
                .and_then(|_| first_error(&completed))
                .and_then(|()| fs.record_dio(ino, &ends, off + len))
                .map(|()| len as usize);
            fs.inner
                .bufs
                .put_all(completed.into_iter().flat_map(|d| d.bufs));
            io.dio_end();
            fs.drop_clean_after_dio(ino, off, len);
            done(r);
        });
    }

    /// The mapper for a direct write that may run under the shared inode lock (which the
    /// caller holds), or `None` when it needs the synchronous, exclusive path.
    fn shared_write_mapper(
        &self,
        ino: Ino,
        off: u64,
        len: usize,
    ) -> Result<Option<FileMapper<'_>>> {
        self.inner.check()?;
        self.check_dio_alignment(off, len)?;
        if len == 0 || len > DIO_WINDOW_BYTES {
            return Ok(None);
        }
        let mapper = FileMapper::new(self, ino)?;
        let end = off.checked_add(len as u64).ok_or(FsError::FileTooBig)?;
        if end > mapper.size() {
            return Ok(None);
        }
        self.coherent_range(&mapper, off, len as u64)?;
        let lock = write_lock_for(
            &mapper,
            off,
            len as u64,
            mapper.size(),
            self.inner.geo.block_size.bytes_u64(),
            self.inner.opts.dio_unaligned,
        )?;
        Ok((lock == DioLock::Shared).then_some(mapper))
    }

    /// Starts a direct read of up to `len` bytes at `off` (as [`Fs::read_direct`]);
    /// `done` gets the bytes read (fewer at EOF) exactly once, on a target completion
    /// thread or, when the read cannot start or needs no I/O, on this thread before
    /// returning.
    pub fn submit_read_direct<F>(&self, ino: Ino, off: u64, len: usize, done: F)
    where
        F: FnOnce(Result<Vec<u8>>) + Send + 'static,
    {
        if len > DIO_WINDOW_BYTES {
            let mut buf = vec![0u8; len];
            let r = self.read_direct(ino, off, &mut buf).map(|n| {
                buf.truncate(n);
                buf
            });
            return done(r);
        }
        let io = self.inner.io_lock(ino);
        let shared = io.read();
        let (mapper, n, span) = match self.read_span(ino, off, len) {
            Ok(Some(v)) => v,
            Ok(None) => {
                drop(shared);
                return done(Ok(Vec::new()));
            }
            Err(e) => {
                drop(shared);
                return done(Err(e));
            }
        };
        io.dio_begin();
        let batch = Batch::new();
        let mut pieces = Vec::new();
        let walked = iterate(&mapper, off, span, IomapOp::Read, |map, p, k| {
            let at = (p - off) as usize;
            pieces.push((
                submit_read_piece(&mapper, &batch, map, p, k),
                at,
                k as usize,
            ));
            Ok(k)
        });
        drop(shared);
        let (fs, io) = (self.clone(), Arc::clone(&io));
        batch.finish_with(move |completed| {
            let r = walked
                .map_err(FsError::from)
                .and_then(|_| first_error(&completed))
                .map(|()| {
                    let mut data = vec![0u8; span as usize];
                    for (slot, at, k) in pieces {
                        if let Some(slot) = slot {
                            data[at..at + k].copy_from_slice(&completed[slot].bufs[0][..k]);
                        }
                    }
                    data.truncate(n as usize);
                    data
                });
            fs.inner
                .bufs
                .put_all(completed.into_iter().flat_map(|d| d.bufs));
            io.dio_end();
            done(r);
        });
    }

    /// For a direct read under the shared lock: the mapper, the bytes before EOF and the
    /// sector-rounded span to read; `None` when nothing is to be read.
    fn read_span(
        &self,
        ino: Ino,
        off: u64,
        len: usize,
    ) -> Result<Option<(FileMapper<'_>, u64, u64)>> {
        self.inner.check()?;
        self.check_dio_alignment(off, len)?;
        let mapper = FileMapper::new(self, ino)?;
        if len > 0 {
            self.touch_atime(ino);
        }
        self.write_back_range(&mapper, off, len as u64)?;
        let size = mapper.size();
        if off >= size || len == 0 {
            return Ok(None);
        }
        let n = (len as u64).min(size - off);
        let span = n
            .next_multiple_of(u64::from(self.inner.geo.sector_size))
            .min(len as u64);
        Ok(Some((mapper, n, span)))
    }
}

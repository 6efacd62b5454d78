//! The queue-depth API: one thread keeps many direct I/Os in flight (submit now, reap
//! later), as fio's `iodepth` or io_uring do.
//!
//! A write that can run under the shared lock is submitted and returns at once; its
//! completion (unwritten conversion included) runs on the targets' completion threads,
//! and the in-flight direct-I/O counter keeps exclusive operations (truncate, fallocate,
//! exclusive direct writes) waiting until it is done (I-000-5). A write that needs the
//! exclusive lock (allocation, sub-block zeroing, EOF) runs synchronously inside
//! `submit_write`, as Linux's `IOMAP_DIO_FORCE_WAIT`; its completion is queued at once.
//! The last release of a file waits for its queued I/O before freeing anything.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use stripefs_core::Ino;
use stripefs_iomap::direct::{submit_read_piece, submit_write_piece, write_lock_for, DioLock};
use stripefs_iomap::{iterate, IomapOp};
use stripefs_target::{Batch, IoDone};

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

fn first_error(done: &[IoDone]) -> Result<()> {
    for d in done {
        d.result.clone()?;
    }
    Ok(())
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
    /// `Invalid` for misalignment; `Poisoned`; `Stale`.
    pub fn submit_write(&self, tag: u64, ino: Ino, off: u64, data: &[u8]) -> Result<()> {
        let fs = &self.fs;
        fs.inner.check()?;
        fs.check_dio_alignment(off, data.len())?;
        let io = fs.inner.io_lock(ino);
        let shared = io.read();
        let mapper = FileMapper::new(fs, ino)?;
        let len = data.len() as u64;
        let bs = fs.inner.geo.block_size.bytes_u64();
        let lock = if off + len <= mapper.size() {
            fs.coherent_range(&mapper, off, len)?;
            write_lock_for(
                &mapper,
                off,
                len,
                mapper.size(),
                bs,
                fs.inner.opts.dio_unaligned,
            )?
        } else {
            DioLock::Exclusive
        };
        if lock == DioLock::Exclusive {
            drop(shared);
            self.start();
            let result = fs.write_direct(ino, off, data);
            self.shared.push(DioCompletion {
                tag,
                result,
                data: Vec::new(),
            });
            return Ok(());
        }
        fs.inner
            .dio_shared
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        fs.touch_mtime(ino)?;
        // From here on a completion is guaranteed (it may carry an error).
        self.start();
        io.dio_begin();
        let batch = Batch::new();
        let mut ends = Vec::new();
        let walked = iterate(&mapper, off, len, IomapOp::Write, |map, p, n| {
            ends.push(submit_write_piece(
                &mapper,
                &batch,
                map,
                p,
                &data[(p - off) as usize..(p - off + n) as usize],
                bs,
            ));
            Ok(n)
        });
        drop(shared);
        let (fs2, q, io2) = (fs.clone(), Arc::clone(&self.shared), Arc::clone(&io));
        batch.finish_with(move |done| {
            let r = walked
                .map_err(|e| match e {
                    stripefs_iomap::IterError::Failed { error, .. } => error,
                    stripefs_iomap::IterError::Contract(m) => FsError::invalid(m),
                })
                .and_then(|_| first_error(&done))
                .and_then(|()| fs2.record_dio(ino, &ends, off + len))
                .map(|()| len as usize);
            fs2.inner
                .bufs
                .put_all(done.into_iter().flat_map(|d| d.bufs));
            io2.dio_end();
            q.push(DioCompletion {
                tag,
                result: r,
                data: Vec::new(),
            });
        });
        Ok(())
    }

    /// Queues a direct read of `len` bytes at `off` (sector multiples).
    ///
    /// # Errors
    /// `Invalid` for misalignment; `Poisoned`; `Stale`.
    pub fn submit_read(&self, tag: u64, ino: Ino, off: u64, len: usize) -> Result<()> {
        let fs = &self.fs;
        fs.inner.check()?;
        fs.check_dio_alignment(off, len)?;
        let io = fs.inner.io_lock(ino);
        let shared = io.read();
        let mapper = FileMapper::new(fs, ino)?;
        fs.write_back_range(&mapper, off, len as u64)?;
        let size = mapper.size();
        self.start();
        if off >= size || len == 0 {
            self.shared.push(DioCompletion {
                tag,
                result: Ok(0),
                data: Vec::new(),
            });
            return Ok(());
        }
        let n = (len as u64).min(size - off);
        let span = n
            .next_multiple_of(u64::from(fs.inner.geo.sector_size))
            .min(len as u64);
        io.dio_begin();
        let batch = Batch::new();
        let mut pieces = Vec::new();
        let walked = iterate(&mapper, off, span, IomapOp::Read, |map, p, k| {
            pieces.push((
                submit_read_piece(&mapper, &batch, map, p, k),
                (p - off) as usize,
                k as usize,
            ));
            Ok(k)
        });
        drop(shared);
        let (fs2, q, io2) = (fs.clone(), Arc::clone(&self.shared), Arc::clone(&io));
        batch.finish_with(move |done| {
            let mut data = vec![0u8; span as usize];
            let r = walked
                .map_err(|e| match e {
                    stripefs_iomap::IterError::Failed { error, .. } => error,
                    stripefs_iomap::IterError::Contract(m) => FsError::invalid(m),
                })
                .and_then(|_| first_error(&done))
                .map(|()| {
                    for (slot, at, k) in pieces {
                        if let Some(slot) = slot {
                            data[at..at + k].copy_from_slice(&done[slot].bufs[0][..k]);
                        }
                    }
                    data.truncate(n as usize);
                    n as usize
                });
            fs2.inner
                .bufs
                .put_all(done.into_iter().flat_map(|d| d.bufs));
            io2.dio_end();
            q.push(DioCompletion {
                tag,
                result: r,
                data,
            });
        });
        Ok(())
    }
}

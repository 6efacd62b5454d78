//! The queue-depth API over open handles ([`Fs::write`], [`Fs::read`]): one thread keeps
//! many I/Os in flight (submit now, reap later), as fio's `iodepth` or io_uring do.
//!
//! Through an `O_DIRECT` handle ([`crate::OpenMode::Direct`]), a write that can run under
//! the shared lock is submitted and returns at once; its completion (unwritten conversion
//! included) runs on the targets' completion threads, and the in-flight direct-I/O
//! counter keeps exclusive operations (truncate, fallocate, exclusive direct writes)
//! waiting until it is done (I-000-5). A write that needs the exclusive lock (allocation,
//! sub-block zeroing, EOF) runs synchronously inside the submission, as Linux's
//! `IOMAP_DIO_FORCE_WAIT`, and calls back before returning. Through a cached handle every
//! I/O completes inside its submission. The last release of a file waits for its queued
//! I/O before freeing anything.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::error::Result;
use crate::fs::Fs;
use crate::types::{Fh, OpenMode, WriteOrigin};
use parking_lot::{Condvar, Mutex};

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

/// A submission/completion queue for I/O through open handles.
#[derive(Debug)]
pub struct DioQueue {
    fs: Fs,
    shared: Arc<Shared>,
}

impl Fs {
    /// A new, empty I/O queue.
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

    /// Checks what stops a submission through `fh` itself: an unknown handle, a poisoned
    /// file system, and for an `O_DIRECT` handle misalignment.
    fn check(&self, fh: Fh, off: u64, len: usize) -> Result<()> {
        self.fs.inner.check()?;
        if self.fs.handle(fh)?.mode == OpenMode::Direct {
            self.fs.check_dio_alignment(off, len)?;
        }
        Ok(())
    }

    /// Queues a write of `data` at `off` through handle `fh` (by its mode; sector
    /// multiples for `O_DIRECT`). Errors that stop the submission itself (unknown handle,
    /// alignment, poisoned) are returned here; I/O errors arrive as completions.
    ///
    /// # Errors
    /// `Invalid` for an unknown handle or misalignment; `Poisoned`.
    pub fn submit_write(&self, tag: u64, fh: Fh, off: u64, data: &[u8]) -> Result<()> {
        self.check(fh, off, data.len())?;
        self.start();
        let q = Arc::clone(&self.shared);
        self.fs
            .write(fh, off, data, WriteOrigin::Caller, move |result| {
                q.push(DioCompletion {
                    tag,
                    result,
                    data: Vec::new(),
                });
            });
        Ok(())
    }

    /// Queues a read of `len` bytes at `off` through handle `fh` (by its mode; sector
    /// multiples for `O_DIRECT`).
    ///
    /// # Errors
    /// `Invalid` for an unknown handle or misalignment; `Poisoned`.
    pub fn submit_read(&self, tag: u64, fh: Fh, off: u64, len: usize) -> Result<()> {
        self.check(fh, off, len)?;
        self.start();
        let q = Arc::clone(&self.shared);
        self.fs.read(fh, off, len, move |r| {
            let (result, data) = match r {
                Ok(data) => (Ok(data.len()), data),
                Err(e) => (Err(e), Vec::new()),
            };
            q.push(DioCompletion { tag, result, data });
        });
        Ok(())
    }
}

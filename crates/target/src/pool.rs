//! Thread-pool engine: the portable fallback where io_uring is unavailable. Each worker
//! takes one operation at a time and issues positioned system calls; the number of workers
//! bounds the operations in flight, and a bounded queue gives submitters back-pressure.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::{Completion, IoDone, IoOp, TargetError, TargetErrorKind};

const MAX_WORKERS: usize = 16;
const EAGAIN_RETRIES: u32 = 8;

#[derive(Debug)]
pub(crate) struct PoolEngine {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

struct Shared {
    queue: Mutex<Queue>,
    work: Condvar,
    space: Condvar,
    fd: Arc<OwnedFd>,
    name: Arc<str>,
    max_queued: usize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<(IoOp, Completion)>,
    shutdown: bool,
}

impl PoolEngine {
    pub(crate) fn new(fd: Arc<OwnedFd>, name: Arc<str>, depth: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            space: Condvar::new(),
            fd,
            name,
            max_queued: depth,
        });
        let mut engine = Self {
            shared,
            workers: Vec::new(),
        };
        for i in 0..depth.min(MAX_WORKERS) {
            let s = Arc::clone(&engine.shared);
            // On failure `engine` drops here and stops the workers already started.
            let w = std::thread::Builder::new()
                .name(format!("stripefs-io{i}"))
                .spawn(move || worker(&s))?;
            engine.workers.push(w);
        }
        Ok(engine)
    }

    pub(crate) fn submit(&self, op: IoOp, done: Completion) {
        let mut q = self.shared.queue.lock();
        while q.ops.len() >= self.shared.max_queued {
            self.shared.space.wait(&mut q);
        }
        q.ops.push_back((op, done));
        drop(q);
        self.shared.work.notify_one();
    }
}

impl Drop for PoolEngine {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared) {
    loop {
        let (mut op, done) = {
            let mut q = s.queue.lock();
            loop {
                if let Some(item) = q.ops.pop_front() {
                    break item;
                }
                if q.shutdown {
                    return;
                }
                s.work.wait(&mut q);
            }
        };
        s.space.notify_one();
        let result = execute(s.fd.as_raw_fd(), &mut op)
            .map_err(|(at, kind)| TargetError::new(s.name.clone(), op.kind(), at, kind));
        done(IoDone {
            bufs: op.into_bufs(),
            result,
        });
    }
}

pub(crate) fn execute(fd: RawFd, op: &mut IoOp) -> Result<(), (u64, TargetErrorKind)> {
    match op {
        IoOp::Read { offset, bufs } => each_buf(fd, *offset, bufs, Transfer::Read),
        IoOp::Write { offset, bufs } => each_buf(fd, *offset, bufs, Transfer::Write),
        // Each piece written with `RWF_DSYNC` is durable when its call returns, so the
        // whole operation is when the last one does.
        IoOp::WriteFua { offset, bufs } => each_buf(fd, *offset, bufs, Transfer::WriteDsync),
        IoOp::Flush => {
            // SAFETY: plain system call on an fd the engine keeps open.
            if unsafe { libc::fdatasync(fd) } < 0 {
                return Err((0, errno_kind(last_errno())));
            }
            Ok(())
        }
        IoOp::Discard { .. } => Ok(()),
    }
}

/// How one system call moves bytes.
#[derive(Debug, Clone, Copy)]
enum Transfer {
    Read,
    Write,
    /// `pwritev2(RWF_DSYNC)`: durable when the call returns.
    WriteDsync,
}

fn each_buf(
    fd: RawFd,
    offset: u64,
    bufs: &mut [crate::IoBuf],
    how: Transfer,
) -> Result<(), (u64, TargetErrorKind)> {
    let mut at = offset;
    for b in bufs.iter_mut() {
        let len = b.len();
        // A write only reads its buffer: a lent window is passed as it is.
        let ptr = match how {
            Transfer::Read => b.as_mut_ptr(),
            Transfer::Write | Transfer::WriteDsync => b.as_ptr().cast_mut(),
        };
        transfer(fd, at, len, how, ptr)?;
        at += len as u64;
    }
    Ok(())
}

fn transfer(
    fd: RawFd,
    offset: u64,
    len: usize,
    how: Transfer,
    ptr: *mut u8,
) -> Result<(), (u64, TargetErrorKind)> {
    let mut done = 0usize;
    let mut again = 0;
    while done < len {
        let pos = (offset + done as u64) as libc::off_t;
        // SAFETY: `ptr` is valid for `len` bytes (an IoBuf owned by the operation) and is
        // not aliased while the worker holds the operation; a write only reads through it
        // (lent memory is never written while a window is out: stable pages, `buf.rs`).
        let n = unsafe {
            let p = ptr.add(done);
            match how {
                Transfer::Read => libc::pread(fd, p.cast(), len - done, pos),
                Transfer::Write => libc::pwrite(fd, p.cast(), len - done, pos),
                Transfer::WriteDsync => {
                    let iov = libc::iovec {
                        iov_base: p.cast(),
                        iov_len: len - done,
                    };
                    libc::pwritev2(fd, &iov, 1, pos, libc::RWF_DSYNC)
                }
            }
        };
        if n < 0 {
            let e = last_errno();
            if e == libc::EINTR || (e == libc::EAGAIN && again < EAGAIN_RETRIES) {
                again += 1;
                continue;
            }
            return Err((offset + done as u64, errno_kind(e)));
        }
        if n == 0 {
            return Err((
                offset,
                TargetErrorKind::Short {
                    done: done as u64,
                    want: len as u64,
                },
            ));
        }
        done += n as usize;
    }
    Ok(())
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn errno_kind(e: i32) -> TargetErrorKind {
    if e == libc::ENOSPC {
        TargetErrorKind::NoSpace
    } else {
        TargetErrorKind::Os(e)
    }
}

//! io_uring engine: one ring and one completion thread per target.
//!
//! Submitters push onto a bounded queue and poke an eventfd; the ring thread keeps a read of
//! that eventfd armed, so it wakes both for completions and for new work, moves queued
//! operations into the submission ring while fewer than `depth` are in flight, and runs
//! completions. `EAGAIN` from the kernel (polled I/O, request starvation) is retried a few
//! times and is never taken as evidence of anything else (I-000-4).
//!
//! ```text
//!  submitters --push--> [queue] --eventfd--> ring thread --SQE--> kernel
//!                                                ^                  |
//!                                                +------CQE---------+  -> done(IoDone)
//! ```

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::{Condvar, Mutex};

use crate::{Completion, IoDone, IoOp, TargetError, TargetErrorKind};

const EVENTFD_TOKEN: u64 = u64::MAX;
const EAGAIN_RETRIES: u8 = 8;

/// An operation slower than this, from its submission to its completion, logs where its
/// time went (`STRIPEFS_LOG=stripefs_target=debug`): queued here or in the kernel. Only
/// then are operations timed: without that log the I/O path reads no clock.
pub(crate) const SLOW_OP: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub(crate) struct UringEngine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    queue: Mutex<VecDeque<Pending>>,
    space: Condvar,
    efd: OwnedFd,
    shutdown: AtomicBool,
    max_queued: usize,
    name: Arc<str>,
    /// Slow operations are logged (debug logging of this module was on at start).
    timed: bool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

struct Pending {
    op: IoOp,
    done: Completion,
    retries: u8,
    /// When the submitter queued it (kept across `EAGAIN` retries), if timed.
    queued_at: Option<Instant>,
}

struct InFlight {
    pending: Pending,
    /// When it went into the submission ring (if timed), and how many operations of this
    /// target were then in the kernel (itself included).
    issued_at: Option<Instant>,
    in_flight_at_issue: usize,
    /// Keeps the iovec array alive (and unmoved) while the kernel may read it.
    _iov: Box<[libc::iovec]>,
}

impl UringEngine {
    /// Checks that io_uring can be set up at all here.
    pub(crate) fn probe() -> std::io::Result<()> {
        IoUring::new(2).map(drop)
    }

    pub(crate) fn new(fd: Arc<OwnedFd>, name: Arc<str>, depth: usize) -> std::io::Result<Self> {
        let entries = u32::try_from((depth + 1).next_power_of_two()).unwrap_or(8192);
        let ring = IoUring::new(entries)?;
        // SAFETY: plain system call; the returned fd is owned below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd we exclusively own.
        let efd = unsafe { OwnedFd::from_raw_fd(raw) };
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            space: Condvar::new(),
            efd,
            shutdown: AtomicBool::new(false),
            max_queued: depth,
            name,
            timed: tracing::enabled!(tracing::Level::DEBUG),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("stripefs-uring".into())
            .spawn(move || run(ring, &s, &fd, depth))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn submit(&self, op: IoOp, done: Completion) {
        let mut q = self.shared.queue.lock();
        while q.len() >= self.shared.max_queued {
            self.shared.space.wait(&mut q);
        }
        q.push_back(Pending {
            op,
            done,
            retries: 0,
            queued_at: self.shared.timed.then(Instant::now),
        });
        drop(q);
        poke(self.shared.efd.as_raw_fd());
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        poke(self.shared.efd.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn poke(efd: RawFd) {
    // SAFETY: eventfd_write on an eventfd we own; failure (counter overflow) only means the
    // thread is already due to wake.
    unsafe { libc::eventfd_write(efd, 1) };
}

fn run(mut ring: IoUring, s: &Shared, fd: &Arc<OwnedFd>, depth: usize) {
    let mut slots: Vec<Option<InFlight>> = (0..depth).map(|_| None).collect();
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut efd_val = Box::new(0u64);
    let mut efd_armed = false;
    loop {
        if !efd_armed {
            let sqe = opcode::Read::new(
                types::Fd(s.efd.as_raw_fd()),
                std::ptr::from_mut(&mut *efd_val).cast(),
                8,
            )
            .build()
            .user_data(EVENTFD_TOKEN);
            push(&mut ring, &sqe);
            efd_armed = true;
        }
        if fill(&mut ring, s, fd.as_raw_fd(), &mut slots, &mut free) {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => tracing::error!(target = %s.name, error = %e, "io_uring_enter failed"),
        }
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let reaped_at = s.timed.then(Instant::now);
        for (token, res) in cqes {
            if token == EVENTFD_TOKEN {
                efd_armed = false;
                continue;
            }
            let slot = usize::try_from(token).expect("token is a slot index");
            let inflight = slots[slot].take().expect("completion for an occupied slot");
            free.push(slot);
            if let Some(at) = reaped_at {
                report_slow(s, &inflight, at);
            }
            complete(s, inflight.pending, res);
        }
    }
    // The ring (and with it the armed eventfd read) must go before the buffer it reads into.
    drop(ring);
    drop(efd_val);
}

/// Moves queued operations into the ring while slots are free. Returns true when the engine
/// is shut down and idle.
fn fill(
    ring: &mut IoUring,
    s: &Shared,
    fd: RawFd,
    slots: &mut [Option<InFlight>],
    free: &mut Vec<usize>,
) -> bool {
    let mut q = s.queue.lock();
    let mut moved = false;
    while let Some(&slot) = free.last() {
        let Some(mut pending) = q.pop_front() else {
            break;
        };
        free.pop();
        let (sqe, iov) = build_sqe(fd, &mut pending.op, slot as u64);
        slots[slot] = Some(InFlight {
            pending,
            issued_at: s.timed.then(Instant::now),
            in_flight_at_issue: slots.len() - free.len(),
            _iov: iov,
        });
        push(ring, &sqe);
        moved = true;
    }
    if moved {
        s.space.notify_all();
    }
    s.shutdown.load(Ordering::Acquire) && q.is_empty() && free.len() == slots.len()
}

/// Logs an operation that took [`SLOW_OP`] or more: how long it waited in this engine's
/// queue (behind the in-flight limit or the ring thread), how long in the kernel (until
/// the ring thread reaped its completion, `reaped_at`), and how long behind the completions
/// reaped with it.
fn report_slow(s: &Shared, f: &InFlight, reaped_at: Instant) {
    let (Some(queued_at), Some(issued_at)) = (f.pending.queued_at, f.issued_at) else {
        return;
    };
    let now = Instant::now();
    let total = now - queued_at;
    if total < SLOW_OP {
        return;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(
        target = %s.name,
        op = ?f.pending.op.kind(),
        offset = f.pending.op.offset(),
        len = f.pending.op.len(),
        total_ms = ms(total),
        queued_ms = ms(issued_at - queued_at),
        kernel_ms = ms(reaped_at - issued_at),
        behind_completions_ms = ms(now - reaped_at),
        in_flight = f.in_flight_at_issue,
        "slow operation"
    );
}

fn push(ring: &mut IoUring, sqe: &squeue::Entry) {
    // SAFETY: every pointer in `sqe` (iovec array, buffers, eventfd counter) stays valid and
    // unmoved until its completion is reaped: they are owned by `slots` or by `run`.
    let pushed = unsafe { ring.submission().push(sqe) };
    assert!(
        pushed.is_ok(),
        "submission ring sized above the in-flight limit"
    );
}

fn build_sqe(fd: RawFd, op: &mut IoOp, token: u64) -> (squeue::Entry, Box<[libc::iovec]>) {
    let iov_of = |bufs: &mut Vec<crate::IoBuf>| -> Box<[libc::iovec]> {
        bufs.iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect()
    };
    // A write only reads its buffers: lent windows go to the kernel as they are.
    let write_iov = |bufs: &Vec<crate::IoBuf>| -> Box<[libc::iovec]> {
        bufs.iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr().cast_mut().cast(),
                iov_len: b.len(),
            })
            .collect()
    };
    let (entry, iov) = match op {
        IoOp::Read { offset, bufs } => {
            let iov = iov_of(bufs);
            let e = opcode::Readv::new(types::Fd(fd), iov.as_ptr(), iov.len() as u32)
                .offset(*offset)
                .build();
            (e, iov)
        }
        IoOp::Write { offset, bufs } => {
            let iov = write_iov(bufs);
            let e = opcode::Writev::new(types::Fd(fd), iov.as_ptr(), iov.len() as u32)
                .offset(*offset)
                .build();
            (e, iov)
        }
        IoOp::WriteFua { offset, bufs } => {
            let iov = write_iov(bufs);
            let e = opcode::Writev::new(types::Fd(fd), iov.as_ptr(), iov.len() as u32)
                .offset(*offset)
                .rw_flags(libc::RWF_DSYNC)
                .build();
            (e, iov)
        }
        IoOp::Flush => {
            let e = opcode::Fsync::new(types::Fd(fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build();
            (e, Box::default())
        }
        IoOp::Discard { .. } => unreachable!("discard is served synchronously by FileTarget"),
    };
    (entry.user_data(token), iov)
}

fn complete(s: &Shared, mut p: Pending, res: i32) {
    let want = p.op.len();
    let result = if res < 0 {
        let errno = -res;
        if errno == libc::EAGAIN && p.retries < EAGAIN_RETRIES {
            p.retries += 1;
            s.queue.lock().push_front(p);
            return;
        }
        Err(TargetError::from_errno(
            s.name.clone(),
            p.op.kind(),
            p.op.offset(),
            errno,
        ))
    } else if !matches!(p.op, IoOp::Flush) && res as u64 != want {
        let kind = TargetErrorKind::Short {
            done: res as u64,
            want,
        };
        Err(TargetError::new(
            s.name.clone(),
            p.op.kind(),
            p.op.offset(),
            kind,
        ))
    } else {
        Ok(())
    };
    (p.done)(IoDone {
        bufs: p.op.into_bufs(),
        result,
    });
}

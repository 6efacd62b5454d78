//! Block targets: the only place stripefs touches storage.
//!
//! Every byte the file system reads or writes goes through [`Target::submit`], an
//! asynchronous, owned-buffer interface shaped after io_uring: the caller hands over an
//! [`IoOp`] with its buffers and gets them back in an [`IoDone`] passed to a completion
//! callback. [`Batch`] is the completion anchor that lets a caller submit many operations
//! (to one or many targets) and wait once.
//!
//! Backends:
//! - [`FileTarget`]: a regular file or block device opened with `O_DIRECT`, served by an
//!   io_uring thread per target or, where io_uring is unavailable, a pool of threads;
//! - [`SimTarget`]: an in-memory target with a live and a durable image, crash, torn and
//!   reordered writes and injected faults, reproducible from one seed;
//! - [`NbdTarget`]: an export of a Network Block Device server on another machine (or a
//!   Unix socket), many requests in flight per connection, named by an NBD URI;
//! - [`RecordingTarget`]: logs completed writes and flushes so that a test can rebuild the
//!   image at any flush point.
//!
//! Architecture Invariant: this crate knows nothing of file systems: no blocks, extents or
//! journal, only byte offsets on one device.

mod absent;
mod batch;
mod buf;
mod counts;
mod error;
pub mod fault;
mod file;
mod gate;
mod lock;
mod nbd;
mod pool;
mod pool_buf;
mod recording;
mod rng;
mod set;
mod sim;
mod uring;

use std::sync::Arc;

pub use absent::AbsentTarget;
pub use batch::Batch;
pub use buf::{IoBuf, SharedBuf, IO_ALIGN};
pub use counts::{OpCounters, OpCounts};
pub use error::{OpKind, TargetError, TargetErrorKind};
pub use fault::{FaultInjector, FaultKind, FaultPoint, Persistence, PointMatch};
pub use file::{EngineKind, FileTarget, FileTargetOptions};
pub use gate::GateTarget;
pub use lock::{LockWait, TargetLock};
pub use nbd::{NbdAddr, NbdOptions, NbdTarget, NbdUri, NBD_DEFAULT_PORT};
pub use pool_buf::BufPool;
pub use recording::{Event, Recorder, RecordingTarget, UnflushedPolicy};
pub use rng::Rng;
pub use set::{SetFull, TargetSet};
pub use sim::{CrashMode, SimStats, SimTarget};

/// One operation on a target. Offsets and buffer lengths must be multiples of the target's
/// logical sector size; buffers are [`IoBuf`]s and therefore suitably aligned.
#[derive(Debug)]
pub enum IoOp {
    /// Positioned vectored read filling `bufs` in order from `offset`.
    Read { offset: u64, bufs: Vec<IoBuf> },
    /// Positioned vectored write of `bufs` in order from `offset`.
    Write { offset: u64, bufs: Vec<IoBuf> },
    /// A write that is durable when it completes (forced unit access: `RWF_DSYNC` on a
    /// file, `REQ_FUA` on a block device, `NBD_CMD_FLAG_FUA` on a network export). It
    /// says nothing about other writes: earlier completed writes still need a
    /// [`IoOp::Flush`]. Targets without the feature emulate it as a write followed by a
    /// flush and say so in [`TargetInfo::fua`].
    WriteFua { offset: u64, bufs: Vec<IoBuf> },
    /// Make every completed write durable (`fdatasync` / cache flush).
    Flush,
    /// The range's contents are no longer needed (may read back as anything).
    Discard { offset: u64, len: u64 },
}

impl IoOp {
    /// The kind of this operation, for errors and statistics.
    #[must_use]
    pub fn kind(&self) -> OpKind {
        match self {
            IoOp::Read { .. } => OpKind::Read,
            IoOp::Write { .. } | IoOp::WriteFua { .. } => OpKind::Write,
            IoOp::Flush => OpKind::Flush,
            IoOp::Discard { .. } => OpKind::Discard,
        }
    }

    /// Byte offset the operation starts at (0 for a flush).
    #[must_use]
    pub fn offset(&self) -> u64 {
        match self {
            IoOp::Read { offset, .. }
            | IoOp::Write { offset, .. }
            | IoOp::WriteFua { offset, .. } => *offset,
            IoOp::Discard { offset, .. } => *offset,
            IoOp::Flush => 0,
        }
    }

    /// Number of bytes transferred or affected.
    #[must_use]
    pub fn len(&self) -> u64 {
        match self {
            IoOp::Read { bufs, .. } | IoOp::Write { bufs, .. } | IoOp::WriteFua { bufs, .. } => {
                bufs.iter().map(|b| b.len() as u64).sum()
            }
            IoOp::Discard { len, .. } => *len,
            IoOp::Flush => 0,
        }
    }

    /// True when the operation moves no bytes (a flush or an empty transfer).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The operation's buffers (none for a flush or discard).
    #[must_use]
    pub fn into_bufs(self) -> Vec<IoBuf> {
        match self {
            IoOp::Read { bufs, .. } | IoOp::Write { bufs, .. } | IoOp::WriteFua { bufs, .. } => {
                bufs
            }
            IoOp::Flush | IoOp::Discard { .. } => Vec::new(),
        }
    }
}

/// What a completed operation hands back: its buffers (filled, for reads) and the result.
#[derive(Debug)]
pub struct IoDone {
    pub bufs: Vec<IoBuf>,
    pub result: Result<(), TargetError>,
}

/// Completion callback. Runs on the backend's completion context: it must be short and must
/// not block on locks that a submitter may hold while waiting for back-pressure.
pub type Completion = Box<dyn FnOnce(IoDone) + Send + 'static>;

/// Static facts about a target.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    /// Human-readable name (a path for file targets), used in every error.
    pub name: Arc<str>,
    /// Usable size in bytes (a multiple of `sector_size`).
    pub size_bytes: u64,
    /// Smallest legal I/O unit and alignment, in bytes (512 to 4096).
    pub sector_size: u32,
    /// How [`IoOp::WriteFua`] is carried out.
    pub fua: FuaSupport,
}

/// How a target carries out a forced-unit-access write ([`IoOp::WriteFua`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuaSupport {
    /// One device operation that is durable at completion (`RWF_DSYNC`, `REQ_FUA`,
    /// `NBD_CMD_FLAG_FUA`, or a device without a volatile cache). On a file or block
    /// device the kernel itself may turn it into a write and a cache flush when the
    /// hardware lacks FUA; it is still one request from stripefs.
    Native,
    /// A write followed by a full flush of the target (the device has a volatile cache but
    /// no FUA): durable at completion too, at the cost of two operations.
    Emulated,
}

/// A storage device: positioned vectored reads and writes, flush, discard.
///
/// Implementations must accept many operations in flight at once and complete each exactly
/// once by calling its [`Completion`]. Submission may block for back-pressure when the
/// backend's per-target in-flight limit is reached.
pub trait Target: Send + Sync + std::fmt::Debug {
    /// Static facts: name, size, logical sector size.
    fn info(&self) -> &TargetInfo;

    /// Queues `op`; `done` is called exactly once with the buffers and the result.
    fn submit(&self, op: IoOp, done: Completion);

    /// As [`Target::submit`], for a caller that submits nothing more before it waits: a
    /// backend that can run `op` on the calling thread (a file's system call) does, and
    /// calls `done` before returning, saving the hand-over to its engine and back (the
    /// caller's other operations, already submitted, run meanwhile). The default queues
    /// it as `submit` does.
    fn submit_here(&self, op: IoOp, done: Completion) {
        self.submit(op, done);
    }

    /// Device operations issued so far (after validation), or `None` for an
    /// implementation that keeps no counters. Every backend of this crate counts; an
    /// emulated FUA write counts as the write and the flush it became.
    fn op_counts(&self) -> Option<OpCounts> {
        None
    }

    /// Synchronous read of `len` bytes at `offset`.
    ///
    /// # Errors
    /// Returns the target's error for the read.
    fn read_sync(&self, offset: u64, len: usize) -> Result<IoBuf, TargetError> {
        let batch = Batch::new();
        batch.submit_here(
            self,
            IoOp::Read {
                offset,
                bufs: vec![IoBuf::zeroed(len)],
            },
        );
        let mut done = batch.wait();
        let d = done.pop().expect("batch of one yields one completion");
        d.result?;
        Ok(d.bufs.into_iter().next().expect("read returns its buffer"))
    }

    /// Synchronous write of `buf` at `offset`.
    ///
    /// # Errors
    /// Returns the target's error for the write.
    fn write_sync(&self, offset: u64, buf: IoBuf) -> Result<(), TargetError> {
        run_one(
            self,
            IoOp::Write {
                offset,
                bufs: vec![buf],
            },
        )
    }

    /// Synchronous forced-unit-access write: `buf` is durable when this returns.
    ///
    /// # Errors
    /// Returns the target's error for the write (or for the flush that emulates FUA).
    fn write_fua_sync(&self, offset: u64, buf: IoBuf) -> Result<(), TargetError> {
        run_one(
            self,
            IoOp::WriteFua {
                offset,
                bufs: vec![buf],
            },
        )
    }

    /// Synchronous flush.
    ///
    /// # Errors
    /// Returns the target's error for the flush.
    fn flush_sync(&self) -> Result<(), TargetError> {
        run_one(self, IoOp::Flush)
    }
}

/// One operation, waited for at once: run on this thread where the target can
/// ([`Target::submit_here`]).
fn run_one<T: Target + ?Sized>(target: &T, op: IoOp) -> Result<(), TargetError> {
    let batch = Batch::new();
    batch.submit_here(target, op);
    batch
        .wait()
        .pop()
        .expect("batch of one yields one completion")
        .result
}

/// Checks the alignment and range rules every backend enforces before touching storage.
///
/// # Errors
/// `Misaligned` or `OutOfRange` naming the operation.
pub fn validate(info: &TargetInfo, op: &IoOp) -> Result<(), TargetError> {
    let sector = u64::from(info.sector_size);
    let err = |kind| TargetError::new(info.name.clone(), op.kind(), op.offset(), kind);
    match op {
        IoOp::Read { offset, bufs }
        | IoOp::Write { offset, bufs }
        | IoOp::WriteFua { offset, bufs } => {
            if offset % sector != 0
                || bufs
                    .iter()
                    .any(|b| !(b.len() as u64).is_multiple_of(sector))
            {
                return Err(err(TargetErrorKind::Misaligned {
                    sector: info.sector_size,
                }));
            }
            let end = offset.checked_add(op.len());
            if end.is_none_or(|e| e > info.size_bytes) {
                return Err(err(TargetErrorKind::OutOfRange {
                    size: info.size_bytes,
                }));
            }
        }
        IoOp::Discard { offset, len } => {
            if offset.checked_add(*len).is_none_or(|e| e > info.size_bytes) {
                return Err(err(TargetErrorKind::OutOfRange {
                    size: info.size_bytes,
                }));
            }
        }
        IoOp::Flush => {}
    }
    Ok(())
}

/// Carries out a FUA write on a target without FUA: the write, waited for here (so
/// `submit` blocks for one round trip), then a flush completing `done`.
pub(crate) fn write_then_flush<T: Target + ?Sized>(
    target: &T,
    offset: u64,
    bufs: Vec<IoBuf>,
    done: Completion,
) {
    let batch = Batch::new();
    batch.submit(target, IoOp::Write { offset, bufs });
    let wrote = batch
        .wait()
        .pop()
        .expect("batch of one yields one completion");
    if wrote.result.is_err() {
        return done(wrote);
    }
    let bufs = wrote.bufs;
    target.submit(
        IoOp::Flush,
        Box::new(move |f: IoDone| {
            done(IoDone {
                bufs,
                result: f.result,
            });
        }),
    );
}

/// Completes `op` immediately with `err` (used by backends for validation failures).
pub(crate) fn fail_now(op: IoOp, done: Completion, err: TargetError) {
    done(IoDone {
        bufs: op.into_bufs(),
        result: Err(err),
    });
}

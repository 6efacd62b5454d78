//! The generic I/O layer: mapping iteration.
//!
//! An I/O path (read, write, and later the page cache, direct I/O, writeback and zeroing)
//! walks a file range by asking the file system for one mapping at a time. The file system
//! answers "what is at `pos`" with an [`Iomap`]; the path does its work for a prefix of that
//! mapping, reports how far it got, and the file system's `end` commits what was used.
//!
//! Architecture Invariant: this crate never names a target, a stripe, the allocator or the
//! journal. A mapping's address is an opaque value of the file system's choosing
//! ([`IomapOps::Addr`]) that the path hands back to the file system to do I/O.

mod buffered;
pub mod cache;
pub mod direct;
pub mod folio;
mod iter;
pub mod lru;
mod readahead;
mod writeback;
mod zero;

pub use buffered::{balance_dirty, fill, read, write};
pub use iter::{iterate, IterError, Step};
pub use writeback::{
    writeback, writeback_finish, writeback_start, WbEnd, WbOutcome, WbStart, WbStarted, WbStats,
    WbWait, BATCH_BYTES as WRITEBACK_BATCH_BYTES,
};
pub use zero::{invalidate_range, zero_range, zero_tail_settled, ZeroMode};

use stripefs_target::{Batch, BufPool, IoBuf, TargetError};

/// What a range of a file is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IomapKind {
    /// No blocks: reads return zeros; a write must allocate.
    Hole,
    /// Space reserved in memory, not yet allocated (page-cache writes only).
    Delalloc,
    /// Allocated but never written: reads return zeros; written data needs conversion.
    Unwritten,
    /// Allocated and holding data.
    Mapped,
    /// Mapped to blocks shared with another file: writes must copy first.
    Shared,
}

/// Mapping flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IomapFlags(u32);

impl IomapFlags {
    /// The blocks were allocated by this `begin`: their old contents are garbage and any
    /// part of a block the I/O does not cover must be zeroed.
    pub const NEW: Self = Self(1);
    /// The mapping ends at a device boundary (stripe unit or target change): never merge
    /// I/O across it.
    pub const BOUNDARY: Self = Self(2);
    /// Dirty page cache lies over the range (zeroing must not skip it).
    pub const DIRTY: Self = Self(4);
    /// This `begin` reserved the space of the delayed allocation it returns (a buffered
    /// write over a hole): `end` gives back what the write did not use. Nothing is
    /// allocated, so this is not `NEW`.
    pub const RESERVED: Self = Self(8);
    /// The mapped blocks are shared with other extents (a clone): reads may use them, a
    /// write never lands on them (writeback and direct writes get new blocks, `NEW`, and
    /// the file system remaps at completion). A buffered write over them is `RESERVED`
    /// for that copy.
    pub const SHARED: Self = Self(16);
    /// Empty set.
    pub const NONE: Self = Self(0);

    /// True when every flag of `other` is set.
    #[must_use]
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    #[must_use]
    pub fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// What the caller intends to do with a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IomapOp {
    /// Read: holes stay holes.
    Read,
    /// Unbuffered write: the file system allocates as needed and may return `NEW` mappings.
    Write,
    /// Buffered write into the page cache: the file system reserves space for holes
    /// (delayed allocation) and returns `Delalloc` for them; nothing is allocated.
    BufferedWrite,
    /// Writeback of dirty cache: the file system allocates delalloc and holes (`NEW`).
    Writeback,
    /// Report only (fiemap, seek, zeroing): nothing is allocated or reserved.
    Report,
}

/// One mapping of a file range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iomap<A> {
    /// File byte offset where the mapping starts (at or before the requested `pos`).
    pub offset: u64,
    /// Bytes covered.
    pub length: u64,
    pub kind: IomapKind,
    pub flags: IomapFlags,
    /// Device address of byte `offset` (meaningless for holes and delalloc).
    pub addr: A,
    /// Validity cookie: the file's mapping sequence when this was produced; a path that
    /// drops locks checks it with [`IomapOps::still_valid`] before trusting the mapping.
    pub seq: u64,
}

impl<A> Iomap<A> {
    /// One past the last byte covered.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.offset + self.length
    }

    /// True if the mapping holds data written before this operation: mapped, and not
    /// allocated by this `begin` (`NEW`). Only such blocks may be read for a partial-block
    /// write or written sector-exact by a direct write; everything else is zeros.
    #[must_use]
    pub fn is_written(&self) -> bool {
        self.kind == IomapKind::Mapped && !self.flags.contains(IomapFlags::NEW)
    }

    /// True if `pos` lies inside the mapping.
    #[must_use]
    pub fn covers(&self, pos: u64) -> bool {
        pos >= self.offset && pos < self.end()
    }
}

/// The file system's side of the contract.
pub trait IomapOps {
    /// Opaque device address carried by mappings.
    type Addr: Copy + std::fmt::Debug;
    /// The file system's error type.
    type Error;

    /// Maps `[pos, pos + len)`: the result must cover `pos` and may be shorter than asked.
    ///
    /// # Errors
    /// The file system's error (out of space, I/O error, corruption...).
    fn begin(&self, pos: u64, len: u64, op: IomapOp) -> Result<Iomap<Self::Addr>, Self::Error>;

    /// Commits the use of `[pos, pos + used)` of `map` (`used` may be 0 after an error).
    /// Called exactly once for every successful `begin`.
    ///
    /// # Errors
    /// The file system's error.
    fn end(
        &self,
        map: &Iomap<Self::Addr>,
        pos: u64,
        used: u64,
        op: IomapOp,
    ) -> Result<(), Self::Error>;

    /// True if `map` still describes the file (its `seq` is current).
    fn still_valid(&self, map: &Iomap<Self::Addr>) -> bool;
}

/// Which way a device I/O goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoDir {
    Read,
    Write,
}

/// What every I/O path needs from the file system beyond the mapping contract: the size,
/// device I/O for a piece of a mapping, buffers and error conversion.
pub trait FileIo: IomapOps {
    /// In-core file size.
    fn size(&self) -> u64;
    /// A buffered write has copied bytes up to `end` into a folio it still holds locked:
    /// the in-core size grows to `end` if that is larger (Linux's `i_size_write` in
    /// `iomap_write_end`, before the folio is unlocked). Writeback reads the size under
    /// the folio lock and writes the EOF block's bytes past it as zeros, clearing the
    /// block's dirty bit; a size that grew only after the folio was unlocked would let it
    /// take the block in between and lose the bytes the write put past the old size.
    fn extend_size(&self, end: u64);
    /// Submits one device I/O for bytes `[pos, pos + total length of bufs)` of mapping
    /// `map` (inside the mapping), vectored over `bufs` in order, into `batch`; returns the
    /// completion slot. Writeback's buffers may be windows lent from folios
    /// ([`IoBuf::is_lent`]).
    fn submit(
        &self,
        batch: &Batch,
        map: &Iomap<Self::Addr>,
        pos: u64,
        dir: IoDir,
        bufs: Vec<IoBuf>,
    ) -> usize;
    /// Recycled I/O buffers.
    fn buffers(&self) -> &BufPool;
    /// Converts a device error.
    fn io_error(&self, e: TargetError) -> Self::Error;
    /// The contract was broken (a bug, reported rather than trusted).
    fn contract_error(&self, what: String) -> Self::Error;
}

/// What the page cache's write side (writeback, zeroing, and so direct I/O's coherence)
/// needs beyond [`FileIo`].
pub trait CacheIo: FileIo {
    /// The errno of an error (recorded for fsync when writeback fails).
    fn errno(&self, e: &Self::Error) -> i32;
    /// Writeback I/O for `ends` completed with `outcome`. The file system records
    /// allocations and conversions, or frees what it allocated.
    ///
    /// # Errors
    /// The file system's error.
    fn writeback_done(
        &self,
        ends: &[WbEnd<Self::Addr>],
        outcome: WbOutcome,
    ) -> Result<(), Self::Error>;
    /// Every mapping of one writeback batch has been made and its I/O submitted into
    /// `batch` (a file system that held a write back, to run it on this thread,
    /// submits it now: nothing else joins the batch); its
    /// [`CacheIo::writeback_done`] follows later, after the mappings of up to
    /// `writeback_depth - 1` further batches. Batches complete in the order they were
    /// submitted, so a file system that tracks what `begin` allocated per operation
    /// closes the batch's set here and settles it in `writeback_done`. File systems that
    /// allocate nothing in writeback need not track anything.
    fn writeback_submitted(&self, _batch: &Batch) {}
    /// An offset `q` in `[pos, end]` such that every block touching `[pos, q)` is a hole or
    /// unwritten: no written data on the device and no delayed allocation, so it reads
    /// zero without the cache's help. `q` is `end` when no such block follows, and may be
    /// less than the largest such offset (returning `pos` is always correct). Zeroing
    /// skips these ranges where nothing is cached, so its cost follows the data, never
    /// the size of the range. Must cost no more than the number of extents.
    ///
    /// # Errors
    /// The file system's error.
    fn next_stored(&self, pos: u64, end: u64) -> Result<u64, Self::Error>;
}

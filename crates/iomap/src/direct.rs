//! Direct I/O: the lock policy and the per-mapping I/O construction.
//!
//! The file system holds the locks, makes the cache coherent and records completions; this
//! module decides, from mappings alone, which lock a direct write needs, and turns each
//! mapping into device I/O.
//!
//! Lock policy (ext4 style, decided before any byte is submitted, so a retry is never
//! needed and `EAGAIN` from below is never interpreted, I-000-4):
//! - shared: the whole range lies inside EOF over written blocks (aligned or not), or over
//!   unwritten blocks that it covers whole (I-000-2); such writes touch only their own
//!   sectors, so concurrent writers to the same block cannot zero each other's bytes;
//! - exclusive: anything that allocates (holes, delalloc), zeroes part of a block
//!   (sub-block writes over unwritten or new blocks), or moves EOF (I-000-6). The caller
//!   then drains in-flight direct I/O and completes the write before unlocking (I-000-1,
//!   I-000-5).
//!
//! I/O construction: a written mapping gets exactly the sectors of the write (no
//! read-modify-write, which is what makes the shared path safe); a new or unwritten
//! mapping gets whole blocks, the bytes around the data zeroed, so no stale byte can ever
//! become visible when the blocks are recorded written.

use stripefs_target::{Batch, IoBuf};

use crate::buffered::FileIo;
use crate::{iterate, Iomap, IomapFlags, IomapKind, IomapOp, Step};

/// The inode lock a direct write needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DioLock {
    /// Concurrent with other shared direct writes and with readers.
    Shared,
    /// Alone, after draining in-flight direct I/O.
    Exclusive,
}

/// The `dio_unaligned` switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnalignedPolicy {
    /// Sub-block overwrites of written blocks run shared (Linux 6.5+ ext4, XFS).
    #[default]
    Shared,
    /// Every sub-block direct write takes the exclusive lock, drains and waits (ext4
    /// before 6.5).
    Exclusive,
}

/// Decides the lock for a direct write of `[pos, pos + len)` in a file of in-core size
/// `size` with `block`-byte blocks (I-000-2, I-000-6).
///
/// # Errors
/// The file system's mapping errors.
pub fn write_lock_for<O: FileIo + ?Sized>(
    ops: &O,
    pos: u64,
    len: u64,
    size: u64,
    block: u64,
    policy: UnalignedPolicy,
) -> Result<DioLock, O::Error> {
    let end = pos + len;
    if end > size {
        return Ok(DioLock::Exclusive);
    }
    let unaligned = !pos.is_multiple_of(block) || !end.is_multiple_of(block);
    if unaligned && policy == UnalignedPolicy::Exclusive {
        return Ok(DioLock::Exclusive);
    }
    let mut lock = DioLock::Shared;
    iterate(ops, pos, len, IomapOp::Report, |map, p, n| {
        let whole_blocks = p.is_multiple_of(block) && (p + n).is_multiple_of(block);
        let ok = match map.kind {
            IomapKind::Mapped => true,
            IomapKind::Unwritten => whole_blocks,
            IomapKind::Hole | IomapKind::Delalloc | IomapKind::Shared => false,
        };
        if ok {
            return Ok(Step::Advance(n));
        }
        lock = DioLock::Exclusive;
        Ok(Step::Done(0))
    })
    .map_err(|e| e.into_parts(|m| ops.contract_error(m)).1)?;
    Ok(lock)
}

/// A piece of a direct write, for completion processing.
#[derive(Debug, Clone, Copy)]
pub struct DioEnd<A> {
    pub map: Iomap<A>,
    /// Device-write start and length (whole blocks for new/unwritten mappings).
    pub pos: u64,
    pub len: u64,
    /// The blocks must be recorded written at completion (new or unwritten).
    pub convert: bool,
}

/// Builds and submits the write of `data` (file position `p`) inside mapping `map`.
pub fn submit_write_piece<O: FileIo + ?Sized>(
    ops: &O,
    batch: &Batch,
    map: &Iomap<O::Addr>,
    p: u64,
    data: &[u8],
    block: u64,
) -> DioEnd<O::Addr> {
    let written = map.kind == IomapKind::Mapped && !map.flags.contains(IomapFlags::NEW);
    let (start, end) = if written {
        (p, p + data.len() as u64)
    } else {
        (
            p / block * block,
            (p + data.len() as u64).div_ceil(block) * block,
        )
    };
    let mut buf = ops.buffers().get((end - start) as usize);
    let head = (p - start) as usize;
    let tail = head + data.len();
    buf[..head].fill(0);
    buf[head..tail].copy_from_slice(data);
    buf[tail..].fill(0);
    ops.submit(batch, map, start, true, buf);
    DioEnd {
        map: *map,
        pos: start,
        len: end - start,
        convert: !written,
    }
}

/// Builds and submits the read of `[p, p + n)` inside `map` (mapped kinds only), or
/// returns `None` for kinds that read as zeros.
pub fn submit_read_piece<O: FileIo + ?Sized>(
    ops: &O,
    batch: &Batch,
    map: &Iomap<O::Addr>,
    p: u64,
    n: u64,
) -> Option<usize> {
    (map.kind == IomapKind::Mapped)
        .then(|| ops.submit(batch, map, p, false, ops.buffers().get(n as usize)))
}

/// A zero-filled buffer of `n` bytes from the pool.
pub fn zeroed<O: FileIo + ?Sized>(ops: &O, n: usize) -> IoBuf {
    ops.buffers().get_zeroed(n)
}

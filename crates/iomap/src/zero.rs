//! Zeroing through the cache: zero range, EOF zeroing, and invalidation.
//!
//! I-004-1: after `zero_range` every byte of the range reads zero through the cache and
//! will read zero from disk after writeback, whatever the extent state. The rule per piece:
//! - cached folio: zero the bytes in cache (preparing partial blocks first); mark a block
//!   dirty if the mapping holds data on disk (mapped, delalloc), the block was dirty, or the
//!   folio is under writeback (I-004-5: dirtying clean unwritten blocks would be harmless,
//!   missing dirty ones is not; we dirty per block, so no zeros are written needlessly);
//! - nothing cached over a hole or unwritten extent: skip, it reads zero (I-004-2); whole
//!   runs of such blocks are skipped at once (`CacheIo::next_stored`), so the cost follows
//!   the cached and stored data, never the size of the range;
//! - nothing cached over mapped blocks: create the folio, zero, dirty.
//!
//! I-004-2: the skip decision is made with the folio locked *after* the mapping lookup and
//! re-validated with the mapping's sequence cookie, so a writeback completion that converted
//! the extent in between is caught and the piece re-mapped (`Step::Stale`). No flush happens in
//! [`ZeroMode::Cache`] (I-004-3); [`ZeroMode::Flush`] restores the Linux 6.12 behaviour of
//! writing back and waiting whenever zeroing meets dirty cache over a hole or unwritten
//! extent, kept as a switch so the benchmark can show the cost.

use crate::buffered::{iter_err, prepare_block};
use crate::cache::{FileCache, PageCache};
use crate::writeback::{writeback, WbWait};
use crate::{iterate, CacheIo, Iomap, IomapKind, IomapOp, Step};

/// How zeroing treats dirty cache over holes and unwritten extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroMode {
    /// Zero in cache, never flush (iomap since 6.13/6.19).
    #[default]
    Cache,
    /// Write back and wait first (iomap in 6.12: the metamix regression).
    Flush,
}

/// Zeroes `[pos, pos + len)` through the cache (see the module documentation).
///
/// # Errors
/// Mapping or device errors (reading a partial block, or the flush in `Flush` mode).
pub fn zero_range<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    pos: u64,
    len: u64,
    mode: ZeroMode,
) -> Result<(), O::Error> {
    if len == 0 {
        return Ok(());
    }
    let end = pos + len;
    if mode == ZeroMode::Flush && range_busy(fc, pos, end) && has_hole_or_unwritten(ops, pos, len)?
    {
        writeback(cache, ops, fc, pos, end, WbWait::Busy)?;
    }
    let size = ops.size();
    let mut cur = pos;
    while cur < end {
        let skip = skip_zero_uncached(ops, fc, cur, end)?;
        if skip > cur {
            cur = skip;
            continue;
        }
        // One piece, then back here: the run after it may be skippable as a whole.
        cur += iterate(ops, cur, end - cur, IomapOp::Report, |map, cur, n| {
            zero_piece(cache, ops, fc, map, cur, n, size)
        })
        .map_err(|e| iter_err(ops, e).1)?;
    }
    Ok(())
}

/// Zeroes the first piece of `[cur, cur + len)` inside `map` (see the module
/// documentation), or finds the mapping stale.
fn zero_piece<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    map: &Iomap<O::Addr>,
    cur: u64,
    len: u64,
    size: u64,
) -> Result<Step, O::Error> {
    let end = cur + len;
    let on_disk = matches!(
        map.kind,
        IomapKind::Mapped | IomapKind::Delalloc | IomapKind::Shared
    );
    let cell = match fc.get(cur) {
        Some(c) => Some(c),
        None if on_disk => Some(cache.folio(fc, cur, end - cur)),
        None => None,
    };
    let Some(cell) = cell else {
        // Nothing cached here: skip up to the next cached folio at most.
        let piece_end = end.min(fc.next_folio_after(cur).unwrap_or(u64::MAX));
        return Ok(Step::Done(piece_end - cur));
    };
    let n = end.min(cell.end()) - cur;
    // Folio tracking dirties whole folios, which must then be wholly uptodate.
    let _held = if cache.config().dirty_tracking == crate::folio::DirtyTracking::Folio {
        Some(crate::buffered::fill(cache, ops, fc, cur, 1)?)
    } else {
        None
    };
    let mut g = cell.lock_settled();
    if !ops.still_valid(map) {
        return Ok(Step::Stale); // Extents changed under us: look again.
    }
    let bs = u64::from(cache.block_size());
    let off = cur - g.pos;
    let (b0, b1) = ((off / bs) as u32, (off + n).div_ceil(bs) as u32);
    if !off.is_multiple_of(bs) {
        prepare_block(ops, cache, &mut g, b0, map, size)?;
    }
    if !(off + n).is_multiple_of(bs) {
        prepare_block(ops, cache, &mut g, b1 - 1, map, size)?;
    }
    g.data[off as usize..(off + n) as usize].fill(0);
    g.state.set_uptodate(b0, b1);
    // Per block: zeros must reach the disk where the disk holds data (mapped,
    // delalloc), where the block was dirty, or where writeback is in flight on the
    // folio; a clean block over a hole or unwritten extent already reads zero there.
    for b in b0..b1 {
        if on_disk || g.writeback || g.state.is_dirty(b) {
            cache.set_dirty(&mut g, b, b + 1);
        }
    }
    cache.touch(&g);
    Ok(Step::Done(n))
}

/// The end of the run from `cur` that needs no zeroing at all: nothing cached and, per
/// the file system, only holes and unwritten blocks (`CacheIo::next_stored`). Returns
/// `cur` when the folio at `cur` is cached or its block holds data. This is what keeps
/// zeroing (extending truncate, EOF zeroing, zero range) proportional to the cached and
/// stored data in the range rather than to its size (issue 9, item 2). The decision is as
/// safe as the per-piece skip below: the caller holds the inode exclusively, so no write
/// can cache or store data in the run meanwhile.
fn skip_zero_uncached<O: CacheIo>(
    ops: &O,
    fc: &FileCache,
    cur: u64,
    end: u64,
) -> Result<u64, O::Error> {
    if fc.get(cur).is_some() {
        return Ok(cur);
    }
    let cached = fc.next_folio_after(cur).map_or(end, |p| p.min(end));
    Ok(ops.next_stored(cur, cached)?.clamp(cur, cached))
}

/// True if a cached folio over `[pos, end)` is dirty or under writeback (folio
/// granularity, as Linux's `filemap_range_needs_writeback`).
fn range_busy(fc: &FileCache, pos: u64, end: u64) -> bool {
    fc.overlapping(pos, end).iter().any(|c| {
        let g = c.lock();
        g.writeback || g.state.folio_dirty()
    })
}

fn has_hole_or_unwritten<O: CacheIo>(ops: &O, pos: u64, len: u64) -> Result<bool, O::Error> {
    let mut found = false;
    iterate(ops, pos, len, IomapOp::Report, |map, _, n| {
        found = matches!(map.kind, IomapKind::Hole | IomapKind::Unwritten);
        Ok(if found {
            Step::Done(0)
        } else {
            Step::Advance(n)
        })
    })
    .map_err(|e| iter_err(ops, e).1)?;
    Ok(found)
}

/// Truncate's zeroing of the new EOF block's tail `[pos, end)` (inside one block): once
/// no writeback is in flight on the folio holding it, zeroes the cached bytes without
/// changing block state (they must read zero if the file grows again), then runs
/// `on_disk` (the file system zeroing the tail on disk) with the folio still locked, and
/// returns its result.
///
/// Writeback runs without the inode lock, so a write of the block taken at the old size
/// may be on the device: it carries the old bytes past the new EOF, and a write into a
/// block placed by writeback is recorded only at its completion. Zeroing the disk before
/// it lands would be undone by it (or would read, modify and write back what the disk held
/// before it). Holding the folio keeps writeback from taking the block again until the
/// disk's copy is zeroed too. Without a cached folio no write of the block is in flight
/// (folios under writeback stay cached) and the caller, holding the inode exclusively,
/// keeps one from being created.
pub fn zero_tail_settled<R>(fc: &FileCache, pos: u64, end: u64, on_disk: impl FnOnce() -> R) -> R {
    let cell = match fc.overlapping(pos, end).into_iter().next() {
        Some(cell) if pos < end => cell,
        _ => return on_disk(),
    };
    let mut g = cell.lock_idle();
    debug_assert!(end <= g.end(), "a block's tail lies in one folio");
    let start = g.pos;
    let a = pos.max(start) - start;
    let b = end.min(g.end()) - start;
    g.data[a as usize..b as usize].fill(0);
    on_disk()
}

/// Discards the cache over `[pos, end)`: whole blocks inside the range lose their data and
/// dirty state (after any writeback in flight on their folio has finished), partial blocks
/// are zeroed in place. Returns the dirty blocks discarded.
pub fn invalidate_range(cache: &PageCache, fc: &FileCache, pos: u64, end: u64) -> u32 {
    if pos >= end {
        return 0;
    }
    let bs = u64::from(cache.block_size());
    let mut discarded = 0;
    for cell in fc.overlapping(pos, end) {
        let start = {
            let mut g = cell.lock_idle();
            let start = g.pos;
            let a = pos.max(start) - start;
            let b = end.min(g.end()) - start;
            g.data[a as usize..b as usize].fill(0);
            let (b0, b1) = (a.div_ceil(bs) as u32, (b / bs) as u32);
            if b0 < b1 {
                discarded += cache.invalidate_blocks(&mut g, b0, b1);
            }
            start
        };
        drop(cell);
        cache.drop_if_empty(fc, start);
    }
    discarded
}

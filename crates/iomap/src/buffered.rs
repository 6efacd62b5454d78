//! Buffered read and write through the page cache.
//!
//! Read: make the range's blocks uptodate (holes, unwritten and delalloc blocks are zeroed,
//! mapped blocks read from the device with one wait), read ahead on sequential access, copy
//! out. Write: EOF zeroing first if the write starts beyond EOF (I-004-7, caller holds the
//! inode exclusively), then per mapping piece and folio: prepare only the partially covered
//! blocks that are not uptodate (read if mapped and inside EOF, zero otherwise), copy, and
//! mark dirty exactly the blocks copied into (I-002-3). Space for holes is reserved by the
//! file system in `begin` (delayed allocation), so ENOSPC surfaces here, not in writeback.

use std::sync::Arc;

use stripefs_target::{Batch, IoBuf};

use crate::cache::{
    DirtyThrottle, FileCache, Flusher, Folio, FolioCell, PageCache, ReadaheadMode,
    THROTTLE_WAIT_BOUND,
};
use crate::folio::DirtyTracking;
use crate::readahead::{self, ReadSpan};
use crate::zero::{zero_range, ZeroMode};
use crate::{iterate, CacheIo, FileIo, IoDir, Iomap, IomapOp, IterError};

/// Most bytes one read or fill pass keeps locked in the cache.
const FILL_WINDOW_BYTES: u64 = 8 << 20;

pub(crate) fn iter_err<E>(ops: &impl FileIo<Error = E>, e: IterError<E>) -> (u64, E) {
    e.into_parts(|m| ops.contract_error(m))
}

/// Reads one block of mapping `map` at file position `block_pos` from the device.
pub(crate) fn read_block<O: FileIo>(
    ops: &O,
    map: &Iomap<O::Addr>,
    block_pos: u64,
    bs: usize,
) -> Result<IoBuf, O::Error> {
    let batch = Batch::new();
    ops.submit(
        &batch,
        map,
        block_pos,
        IoDir::Read,
        vec![ops.buffers().get(bs)],
    );
    let mut done = batch.wait();
    let d = done.pop().expect("one completion");
    d.result.map_err(|e| ops.io_error(e))?;
    Ok(d.bufs.into_iter().next().expect("read returns its buffer"))
}

/// Makes block `b` of folio `f` uptodate before a partial overwrite: read it if the mapping
/// holds written data inside EOF, zero it otherwise (holes, unwritten, delalloc, new, and
/// post-EOF blocks never need reading).
pub(crate) fn prepare_block<O: FileIo>(
    ops: &O,
    cache: &PageCache,
    f: &mut Folio,
    b: u32,
    map: &Iomap<O::Addr>,
    size: u64,
) -> Result<(), O::Error> {
    if f.state.is_uptodate(b) {
        return Ok(());
    }
    let bs = cache.block_size() as usize;
    let at = b as usize * bs;
    let block_pos = f.pos + at as u64;
    if map.is_written() && block_pos < size && map.covers(block_pos) {
        let buf = read_block(ops, map, block_pos, bs)?;
        f.data[at..at + bs].copy_from_slice(&buf);
        ops.buffers().put_all([buf]);
    } else {
        f.data[at..at + bs].fill(0);
    }
    f.state.set_uptodate(b, b + 1);
    Ok(())
}

/// Makes `[pos, pos + len)` (clipped to the folios it touches) uptodate in the cache and
/// returns the folios, which stay referenced (and so unevictable) while the caller holds
/// them.
///
/// # Errors
/// Mapping or device errors; blocks whose read failed stay not uptodate.
pub fn fill<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    pos: u64,
    len: u64,
) -> Result<Vec<Arc<FolioCell>>, O::Error> {
    let bs = u64::from(cache.block_size());
    // Contiguous folios covering the range: each new one starts where the last ended.
    let end = pos + len.max(1);
    let mut cells: Vec<Arc<FolioCell>> = Vec::new();
    let mut cur = pos;
    while cur < end {
        let cell = cache.folio(fc, cur, end - cur);
        cur = cell.end();
        cells.push(cell);
    }
    // Ascending; a folio with a readahead read in flight is waited for (its read may be
    // the very data wanted), and if that read failed its blocks are read again here.
    let mut guards: Vec<_> = cells.iter().map(|c| c.lock_settled()).collect();
    for g in &mut guards {
        cache.touch(g);
    }
    // Runs of blocks that are not uptodate, as file byte ranges (blocks wholly past EOF
    // are zeroed on the way: reads see nothing there).
    let runs = readahead::runs_to_read(cache, ops.size(), &mut guards);
    let batch = Batch::new();
    let shared = cache.reads();
    let mut pending: Vec<(usize, ReadSpan)> = Vec::new();
    for (a, e) in runs {
        iterate(ops, a, e - a, IomapOp::Read, |map, p, n| {
            if map.is_written() {
                let (bufs, layout) = readahead::read_bufs(shared, ops.buffers(), &mut guards, p, n);
                let slot = ops.submit(&batch, map, p, IoDir::Read, bufs);
                let span = ReadSpan {
                    pos: p,
                    len: n,
                    layout,
                };
                pending.push((slot, span));
            } else {
                for_each_span(&mut guards, p, n, |g, off, len| {
                    g.data[off..off + len].fill(0);
                    mark_uptodate(g, off, len, bs);
                });
            }
            Ok(n)
        })
        .map_err(|e| iter_err(ops, e).1)?;
    }
    let mut done = batch.wait();
    let mut failed = None;
    let mut spare: Vec<IoBuf> = Vec::new();
    for (slot, span) in pending {
        let d = &mut done[slot];
        let bufs = std::mem::take(&mut d.bufs);
        match &d.result {
            Ok(()) => spare.extend(readahead::take_read(shared, &mut guards, span, bufs, bs)),
            Err(e) => {
                failed = Some(ops.io_error(e.clone()));
                spare.extend(bufs);
            }
        }
    }
    ops.buffers().put_all(spare);
    drop(guards);
    match failed {
        Some(e) => Err(e),
        None => Ok(cells),
    }
}

pub(crate) fn mark_uptodate(g: &mut Folio, off: usize, len: usize, bs: u64) {
    let b0 = (off as u64 / bs) as u32;
    let b1 = ((off + len) as u64).div_ceil(bs) as u32;
    g.state.set_uptodate(b0, b1);
}

/// Calls `f(folio, offset in folio, len)` for each folio piece of `[p, p + n)`; `guards`
/// are contiguous folios, ascending, covering the range.
pub(crate) fn for_each_span(
    guards: &mut [parking_lot::MutexGuard<'_, Folio>],
    p: u64,
    n: u64,
    mut f: impl FnMut(&mut Folio, usize, usize),
) {
    let mut i = guards.partition_point(|g| g.end() <= p);
    let mut cur = p;
    while cur < p + n {
        let g = &mut guards[i];
        debug_assert!(g.pos <= cur && cur < g.end(), "folios cover the range");
        let off = cur - g.pos;
        let len = (g.len() - off).min(p + n - cur);
        f(g, off as usize, len as usize);
        cur += len;
        i += 1;
    }
}

/// Reads up to `buf.len()` bytes at `pos` through the cache; returns the bytes read.
///
/// # Errors
/// Mapping or device errors.
pub fn read<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    pos: u64,
    buf: &mut [u8],
) -> Result<usize, O::Error> {
    let size = ops.size();
    if pos >= size || buf.is_empty() {
        return Ok(0);
    }
    let n = (buf.len() as u64).min(size - pos);
    let fb = u64::from(cache.config().folio_bytes);
    let sequential = fc
        .next_read
        .swap(pos + n, std::sync::atomic::Ordering::Relaxed)
        == pos;
    // The folios of one fill pass stay pinned: bound the pass by the memory budget.
    let window = FILL_WINDOW_BYTES
        .min(cache.config().budget_bytes / 4)
        .max(fb);
    let readahead = cache
        .config()
        .readahead_bytes
        .min(cache.config().budget_bytes / 8);
    // Readahead the read itself waits for (`Sync`), or none: the window goes in flight.
    let sync_ahead = match cache.config().readahead {
        ReadaheadMode::Sync => readahead,
        ReadaheadMode::Async => {
            // At least as large as the reads, so one window is always ahead of the copy.
            let want = match (sequential, readahead) {
                (false, _) => None,
                (true, 0) => Some(0),
                (true, r) => Some(r.max(n.min(window)).min(cache.config().budget_bytes / 8)),
            };
            start_readahead(cache, ops, fc, pos + n, size, want);
            0
        }
    };
    let mut done = 0u64;
    while done < n {
        let at = pos + done;
        let chunk = (n - done).min(window - at % fb);
        let ahead = if sequential && done + chunk == n {
            sync_ahead.min(size - at - chunk)
        } else {
            0
        };
        let cells = fill(cache, ops, fc, at, chunk + ahead)?;
        let mut cur = at;
        for cell in &cells {
            if cur >= at + chunk || cur < cell.pos() || cur >= cell.end() {
                continue;
            }
            let g = cell.lock();
            let start = g.pos;
            let len = (g.end() - cur).min(at + chunk - cur);
            let off = (cur - start) as usize;
            let dst = (cur - pos) as usize;
            buf[dst..dst + len as usize].copy_from_slice(&g.data[off..off + len as usize]);
            cur += len;
        }
        done += chunk;
    }
    Ok(n as usize)
}

/// Asynchronous readahead for a read ending at `end`: a sequential reader (`want`: the
/// window size) that reached the marker gets its next window submitted before it waits
/// for its own data; any other read (`None`) forgets the window.
fn start_readahead<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    end: u64,
    size: u64,
    want: Option<u64>,
) {
    let Some(want) = want else {
        readahead::reset(fc);
        return;
    };
    if let Some((a, b)) = readahead::next_window(fc, end, size, want) {
        readahead::submit(cache, ops, fc, a, b);
    }
}

/// Writes `data` at `pos` into the cache; returns the bytes written (short only if an
/// error struck after some bytes were copied). The caller updates the in-core size.
///
/// # Errors
/// `ENOSPC`-style errors from the reservation in `begin`, device errors from preparing a
/// partial block, when nothing was written.
pub fn write<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    pos: u64,
    data: &[u8],
    eof_zeroing: ZeroMode,
) -> Result<usize, O::Error> {
    let size = ops.size();
    if pos > size {
        zero_range(cache, ops, fc, size, pos - size, eof_zeroing)?;
    }
    let len = data.len() as u64;
    // Pre-6.6 behaviour: the folio is the unit, so it must be wholly uptodate; the filled
    // folios stay held (unevictable) until the copy is done.
    let _held = if cache.config().dirty_tracking == DirtyTracking::Folio {
        fill(cache, ops, fc, pos, len)?
    } else {
        Vec::new()
    };
    let walked = iterate(ops, pos, len, IomapOp::BufferedWrite, |map, p, n| {
        copy_in(
            cache,
            ops,
            fc,
            map,
            p,
            &data[(p - pos) as usize..(p - pos + n) as usize],
            size,
        )?;
        Ok(n)
    });
    match walked {
        Ok(n) => Ok(n as usize),
        Err(e) => match iter_err(ops, e) {
            (0, err) => Err(err),
            (done, _) => Ok(done as usize),
        },
    }
}

/// Copies `src` (file position `p`, inside mapping `map`) into the cache folio by folio.
fn copy_in<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    map: &Iomap<O::Addr>,
    p: u64,
    src: &[u8],
    size: u64,
) -> Result<(), O::Error> {
    let bs = u64::from(cache.block_size());
    let mut cur = p;
    let end = p + src.len() as u64;
    while cur < end {
        let cell = cache.folio(fc, cur, end - cur);
        let mut g = cell.lock_settled();
        if g.data.is_lent() {
            // A write in flight holds these bytes: the change below copies them first.
            cache.count_lent_rewrite();
        }
        let off = cur - g.pos;
        let len = (g.len() - off).min(end - cur);
        let b0 = (off / bs) as u32;
        let b1 = (off + len).div_ceil(bs) as u32;
        if !off.is_multiple_of(bs) {
            prepare_block(ops, cache, &mut g, b0, map, size)?;
        }
        if !(off + len).is_multiple_of(bs) {
            prepare_block(ops, cache, &mut g, b1 - 1, map, size)?;
        }
        let s = (cur - p) as usize;
        g.data[off as usize..(off + len) as usize].copy_from_slice(&src[s..s + len as usize]);
        g.state.set_uptodate(b0, b1);
        cache.set_dirty(&mut g, b0, b1);
        cache.touch(&g);
        cur += len;
        // Still under the folio lock: writeback must never see these bytes dirty past
        // the size it reads (see `FileIo::extend_size`).
        if cur > size {
            ops.extend_size(cur);
        }
    }
    Ok(())
}

/// Throttles a writer while dirty bytes exceed the limit, as the cache's
/// [`DirtyThrottle`] says: under `Wait`, with a flusher `Running` (which the caller has
/// kicked), it sleeps while background writeback brings the total down and writes `fc`
/// back itself only after [`THROTTLE_WAIT_BOUND`]; under `Write`, or with no flusher, it
/// writes `fc` back at once, then waits (bounded) for the total to fall.
///
/// # Errors
/// Writeback errors of `fc` (also recorded for fsync).
pub fn balance_dirty<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    flusher: Flusher,
) -> Result<(), O::Error> {
    if !cache.over_dirty_limit() {
        return Ok(());
    }
    let waits = cache.config().dirty_throttle == DirtyThrottle::Wait && flusher == Flusher::Running;
    if waits && cache.wait_under_dirty_limit(THROTTLE_WAIT_BOUND) {
        return Ok(());
    }
    crate::writeback(cache, ops, fc, 0, u64::MAX, crate::WbWait::SkipBusy)?;
    cache.wait_under_dirty_limit(THROTTLE_WAIT_BOUND);
    Ok(())
}

//! Writeback: find the dirty block runs, map them (the file system allocates delayed
//! allocations here), submit every run, wait once, then let the file system record what
//! became durable-ready.
//!
//! I-002-5: exactly the dirty blocks are written, clamped to EOF; the bytes of the EOF
//! block past EOF are written as zeros, so the on-disk invariant "bytes past EOF in the EOF
//! block are zero" survives anything the cache held there. Dirty bits are cleared and the
//! folio marked under writeback while its lock is held; a redirtying write during the I/O
//! just sets them again. On failure the data is dropped (as Linux does) and the error is
//! recorded in the file's error sequence for fsync.

use std::sync::Arc;

use stripefs_target::Batch;

use crate::buffered::{iter_err, FileIo};
use crate::cache::{FileCache, FolioCell, PageCache};
use crate::{iterate, Iomap, IomapOp};

/// Most bytes collected before they are submitted and waited for.
const BATCH_BYTES: u64 = 32 << 20;

/// A written piece, handed to the file system at completion.
#[derive(Debug, Clone, Copy)]
pub struct WbEnd<A> {
    pub map: Iomap<A>,
    pub pos: u64,
    pub len: u64,
}

/// What a writeback pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WbStats {
    pub bytes: u64,
    pub ios: u64,
}

/// Whether to wait for folios another thread is writing back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WbWait {
    /// Wait for them, then write what is dirty (fsync: everything dirty before the call
    /// is on the device when it returns).
    Busy,
    /// Skip them (background writeback, throttling).
    SkipBusy,
}

/// Writes back the dirty blocks of `fc` in `[from, to)`.
///
/// # Errors
/// The first mapping, device or completion error (also recorded in the error sequence).
pub fn writeback<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    from: u64,
    to: u64,
    wait: WbWait,
) -> Result<WbStats, O::Error> {
    let fb = u64::from(cache.config().folio_bytes);
    let last = if to == u64::MAX {
        u64::MAX
    } else {
        to.div_ceil(fb).saturating_sub(1)
    };
    let folios = fc.range(from / fb, last);
    let mut stats = WbStats::default();
    let mut first_err = None;
    for chunk in chunks(cache, &folios) {
        if let Err(e) = write_chunk(cache, ops, fc, chunk, wait, &mut stats) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(stats), Err)
}

/// Splits folios into groups of at most `BATCH_BYTES`.
fn chunks<'a>(
    cache: &PageCache,
    folios: &'a [Arc<FolioCell>],
) -> impl Iterator<Item = &'a [Arc<FolioCell>]> {
    let per = (BATCH_BYTES / u64::from(cache.config().folio_bytes)).max(1) as usize;
    folios.chunks(per)
}

fn write_chunk<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
    stats: &mut WbStats,
) -> Result<(), O::Error> {
    let (runs, busy) = collect(cache, ops, folios, wait);
    if runs.is_empty() {
        return Ok(());
    }
    let batch = Batch::new();
    let mut ends: Vec<WbEnd<O::Addr>> = Vec::new();
    let mut map_err = None;
    for (pos, data) in &runs {
        let walked = iterate(
            ops,
            *pos,
            data.len() as u64,
            IomapOp::Writeback,
            |map, p, n| {
                let mut buf = ops.buffers().get(n as usize);
                let s = (p - pos) as usize;
                buf.copy_from_slice(&data[s..s + n as usize]);
                ops.submit(&batch, map, p, true, buf);
                ends.push(WbEnd {
                    map: *map,
                    pos: p,
                    len: n,
                });
                Ok(n)
            },
        );
        if let Err(e) = walked {
            map_err.get_or_insert(iter_err(ops, e).1);
        }
    }
    let done = batch.wait();
    let io_err = done.iter().find_map(|d| d.result.clone().err());
    ops.buffers().put_all(done.into_iter().flat_map(|d| d.bufs));
    let ok = io_err.is_none() && map_err.is_none();
    stats.ios += ends.len() as u64;
    stats.bytes += ends.iter().map(|e| e.len).sum::<u64>();
    let completed = ops.writeback_done(&ends, ok);
    for cell in busy {
        cell.end_writeback();
    }
    let err = map_err
        .or_else(|| io_err.map(|e| ops.io_error(e)))
        .or(completed.err());
    if let Some(e) = err {
        fc.record_error(ops.errno(&e));
        return Err(e);
    }
    Ok(())
}

/// Dirty runs taken for writeback (file position, bytes) and the folios now under
/// writeback.
type Collected = (Vec<(u64, Vec<u8>)>, Vec<Arc<FolioCell>>);

/// Takes the dirty runs (clamped to EOF) out of `folios`: copies them, clears their dirty
/// bits and marks the folios under writeback. Returns contiguous runs and the busy folios.
fn collect<O: FileIo>(
    cache: &PageCache,
    ops: &O,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
) -> Collected {
    let fb = u64::from(cache.config().folio_bytes);
    let bs = u64::from(cache.block_size());
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut busy = Vec::new();
    for cell in folios {
        let mut g = match wait {
            WbWait::Busy => cell.lock_idle(),
            WbWait::SkipBusy => {
                let g = cell.lock();
                if g.writeback {
                    continue;
                }
                g
            }
        };
        let size = ops.size();
        let mut took = false;
        for r in g.state.dirty_runs() {
            let a = g.index * fb + u64::from(r.first) * bs;
            if a >= size {
                continue; // Wholly past EOF: not written, stays dirty until EOF moves.
            }
            let b = (a + u64::from(r.count) * bs).min(size.div_ceil(bs) * bs);
            let (oa, ob) = ((a - g.index * fb) as usize, (b - g.index * fb) as usize);
            let mut bytes = g.data[oa..ob].to_vec();
            if b > size {
                let keep = (size - a) as usize;
                bytes[keep..].fill(0);
            }
            let cleared = g
                .state
                .clear_dirty((oa as u64 / bs) as u32, (ob as u64 / bs) as u32);
            cache.sub_dirty_blocks(cleared);
            took = true;
            match runs.last_mut() {
                Some((p, d)) if *p + d.len() as u64 == a => d.extend_from_slice(&bytes),
                _ => runs.push((a, bytes)),
            }
        }
        if took {
            g.writeback = true;
            busy.push(Arc::clone(cell));
        }
    }
    (runs, busy)
}

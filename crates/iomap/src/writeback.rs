//! Writeback: find the dirty block runs, map them (the file system allocates delayed
//! allocations here), submit every run of a batch, then let the file system record what
//! became durable-ready once the batch completes. Batches are pipelined: the next one is
//! collected and submitted while earlier ones are in flight (`CacheConfig::writeback_depth`).
//!
//! I-002-5: exactly the dirty blocks are written, clamped to EOF; the bytes of the EOF
//! block past EOF are written as zeros, so the on-disk invariant "bytes past EOF in the EOF
//! block are zero" survives anything the cache held there. Dirty bits are cleared and the
//! folio marked under writeback while its lock is held; a redirtying write during the I/O
//! just sets them again. On failure the data is dropped (as Linux does) and the error is
//! recorded in the file's error sequence for fsync.

use std::collections::VecDeque;
use std::sync::Arc;

use stripefs_target::{Batch, IoBuf};

use crate::buffered::iter_err;
use crate::cache::{FileCache, FolioCell, PageCache};
use crate::{iterate, CacheIo, IoDir, Iomap, IomapOp};

/// Most bytes of one writeback batch (collected, mapped and submitted together).
pub const BATCH_BYTES: u64 = 32 << 20;

/// How a writeback pass ended, for the file system's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WbOutcome {
    /// Every piece was mapped and written: record it.
    Written,
    /// A mapping or a device I/O failed: record nothing, free what was allocated.
    Failed,
}

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
/// Pipelined: up to `writeback_depth` batches are in flight; batch k+1 is collected,
/// mapped and submitted while batch k is on the device, and batches complete in
/// submission order (so the file system records them in file order). Waiting for a
/// folio another thread writes back while holding batches in flight cannot deadlock:
/// every writeback walks folios in ascending order and only holds folios below the one
/// it waits for, so a cycle of waits would need a position below itself.
///
/// # Errors
/// The first mapping, device or completion error (also recorded in the error sequence).
pub fn writeback<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    from: u64,
    to: u64,
    wait: WbWait,
) -> Result<WbStats, O::Error> {
    let folios = fc.overlapping(from, to);
    let depth = cache.config().writeback_depth.0.max(1) as usize;
    let mut stats = WbStats::default();
    let mut first_err = None;
    let mut flight: VecDeque<InFlight<O>> = VecDeque::new();
    for chunk in chunks(&folios) {
        if let Some(b) = submit_chunk(cache, ops, chunk, wait) {
            flight.push_back(b);
        }
        while flight.len() >= depth {
            let b = flight.pop_front().expect("a batch in flight");
            if let Err(e) = complete(cache, ops, fc, b, &mut stats) {
                first_err.get_or_insert(e);
            }
        }
    }
    while let Some(b) = flight.pop_front() {
        if let Err(e) = complete(cache, ops, fc, b, &mut stats) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(stats), Err)
}

/// Splits folios into groups of at most `BATCH_BYTES` (or one folio).
fn chunks(folios: &[Arc<FolioCell>]) -> impl Iterator<Item = &[Arc<FolioCell>]> {
    let mut rest = folios;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let n = rest
            .iter()
            .take_while(|c| {
                bytes += c.len();
                bytes <= BATCH_BYTES
            })
            .count()
            .max(1);
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

/// A submitted writeback batch, completed by [`complete`].
struct InFlight<O: CacheIo> {
    batch: Batch,
    ends: Vec<WbEnd<O::Addr>>,
    busy: Vec<Arc<FolioCell>>,
    map_err: Option<O::Error>,
}

/// Collects the dirty runs of `folios`, maps and submits them; `None` if nothing was
/// dirty.
fn submit_chunk<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
) -> Option<InFlight<O>> {
    let (runs, busy) = collect(cache, ops, folios, wait);
    if runs.is_empty() {
        debug_assert!(busy.is_empty(), "folios taken for writeback without a run");
        return None;
    }
    let batch = Batch::new();
    let mut ends: Vec<WbEnd<O::Addr>> = Vec::new();
    let mut map_err = None;
    for (pos, data) in runs {
        let len = data.len() as u64;
        let mut whole = Some(data);
        let walked = iterate(ops, pos, len, IomapOp::Writeback, |map, p, n| {
            let buf = match whole.take() {
                // The run is one mapping piece: submit its buffer as is.
                Some(b) if p == pos && n == len => b,
                Some(b) => {
                    let piece = copy_piece(ops, &b, p - pos, n);
                    whole = Some(b);
                    piece
                }
                None => unreachable!("the whole-run buffer is only given away for a single piece"),
            };
            ops.submit(&batch, map, p, IoDir::Write, buf);
            ends.push(WbEnd {
                map: *map,
                pos: p,
                len: n,
            });
            Ok(n)
        });
        if let Some(b) = whole {
            ops.buffers().put_all([b]);
        }
        if let Err(e) = walked {
            map_err.get_or_insert(iter_err(ops, e).1);
        }
    }
    ops.writeback_submitted();
    Some(InFlight {
        batch,
        ends,
        busy,
        map_err,
    })
}

/// Waits for batch `b`, lets the file system record it and ends writeback on its folios.
fn complete<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    b: InFlight<O>,
    stats: &mut WbStats,
) -> Result<(), O::Error> {
    let done = b.batch.wait();
    let io_err = done.iter().find_map(|d| d.result.clone().err());
    ops.buffers().put_all(done.into_iter().flat_map(|d| d.bufs));
    let outcome = if io_err.is_none() && b.map_err.is_none() {
        WbOutcome::Written
    } else {
        WbOutcome::Failed
    };
    stats.ios += b.ends.len() as u64;
    stats.bytes += b.ends.iter().map(|e| e.len).sum::<u64>();
    let completed = ops.writeback_done(&b.ends, outcome);
    for cell in b.busy {
        cache.end_writeback(&cell);
    }
    let err = b
        .map_err
        .or_else(|| io_err.map(|e| ops.io_error(e)))
        .or(completed.err());
    if let Some(e) = err {
        fc.record_error(ops.errno(&e));
        return Err(e);
    }
    Ok(())
}

fn copy_piece<O: CacheIo>(ops: &O, run: &IoBuf, from: u64, n: u64) -> IoBuf {
    let mut buf = ops.buffers().get(n as usize);
    buf.copy_from_slice(&run[from as usize..(from + n) as usize]);
    buf
}

/// Largest run staged in one buffer; runs never cross a multiple of it, so with stripe
/// units that are multiples of it a full run is exactly one mapping piece.
const RUN_BYTES: u64 = 1 << 20;

/// Dirty runs taken for writeback (file position, bytes) and the folios now under
/// writeback.
type Collected = (Vec<(u64, IoBuf)>, Vec<Arc<FolioCell>>);

/// A run being staged.
struct Staging {
    pos: u64,
    len: usize,
    buf: IoBuf,
}

fn finish<O: CacheIo>(ops: &O, runs: &mut Vec<(u64, IoBuf)>, s: Staging) {
    if s.len == s.buf.len() {
        runs.push((s.pos, s.buf));
        return;
    }
    let mut exact = ops.buffers().get(s.len);
    exact.copy_from_slice(&s.buf[..s.len]);
    ops.buffers().put_all([s.buf]);
    runs.push((s.pos, exact));
}

/// Takes the dirty runs (clamped to EOF) out of `folios`: copies them into staging
/// buffers (zeroing bytes past EOF), clears their dirty bits and marks the folios under
/// writeback. Returns the runs and the busy folios.
fn collect<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
) -> Collected {
    let bs = u64::from(cache.block_size());
    let mut runs: Vec<(u64, IoBuf)> = Vec::new();
    let mut busy = Vec::new();
    let mut cur: Option<Staging> = None;
    for cell in folios {
        let mut g = match wait {
            // Only dirty blocks are taken, never the ones a readahead reads into.
            WbWait::Busy => cell.lock_wb_idle(),
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
            let a = g.pos + u64::from(r.first) * bs;
            if a >= size {
                continue; // Wholly past EOF: not written, stays dirty until EOF moves.
            }
            let b = (a + u64::from(r.count) * bs).min(size.div_ceil(bs) * bs);
            let mut at = a;
            while at < b {
                let fresh = match &cur {
                    Some(s) => {
                        s.pos + s.len as u64 != at
                            || s.len as u64 == RUN_BYTES
                            || at % RUN_BYTES == 0
                    }
                    None => true,
                };
                if fresh {
                    if let Some(s) = cur.take() {
                        finish(ops, &mut runs, s);
                    }
                    cur = Some(Staging {
                        pos: at,
                        len: 0,
                        buf: ops.buffers().get(RUN_BYTES as usize),
                    });
                }
                let s = cur.as_mut().expect("staging run");
                let boundary = (at / RUN_BYTES + 1) * RUN_BYTES;
                let n = (b - at).min(boundary - at) as usize;
                let from = (at - g.pos) as usize;
                s.buf[s.len..s.len + n].copy_from_slice(&g.data[from..from + n]);
                if at + n as u64 > size {
                    // The EOF block's bytes past EOF go out as zeros.
                    let keep = size.saturating_sub(at) as usize;
                    s.buf[s.len + keep..s.len + n].fill(0);
                }
                s.len += n;
                at += n as u64;
            }
            let (oa, ob) = (a - g.pos, b - g.pos);
            cache.take_for_writeback(&mut g, (oa / bs) as u32, (ob / bs) as u32);
            took = true;
        }
        if took {
            busy.push(Arc::clone(cell));
        }
    }
    if let Some(s) = cur.take() {
        finish(ops, &mut runs, s);
    }
    (runs, busy)
}

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
//!
//! Lending (`WbCopy::Lend`, the default): the device writes from the folios' own memory,
//! read-only windows of each folio's `SharedBuf`, several per vectored write when a run
//! spans folios; a mapping piece boundary inside a run splits a window, never copies it.
//! Only the EOF block is copied (its bytes past EOF go out as zeros without touching the
//! folio). Stable pages: a writer that changes a folio while a window of it is on the
//! device gets a fresh copy of its bytes (the `SharedBuf`'s copy on write), so the device
//! keeps writing exactly what writeback took, and the new bytes, dirty again, go out with
//! the next writeback. `WbCopy::Stage` copies every run into pooled staging buffers (the
//! behaviour before lending).

use std::collections::VecDeque;
use std::sync::Arc;

use stripefs_target::{Batch, IoBuf, SharedBuf, TargetError};

use crate::buffered::iter_err;
use crate::cache::{FileCache, FolioCell, PageCache, WbCopy};
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

/// Writes back the dirty blocks of `fc` in `[from, to)`, up to where the cache ended when
/// the call began (a folio created below that during the pass is written too; one past it
/// is left to the next pass).
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
    let depth = cache.config().writeback_depth.0.max(1) as usize;
    let mut stats = WbStats::default();
    let mut first_err = None;
    let mut flight: VecDeque<InFlight<O>> = VecDeque::new();
    let mut pos = from;
    // The pass ends where the cache ended when it began: everything dirty then lies below,
    // and a writer appending as fast as the pass writes cannot keep it going forever.
    let to = to.min(fc.cached_end());
    // One batch's folios at a time: holding every folio of the range for the whole pass
    // kept the ones already written from being evicted until the pass ended.
    while pos < to {
        let chunk = fc.overlapping_within(pos, to, BATCH_BYTES);
        let Some(last) = chunk.last() else { break };
        pos = last.end();
        if let Some(b) = submit_chunk(cache, ops, &chunk, wait) {
            flight.push_back(b);
        }
        drop(chunk);
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

/// One small file's writeback, submitted by [`writeback_start`] and not yet settled.
pub struct WbStarted<O: CacheIo> {
    sub: Submitted<O>,
}

impl<O: CacheIo> std::fmt::Debug for WbStarted<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WbStarted")
            .field("pieces", &self.sub.ends.len())
            .field("folios", &self.sub.busy.len())
            .field("map_failed", &self.sub.map_err.is_some())
            .finish()
    }
}

impl<O: CacheIo> WbStarted<O> {
    /// Bytes submitted.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.sub.ends.iter().map(|e| e.len).sum()
    }
}

/// What [`writeback_start`] did with a file.
#[derive(Debug)]
pub enum WbStart<O: CacheIo> {
    /// Its dirty blocks were taken, mapped and submitted: settle with [`writeback_finish`]
    /// once the submitted I/O completed.
    Started(WbStarted<O>),
    /// Nothing to write (nothing dirty inside EOF, or every dirty folio busy under
    /// `SkipBusy`).
    Clean,
    /// More than the limit is cached: write it back with [`writeback`].
    TooLarge,
}

/// Starts the writeback of all of a small file without waiting, for a caller that writes
/// back many files at once (the file system's multi-file writeback): collects the dirty
/// blocks (clamped to EOF, I-002-5), maps them and submits them through `ops` into
/// `batch`, which the caller shares among the files and waits for once. The caller then
/// hands each file the result of its own I/O through [`writeback_finish`]. Files with
/// more than `limit` bytes cached are left alone (`TooLarge`), so one started file is
/// always one batch of at most [`BATCH_BYTES`].
///
/// The folios stay under writeback until [`writeback_finish`]: a caller holding several
/// started files walks them in one ascending order (as [`writeback`] walks folios), so
/// waiting for a folio another writeback holds cannot close a cycle.
pub fn writeback_start<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    wait: WbWait,
    limit: u64,
    batch: &Batch,
) -> WbStart<O> {
    let limit = limit.min(BATCH_BYTES);
    let Some(folios) = fc.folios_within(limit) else {
        return WbStart::TooLarge;
    };
    match submit_into(cache, ops, &folios, wait, batch) {
        Some(sub) => WbStart::Started(WbStarted { sub }),
        None => WbStart::Clean,
    }
}

/// Settles a file started by [`writeback_start`] once its I/O completed: `io` is the
/// first device error among that file's own writes (the caller attributes them), which
/// fails this file only. The file system records the pieces or frees what was placed, the
/// folios leave writeback, and an error enters the file's error sequence.
///
/// # Errors
/// The file's mapping, device or completion error.
pub fn writeback_finish<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    started: WbStarted<O>,
    io: Option<TargetError>,
) -> Result<WbStats, O::Error> {
    let mut stats = WbStats::default();
    settle(cache, ops, fc, started.sub, io, &mut stats)?;
    Ok(stats)
}

/// A submitted writeback batch, completed by [`complete`].
struct InFlight<O: CacheIo> {
    batch: Batch,
    sub: Submitted<O>,
}

/// What completing a submitted set of runs needs: the pieces written, the folios under
/// writeback, and the first mapping error.
struct Submitted<O: CacheIo> {
    ends: Vec<WbEnd<O::Addr>>,
    busy: Vec<Arc<FolioCell>>,
    map_err: Option<O::Error>,
    /// The runs taken (file position, length), mapped or not: on failure their blocks
    /// are forgotten.
    taken: Vec<(u64, u64)>,
}

/// Collects the dirty runs of `folios`, maps and submits them; `None` if nothing was
/// dirty.
fn submit_chunk<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
) -> Option<InFlight<O>> {
    let batch = Batch::new();
    let sub = submit_into(cache, ops, folios, wait, &batch)?;
    Some(InFlight { batch, sub })
}

/// Collects the dirty runs of `folios`, maps them and submits them into `batch`; `None`
/// if nothing was dirty.
fn submit_into<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
    batch: &Batch,
) -> Option<Submitted<O>> {
    let (runs, busy) = collect(cache, ops, folios, wait);
    if runs.is_empty() {
        debug_assert!(busy.is_empty(), "folios taken for writeback without a run");
        return None;
    }
    let mut ends: Vec<WbEnd<O::Addr>> = Vec::new();
    let mut map_err = None;
    let mut taken = Vec::with_capacity(runs.len());
    for run in runs {
        let (pos, len) = (run.pos, run.len);
        taken.push((pos, len));
        let mut rest = RunBytes {
            at: pos,
            segs: run.segs.into(),
        };
        let walked = iterate(ops, pos, len, IomapOp::Writeback, |map, p, n| {
            // Pieces split the run without copying: windows of windows.
            let bufs = rest.take(p, n);
            ops.submit(batch, map, p, IoDir::Write, bufs);
            ends.push(WbEnd {
                map: *map,
                pos: p,
                len: n,
            });
            Ok(n)
        });
        ops.buffers().put_all(rest.segs);
        if let Err(e) = walked {
            map_err.get_or_insert(iter_err(ops, e).1);
        }
    }
    ops.writeback_submitted(batch);
    Some(Submitted {
        ends,
        busy,
        map_err,
        taken,
    })
}

/// What is left of a run's bytes as its mapping pieces take them, in file order.
struct RunBytes {
    /// File position of the first byte of `segs`.
    at: u64,
    segs: VecDeque<IoBuf>,
}

impl RunBytes {
    /// The buffers holding bytes `[p, p + n)` (`p` at or after `self.at`), split off the
    /// front without copying.
    fn take(&mut self, p: u64, n: u64) -> Vec<IoBuf> {
        debug_assert!(p >= self.at, "mapping pieces go forward");
        self.skip(p.saturating_sub(self.at));
        let mut out = Vec::new();
        let mut need = n;
        while need > 0 {
            let b = self
                .segs
                .pop_front()
                .expect("a run holds the bytes its pieces cover");
            let got = b.len() as u64;
            if got <= need {
                out.push(b);
                need -= got;
            } else {
                let (head, tail) = b.split_at(need as usize);
                out.push(head);
                self.segs.push_front(tail);
                need = 0;
            }
        }
        self.at = p + n;
        out
    }

    /// Drops `n` bytes from the front.
    fn skip(&mut self, n: u64) {
        if n > 0 {
            drop(self.take(self.at, n));
        }
    }
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
    settle(cache, ops, fc, b.sub, io_err, stats)
}

/// Lets the file system record (or, after `io_err` or a mapping error, undo) the pieces
/// of `b`, whose I/O completed, and ends writeback on its folios.
fn settle<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    fc: &FileCache,
    b: Submitted<O>,
    io_err: Option<TargetError>,
    stats: &mut WbStats,
) -> Result<(), O::Error> {
    let outcome = if io_err.is_none() && b.map_err.is_none() {
        WbOutcome::Written
    } else {
        WbOutcome::Failed
    };
    stats.ios += b.ends.len() as u64;
    stats.bytes += b.ends.iter().map(|e| e.len).sum::<u64>();
    let completed = ops.writeback_done(&b.ends, outcome);
    for cell in b.busy {
        if outcome == WbOutcome::Failed {
            forget_failed(cache, &cell, &b.taken);
        }
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

/// After a failed writeback, forgets the blocks of `cell` the failed runs took (those
/// not dirtied again since): the file system recorded nothing for them, so the next read
/// reads what the device holds under the file's mapping, its last durable contents (for
/// copy on write and new allocations, the old blocks or a hole), rather than bytes that
/// never reached it (issue 12: a failed copy on write leaves both files reading what was
/// durable). Linux keeps such pages uptodate until evicted; a cache that showed data the
/// disk never got would change its answer at an eviction or a remount.
fn forget_failed(cache: &PageCache, cell: &FolioCell, taken: &[(u64, u64)]) {
    let bs = u64::from(cache.block_size());
    let (start, end) = (cell.pos(), cell.pos() + cell.len());
    let mut g = cell.lock();
    for &(pos, len) in taken {
        let (from, to) = (pos.max(start), (pos + len).min(end));
        if from >= to {
            continue;
        }
        let (first, last) = ((from - start) / bs, (to - start).div_ceil(bs));
        for blk in first as u32..last as u32 {
            if !g.state.is_dirty(blk) {
                cache.invalidate_blocks(&mut g, blk, blk + 1);
            }
        }
    }
}

/// Largest run in one device write; runs never cross a multiple of it, so with stripe
/// units that are multiples of it a full run is exactly one mapping piece.
const RUN_BYTES: u64 = 1 << 20;

/// A dirty run taken for writeback: file position, length and its bytes in order (windows
/// lent from folios, or staging buffers).
struct Run {
    pos: u64,
    len: u64,
    segs: Vec<IoBuf>,
}

/// Dirty runs taken for writeback and the folios now under writeback.
type Collected = (Vec<Run>, Vec<Arc<FolioCell>>);

/// A run being collected: bytes so far in `segs`, and a staging buffer filled up to
/// `staged` bytes that follow them (all of the run with [`WbCopy::Stage`]; with
/// [`WbCopy::Lend`] only the EOF block, whose bytes past EOF go out as zeros without
/// changing the folio).
struct Building {
    pos: u64,
    len: u64,
    segs: Vec<IoBuf>,
    stage: Option<(IoBuf, usize)>,
}

impl Building {
    fn new(pos: u64) -> Self {
        Self {
            pos,
            len: 0,
            segs: Vec::new(),
            stage: None,
        }
    }

    /// Appends a window lent from `data` (bytes `[from, from + n)`).
    fn lend(&mut self, data: &SharedBuf, from: usize, n: usize) {
        debug_assert!(self.stage.is_none(), "nothing follows the staged EOF block");
        self.segs.push(data.window(from, n));
        self.len += n as u64;
    }

    /// Appends a copy of `src` followed by `zeros` zero bytes, in a staging buffer of
    /// `cap` bytes taken for the first such bytes of the run.
    fn stage<O: CacheIo>(&mut self, ops: &O, src: &[u8], zeros: usize, cap: usize) {
        let (buf, used) = self
            .stage
            .get_or_insert_with(|| (ops.buffers().get(cap), 0));
        buf[*used..*used + src.len()].copy_from_slice(src);
        buf[*used + src.len()..*used + src.len() + zeros].fill(0);
        *used += src.len() + zeros;
        self.len += (src.len() + zeros) as u64;
    }

    fn end(&self) -> u64 {
        self.pos + self.len
    }

    fn finish(mut self) -> Run {
        if let Some((buf, used)) = self.stage.take() {
            // The staged bytes without a copy: a window of the staging buffer, which
            // returns to the pool whole when the write gives the last window back.
            let exact = if used == buf.len() {
                buf
            } else {
                buf.split_at(used).0
            };
            self.segs.push(exact);
        }
        Run {
            pos: self.pos,
            len: self.len,
            segs: self.segs,
        }
    }
}

/// Takes the dirty runs (clamped to EOF) out of `folios`: lends windows of the folios'
/// memory (or copies it into staging buffers, [`WbCopy::Stage`]), with the bytes of the
/// EOF block past EOF as zeros; clears their dirty bits and marks the folios under
/// writeback. Returns the runs and the busy folios.
fn collect<O: CacheIo>(
    cache: &PageCache,
    ops: &O,
    folios: &[Arc<FolioCell>],
    wait: WbWait,
) -> Collected {
    let bs = u64::from(cache.block_size());
    let mode = cache.config().writeback_copy;
    let mut runs: Vec<Run> = Vec::new();
    let mut busy = Vec::new();
    let mut cur: Option<Building> = None;
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
                let fresh = cur.as_ref().is_none_or(|s| {
                    s.end() != at || s.len == RUN_BYTES || at.is_multiple_of(RUN_BYTES)
                });
                if fresh {
                    if let Some(s) = cur.take() {
                        runs.push(s.finish());
                    }
                    cur = Some(Building::new(at));
                }
                let s = cur.as_mut().expect("a run being built");
                let boundary = (at / RUN_BYTES + 1) * RUN_BYTES;
                let n = (b - at).min(boundary - at);
                add_bytes(
                    ops,
                    s,
                    &g.data,
                    (at - g.pos, n),
                    size.saturating_sub(at),
                    bs,
                    mode,
                );
                at += n;
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
        runs.push(s.finish());
    }
    (runs, busy)
}

/// Adds folio bytes `[from, from + n)` (whole blocks of `bs` bytes) to run `s`; only the
/// first `keep` of them are inside EOF (the rest, in the last block, go out as zeros).
#[allow(clippy::too_many_arguments)]
fn add_bytes<O: CacheIo>(
    ops: &O,
    s: &mut Building,
    data: &SharedBuf,
    (from, n): (u64, u64),
    keep: u64,
    bs: u64,
    mode: WbCopy,
) {
    let keep = keep.min(n) as usize;
    let (from, n, bs) = (from as usize, n as usize, bs as usize);
    match mode {
        WbCopy::Stage => s.stage(ops, &data[from..from + keep], n - keep, RUN_BYTES as usize),
        WbCopy::Lend if keep == n => s.lend(data, from, n),
        WbCopy::Lend => {
            // The EOF block: lend what precedes it, stage it with zeros past EOF. The
            // folio's own bytes past EOF are left alone (a writer extending the file may
            // have put data there that the size does not cover yet).
            debug_assert!(n % bs == 0 && n - keep < bs, "EOF inside the last block");
            let lent = n - bs;
            if lent > 0 {
                s.lend(data, from, lent);
            }
            s.stage(ops, &data[from + lent..from + keep], n - keep, bs);
        }
    }
}

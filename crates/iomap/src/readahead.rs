//! Asynchronous readahead: the next window of a sequential reader is submitted to the
//! device and left in flight while the current read returns its data.
//!
//! The window (Linux's `PG_readahead` marker idea, read as a spec only): each file keeps
//! the window it submitted last, `[mark, end)`. A sequential read of `[pos, e)` that
//! finds nothing submitted ahead of `e` (a new stream, or a reader that outran its
//! readahead) submits `[e, e + W)`; a read that enters the last window (`e > mark`)
//! submits the one after it, `[end, end + W)`. So while a reader copies window k, window
//! k + 1 is on the device. `W` is the readahead size, at least the read's own size.
//!
//! The state machine of a folio (`docs/design/cache.md`, "Readahead"): the submitter
//! takes every folio of the window that is neither wholly uptodate nor already being read,
//! under its lock sets `reading`, fills the blocks that need no device read (holes,
//! unwritten, past EOF), submits reads for the rest, and unlocks. The completion, on a
//! target's thread, locks those folios, copies in the blocks whose read succeeded and
//! marks them uptodate (a failed read leaves its blocks not uptodate: the next reader
//! reads them again, synchronously, and gets the error if it fails again), clears
//! `reading`, and then signals the cache's settlement condition. Every other user that
//! reads or changes a folio's data or block state waits for `reading` to clear first
//! (`FolioCell::lock_settled`, `FolioCell::lock_idle`), or leaves the folio alone
//! (reclaim, `drop_clean`, `drop_if_empty`); writeback, which touches only dirty blocks
//! (uptodate, so never read into), neither waits nor skips.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use stripefs_target::{Batch, BufPool, IoBuf, IoDone, SharedBuf};

use crate::buffered::{for_each_span, mark_uptodate};
use crate::cache::{FileCache, Folio, FolioCell, PageCache, ReadCopy};
use crate::{iterate, FileIo, IoDir, IomapOp};

/// The window a file's asynchronous readahead submitted last: `[mark, end)`. A
/// sequential read ending past `mark` triggers the next window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RaWindow {
    mark: u64,
    end: u64,
}

/// What the readahead completions share with the cache: the settlement signal, the
/// buffers they read into, counters.
#[derive(Debug)]
pub(crate) struct ReadShared {
    /// Held to check-and-wait and to signal, so that no wake-up is lost: a waiter takes
    /// it before unlocking the folio it found reading, a completion after unlocking the
    /// folios it cleared.
    settle: Mutex<()>,
    settled: Condvar,
    /// Readahead's own I/O buffers: the completion runs without the file system, so it
    /// returns them here rather than to the file system's pool.
    bufs: BufPool,
    /// How device reads reach the folios (readahead's and `fill`'s alike).
    copy: ReadCopy,
    reading_folios: AtomicU64,
    submitted_bytes: AtomicU64,
    failed_reads: AtomicU64,
    swapped_bytes: AtomicU64,
    copied_bytes: AtomicU64,
}

impl ReadShared {
    /// Shared state keeping at most `pool_bytes` of idle readahead buffers.
    pub(crate) fn new(pool_bytes: usize, copy: ReadCopy) -> Self {
        Self {
            settle: Mutex::new(()),
            settled: Condvar::new(),
            bufs: BufPool::new(pool_bytes),
            copy,
            reading_folios: AtomicU64::new(0),
            submitted_bytes: AtomicU64::new(0),
            failed_reads: AtomicU64::new(0),
            swapped_bytes: AtomicU64::new(0),
            copied_bytes: AtomicU64::new(0),
        }
    }

    /// Unlocks `g` (a folio found reading) and sleeps until some readahead completion
    /// settles its folios; the caller looks again. Never call this on a target's
    /// completion thread: the completion it waits for may be that thread's next job.
    pub(crate) fn wait_settled(&self, g: MutexGuard<'_, Folio>) {
        let mut s = self.settle.lock();
        drop(g);
        self.settled.wait(&mut s);
    }

    fn notify_settled(&self) {
        let _s = self.settle.lock();
        self.settled.notify_all();
    }

    pub(crate) fn reading_folios(&self) -> u64 {
        self.reading_folios.load(Ordering::Relaxed)
    }

    pub(crate) fn submitted_bytes(&self) -> u64 {
        self.submitted_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn failed_reads(&self) -> u64 {
        self.failed_reads.load(Ordering::Relaxed)
    }

    pub(crate) fn swapped_bytes(&self) -> u64 {
        self.swapped_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn copied_bytes(&self) -> u64 {
        self.copied_bytes.load(Ordering::Relaxed)
    }
}

/// Forgets the file's readahead window (a read that is not sequential).
pub(crate) fn reset(fc: &FileCache) {
    *fc.ra.lock() = RaWindow::default();
}

/// For a sequential read of `[pos, e)` of a file of `size` bytes, the window to submit
/// now, of at most `want` bytes, if any (see the module documentation); records it.
pub(crate) fn next_window(fc: &FileCache, e: u64, size: u64, want: u64) -> Option<(u64, u64)> {
    let mut w = fc.ra.lock();
    let start = if w.end < e {
        e // Nothing submitted ahead of this read.
    } else if e > w.mark {
        w.end // The reader entered the last window: the next one goes now.
    } else {
        return None;
    };
    if start >= size || want == 0 {
        return None;
    }
    let end = start.saturating_add(want).min(size);
    *w = RaWindow { mark: start, end };
    Some((start, end))
}

/// A device read of readahead: its completion slot and file range.
struct Pending {
    slot: usize,
    span: ReadSpan,
}

/// Submits the readahead of `[from, to)` without waiting (see the module documentation).
/// Readahead is advisory: a mapping error ends the submission early and is not reported
/// (the blocks it did not reach stay not uptodate and the reader maps them again).
pub(crate) fn submit<O: FileIo>(cache: &PageCache, ops: &O, fc: &FileCache, from: u64, to: u64) {
    let mut cells: Vec<Arc<FolioCell>> = Vec::new();
    let mut cur = from;
    while cur < to {
        let cell = cache.folio(fc, cur, to - cur);
        cur = cell.end();
        cells.push(cell);
    }
    let mut mine: Vec<Arc<FolioCell>> = Vec::new();
    let mut guards: Vec<MutexGuard<'_, Folio>> = Vec::new();
    for cell in &cells {
        let g = cell.lock();
        if g.reading || g.state.folio_uptodate() {
            continue; // Another readahead owns it, or nothing to read.
        }
        guards.push(g);
        mine.push(Arc::clone(cell));
    }
    if guards.is_empty() {
        return;
    }
    let shared = Arc::clone(cache.reads());
    for g in &mut guards {
        debug_assert!(!g.reading, "one readahead per folio");
        g.reading = true;
    }
    shared
        .reading_folios
        .fetch_add(guards.len() as u64, Ordering::Relaxed);
    let runs = runs_to_read(cache, ops.size(), &mut guards);
    let batch = Batch::new();
    let mut pending: Vec<Pending> = Vec::new();
    for (a, e) in runs {
        let walked = iterate(ops, a, e - a, IomapOp::Read, |map, p, n| {
            if map.is_written() {
                let (bufs, layout) = read_bufs(&shared, &shared.bufs, &mut guards, p, n);
                let slot = ops.submit(&batch, map, p, IoDir::Read, bufs);
                shared.submitted_bytes.fetch_add(n, Ordering::Relaxed);
                pending.push(Pending {
                    slot,
                    span: ReadSpan {
                        pos: p,
                        len: n,
                        layout,
                    },
                });
            } else {
                for_each_span(&mut guards, p, n, |g, off, len| {
                    g.data[off..off + len].fill(0);
                    mark_uptodate(g, off, len, u64::from(cache.block_size()));
                });
            }
            Ok(n)
        });
        if walked.is_err() {
            break;
        }
    }
    // The completion locks these folios: unlock them before it can run (here, if every
    // read already completed).
    drop(guards);
    let bs = u64::from(cache.block_size());
    batch.finish_with(move |done| complete(&shared, mine, &pending, done, bs));
}

/// The runs of blocks of `guards` (ascending, each run inside consecutive folios) that
/// need reading, as file byte ranges; blocks wholly past EOF are zeroed and made uptodate
/// on the way. `fill` (a synchronous read) and readahead both read what this returns.
pub(crate) fn runs_to_read(
    cache: &PageCache,
    size: u64,
    guards: &mut [MutexGuard<'_, Folio>],
) -> Vec<(u64, u64)> {
    let bs = u64::from(cache.block_size());
    let eof_blocks_end = size.div_ceil(bs) * bs;
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for g in guards.iter_mut() {
        for b in 0..g.state.blocks() {
            if g.state.is_uptodate(b) {
                continue;
            }
            let at = g.pos + u64::from(b) * bs;
            if at >= eof_blocks_end {
                let o = (u64::from(b) * bs) as usize;
                g.data[o..o + bs as usize].fill(0);
                g.state.set_uptodate(b, b + 1);
                continue;
            }
            match runs.last_mut() {
                Some((_, e)) if *e == at => *e += bs,
                _ => runs.push((at, at + bs)),
            }
        }
    }
    runs
}

/// The completion of one readahead submission, on the thread of its last device
/// completion: fills what was read, settles the folios, wakes the waiters. Takes no lock
/// but the folios' (which nobody holds while waiting for anything) and the settlement
/// lock, and calls nothing of the file system.
fn complete(
    shared: &ReadShared,
    cells: Vec<Arc<FolioCell>>,
    pending: &[Pending],
    mut done: Vec<IoDone>,
    bs: u64,
) {
    let mut guards: Vec<MutexGuard<'_, Folio>> = cells.iter().map(|c| c.lock()).collect();
    let mut spare: Vec<IoBuf> = Vec::new();
    for p in pending {
        let d = &mut done[p.slot];
        let bufs = std::mem::take(&mut d.bufs);
        if d.result.is_err() {
            // Left not uptodate: the next reader retries synchronously.
            shared.failed_reads.fetch_add(1, Ordering::Relaxed);
            spare.extend(bufs);
            continue;
        }
        spare.extend(take_read(shared, &mut guards, p.span, bufs, bs));
    }
    for g in &mut guards {
        debug_assert!(
            g.reading,
            "a readahead folio stays reading until its completion"
        );
        g.reading = false;
    }
    drop(guards);
    shared
        .reading_folios
        .fetch_sub(cells.len() as u64, Ordering::Relaxed);
    // Let go of the folios before waking anyone: a woken user may count references
    // (`drop_if_empty`, reclaim) and must not count ours.
    drop(cells);
    shared.bufs.put_all(spare);
    shared.notify_settled();
}

/// Most folio spans one device read is split into under [`ReadCopy::Swap`] (an iovec
/// each; the kernel takes at most 1,024): a piece over more, smaller folios is read into
/// one buffer and copied, as under [`ReadCopy::Bounce`].
const SWAP_MAX_SPANS: usize = 256;

/// How the buffers of one device read of folio bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BufLayout {
    /// One buffer for the whole read, copied into the folios.
    Whole,
    /// One buffer per folio span, in order: a span that is a whole folio becomes its
    /// memory ([`ReadCopy::Swap`]).
    PerFolio,
}

/// One completed device read of folio bytes `[pos, pos + len)`, as [`read_bufs`] laid it
/// out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadSpan {
    pub(crate) pos: u64,
    pub(crate) len: u64,
    pub(crate) layout: BufLayout,
}

/// The buffers, from `pool`, that a device read of folio bytes `[p, p + n)` of `guards`
/// reads into (see [`ReadCopy`]).
pub(crate) fn read_bufs(
    shared: &ReadShared,
    pool: &BufPool,
    guards: &mut [MutexGuard<'_, Folio>],
    p: u64,
    n: u64,
) -> (Vec<IoBuf>, BufLayout) {
    if shared.copy == ReadCopy::Swap {
        let mut lens: Vec<usize> = Vec::new();
        for_each_span(guards, p, n, |_, _, len| lens.push(len));
        if lens.len() <= SWAP_MAX_SPANS {
            let bufs = lens.into_iter().map(|len| pool.get(len)).collect();
            return (bufs, BufLayout::PerFolio);
        }
    }
    (vec![pool.get(n as usize)], BufLayout::Whole)
}

/// Puts what a completed device read brought in `bufs` into the folios of `guards` and
/// marks those blocks uptodate; returns the buffers left for the pool. Under
/// [`BufLayout::PerFolio`] a buffer that is a whole folio becomes that folio's memory and
/// the folio's old memory is returned in its place: every block of such a folio was read
/// (a read covers only blocks that were not uptodate), and while the read was in flight
/// nothing else changed the folio's data (the caller held it locked, or it was
/// `reading`), so no byte of the old memory is still wanted. A window of the old memory
/// still lent to a write keeps it alive until that write is done (`SharedBuf`).
pub(crate) fn take_read(
    shared: &ReadShared,
    guards: &mut [MutexGuard<'_, Folio>],
    span: ReadSpan,
    bufs: Vec<IoBuf>,
    bs: u64,
) -> Vec<IoBuf> {
    let (p, n) = (span.pos, span.len);
    if span.layout == BufLayout::Whole {
        let src = &bufs[0];
        for_each_span(guards, p, n, |g, off, len| {
            let from = (g.pos + off as u64 - p) as usize;
            g.data[off..off + len].copy_from_slice(&src[from..from + len]);
            mark_uptodate(g, off, len, bs);
        });
        shared.copied_bytes.fetch_add(n, Ordering::Relaxed);
        return bufs;
    }
    let mut spare: Vec<IoBuf> = Vec::with_capacity(bufs.len());
    let mut it = bufs.into_iter();
    let (mut swapped, mut copied) = (0u64, 0u64);
    for_each_span(guards, p, n, |g, off, len| {
        let buf = it.next().expect("one buffer per folio span");
        assert_eq!(buf.len(), len, "a folio span's buffer is the span");
        if off == 0 && len as u64 == g.len() {
            let old = std::mem::replace(&mut g.data, SharedBuf::from(buf));
            spare.extend(old.into_unshared());
            swapped += len as u64;
        } else {
            g.data[off..off + len].copy_from_slice(&buf);
            spare.push(buf);
            copied += len as u64;
        }
        mark_uptodate(g, off, len, bs);
    });
    shared.swapped_bytes.fetch_add(swapped, Ordering::Relaxed);
    shared.copied_bytes.fetch_add(copied, Ordering::Relaxed);
    spare
}

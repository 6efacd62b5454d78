//! The page cache: folios whose size follows the file, a memory budget with eviction of
//! clean folios, dirty accounting with a limit, and the writeback error sequence.
//!
//! Folio size: every folio is a naturally aligned power of two from the block size to
//! `folio_bytes`, and the folios of a file never overlap. With [`FolioSizing::File`] (the
//! default) a new folio at `pos` is as large as the I/O that creates it or as `pos` (the
//! largest power of two not above it), whichever is larger, halved until it overlaps no
//! cached folio: a 4 KiB file gets one 4 KiB folio, a file written or read sequentially
//! ramps up 4, 4, 8, 16, 32 KiB... to full-size folios, as Linux's large-folio page cache
//! sizes folios by the write and readahead sizes. [`FolioSizing::Fixed`] makes every folio
//! `folio_bytes` (the behaviour before, kept for benchmarks).
//!
//! Reclaim: every folio is on one of the reclaim lists of [`crate::lru`] (clean, dirty,
//! under writeback), moved between them by the methods that change its dirty or writeback
//! state ([`PageCache::set_dirty`] and the crate's writeback and invalidation paths), and
//! to the front of its list when used. Eviction takes the oldest clean folios, so its cost
//! per evicted folio does not depend on how many folios or files are cached, and dirty or
//! busy folios are never visited (the `reclaim_scanned` counter proves it in tests).
//!
//! Locking: the per-file folio map is a read-write lock held only to find or insert a
//! folio; each folio has its own mutex, so readers and writers on different folios of the
//! same file proceed in parallel. Lock order: folio (ascending position within a file), then
//! whatever the file system takes in its mapping callbacks. A folio under writeback stays
//! cached (it cannot be evicted or invalidated) until its I/O completed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use stripefs_target::{IoBuf, SharedBuf};

use crate::folio::{DirtyTracking, FolioState};
use crate::lru::{LruKey, LruList, LruLists, LruSlot};
use crate::readahead::{RaWindow, ReadShared};

/// Most folios one eviction pass skips (in use, locked) before it gives up: the budget is
/// a target, not a hard limit, so a pass never scans more than this beyond what it evicts.
const RECLAIM_SKIP_LIMIT: u32 = 32;

/// Page-cache configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Largest folio in bytes: a power of two from 4 KiB to 2 MiB, at least the block size.
    pub folio_bytes: u32,
    /// How the size of a new folio is chosen.
    pub folio_sizing: FolioSizing,
    /// Most bytes of folios resident at once (clean folios are evicted beyond it).
    pub budget_bytes: u64,
    /// Most dirty bytes before writers are throttled.
    pub dirty_limit_bytes: u64,
    /// Per-block or per-folio dirty tracking.
    pub dirty_tracking: DirtyTracking,
    /// Most bytes read ahead on sequential reads (0: no readahead).
    pub readahead_bytes: u64,
    /// Whether readahead waits for its device reads inside the read that triggers it
    /// (`Sync`, the behaviour before) or leaves the next window in flight (`Async`).
    pub readahead: ReadaheadMode,
    /// Writeback batches in flight at once: the next batch is collected, mapped and
    /// submitted while earlier ones are on the device (1: submit a batch and wait for it
    /// before the next, the behaviour before pipelining).
    pub writeback_depth: WbDepth,
    /// Whether writeback lends the folios' memory to the device or copies it into
    /// staging buffers.
    pub writeback_copy: WbCopy,
    /// Whether a read of whole folios becomes their memory or is copied into them.
    pub read_copy: ReadCopy,
    /// How a writer over the dirty limit is throttled.
    pub dirty_throttle: DirtyThrottle,
}

/// How a writer over the dirty limit is throttled (`docs/design/cache.md`, "Dirty
/// throttling").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyThrottle {
    /// The writer sleeps while background writeback brings dirty bytes under the limit
    /// (Linux's I/O-less throttling), so its copying overlaps the device writing; it
    /// writes its own file back only if that has not happened within
    /// [`THROTTLE_WAIT_BOUND`]. With no flusher ([`Flusher::Absent`]) it behaves as
    /// `Write`.
    #[default]
    Wait,
    /// The writer writes its own file back first, then waits (the behaviour before, kept
    /// as the benchmark switch; what a caller without a flusher needs).
    Write,
}

/// Whether a background flusher writes dirty files back (what [`DirtyThrottle::Wait`]
/// waits for; the file system knows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flusher {
    /// A flusher thread runs and is kicked past half the dirty limit.
    Running,
    /// None: only the writers themselves write back.
    Absent,
}

/// Longest a writer waits for background writeback under [`DirtyThrottle::Wait`] before
/// writing its own file back.
pub const THROTTLE_WAIT_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// How a device read of folio blocks (a readahead window, a cold read) reaches the folios
/// (`docs/design/cache.md`, "Reads without the bounce copy").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadCopy {
    /// The device reads each folio span into a buffer of its own; a buffer that is a
    /// whole folio (none of its blocks was uptodate) becomes the folio's memory at
    /// completion, and the folio's old memory goes back to the pool: no copy. Spans of
    /// partly uptodate folios are still copied.
    #[default]
    Swap,
    /// The device reads each mapping piece into one pooled buffer, copied into the
    /// folios at completion (the behaviour before, kept as the benchmark switch).
    Bounce,
}

/// How writeback hands the folios' bytes to the device (`docs/design/cache.md`,
/// "Writeback without the staging copy").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WbCopy {
    /// The device writes from the folio's own memory (read-only windows of it); a folio
    /// changed while its writeback is in flight gets a fresh copy of its bytes (copy on
    /// write), so only such rewrites pay a copy.
    #[default]
    Lend,
    /// Every written byte is copied into a pooled staging buffer first (the behaviour
    /// before lending, kept as the benchmark switch).
    Stage,
}

/// Writeback batches in flight at once (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WbDepth(pub u32);

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            folio_bytes: 64 << 10,
            folio_sizing: FolioSizing::File,
            budget_bytes: 256 << 20,
            dirty_limit_bytes: 64 << 20,
            dirty_tracking: DirtyTracking::Block,
            readahead_bytes: 2 << 20,
            readahead: ReadaheadMode::Async,
            writeback_depth: WbDepth(2),
            writeback_copy: WbCopy::Lend,
            read_copy: ReadCopy::Swap,
            dirty_throttle: DirtyThrottle::Wait,
        }
    }
}

impl CacheConfig {
    /// Checks the configuration against a block size.
    ///
    /// # Errors
    /// A sentence naming the bad value.
    pub fn validate(&self, block_size: u32) -> Result<(), String> {
        let f = self.folio_bytes;
        if !f.is_power_of_two() || !(4096..=2 << 20).contains(&f) {
            return Err(format!(
                "folio size {f} is not a power of two from 4 KiB to 2 MiB"
            ));
        }
        if f < block_size {
            return Err(format!(
                "folio size {f} is smaller than the block size {block_size}"
            ));
        }
        if self.writeback_depth.0 == 0 {
            return Err("writeback depth must be at least 1 batch".into());
        }
        if self.dirty_limit_bytes < u64::from(f) || self.budget_bytes < 2 * self.dirty_limit_bytes {
            return Err(
                "the memory budget must be at least twice the dirty limit, which must hold a folio"
                    .into(),
            );
        }
        Ok(())
    }
}

/// How sequential readahead runs (see `docs/design/cache.md`, "Readahead").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadaheadMode {
    /// The read that detects a sequential stream reads its own data and the readahead
    /// window together and waits for both (the behaviour before asynchronous readahead).
    Sync,
    /// The next window's device reads are submitted and left in flight while the read
    /// returns the current data; a later read entering that window submits the one after
    /// (Linux's `PG_readahead` marker idea).
    #[default]
    Async,
}

/// How big a new folio is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FolioSizing {
    /// As large as the I/O creating it or as its position in the file (see the module
    /// documentation), from the block size up to `folio_bytes`.
    #[default]
    File,
    /// Always `folio_bytes` (a 4 KiB file occupies a whole large folio).
    Fixed,
}

/// One cached folio.
#[derive(Debug)]
pub struct Folio {
    /// File position of the folio's first byte (a multiple of its size).
    pub pos: u64,
    /// The cached bytes (the folio's size: a power of two), aligned for the device. With
    /// [`WbCopy::Lend`] writeback lends windows of them to its writes; every change to
    /// them goes through `DerefMut`, which copies them to fresh memory first while a
    /// window is out (stable pages, `stripefs_target::SharedBuf`).
    pub data: SharedBuf,
    /// Per-block state. Dirty bits change only through [`PageCache::set_dirty`] and the
    /// crate's writeback and invalidation paths, which keep the reclaim lists right.
    pub(crate) state: FolioState,
    /// Blocks of this folio are being written back.
    pub(crate) writeback: bool,
    /// Read in flight: an asynchronous readahead owns this folio's blocks that are not
    /// uptodate until its completion fills them (or leaves them not uptodate on error).
    /// Nothing else changes the folio's data or block state meanwhile: every such user
    /// waits ([`FolioCell::lock_settled`], [`FolioCell::lock_idle`]) or skips it.
    pub(crate) reading: bool,
    /// This folio's node on the reclaim lists.
    lru: LruSlot,
}

impl Folio {
    /// Bytes in the folio.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// True for a folio of no bytes (never: folios hold at least one block).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One past the folio's last file position.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.pos + self.len()
    }

    /// Per-block state.
    #[must_use]
    pub fn state(&self) -> &FolioState {
        &self.state
    }

    /// Marks blocks `[from, to)` uptodate (their bytes were just filled).
    pub fn set_uptodate(&mut self, from: u32, to: u32) {
        self.state.set_uptodate(from, to);
    }

    /// True while writeback I/O is in flight on the folio.
    #[must_use]
    pub fn under_writeback(&self) -> bool {
        self.writeback
    }

    /// True while an asynchronous readahead read is in flight into the folio.
    #[must_use]
    pub fn read_in_flight(&self) -> bool {
        self.reading
    }

    /// The reclaim list the folio belongs on.
    fn wanted_list(&self) -> LruList {
        if self.state.folio_dirty() {
            LruList::Dirty
        } else if self.writeback {
            LruList::Writeback
        } else {
            LruList::Clean
        }
    }
}

/// A folio, its (fixed) extent in the file, the condition variable its writeback
/// completion signals, and the cache's read-settlement signal.
#[derive(Debug)]
pub struct FolioCell {
    pos: u64,
    len: u64,
    folio: Mutex<Folio>,
    wb_done: Condvar,
    reads: Arc<ReadShared>,
}

impl FolioCell {
    /// File position of the folio's first byte.
    #[must_use]
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// One past the folio's last file position.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.pos + self.len
    }

    /// Bytes in the folio.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a folio of no bytes (never).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Locks the folio.
    pub fn lock(&self) -> MutexGuard<'_, Folio> {
        self.folio.lock()
    }

    /// Locks the folio once neither writeback nor a readahead read is in flight on it
    /// (invalidation, dropping a file).
    pub fn lock_idle(&self) -> MutexGuard<'_, Folio> {
        loop {
            let mut g = self.lock_settled();
            if !g.writeback {
                return g;
            }
            while g.writeback {
                self.wb_done.wait(&mut g);
            }
            // Waiting released the lock: a readahead may have taken the folio meanwhile.
            if !g.reading {
                return g;
            }
        }
    }

    /// Locks the folio once no writeback is in flight on it (a readahead read may be:
    /// writeback touches only dirty blocks, which a readahead never reads into).
    pub(crate) fn lock_wb_idle(&self) -> MutexGuard<'_, Folio> {
        let mut g = self.folio.lock();
        while g.writeback {
            self.wb_done.wait(&mut g);
        }
        g
    }

    /// Locks the folio once no readahead read is in flight on it: what every user that
    /// reads or changes the data or block state of blocks that may not be uptodate does
    /// (buffered read, write, zeroing).
    pub fn lock_settled(&self) -> MutexGuard<'_, Folio> {
        loop {
            let g = self.folio.lock();
            if !g.reading {
                return g;
            }
            self.reads.wait_settled(g);
        }
    }
}

/// Writeback errors of a file as an error sequence: each open handle remembers the
/// sequence it has seen and is told about every later error exactly once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ErrSeq {
    pub seq: u64,
    pub errno: i32,
}

/// The cache of one file.
#[derive(Debug)]
pub struct FileCache {
    pub key: u64,
    /// Folios by the file position of their first byte; they never overlap.
    folios: RwLock<BTreeMap<u64, Arc<FolioCell>>>,
    /// End of the last read, for sequential readahead detection.
    pub next_read: AtomicU64,
    /// Asynchronous readahead: the window submitted last and its marker.
    pub(crate) ra: Mutex<RaWindow>,
    wb_err: Mutex<ErrSeq>,
}

impl FileCache {
    /// The folio holding byte `pos`, if cached.
    #[must_use]
    pub fn get(&self, pos: u64) -> Option<Arc<FolioCell>> {
        containing(&self.folios.read(), pos).cloned()
    }

    /// Whether no folio of the file is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.folios.read().is_empty()
    }

    /// Cached folios overlapping `[from, to)`, ascending.
    #[must_use]
    pub fn overlapping(&self, from: u64, to: u64) -> Vec<Arc<FolioCell>> {
        self.overlapping_within(from, to, u64::MAX)
    }

    /// The cached folios overlapping `[from, to)`, ascending, as many as hold at most
    /// `limit` bytes together (at least one, if any overlaps): one writeback batch. The
    /// caller holds only these while they are written, so a folio written early in a
    /// long pass is evictable as soon as its batch completes.
    #[must_use]
    pub fn overlapping_within(&self, from: u64, to: u64, limit: u64) -> Vec<Arc<FolioCell>> {
        if from >= to {
            return Vec::new();
        }
        let map = self.folios.read();
        let start = containing(&map, from).map_or(from, |c| c.pos);
        let mut bytes = 0;
        let mut out = Vec::new();
        for c in map.range(start..to).map(|(_, c)| c) {
            bytes += c.len();
            if bytes > limit && !out.is_empty() {
                break;
            }
            out.push(Arc::clone(c));
        }
        out
    }

    /// Every cached folio, ascending, if together they hold at most `limit` bytes
    /// (`None` otherwise; stops counting at the limit, so a large file costs little).
    #[must_use]
    pub fn folios_within(&self, limit: u64) -> Option<Vec<Arc<FolioCell>>> {
        let map = self.folios.read();
        let mut bytes = 0;
        let mut out = Vec::new();
        for c in map.values() {
            bytes += c.len();
            if bytes > limit {
                return None;
            }
            out.push(Arc::clone(c));
        }
        Some(out)
    }

    /// One past the last cached byte position (the end of the last folio); 0 if none.
    #[must_use]
    pub fn cached_end(&self) -> u64 {
        self.folios
            .read()
            .last_key_value()
            .map_or(0, |(_, c)| c.end())
    }

    /// File position of the first cached folio starting after `pos`.
    #[must_use]
    pub fn next_folio_after(&self, pos: u64) -> Option<u64> {
        use std::ops::Bound;
        self.folios
            .read()
            .range((Bound::Excluded(pos), Bound::Unbounded))
            .next()
            .map(|(&p, _)| p)
    }

    /// True if the block holding byte `pos` is cached dirty.
    #[must_use]
    pub fn block_dirty(&self, cache: &PageCache, pos: u64) -> bool {
        let Some(cell) = self.get(pos) else {
            return false;
        };
        let g = cell.lock();
        g.state
            .is_dirty(((pos - g.pos) / u64::from(cache.block_size())) as u32)
    }

    /// True if the block holding byte `pos` holds cached data the device may not have
    /// yet: dirty, or uptodate in a folio under writeback (taken for writeback, its
    /// extent recorded only when the write completes). Per folio, so it may also answer
    /// true for a clean block beside the ones being written.
    #[must_use]
    pub fn block_pending(&self, cache: &PageCache, pos: u64) -> bool {
        let Some(cell) = self.get(pos) else {
            return false;
        };
        let g = cell.lock();
        let b = ((pos - g.pos) / u64::from(cache.block_size())) as u32;
        g.state.is_dirty(b) || (g.writeback && g.state.is_uptodate(b))
    }

    /// True if any cached block starting below `end` is dirty.
    #[must_use]
    pub fn has_dirty_below(&self, cache: &PageCache, end: u64) -> bool {
        let bs = u64::from(cache.block_size());
        let folios: Vec<Arc<FolioCell>> = self
            .folios
            .read()
            .range(..end.max(1))
            .map(|(_, c)| Arc::clone(c))
            .collect();
        folios.iter().any(|c| {
            let g = c.lock();
            g.state
                .dirty_runs()
                .iter()
                .any(|r| g.pos + u64::from(r.first) * bs < end)
        })
    }

    /// Records a writeback error.
    pub fn record_error(&self, errno: i32) {
        let mut e = self.wb_err.lock();
        e.seq += 1;
        e.errno = errno;
    }

    /// The current error sequence (a new handle starts from here).
    #[must_use]
    pub fn err_seq(&self) -> u64 {
        self.wb_err.lock().seq
    }

    /// Reports an error the handle that has seen `*seen` has not been told about yet, and
    /// advances it.
    pub fn check_error(&self, seen: &mut u64) -> Option<i32> {
        let e = *self.wb_err.lock();
        if e.seq > *seen {
            *seen = e.seq;
            return Some(e.errno);
        }
        None
    }
}

/// The folio of `map` holding byte `pos`.
fn containing(map: &BTreeMap<u64, Arc<FolioCell>>, pos: u64) -> Option<&Arc<FolioCell>> {
    map.range(..=pos)
        .next_back()
        .map(|(_, c)| c)
        .filter(|c| pos < c.end())
}

/// True if a folio of `map` overlaps `[a, b)`.
fn overlaps(map: &BTreeMap<u64, Arc<FolioCell>>, a: u64, b: u64) -> bool {
    map.range(..b).next_back().is_some_and(|(_, c)| c.end() > a)
}

/// Counters of the cache (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub resident_bytes: u64,
    pub dirty_bytes: u64,
    pub peak_resident_bytes: u64,
    pub evicted_folios: u64,
    /// Folios reclaim looked at (evicted or skipped): the cost of eviction.
    pub reclaim_scanned: u64,
    /// Folios on the clean, dirty and writeback lists.
    pub clean_folios: u64,
    pub dirty_folios: u64,
    pub writeback_folios: u64,
    /// Files with a cache (an empty one included): the index reclaim walks.
    pub files: u64,
    /// Folios with an asynchronous readahead read in flight now.
    pub reading_folios: u64,
    /// Bytes asynchronous readahead submitted to the device, and its reads that failed
    /// (their blocks were left not uptodate).
    pub readahead_async_bytes: u64,
    pub readahead_failed_reads: u64,
    /// Bytes device reads (readahead and cold reads) brought into folios by becoming
    /// their memory ([`ReadCopy::Swap`]), and by being copied into them.
    pub read_swapped_bytes: u64,
    pub read_copied_bytes: u64,
    /// Buffered writes into a folio whose memory a write in flight held (lent by
    /// writeback): each made the folio copy its bytes first (stable pages).
    pub lent_rewrites: u64,
}

/// What reclaim did with the oldest clean folio.
enum Reclaimed {
    Evicted,
    Skipped,
}

/// The page cache of a file system.
#[derive(Debug)]
pub struct PageCache {
    cfg: CacheConfig,
    block_size: u32,
    files: Mutex<HashMap<u64, Arc<FileCache>>>,
    resident: AtomicU64,
    peak: AtomicU64,
    dirty: AtomicU64,
    evicted: AtomicU64,
    lent_rewrites: AtomicU64,
    scanned: AtomicU64,
    /// The reclaim lists (innermost lock: nothing is locked while holding it).
    lru: Mutex<LruLists>,
    /// Asynchronous readahead: settlement signal, buffers, counters (shared with the
    /// completions, which run on the targets' threads).
    reads: Arc<ReadShared>,
    /// Signalled when dirty bytes drop (throttled writers wait on it).
    dirty_fell: (Mutex<()>, Condvar),
    /// Data buffers of dropped folios by size (log2), reused for new ones (at most 1/8 of
    /// the budget in all). A reused buffer holds old bytes: harmless, since no byte of a
    /// folio is read before its block is made uptodate (read, zeroed or wholly written).
    spare: Mutex<Spare>,
}

impl PageCache {
    /// A cache for a file system of `block_size`-byte blocks.
    ///
    /// # Panics
    /// Panics if the configuration is invalid (validate it first).
    #[must_use]
    pub fn new(cfg: CacheConfig, block_size: u32) -> Self {
        if let Err(e) = cfg.validate(block_size) {
            panic!("invalid cache configuration: {e}");
        }
        Self {
            cfg,
            block_size,
            files: Mutex::new(HashMap::new()),
            resident: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            dirty: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            lent_rewrites: AtomicU64::new(0),
            scanned: AtomicU64::new(0),
            lru: Mutex::new(LruLists::new()),
            reads: Arc::new(ReadShared::new(
                usize::try_from(cfg.readahead_bytes.min(cfg.budget_bytes / 8) * 2)
                    .unwrap_or(usize::MAX),
                cfg.read_copy,
            )),
            dirty_fell: (Mutex::new(()), Condvar::new()),
            spare: Mutex::new(Spare::default()),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Block size in bytes.
    #[must_use]
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The cache of file `key`, created empty if needed.
    pub fn file(&self, key: u64) -> Arc<FileCache> {
        Arc::clone(self.files.lock().entry(key).or_insert_with(|| {
            Arc::new(FileCache {
                key,
                folios: RwLock::new(BTreeMap::new()),
                next_read: AtomicU64::new(u64::MAX),
                ra: Mutex::new(RaWindow::default()),
                wb_err: Mutex::new(ErrSeq::default()),
            })
        }))
    }

    /// The cache of file `key` if it has one.
    #[must_use]
    pub fn existing(&self, key: u64) -> Option<Arc<FileCache>> {
        self.files.lock().get(&key).cloned()
    }

    /// Files with dirty folios (from the dirty list: O(dirty folios), not O(cache)).
    #[must_use]
    pub fn dirty_files(&self) -> Vec<Arc<FileCache>> {
        self.files_on(LruList::Dirty)
    }

    /// Files with folios under writeback and not dirty again (from the writeback list).
    /// A writeback that took a file's folios and has not yet recorded them leaves the
    /// file only here: a sync must wait for it too.
    #[must_use]
    pub fn writeback_files(&self) -> Vec<Arc<FileCache>> {
        self.files_on(LruList::Writeback)
    }

    fn files_on(&self, list: LruList) -> Vec<Arc<FileCache>> {
        let mut keys: Vec<u64> = self.lru.lock().keys(list).map(|k| k.0).collect();
        keys.sort_unstable();
        keys.dedup();
        let files = self.files.lock();
        keys.iter().filter_map(|k| files.get(k).cloned()).collect()
    }

    /// Drops a file's cache (the file is gone). Its folios must be clean.
    pub fn forget(&self, key: u64) {
        let Some(fc) = self.files.lock().remove(&key) else {
            return;
        };
        let folios = std::mem::take(&mut *fc.folios.write());
        for cell in folios.values() {
            let g = cell.lock_idle();
            let dirty = u64::from(g.state.dirty_blocks()) * u64::from(self.block_size);
            self.sub_dirty(dirty);
            self.lru.lock().remove(g.lru);
        }
        let bytes: u64 = folios.values().map(|c| c.len).sum();
        self.resident.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// The folio holding byte `pos` of `fc`, created (empty, nothing uptodate) if absent,
    /// sized for an I/O of `len` bytes from `pos` (see [`FolioSizing`]); evicts clean
    /// folios first if the budget is exceeded.
    pub fn folio(&self, fc: &FileCache, pos: u64, len: u64) -> Arc<FolioCell> {
        let size = {
            let map = fc.folios.read();
            if let Some(c) = containing(&map, pos) {
                return Arc::clone(c);
            }
            self.new_folio_size(&map, pos, len)
        };
        if self.resident.load(Ordering::Relaxed) + size > self.cfg.budget_bytes {
            self.evict(size);
        }
        let mut map = fc.folios.write();
        if let Some(c) = containing(&map, pos) {
            return Arc::clone(c); // Created meanwhile.
        }
        // Folios created meanwhile may leave room for a smaller one only.
        let size = self.new_folio_size(&map, pos, len);
        let start = pos & !(size - 1);
        let now = self.resident.fetch_add(size, Ordering::Relaxed) + size;
        self.peak.fetch_max(now, Ordering::Relaxed);
        let blocks = u32::try_from(size / u64::from(self.block_size)).expect("at most 2 MiB");
        let cell = Arc::new(FolioCell {
            pos: start,
            len: size,
            folio: Mutex::new(Folio {
                pos: start,
                data: self.spare.lock().take(size),
                state: FolioState::new(blocks, self.cfg.dirty_tracking),
                writeback: false,
                reading: false,
                lru: self.lru.lock().insert(LruList::Clean, (fc.key, start)),
            }),
            wb_done: Condvar::new(),
            reads: Arc::clone(&self.reads),
        });
        map.insert(start, Arc::clone(&cell));
        cell
    }

    /// Size of a new folio holding `pos` (not cached) for an I/O of `len` bytes: see
    /// [`FolioSizing`]; halved until it overlaps no folio of `map` (a block-sized one never
    /// does, since folios are aligned to their size and `pos` is not cached).
    fn new_folio_size(&self, map: &BTreeMap<u64, Arc<FolioCell>>, pos: u64, len: u64) -> u64 {
        let (min, max) = (u64::from(self.block_size), u64::from(self.cfg.folio_bytes));
        let mut size = match self.cfg.folio_sizing {
            FolioSizing::Fixed => max,
            FolioSizing::File => {
                let by_len = len.max(1).checked_next_power_of_two().unwrap_or(max);
                let by_pos = if pos == 0 { 0 } else { 1 << pos.ilog2() };
                by_len.max(by_pos).clamp(min, max)
            }
        };
        loop {
            let start = pos & !(size - 1);
            if !overlaps(map, start, start + size) {
                return size;
            }
            debug_assert!(size > min, "a block-sized folio cannot overlap at {pos}");
            size /= 2;
        }
    }

    /// Takes a folio out of the cache: the caller removed it from its file's map (and
    /// still holds the map's write lock, so reclaim cannot look it up meanwhile).
    fn unlink(&self, cell: Arc<FolioCell>) {
        let slot = cell.folio.lock().lru;
        self.lru.lock().remove(slot);
        self.resident.fetch_sub(cell.len, Ordering::Relaxed);
        self.recycle(cell);
    }

    /// Puts the folio on the reclaim list its state calls for (O(1)).
    fn relist(&self, f: &Folio) {
        self.lru.lock().set_list(f.lru, f.wanted_list());
    }

    /// Marks blocks `[from, to)` of `f` dirty (they must be uptodate), accounts them and
    /// takes the folio off the clean list. Returns how many blocks became dirty.
    pub fn set_dirty(&self, f: &mut Folio, from: u32, to: u32) -> u32 {
        let newly = f.state.set_dirty(from, to);
        self.add_dirty_blocks(newly);
        if newly > 0 {
            self.relist(f);
        }
        newly
    }

    /// Clears the dirty bits of `[from, to)` as writeback takes them and marks the folio
    /// under writeback. Returns how many blocks were dirty.
    pub(crate) fn take_for_writeback(&self, f: &mut Folio, from: u32, to: u32) -> u32 {
        let cleared = f.state.clear_dirty(from, to);
        self.sub_dirty_blocks(cleared);
        f.writeback = true;
        self.relist(f);
        cleared
    }

    /// Ends writeback on the folio, wakes its waiters, and makes it evictable again if
    /// nothing redirtied it meanwhile.
    pub(crate) fn end_writeback(&self, cell: &FolioCell) {
        let mut g = cell.folio.lock();
        g.writeback = false;
        self.relist(&g);
        drop(g);
        cell.wb_done.notify_all();
    }

    /// Forgets blocks `[from, to)` of `f` (neither uptodate nor dirty). Returns how many
    /// were dirty.
    pub(crate) fn invalidate_blocks(&self, f: &mut Folio, from: u32, to: u32) -> u32 {
        let d = f.state.invalidate(from, to);
        self.sub_dirty_blocks(d);
        if d > 0 {
            self.relist(f);
        }
        d
    }

    /// Keeps a dropped folio's buffer for reuse if the spare list has room.
    fn recycle(&self, cell: Arc<FolioCell>) {
        let Ok(cell) = Arc::try_unwrap(cell) else {
            return;
        };
        // Memory a write still holds (the folio was rewritten and dropped meanwhile) goes
        // with the write's buffers instead.
        if let Some(data) = cell.folio.into_inner().data.into_unshared() {
            self.spare.lock().put(data, self.cfg.budget_bytes / 8);
        }
    }

    /// The asynchronous readahead's shared state.
    pub(crate) fn reads(&self) -> &Arc<ReadShared> {
        &self.reads
    }

    /// Counts a buffered write into a folio whose memory was lent (it copies first).
    pub(crate) fn count_lent_rewrite(&self) {
        self.lent_rewrites.fetch_add(1, Ordering::Relaxed);
    }

    /// Moves a folio to the front of its reclaim list (it was just used).
    pub fn touch(&self, f: &Folio) {
        self.lru.lock().touch(f.lru);
    }

    /// Evicts the least recently used clean, idle folios until `need` bytes fit the budget
    /// with a margin of 1/8 of it, taking them from the back of the clean list: O(1) per
    /// folio evicted, plus at most [`RECLAIM_SKIP_LIMIT`] folios skipped because in use.
    fn evict(&self, need: u64) {
        let target = self.cfg.budget_bytes - self.cfg.budget_bytes / 8;
        let mut skipped = 0;
        while self.resident.load(Ordering::Relaxed) + need > target && skipped < RECLAIM_SKIP_LIMIT
        {
            let Some((slot, key)) = self.lru.lock().oldest(LruList::Clean) else {
                break;
            };
            self.scanned.fetch_add(1, Ordering::Relaxed);
            if let Reclaimed::Skipped = self.reclaim_one(slot, key) {
                skipped += 1;
            }
        }
    }

    /// Evicts the folio of node `slot` (named `key`, read without holding the folio) if it
    /// is clean and idle; otherwise moves it to the front of its list (in use) or to the
    /// list its state calls for.
    fn reclaim_one(&self, slot: LruSlot, key: LruKey) -> Reclaimed {
        let rotate = || {
            let mut lru = self.lru.lock();
            if lru.key(slot) == Some(key) {
                lru.touch(slot);
            }
            Reclaimed::Skipped
        };
        let Some(fc) = self.files.lock().get(&key.0).cloned() else {
            return rotate(); // Being forgotten: its nodes go with it.
        };
        let mut map = fc.folios.write();
        let Some(cell) = map.get(&key.1) else {
            return rotate();
        };
        let Some(g) = cell.folio.try_lock() else {
            return rotate();
        };
        if g.lru != slot || g.reading {
            drop(g);
            return rotate();
        }
        if g.wanted_list() != LruList::Clean {
            self.relist(&g);
            return Reclaimed::Skipped;
        }
        drop(g);
        if Arc::strong_count(cell) != 1 {
            return rotate();
        }
        let cell = map.remove(&key.1).expect("folio just looked up");
        self.unlink(cell);
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Reclaimed::Evicted
    }

    /// Removes the folio starting at `pos` from `fc` if it is clean, idle and holds no
    /// uptodate block (after invalidation).
    pub fn drop_if_empty(&self, fc: &FileCache, pos: u64) {
        let mut map = fc.folios.write();
        let Some(cell) = map.get(&pos) else { return };
        let empty = cell.folio.try_lock().is_some_and(|g| {
            !g.writeback
                && !g.reading
                && !g.state.folio_dirty()
                && !(0..g.state.blocks()).any(|b| g.state.is_uptodate(b))
        });
        if empty && Arc::strong_count(cell) == 1 {
            let cell = map.remove(&pos).expect("folio just looked up");
            self.unlink(cell);
        }
    }

    /// Drops the clean, idle folios overlapping `[from, to)` (after a direct write: cached
    /// copies of the old bytes must go; dirty ones are left alone, they belong to a
    /// concurrent buffered writer and will be written back). Never waits: it runs on
    /// targets' completion threads. A folio with a readahead read in flight is skipped
    /// like one in use; a direct write waited for those before it started
    /// (`invalidate_range`), so only a read racing the write itself can be in flight here,
    /// as with a synchronous read holding its folios.
    pub fn drop_clean(&self, fc: &FileCache, from: u64, to: u64) {
        let mut map = fc.folios.write();
        let first = containing(&map, from).map_or(from, |c| c.pos);
        let idle: Vec<u64> = map
            .range(first..to.max(first))
            .filter(|(_, c)| {
                Arc::strong_count(c) == 1
                    && c.folio
                        .try_lock()
                        .is_some_and(|g| !g.writeback && !g.reading && !g.state.folio_dirty())
            })
            .map(|(&i, _)| i)
            .collect();
        for i in idle {
            if let Some(cell) = map.remove(&i) {
                self.unlink(cell);
            }
        }
    }

    /// Accounts `blocks` newly dirty blocks.
    fn add_dirty_blocks(&self, blocks: u32) {
        self.dirty.fetch_add(
            u64::from(blocks) * u64::from(self.block_size),
            Ordering::Relaxed,
        );
    }

    /// Accounts `blocks` blocks that stopped being dirty.
    fn sub_dirty_blocks(&self, blocks: u32) {
        self.sub_dirty(u64::from(blocks) * u64::from(self.block_size));
    }

    fn sub_dirty(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let prev = self.dirty.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(prev >= bytes, "dirty accounting underflow");
        let _g = self.dirty_fell.0.lock();
        self.dirty_fell.1.notify_all();
    }

    /// True when dirty bytes exceed the limit.
    #[must_use]
    pub fn over_dirty_limit(&self) -> bool {
        self.dirty.load(Ordering::Relaxed) > self.cfg.dirty_limit_bytes
    }

    /// True when background writeback should start (half the dirty limit).
    #[must_use]
    pub fn over_background_threshold(&self) -> bool {
        self.dirty.load(Ordering::Relaxed) > self.cfg.dirty_limit_bytes / 2
    }

    /// Waits, up to `bound` in all, until dirty bytes are under the limit; returns whether
    /// they are.
    pub fn wait_under_dirty_limit(&self, bound: std::time::Duration) -> bool {
        const PAUSE: std::time::Duration = std::time::Duration::from_millis(25);
        let deadline = std::time::Instant::now() + bound;
        while self.over_dirty_limit() && std::time::Instant::now() < deadline {
            self.wait_dirty_fell(PAUSE);
        }
        !self.over_dirty_limit()
    }

    /// Waits up to `timeout` for dirty bytes to drop.
    pub fn wait_dirty_fell(&self, timeout: std::time::Duration) {
        let mut g = self.dirty_fell.0.lock();
        if self.over_dirty_limit() {
            self.dirty_fell.1.wait_for(&mut g, timeout);
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        let files = self.files.lock().len() as u64;
        let lru = self.lru.lock();
        CacheStats {
            resident_bytes: self.resident.load(Ordering::Relaxed),
            dirty_bytes: self.dirty.load(Ordering::Relaxed),
            peak_resident_bytes: self.peak.load(Ordering::Relaxed),
            evicted_folios: self.evicted.load(Ordering::Relaxed),
            reclaim_scanned: self.scanned.load(Ordering::Relaxed),
            clean_folios: lru.len(LruList::Clean) as u64,
            dirty_folios: lru.len(LruList::Dirty) as u64,
            writeback_folios: lru.len(LruList::Writeback) as u64,
            files,
            reading_folios: self.reads.reading_folios(),
            readahead_async_bytes: self.reads.submitted_bytes(),
            readahead_failed_reads: self.reads.failed_reads(),
            read_swapped_bytes: self.reads.swapped_bytes(),
            read_copied_bytes: self.reads.copied_bytes(),
            lent_rewrites: self.lent_rewrites.load(Ordering::Relaxed),
        }
    }
}

/// Recycled folio buffers by size.
#[derive(Debug, Default)]
struct Spare {
    /// Index: log2 of the buffer size.
    by_size: Vec<Vec<IoBuf>>,
    bytes: u64,
}

impl Spare {
    /// A buffer of `size` bytes (a power of two), recycled if one is kept.
    fn take(&mut self, size: u64) -> SharedBuf {
        let class = size.ilog2() as usize;
        match self.by_size.get_mut(class).and_then(Vec::pop) {
            Some(b) => {
                self.bytes -= size;
                SharedBuf::from(b)
            }
            None => SharedBuf::zeroed(usize::try_from(size).expect("folio fits memory")),
        }
    }

    /// Keeps `data` if the spare buffers stay within `limit` bytes.
    fn put(&mut self, data: IoBuf, limit: u64) {
        let size = data.len() as u64;
        if self.bytes + size > limit {
            return;
        }
        let class = size.ilog2() as usize;
        if self.by_size.len() <= class {
            self.by_size.resize_with(class + 1, Vec::new);
        }
        self.by_size[class].push(data);
        self.bytes += size;
    }
}

//! The page cache: folios of a fixed size per file, a memory budget with eviction of clean
//! folios, dirty accounting with a limit, and the writeback error sequence.
//!
//! Locking: the per-file folio map is a read-write lock held only to find or insert a
//! folio; each folio has its own mutex, so readers and writers on different folios of the
//! same file proceed in parallel. Lock order: folio (ascending index within a file), then
//! whatever the file system takes in its mapping callbacks. A folio under writeback stays
//! cached (it cannot be evicted or invalidated) until its I/O completed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use crate::folio::{DirtyTracking, FolioState};

/// Page-cache configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Folio size in bytes: a power of two from 4 KiB to 2 MiB, at least the block size.
    pub folio_bytes: u32,
    /// Most bytes of folios resident at once (clean folios are evicted beyond it).
    pub budget_bytes: u64,
    /// Most dirty bytes before writers are throttled.
    pub dirty_limit_bytes: u64,
    /// Per-block or per-folio dirty tracking.
    pub dirty_tracking: DirtyTracking,
    /// Most bytes read ahead on sequential reads.
    pub readahead_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            folio_bytes: 64 << 10,
            budget_bytes: 256 << 20,
            dirty_limit_bytes: 64 << 20,
            dirty_tracking: DirtyTracking::Block,
            readahead_bytes: 2 << 20,
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
        if self.dirty_limit_bytes < u64::from(f) || self.budget_bytes < 2 * self.dirty_limit_bytes {
            return Err(
                "the memory budget must be at least twice the dirty limit, which must hold a folio"
                    .into(),
            );
        }
        Ok(())
    }
}

/// One cached folio.
#[derive(Debug)]
pub struct Folio {
    /// Folio number within the file (`pos / folio_bytes`).
    pub index: u64,
    /// The cached bytes.
    pub data: Box<[u8]>,
    /// Per-block state.
    pub state: FolioState,
    /// Blocks of this folio are being written back.
    pub writeback: bool,
    /// Logical clock of the last use (eviction picks the oldest).
    pub last_use: u64,
}

/// A folio and the condition variable its writeback completion signals.
#[derive(Debug)]
pub struct FolioCell {
    folio: Mutex<Folio>,
    wb_done: Condvar,
}

impl FolioCell {
    /// Locks the folio.
    pub fn lock(&self) -> MutexGuard<'_, Folio> {
        self.folio.lock()
    }

    /// Locks the folio once no writeback is in flight on it.
    pub fn lock_idle(&self) -> MutexGuard<'_, Folio> {
        let mut g = self.folio.lock();
        while g.writeback {
            self.wb_done.wait(&mut g);
        }
        g
    }

    /// Ends writeback on the folio and wakes its waiters.
    pub fn end_writeback(&self) {
        self.folio.lock().writeback = false;
        self.wb_done.notify_all();
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
    folios: RwLock<BTreeMap<u64, Arc<FolioCell>>>,
    /// End of the last read, for sequential readahead detection.
    pub next_read: AtomicU64,
    wb_err: Mutex<ErrSeq>,
}

impl FileCache {
    /// The folio at `index`, if cached.
    #[must_use]
    pub fn get(&self, index: u64) -> Option<Arc<FolioCell>> {
        self.folios.read().get(&index).cloned()
    }

    /// Cached folios with index in `[first, last]`, ascending.
    #[must_use]
    pub fn range(&self, first: u64, last: u64) -> Vec<Arc<FolioCell>> {
        if first > last {
            return Vec::new();
        }
        self.folios
            .read()
            .range(first..=last)
            .map(|(_, f)| Arc::clone(f))
            .collect()
    }

    /// True if the block holding byte `pos` is cached dirty.
    #[must_use]
    pub fn block_dirty(&self, cache: &PageCache, pos: u64) -> bool {
        let fb = u64::from(cache.config().folio_bytes);
        let Some(cell) = self.get(pos / fb) else {
            return false;
        };
        let g = cell.lock();
        g.state
            .is_dirty(((pos % fb) / u64::from(cache.block_size())) as u32)
    }

    /// True if any cached block starting below `end` is dirty.
    #[must_use]
    pub fn has_dirty_below(&self, cache: &PageCache, end: u64) -> bool {
        let fb = u64::from(cache.config().folio_bytes);
        let bs = u64::from(cache.block_size());
        let folios: Vec<Arc<FolioCell>> = self
            .folios
            .read()
            .range(..end.div_ceil(fb).max(1))
            .map(|(_, c)| Arc::clone(c))
            .collect();
        folios.iter().any(|c| {
            let g = c.lock();
            g.state
                .dirty_runs()
                .iter()
                .any(|r| g.index * fb + u64::from(r.first) * bs < end)
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

/// Counters of the cache (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub resident_bytes: u64,
    pub dirty_bytes: u64,
    pub peak_resident_bytes: u64,
    pub evicted_folios: u64,
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
    clock: AtomicU64,
    /// Signalled when dirty bytes drop (throttled writers wait on it).
    dirty_fell: (Mutex<()>, Condvar),
    /// Data buffers of dropped folios, reused for new ones (at most 1/8 of the budget).
    /// A reused buffer holds old bytes: harmless, since no byte of a folio is read before
    /// its block is made uptodate (read, zeroed or wholly written).
    spare: Mutex<Vec<Box<[u8]>>>,
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
            clock: AtomicU64::new(0),
            dirty_fell: (Mutex::new(()), Condvar::new()),
            spare: Mutex::new(Vec::new()),
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

    /// Blocks per folio.
    #[must_use]
    pub fn blocks_per_folio(&self) -> u32 {
        self.cfg.folio_bytes / self.block_size
    }

    /// The cache of file `key`, created empty if needed.
    pub fn file(&self, key: u64) -> Arc<FileCache> {
        Arc::clone(self.files.lock().entry(key).or_insert_with(|| {
            Arc::new(FileCache {
                key,
                folios: RwLock::new(BTreeMap::new()),
                next_read: AtomicU64::new(u64::MAX),
                wb_err: Mutex::new(ErrSeq::default()),
            })
        }))
    }

    /// The cache of file `key` if it has one.
    #[must_use]
    pub fn existing(&self, key: u64) -> Option<Arc<FileCache>> {
        self.files.lock().get(&key).cloned()
    }

    /// Files with dirty folios.
    #[must_use]
    pub fn dirty_files(&self) -> Vec<Arc<FileCache>> {
        let files: Vec<Arc<FileCache>> = self.files.lock().values().cloned().collect();
        files
            .into_iter()
            .filter(|f| {
                f.folios.read().values().any(|c| {
                    let g = c.lock();
                    g.state.folio_dirty()
                })
            })
            .collect()
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
        }
        self.resident.fetch_sub(
            folios.len() as u64 * u64::from(self.cfg.folio_bytes),
            Ordering::Relaxed,
        );
    }

    /// The folio at `index` of `fc`, created (empty, nothing uptodate) if absent; evicts
    /// clean folios first if the budget is exceeded.
    pub fn folio(&self, fc: &FileCache, index: u64) -> Arc<FolioCell> {
        if let Some(c) = fc.get(index) {
            return c;
        }
        let size = u64::from(self.cfg.folio_bytes);
        if self.resident.load(Ordering::Relaxed) + size > self.cfg.budget_bytes {
            self.evict(size);
        }
        let mut map = fc.folios.write();
        Arc::clone(map.entry(index).or_insert_with(|| {
            let now = self.resident.fetch_add(size, Ordering::Relaxed) + size;
            self.peak.fetch_max(now, Ordering::Relaxed);
            Arc::new(FolioCell {
                folio: Mutex::new(Folio {
                    index,
                    data: self.spare.lock().pop().unwrap_or_else(|| {
                        vec![0u8; self.cfg.folio_bytes as usize].into_boxed_slice()
                    }),
                    state: FolioState::new(self.blocks_per_folio(), self.cfg.dirty_tracking),
                    writeback: false,
                    last_use: 0,
                }),
                wb_done: Condvar::new(),
            })
        }))
    }

    /// Keeps a dropped folio's buffer for reuse if the spare list has room.
    fn recycle(&self, cell: Arc<FolioCell>) {
        let Ok(cell) = Arc::try_unwrap(cell) else {
            return;
        };
        let data = cell.folio.into_inner().data;
        let mut spare = self.spare.lock();
        if (spare.len() as u64 + 1) * u64::from(self.cfg.folio_bytes) <= self.cfg.budget_bytes / 8 {
            spare.push(data);
        }
    }

    /// Stamps a folio as just used.
    pub fn touch(&self, f: &mut Folio) {
        f.last_use = self.clock.fetch_add(1, Ordering::Relaxed);
    }

    /// Evicts the least recently used clean, idle folios until `need` bytes fit the budget
    /// with a margin of 1/8 of it.
    fn evict(&self, need: u64) {
        let files: Vec<Arc<FileCache>> = self.files.lock().values().cloned().collect();
        let mut candidates: Vec<(u64, u64, Arc<FileCache>)> = Vec::new();
        for fc in &files {
            for (&idx, cell) in fc.folios.read().iter() {
                if let Some(g) = cell.folio.try_lock() {
                    if !g.writeback && !g.state.folio_dirty() {
                        candidates.push((g.last_use, idx, Arc::clone(fc)));
                    }
                }
            }
        }
        candidates.sort_by_key(|c| c.0);
        let target = self.cfg.budget_bytes - self.cfg.budget_bytes / 8;
        for (_, idx, fc) in candidates {
            if self.resident.load(Ordering::Relaxed) + need <= target {
                break;
            }
            let mut map = fc.folios.write();
            let Some(cell) = map.get(&idx) else { continue };
            let evictable = cell
                .folio
                .try_lock()
                .is_some_and(|g| !g.writeback && !g.state.folio_dirty());
            if evictable && Arc::strong_count(cell) == 1 {
                let cell = map.remove(&idx).expect("folio just looked up");
                self.resident
                    .fetch_sub(u64::from(self.cfg.folio_bytes), Ordering::Relaxed);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                self.recycle(cell);
            }
        }
    }

    /// Removes folio `index` from `fc` if it is clean and idle (after invalidation).
    pub fn drop_if_empty(&self, fc: &FileCache, index: u64) {
        let mut map = fc.folios.write();
        let Some(cell) = map.get(&index) else { return };
        let empty = cell.folio.try_lock().is_some_and(|g| {
            !g.writeback
                && !g.state.folio_dirty()
                && !(0..g.state.blocks()).any(|b| g.state.is_uptodate(b))
        });
        if empty && Arc::strong_count(cell) == 1 {
            let cell = map.remove(&index).expect("folio just looked up");
            self.resident
                .fetch_sub(u64::from(self.cfg.folio_bytes), Ordering::Relaxed);
            self.recycle(cell);
        }
    }

    /// Drops the clean, idle folios with index in `[first, last]` (after a direct write:
    /// cached copies of the old bytes must go; dirty ones are left alone, they belong to
    /// a concurrent buffered writer and will be written back).
    pub fn drop_clean(&self, fc: &FileCache, first: u64, last: u64) {
        let mut map = fc.folios.write();
        let idle: Vec<u64> = map
            .range(first..=last)
            .filter(|(_, c)| {
                Arc::strong_count(c) == 1
                    && c.folio
                        .try_lock()
                        .is_some_and(|g| !g.writeback && !g.state.folio_dirty())
            })
            .map(|(&i, _)| i)
            .collect();
        for i in idle {
            if let Some(cell) = map.remove(&i) {
                self.resident
                    .fetch_sub(u64::from(self.cfg.folio_bytes), Ordering::Relaxed);
                self.recycle(cell);
            }
        }
    }

    /// Accounts `blocks` newly dirty blocks.
    pub fn add_dirty_blocks(&self, blocks: u32) {
        self.dirty.fetch_add(
            u64::from(blocks) * u64::from(self.block_size),
            Ordering::Relaxed,
        );
    }

    /// Accounts `blocks` blocks that stopped being dirty.
    pub fn sub_dirty_blocks(&self, blocks: u32) {
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
        CacheStats {
            resident_bytes: self.resident.load(Ordering::Relaxed),
            dirty_bytes: self.dirty.load(Ordering::Relaxed),
            peak_resident_bytes: self.peak.load(Ordering::Relaxed),
            evicted_folios: self.evicted.load(Ordering::Relaxed),
        }
    }
}

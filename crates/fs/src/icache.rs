//! The in-core inode table: one object per inode the mount is using (as XFS's `xfs_inode`
//! or the VFS's `struct inode`), holding every piece of per-inode runtime state, looked up
//! in one table, with an explicit lifetime (`docs/design/cache.md`, "In-core inodes").
//!
//! The decoded on-disk inode (attributes, extent maps) is in the metadata core's
//! `MetaView` (`metaview.rs`), which keeps it in core while this table pins it; an
//! [`InCoreInode`] holds only what the mount adds to it: open handles, the journal
//! sequences `fsync` must make durable, the mapping generation, delayed allocations, the
//! in-core size, idle-trim and lazy-atime state, the error sequence inode-based `fsync`
//! has seen, and (in [`InodeIo`], shared with paths that run without the metadata lock)
//! the inode I/O lock, the in-flight direct-I/O count and the page-cache handle.
//!
//! Lifetime: created on first use ([`InodeTable::entry`]); evicted by a sweep
//! ([`InodeTable::sweep`]) once it is unreferenced and clean (see
//! [`InCoreInode::reclaimable`]); removed at once when the inode is freed. The sweep runs
//! when the table has doubled since the last one, so its cost is amortised O(1) per
//! inode created and the table holds at most twice the pinned inodes (at least
//! [`SWEEP_MIN`]).
//!
//! An evicted inode's journal sequences are folded into a floor that every inode created
//! afterwards starts from, so `fsync` of an inode whose in-core state was evicted before
//! its last change was durable still commits (conservatively: up to the floor).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::RwLock;
use stripefs_core::idhash::IdMap;
use stripefs_core::inode::Timespec;
use stripefs_core::Ino;
use stripefs_iomap::cache::{FileCache, PageCache};
use stripefs_iomap::direct::DioCount;

use crate::clock::StampSeen;
use crate::delalloc::DelallocMap;

/// The table is swept when it holds more than this many inodes and has doubled since the
/// last sweep.
pub(crate) const SWEEP_MIN: usize = 1024;

/// The part of an in-core inode that paths use without the metadata lock: the inode lock
/// (shared or exclusive), the count of direct I/Os in flight, which exclusive operations
/// drain (`dio.drain()`, `inode_dio_wait`), and the file's page cache. Holding an
/// `Arc<InodeIo>` references (pins) the in-core inode.
#[derive(Debug)]
pub(crate) struct InodeIo {
    ino: Ino,
    lock: RwLock<()>,
    pub dio: DioCount,
    /// The file's page cache, created on first use. While the in-core inode exists, the
    /// page cache's index holds this same `FileCache` under the inode's number; both go
    /// when the inode is evicted or freed.
    cache: OnceLock<Arc<FileCache>>,
    /// Set when a data change stamped the times, cleared when the attributes are
    /// returned to anyone (`clock::data_stamp`): whether the next write may keep them.
    stamp_unseen: AtomicBool,
}

impl InodeIo {
    fn new(ino: Ino) -> Self {
        Self {
            ino,
            lock: RwLock::new(()),
            dio: DioCount::default(),
            cache: OnceLock::new(),
            stamp_unseen: AtomicBool::new(false),
        }
    }

    /// Whether the times may have been seen since the last data-change stamp.
    pub fn stamp_seen(&self) -> StampSeen {
        if self.stamp_unseen.load(Ordering::Acquire) {
            StampSeen::No
        } else {
            StampSeen::Maybe
        }
    }

    /// A data change stamped the times just now.
    pub fn stamped(&self) {
        self.stamp_unseen.store(true, Ordering::Release);
    }

    /// The attributes are being returned: the next data change must show.
    pub fn times_seen(&self) {
        self.stamp_unseen.store(false, Ordering::Release);
    }

    /// The inode lock, shared.
    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.lock.read()
    }

    /// The inode lock, exclusive.
    pub fn write(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.lock.write()
    }

    /// The inode lock, exclusive, if free now.
    pub fn try_write(&self) -> Option<parking_lot::RwLockWriteGuard<'_, ()>> {
        self.lock.try_write()
    }

    /// The file's page cache (created empty on first use).
    pub fn file_cache(&self, pc: &PageCache) -> Arc<FileCache> {
        Arc::clone(self.cache.get_or_init(|| pc.file(self.ino.0)))
    }

    /// Whether the page cache pins the inode: folios cached (clean ones included: their
    /// data would be lost with the inode), someone else holding the `FileCache`, or a
    /// writeback error inode-based `fsync` has not reported yet (`anon_seen`).
    fn cache_pins(&self, anon_seen: u64) -> bool {
        self.cache.get().is_some_and(|fc| {
            // The page cache's index and this inode hold it; anything more is a user.
            Arc::strong_count(fc) > 2 || !fc.is_empty() || fc.err_seq() != anon_seen
        })
    }
}

/// What a sweep of the table did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    pub evicted: usize,
    pub kept: usize,
}

/// One inode's runtime state (protected by the metadata lock, except `io`).
#[derive(Debug)]
pub(crate) struct InCoreInode {
    /// Lock, in-flight direct I/O and page cache; shared with lock-free paths.
    pub io: Arc<InodeIo>,
    /// Open handles (an unlinked inode lives while this is non-zero).
    pub open: u32,
    /// Last transaction that changed the inode (`fsync` needs it durable).
    pub meta_seq: u64,
    /// Last transaction that changed what `fdatasync` must persist (size, extents).
    pub data_seq: u64,
    /// Mapping generation, changed by every extent change: the validity cookie carried
    /// by mappings (`Iomap::seq`). Values come from one counter per table, so an inode
    /// evicted and created again never repeats one.
    pub map_gen: u64,
    /// Delayed allocations, one map per stripe object (empty: none).
    pub delalloc: Vec<DelallocMap>,
    /// In-core size, when buffered writes not yet written back put it ahead of the
    /// on-disk size.
    pub isize: Option<u64>,
    /// Last buffered write (idle detection for trimming speculative preallocation).
    pub last_write: Option<Instant>,
    /// Access time kept in memory under `lazytime` (see `atime.rs`).
    pub lazy_atime: Option<Timespec>,
    /// Writeback-error sequence seen by inode-based `fsync` calls (no handle).
    pub anon_seen: u64,
}

impl InCoreInode {
    fn new(ino: Ino, seq_floor: u64, map_gen: u64) -> Self {
        Self {
            io: Arc::new(InodeIo::new(ino)),
            open: 0,
            meta_seq: seq_floor,
            data_seq: seq_floor,
            map_gen,
            delalloc: Vec::new(),
            isize: None,
            last_write: None,
            lazy_atime: None,
            anon_seen: 0,
        }
    }

    /// Delayed-allocation blocks in all objects.
    pub fn delalloc_blocks(&self) -> u64 {
        self.delalloc.iter().map(DelallocMap::total).sum()
    }

    /// Unreferenced (no handle, no `Arc<InodeIo>` beyond the table's: no I/O, lock holder
    /// or direct I/O in flight) and clean (nothing cached, no delayed allocation, no
    /// in-core size ahead of the disk, no preallocation awaiting its idle trim, no lazily
    /// kept access time, no unreported writeback error). Journal sequences do not pin:
    /// eviction folds them into the table's floor.
    pub fn reclaimable(&self) -> bool {
        self.pinned_except_atime() == Pin::None && self.lazy_atime.is_none()
    }

    fn pinned_except_atime(&self) -> Pin {
        if self.open > 0 || Arc::strong_count(&self.io) > 1 {
            return Pin::Referenced;
        }
        let dirty = self.delalloc_blocks() > 0
            || self.isize.is_some()
            || self.last_write.is_some()
            || self.io.cache_pins(self.anon_seen);
        if dirty {
            Pin::Dirty
        } else {
            Pin::None
        }
    }
}

/// Why an inode cannot be evicted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pin {
    None,
    Referenced,
    Dirty,
}

/// The in-core inodes of a mount (protected by the metadata lock).
#[derive(Debug)]
pub(crate) struct InodeTable {
    map: IdMap<Ino, InCoreInode>,
    /// The highest journal sequence of any inode evicted: inodes created later start
    /// with it as their sequences, so `fsync` never skips a commit an evicted inode
    /// needed.
    seq_floor: u64,
    /// Mapping generations handed out.
    gens: u64,
    /// Sweep when the table holds more than this.
    sweep_at: usize,
    /// Most inodes the table held at once, and inodes evicted, since mount.
    peak: usize,
    evicted: u64,
}

impl Default for InodeTable {
    fn default() -> Self {
        Self {
            map: IdMap::default(),
            seq_floor: 0,
            gens: 0,
            sweep_at: SWEEP_MIN,
            peak: 0,
            evicted: 0,
        }
    }
}

impl InodeTable {
    /// The in-core inode of `ino`, if it has one.
    pub fn get(&self, ino: Ino) -> Option<&InCoreInode> {
        self.map.get(&ino)
    }

    /// The in-core inode of `ino`, if it has one, to change.
    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut InCoreInode> {
        self.map.get_mut(&ino)
    }

    /// The in-core inode of `ino`, created if it has none (journal sequences at the floor,
    /// a fresh mapping generation).
    pub fn entry(&mut self, ino: Ino) -> &mut InCoreInode {
        if !self.map.contains_key(&ino) {
            self.gens += 1;
            self.map
                .insert(ino, InCoreInode::new(ino, self.seq_floor, self.gens));
            self.peak = self.peak.max(self.map.len());
        }
        self.map.get_mut(&ino).expect("just inserted")
    }

    /// Changes `ino`'s mapping generation (its extents changed).
    pub fn bump_map_gen(&mut self, ino: Ino) {
        self.gens += 1;
        let g = self.gens;
        self.entry(ino).map_gen = g;
    }

    /// Removes `ino`'s in-core inode (the inode was freed; its page cache is dropped by
    /// the caller, outside the metadata lock).
    pub fn remove(&mut self, ino: Ino) -> Option<InCoreInode> {
        self.map.remove(&ino)
    }

    /// Every in-core inode.
    pub fn iter(&self) -> impl Iterator<Item = (Ino, &InCoreInode)> {
        self.map.iter().map(|(&i, c)| (i, c))
    }

    /// In-core inodes now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Most in-core inodes at once since mount.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// In-core inodes evicted since mount.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Whether the table has grown enough since the last sweep to sweep again.
    pub fn sweep_due(&self) -> bool {
        self.map.len() > self.sweep_at
    }

    /// Unreferenced inodes whose only pin is a lazily kept access time (the sweep logs
    /// it first, as Linux writes a `lazytime` inode at eviction).
    pub fn pinned_by_atime_only(&self) -> Vec<Ino> {
        self.map
            .iter()
            .filter(|(_, c)| c.lazy_atime.is_some() && c.pinned_except_atime() == Pin::None)
            .map(|(&i, _)| i)
            .collect()
    }

    /// Evicts every reclaimable inode, folding its journal sequences into the floor and
    /// dropping its (empty) page cache from `pc`'s index; the next sweep is due when the
    /// table has doubled from what remains.
    pub fn sweep(&mut self, pc: &PageCache) -> Swept {
        let before = self.map.len();
        let mut floor = self.seq_floor;
        self.map.retain(|&ino, c| {
            if !c.reclaimable() {
                return true;
            }
            debug_assert!(
                c.io.dio.is_idle(),
                "evicting inode {ino} with direct I/O in flight"
            );
            floor = floor.max(c.meta_seq).max(c.data_seq);
            if c.io.cache.get().is_some() {
                pc.forget(ino.0);
            }
            false
        });
        self.seq_floor = floor;
        let kept = self.map.len();
        self.evicted += (before - kept) as u64;
        self.sweep_at = SWEEP_MIN.max(2 * kept);
        Swept {
            evicted: before - kept,
            kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripefs_iomap::cache::CacheConfig;

    fn pc() -> PageCache {
        PageCache::new(CacheConfig::default(), 4096)
    }

    #[test]
    fn eviction_folds_sequences_into_the_floor() {
        let pc = pc();
        let mut t = InodeTable::default();
        t.entry(Ino(5)).meta_seq = 7;
        t.entry(Ino(6)).data_seq = 9;
        assert_eq!(t.sweep(&pc).evicted, 2);
        let c = t.entry(Ino(5));
        assert_eq!((c.meta_seq, c.data_seq), (9, 9));
    }

    #[test]
    fn pinned_inodes_stay() {
        let pc = pc();
        let mut t = InodeTable::default();
        t.entry(Ino(1)).open = 1;
        t.entry(Ino(2)).isize = Some(10);
        let held = Arc::clone(&t.entry(Ino(3)).io);
        t.entry(Ino(4)).lazy_atime = Some(Timespec { sec: 1, nsec: 0 });
        let fc = t.entry(Ino(5)).io.file_cache(&pc);
        fc.record_error(5);
        t.entry(Ino(6)).last_write = Some(Instant::now());
        t.entry(Ino(7));
        assert_eq!(t.pinned_by_atime_only(), vec![Ino(4)]);
        assert_eq!(
            t.sweep(&pc),
            Swept {
                evicted: 1,
                kept: 6
            }
        );
        drop(held);
        drop(fc);
        t.get_mut(Ino(5)).unwrap().anon_seen = 1;
        assert_eq!(t.sweep(&pc).evicted, 2);
        assert!(
            pc.existing(5).is_none(),
            "an evicted inode's cache index entry goes"
        );
    }

    #[test]
    fn map_generations_never_repeat_across_eviction() {
        let pc = pc();
        let mut t = InodeTable::default();
        t.bump_map_gen(Ino(9));
        let before = t.entry(Ino(9)).map_gen;
        t.sweep(&pc);
        assert_ne!(t.entry(Ino(9)).map_gen, before);
    }

    #[test]
    fn the_table_stays_within_twice_what_is_pinned() {
        let pc = pc();
        let mut t = InodeTable::default();
        for i in 0..100_000u64 {
            t.entry(Ino(i + 1));
            if t.sweep_due() {
                t.sweep(&pc);
            }
        }
        assert!(t.peak() <= SWEEP_MIN + 1, "peak {}", t.peak());
    }

    /// What one in-core inode costs: the table slot, its `InodeIo` allocation and, once
    /// created, its `FileCache` and the page cache's index slot. Printed for the record;
    /// the bound keeps a million-entry regression visible.
    #[test]
    fn an_in_core_inode_is_small() {
        use std::mem::size_of;
        let arc = 2 * size_of::<usize>();
        let slot = size_of::<(Ino, InCoreInode)>() + 1;
        let io = arc + size_of::<InodeIo>();
        let fc = arc + size_of::<FileCache>() + size_of::<(u64, Arc<FileCache>)>() + 1;
        eprintln!(
            "in-core inode: table slot {slot} B + InodeIo {io} B (+ FileCache and index slot {fc} B once cached) = {} B",
            slot + io + fc
        );
        assert!(
            slot + io + fc <= 512,
            "{} bytes per in-core inode",
            slot + io + fc
        );
    }
}

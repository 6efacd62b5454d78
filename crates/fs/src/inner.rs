//! The shared state of a mounted file system and the rules for changing it.
//!
//! Lock order: per-inode I/O lock, then the journal's commit lock, then the metadata lock.
//! Per-inode runtime state lives in the in-core inode table (`icache.rs`), under the
//! metadata lock; its I/O part (`InodeIo`) is reached through [`FsInner::io_lock`].
//! The metadata lock is never held across I/O (the btrfs NOCOW lesson, I-001-2): paths look
//! up or allocate under it, drop it, do their I/O, and take it again to record the result.
//! Exceptions, metadata page misses only: an inode miss outside `FsInner::meta_with`, and
//! a reference-count lookup that misses a page of the `refcount` tree (decision 88).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use stripefs_core::alloc::Allocator;
use stripefs_core::geometry::Geometry;
use stripefs_core::idhash::IdMap;
use stripefs_core::record::Record;
use stripefs_core::Ino;
use stripefs_target::{
    BufPool, FaultInjector, FaultPoint, OpKind, TargetError, TargetErrorKind, TargetSet,
};

use crate::dirty::DirtyTargets;
use crate::error::{FsError, Result};
use crate::icache::{InCoreInode, InodeIo, InodeTable, Swept};
use crate::journal::Journal;
use crate::metaview::Placed;
use crate::types::DirCookie;

/// The running transaction: records applied in memory, not yet in the journal.
#[derive(Debug, Default)]
pub(crate) struct Txn {
    pub seq: u64,
    pub records: Vec<Record>,
    pub bytes: usize,
    /// Index of the first `InodeSet` per inode, which later ones overwrite in place: a
    /// transaction is atomic, so only its final attributes matter, and rewriting in place
    /// keeps the record before anything that needs the inode to exist.
    inode_set_at: IdMap<Ino, usize>,
}

impl Txn {
    pub fn new(seq: u64) -> Self {
        Self {
            seq,
            ..Self::default()
        }
    }
}

/// Everything protected by the metadata lock.
#[derive(Debug)]
pub(crate) struct MetaCore {
    /// The decoded inodes in core, read from the trees on a miss (`metaview.rs`).
    pub state: crate::metaview::MetaView,
    pub alloc: Allocator,
    /// The count changes of `RefcountSet` records the trees do not hold yet
    /// (`refcount.rs`): lookups answer from it where it holds a block, else from the
    /// `refcount` tree. Never the whole index.
    pub refs: Arc<crate::refcount::RefcountOverlay>,
    /// The checksum changes the trees do not hold yet (`csum.rs`; its own lock, shared
    /// with [`FsInner::csum_overlay`] for readers that do not take this one).
    pub csums: Arc<crate::csum::CsumOverlay>,
    /// Per target: reference-count or checksum changes logged so far (every
    /// `RefcountSet`, `CsumSet`, `CsumClear`). The in-place decision reads it before it
    /// drops this lock for its checks and compares it after taking it again
    /// (`nocow.rs`): equal, no count or checksum of that target changed meanwhile.
    pub ref_changes: Vec<u64>,
    pub txn: Txn,
    /// Next first-target for new files, so that files spread over the targets.
    pub rotor: u32,
    /// The in-core inodes: every piece of per-inode runtime state (`icache.rs`).
    pub inodes: InodeTable,
    /// Freed inodes whose page cache is still to be dropped (outside this lock: folio
    /// locks come before the metadata lock), with the blocks they held.
    pub dead: Vec<DeadInode>,
    /// The last transaction the checkpointer applied to the trees (shared with the
    /// journal): an in-core inode changed after it cannot leave core.
    pub applied: Arc<std::sync::atomic::AtomicU64>,
    /// The highest durable transaction (shared with the journal). Applied is not always
    /// durable: a transaction larger than the journal is committed by a checkpoint, which
    /// applies it (and publishes `applied`) before its root record is written.
    pub committed: Arc<std::sync::atomic::AtomicU64>,
}

/// A freed inode on its way out: its blocks stay out of the free map until its page cache
/// is gone, which waits for every writeback write of it still in flight or plugged, so a
/// late write never lands on blocks another file was given (`cache.md`, "Freeing a dead
/// inode's blocks").
#[derive(Debug)]
pub(crate) struct DeadInode {
    pub ino: Ino,
    /// The transaction that unmapped the blocks: they are reusable once it is durable too.
    pub seq: u64,
    pub blocks: Vec<Freed>,
}

/// Physical blocks an unmapped object range held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Freed {
    pub target: stripefs_core::TargetId,
    pub phys: u64,
    pub len: u64,
}

impl MetaCore {
    /// Whether `ino` is a copy-on-write (checksummed) file; false for one that is gone.
    ///
    /// # Errors
    /// The trees' errors reading the inode.
    pub fn is_datacow(&self, ino: Ino) -> Result<bool> {
        Ok(self
            .state
            .get(ino)?
            .is_some_and(|i| stripefs_core::csum::datacow(&i.attrs)))
    }

    /// In-core size: what `stat` and reads see.
    pub fn size_of(&self, ino: Ino) -> Option<u64> {
        let disk = self.state.get(ino).ok().flatten()?.attrs.size;
        Some(self.isize_of(ino).unwrap_or(disk))
    }

    /// The in-core size of `ino` when it is ahead of the on-disk size.
    pub fn isize_of(&self, ino: Ino) -> Option<u64> {
        self.inodes.get(ino).and_then(|c| c.isize)
    }

    /// Sets (`Some`) or forgets (`None`) the in-core size of `ino`.
    pub fn set_isize(&mut self, ino: Ino, size: Option<u64>) {
        match (size, self.inodes.get_mut(ino)) {
            (Some(s), _) => self.inodes.entry(ino).isize = Some(s),
            (None, Some(c)) => c.isize = None,
            (None, None) => {}
        }
    }

    /// Open handles of `ino`.
    pub fn open_count(&self, ino: Ino) -> u32 {
        self.inodes.get(ino).map_or(0, |c| c.open)
    }

    /// The delalloc map of `ino`'s object `object`.
    pub fn delalloc_mut(
        &mut self,
        ino: Ino,
        object: u32,
        objects: u32,
    ) -> &mut crate::delalloc::DelallocMap {
        let v = &mut self.inodes.entry(ino).delalloc;
        if v.is_empty() {
            *v = vec![crate::delalloc::DelallocMap::default(); objects as usize];
        }
        &mut v[object as usize]
    }

    /// The delalloc map of `ino`'s object `object`, if it has delayed allocations.
    pub fn delalloc_of(&self, ino: Ino, object: usize) -> Option<&crate::delalloc::DelallocMap> {
        self.inodes.get(ino).and_then(|c| c.delalloc.get(object))
    }

    /// Delalloc blocks of `ino` in total.
    pub fn delalloc_blocks(&self, ino: Ino) -> u64 {
        self.inodes.get(ino).map_or(0, InCoreInode::delalloc_blocks)
    }
}

impl MetaCore {
    /// Applies `rec` to the model and appends it to the running transaction.
    ///
    /// # Errors
    /// `Corrupted` if the model rejects the record (damaged metadata or a bug); the caller
    /// poisons the file system.
    pub fn log(&mut self, mut rec: Record) -> Result<()> {
        if let Record::RefcountSet { target, .. }
        | Record::CsumSet { target, .. }
        | Record::CsumClear { target, .. } = &rec
        {
            self.bump_ref_changes(*target);
        }
        if let Record::RefcountSet {
            target,
            phys,
            len,
            count,
        } = rec
        {
            self.refs.set(target, phys, len, count, self.txn.seq);
            self.txn.bytes += rec.encoded_len();
            self.txn.records.push(rec);
            return Ok(());
        }
        match &rec {
            Record::CsumSet {
                target,
                phys,
                csums,
            } => {
                self.csums.set(
                    *target,
                    *phys,
                    csums.len() as u64,
                    Some(csums),
                    self.txn.seq,
                );
            }
            Record::CsumClear { target, phys, len } => {
                self.csums.set(*target, *phys, *len, None, self.txn.seq);
            }
            _ => {}
        }
        // About blocks or targets, not inodes: nothing in core to change.
        if matches!(
            rec,
            Record::CsumSet { .. }
                | Record::CsumClear { .. }
                | Record::TargetAdd { .. }
                | Record::TargetState { .. }
        ) {
            self.txn.bytes += rec.encoded_len();
            self.txn.records.push(rec);
            return Ok(());
        }
        self.fold_lazy_atime(&mut rec);
        let needed_for_data = self.needed_to_reach_data(&rec)?;
        let seq = self.txn.seq;
        self.state.apply(&rec, seq)?;
        let ino = rec.subject().expect("only reference counts name no inode");
        self.inodes.entry(ino).meta_seq = seq;
        if let Some(i) = needed_for_data {
            self.inodes.entry(i).data_seq = seq;
        }
        if let Record::InodeSet(a) = &rec {
            // A later InodeSet replaces the transaction's earlier one in place, unless it
            // changes the layout (an empty clone destination taking its source's): the
            // extent records between them were applied with the old layout's targets.
            let at = self.txn.inode_set_at.get(&a.ino).copied();
            let same_layout = at.is_some_and(
                |at| matches!(&self.txn.records[at], Record::InodeSet(o) if o.layout == a.layout),
            );
            if let (Some(at), true) = (at, same_layout) {
                self.txn.records[at] = rec;
                return Ok(());
            }
            self.txn.inode_set_at.insert(a.ino, self.txn.records.len());
        }
        if matches!(
            rec,
            Record::ExtentSet { .. } | Record::ExtentClear { .. } | Record::InodeFree(_)
        ) {
            self.inodes.entry(ino).data_seq = seq;
            self.inodes.bump_map_gen(ino);
        }
        self.txn.bytes += rec.encoded_len();
        self.txn.records.push(rec);
        Ok(())
    }

    /// The inode whose data `rec` is needed to reach, if any: fdatasync must commit it. That
    /// is the inode's creation, a change of its size or link count, and a new name for it;
    /// permission, owner and time updates are not (the fdatasync contract).
    fn needed_to_reach_data(&self, rec: &Record) -> Result<Option<Ino>> {
        Ok(match rec {
            Record::InodeSet(a) => match self.state.get(a.ino)? {
                None => Some(a.ino),
                Some(old) => (old.attrs.size != a.size
                    || old.attrs.nlink != a.nlink
                    || old.attrs.parent != a.parent)
                    .then_some(a.ino),
            },
            Record::DirAdd { ino, .. } => Some(*ino),
            _ => None,
        })
    }

    /// Counts a reference-count or checksum change of `t` (see [`MetaCore::ref_changes`]).
    fn bump_ref_changes(&mut self, t: stripefs_core::TargetId) {
        let i = t.0 as usize;
        if self.ref_changes.len() <= i {
            self.ref_changes.resize(i + 1, 0);
        }
        self.ref_changes[i] += 1;
    }

    /// Reference-count or checksum changes of `t` logged so far.
    pub fn ref_changes_of(&self, t: stripefs_core::TargetId) -> u64 {
        self.ref_changes.get(t.0 as usize).copied().unwrap_or(0)
    }

    /// Marks `ino`'s size as changed in the running transaction (fdatasync must commit).
    pub fn mark_data(&mut self, ino: Ino) {
        self.inodes.entry(ino).data_seq = self.txn.seq;
    }
}

/// Reads made without the metadata lock beyond one per inode (stale reads retried, or
/// inodes a sweep evicted again) after which [`FsInner::meta_with`] leaves the read to
/// `MetaView::get`, under the lock.
pub(crate) const MISS_RETRIES: u32 = 3;

/// The metadata lock. Its guard sweeps the in-core inodes when they pass their bound, as
/// it is released: every borrow of an inode has ended then, read paths included.
#[derive(Debug)]
pub(crate) struct MetaLock(Mutex<MetaCore>);

impl MetaLock {
    pub fn new(m: MetaCore) -> Self {
        Self(Mutex::new(m))
    }

    /// Takes the metadata lock.
    pub fn lock(&self) -> MetaGuard<'_> {
        let g = MetaGuard(self.0.lock());
        #[cfg(debug_assertions)]
        META_HELD.with(|h| h.set(h.get() + 1));
        g
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// Metadata-lock guards alive on this thread (debug builds): what
    /// [`assert_meta_unlocked`] checks.
    static META_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Debug builds: panics if this thread holds the metadata lock (I-001-2: no check that
/// may read the trees runs under it). Release builds: nothing.
///
/// # Panics
/// In debug builds, when a metadata-lock guard is alive on this thread.
pub(crate) fn assert_meta_unlocked(what: &str) {
    #[cfg(debug_assertions)]
    META_HELD.with(|h| {
        assert_eq!(
            h.get(),
            0,
            "{what} ran with the metadata lock held (I-001-2)"
        );
    });
    #[cfg(not(debug_assertions))]
    let _ = what;
}

/// The metadata lock, held.
pub(crate) struct MetaGuard<'a>(parking_lot::MutexGuard<'a, MetaCore>);

impl std::ops::Deref for MetaGuard<'_> {
    type Target = MetaCore;
    fn deref(&self) -> &MetaCore {
        &self.0
    }
}

impl std::ops::DerefMut for MetaGuard<'_> {
    fn deref_mut(&mut self) -> &mut MetaCore {
        &mut self.0
    }
}

impl Drop for MetaGuard<'_> {
    fn drop(&mut self) {
        let applied = self.0.applied.load(Ordering::Acquire);
        self.0.state.settle_overlay(applied);
        self.0.csums.drop_applied(applied);
        // A count change stays until it is durable as well as applied: decision 94 reads
        // the overlay's runs after `committed` as pending, and an oversized transaction
        // is applied before it is durable.
        let durable = self.0.committed.load(Ordering::Acquire);
        self.0.refs.drop_applied(applied.min(durable));
        if self.0.state.sweep_due() {
            self.0.sweep_view();
        }
        #[cfg(debug_assertions)]
        META_HELD.with(|h| h.set(h.get() - 1));
    }
}

impl MetaCore {
    /// Evicts in-core inodes that nothing pins: every change applied to the trees (the
    /// journal's applied transaction), and no runtime state that keeps them
    /// (`InCoreInode::reclaimable`: open handles, I/O or lock holders, cached or dirty
    /// data, delayed allocations, an in-core size, a lazily kept access time).
    pub fn sweep_view(&mut self) -> crate::metaview::ViewSwept {
        let applied = self.applied.load(Ordering::Acquire);
        let inodes = &self.inodes;
        self.state.sweep(applied, |ino| {
            inodes.get(ino).is_some_and(|c| !c.reclaimable())
        })
    }
}

/// An open handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle {
    pub ino: Ino,
    /// The writeback-error sequence this handle has been told about.
    pub seen: u64,
    pub mode: crate::types::OpenMode,
}

/// Background commit thread control.
#[derive(Debug, Default)]
pub(crate) struct BgControl {
    pub stop: Mutex<bool>,
    /// Wakes the commit thread (and everything at stop).
    pub wake: Condvar,
    /// Wakes the flusher (writers over the background threshold).
    pub flush_kick: Condvar,
    /// A kick the flusher has not yet seen: set and cleared under `stop`'s lock, so one
    /// sent while it is in a pass starts the next pass at once instead of being lost.
    pub flush_kicked: AtomicBool,
    /// A flusher thread runs: throttled writers may wait for it (`DirtyThrottle::Wait`).
    pub flusher_running: AtomicBool,
}

impl BgControl {
    /// Asks the flusher for a pass (remembered if it is in one).
    pub fn kick_flusher(&self) {
        let _stop = self.stop.lock();
        self.flush_kicked.store(true, Ordering::Relaxed);
        self.flush_kick.notify_one();
    }

    /// Waits until a kick, the tick or stop; clears the kick. Returns whether to stop.
    pub fn wait_for_flush_kick(&self, tick: Duration) -> bool {
        let mut stop = self.stop.lock();
        if !*stop && !self.flush_kicked.load(Ordering::Relaxed) {
            self.flush_kick.wait_for(&mut stop, tick);
        }
        self.flush_kicked.store(false, Ordering::Relaxed);
        *stop
    }
}

/// The shared state of a mounted file system.
#[derive(Debug)]
pub(crate) struct FsInner {
    /// The geometry as mounted; its `targets` are the members at mount. The members now
    /// are [`FsInner::targets`] ([`FsInner::target_count`]): `add-target` grows them.
    pub geo: Geometry,
    /// The members in index order; grows (never shrinks) while others read it, changed
    /// only by `Fs::add_target` with every change excluded (`docs/design/targets.md`).
    pub targets: TargetSet,
    pub meta: MetaLock,
    pub journal: Journal,
    /// The metadata trees, the persistent form of the metadata: the checkpoint applies
    /// committed records to them (`journal.rs`). Read only at mount in stage 1.
    pub store: Arc<stripefs_meta::Store>,
    /// Their page allocation, over `meta.alloc`; counts the blocks pages hold.
    pub pages: Arc<crate::metapages::MetaPages>,
    /// Targets with completed writes not yet covered by a completed flush.
    pub dirty: DirtyTargets,
    poisoned: AtomicBool,
    poison_reason: Mutex<Option<String>>,
    pub faults: Option<Arc<FaultInjector>>,
    pub bg: Arc<BgControl>,
    pub bg_thread: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub unmounted: AtomicBool,
    /// Read-write or read-only; shared by every call that changes the file system for its
    /// duration ([`FsInner::begin_change`]).
    pub access: RwLock<crate::types::Access>,
    /// Serialises switches of `access`, and a follower of the access source waits on it for
    /// a switch in progress; reentrant, as a change refused on the switching thread asks
    /// the source again.
    pub access_switch: parking_lot::ReentrantMutex<()>,
    /// Who else decides `access` ([`crate::Fs::set_access_source`]).
    pub access_source: Mutex<Option<SourceSlot>>,
    /// Recycled data buffers (bounded by [`IDLE_BUFFER_BYTES`]).
    pub bufs: BufPool,
    /// The page cache.
    pub cache: stripefs_iomap::cache::PageCache,
    /// Mount options (cache, zeroing, preallocation switches).
    pub opts: crate::options::MountOptions,
    /// Open handles by number.
    pub handles: Mutex<HashMap<u64, Handle>>,
    pub next_fh: std::sync::atomic::AtomicU64,
    /// Bytes written to targets for file data (writeback and direct writes).
    pub data_bytes_written: std::sync::atomic::AtomicU64,
    /// Bytes read from targets for file data.
    pub data_bytes_read: std::sync::atomic::AtomicU64,
    /// Multi-file writeback: groups written back, files in them, and device writes they
    /// submitted (after merging neighbours).
    pub wb_groups: std::sync::atomic::AtomicU64,
    pub wb_group_files: std::sync::atomic::AtomicU64,
    pub wb_group_writes: std::sync::atomic::AtomicU64,
    /// Bytes written to the journal and checkpoints.
    pub meta_bytes_written: std::sync::atomic::AtomicU64,
    /// Of those, bytes written by checkpoints (payload and header), and checkpoints
    /// written.
    pub ckpt_bytes_written: std::sync::atomic::AtomicU64,
    pub checkpoints: std::sync::atomic::AtomicU64,
    /// Direct writes run under the shared / exclusive inode lock, and stripe pieces they
    /// submitted.
    pub dio_shared: std::sync::atomic::AtomicU64,
    pub dio_exclusive: std::sync::atomic::AtomicU64,
    pub dio_pieces: std::sync::atomic::AtomicU64,
    pub dio_read_copied: std::sync::atomic::AtomicU64,
    /// Mapping lookups (`FileMapper::begin`) since mount: what zeroing costs is counted here.
    pub map_lookups: std::sync::atomic::AtomicU64,
    /// The checksum overlay (the same as `MetaCore::csums`), read without the metadata
    /// lock (`csum.rs`).
    pub csum_overlay: Arc<crate::csum::CsumOverlay>,
    /// The reference-count overlay (the same as `MetaCore::refs`), read without the
    /// metadata lock by the in-place decision (`nocow.rs`).
    pub ref_overlay: Arc<crate::refcount::RefcountOverlay>,
    /// The in-place decision's counters and test hook (`nocow.rs`).
    pub nocow: crate::nocow::NocowStats,
    /// Checksums of written blocks until their completion logs them.
    pub write_csums: crate::csum::WriteCsums,
    /// Checksum mismatches met by reads.
    pub csum_errors: Arc<crate::csum::CsumErrors>,
    /// Per target: read-only, and in-place writers admitted (`placement.rs`).
    pub states: crate::placement::TargetStates,
    /// File blocks moved off evacuated targets since mount (`evacuate.rs`).
    pub evacuated_blocks: std::sync::atomic::AtomicU64,
}

/// An [`crate::AccessSource`] (a closure, so without `Debug`).
#[derive(Clone)]
pub(crate) struct SourceSlot(pub crate::types::AccessSource);

impl std::fmt::Debug for SourceSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessSource")
    }
}

/// Idle I/O buffers kept for reuse.
pub(crate) const IDLE_BUFFER_BYTES: usize = 64 << 20;

impl FsInner {
    pub fn new(
        geo: Geometry,
        targets: TargetSet,
        meta: MetaCore,
        journal: Journal,
        trees: (Arc<stripefs_meta::Store>, Arc<crate::metapages::MetaPages>),
        opts: crate::options::MountOptions,
    ) -> Self {
        let faults = opts.faults.clone();
        let cache = stripefs_iomap::cache::PageCache::new(opts.cache, geo.block_size.bytes());
        let dirty = DirtyTargets::new(stripefs_core::btree::pagelog::MAX_TARGETS);
        let states =
            crate::placement::TargetStates::new(stripefs_core::btree::pagelog::MAX_TARGETS);
        let csum_overlay = Arc::clone(&meta.csums);
        let ref_overlay = Arc::clone(&meta.refs);
        Self {
            geo,
            targets,
            meta: MetaLock::new(meta),
            journal,
            store: trees.0,
            pages: trees.1,
            dirty,
            poisoned: AtomicBool::new(false),
            poison_reason: Mutex::new(None),
            faults,
            bg: Arc::new(BgControl::default()),
            bg_thread: Mutex::new(Vec::new()),
            unmounted: AtomicBool::new(false),
            access: RwLock::new(crate::types::Access::ReadWrite),
            access_switch: parking_lot::ReentrantMutex::new(()),
            access_source: Mutex::new(None),
            bufs: BufPool::new(IDLE_BUFFER_BYTES),
            cache,
            opts,
            handles: Mutex::new(HashMap::new()),
            next_fh: std::sync::atomic::AtomicU64::new(1),
            data_bytes_written: std::sync::atomic::AtomicU64::new(0),
            wb_groups: std::sync::atomic::AtomicU64::new(0),
            wb_group_files: std::sync::atomic::AtomicU64::new(0),
            wb_group_writes: std::sync::atomic::AtomicU64::new(0),
            data_bytes_read: std::sync::atomic::AtomicU64::new(0),
            meta_bytes_written: std::sync::atomic::AtomicU64::new(0),
            ckpt_bytes_written: std::sync::atomic::AtomicU64::new(0),
            checkpoints: std::sync::atomic::AtomicU64::new(0),
            dio_shared: std::sync::atomic::AtomicU64::new(0),
            dio_exclusive: std::sync::atomic::AtomicU64::new(0),
            dio_pieces: std::sync::atomic::AtomicU64::new(0),
            dio_read_copied: std::sync::atomic::AtomicU64::new(0),
            map_lookups: std::sync::atomic::AtomicU64::new(0),
            csum_overlay,
            ref_overlay,
            nocow: crate::nocow::NocowStats::default(),
            write_csums: crate::csum::WriteCsums::default(),
            csum_errors: Arc::default(),
            states,
            evacuated_blocks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The members now. Stable for a call that holds [`FsInner::begin_change`]'s guard
    /// (an add excludes every change while it publishes a member): what such a call
    /// computes from it, home targets above all, agrees from its start to its end.
    pub fn target_count(&self) -> u32 {
        self.targets.len() as u32
    }

    /// Takes the metadata lock with `inos` in core, reading each one that is not from the
    /// trees with the lock dropped, so a miss does not stall operations on other files
    /// (`metaview.rs`, "Misses without the metadata lock"; metadata.md, "Inode misses").
    /// After one read per inode plus [`MISS_RETRIES`] it returns the guard as it is, and
    /// the caller's `MetaView::get` reads what is still missing under the lock
    /// (guaranteed progress). An inode the caller
    /// finds absent later (evicted by a sweep between the fill and the return) is also
    /// read under the lock: correct, only slower.
    ///
    /// # Errors
    /// A read error that the ticket shows is not a torn read: the trees' error for an
    /// inode no record changed while it was read.
    pub fn meta_with(&self, inos: &[Ino]) -> Result<MetaGuard<'_>> {
        let mut m = self.meta.lock();
        // Reads this call may make: one per inode, plus the retries. A sweep may evict
        // an inode filled a moment ago (a bound smaller than `inos`), so successful fills
        // count too, or two inodes could evict each other forever.
        let mut reads = inos.len() as u32 + MISS_RETRIES;
        while reads > 0 {
            reads -= 1;
            // Sweep now if due, not when the guard drops below: a sweep bumps the epoch,
            // and would make the read about to start stale at once.
            if m.state.sweep_due() {
                m.sweep_view();
            }
            let Some(t) = inos.iter().find_map(|&i| m.state.miss(i)) else {
                break;
            };
            drop(m);
            let read = stripefs_meta::items::load_inode_without_entries(&self.store, t.ino);
            m = self.meta.lock();
            match read {
                Ok(read) => {
                    m.state.fill(t, read);
                }
                // A torn read of an inode that changed meanwhile may fail its checks:
                // retry it; an error of a read that nothing raced is the trees' own.
                Err(_) if !m.state.still_valid(t) => {
                    m.state.fill(t, None);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(m)
    }

    /// Up to `limit` entries of directory `dir` after cookie `after`, in cookie order
    /// (`MetaView::dir_page`), with the trees' cookie items read without the metadata
    /// lock: `m` is the lock, taken by the caller to check `dir`; it is dropped for the
    /// reads and taken again to merge the overlay, if no change of the directory left the
    /// overlay meanwhile (`MetaView::dir_ticket_valid`; metadata.md, "Directory
    /// entries"). After [`MISS_RETRIES`] stale reads the page is read under the lock.
    ///
    /// # Errors
    /// A read error that the ticket shows is not a torn read.
    pub fn dir_page<'a>(
        &'a self,
        mut m: MetaGuard<'a>,
        dir: Ino,
        after: DirCookie,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Placed)>> {
        'read: for _ in 0..MISS_RETRIES {
            let t = m.state.dir_ticket(dir);
            drop(m);
            let mut tree = Vec::new();
            let mut at = after.0;
            let mut want = limit;
            loop {
                let read = stripefs_meta::items::dir_cookies(&self.store, dir, at, want);
                m = self.meta.lock();
                if !m.state.dir_ticket_valid(t) {
                    m.state.note_stale_dir_read();
                    continue 'read;
                }
                let batch = read?;
                let exhausted = batch.len() < want;
                if let Some(last) = batch.last() {
                    at = last.cookie;
                }
                tree.extend(batch);
                let kept = m.state.dir_unchanged(dir, &tree);
                if exhausted || kept >= limit {
                    return Ok(m.state.merge_dir_page(dir, after, limit, tree));
                }
                want = (limit - kept).max(16);
                drop(m);
            }
        }
        m.state.dir_page(dir, after, limit)
    }

    /// The entry `name` of directory `dir` (`MetaView::entry`), with the trees' items
    /// read without the metadata lock when neither the overlay nor a kept answer
    /// (`MetaView::known_entry`) has the name: `m` is the
    /// lock, dropped for the read and returned taken again. The read is kept if no change
    /// of the directory left the overlay meanwhile and the overlay still does not hold the
    /// name (then no record changed it while it was read); if the overlay took the name
    /// meanwhile, it answers. After [`MISS_RETRIES`] stale reads, read under the lock.
    ///
    /// # Errors
    /// A read error that the ticket shows is not a torn read.
    pub fn dir_entry<'a>(
        &'a self,
        mut m: MetaGuard<'a>,
        dir: Ino,
        name: &[u8],
    ) -> Result<(MetaGuard<'a>, Option<Placed>)> {
        for _ in 0..MISS_RETRIES {
            if let Some(now) = m.state.known_entry(dir, name) {
                return Ok((m, now));
            }
            let t = m.state.dir_ticket(dir);
            drop(m);
            let read = stripefs_meta::items::lookup_entry(&self.store, dir, name);
            m = self.meta.lock();
            if !m.state.dir_ticket_valid(t) {
                m.state.note_stale_dir_read();
                continue;
            }
            if let Some(now) = m.state.overlay_entry(dir, name) {
                return Ok((m, now));
            }
            let e = read?.as_ref().map(Placed::of);
            m.state.keep_entry(t, name, e);
            return Ok((m, e));
        }
        let e = m.state.entry(dir, name)?;
        Ok((m, e))
    }

    /// Fails if the file system has been poisoned.
    pub fn check(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            let why = self.poison_reason.lock().clone().unwrap_or_default();
            return Err(FsError::Poisoned(why));
        }
        Ok(())
    }

    /// Admits a call that changes the file system: the returned guard is held for the
    /// call's duration, so that a switch to read-only waits for calls in flight.
    ///
    /// # Errors
    /// `ReadOnly` while read-only.
    pub fn begin_change(&self) -> Result<parking_lot::RwLockReadGuard<'_, crate::types::Access>> {
        // Recursive: public calls that change things call each other (setattr, set_len).
        let g = self.access.read_recursive();
        match *g {
            crate::types::Access::ReadWrite => Ok(g),
            crate::types::Access::ReadOnly => Err(FsError::ReadOnly),
        }
    }

    /// Whether the file system is read-only now.
    pub fn read_only(&self) -> bool {
        *self.access.read_recursive() == crate::types::Access::ReadOnly
    }

    /// Shuts the file system down: every later call fails until it is mounted again.
    pub fn poison(&self, why: &str) {
        let mut r = self.poison_reason.lock();
        if r.is_none() {
            tracing::error!(
                reason = why,
                "stripefs: shutting down after a failed metadata or flush operation"
            );
            *r = Some(why.to_string());
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// True once poisoned.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Applies and logs records under the metadata lock; a rejected record poisons.
    pub fn log_all(&self, m: &mut MetaCore, recs: Vec<Record>) -> Result<()> {
        for r in recs {
            if let Err(e) = m.log(r) {
                self.poison(&e.to_string());
                return Err(e);
            }
        }
        self.sweep_inodes_if_due(m);
        Ok(())
    }

    /// The lock, direct-I/O count and page cache of `ino`'s in-core inode (created on
    /// first use); holding it pins the in-core inode. Takes the metadata lock: never call
    /// it holding that.
    pub fn io_lock(&self, ino: Ino) -> Arc<InodeIo> {
        let mut m = self.meta.lock();
        let io = Arc::clone(&m.inodes.entry(ino).io);
        self.sweep_inodes_if_due(&mut m);
        io
    }

    /// The page cache of `ino` (through its in-core inode, which owns it). Takes the
    /// metadata lock: never call it holding that.
    pub fn file_cache(&self, ino: Ino) -> Arc<stripefs_iomap::cache::FileCache> {
        self.io_lock(ino).file_cache(&self.cache)
    }

    /// Sweeps the in-core inode table if it has doubled since the last sweep.
    pub fn sweep_inodes_if_due(&self, m: &mut MetaCore) {
        if m.inodes.sweep_due() {
            self.sweep_inodes(m);
        }
    }

    /// Evicts every unreferenced, clean in-core inode; a lazily kept access time of an
    /// otherwise evictable inode is logged first (as Linux writes a `lazytime` inode when
    /// it is evicted), unless the file system is read-only or shut down.
    pub fn sweep_inodes(&self, m: &mut MetaCore) -> Swept {
        if !self.is_poisoned() && !self.read_only() {
            for ino in m.inodes.pinned_by_atime_only() {
                let Some(i) = m.state.resident(ino) else {
                    if let Some(c) = m.inodes.get_mut(ino) {
                        c.lazy_atime = None;
                    }
                    continue;
                };
                // Logging folds the kept time in (`fold_lazy_atime`).
                let rec = Record::InodeSet(i.attrs.clone());
                if let Err(e) = m.log(rec) {
                    self.poison(&e.to_string());
                    break;
                }
            }
        }
        m.inodes.sweep(&self.cache)
    }

    /// Records that `target` has completed writes needing a flush.
    pub fn mark_dirty(&self, target: usize) {
        self.dirty.mark(target);
    }

    /// Flushes every target with completed writes no completed flush covers, all at once
    /// (none when nothing new is on any target).
    ///
    /// # Errors
    /// The first flush error (the caller decides whether it poisons).
    pub fn flush_dirty(&self) -> Result<()> {
        Ok(self.dirty.flush(&self.targets)?)
    }

    /// Bytes of the metadata reserve over every target (the checkpoint trigger keeps a
    /// checkpoint's pages under half of it; `metadata.md`, "Space"). Takes the metadata
    /// lock for a moment.
    pub fn meta_reserve_bytes(&self) -> u64 {
        let m = self.meta.lock();
        let blocks: u64 = (0..self.target_count())
            .map(stripefs_core::TargetId)
            .filter(|&t| !self.states.is_read_only(t))
            .map(|t| m.alloc.meta_reserve(t))
            .sum();
        self.geo.block_size.to_bytes(blocks)
    }

    /// Consults the fault injector at one of the journal's or the checkpoint's fault
    /// points (`crate::faults`): a fault is the I/O error of target 0, which holds both.
    pub fn metadata_fault(&self, point: FaultPoint) -> Result<()> {
        let Some(k) = self.faults.as_ref().and_then(|f| f.check(point)) else {
            return Ok(());
        };
        let kind = if k.errno() == libc::ENOSPC {
            TargetErrorKind::NoSpace
        } else {
            TargetErrorKind::Os(k.errno())
        };
        let name = self.targets[0].info().name.clone();
        Err(TargetError::new(name, OpKind::Write, 0, kind).into())
    }

    /// Where new blocks whose home target is `home` go (`placement.rs`): `home` unless it
    /// is read-only. Call under the metadata lock and allocate under the same hold.
    ///
    /// # Errors
    /// `NoSpace` when every target is read-only.
    pub fn place(&self, home: stripefs_core::TargetId) -> Result<stripefs_core::TargetId> {
        self.states.place(home, self.target_count()).ok_or_else(|| {
            FsError::NoSpace(format!(
                "no writable target for new blocks (home target {home})"
            ))
        })
    }

    /// Consults the fault injector at the allocator's fault point: whatever kind is armed,
    /// a fault means "target `target` is full".
    pub fn alloc_fault(&self, target: stripefs_core::TargetId) -> Result<()> {
        match self
            .faults
            .as_ref()
            .and_then(|f| f.check(crate::faults::ALLOC))
        {
            None => Ok(()),
            Some(_) => Err(FsError::NoSpace(format!(
                "allocation on target {target} (injected)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const TICK: Duration = Duration::from_millis(100);

    #[test]
    fn the_flusher_sleeps_for_its_tick_without_a_kick() {
        let bg = BgControl::default();
        let t = Instant::now();
        assert!(!bg.wait_for_flush_kick(TICK));
        assert!(t.elapsed() >= TICK, "it woke without a kick");
    }

    #[test]
    fn a_kick_sent_while_the_flusher_is_busy_is_not_lost() {
        let bg = BgControl::default();
        // Sent while nobody waits (the flusher is in a pass): the next wait returns at once.
        bg.kick_flusher();
        let t = Instant::now();
        assert!(!bg.wait_for_flush_kick(Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(10), "the kick was lost");
        // Seen once: the wait after it sleeps again.
        let t = Instant::now();
        assert!(!bg.wait_for_flush_kick(TICK));
        assert!(t.elapsed() >= TICK);
    }

    #[test]
    fn stop_ends_the_wait() {
        let bg = BgControl::default();
        *bg.stop.lock() = true;
        assert!(bg.wait_for_flush_kick(Duration::from_secs(30)));
    }
}

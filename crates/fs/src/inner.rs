//! The shared state of a mounted file system and the rules for changing it.
//!
//! Lock order: per-inode I/O lock, then the journal's commit lock, then the metadata lock.
//! The metadata lock is never held across I/O (the btrfs NOCOW lesson, I-001-2): paths look
//! up or allocate under it, drop it, do their I/O, and take it again to record the result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};
use stripefs_core::alloc::Allocator;
use stripefs_core::geometry::Geometry;
use stripefs_core::meta::MetaState;
use stripefs_core::record::Record;
use stripefs_core::Ino;
use stripefs_target::{
    BufPool, FaultInjector, FaultPoint, OpKind, Target, TargetError, TargetErrorKind,
};

use crate::dirty::DirtyTargets;
use crate::error::{FsError, Result};
use crate::journal::Journal;

/// The running transaction: records applied in memory, not yet in the journal.
#[derive(Debug, Default)]
pub(crate) struct Txn {
    pub seq: u64,
    pub records: Vec<Record>,
    pub bytes: usize,
    /// Index of the first `InodeSet` per inode, which later ones overwrite in place: a
    /// transaction is atomic, so only its final attributes matter, and rewriting in place
    /// keeps the record before anything that needs the inode to exist.
    inode_set_at: HashMap<Ino, usize>,
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
    pub state: MetaState,
    pub alloc: Allocator,
    pub txn: Txn,
    /// Open handles per inode (unlinked inodes live while this is non-zero).
    pub open: HashMap<Ino, u32>,
    /// Last transaction that changed each inode (fsync needs it durable).
    pub meta_seq: HashMap<Ino, u64>,
    /// Last transaction that changed what fdatasync must persist (size, extents).
    pub data_seq: HashMap<Ino, u64>,
    /// Next first-target for new files, so that files spread over the targets.
    pub rotor: u32,
    /// Mapping generation per inode, bumped by every extent change: the validity cookie
    /// carried by mappings (`Iomap::seq`).
    pub map_gen: HashMap<Ino, u64>,
    /// Delayed allocations per inode, one map per stripe object.
    pub delalloc: HashMap<Ino, Vec<crate::delalloc::DelallocMap>>,
    /// In-core size of inodes whose size in the model (the on-disk size) lags behind
    /// buffered writes not yet written back.
    pub isize: HashMap<Ino, u64>,
    /// Last buffered write per inode (idle detection for trimming preallocation).
    pub last_write: HashMap<Ino, std::time::Instant>,
    /// Freed inodes whose page cache is still to be dropped (outside this lock: folio
    /// locks come before the metadata lock).
    pub dead: Vec<Ino>,
    /// Access times kept in memory under `lazytime` (see `atime.rs`).
    pub lazy_atime: HashMap<Ino, stripefs_core::inode::Timespec>,
}

impl MetaCore {
    /// In-core size: what `stat` and reads see.
    pub fn size_of(&self, ino: Ino) -> Option<u64> {
        let disk = self.state.get(ino)?.attrs.size;
        Some(self.isize.get(&ino).copied().unwrap_or(disk))
    }

    /// The delalloc map of `ino`'s object `object`.
    pub fn delalloc_mut(
        &mut self,
        ino: Ino,
        object: u32,
        objects: u32,
    ) -> &mut crate::delalloc::DelallocMap {
        let v = self
            .delalloc
            .entry(ino)
            .or_insert_with(|| vec![crate::delalloc::DelallocMap::default(); objects as usize]);
        &mut v[object as usize]
    }

    /// Delalloc blocks of `ino` in total.
    pub fn delalloc_blocks(&self, ino: Ino) -> u64 {
        self.delalloc.get(&ino).map_or(0, |v| {
            v.iter().map(crate::delalloc::DelallocMap::total).sum()
        })
    }
}

impl MetaCore {
    /// Applies `rec` to the model and appends it to the running transaction.
    ///
    /// # Errors
    /// `Corrupted` if the model rejects the record (damaged metadata or a bug); the caller
    /// poisons the file system.
    pub fn log(&mut self, mut rec: Record) -> Result<(), stripefs_core::CoreError> {
        self.fold_lazy_atime(&mut rec);
        let needed_for_data = self.needed_to_reach_data(&rec);
        self.state.apply(&rec)?;
        let ino = rec.subject();
        self.meta_seq.insert(ino, self.txn.seq);
        if let Some(i) = needed_for_data {
            self.data_seq.insert(i, self.txn.seq);
        }
        if let Record::InodeSet(a) = &rec {
            if let Some(&at) = self.txn.inode_set_at.get(&a.ino) {
                self.txn.records[at] = rec;
                return Ok(());
            }
            self.txn.inode_set_at.insert(a.ino, self.txn.records.len());
        }
        if matches!(
            rec,
            Record::ExtentSet { .. } | Record::ExtentClear { .. } | Record::InodeFree(_)
        ) {
            self.data_seq.insert(ino, self.txn.seq);
            *self.map_gen.entry(ino).or_default() += 1;
        }
        self.txn.bytes += rec.encoded_len();
        self.txn.records.push(rec);
        Ok(())
    }

    /// The inode whose data `rec` is needed to reach, if any: fdatasync must commit it. That
    /// is the inode's creation, a change of its size or link count, and a new name for it;
    /// permission, owner and time updates are not (the fdatasync contract).
    fn needed_to_reach_data(&self, rec: &Record) -> Option<Ino> {
        match rec {
            Record::InodeSet(a) => match self.state.get(a.ino) {
                None => Some(a.ino),
                Some(old) => (old.attrs.size != a.size
                    || old.attrs.nlink != a.nlink
                    || old.attrs.parent != a.parent)
                    .then_some(a.ino),
            },
            Record::DirAdd { ino, .. } => Some(*ino),
            _ => None,
        }
    }

    /// Marks `ino`'s size as changed in the running transaction (fdatasync must commit).
    pub fn mark_data(&mut self, ino: Ino) {
        self.data_seq.insert(ino, self.txn.seq);
    }
}

/// Per-inode I/O serialisation: the inode lock (shared or exclusive) and the count of
/// direct I/Os in flight, which exclusive operations drain (`dio.drain()`,
/// `inode_dio_wait`).
#[derive(Debug, Default)]
pub(crate) struct InodeIo {
    lock: RwLock<()>,
    pub dio: stripefs_iomap::direct::DioCount,
}

impl InodeIo {
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
}

/// The shared state of a mounted file system.
#[derive(Debug)]
pub(crate) struct FsInner {
    pub geo: Geometry,
    pub targets: Vec<Arc<dyn Target>>,
    pub meta: Mutex<MetaCore>,
    pub journal: Journal,
    pub io_locks: Mutex<HashMap<Ino, Arc<InodeIo>>>,
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
    /// Error sequence seen by inode-based `fsync` calls (no handle).
    pub anon_seen: Mutex<HashMap<Ino, u64>>,
    /// Bytes written to targets for file data (writeback and direct writes).
    pub data_bytes_written: std::sync::atomic::AtomicU64,
    /// Bytes read from targets for file data.
    pub data_bytes_read: std::sync::atomic::AtomicU64,
    /// Bytes written to the journal and checkpoints.
    pub meta_bytes_written: std::sync::atomic::AtomicU64,
    /// Direct writes run under the shared / exclusive inode lock, and stripe pieces they
    /// submitted.
    pub dio_shared: std::sync::atomic::AtomicU64,
    pub dio_exclusive: std::sync::atomic::AtomicU64,
    pub dio_pieces: std::sync::atomic::AtomicU64,
    /// Mapping lookups (`FileMapper::begin`) since mount: what zeroing costs is counted here.
    pub map_lookups: std::sync::atomic::AtomicU64,
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
        targets: Vec<Arc<dyn Target>>,
        meta: MetaCore,
        journal: Journal,
        opts: crate::options::MountOptions,
    ) -> Self {
        let faults = opts.faults.clone();
        let cache = stripefs_iomap::cache::PageCache::new(opts.cache, geo.block_size.bytes());
        let dirty = DirtyTargets::new(targets.len());
        Self {
            geo,
            targets,
            meta: Mutex::new(meta),
            journal,
            io_locks: Mutex::new(HashMap::new()),
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
            anon_seen: Mutex::new(HashMap::new()),
            data_bytes_written: std::sync::atomic::AtomicU64::new(0),
            data_bytes_read: std::sync::atomic::AtomicU64::new(0),
            meta_bytes_written: std::sync::atomic::AtomicU64::new(0),
            dio_shared: std::sync::atomic::AtomicU64::new(0),
            dio_exclusive: std::sync::atomic::AtomicU64::new(0),
            dio_pieces: std::sync::atomic::AtomicU64::new(0),
            map_lookups: std::sync::atomic::AtomicU64::new(0),
        }
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
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// The I/O lock of `ino` (created on first use).
    pub fn io_lock(&self, ino: Ino) -> Arc<InodeIo> {
        Arc::clone(self.io_locks.lock().entry(ino).or_default())
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

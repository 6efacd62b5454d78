//! `Fs`: creating, mounting and unmounting a file system, and whole-file-system calls.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use stripefs_core::alloc::Allocator;
use stripefs_core::geometry::{Geometry, MkfsParams};
use stripefs_core::inode::{FileKind, InodeAttrs};
use stripefs_core::layout::StripeLayout;
use stripefs_core::record::Record;
use stripefs_core::{BlockSize, CoreError, Ino, TargetId, Uuid};
use stripefs_meta::{items, JournalMark, Store};
use stripefs_target::{IoBuf, Target, TargetSet};

use crate::error::{FsError, Result};
use crate::inner::{DeadInode, Freed, FsInner, MetaCore, Txn};
use crate::journal::{CommitMode, Journal, JournalPosition, Urge, Wake};
use crate::metapages::MetaPages;
use crate::metaview::MetaView;
use crate::options::{Checkpoints, MkfsOptions, MountOptions};
use crate::recovery;
use crate::types::{Access, AccessSource, FsStatus, SpaceAccount, StatFs, TargetStatus};

/// The largest running transaction, in encoded record bytes, before it is committed
/// (decision 84): the records are held in memory about four times larger than encoded,
/// and the commit encodes and copies them whole, so an eighth of a 64 MiB journal
/// (8 MiB) held about 50 MiB during `fsync`-free unlinks (BENCHMARKS.md, "Resident
/// memory at scale").
const TXN_LIMIT_MAX: usize = 1 << 20;

/// A mounted stripefs file system. Cloning is cheap and shares the mount.
#[derive(Debug, Clone)]
pub struct Fs {
    pub(crate) inner: Arc<FsInner>,
}

/// Bytes of the journal mkfs writes at a time.
const JOURNAL_ZERO_CHUNK: u64 = 8 << 20;

/// Writes zeros over the whole journal region (as mkfs.xfs clears its log), flushed with
/// the rest of mkfs. Recovery does not need it (a transaction is recognised by its header's
/// uuid, position and checksums, never by what surrounds it); it is for the commits: on a
/// file target whose journal is a hole, each commit's FUA write of the first lap
/// allocates blocks, and the host file system makes that write wait for a commit of its
/// own journal (hundreds of milliseconds on a busy disk: decisions.md, 81).
fn zero_journal(t0: &dyn Target, geo: &Geometry) -> Result<()> {
    let start = geo.journal_unit_offset(0);
    let len = geo.journal_bytes();
    let mut at = 0;
    while at < len {
        let n = JOURNAL_ZERO_CHUNK.min(len - at);
        t0.write_sync(start + at, IoBuf::zeroed(n as usize))?;
        at += n;
    }
    Ok(())
}

/// What mount found and did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MountReport {
    /// Journal transactions replayed.
    pub replayed_txns: u64,
    /// Records in them.
    pub replayed_records: u64,
    /// The most inodes replay held in memory at once to check the records (bounded by
    /// the in-core inode bound plus its read-ahead window, not by the journal:
    /// decisions.md, 121 and 135).
    pub replay_peak_inodes: u64,
    /// Inodes replay read from the trees for its checks (a file named again after the
    /// checks let it go is read again).
    pub replay_inode_reads: u64,
    /// Keys replay gave the store to read ahead (a key an earlier window read ahead is
    /// not given again: decisions.md, 138).
    pub replay_keys_read_ahead: u64,
    /// Unlinked-but-open inodes freed (orphans left by a crash).
    pub orphans_freed: u64,
    /// Targets given that are not members: formatted for this file system by an
    /// `add-target` that never committed (`docs/design/targets.md`), left unused.
    pub ignored_targets: Vec<String>,
}

impl Fs {
    /// Creates a new file system on `targets` (in target-index order) and returns its
    /// geometry.
    ///
    /// # Errors
    /// `Invalid` for parameters that cannot work (with the reason); target I/O errors.
    pub fn mkfs(targets: &[Arc<dyn Target>], opts: &MkfsOptions) -> Result<Geometry> {
        let sector = targets
            .iter()
            .map(|t| t.info().sector_size)
            .max()
            .unwrap_or(512);
        let block_size = BlockSize::new(opts.block_size).map_err(FsError::Invalid)?;
        let max = stripefs_core::btree::pagelog::MAX_TARGETS;
        if targets.len() > max {
            return Err(FsError::invalid(format!(
                "{} targets: at most {max} (the page log of a checkpoint holds a page count per target)",
                targets.len()
            )));
        }
        let n = u32::try_from(targets.len()).map_err(|_| FsError::invalid("too many targets"))?;
        let params = MkfsParams {
            uuid: random_uuid(),
            block_size,
            sector_size: sector,
            target_bytes: targets.iter().map(|t| t.info().size_bytes).collect(),
            stripe_unit: opts.stripe_unit,
            stripe_count: opts.stripe_count.unwrap_or(n),
            journal_bytes: opts.journal_bytes,
            mkfs_time_sec: crate::clock::time_now().sec,
        };
        let geo = Geometry::plan(&params).map_err(|e| FsError::Invalid(e.to_string()))?;
        let sb_len = 512u64.next_multiple_of(u64::from(sector)) as usize;
        for (i, t) in targets.iter().enumerate() {
            let mut buf = IoBuf::zeroed(sb_len);
            let sb = geo.superblock(TargetId(i as u32)).encode();
            buf[..sb.len()].copy_from_slice(&sb);
            t.write_sync(0, buf)?;
        }
        // A stale root record of an earlier file system must not be mistaken for one of
        // this one (the uuid check would refuse it, and with it the mount).
        let bs = geo.block_size;
        for slot in geo.root_slots {
            targets[0].write_sync(bs.to_bytes(slot), IoBuf::zeroed(bs.bytes() as usize))?;
        }
        zero_journal(targets[0].as_ref(), &geo)?;
        let pages = Arc::new(MetaPages::standalone(&geo));
        let store = Store::create(
            recovery::store_config(&geo, crate::options::MetaCacheBytes::DEFAULT),
            targets.to_vec(),
            pages as Arc<dyn stripefs_meta::PageAlloc>,
        );
        let data: Vec<(TargetId, u64, u64)> = geo
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| (TargetId(i as u32), t.data_start, t.data_blocks()))
            .collect();
        stripefs_meta::space::init(&store, &data)?;
        items::apply_record(&store, &Record::InodeSet(root_attrs()))?;
        // Generation 1: replay starts at journal unit 0 with transaction 1.
        store.checkpoint_at(JournalMark { tail: 0, seq: 1 })?;
        for t in targets {
            t.flush_sync()?;
        }
        Ok(geo)
    }

    /// Mounts the file system on `targets` (any order): loads the newest checkpoint,
    /// replays the journal, frees orphans, and writes a fresh checkpoint if it recovered
    /// anything.
    ///
    /// # Errors
    /// A clear error naming the target or structure when superblocks, checkpoint or
    /// journal fail verification, or targets are missing, duplicated or foreign.
    pub fn mount(targets: Vec<Arc<dyn Target>>, opts: MountOptions) -> Result<(Fs, MountReport)> {
        let mut l = recovery::load(targets, opts.meta_cache, opts.inode_bound())?;
        let replayed_records = l.replayed_records;
        let states = std::mem::take(&mut l.states);
        opts.cache
            .validate(l.geo.block_size.bytes())
            .map_err(FsError::Invalid)?;
        // The replayed records are in the trees (applied at load), so their free-space
        // changes are in the space tree the allocator is read from.
        let alloc = build_allocator(&l)?;
        // Mount reads no reference count: only whether there are any (one descent).
        let refs_empty = stripefs_meta::refcount::is_empty(&l.store)?;
        let counter = items::counter(&l.store)?;
        let orphans = items::orphans(&l.store)?;
        let committed = l.next_seq - 1;
        let store = Arc::new(l.store);
        // Nothing in core yet: inodes are read from the trees (which hold the replay) on
        // first use.
        let view = MetaView::new(
            Arc::clone(&store),
            counter.next_ino,
            counter.inodes,
            opts.inode_bound().0,
        );
        let pos = JournalPosition {
            head: l.head,
            tail: l.mark.tail,
            generation: store.durable_generation().0,
        };
        // The trees hold every replayed transaction (applied at load): the checkpointer
        // starts after them, and the next checkpoint's root record covers them.
        let applied = JournalMark {
            tail: l.head,
            seq: l.next_seq,
        };
        let journal = Journal::new(pos, committed, Vec::new(), applied);
        let meta = MetaCore {
            state: view,
            alloc,
            refs: Arc::new(crate::refcount::RefcountOverlay::new(!refs_empty)),
            csums: Arc::default(),
            ref_changes: Vec::new(),
            txn: Txn::new(l.next_seq),
            rotor: 0,
            inodes: crate::icache::InodeTable::default(),
            dead: Vec::new(),
            applied: journal.applied(),
            committed: journal.committed_mark(),
        };
        opts.meta_cache
            .validate(l.geo.page_size().bytes() as u64)
            .map_err(FsError::Invalid)?;
        let pages = Arc::clone(&l.pages);
        let trees = (store, l.pages);
        let members = TargetSet::new(stripefs_core::btree::pagelog::MAX_TARGETS, l.targets)
            .map_err(|e| FsError::invalid(e.to_string()))?;
        let inner = Arc::new(FsInner::new(
            l.geo,
            members,
            meta,
            journal,
            trees,
            opts.clone(),
        ));
        // Persisted states first: nothing is written before they hold (decision 106).
        for (i, s) in states.iter().enumerate() {
            let t = stripefs_core::TargetId(i as u32);
            if s.is_read_only() {
                inner.states.set_read_only(t);
            }
            if let stripefs_core::record::TargetState::Retired { .. } = s {
                inner.states.set_retired(t);
            }
        }
        pages.attach(Arc::downgrade(&inner));
        let fs = Fs { inner };
        let orphans = fs.free_orphans(&orphans)?;
        fs.reap_dead();
        if l.replayed_txns > 0 || orphans > 0 {
            match fs
                .inner
                .journal
                .commit(&fs.inner, 0, CommitMode::Checkpoint)
            {
                // Committed to the journal, but no pages for the checkpoint: mount
                // anyway (the journal still holds everything, and a full file system
                // must stay mountable so files can be read and removed).
                Err(FsError::NoSpace(why)) if !fs.inner.is_poisoned() => {
                    tracing::warn!(%why, "mounted without the recovery checkpoint");
                }
                r => r?,
            }
        }
        if opts.checkpoints == Checkpoints::Background {
            fs.start_checkpointer();
        }
        if let Some(every) = opts.commit_interval {
            fs.start_background(every);
        }
        if let Some(every) = opts.writeback_interval {
            fs.start_flusher(every);
        }
        let report = MountReport {
            replayed_txns: l.replayed_txns,
            replayed_records,
            replay_peak_inodes: l.replay_peak_inodes,
            replay_inode_reads: l.replay_inode_reads,
            replay_keys_read_ahead: l.replay_keys_read_ahead,
            orphans_freed: orphans,
            ignored_targets: l.ignored,
        };
        Ok((fs, report))
    }

    /// Frees the inodes left with link count 0 (open when the file system crashed).
    ///
    /// # Errors
    /// `Corrupted` for an orphan item naming no inode or a linked one; the free's errors.
    fn free_orphans(&self, orphans: &[Ino]) -> Result<u64> {
        let mut m = self.inner.meta.lock();
        let mut freed = 0;
        for &ino in orphans {
            if m.state.get(ino)?.is_none_or(|i| i.attrs.nlink != 0) {
                return Err(CoreError::corrupted(
                    "metadata orphan index",
                    format!("an orphan item names inode {ino}, which is missing or linked"),
                )
                .into());
            }
            if m.open_count(ino) == 0 {
                self.free_inode(&mut m, ino)?;
                freed += 1;
            }
        }
        Ok(freed)
    }

    fn start_background(&self, every: std::time::Duration) {
        let weak: Weak<FsInner> = Arc::downgrade(&self.inner);
        let bg = Arc::clone(&self.inner.bg);
        let spawned = std::thread::Builder::new()
            .name("stripefs-commit".into())
            .spawn(move || loop {
                {
                    let mut stop = bg.stop.lock();
                    if !*stop {
                        bg.wake.wait_for(&mut stop, every);
                    }
                    if *stop {
                        return;
                    }
                }
                let Some(inner) = weak.upgrade() else { return };
                if !inner.is_poisoned() {
                    let running = inner.meta.lock().txn.seq;
                    // A failure poisons the file system and is reported by the next call.
                    let _ = inner.journal.commit(&inner, running, CommitMode::Append);
                }
            });
        match spawned {
            Ok(h) => self.inner.bg_thread.lock().push(h),
            Err(e) => {
                tracing::warn!(error = %e, "no background commit thread; commits happen on fsync only")
            }
        }
    }

    fn start_flusher(&self, every: std::time::Duration) {
        let weak: Weak<FsInner> = Arc::downgrade(&self.inner);
        let bg = Arc::clone(&self.inner.bg);
        // Set before the thread starts, which clears it when it ends.
        self.inner.bg.flusher_running.store(true, Ordering::Release);
        let spawned = std::thread::Builder::new()
            .name("stripefs-flush".into())
            .spawn(move || crate::buffered::flusher(weak, bg, every));
        match spawned {
            Ok(h) => self.inner.bg_thread.lock().push(h),
            Err(e) => {
                self.inner
                    .bg
                    .flusher_running
                    .store(false, Ordering::Release);
                tracing::warn!(error = %e, "no flusher thread; writeback happens on fsync and pressure only")
            }
        }
    }

    /// The checkpointer thread (`journal.rs`): applies queued records to the metadata
    /// trees and writes checkpoints when due, outside every lock commits need. It waits on
    /// the journal's control, holding only a weak reference to the file system between
    /// checkpoints.
    fn start_checkpointer(&self) {
        let weak: Weak<FsInner> = Arc::downgrade(&self.inner);
        let ctl = self.inner.journal.control();
        let spawned = std::thread::Builder::new()
            .name("stripefs-ckpt".into())
            .spawn(move || {
                while ctl.wait() == Wake::Work {
                    let Some(inner) = weak.upgrade() else { return };
                    if !inner.is_poisoned() {
                        // A failure poisons the file system; the next call reports it.
                        let _ = inner.journal.checkpoint_now(&inner, Urge::IfDue);
                    }
                }
            });
        match spawned {
            Ok(h) => self.inner.bg_thread.lock().push(h),
            Err(e) => {
                tracing::warn!(error = %e, "no checkpointer thread; checkpoints run when the journal is full")
            }
        }
    }

    fn stop_background(&self) {
        self.inner.journal.control().stop();
        *self.inner.bg.stop.lock() = true;
        // At once, not when the flusher thread ends: writers throttled meanwhile write
        // back themselves instead of waiting for a flusher that is stopping.
        self.inner
            .bg
            .flusher_running
            .store(false, Ordering::Release);
        self.inner.bg.wake.notify_all();
        self.inner.bg.flush_kick.notify_all();
        let threads = std::mem::take(&mut *self.inner.bg_thread.lock());
        for h in threads {
            let _ = h.join();
        }
    }

    /// Commits everything, writes a checkpoint (so the next mount replays nothing) and
    /// stops background work. The `Fs` (and its clones) must not be used afterwards.
    /// Read-only, it writes nothing: the switch to read-only settled everything.
    ///
    /// # Errors
    /// The commit's error; the file system may then need recovery at the next mount.
    pub fn unmount(&self) -> Result<()> {
        self.stop_background();
        if self.inner.unmounted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.inner.check()?;
        if self.inner.read_only() {
            return Ok(());
        }
        self.settle(|m, ino| m.open_count(ino) == 0)?;
        self.inner
            .journal
            .commit(&self.inner, 0, CommitMode::Checkpoint)?;
        for t in &self.inner.targets {
            t.flush_sync()?;
        }
        Ok(())
    }

    /// Switches between read-write and read-only (`mount -o remount,ro`).
    ///
    /// To read-only: waits for changes in flight, refuses new ones with
    /// [`FsError::ReadOnly`] (`EROFS`), drains direct writes, writes back every dirty
    /// block, trims unused speculative preallocation and writes a checkpoint if anything
    /// changed since the last one; afterwards nothing is written to the targets (an
    /// unlinked file closed meanwhile stays an orphan). To read-write: accepts changes
    /// again and frees those orphans.
    ///
    /// # Errors
    /// `Poisoned`; the writeback or checkpoint error (the file system is then read-only
    /// and poisoned, as after any failed flush).
    pub fn set_access(&self, to: Access) -> Result<()> {
        let _switch = self.inner.access_switch.lock();
        self.switch_access(to)
    }

    /// [`Fs::set_access`] with the switch lock held by the caller.
    fn switch_access(&self, to: Access) -> Result<()> {
        self.inner.check()?;
        if self.inner.unmounted.load(Ordering::Acquire) {
            return Err(FsError::invalid("the file system is unmounted"));
        }
        let from = std::mem::replace(&mut *self.inner.access.write(), to);
        match (from, to) {
            (Access::ReadWrite, Access::ReadOnly) => {
                self.settle(|_, _| true)?;
                let pos = self.inner.journal.position();
                if pos.head != pos.tail || !self.inner.meta.lock().txn.records.is_empty() {
                    self.inner
                        .journal
                        .commit(&self.inner, 0, CommitMode::Checkpoint)?;
                }
                for t in &self.inner.targets {
                    t.flush_sync()?;
                }
                Ok(())
            }
            (Access::ReadOnly, Access::ReadWrite) => {
                // Files closed while read-only kept their link count 0: find them among
                // every inode (a streaming pass; the switch is rare).
                let mut orphans = Vec::new();
                self.inner.meta.lock().state.each_inode(&mut |i| {
                    if i.attrs.nlink == 0 {
                        orphans.push(i.attrs.ino);
                    }
                })?;
                let freed = self.free_orphans(&orphans)?;
                self.reap_dead();
                tracing::debug!(freed, "read-write again; orphans freed");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Read-write or read-only.
    #[must_use]
    pub fn access(&self) -> Access {
        *self.inner.access.read_recursive()
    }

    /// Lets `source` decide read-only too: [`Fs::follow_access_source`] applies what it
    /// says, and a change refused as read-only asks it first (so a change right after the
    /// front end became read-write again is not refused for lack of news).
    pub fn set_access_source(&self, source: AccessSource) {
        *self.inner.access_source.lock() = Some(crate::inner::SourceSlot(source));
    }

    /// Switches to what the access source says, if it says anything different.
    ///
    /// # Errors
    /// As [`Fs::set_access`].
    pub fn follow_access_source(&self) -> Result<()> {
        let source = self.inner.access_source.lock().clone();
        let Some(want) = source.and_then(|s| (s.0)()) else {
            return Ok(());
        };
        // The flag flips at the start of a switch; taking the switch lock first waits for
        // one in progress (another thread's), so a caller such as fsyncdir returns only
        // once the engine has settled and checkpointed.
        let _switch = self.inner.access_switch.lock();
        if want != self.access() {
            self.switch_access(want)?;
        }
        Ok(())
    }

    /// Admits a call that changes the file system (see [`FsInner::begin_change`]),
    /// following the access source when it is read-only.
    /// Before the change, commits the running transaction if it has grown past
    /// [`Fs::txn_limit`]: call it holding no lock.
    pub(crate) fn begin_change(
        &self,
    ) -> Result<parking_lot::RwLockReadGuard<'_, crate::types::Access>> {
        let g = match self.inner.begin_change() {
            Err(FsError::ReadOnly) => {
                self.follow_access_source()?;
                self.inner.begin_change()
            }
            r => r,
        }?;
        self.commit_if_large()?;
        // The apply queue holds at most a quarter of the in-core inode bound's number of
        // records: past it, this change applies a slice first (`Journal::throttle_apply`).
        let limit = crate::journal::queue_bound(self.inner.opts.inode_bound().0);
        self.inner.journal.throttle_apply(&self.inner, limit)?;
        Ok(g)
    }

    /// Refuses a change that adds metadata (a new inode, name or extended attribute) with
    /// `NoSpace` when the blocks metadata pages may still take (free and not promised
    /// to delayed allocations, the metadata reserve included) would not cover the next
    /// checkpoint's pages plus half the metadata reserve, which stays for the changes
    /// that free space (unlink, truncate, removexattr). So metadata growth meets
    /// `ENOSPC` before a checkpoint can lack pages (`docs/design/metadata.md`, "Space").
    /// The next checkpoint's pages are estimated as the trees' dirty pages plus two per
    /// record not yet applied to them (a record changes one or two items; the pages on
    /// their paths are mostly shared with other records').
    pub(crate) fn admit_metadata_growth(&self) -> Result<()> {
        if self.metadata_room().is_ok() {
            return Ok(());
        }
        // The estimate of the records not yet in the trees is coarse (most share their
        // pages): commit the running transaction and apply everything, so the trees'
        // dirty pages count exactly, and judge again.
        let seq = self.inner.meta.lock().txn.seq;
        let journal = &self.inner.journal;
        journal.commit(&self.inner, seq, CommitMode::Append)?;
        journal.checkpoint_now(&self.inner, Urge::IfDue)?;
        self.metadata_room()
    }

    /// [`Fs::admit_metadata_growth`]'s test, once.
    fn metadata_room(&self) -> Result<()> {
        let inner = &self.inner;
        let page_blocks = inner.pages.page_blocks();
        let waiting = inner.journal.queued_records() as u64;
        let (room, reserve, running) = {
            let m = inner.meta.lock();
            // Pages go to writable targets only (`placement.rs`).
            let targets = (0..inner.target_count())
                .map(TargetId)
                .filter(|&t| !inner.states.is_read_only(t));
            let room: u64 = targets
                .clone()
                .map(|t| {
                    m.alloc
                        .free_blocks(t)
                        .saturating_sub(m.alloc.reserved_blocks(t))
                })
                .sum();
            let reserve: u64 = targets.map(|t| m.alloc.meta_reserve(t)).sum();
            (room, reserve, m.txn.records.len() as u64)
        };
        // Two pages per record not in the trees yet, and the page log's pages as the
        // checkpoint sizes them (one per about 250 pages it changes).
        let more = usize::try_from(2 * (waiting + running + 1)).unwrap_or(usize::MAX / 4);
        let need = inner.store.checkpoint_pages(more) as u64 * page_blocks + reserve / 2;
        if room < need {
            return Err(FsError::NoSpace(format!(
                "no room for more metadata: {room} blocks free for metadata pages, the next \
                 checkpoint may need {} and {} stay for removals",
                need - reserve / 2,
                reserve / 2
            )));
        }
        Ok(())
    }

    /// Bytes of records past which the running transaction is committed before the next
    /// change starts: an eighth of the journal, at most [`TXN_LIMIT_MAX`]. Without it, a
    /// mount with no `fsync` and no background commit would gather everything into one
    /// transaction, whose freed blocks stay busy (unusable, for data and for the
    /// checkpoint's pages) until it commits, and which a checkpoint must then commit
    /// whole.
    fn txn_limit(&self) -> usize {
        ((self.inner.geo.journal_bytes() / 8) as usize).min(TXN_LIMIT_MAX)
    }

    /// Commits the running transaction if it is past [`Fs::txn_limit`], or if it holds
    /// half a bound's worth of records while the decoded inodes in core are past their
    /// bound (decision 84; it was a bound's worth past twice the bound): an inode the running transaction changed cannot leave core before the
    /// transaction is committed and its records applied to the trees, so a transaction
    /// of many creates kept every new inode in core (49,033 against a bound of 8,192 in
    /// `tests/scale.rs`). At most one such commit per half a bound's worth of records; the
    /// apply queue's own bound ([`Journal::throttle_apply`]) then gets the records into
    /// the trees and the next sweep evicts (`docs/design/metadata.md`, "Stage 2").
    ///
    /// [`Journal::throttle_apply`]: crate::journal::Journal::throttle_apply
    fn commit_if_large(&self) -> Result<()> {
        let seq = {
            let m = self.inner.meta.lock();
            let bound = m.state.bound();
            let pins_too_many =
                m.state.resident_count() > bound && m.txn.records.len() >= bound / 2;
            if m.txn.bytes <= self.txn_limit() && !pins_too_many {
                return Ok(());
            }
            m.txn.seq
        };
        self.inner
            .journal
            .commit(&self.inner, seq, CommitMode::Append)
    }

    /// Makes the in-memory state complete: direct writes in flight finish, dirty data is
    /// written back, the speculative preallocation of the inodes `trim` selects is
    /// trimmed, and access times kept under `lazytime` are logged. The caller commits.
    pub(crate) fn settle(&self, trim: impl Fn(&MetaCore, Ino) -> bool) -> Result<()> {
        let ios: Vec<_> = {
            let m = self.inner.meta.lock();
            m.inodes.iter().map(|(_, c)| Arc::clone(&c.io)).collect()
        };
        for io in ios {
            io.dio.drain();
        }
        self.writeback_all(stripefs_iomap::WbWait::Busy)?;
        {
            let mut m = self.inner.meta.lock();
            // Speculative preallocation pins its inode in core (`last_write`), so the
            // resident inodes are the ones that can have some.
            let files: Vec<Ino> = m
                .state
                .resident_inos()
                .into_iter()
                .filter(|&i| trim(&m, i))
                .collect();
            for ino in files {
                self.trim_prealloc(&mut m, ino)?;
            }
            self.write_lazy_atimes(&mut m, None)?;
        }
        self.reap_dead();
        Ok(())
    }

    /// Makes every completed change durable (`syncfs`).
    ///
    /// # Errors
    /// I/O errors (after which the file system is poisoned) or `Poisoned`.
    pub fn sync(&self) -> Result<()> {
        self.inner.check()?;
        let wb = self.writeback_all(stripefs_iomap::WbWait::Busy);
        let running = {
            let mut m = self.inner.meta.lock();
            self.write_lazy_atimes(&mut m, None)?;
            m.txn.seq
        };
        self.inner
            .journal
            .commit(&self.inner, running, CommitMode::Append)?;
        wb
    }

    /// Writes a checkpoint now (empties the journal).
    ///
    /// # Errors
    /// As [`Fs::sync`].
    pub fn checkpoint(&self) -> Result<()> {
        self.inner
            .journal
            .commit(&self.inner, 0, CommitMode::Checkpoint)
    }

    /// The file system's geometry as mounted: its `targets` are the members at mount
    /// (`Fs::targets` is the list now, `add_target` grows it).
    #[must_use]
    pub fn geometry(&self) -> &Geometry {
        &self.inner.geo
    }

    /// The targets in index order.
    #[must_use]
    pub fn targets(&self) -> Vec<Arc<dyn Target>> {
        self.inner.targets.to_vec()
    }

    /// True once a failed flush or metadata write shut the file system down.
    #[must_use]
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// `statfs`.
    ///
    /// # Errors
    /// `Poisoned`.
    pub fn statfs(&self) -> Result<StatFs> {
        self.inner.check()?;
        let m = self.inner.meta.lock();
        let n = self.inner.target_count();
        let blocks = (0..n).map(|t| m.alloc.data_blocks(TargetId(t))).sum();
        // Busy blocks are free: the allocator commits to reuse them (`commit_for_space`).
        // The metadata reserve is not (XFS's reserved blocks).
        // Read-only targets (being evacuated) take no new blocks: their free blocks are
        // neither free nor available to a writer; a retired target counts nothing
        // (decision 108).
        let free: Vec<u64> = (0..n)
            .map(TargetId)
            .filter(|&t| !self.inner.states.is_read_only(t))
            .map(|t| m.alloc.user_free_blocks(t))
            .collect();
        let blocks_free = free.iter().sum();
        let blocks_avail = self.default_file_blocks(&free);
        let files = m.state.count();
        // Metadata pages come from the data area: every free block could hold inodes.
        // Estimate 16 inodes per 4 KiB page of free space (an inode item with a directory
        // entry and its cookie takes roughly 250 bytes of leaf).
        let per_block = (u64::from(self.inner.geo.block_size.bytes()) / 256).max(1);
        Ok(StatFs {
            block_size: self.inner.geo.block_size.bytes(),
            blocks,
            blocks_free,
            blocks_avail,
            files,
            files_free: blocks_free * per_block,
            name_max: 255,
        })
    }

    /// The journal's head and tail now, in journal units (what [`Fs::status`] reports,
    /// without its walk of the whole metadata model).
    #[must_use]
    pub fn journal_position(&self) -> JournalPosition {
        self.inner.journal.position()
    }

    /// The journal's size in units (those of [`Fs::journal_position`]).
    #[must_use]
    pub fn journal_units(&self) -> u64 {
        self.inner.geo.journal_units()
    }

    /// The journal's size in bytes.
    #[must_use]
    pub fn journal_bytes(&self) -> u64 {
        self.inner.geo.journal_bytes()
    }

    /// Counters for `inspect` and tests.
    #[must_use]
    pub fn status(&self) -> FsStatus {
        let store = self.inner.store.stats();
        let m = self.inner.meta.lock();
        let targets = self
            .inner
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let id = TargetId(i as u32);
                TargetStatus {
                    name: t.info().name.to_string(),
                    data_blocks: m.alloc.data_blocks(id),
                    free_blocks: m.alloc.free_blocks(id),
                    free_ranges: m.alloc.free_ranges(id),
                }
            })
            .collect();
        FsStatus {
            uuid: self.inner.geo.uuid.to_string(),
            targets,
            journal: self.inner.journal.position(),
            journal_units: self.inner.geo.journal_units(),
            committed_seq: self.inner.journal.committed(),
            running_seq: m.txn.seq,
            running_records: m.txn.records.len(),
            inodes: m.state.count(),
            extents: m.state.resident_extents() as u64,
            meta_page_blocks: self.inner.pages.live_blocks_total(),
            meta_cache: store.cache,
            meta_pinned_bytes: store.pinned_bytes,
            meta_tree_levels: store.trees.iter().map(|t| (t.0, t.1)).collect(),
            journal_queued_records: self.inner.journal.queued_records(),
            busy_blocks: m.alloc.busy_blocks(),
            poisoned: self.inner.is_poisoned(),
            data_bytes_written: self.inner.data_bytes_written.load(Ordering::Relaxed),
            data_bytes_read: self.inner.data_bytes_read.load(Ordering::Relaxed),
            wb_groups: self.inner.wb_groups.load(Ordering::Relaxed),
            wb_group_files: self.inner.wb_group_files.load(Ordering::Relaxed),
            wb_group_writes: self.inner.wb_group_writes.load(Ordering::Relaxed),
            meta_bytes_written: self.inner.meta_bytes_written.load(Ordering::Relaxed),
            ckpt_bytes_written: self.inner.ckpt_bytes_written.load(Ordering::Relaxed),
            checkpoints: self.inner.checkpoints.load(Ordering::Relaxed),
            journal_full_waits: self.inner.journal.full_waits.load(Ordering::Relaxed),
            journal_full_checkpoints: self.inner.journal.full_checkpoints.load(Ordering::Relaxed),
            apply_throttled: self.inner.journal.apply_throttled.load(Ordering::Relaxed),
            meta_pinned_peak_bytes: self.inner.journal.pinned_peak.load(Ordering::Relaxed),
            cache: self.inner.cache.stats(),
            dio_shared: self.inner.dio_shared.load(Ordering::Relaxed),
            dio_exclusive: self.inner.dio_exclusive.load(Ordering::Relaxed),
            dio_pieces: self.inner.dio_pieces.load(Ordering::Relaxed),
            dio_read_copied: self.inner.dio_read_copied.load(Ordering::Relaxed),
            csum_errors: self.inner.csum_errors.count.load(Ordering::Relaxed),
            csum_overlay_runs: self.inner.csum_overlay.runs(),
            csum_pending_blocks: self.inner.write_csums.pending(),
            refcount_overlay_runs: m.refs.runs(),
            nocow_in_place: self.inner.nocow.in_place.load(Ordering::Relaxed),
            nocow_cow: self.inner.nocow.cow.load(Ordering::Relaxed),
            nocow_researches: self.inner.nocow.researches.load(Ordering::Relaxed),
            nocow_locked_fallbacks: self.inner.nocow.locked_fallbacks.load(Ordering::Relaxed),
            nocow_read_only: self.inner.nocow.read_only.load(Ordering::Relaxed),
            evacuated_blocks: self.inner.evacuated_blocks.load(Ordering::Relaxed),
            map_lookups: self.inner.map_lookups.load(Ordering::Relaxed),
            incore_inodes: m.inodes.len(),
            incore_inodes_peak: m.inodes.peak(),
            incore_inodes_evicted: m.inodes.evicted(),
            meta_inodes: m.state.resident_count(),
            meta_inodes_peak: m.state.peak(),
            meta_inode_loads: m.state.loads(),
            meta_inodes_evicted: m.state.evicted(),
            meta_inode_stale_reads: m.state.stale_reads(),
            dir_overlay_names: m.state.overlay_names(),
        }
    }

    /// Test hook: stops the background threads (commit, writeback, checkpointer) after
    /// the work in progress, so a test can then crash the targets at a quiet moment.
    #[doc(hidden)]
    pub fn debug_stop_background(&self) {
        self.stop_background();
    }

    /// Test hook: holds back `blocks` free blocks of every target for metadata pages
    /// (`Allocator::set_meta_reserve`), as the mount does once metadata pages live in the
    /// data area.
    #[doc(hidden)]
    pub fn debug_set_meta_reserve(&self, blocks: u64) {
        let mut m = self.inner.meta.lock();
        for t in 0..self.inner.target_count() {
            m.alloc.set_meta_reserve(TargetId(t), blocks);
        }
    }

    /// Test hook: sweeps the in-core inode table now (as it is swept whenever it has
    /// doubled), returning how many inodes were evicted, then the decoded inodes (as they
    /// are swept past their bound).
    #[doc(hidden)]
    pub fn debug_evict_inodes(&self) -> usize {
        let mut m = self.inner.meta.lock();
        let evicted = self.inner.sweep_inodes(&mut m).evicted;
        m.sweep_view();
        evicted
    }

    /// The space books of every target (see [`SpaceAccount`]): allocator counters next to
    /// what the extent maps and delayed allocations actually hold.
    #[must_use]
    pub fn space_accounting(&self) -> Vec<SpaceAccount> {
        let m = self.inner.meta.lock();
        self.space_books(&m)
    }

    /// [`Fs::space_accounting`] under a metadata lock the caller holds.
    pub(crate) fn space_books(&self, m: &MetaCore) -> Vec<SpaceAccount> {
        let n = self.inner.target_count();
        let mut books: Vec<SpaceAccount> = (0..n)
            .map(|t| {
                let id = TargetId(t);
                SpaceAccount {
                    target: t,
                    data_blocks: m.alloc.data_blocks(id),
                    available_blocks: m.alloc.available_blocks(id),
                    reserved_blocks: m.alloc.reserved_blocks(id),
                    meta_held_blocks: m.alloc.meta_held_blocks(id),
                    busy_blocks: m.alloc.busy_blocks_on(id),
                    meta_page_blocks: self.inner.pages.live_blocks(id),
                    dead_blocks: 0,
                    extent_blocks: 0,
                    delalloc_blocks: 0,
                }
            })
            .collect();
        for f in m.dead.iter().flat_map(|d| &d.blocks) {
            books[f.target.index()].dead_blocks += f.len;
        }
        let seen = m.state.each_inode(&mut |i| {
            for (object, map) in i.objects.iter().enumerate() {
                for (_, e) in map.iter() {
                    books[e.target.index()].extent_blocks += e.len;
                }
                if let Some(da) = m.delalloc_of(i.attrs.ino, object) {
                    for (_, len, t) in da.ranges() {
                        books[t.index()].delalloc_blocks += len;
                    }
                }
            }
        });
        if let Err(e) = seen {
            tracing::warn!(error = %e, "space books: the trees could not be read");
        }
        // A shared block is in several maps but on the target once.
        let refs = m.ref_index(n).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "space books: the refcount tree could not be read");
            stripefs_core::refcount::RefcountIndex::new()
        });
        for (t, _, e) in refs.iter() {
            let extra = e.len * u64::from(e.count - 1);
            let b = &mut books[t.index()].extent_blocks;
            *b = b.saturating_sub(extra);
        }
        books
    }

    /// Checks [`Self::space_accounting`] on every target (call with no I/O in flight).
    ///
    /// # Errors
    /// The first target whose books do not balance.
    pub fn check_space_accounting(&self) -> std::result::Result<(), String> {
        self.space_accounting()
            .iter()
            .try_for_each(SpaceAccount::check)
    }

    /// Checks that the reference-count index equals the counts every extent map derives
    /// (`docs/design/reflink.md`); reads every inode (tests and tools).
    ///
    /// # Errors
    /// The first difference, worded as fsck words it, or an inode that could not be read.
    pub fn check_refcounts(&self) -> std::result::Result<(), String> {
        let m = self.inner.meta.lock();
        let n = self.inner.target_count();
        let mut pieces = Vec::new();
        m.state
            .each_inode(&mut |i| {
                for map in &i.objects {
                    pieces.extend(map.iter().map(|(_, e)| (e.target, e.phys, e.len)));
                }
            })
            .map_err(|e| e.to_string())?;
        let derived = stripefs_core::refcount::RefcountIndex::derive(pieces);
        let refs = m.ref_index(n).map_err(|e| e.to_string())?;
        refs.first_difference(&derived).map_or(Ok(()), Err)
    }

    /// Blocks shared by two or more extents, counted once (what a clone saved).
    #[must_use]
    pub fn shared_blocks(&self) -> u64 {
        let m = self.inner.meta.lock();
        match m.ref_index(self.inner.target_count()) {
            Ok(refs) => refs.shared_blocks(),
            Err(e) => {
                tracing::warn!(error = %e, "shared blocks: the refcount tree could not be read");
                0
            }
        }
    }

    /// Blocks freed by a transaction stay busy until it is durable (see `Allocator`), so
    /// an allocation or reservation can fail while freed space waits for a commit. Callers
    /// that met `ENOSPC` call this: with busy blocks, it commits the running transaction
    /// (which makes them allocatable) and returns true, and the caller retries once, as
    /// XFS forces the log and ext4 commits the journal before reporting `ENOSPC`.
    ///
    /// # Errors
    /// The commit's error (the file system is then poisoned).
    pub(crate) fn commit_for_space(&self) -> Result<bool> {
        let seq = {
            let m = self.inner.meta.lock();
            if m.alloc.busy_blocks() == 0 {
                return Ok(false);
            }
            m.txn.seq
        };
        self.inner
            .journal
            .commit(&self.inner, seq, CommitMode::Append)?;
        Ok(true)
    }

    /// Takes blocks with `take` (`None`: none free); if none were free, commits for the
    /// busy space ([`Self::commit_for_space`]) and takes once more. `NoSpace(why())`
    /// when there are still none.
    ///
    /// # Errors
    /// `take`'s errors, the commit's, `NoSpace`.
    pub(crate) fn take_or_commit<T>(
        &self,
        take: impl Fn() -> Result<Option<T>>,
        why: impl FnOnce() -> String,
    ) -> Result<T> {
        if let Some(a) = take()? {
            return Ok(a);
        }
        if self.commit_for_space()? {
            if let Some(a) = take()? {
                return Ok(a);
            }
        }
        Err(FsError::NoSpace(why()))
    }

    /// The largest file (in blocks) the default layout can hold given `free` blocks per
    /// target, for the least favourable first target. A file of `c` objects with stripe
    /// unit `u` fills its objects a unit at a time in object order, so it holds `c * u`
    /// per full row its fullest target allows, then one unit per object in order until
    /// the first object whose target has less than a unit left, which takes what remains.
    fn default_file_blocks(&self, free: &[u64]) -> u64 {
        let g = &self.inner.geo;
        let bs = g.block_size;
        let unit = bs.block_of(u64::from(g.stripe_unit));
        let (n, c) = (free.len(), g.stripe_count as usize);
        (0..n)
            .map(|first| {
                let objects: Vec<u64> = (0..c).map(|k| free[(first + k) % n]).collect();
                let rows = objects.iter().map(|&f| f / unit).min().unwrap_or(0);
                let mut blocks = rows * unit * c as u64;
                for f in objects {
                    let left = f - rows * unit;
                    if left < unit {
                        blocks += left;
                        break;
                    }
                    blocks += unit;
                }
                blocks
            })
            .min()
            .unwrap_or(0)
    }

    /// Default layout for a new regular file.
    pub(crate) fn default_layout(&self, m: &mut MetaCore) -> StripeLayout {
        let g = &self.inner.geo;
        let first = m.rotor % self.inner.target_count();
        m.rotor = m.rotor.wrapping_add(1);
        StripeLayout {
            count: g.stripe_count,
            unit_bytes: g.stripe_unit,
            first_target: first,
        }
    }

    /// Unmaps object blocks `[from, from + len)` of `ino`'s object `object` (only extents
    /// in state `only`, if given): logs an `ExtentClear` per mapped piece, each followed
    /// by the reference-count decrements of its shared blocks, and frees the others once
    /// the running transaction commits (busy extents). The caller has waited for every
    /// writeback write of the range (its cache is gone).
    pub(crate) fn clear_object_range(
        &self,
        m: &mut MetaCore,
        ino: Ino,
        object: u32,
        range: (u64, u64),
        only: Option<stripefs_core::extent::ExtentState>,
    ) -> Result<()> {
        let seq = m.txn.seq;
        let mut recs = Vec::new();
        let pieces = self.unmap_object_range(m, ino, object, range, only, &mut recs)?;
        for f in self.log_released(m, recs.into_iter().zip(pieces).collect())? {
            m.alloc.free_after(f.target, f.phys, f.len, seq);
        }
        Ok(())
    }

    /// Logs each record that unmaps blocks, each followed at once by the decrements of the
    /// shared blocks it unmapped (`docs/design/reflink.md`): the next record, here and when
    /// the trees apply them in this order, sees the counts the previous one left (one
    /// file may map a shared block twice). Returns the blocks whose last owner let go.
    pub(crate) fn log_released(
        &self,
        m: &mut MetaCore,
        batch: Vec<(Record, Freed)>,
    ) -> Result<Vec<Freed>> {
        let mut freed = Vec::new();
        for (rec, f) in batch {
            let datacow = match rec.subject() {
                Some(ino) => m.is_datacow(ino)?,
                None => false,
            };
            self.inner.log_all(m, vec![rec])?;
            let r = self
                .inner
                .refs_ok(m.ref_release(&[(f.target, f.phys, f.len)]))?;
            self.inner.log_all(m, r.records)?;
            if datacow {
                // Freed blocks lose their checksums in the same transaction.
                self.inner
                    .log_all(m, crate::reflink::csum_clears(&r.freed))?;
            }
            freed.extend(r.freed.into_iter().map(|(target, phys, len)| Freed {
                target,
                phys,
                len,
            }));
        }
        Ok(freed)
    }

    /// Appends an `ExtentClear` per mapped piece of object blocks `[from, from + len)` of
    /// `ino`'s object `object` (only extents in state `only`, if given) to `recs`, and
    /// returns the physical blocks they held, still allocated: the caller frees them.
    fn unmap_object_range(
        &self,
        m: &MetaCore,
        ino: Ino,
        object: u32,
        (from, len): (u64, u64),
        only: Option<stripefs_core::extent::ExtentState>,
        recs: &mut Vec<Record>,
    ) -> Result<Vec<Freed>> {
        let i = m.state.get(ino)?.ok_or(FsError::Stale(ino.0))?;
        let end = from.saturating_add(len);
        let mut freed = Vec::new();
        for (s, e) in i.objects[object as usize].range(from, end - from) {
            if only.is_some_and(|st| e.state != st) {
                continue;
            }
            let block = s.max(from);
            let n = (s + e.len).min(end) - block;
            recs.push(Record::ExtentClear {
                ino,
                object,
                block,
                len: n,
            });
            freed.push(Freed {
                target: e.target,
                phys: e.phys + (block - s),
                len: n,
            });
        }
        Ok(freed)
    }

    /// Frees `ino`. Its blocks leave the free map's reach until [`Fs::reap_dead`] has
    /// dropped its page cache: a writeback write of the file may still be on its way.
    pub(crate) fn free_inode(&self, m: &mut MetaCore, ino: Ino) -> Result<()> {
        let inode = m.state.get(ino)?.ok_or(FsError::Stale(ino.0))?.clone();
        let mut batch = Vec::new();
        for object in 0..inode.objects.len() as u32 {
            let mut recs = Vec::new();
            let pieces = self.unmap_object_range(m, ino, object, (0, u64::MAX), None, &mut recs)?;
            batch.extend(recs.into_iter().zip(pieces));
        }
        // Shared blocks lose this owner; only the others are the dead inode's to free.
        let blocks = self.log_released(m, batch)?;
        self.inner.log_all(m, vec![Record::InodeFree(ino)])?;
        if let Some(c) = m.inodes.remove(ino) {
            for da in &c.delalloc {
                da.all().unreserve(&mut m.alloc);
            }
        }
        let seq = m.txn.seq;
        m.dead.push(DeadInode { ino, seq, blocks });
        Ok(())
    }

    /// Drops the page cache of freed inodes, which waits for their writeback writes, and
    /// only then hands their blocks to the allocator (call without the metadata lock).
    pub(crate) fn reap_dead(&self) {
        let dead = std::mem::take(&mut self.inner.meta.lock().dead);
        if dead.is_empty() {
            return;
        }
        for d in &dead {
            self.inner.cache.forget(d.ino.0);
        }
        let mut m = self.inner.meta.lock();
        // Read under the lock: a commit publishes its sequence before it takes this lock
        // to release its busy blocks, so a sequence not yet seen here is released later.
        let committed = self.inner.journal.committed();
        for d in dead {
            for f in d.blocks {
                if d.seq <= committed {
                    // Not before the trees hold the free for metadata pages (the space
                    // tree of the next checkpoint must show the blocks free).
                    m.alloc.free_committed(f.target, f.phys, f.len, d.seq);
                } else {
                    m.alloc.free_after(f.target, f.phys, f.len, d.seq);
                }
            }
        }
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        // The last clone of a mounted file system unmounts it (background threads hold only
        // weak references). Errors are logged: destructors never fail, and the next mount
        // recovers from the journal.
        if Arc::strong_count(&self.inner) == 1
            && !self.inner.unmounted.load(Ordering::Acquire)
            && !self.inner.is_poisoned()
        {
            if let Err(e) = self.unmount() {
                tracing::warn!(error = %e, "stripefs dropped without unmount; unmount failed");
            }
        }
    }
}

/// The free space at mount: the free runs of the space tree (the durable generation's,
/// its page log folded in, and the replayed records applied: metadata.md, "Persisted free
/// space"), so mount reads neither every extent nor every page. The metadata pages are
/// counted from the page log's counts.
///
/// # Errors
/// `Corrupted` for a free run that does not fit the data area or overlaps another; a page
/// read's error.
fn build_allocator(l: &recovery::Loaded) -> Result<Allocator> {
    let geo = &l.geo;
    let runs = stripefs_meta::space::free_runs(&l.store)?;
    let mut alloc = Allocator::from_free_runs(geo, runs)
        .map_err(|e| CoreError::corrupted("space tree", e.to_string()))?;
    // Blocks data cannot take, so a checkpoint finds room for its copy-on-write pages
    // when users filled the file system (metadata.md, "Space").
    for (t, g) in geo.targets.iter().enumerate() {
        let reserve = Allocator::meta_reserve_for(g.data_blocks(), geo.block_size);
        alloc.set_meta_reserve(TargetId(t as u32), reserve);
    }
    for (t, pages) in l.store.page_counts().into_iter().enumerate() {
        l.pages.set_live(TargetId(t as u32), pages);
    }
    Ok(alloc)
}

fn root_attrs() -> InodeAttrs {
    let now = crate::clock::time_now();
    InodeAttrs {
        ino: Ino::ROOT,
        kind: FileKind::Directory,
        perm: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        rdev: 0,
        parent: Ino::ROOT,
        layout: StripeLayout {
            count: 0,
            unit_bytes: 0,
            first_target: 0,
        },
        flags: 0,
    }
}

pub(crate) fn random_uuid() -> Uuid {
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    if !ok {
        let t = crate::clock::time_now();
        let mut r = stripefs_target::Rng::new(
            t.sec as u64 ^ u64::from(t.nsec) ^ u64::from(std::process::id()),
        );
        r.fill(&mut b);
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Uuid(b)
}

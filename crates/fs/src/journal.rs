//! Journal commit and checkpointing (the writer side; framing lives in the core crate).
//!
//! Commit protocol for transaction `s` (under the commit lock, never the metadata lock):
//! 1. take the running transaction from under the metadata lock (new records go to `s+1`);
//! 2. flush every data target with completed writes no completed flush covers, and no
//!    other (ordered data: metadata that makes data visible reaches the journal only after
//!    the data is durable); when nothing new is on any target, no flush at all;
//! 3. append the transaction at the journal head on target 0 as a FUA write (durable when
//!    it completes; two when it wraps), and queue its records for the metadata trees;
//!    when it would not fit the journal, wait for the tail to move first (below);
//! 4. publish `committed = s` and release blocks freed by `s` for reuse by data; metadata
//!    pages may take them only once `s` is also applied to the trees (below), whose space
//!    tree then shows them free (`docs/design/metadata.md`, "Persisted free space").
//!
//! Checkpoints ([`Journal::checkpoint_now`]) run outside the commit lock, normally on the
//! checkpointer thread (`Fs::start_checkpointer`), woken when the journal is half full,
//! when pacing says the journal would be full within two recent checkpoint writes at the
//! recent append rate ([`Pace`]), when the queue holds enough records to apply, or on
//! request: they take the queued transactions (in journal order), apply their records to
//! the metadata trees (`stripefs_meta::items::apply_records_with`, remembering what
//! the next transactions read: `ApplyMemo`), and when the journal is
//! half full, pacing says so, the trees' dirty pages pass half the cache budget or half
//! the metadata reserve, or a caller asks,
//! write the dirty pages and the root record naming the journal position of the last
//! applied transaction (`Store::checkpoint_at`); then the journal tail moves there. No
//! lock that commits or other operations need is held meanwhile: a commit appends while a
//! checkpoint writes (`tests/checkpoint_background.rs`). Only a commit whose transaction
//! does not fit between the head and the tail waits: for the running checkpoint, and if
//! that does not free enough, by applying the queue up to half a journal and writing a
//! checkpoint itself (`Journal::make_room`, bounded back-pressure). A
//! transaction larger than the whole journal is committed by a checkpoint (its root record
//! is the commit point). [`CommitMode::Checkpoint`] appends and then runs a checkpoint to
//! completion, waiting for it.
//!
//! So an `fsync` costs one flush per data target it wrote plus one FUA write; a
//! metadata-only one costs the FUA write alone (`tests/fsync_ops.rs` counts them).
//!
//! Concurrent `fsync` callers queue on the commit lock; whoever gets it commits everything
//! logged so far, and the others find their transaction already committed (group commit).
//! A failure in steps 2-3, or of a checkpoint (on any thread), poisons the file system:
//! the in-memory state is ahead of the disk and nothing later may pretend otherwise.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use stripefs_core::codec::Enc;
use stripefs_core::journal::{encode_txn, log_limit, txn_units};
use stripefs_core::record::Record;
use stripefs_meta::{items, JournalMark};
use stripefs_target::{Batch, IoBuf, IoOp};

use crate::error::{FsError, Result};
use crate::inner::{FsInner, Txn};
use crate::options::Checkpoints;

/// Records queued before the checkpointer is woken to apply them (so it applies in
/// batches rather than once per commit).
const APPLY_BATCH_RECORDS: usize = 4096;

/// The most records the apply queue holds before a change applies a slice itself
/// ([`Journal::throttle_apply`]), for an in-core bound of `inodes` decoded inodes: a
/// quarter of it. Queued records pin their inodes in core, so
/// a queue as long as the bound (as before) let the queue's inodes and the bound's
/// resident ones both stay: at 10 million files, where the trees apply slower than
/// files are created, 108,128 records were queued at the end of the creates, which
/// held 218-220 MiB against a goal of 192 (decisions.md, 126). At least a slice, so the
/// checkpointer's slices stay whole; never more than the bound.
pub(crate) fn queue_bound(inodes: usize) -> usize {
    (inodes / 4).max(APPLY_BATCH_RECORDS).min(inodes)
}

/// Records a checkpoint that must apply everything queued (unmount, a full journal)
/// applies between looks at the pinned pages, so their memory stays near the bound the
/// checkpointer keeps ([`Journal::memory_due`]) plus what one such slice dirties.
const DRAIN_SLICE_RECORDS: usize = 256;

/// How fast the journal fills and how long a checkpoint takes, measured as the file
/// system runs: the checkpointer writes a checkpoint when, at the recent append rate, the
/// journal would be full sooner than [`PACE_MARGIN`] times the recent checkpoint
/// duration (`docs/design/journal.md`, "Pacing").
#[derive(Debug)]
struct Pace {
    /// Journal units appended since `since`.
    units: u64,
    since: Instant,
    /// Journal units appended per second, smoothed.
    rate: f64,
    /// Seconds a checkpoint write took, smoothed.
    write_secs: f64,
}

/// How many checkpoint durations ahead of a full journal the checkpointer writes.
const PACE_MARGIN: f64 = 2.0;

/// The shortest window the append rate is measured over.
const PACE_WINDOW: Duration = Duration::from_millis(100);

impl Pace {
    fn new() -> Pace {
        Pace {
            units: 0,
            since: Instant::now(),
            rate: 0.0,
            write_secs: 0.0,
        }
    }

    fn appended(&mut self, units: u64, now: Instant) {
        self.units += units;
        let dt = now.saturating_duration_since(self.since);
        if dt >= PACE_WINDOW {
            let r = self.units as f64 / dt.as_secs_f64();
            self.rate = if self.rate == 0.0 {
                r
            } else {
                0.5 * (self.rate + r)
            };
            self.units = 0;
            self.since = now;
        }
    }

    fn wrote(&mut self, took: Duration) {
        let t = took.as_secs_f64();
        self.write_secs = if self.write_secs == 0.0 {
            t
        } else {
            0.5 * (self.write_secs + t)
        };
    }

    /// Whether a journal with `free` units before it is full must be checkpointed now.
    fn urgent(&self, free: u64) -> bool {
        pace_due(free, self.rate, self.write_secs)
    }
}

/// Whether `free` journal units last less than [`PACE_MARGIN`] checkpoint writes of
/// `write_secs` at `rate` units per second (no measurement yet: not urgent).
fn pace_due(free: u64, rate: f64, write_secs: f64) -> bool {
    rate > 0.0 && (free as f64) < rate * write_secs * PACE_MARGIN
}

/// Where the log stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalPosition {
    /// Next journal unit to write.
    pub head: u64,
    /// First journal unit still needed (where the durable root record's replay starts).
    pub tail: u64,
    /// Generation of the durable root record of the metadata trees.
    pub generation: u64,
}

/// Whether a commit may append or must write a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitMode {
    /// Append to the journal (waiting for a checkpoint only when the journal is full).
    Append,
    /// Append, then run a checkpoint to completion (unmount, sync of the trees, recovery,
    /// the switch to read-only).
    Checkpoint,
}

/// Why a checkpoint runs: whether it writes even below the thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Urge {
    /// Apply what is queued; write only past a threshold (the checkpointer's wake-ups).
    IfDue,
    /// Apply and write whatever is not yet in the trees' durable state.
    Now,
}

/// The journal writer.
#[derive(Debug)]
pub(crate) struct Journal {
    /// The commit lock: the head, and the order of appends.
    head: Mutex<u64>,
    /// The head as of the last append, readable without waiting for a commit (status).
    head_seen: AtomicU64,
    committed: Arc<AtomicU64>,
    /// Commits that found the journal full and waited for a checkpoint.
    pub full_waits: AtomicU64,
    /// Of those, the ones that wrote a checkpoint themselves.
    pub full_checkpoints: AtomicU64,
    /// Changes that applied a slice of the queue themselves (`throttle_apply`).
    pub apply_throttled: AtomicU64,
    /// The most bytes of tree pages pinned (dirty or frozen) after an apply, since mount.
    pub pinned_peak: AtomicU64,
    /// Shared with committers, checkpoints and the checkpointer thread.
    ctl: Arc<CheckpointCtl>,
    /// Serialises checkpoints (apply and write), with the mark of the last transaction
    /// applied to the trees.
    run: Mutex<JournalMark>,
    /// What the applier remembers of the items between transactions
    /// (`items::ApplyMemo`): taken only with `run` held, so by one applier at a time.
    memo: Mutex<items::ApplyMemo>,
    /// The last transaction whose records the trees hold (read without a lock: an
    /// in-core inode changed by a later one cannot be evicted, `metaview.rs`).
    applied: Arc<AtomicU64>,
    /// Append rate and checkpoint duration (a lock held for moments).
    pace: Mutex<Pace>,
}

/// A transaction durable in the journal whose records have not reached the trees.
#[derive(Debug)]
struct Queued {
    seq: u64,
    /// The journal unit after it.
    end: u64,
    records: Vec<Record>,
}

/// The queue, the tail and the checkpointer's wake-up: a lock held for moments, never
/// across I/O, and shared with the checkpointer thread, which waits on it without holding
/// the file system (its last user's drop unmounts it).
#[derive(Debug)]
pub(crate) struct CheckpointCtl {
    shared: Mutex<Shared>,
    kick: Condvar,
}

/// What the checkpointer thread is to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Work,
    Stop,
}

impl CheckpointCtl {
    /// Waits until there is work or the thread must stop.
    pub fn wait(&self) -> Wake {
        let mut s = self.shared.lock();
        while !s.wanted && !s.stop {
            self.kick.wait(&mut s);
        }
        if s.stop {
            Wake::Stop
        } else {
            s.wanted = false;
            Wake::Work
        }
    }

    fn want(&self, s: &mut Shared) {
        s.wanted = true;
        self.kick.notify_one();
    }

    /// Makes the checkpointer thread return.
    pub fn stop(&self) {
        self.shared.lock().stop = true;
        self.kick.notify_all();
    }
}

#[derive(Debug)]
struct Shared {
    /// In journal order.
    queue: VecDeque<Queued>,
    queued_records: usize,
    tail: u64,
    generation: u64,
    /// The checkpointer has work (`kick`).
    wanted: bool,
    /// The checkpointer must exit.
    stop: bool,
}

/// Whether transactions are still queued after an apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Empty,
    More,
}

struct Work {
    seq: u64,
    records: Vec<Record>,
    payload: Vec<u8>,
    units: u64,
}

impl Journal {
    /// A journal at `pos` whose transactions up to `committed` are durable; `replayed`
    /// are the records recovery replayed from it (ending at the head), still to reach the
    /// trees, and `mark` the journal position the trees' durable root record covers.
    pub fn new(
        pos: JournalPosition,
        committed: u64,
        replayed: Vec<Record>,
        mark: JournalMark,
    ) -> Self {
        let mut queue = VecDeque::new();
        let queued_records = replayed.len();
        if !replayed.is_empty() {
            queue.push_back(Queued {
                seq: committed,
                end: pos.head,
                records: replayed,
            });
        }
        Self {
            head: Mutex::new(pos.head),
            head_seen: AtomicU64::new(pos.head),
            committed: Arc::new(AtomicU64::new(committed)),
            full_waits: AtomicU64::new(0),
            full_checkpoints: AtomicU64::new(0),
            apply_throttled: AtomicU64::new(0),
            pinned_peak: AtomicU64::new(0),
            ctl: Arc::new(CheckpointCtl {
                shared: Mutex::new(Shared {
                    queue,
                    queued_records,
                    tail: pos.tail,
                    generation: pos.generation,
                    wanted: false,
                    stop: false,
                }),
                kick: Condvar::new(),
            }),
            run: Mutex::new(mark),
            memo: Mutex::default(),
            applied: Arc::new(AtomicU64::new(mark.seq.saturating_sub(1))),
            pace: Mutex::new(Pace::new()),
        }
    }

    /// The last transaction applied to the trees, kept current by the checkpointer.
    pub fn applied(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.applied)
    }

    /// The highest durable transaction, shared (`MetaCore::committed`).
    pub fn committed_mark(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.committed)
    }

    /// Highest transaction sequence known durable.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Records committed to the journal and not yet applied to the trees.
    pub fn queued_records(&self) -> usize {
        self.ctl.shared.lock().queued_records
    }

    /// Current log position (without waiting for a commit in progress).
    pub fn position(&self) -> JournalPosition {
        let s = self.ctl.shared.lock();
        let head = self.head_seen.load(Ordering::Acquire);
        JournalPosition {
            head,
            tail: s.tail,
            generation: s.generation,
        }
    }

    /// Makes every transaction up to `upto` durable (see the module documentation).
    ///
    /// # Errors
    /// `Poisoned` if the file system is already shut down; the I/O or space error that
    /// made this commit fail (after which it is poisoned).
    pub fn commit(&self, fs: &FsInner, upto: u64, mode: CommitMode) -> Result<()> {
        {
            let mut phases = CommitPhases::start();
            let mut head = self.head.lock();
            phases.mark(CommitPhase::Lock);
            if mode == CommitMode::Append && self.committed() >= upto {
                // Another commit carried it (group commit): the wait was for that one.
                phases.report(upto, 0);
                return Ok(());
            }
            fs.check()?;
            let taken = self.take(fs)?;
            phases.mark(CommitPhase::Take);
            match taken {
                None => fs
                    .flush_dirty()
                    .inspect_err(|e| fs.poison(&format!("data flush failed: {e}")))?,
                Some(work) => {
                    let seq = work.seq;
                    let full = self.full_waits.load(Ordering::Relaxed);
                    let res = fs.flush_dirty().and_then(|()| {
                        phases.mark(CommitPhase::DataFlush);
                        self.write(fs, &mut head, work)
                    });
                    phases.mark(CommitPhase::Write);
                    phases.report(seq, self.full_waits.load(Ordering::Relaxed) - full);
                    if let Err(e) = res {
                        fs.poison(&format!("commit of transaction {seq} failed: {e}"));
                        return Err(e);
                    }
                    self.committed.store(seq, Ordering::Release);
                    fs.meta.lock().alloc.release_busy(seq);
                }
            }
        }
        if mode == CommitMode::Checkpoint {
            self.checkpoint_now(fs, Urge::Now)?;
        }
        Ok(())
    }

    /// Makes `w` durable: appended to the journal, or committed by a checkpoint when it
    /// is larger than the whole journal. Called with the commit lock (`head`).
    fn write(&self, fs: &FsInner, head: &mut u64, w: Work) -> Result<()> {
        let limit = log_limit(fs.geo.journal_units());
        if w.units > limit {
            // The checkpoint is the commit: its root record covers `w`.
            self.enqueue(w.seq, *head, w.records);
            return self.checkpoint_now(fs, Urge::Now);
        }
        if *head + w.units - self.ctl.shared.lock().tail > limit {
            self.full_waits.fetch_add(1, Ordering::Relaxed);
            // With a checkpointer, make room down to half a journal (it applies the
            // rest); without one, empty the journal as the synchronous design does.
            let keep = match fs.opts.checkpoints {
                Checkpoints::Background => limit / 2,
                Checkpoints::Inline => 0,
            };
            let end = *head + w.units;
            self.make_room(fs, end - limit, end.saturating_sub(keep))?;
            debug_assert!(
                *head + w.units - self.ctl.shared.lock().tail <= limit,
                "room made for the transaction"
            );
        }
        self.append(fs, head, &w)?;
        let used = *head - self.enqueue(w.seq, *head, w.records);
        let urgent = {
            let mut p = self.pace.lock();
            p.appended(w.units, Instant::now());
            p.urgent(limit.saturating_sub(used))
        };
        let mut s = self.ctl.shared.lock();
        if used > limit / 2 || urgent || s.queued_records >= APPLY_BATCH_RECORDS {
            self.ctl.want(&mut s);
        }
        Ok(())
    }

    /// Queues a durable transaction's records for the trees; returns the tail.
    fn enqueue(&self, seq: u64, end: u64, records: Vec<Record>) -> u64 {
        let mut s = self.ctl.shared.lock();
        s.queued_records += records.len();
        s.queue.push_back(Queued { seq, end, records });
        s.tail
    }

    /// The running transaction, encoded; `None` when it is empty (a checkpoint request
    /// is served by `commit` after this).
    ///
    /// # Errors
    /// `Poisoned`, checked again under the metadata lock: a call that fails between two
    /// records of one transaction (a record the model refuses, a reference-count lookup
    /// that cannot read its page) poisons before it releases the lock, and leaves its
    /// first records in the running transaction. A commit that passed `commit`'s check
    /// and then waited here for the lock must not write that half (an extent unmapped
    /// without its count decrements).
    fn take(&self, fs: &FsInner) -> Result<Option<Work>> {
        let mut m = fs.meta.lock();
        fs.check()?;
        if m.txn.records.is_empty() {
            return Ok(None);
        }
        let next = m.txn.seq + 1;
        let txn = std::mem::replace(&mut m.txn, Txn::new(next));
        drop(m);
        let mut e = Enc::new();
        for r in &txn.records {
            r.encode(&mut e);
        }
        let units = txn_units(e.len(), fs.geo.journal_unit);
        Ok(Some(Work {
            seq: txn.seq,
            records: txn.records,
            payload: e.buf,
            units,
        }))
    }

    fn append(&self, fs: &FsInner, head: &mut u64, w: &Work) -> Result<()> {
        let geo = &fs.geo;
        let unit = u64::from(geo.journal_unit);
        let cap = geo.journal_units();
        let buf = encode_txn(geo.uuid, *head, w.seq, &w.payload, geo.journal_unit);
        fs.metadata_fault(crate::faults::JOURNAL_WRITE)?;
        let t0 = fs.targets[0].as_ref();
        let first_units = w.units.min(cap - *head % cap);
        let (a, b) = buf.split_at((first_units * unit) as usize);
        // FUA: each piece is durable when it completes, so no flush follows. The pieces
        // of a wrapping record may land in either order; a crash between them leaves a
        // record whose checksum fails, the torn last record recovery already ends at.
        if b.is_empty() {
            // One piece, waited for here: the target may run it on this thread.
            let wrote = t0.write_fua_sync(geo.journal_unit_offset(*head), IoBuf::from_slice(a));
            // The injected "journal flush" failure stands for the durability step
            // failing, which is now the FUA write's own completion.
            let flushed = fs.metadata_fault(crate::faults::JOURNAL_FLUSH);
            wrote?;
            flushed?;
        } else {
            let batch = Batch::new();
            for (at, piece) in [(*head, a), (*head + first_units, b)] {
                let offset = geo.journal_unit_offset(at);
                let bufs = vec![IoBuf::from_slice(piece)];
                batch.submit(t0, IoOp::WriteFua { offset, bufs });
            }
            let flushed = fs.metadata_fault(crate::faults::JOURNAL_FLUSH);
            for d in batch.wait() {
                d.result?;
            }
            flushed?;
        }
        fs.meta_bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        *head += w.units;
        self.head_seen.store(*head, Ordering::Release);
        Ok(())
    }

    /// Applies the queued transactions to the trees and, if `urge` says so or a
    /// threshold is passed, writes a checkpoint covering them and moves the journal tail
    /// to the end of the last one. Serialised with other checkpoints; holds no lock that
    /// commits or other operations need across the apply or the I/O. A failure poisons the
    /// file system.
    ///
    /// `Urge::IfDue` applies in slices of [`APPLY_BATCH_RECORDS`] records, leaving the
    /// checkpoint lock between them and writing as soon as a threshold is passed: a
    /// commit waiting for room (`make_room`) waits for one slice, not for a whole
    /// backlog, and a checkpoint covers about half a journal even when the queue holds
    /// more.
    ///
    /// # Errors
    /// `Poisoned`; an injected checkpoint fault; the store's apply, allocation, write or
    /// flush error.
    pub fn checkpoint_now(&self, fs: &FsInner, urge: Urge) -> Result<()> {
        let res = match urge {
            Urge::Now => {
                let mut applied = self.run.lock();
                fs.check()?;
                self.drain_and_write(fs, &mut applied, u64::MAX)
            }
            Urge::IfDue => self.apply_in_slices(fs),
        };
        res.inspect_err(|e| match e {
            // The store allocates every page before it freezes anything: no pages is
            // NoSpace with the trees unchanged (the records stay applied in memory, the
            // journal keeps them and its tail), so a later checkpoint can still succeed.
            FsError::NoSpace(_) => tracing::warn!(error = %e, "checkpoint postponed"),
            _ => fs.poison(&format!("checkpoint failed: {e}")),
        })
    }

    /// Bounds the apply queue: when it holds more than `limit` records, the caller (a
    /// change about to start, holding no lock: `Fs::begin_change`) applies one slice of
    /// [`APPLY_BATCH_RECORDS`] records itself, and writes a checkpoint if that makes one
    /// due. Without it the queue was bounded only by the journal: at 3,000,000 files it
    /// held 996,429 records, and their inodes (662,897, against a bound of 131,072) could
    /// not leave core until applied. So writers run no faster than the trees take their
    /// records, a slice at a time, instead of filling the journal and then waiting for
    /// half of it to be applied (`docs/design/metadata.md`, "Memory"; decisions.md, 62).
    /// A failure poisons the file system, except `NoSpace` (as [`Self::checkpoint_now`]).
    pub fn throttle_apply(&self, fs: &FsInner, limit: usize) -> Result<()> {
        if self.ctl.shared.lock().queued_records <= limit {
            return Ok(());
        }
        let res = (|| {
            let mut applied = self.run.lock();
            fs.check()?;
            if self.ctl.shared.lock().queued_records <= limit {
                return Ok(()); // applied by another caller or the checkpointer meanwhile
            }
            self.apply_throttled.fetch_add(1, Ordering::Relaxed);
            self.apply_until(fs, &mut applied, u64::MAX, APPLY_BATCH_RECORDS)?;
            if self.due(fs, *applied) {
                self.write_checkpoint(fs, *applied)?;
            }
            Ok(())
        })();
        res.inspect_err(|e| match e {
            FsError::NoSpace(_) => tracing::warn!(error = %e, "checkpoint postponed"),
            _ => fs.poison(&format!("checkpoint failed: {e}")),
        })
    }

    fn apply_in_slices(&self, fs: &FsInner) -> Result<()> {
        loop {
            let mut applied = self.run.lock();
            fs.check()?;
            let rest = self.apply_until(fs, &mut applied, u64::MAX, APPLY_BATCH_RECORDS)?;
            if self.due(fs, *applied) {
                return self.write_checkpoint(fs, *applied);
            }
            if rest == Queue::Empty {
                return Ok(());
            }
        }
    }

    /// Applies the queued transactions up to journal unit `tail` (the whole queue with
    /// `u64::MAX`) and writes a checkpoint at the end. Between slices of
    /// [`DRAIN_SLICE_RECORDS`] records it writes one more whenever the pinned pages pass
    /// the memory bound ([`Self::memory_due`]), as the checkpointer does: applying a
    /// whole queue at once pinned every page it dirtied until the one write (at 10
    /// million files an unmount applied 108,128 queued records and peaked at 367-398 MiB
    /// against 220 MiB for the creates; decisions.md, 125). Every write is at a
    /// transaction boundary, as any checkpoint's.
    fn drain_and_write(&self, fs: &FsInner, applied: &mut JournalMark, tail: u64) -> Result<()> {
        loop {
            let rest = self.apply_until(fs, applied, tail, DRAIN_SLICE_RECORDS)?;
            if rest == Queue::Empty || applied.tail >= tail {
                return self.write_checkpoint(fs, *applied);
            }
            if self.memory_due(fs) {
                self.write_checkpoint(fs, *applied)?;
            }
        }
    }

    /// Applies queued transactions in journal order until the applied mark reaches
    /// journal unit `tail`, at least `records` records are applied, or the queue is
    /// empty; says whether it is.
    fn apply_until(
        &self,
        fs: &FsInner,
        applied: &mut JournalMark,
        tail: u64,
        records: usize,
    ) -> Result<Queue> {
        let mut done = 0;
        let mut applied_any = false;
        let mut rest = Queue::More;
        let mut memo = self.memo.lock();
        while applied.tail < tail && done < records {
            let next = {
                let mut s = self.ctl.shared.lock();
                let q = s.queue.pop_front();
                s.queued_records -= q.as_ref().map_or(0, |q| q.records.len());
                q
            };
            let Some(q) = next else {
                rest = Queue::Empty;
                break;
            };
            // A whole transaction at once: the counter item is read and written once.
            items::apply_records_with(&fs.store, &q.records, &mut memo)?;
            done += q.records.len();
            applied_any = true;
            *applied = JournalMark {
                tail: q.end,
                seq: q.seq + 1,
            };
            self.applied.store(q.seq, Ordering::Release);
        }
        if applied_any {
            // In the trees' free space now: metadata pages may take them too.
            fs.meta.lock().alloc.applied(applied.seq - 1);
            let pinned = fs.store.dirty_bytes() as u64;
            self.pinned_peak.fetch_max(pinned, Ordering::Relaxed);
        }
        if rest == Queue::More && self.ctl.shared.lock().queue.is_empty() {
            rest = Queue::Empty;
        }
        Ok(rest)
    }

    /// Makes the journal tail reach unit `need` for a commit that found the journal
    /// full (called with the commit lock). First waits for a running checkpoint, whose
    /// tail move may be enough; otherwise applies only the queued transactions up to
    /// unit `want` (at least `need`, at most the head: not the whole queue, the
    /// checkpointer applies the rest) and writes a checkpoint at that mark (and on the
    /// way whenever the pinned pages pass their bound: [`Self::drain_and_write`]). So the wait
    /// is at most the rest of a running checkpoint plus one checkpoint of what is
    /// applied (bounded back-pressure, journal.md).
    /// A failure poisons the file system, except `NoSpace` (as [`Self::checkpoint_now`]).
    fn make_room(&self, fs: &FsInner, need: u64, want: u64) -> Result<()> {
        debug_assert!(need <= want, "room wanted {want} below room needed {need}");
        let mut applied = self.run.lock();
        fs.check()?;
        if self.ctl.shared.lock().tail >= need {
            return Ok(());
        }
        self.full_checkpoints.fetch_add(1, Ordering::Relaxed);
        let res = self.drain_and_write(fs, &mut applied, want);
        res.inspect_err(|e| match e {
            FsError::NoSpace(_) => tracing::warn!(error = %e, "checkpoint postponed"),
            _ => fs.poison(&format!("checkpoint failed: {e}")),
        })
    }

    /// Whether the trees should be written now: the applied part of the journal is half
    /// of it; or at the recent append rate the journal would be full within
    /// [`PACE_MARGIN`] recent checkpoint writes (pacing: start early enough that a
    /// committer rarely finds it full); or their pinned pages pass half the cache budget
    /// or half the metadata reserve.
    fn due(&self, fs: &FsInner, applied: JournalMark) -> bool {
        let limit = log_limit(fs.geo.journal_units());
        let tail = self.ctl.shared.lock().tail;
        let used = applied.tail - tail;
        let in_use = self.head_seen.load(Ordering::Acquire).saturating_sub(tail);
        let paced = used > 0 && self.pace.lock().urgent(limit.saturating_sub(in_use));
        used > limit / 2 || paced || self.memory_due(fs)
    }

    /// Whether the pages the trees pin (dirty and frozen) pass half the cache budget or
    /// half the metadata reserve: a checkpoint must write them before more are dirtied.
    fn memory_due(&self, fs: &FsInner) -> bool {
        let dirty = fs.store.dirty_bytes() as u64;
        dirty > fs.opts.meta_cache.0 / 2 || dirty > fs.meta_reserve_bytes() / 2
    }

    fn write_checkpoint(&self, fs: &FsInner, mark: JournalMark) -> Result<()> {
        if fs.store.journal_mark() == mark && fs.store.dirty_bytes() == 0 {
            return Ok(()); // nothing since the last checkpoint
        }
        fs.metadata_fault(crate::faults::CHECKPOINT_WRITE)?;
        // A file system poisoned while this checkpoint applied (a commit failed) writes
        // nothing more: the targets keep what its last durable write left.
        fs.check()?;
        let pages = fs.store.dirty_bytes() as u64;
        let started = Instant::now();
        let generation = fs.store.checkpoint_at(mark)?;
        self.pace.lock().wrote(started.elapsed());
        let written = pages + u64::from(fs.geo.sector_size);
        fs.meta_bytes_written.fetch_add(written, Ordering::Relaxed);
        fs.ckpt_bytes_written.fetch_add(written, Ordering::Relaxed);
        fs.checkpoints.fetch_add(1, Ordering::Relaxed);
        let mut s = self.ctl.shared.lock();
        debug_assert!(mark.tail >= s.tail, "the journal tail moves forward");
        s.tail = mark.tail;
        s.generation = generation.0;
        Ok(())
    }

    /// The control the checkpointer thread waits on.
    pub fn control(&self) -> Arc<CheckpointCtl> {
        Arc::clone(&self.ctl)
    }
}

/// A commit slower than this logs where its time went (`STRIPEFS_LOG=debug`).
pub(crate) const SLOW_COMMIT: Duration = Duration::from_millis(50);

/// The steps of a commit, timed for the slow-commit log.
#[derive(Debug, Clone, Copy)]
enum CommitPhase {
    /// Waiting for the commit lock (another commit in progress).
    Lock,
    /// Taking the running transaction (the metadata lock) and encoding it.
    Take,
    /// Flushing the data targets (ordered data).
    DataFlush,
    /// Making room in a full journal, if needed, and the FUA append.
    Write,
}

/// Where one commit's time went.
struct CommitPhases {
    t0: Instant,
    last: Instant,
    spent: [Duration; 4],
}

impl CommitPhases {
    fn start() -> Self {
        let now = Instant::now();
        Self {
            t0: now,
            last: now,
            spent: [Duration::ZERO; 4],
        }
    }

    /// `phase` ended now.
    fn mark(&mut self, phase: CommitPhase) {
        let now = Instant::now();
        self.spent[phase as usize] += now - self.last;
        self.last = now;
    }

    /// Logs the phases if the commit was slow; `full_waits`: how often it found the
    /// journal full.
    fn report(&self, seq: u64, full_waits: u64) {
        let total = self.last - self.t0;
        if total < SLOW_COMMIT {
            return;
        }
        let ms = |p: CommitPhase| self.spent[p as usize].as_secs_f64() * 1e3;
        tracing::debug!(
            seq,
            total_ms = total.as_secs_f64() * 1e3,
            lock_ms = ms(CommitPhase::Lock),
            take_ms = ms(CommitPhase::Take),
            data_flush_ms = ms(CommitPhase::DataFlush),
            write_ms = ms(CommitPhase::Write),
            full_waits,
            "slow commit"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards a review finding: a commit that passed `commit`'s poison check and then
    /// waited for the metadata lock took whatever the running transaction held, though
    /// a call holding that lock had poisoned the file system between two records of one
    /// transaction. The interleaving, step by step: records in the running transaction,
    /// the file system poisoned under the metadata lock, then `take` (the committer's
    /// next step after its check).
    #[test]
    fn take_refuses_a_transaction_left_by_a_call_that_poisoned() {
        use std::sync::Arc;
        use stripefs_target::{SimTarget, Target};
        let targets: Vec<Arc<dyn Target>> = (0..2)
            .map(|i| Arc::new(SimTarget::new(&format!("t{i}"), 16 << 20, 512)) as _)
            .collect();
        crate::Fs::mkfs(&targets, &crate::MkfsOptions::default()).unwrap();
        let opts = crate::MountOptions {
            commit_interval: None,
            writeback_interval: None,
            ..crate::MountOptions::default()
        };
        let (fs, _) = crate::Fs::mount(targets, opts).unwrap();
        let p = crate::CreateParams::with_perm(0o644);
        fs.create(stripefs_core::Ino::ROOT, "f".as_ref(), p)
            .unwrap();
        let inner = &fs.inner;
        {
            let m = inner.meta.lock();
            assert!(!m.txn.records.is_empty(), "the create is not committed yet");
            inner.poison("a call failed between two records of its transaction");
        }
        let taken = inner.journal.take(inner);
        assert!(
            matches!(taken, Err(FsError::Poisoned(_))),
            "a poisoned file system's running transaction was taken for the journal: {:?}",
            taken.map(|w| w.map(|w| w.records.len()))
        );
    }

    #[test]
    fn pacing_writes_when_the_journal_would_fill_within_two_checkpoints() {
        // 1000 units/s, checkpoints of 0.5 s: due below 1000 free units.
        assert!(pace_due(999, 1000.0, 0.5));
        assert!(!pace_due(1000, 1000.0, 0.5));
        assert!(!pace_due(0, 0.0, 0.5), "no rate measured yet");
        assert!(!pace_due(10, 1000.0, 0.0), "no checkpoint measured yet");
    }

    #[test]
    fn the_append_rate_is_measured_over_windows_and_smoothed() {
        let t0 = Instant::now();
        let mut p = Pace::new();
        p.since = t0;
        p.appended(50, t0 + Duration::from_millis(50));
        assert!(p.rate == 0.0, "no full window yet");
        p.appended(50, t0 + Duration::from_millis(100));
        assert!(
            (p.rate - 1000.0).abs() < 1e-6,
            "100 units in 0.1 s: {}",
            p.rate
        );
        p.appended(300, t0 + Duration::from_millis(200));
        assert!(
            (p.rate - 2000.0).abs() < 1e-6,
            "mean of 1000 and 3000: {}",
            p.rate
        );
        p.wrote(Duration::from_millis(400));
        p.wrote(Duration::from_millis(200));
        assert!((p.write_secs - 0.3).abs() < 1e-9, "{}", p.write_secs);
        assert!(p.urgent(1190) && !p.urgent(1210), "2000/s x 0.3 s x 2");
    }
}

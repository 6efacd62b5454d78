//! Journal commit and checkpointing (the writer side; framing lives in the core crate).
//!
//! Commit protocol for transaction `s` (under the commit lock, never the metadata lock):
//! 1. take the running transaction from under the metadata lock (new records go to `s+1`);
//! 2. flush every data target with completed writes no completed flush covers, and no
//!    other (ordered data: metadata that makes data visible reaches the journal only after
//!    the data is durable); when nothing new is on any target, no flush at all;
//! 3. append the transaction at the journal head on target 0 as a FUA write (durable when
//!    it completes; two when it wraps), and queue its records for the metadata trees;
//!    when it would not fit the journal, checkpoint first (which empties the journal);
//! 4. publish `committed = s` and release blocks freed by `s` for reuse.
//!
//! A checkpoint ([`checkpoint_trees`]) applies the queued records to the metadata trees
//! (`stripefs_meta::items::apply_record`, in journal order), writes the pages they
//! dirtied and the root record naming the journal position it covers
//! (`Store::checkpoint_at`), and then moves the journal tail to the head. A transaction
//! too large for an empty journal, and every commit in [`CommitMode::Checkpoint`], is
//! committed by the checkpoint itself (its root record is the commit point).
//!
//! So an `fsync` costs one flush per data target it wrote plus one FUA write; a
//! metadata-only one costs the FUA write alone (`tests/fsync_ops.rs` counts them).
//!
//! Concurrent `fsync` callers queue on the commit lock; whoever gets it commits everything
//! logged so far, and the others find their transaction already committed (group commit).
//! A failure in steps 2-3, or of a checkpoint, poisons the file system: the in-memory
//! state is ahead of the disk and nothing later may pretend otherwise.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use stripefs_core::codec::Enc;
use stripefs_core::journal::{encode_txn, log_limit, txn_units};
use stripefs_core::record::Record;
use stripefs_meta::{items, JournalMark};
use stripefs_target::{Batch, IoBuf, IoOp};

use crate::error::Result;
use crate::inner::{FsInner, Txn};

/// Where the log stands (protected by the commit lock).
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
    /// Append to the journal (checkpoint only under journal pressure).
    Append,
    /// Write a checkpoint even if the journal has room (unmount, sync of the trees,
    /// recovery, the switch to read-only).
    Checkpoint,
}

/// The journal writer.
#[derive(Debug)]
pub(crate) struct Journal {
    /// The commit lock.
    log: Mutex<Log>,
    committed: AtomicU64,
}

/// What the commit lock protects.
#[derive(Debug)]
struct Log {
    pos: JournalPosition,
    /// Records of transactions durable in the journal but not yet applied to the trees,
    /// in journal order (bounded by the journal's size: a checkpoint drains it before the
    /// journal wraps onto them).
    queue: Vec<Record>,
}

struct Work {
    seq: u64,
    records: Vec<Record>,
    payload: Vec<u8>,
    units: u64,
}

impl Journal {
    /// A journal at `pos` whose transactions up to `committed` are durable; `replayed`
    /// are the records recovery replayed from it, still to reach the trees.
    pub fn new(pos: JournalPosition, committed: u64, replayed: Vec<Record>) -> Self {
        Self {
            log: Mutex::new(Log {
                pos,
                queue: replayed,
            }),
            committed: AtomicU64::new(committed),
        }
    }

    /// Highest transaction sequence known durable.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Current log position.
    pub fn position(&self) -> JournalPosition {
        self.log.lock().pos
    }

    /// Makes every transaction up to `upto` durable (see the module documentation).
    ///
    /// # Errors
    /// `Poisoned` if the file system is already shut down; the I/O or space error that
    /// made this commit fail (after which it is poisoned).
    pub fn commit(&self, fs: &FsInner, upto: u64, mode: CommitMode) -> Result<()> {
        let mut log = self.log.lock();
        if mode == CommitMode::Append && self.committed() >= upto {
            return Ok(());
        }
        fs.check()?;
        let Some(work) = self.take(fs, mode) else {
            return fs
                .flush_dirty()
                .inspect_err(|e| fs.poison(&format!("data flush failed: {e}")));
        };
        let seq = work.seq;
        let res = fs
            .flush_dirty()
            .and_then(|()| self.write(fs, &mut log, work, mode));
        if let Err(e) = res {
            fs.poison(&format!("commit of transaction {seq} failed: {e}"));
            return Err(e);
        }
        self.committed.store(seq, Ordering::Release);
        fs.meta.lock().alloc.release_busy(seq);
        Ok(())
    }

    /// Makes `w` durable: appended to the journal, or committed by a checkpoint.
    fn write(&self, fs: &FsInner, log: &mut Log, w: Work, mode: CommitMode) -> Result<()> {
        let limit = log_limit(fs.geo.journal_units());
        if mode == CommitMode::Checkpoint || w.units > limit {
            // The checkpoint is the commit: its root record covers `w`.
            log.queue.extend(w.records);
            return checkpoint_trees(fs, log, w.seq + 1);
        }
        if log.pos.head + w.units - log.pos.tail > limit {
            checkpoint_trees(fs, log, w.seq)?;
        }
        self.append(fs, &mut log.pos, &w)?;
        log.queue.extend(w.records);
        Ok(())
    }

    fn take(&self, fs: &FsInner, mode: CommitMode) -> Option<Work> {
        let mut m = fs.meta.lock();
        if m.txn.records.is_empty() && mode == CommitMode::Append {
            return None;
        }
        let next = m.txn.seq + 1;
        let txn = std::mem::replace(&mut m.txn, Txn::new(next));
        drop(m);
        let mut e = Enc::new();
        for r in &txn.records {
            r.encode(&mut e);
        }
        let units = txn_units(e.len(), fs.geo.journal_unit);
        Some(Work {
            seq: txn.seq,
            records: txn.records,
            payload: e.buf,
            units,
        })
    }

    fn append(&self, fs: &FsInner, pos: &mut JournalPosition, w: &Work) -> Result<()> {
        let geo = &fs.geo;
        let unit = u64::from(geo.journal_unit);
        let cap = geo.journal_units();
        let buf = encode_txn(geo.uuid, pos.head, w.seq, &w.payload, geo.journal_unit);
        fs.metadata_fault(crate::faults::JOURNAL_WRITE)?;
        let t0 = fs.targets[0].as_ref();
        let first_units = w.units.min(cap - pos.head % cap);
        let (a, b) = buf.split_at((first_units * unit) as usize);
        // FUA: each piece is durable when it completes, so no flush follows. The pieces
        // of a wrapping record may land in either order; a crash between them leaves a
        // record whose checksum fails, the torn last record recovery already ends at.
        let batch = Batch::new();
        batch.submit(
            t0,
            IoOp::WriteFua {
                offset: geo.journal_unit_offset(pos.head),
                bufs: vec![IoBuf::from_slice(a)],
            },
        );
        if !b.is_empty() {
            let offset = geo.journal_unit_offset(pos.head + first_units);
            batch.submit(
                t0,
                IoOp::WriteFua {
                    offset,
                    bufs: vec![IoBuf::from_slice(b)],
                },
            );
        }
        // The injected "journal flush" failure stands for the durability step failing,
        // which is now the FUA write's own completion.
        let flushed = fs.metadata_fault(crate::faults::JOURNAL_FLUSH);
        for d in batch.wait() {
            d.result?;
        }
        flushed?;
        fs.meta_bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        pos.head += w.units;
        Ok(())
    }
}

/// Brings the metadata trees up to the journal head: applies the queued records in
/// journal order, writes the pages they dirtied and the root record naming the journal
/// position (`pos.head`, `next_seq`) replay must start from, then frees the journal up to
/// the head. Runs under the commit lock, never the metadata lock. A failure poisons the
/// store (and, through the caller, the file system).
///
/// # Errors
/// An injected checkpoint fault; the store's apply, allocation, write or flush error.
fn checkpoint_trees(fs: &FsInner, log: &mut Log, next_seq: u64) -> Result<()> {
    fs.metadata_fault(crate::faults::CHECKPOINT_WRITE)?;
    for rec in log.queue.drain(..) {
        items::apply_record(&fs.store, &rec)?;
    }
    let pages: usize = fs.store.stats().trees.iter().map(|t| t.2).sum();
    let mark = JournalMark {
        tail: log.pos.head,
        seq: next_seq,
    };
    let generation = fs.store.checkpoint_at(mark)?;
    let written = (pages * fs.geo.page_size().bytes()) as u64 + u64::from(fs.geo.sector_size);
    fs.meta_bytes_written.fetch_add(written, Ordering::Relaxed);
    fs.ckpt_bytes_written.fetch_add(written, Ordering::Relaxed);
    fs.checkpoints.fetch_add(1, Ordering::Relaxed);
    log.pos.tail = log.pos.head;
    log.pos.generation = generation.0;
    Ok(())
}

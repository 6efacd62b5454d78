//! Journal commit and checkpointing (the writer side; framing lives in the core crate).
//!
//! Commit protocol for transaction `s` (under the commit lock, never the metadata lock):
//! 1. take the running transaction from under the metadata lock (new records go to `s+1`);
//! 2. flush every data target with completed writes no completed flush covers, and no
//!    other (ordered data: metadata that makes data visible reaches the journal only after
//!    the data is durable); when nothing new is on any target, no flush at all;
//! 3. append the transaction at the journal head on target 0 as a FUA write (durable when
//!    it completes; two when it wraps) — or, when the journal is three-quarters full, write
//!    a checkpoint instead (payload, flush, header as a FUA write);
//! 4. publish `committed = s` and release blocks freed by `s` for reuse.
//!
//! So an `fsync` costs one flush per data target it wrote plus one FUA write; a
//! metadata-only one costs the FUA write alone (`tests/fsync_ops.rs` counts them).
//!
//! Concurrent `fsync` callers queue on the commit lock; whoever gets it commits everything
//! logged so far, and the others find their transaction already committed (group commit).
//! A failure in steps 2-3 poisons the file system: the in-memory state is ahead of the disk
//! and nothing later may pretend otherwise.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use stripefs_core::checkpoint::{self, CheckpointHeader};
use stripefs_core::codec::Enc;
use stripefs_core::geometry::Geometry;
use stripefs_core::journal::{encode_txn, log_limit, txn_units};
use stripefs_target::{Batch, IoBuf, IoOp, Target};

use crate::error::{FsError, Result};
use crate::inner::{FsInner, Txn};

/// Largest single write the checkpoint writer issues.
const CKPT_CHUNK_BYTES: usize = 4 << 20;

/// Where the log stands (protected by the commit lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalPosition {
    /// Next journal unit to write.
    pub head: u64,
    /// First journal unit still needed (the active checkpoint's replay start).
    pub tail: u64,
    /// Generation of the active checkpoint.
    pub generation: u64,
    /// Area (0 or 1) of the active checkpoint.
    pub area: u32,
}

/// Whether a commit may append or must write a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitMode {
    /// Append to the journal (checkpoint only under journal pressure).
    Append,
    /// Write a checkpoint even if the journal has room (unmount, recovery, metadata
    /// admission).
    Checkpoint,
}

/// The journal writer.
#[derive(Debug)]
pub(crate) struct Journal {
    pos: Mutex<JournalPosition>,
    committed: AtomicU64,
    /// Size of the last checkpoint payload (exact metadata size then).
    pub snapshot_len: AtomicU64,
    /// Journal payload bytes since that checkpoint (an upper bound on metadata growth).
    pub bytes_since: AtomicU64,
}

struct Work {
    seq: u64,
    payload: Vec<u8>,
    units: u64,
    snapshot: Option<(Vec<u8>, u64)>,
}

impl Journal {
    pub fn new(pos: JournalPosition, committed: u64, snapshot_len: u64) -> Self {
        Self {
            pos: Mutex::new(pos),
            committed: AtomicU64::new(committed),
            snapshot_len: AtomicU64::new(snapshot_len),
            bytes_since: AtomicU64::new(0),
        }
    }

    /// Highest transaction sequence known durable.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Current log position.
    pub fn position(&self) -> JournalPosition {
        *self.pos.lock()
    }

    /// Makes every transaction up to `upto` durable (see the module documentation).
    ///
    /// # Errors
    /// `Poisoned` if the file system is already shut down; the I/O or space error that
    /// made this commit fail (after which it is poisoned).
    pub fn commit(&self, fs: &FsInner, upto: u64, mode: CommitMode) -> Result<()> {
        let mut pos = self.pos.lock();
        if mode == CommitMode::Append && self.committed() >= upto {
            return Ok(());
        }
        fs.check()?;
        let Some(work) = self.take(fs, &pos, mode) else {
            return fs
                .flush_dirty()
                .inspect_err(|e| fs.poison(&format!("data flush failed: {e}")));
        };
        let res = fs.flush_dirty().and_then(|()| match &work.snapshot {
            Some((snap, next_ino)) => self.checkpoint(fs, &mut pos, work.seq, snap, *next_ino),
            None => self.append(fs, &mut pos, &work),
        });
        if let Err(e) = res {
            fs.poison(&format!("commit of transaction {} failed: {e}", work.seq));
            return Err(e);
        }
        self.committed.store(work.seq, Ordering::Release);
        fs.meta.lock().alloc.release_busy(work.seq);
        Ok(())
    }

    fn take(&self, fs: &FsInner, pos: &JournalPosition, mode: CommitMode) -> Option<Work> {
        let mut m = fs.meta.lock();
        if m.txn.records.is_empty() && mode == CommitMode::Append {
            return None;
        }
        let next = m.txn.seq + 1;
        let txn = std::mem::replace(&mut m.txn, Txn::new(next));
        let mut e = Enc::new();
        for r in &txn.records {
            r.encode(&mut e);
        }
        let units = txn_units(e.len(), fs.geo.journal_unit);
        let cap = fs.geo.journal_units();
        let full = pos.head + units - pos.tail > log_limit(cap);
        let snapshot = (mode == CommitMode::Checkpoint || full)
            .then(|| (m.state.encode_snapshot(), m.state.next_ino));
        Some(Work {
            seq: txn.seq,
            payload: e.buf,
            units,
            snapshot,
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
        self.bytes_since
            .fetch_add(w.payload.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn checkpoint(
        &self,
        fs: &FsInner,
        pos: &mut JournalPosition,
        seq: u64,
        snap: &[u8],
        next_ino: u64,
    ) -> Result<()> {
        fs.metadata_fault(crate::faults::CHECKPOINT_WRITE)?;
        let area = 1 - pos.area;
        let generation = pos.generation + 1;
        let hdr = CheckpointHeader {
            area,
            own_block: 0,
            generation,
            payload_blocks: 0,
            payload_bytes: 0,
            payload_crc: 0,
            journal_tail: pos.head,
            journal_seq: seq + 1,
            next_ino,
            time_sec: crate::clock::time_now().sec,
        };
        write_checkpoint(fs.targets[0].as_ref(), &fs.geo, hdr, snap)?;
        let written = snap.len() as u64 + u64::from(fs.geo.block_size.bytes());
        fs.meta_bytes_written.fetch_add(written, Ordering::Relaxed);
        fs.ckpt_bytes_written.fetch_add(written, Ordering::Relaxed);
        fs.checkpoints.fetch_add(1, Ordering::Relaxed);
        *pos = JournalPosition {
            head: pos.head,
            tail: pos.head,
            generation,
            area,
        };
        self.snapshot_len
            .store(snap.len() as u64, Ordering::Relaxed);
        self.bytes_since.store(0, Ordering::Relaxed);
        Ok(())
    }
}

/// Writes a checkpoint into area `hdr.area`: payload blocks, flush, then the header as a
/// FUA write (durable when it completes; the payload it vouches for already is).
///
/// # Errors
/// `NoSpace` if the metadata does not fit the area; target errors.
pub(crate) fn write_checkpoint(
    t0: &dyn Target,
    geo: &Geometry,
    hdr: CheckpointHeader,
    snap: &[u8],
) -> Result<()> {
    let cap = geo.ckpt_payload_capacity();
    if snap.len() as u64 > cap {
        return Err(FsError::NoSpace(format!(
            "metadata ({} bytes) exceeds the checkpoint area ({cap} bytes); mkfs with a larger --ckpt-size",
            snap.len()
        )));
    }
    let start = geo.ckpt_start[hdr.area as usize];
    let bs = geo.block_size;
    let (blocks, header) = checkpoint::encode(geo.uuid, bs.bytes(), start, hdr, snap);
    let batch = Batch::new();
    let base = bs.to_bytes(start + 1);
    for (i, chunk) in blocks.chunks(CKPT_CHUNK_BYTES).enumerate() {
        let offset = base + (i * CKPT_CHUNK_BYTES) as u64;
        batch.submit(
            t0,
            IoOp::Write {
                offset,
                bufs: vec![IoBuf::from_slice(chunk)],
            },
        );
    }
    for d in batch.wait() {
        d.result?;
    }
    t0.flush_sync()?;
    t0.write_fua_sync(bs.to_bytes(start), IoBuf::from_slice(&header))?;
    Ok(())
}

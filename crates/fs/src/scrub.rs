//! Scrub: reads every checksummed data block and reports the ones whose bytes do not
//! match their checksum (`docs/design/scrub.md`, decision 75).
//!
//! [`Fs::scrub_step`] does a bounded amount of work from a [`ScrubCursor`] and returns
//! the cursor to resume from, so an online caller drives it in chunks and rate-limits
//! between them. Files are visited in inode order (the fs tree's order; inodes created
//! since the last checkpoint are found among the inodes in core), each file's objects in
//! order, each object's extents in block order. Only written extents of copy-on-write
//! (datacow) files carry checksums; those are read from their target through
//! [`VerifyRead`](crate::csum::VerifyRead), the wrapper every read path uses, so scrub
//! and reads verify one way.
//!
//! Locking: per step, the file's inode I/O lock is held shared (as a direct read holds
//! it) and the metadata lock only while the step's extents are collected; the reads run
//! with the metadata lock dropped. A shared block is checked once per file mapping it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use stripefs_core::btree::schema::inode_key;
use stripefs_core::btree::TreeId;
use stripefs_core::extent::ExtentState;
use stripefs_core::inode::FileKind;
use stripefs_core::layout::StripeLayout;
use stripefs_core::{Ino, TargetId};
use stripefs_target::{Batch, IoBuf, IoOp};

use crate::csum::{CsumErrors, ReadCtx, VerifyRead};
use crate::error::Result;
use crate::namespace::inode;
use crate::Fs;

/// Where a scrub resumes: the next block to consider is block `block` of object
/// `object` of inode `ino` (or the first block after it that a written extent maps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScrubCursor {
    pub ino: u64,
    pub object: u32,
    pub block: u64,
}

impl ScrubCursor {
    /// The start of a scrub.
    pub const START: ScrubCursor = ScrubCursor {
        ino: Ino::ROOT.0,
        object: 0,
        block: 0,
    };

    fn next_ino(ino: u64) -> ScrubCursor {
        ScrubCursor {
            ino: ino.saturating_add(1),
            object: 0,
            block: 0,
        }
    }
}

/// One data block whose bytes do not match its checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubMismatch {
    pub ino: Ino,
    /// Byte offset in the file of the block.
    pub file_off: u64,
    pub target: TargetId,
    /// Physical block on the target.
    pub phys: u64,
}

/// A run of blocks that could not be read at all (a target error, not a mismatch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubReadError {
    pub ino: Ino,
    pub file_off: u64,
    pub target: TargetId,
    pub phys: u64,
    pub blocks: u64,
    pub error: String,
}

/// What one [`Fs::scrub_step`] did.
#[derive(Debug, Clone, Default)]
pub struct ScrubStep {
    /// Where to resume; `None`: the scrub is complete.
    pub next: Option<ScrubCursor>,
    /// Checksummed blocks read and verified (mismatches included).
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files whose blocks this step visited (a file spanning steps counts in each).
    pub files: u64,
    /// The next inode number the file system would hand out, when the step looked: the
    /// end of the cursor's inode range (for progress).
    pub ino_limit: u64,
    pub mismatches: Vec<ScrubMismatch>,
    pub read_errors: Vec<ScrubReadError>,
}

/// One run of checksummed blocks to read: object `object`'s blocks `[block, +len)` at
/// physical `phys` of `target`.
struct Run {
    object: u32,
    block: u64,
    target: TargetId,
    phys: u64,
    len: u64,
}

/// A step's runs, the cursor after them (`None`: the file is done), the file's layout.
type StepRuns = (Vec<Run>, Option<ScrubCursor>, StripeLayout);

impl Fs {
    /// Scrubs from `from`: reads and verifies at most `budget` checksummed blocks (at
    /// least one extent piece of one block when `budget` is 0), visiting at most one
    /// file with checksummed blocks, and returns what it found and where to resume.
    /// Read-only: it changes nothing on the targets or in the metadata.
    ///
    /// # Errors
    /// `Poisoned` / `Stale` file system; the trees' read or decode error while finding
    /// the next inode or its extents. Target read errors and mismatches are reported in
    /// the result, not as errors.
    pub fn scrub_step(&self, from: ScrubCursor, budget: u64) -> Result<ScrubStep> {
        self.inner.check()?;
        let budget = budget.max(1);
        let mut out = ScrubStep::default();
        let mut at = from;
        loop {
            let (next_ino, limit) = self.next_ino_from(at.ino)?;
            out.ino_limit = limit;
            let Some(ino) = next_ino else {
                out.next = None;
                return Ok(out);
            };
            if ino.0 != at.ino {
                at = ScrubCursor {
                    ino: ino.0,
                    object: 0,
                    block: 0,
                };
            }
            // Pins the in-core inode; shared, as a direct read holds it: a write that
            // replaces the blocks of a datacow file waits.
            let io = self.inner.io_lock(ino);
            let _shared = io.read();
            let Some((runs, next, layout)) = self.scrub_runs(ino, at, budget)? else {
                at = ScrubCursor::next_ino(ino.0);
                continue;
            };
            if runs.is_empty() {
                at = ScrubCursor::next_ino(ino.0);
                continue;
            }
            out.files += 1;
            self.scrub_read(ino, &layout, &runs, &mut out);
            out.next = Some(next.unwrap_or(ScrubCursor::next_ino(ino.0)));
            return Ok(out);
        }
    }

    /// The smallest inode number at or above `from` that the file system may hold: the
    /// fs tree's next inode item or an inode in core (created since the checkpoint).
    /// `None`: no more inodes. The tree is read without the metadata lock. Also returns
    /// the next inode number to be handed out.
    pub(crate) fn next_ino_from(&self, from: u64) -> Result<(Option<Ino>, u64)> {
        let from = from.max(Ino::ROOT.0);
        let tree = self
            .inner
            .store
            .scan(TreeId::Fs, inode_key(Ino(from)), None, 1)?
            .first()
            .map(|(k, _)| k.object);
        let m = self.inner.meta.lock();
        let core = m
            .state
            .resident_inos()
            .into_iter()
            .map(|i| i.0)
            .filter(|&i| i >= from)
            .min();
        let next = match (tree, core) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let limit = m.state.next_ino();
        Ok((next.filter(|&i| i < limit).map(Ino), limit))
    }

    /// Under the metadata lock: the runs of checksummed blocks of `ino` from `at`, at
    /// most `budget` blocks, and the cursor after them (`None`: the file is done).
    /// `Ok(None)`: `ino` is not a datacow regular file (or no longer exists).
    fn scrub_runs(&self, ino: Ino, at: ScrubCursor, budget: u64) -> Result<Option<StepRuns>> {
        let m = self.inner.meta.lock();
        let i = match inode(&m, ino) {
            Ok(i) => i,
            Err(crate::FsError::Stale(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if i.attrs.kind != FileKind::Regular || !stripefs_core::csum::datacow(&i.attrs) {
            return Ok(None);
        }
        let l = i.attrs.layout;
        let mut runs = Vec::new();
        let mut left = budget;
        for (object, map) in i.objects.iter().enumerate().skip(at.object as usize) {
            let object = u32::try_from(object).expect("object index");
            let start = if object == at.object { at.block } else { 0 };
            for (s, e) in map.range(start, u64::MAX - start) {
                let target = e.target;
                if e.state != ExtentState::Written {
                    continue;
                }
                let lo = s.max(start);
                let end = s + e.len;
                if left == 0 {
                    let next = ScrubCursor {
                        ino: ino.0,
                        object,
                        block: lo,
                    };
                    return Ok(Some((runs, Some(next), l)));
                }
                let len = (end - lo).min(left);
                runs.push(Run {
                    object,
                    block: lo,
                    target,
                    phys: e.phys + (lo - s),
                    len,
                });
                left -= len;
                if lo + len < end {
                    let next = ScrubCursor {
                        ino: ino.0,
                        object,
                        block: lo + len,
                    };
                    return Ok(Some((runs, Some(next), l)));
                }
            }
        }
        Ok(Some((runs, None, l)))
    }

    /// Whether `ino` still maps its block at `at` to `phys` of `target`: a mismatch is
    /// reported only then. Buffered writeback does not take the inode lock a step holds,
    /// so it may have moved the block (copy on write) and another write reused the old
    /// one between the checksum lookup and the read; a mapped block of a datacow file is
    /// never rewritten in place, so a block still mapped is the file's data. A lookup
    /// error counts as still mapped (reported, never hidden).
    fn scrub_still_maps(&self, ino: Ino, at: ScrubCursor, target: TargetId, phys: u64) -> bool {
        match self.scrub_runs(ino, at, 1) {
            Ok(Some((runs, _, _))) => runs.first().is_some_and(|r| {
                (r.object, r.block, r.target, r.phys) == (at.object, at.block, target, phys)
            }),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Reads `runs` of `ino` through [`VerifyRead`], with no lock of the metadata held.
    /// A verified read stops at the first bad block: the read resumes after it, so every
    /// block is verified and each mismatch is reported by block.
    fn scrub_read(&self, ino: Ino, layout: &StripeLayout, runs: &[Run], out: &mut ScrubStep) {
        let bs = self.inner.geo.block_size;
        let file_off = |object: u32, block: u64| layout.file_off(object, bs.to_bytes(block));
        for r in runs {
            let target = Arc::clone(&self.inner.targets[r.target.index()]);
            let mut done = 0u64;
            while done < r.len {
                let phys = r.phys + done;
                let len = r.len - done;
                let ctx = ReadCtx {
                    ino,
                    file_off: file_off(r.object, r.block + done),
                    target: r.target,
                    phys,
                    block_bytes: bs.bytes() as usize,
                    name: target.info().name.clone(),
                };
                // Private counts: a mismatch is told from a device error by them; they
                // are added to the file system's once the read is done.
                let errors = Arc::new(CsumErrors::default());
                let (want, lookup_failed) = match self.expected_csums(r.target, phys, len) {
                    Ok(w) => (w, false),
                    Err(e) => {
                        tracing::error!(ino = ino.0, error = %e, "checksum lookup failed");
                        (Vec::new(), true)
                    }
                };
                let v = VerifyRead {
                    target: Arc::clone(&target),
                    ctx,
                    want,
                    lookup_failed,
                    errors: Arc::clone(&errors),
                };
                let batch = Batch::new();
                let bytes = usize::try_from(bs.to_bytes(len)).expect("run fits memory");
                batch.submit(
                    &v,
                    IoOp::Read {
                        offset: bs.to_bytes(phys),
                        bufs: vec![IoBuf::zeroed(bytes)],
                    },
                );
                let result = batch.wait().pop().map_or(Ok(()), |d| d.result);
                let bad = errors.count.load(Ordering::Relaxed);
                match result {
                    Ok(()) => {
                        out.blocks += len;
                        out.bytes += bs.to_bytes(len);
                        done = r.len;
                    }
                    Err(e) if bad > 0 => {
                        // The read stopped at its first bad block, the one the error
                        // names; the blocks before it verified.
                        let b = e.offset / u64::from(bs.bytes());
                        let ok = b.saturating_sub(phys).min(len - 1);
                        out.blocks += ok + 1;
                        out.bytes += bs.to_bytes(ok + 1);
                        let here = ScrubCursor {
                            ino: ino.0,
                            object: r.object,
                            block: r.block + done + ok,
                        };
                        if self.scrub_still_maps(ino, here, r.target, phys + ok) {
                            self.inner
                                .csum_errors
                                .count
                                .fetch_add(bad, Ordering::Relaxed);
                            out.mismatches.push(ScrubMismatch {
                                ino,
                                file_off: file_off(r.object, here.block),
                                target: r.target,
                                phys: phys + ok,
                            });
                        } else {
                            tracing::info!(
                                ino = ino.0,
                                "scrub: a block moved during its read; not a mismatch"
                            );
                        }
                        done += ok + 1;
                    }
                    Err(error) => {
                        out.read_errors.push(ScrubReadError {
                            ino,
                            file_off: file_off(r.object, r.block + done),
                            target: r.target,
                            phys,
                            blocks: len,
                            error: error.to_string(),
                        });
                        done = r.len;
                    }
                }
            }
        }
    }
}

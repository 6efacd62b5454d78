//! The in-place or copy-on-write decision for a mapped extent (seed 001: I-001-1, I-001-2,
//! I-001-4; `docs/design/reflink.md`, "NOCOW decision (seed 001)").
//!
//! A data write (writeback, a direct write, and the buffered write that reserves for
//! them) writes a mapped extent in place only if its blocks have exactly one owner (the
//! reference-count index, where a count a transaction not yet durable changed counts as
//! shared: decision 94), carry no data checksum (the checksum index), and the file is
//! NOCOW or the extent unwritten (a datacow file's written blocks are always copied).
//! Holes never get here. An unwritten extent written in place is recorded written by the
//! write's completion (I-001-4: `piece_record` with `ExtentState::Written`).
//!
//! The lock discipline (I-001-2), as btrfs's `run_delalloc_nocow` since Linux 5.11:
//!
//! ```text
//!   meta lock:  lookup(obj_block) -> Cheap { extent start, phys, len, state,
//!               ref_changes[target] }                      (no tree read here)
//!   unlock
//!   no lock:    owners  = refcount overlay (own lock), then refcount tree
//!               csums   = csum overlay (own lock), then csum tree
//!   meta lock:  lookup(obj_block) again -> Cheap'
//!               Cheap' == Cheap: decide with what the checks found
//!               else: count a re-search, unlock, check again (at most
//!               NOCOW_RETRIES times, then check under the lock: a locked fallback)
//! ```
//!
//! Why an unchanged `Cheap` makes the unlocked answer current: every count or checksum
//! change is a `RefcountSet` / `CsumSet` / `CsumClear` logged under the metadata lock,
//! and logging one bumps `MetaCore::ref_changes` of its target; the checks start after
//! the counter was read and end before it is read again, so a change logged while they
//! ran is seen. What they read is exact for the moment they read it (decision 89's
//! argument, without the metadata lock): the overlay is read first, then the trees for
//! the blocks it does not hold. A block the overlay does not hold has no count change
//! the trees lack that was logged before that read (runs are dropped only once their
//! transaction is applied, a mark the checkpointer publishes after the trees hold it,
//! and durable, so decision 94's pending runs stay until a crash can no longer undo
//! them, even for a transaction larger than the journal, applied before its checkpoint
//! commits it), so the only records the checkpointer can be applying to such a block
//! while the trees are read were logged after the overlay read, and those bumped the
//! counter: the answer is then thrown away. Blocks outside a record's range read their
//! count at every moment of its application (`refcount::set`'s order), as before.
//!
//! `nocow_check=locked` runs the same checks under the metadata lock (what btrfs did
//! before 5.11), for comparison.

use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(debug_assertions)]
use std::sync::Arc;

use stripefs_core::extent::{Extent, ExtentState, Lookup};
use stripefs_core::TargetId;
use stripefs_iomap::IomapOp;

use crate::error::Result;
use crate::inner::{assert_meta_unlocked, MetaCore, MetaGuard};
use crate::mapping::FileMapper;
use crate::namespace::inode;
use crate::options::NocowCheck;

/// Re-searches after which the checks run under the metadata lock.
pub(crate) const NOCOW_RETRIES: u32 = 8;

/// A test hook run after the unlocked checks, before the metadata lock is taken again,
/// with the mapping's operation and the target and first physical block checked (debug
/// builds only).
#[cfg(debug_assertions)]
pub type NocowHook = Arc<dyn Fn(IomapOp, TargetId, u64) + Send + Sync>;

/// One in-place decision, as the audit (`MountOptions::nocow_audit`) logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlace {
    pub target: u32,
    /// First block and blocks of the mapping written in place.
    pub phys: u64,
    pub blocks: u64,
    /// What an independent look at the indexes under the metadata lock, at the moment
    /// the decision was acted on, found wrong with it (`None`: every block has one
    /// owner and no checksum, and the file is NOCOW or the extent unwritten).
    pub violation: Option<String>,
}

/// The decision's counters since mount (`FsStatus`), and the test hook.
#[derive(Default)]
pub(crate) struct NocowStats {
    /// Writeback and direct-write decisions to write in place / copy on write.
    pub in_place: AtomicU64,
    pub cow: AtomicU64,
    /// Unlocked checks thrown away because the extent or the target's counts changed.
    pub researches: AtomicU64,
    /// Decisions taken under the lock after [`NOCOW_RETRIES`] re-searches.
    pub locked_fallbacks: AtomicU64,
    /// Writes that would have been in place but copy because their target is read-only
    /// (counted in `cow` too).
    pub read_only: AtomicU64,
    /// With `MountOptions::nocow_audit`: every in-place decision, until
    /// [`crate::Fs::take_in_place_log`] takes them.
    pub audit: parking_lot::Mutex<Vec<InPlace>>,
    #[cfg(debug_assertions)]
    pub hook: parking_lot::Mutex<Option<NocowHook>>,
}

impl std::fmt::Debug for NocowStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NocowStats")
            .field("in_place", &self.in_place)
            .field("cow", &self.cow)
            .field("researches", &self.researches)
            .field("locked_fallbacks", &self.locked_fallbacks)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// What a mapping is for, as far as the decision goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Reads, reports and preallocation: only sharing matters (the `SHARED` flag).
    Report,
    /// A data write: writeback, a direct write, a buffered write's reservation.
    DataWrite,
}

/// What the checks found for the blocks from the mapping's first physical block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checked {
    /// Blocks with the same owner count (the mapping is cut there).
    pub blocks: u64,
    pub owners: u32,
    /// Some block of them has a data checksum (asked only when it matters).
    pub csums: bool,
}

/// The facts a decision rests on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts {
    pub purpose: Purpose,
    /// The file is copy on write with data checksums.
    pub datacow: bool,
    pub state: ExtentState,
    pub checked: Checked,
}

/// I-001-1: whether the blocks are copied (`true`) or used in place. Pure, so that the
/// table is tested whole (`tests::decision_table`).
pub(crate) fn copies(f: Facts) -> bool {
    let shared = f.checked.owners >= 2;
    let datacow_written = f.datacow && f.state == ExtentState::Written;
    match f.purpose {
        Purpose::Report => shared || datacow_written,
        Purpose::DataWrite => shared || datacow_written || f.checked.csums,
    }
}

/// Whether a decision needs the checksum lookup: a data write the counts alone would let
/// write in place.
fn needs_csums(purpose: Purpose, datacow: bool, state: ExtentState, owners: u32) -> bool {
    purpose == Purpose::DataWrite && owners < 2 && !(datacow && state == ExtentState::Written)
}

/// Whether a decision places data (writeback, a direct write): what the counters count.
fn counted(op: IomapOp, purpose: Purpose) -> bool {
    purpose == Purpose::DataWrite && op != IomapOp::BufferedWrite
}

/// The fields read under the metadata lock, compared when it is taken again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cheap {
    extent_start: u64,
    target: TargetId,
    phys: u64,
    len: u64,
    state: ExtentState,
    ref_changes: u64,
}

/// What the lookup found, decided.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Found {
    Hole {
        next: Option<u64>,
    },
    Mapped {
        state: ExtentState,
        /// The target holding the extent.
        target: TargetId,
        /// Physical block of the mapping's first block.
        phys: u64,
        /// Blocks from `phys` the decision covers.
        blocks: u64,
        copy: bool,
    },
}

/// Where the checks read the reference counts from.
enum Counts<'m> {
    /// The overlay's own lock, then the trees: no lock of the file system held.
    Unlocked,
    /// Under the metadata lock (`nocow_check=locked`, or a locked fallback).
    Held(&'m MetaCore),
}

impl<'a> FileMapper<'a> {
    /// Takes the metadata lock and looks `obj_block` of `object` up; a mapped extent's
    /// in-place or copy decision for `op` is made by the discipline of the module
    /// documentation. Returns with the lock held, with the inode's map generation read
    /// under it.
    ///
    /// # Errors
    /// `Stale` for a missing inode; a failed reference-count lookup (which poisons) or
    /// checksum lookup.
    pub(crate) fn lookup_decided(
        &self,
        op: IomapOp,
        (object, obj_block): (u32, u64),
        want: u64,
    ) -> Result<(MetaGuard<'a>, u64, Found)> {
        let inner = &self.fs.inner;
        let purpose = match op {
            IomapOp::Writeback | IomapOp::BufferedWrite => Purpose::DataWrite,
            IomapOp::Write if self.dio_lock().is_some() => Purpose::DataWrite,
            _ => Purpose::Report,
        };
        let mut checked: Option<(Cheap, Checked)> = None;
        let mut attempt = 0;
        loop {
            let mut m = inner.meta.lock();
            let seq = m.inodes.entry(self.ino).map_gen;
            let (es, ext): (u64, Extent) =
                match inode(&m, self.ino)?.objects[object as usize].lookup(obj_block) {
                    Lookup::Hole { next } => return Ok((m, seq, Found::Hole { next })),
                    Lookup::Mapped { start, ext } => (start, ext),
                };
            let off_in = obj_block - es;
            let target = ext.target;
            let phys = ext.phys + off_in;
            let span = (ext.len - off_in).min(want);
            let cheap = Cheap {
                extent_start: es,
                target,
                phys: ext.phys,
                len: ext.len,
                state: ext.state,
                ref_changes: m.ref_changes_of(target),
            };
            let decided = |m: &MetaCore, c: Checked| {
                let copy = copies(Facts {
                    purpose,
                    datacow: self.datacow,
                    state: ext.state,
                    checked: c,
                }) || !self.admitted_in_place(op, purpose, target);
                self.count(op, purpose, copy);
                if !copy && inner.opts.nocow_audit && counted(op, purpose) {
                    let violation = self.audit(m, target, ext.state, phys, c.blocks);
                    inner.nocow.audit.lock().push(InPlace {
                        target: target.0,
                        phys,
                        blocks: c.blocks,
                        violation,
                    });
                }
                Found::Mapped {
                    state: ext.state,
                    target,
                    phys,
                    blocks: c.blocks,
                    copy,
                }
            };
            if let Some((was, c)) = checked {
                if was == cheap {
                    let found = decided(&m, c);
                    return Ok((m, seq, found));
                }
                inner.nocow.researches.fetch_add(1, Ordering::Relaxed);
            }
            let exhausted = attempt >= NOCOW_RETRIES;
            if exhausted || inner.opts.nocow_check == NocowCheck::Locked {
                if exhausted {
                    inner.nocow.locked_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                let c = self.check(Counts::Held(&m), purpose, target, ext.state, phys, span)?;
                let found = decided(&m, c);
                return Ok((m, seq, found));
            }
            drop(m);
            let c = self.check(Counts::Unlocked, purpose, target, ext.state, phys, span)?;
            #[cfg(debug_assertions)]
            if let Some(h) = inner.nocow.hook.lock().clone() {
                h(op, target, phys);
            }
            checked = Some((cheap, c));
            attempt += 1;
        }
    }

    /// The audit's independent look at an in-place decision, under the metadata lock it
    /// is acted on under: every piece of the range (not only the first) has one owner by
    /// `MetaCore::ref_pieces_for_write` (no count a transaction not yet durable changed,
    /// decision 94), no block has a checksum, and a datacow file's extent is
    /// unwritten.
    fn audit(
        &self,
        m: &MetaCore,
        target: TargetId,
        state: ExtentState,
        phys: u64,
        blocks: u64,
    ) -> Option<String> {
        if self.datacow && state == ExtentState::Written {
            return Some("a datacow file's written blocks".into());
        }
        let durable = self.fs.inner.journal.committed();
        match m.ref_pieces_for_write(target, phys, blocks, durable) {
            Err(e) => return Some(format!("refcount lookup: {e}")),
            Ok(p) => {
                if let Some((b, _, c)) = p.into_iter().find(|&(_, _, c)| c != 1) {
                    return Some(format!("block {b} has {c} owners"));
                }
            }
        }
        match self.fs.csums_exist(target, phys, blocks) {
            Err(e) => Some(format!("checksum lookup: {e}")),
            Ok(true) => Some("a block has a checksum".into()),
            Ok(false) => None,
        }
    }

    /// I-001-3, for a decision to write in place on `target`: a write that reaches the
    /// device is admitted as an in-place writer there (checked against read-only and
    /// counted in one step, left when the mapper is dropped); a buffered write's
    /// reservation only asks whether `target` is read-only. False: the write copies.
    fn admitted_in_place(&self, op: IomapOp, purpose: Purpose, target: TargetId) -> bool {
        let states = &self.fs.inner.states;
        match (purpose, op) {
            (Purpose::Report, _) => true,
            (Purpose::DataWrite, IomapOp::BufferedWrite) => !states.is_read_only(target),
            (Purpose::DataWrite, _) => {
                let ok = self.in_place.enter(target);
                if !ok {
                    self.fs
                        .inner
                        .nocow
                        .read_only
                        .fetch_add(1, Ordering::Relaxed);
                }
                ok
            }
        }
    }

    /// Counts a writeback or direct-write decision.
    fn count(&self, op: IomapOp, purpose: Purpose, copy: bool) {
        if !counted(op, purpose) {
            return;
        }
        let n = &self.fs.inner.nocow;
        let c = if copy { &n.cow } else { &n.in_place };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The expensive checks over `[phys, phys + span)` of `target`: the owner count of
    /// the first run of equal counts, and whether any block of it has a checksum when
    /// that decides.
    fn check(
        &self,
        counts: Counts<'_>,
        purpose: Purpose,
        target: TargetId,
        state: ExtentState,
        phys: u64,
        span: u64,
    ) -> Result<Checked> {
        let inner = &self.fs.inner;
        // A count a transaction not yet durable changed counts as shared (decision 94),
        // for every purpose, so a direct write's plan (`Report`) and its write agree.
        let durable = inner.journal.committed();
        let pieces = match counts {
            Counts::Held(m) => {
                inner.refs_ok(m.ref_pieces_for_write(target, phys, span, durable))?
            }
            Counts::Unlocked => {
                assert_meta_unlocked("the in-place decision's reference-count lookup");
                inner.refs_ok(crate::refcount::pieces_for_write_of(
                    &inner.ref_overlay,
                    &inner.store,
                    (target, phys, span),
                    durable,
                ))?
            }
        };
        let (_, blocks, owners) = pieces[0];
        let csums = needs_csums(purpose, self.datacow, state, owners)
            && self.fs.csums_exist(target, phys, blocks)?;
        if matches!(counts, Counts::Unlocked) {
            assert_meta_unlocked("the in-place decision's checksum lookup");
        }
        Ok(Checked {
            blocks,
            owners,
            csums,
        })
    }
}

impl crate::Fs {
    /// The in-place decisions of writeback and direct writes logged since the last call
    /// (`MountOptions::nocow_audit`), each with the audit's verdict.
    pub fn take_in_place_log(&self) -> Vec<InPlace> {
        std::mem::take(&mut *self.inner.nocow.audit.lock())
    }

    /// Every block no data write may write in place, by the indexes: `(target, block)` of
    /// each block with two or more owners (`"shared"`) or a data checksum
    /// (`"checksummed"`). Reads both whole indexes (tests and tools).
    ///
    /// # Errors
    /// A tree that could not be read.
    pub fn shared_or_checksummed(
        &self,
    ) -> std::result::Result<std::collections::BTreeMap<(u32, u64), &'static str>, String> {
        let m = self.inner.meta.lock();
        let mut out: std::collections::BTreeMap<(u32, u64), &'static str> = self
            .checksummed_blocks()?
            .into_keys()
            .map(|(t, b)| ((t.0, b), "checksummed"))
            .collect();
        let refs = m
            .ref_index(self.inner.target_count())
            .map_err(|e| e.to_string())?;
        for (t, start, e) in refs.iter() {
            if e.count >= 2 {
                out.extend((start..start + e.len).map(|b| ((t.0, b), "shared")));
            }
        }
        Ok(out)
    }

    /// Test hook (debug builds): `hook` runs on every unlocked in-place decision after
    /// its checks, before the metadata lock is taken again to re-validate them, with the
    /// mapping's operation, the target and the first physical block checked; `None` removes it. The hook may
    /// call the file system (no lock of it is held), but not on the file being mapped.
    #[cfg(debug_assertions)]
    #[doc(hidden)]
    pub fn set_nocow_hook(&self, hook: Option<NocowHook>) {
        *self.inner.nocow.hook.lock() = hook;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(
        purpose: Purpose,
        datacow: bool,
        state: ExtentState,
        owners: u32,
        csums: bool,
    ) -> Facts {
        Facts {
            purpose,
            datacow,
            state,
            checked: Checked {
                blocks: 1,
                owners,
                csums,
            },
        }
    }

    /// I-001-1 whole: in place only for one owner, no checksum, and a NOCOW file or an
    /// unwritten extent; reads see `SHARED` only for sharing (and a datacow file's
    /// written blocks, as before).
    #[test]
    fn decision_table() {
        use ExtentState::{Unwritten, Written};
        use Purpose::{DataWrite, Report};
        for state in [Written, Unwritten] {
            assert!(
                !copies(facts(DataWrite, false, state, 1, false)),
                "plain NOCOW"
            );
            assert!(copies(facts(DataWrite, false, state, 2, false)), "shared");
            assert!(
                copies(facts(DataWrite, false, state, 1, true)),
                "checksummed"
            );
            assert!(
                copies(facts(DataWrite, true, state, 3, false)),
                "datacow shared"
            );
            assert!(
                !copies(facts(Report, false, state, 1, true)),
                "a read ignores checksums"
            );
            assert!(
                copies(facts(Report, false, state, 2, false)),
                "a read sees sharing"
            );
        }
        assert!(
            copies(facts(DataWrite, true, Written, 1, false)),
            "datacow written"
        );
        assert!(
            !copies(facts(DataWrite, true, Unwritten, 1, false)),
            "datacow unwritten"
        );
        assert!(needs_csums(DataWrite, false, Written, 1));
        assert!(!needs_csums(DataWrite, false, Written, 2), "already copied");
        assert!(!needs_csums(DataWrite, true, Written, 1), "already copied");
        assert!(!needs_csums(Report, false, Written, 1));
    }

    /// The I-001-2 assertion fires: an unlocked check run with a metadata-lock guard
    /// alive on this thread panics in debug builds.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "ran with the metadata lock held (I-001-2)")]
    fn unlocked_check_under_the_metadata_lock_panics() {
        use stripefs_target::{SimTarget, Target};
        let t: Vec<std::sync::Arc<dyn Target>> = vec![std::sync::Arc::new(SimTarget::from_image(
            "sim0",
            vec![0; 16 << 20],
            512,
        ))];
        crate::Fs::mkfs(&t, &crate::MkfsOptions::default()).expect("mkfs");
        let (fs, _) = crate::Fs::mount(t, crate::MountOptions::default()).expect("mount");
        let ino = fs
            .create(
                stripefs_core::Ino::ROOT,
                "f".as_ref(),
                crate::CreateParams::with_perm(0o644),
            )
            .expect("create")
            .ino;
        let mapper = FileMapper::new(&fs, ino).expect("mapper");
        let _held = fs.inner.meta.lock();
        let _ = mapper.check(
            Counts::Unlocked,
            Purpose::DataWrite,
            TargetId(0),
            ExtentState::Written,
            100,
            1,
        );
    }
}

//! The reference-count index at run time (`docs/design/reflink.md`, "The runtime reads
//! the index from the trees").
//!
//! The index lives in the `refcount` tree and is never held whole in memory. What the
//! trees do not hold yet (the `RefcountSet` records the checkpointer has not applied) is
//! the [`RefcountOverlay`]: runs of blocks with the count a record gave them and the
//! transaction that logged it, dropped once the trees hold that transaction (when the
//! metadata lock is released after the checkpointer's applied mark passed it, as the
//! checksum and directory overlays) and it is durable (decision 94 reads the runs after
//! the durable mark as pending; a transaction larger than the journal is applied before
//! the checkpoint that commits it is written). Its size follows the unapplied records (each record
//! adds one run and cuts at most one other in two), never the index.
//!
//! Lookups ([`MetaCore::ref_pieces`], [`MetaCore::ref_share`], [`MetaCore::ref_release`],
//! [`MetaCore::nothing_shared`]) run under the metadata lock, where every count change is
//! logged, so the overlay they see is stable. A block the overlay holds takes its count;
//! the others are read from the trees (`stripefs_meta::refcount::shared`). Those reads
//! race the checkpointer, which applies records without the metadata lock, but only
//! records the overlay still holds (their transaction is above the applied mark at the
//! overlay's last drop), so no record being applied changes a block the trees are asked
//! about, and `refcount::set` orders its item changes so that such a block reads its
//! count at every moment of the change. Reading the trees under the metadata lock is
//! I/O under it on a page miss: the documented exception of decision 88.
//!
//! The in-place decision's lookup ([`pieces_for_write_of`], and
//! [`MetaCore::ref_pieces_for_write`] under the lock) reads the overlay under its own
//! lock instead, runs, pending runs and `trees_may_hold` at one moment, then the trees,
//! and is re-validated under the metadata lock (`nocow.rs`): a count change logged after
//! that moment, which could set `trees_may_hold` or add a run, bumps the target's
//! counter and forces a re-search. A block whose count a transaction after
//! `Journal::committed` set counts as shared there (decision 94).
//!
//! `share` and `release` keep one implementation of the counting rules: a small
//! `RefcountIndex` holding the counts over just the ranges involved (overlay over trees)
//! is built and asked, as `RefcountIndex::share`/`release` ask the whole index.

use stripefs_core::record::Record;
use stripefs_core::refcount::{PhysPiece, RefcountIndex, Release};
use stripefs_core::TargetId;

use parking_lot::Mutex;

use crate::error::{FsError, Result};
use crate::inner::MetaCore;
use crate::runmap::{RunMap, RunValue};

/// A run's count (1: not shared): the same for every block, so a piece keeps it.
#[derive(Debug, Clone, Copy)]
struct Count(u32);

impl RunValue for Count {
    fn slice(&self, _from: u64, _to: u64) -> Self {
        *self
    }
}

#[derive(Debug, Default)]
struct OverlayInner {
    runs: RunMap<Count>,
    /// False only when the `refcount` tree holds no entry and no record logged since
    /// could add one: lookups then read nothing (a file system that shares nothing
    /// costs no tree read, as when the index was in memory). Set by every count of 2 or
    /// more logged (before the checkpointer can apply it); cleared by
    /// [`MetaCore::nothing_shared`] when it finds the overlay and the tree empty.
    trees_may_hold: bool,
}

/// The count changes of records the trees do not hold yet (see the module
/// documentation). Changed only under the metadata lock (by `MetaCore::log` and the
/// guard's release); its own lock, innermost (nothing is taken while it is held), lets
/// the in-place decision read it without the metadata lock (`nocow.rs`).
#[derive(Debug)]
pub(crate) struct RefcountOverlay {
    inner: Mutex<OverlayInner>,
}

impl RefcountOverlay {
    /// An overlay over a `refcount` tree that holds entries (`trees_may_hold`) or none.
    pub fn new(trees_may_hold: bool) -> Self {
        Self {
            inner: Mutex::new(OverlayInner {
                trees_may_hold,
                ..OverlayInner::default()
            }),
        }
    }

    /// Records that `[start, start + len)` of `t` has `count` owners since transaction
    /// `seq`.
    pub fn set(&self, t: TargetId, start: u64, len: u64, count: u32, seq: u64) {
        if len == 0 {
            return;
        }
        let mut o = self.inner.lock();
        o.trees_may_hold |= count >= 2;
        o.runs
            .set(t, start, start.saturating_add(len), Count(count), seq);
    }

    /// Drops the changes of transactions at or below `applied` (the trees hold them):
    /// constant time when there are none.
    pub fn drop_applied(&self, applied: u64) {
        self.inner.lock().runs.drop_applied(applied);
    }

    /// What a lookup of `[start, end)` of `t` needs from the overlay, read under its
    /// lock at one moment (`OverlayView`).
    fn view(&self, t: TargetId, start: u64, end: u64, durable: Option<u64>) -> OverlayView {
        let o = self.inner.lock();
        let mut runs = Vec::new();
        let mut pending = Vec::new();
        for (s, r) in o.runs.overlapping(t, start, end) {
            let (lo, hi) = (s.max(start), r.end.min(end));
            runs.push((lo, hi, r.value.0));
            if durable.is_some_and(|d| r.seq > d) {
                pending.push((lo, hi));
            }
        }
        OverlayView {
            runs,
            pending,
            trees_may_hold: o.trees_may_hold,
        }
    }

    /// The runs over `[start, end)` of `t`, cut to it: `(first, end, count)` in order.
    #[cfg(test)]
    fn over(&self, t: TargetId, start: u64, end: u64) -> Vec<(u64, u64, u32)> {
        self.view(t, start, end, None).runs
    }

    /// Every run: `(target, first, end, count)`.
    fn all(&self) -> Vec<(TargetId, u64, u64, u32)> {
        let o = self.inner.lock();
        o.runs
            .iter()
            .map(|(t, s, r)| (t, s, r.end, r.value.0))
            .collect()
    }

    /// Runs held (statistics, tests).
    pub fn runs(&self) -> usize {
        self.inner.lock().runs.len()
    }

    /// True when every count change is in the trees.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().runs.is_empty()
    }

    /// Whether the trees may hold an entry (`OverlayInner::trees_may_hold`).
    fn trees_may_hold(&self) -> bool {
        self.inner.lock().trees_may_hold
    }
}

/// The overlay over one range, read at one moment under its lock.
struct OverlayView {
    /// `(first, end, count)` of the runs, cut to the range, in order.
    runs: Vec<(u64, u64, u32)>,
    /// `(first, end)` of the runs a transaction after the durable mark set (asked for by
    /// a write's decision only).
    pending: Vec<(u64, u64)>,
    trees_may_hold: bool,
}

/// Adds to `idx` the counts of `[start, start + len)` of `t`: `overlay`'s where it holds
/// a block, the trees' elsewhere (not read when the overlay holds the range, nor while
/// the trees are known empty: `trees_may_hold`). The overlay is read first, then the
/// trees: why that order is right with or without the metadata lock is in the module
/// documentation and `nocow.rs`. With `durable`, a write's view (decision 94): a block
/// whose count a transaction after `durable` set counts as shared (at least 2).
fn counts_into(
    overlay: &RefcountOverlay,
    store: &stripefs_meta::Store,
    idx: &mut RefcountIndex,
    (t, start, len): PhysPiece,
    durable: Option<u64>,
) -> Result<()> {
    let end = start.saturating_add(len);
    let view = overlay.view(t, start, end, durable);
    let held: u64 = view.runs.iter().map(|(lo, hi, _)| hi - lo).sum();
    if held < end - start && view.trees_may_hold {
        let trees = stripefs_meta::refcount::shared(store, t, start, end).map_err(FsError::from)?;
        for (s, e) in trees {
            idx.set(t, s, e.len, e.count);
        }
    }
    for (lo, hi, count) in view.runs {
        idx.set(t, lo, hi - lo, count);
    }
    for (lo, hi) in view.pending {
        for (p, n, c) in idx.pieces(t, lo, hi - lo) {
            if c < 2 {
                idx.set(t, p, n, 2);
            }
        }
    }
    Ok(())
}

/// `[start, start + len)` of `t` cut where the count changes as a write's in-place
/// decision must see it (`MetaCore::ref_pieces_for_write`, decision 94: a count a
/// transaction after `durable` changed counts as shared), read from `overlay` then
/// `store` by a caller that may hold no lock of the file system.
///
/// # Errors
/// The trees' read or decode error.
pub(crate) fn pieces_for_write_of(
    overlay: &RefcountOverlay,
    store: &stripefs_meta::Store,
    (t, start, len): PhysPiece,
    durable: u64,
) -> Result<Vec<(u64, u64, u32)>> {
    let mut idx = RefcountIndex::new();
    counts_into(overlay, store, &mut idx, (t, start, len), Some(durable))?;
    Ok(idx.pieces(t, start, len))
}

impl crate::inner::FsInner {
    /// The result of a reference-count lookup. A failure (an unreadable or damaged
    /// `refcount` page) poisons the file system: the counts could not be known, so no
    /// write may trust them, and the caller may be between records of one transaction
    /// (an unmapping logged, its decrements not), which must never commit half.
    ///
    /// # Errors
    /// `r`'s error.
    pub fn refs_ok<T>(&self, r: Result<T>) -> Result<T> {
        r.inspect_err(|e| self.poison(&format!("reference-count lookup: {e}")))
    }
}

impl MetaCore {
    /// Adds to `idx` the counts of `[start, start + len)` of `t`: the overlay's where it
    /// holds a block, the trees' elsewhere (not read when the overlay holds the range).
    fn ref_counts_into(
        &self,
        idx: &mut RefcountIndex,
        t: TargetId,
        start: u64,
        len: u64,
    ) -> Result<()> {
        counts_into(&self.refs, self.state.store(), idx, (t, start, len), None)
    }

    /// The counts over `pieces` only, as an index (what `share` and `release` read).
    fn ref_window(&self, pieces: &[PhysPiece]) -> Result<RefcountIndex> {
        let mut idx = RefcountIndex::new();
        for &(t, start, len) in pieces {
            self.ref_counts_into(&mut idx, t, start, len)?;
        }
        Ok(idx)
    }

    /// `[start, start + len)` of `t` cut where the count changes: `(first, blocks,
    /// count)` in order, count 1 where nothing is shared (`RefcountIndex::pieces`).
    ///
    /// # Errors
    /// The trees' read or decode error.
    pub fn ref_pieces(&self, t: TargetId, start: u64, len: u64) -> Result<Vec<(u64, u64, u32)>> {
        Ok(self.ref_window(&[(t, start, len)])?.pieces(t, start, len))
    }

    /// [`Self::ref_pieces`] as a write's in-place decision must see it: a block whose
    /// count a transaction after `durable` changed counts as shared (at least 2). Its
    /// count may have dropped to 1 because another owner let go (an unlink, a truncate,
    /// the other file's copy on write), but until that transaction is durable a crash
    /// brings the other owner back: a write in place would land in its data. btrfs
    /// counts such delayed reference drops as other owners the same way (seed 001's
    /// "no pending reference change", I-001-1). Every mapping decision asks this one
    /// (planning and the write alike), so they agree; releases and clones keep the
    /// exact counts.
    ///
    /// # Errors
    /// As [`Self::ref_pieces`].
    pub fn ref_pieces_for_write(
        &self,
        t: TargetId,
        start: u64,
        len: u64,
        durable: u64,
    ) -> Result<Vec<(u64, u64, u32)>> {
        pieces_for_write_of(&self.refs, self.state.store(), (t, start, len), durable)
    }

    /// The records adding one owner to every block of `pieces` (`RefcountIndex::share`).
    ///
    /// # Errors
    /// As [`Self::ref_pieces`].
    pub fn ref_share(&self, pieces: &[PhysPiece]) -> Result<Vec<Record>> {
        Ok(self.ref_window(pieces)?.share(pieces))
    }

    /// What unmapping `pieces` does (`RefcountIndex::release`).
    ///
    /// # Errors
    /// As [`Self::ref_pieces`].
    pub fn ref_release(&self, pieces: &[PhysPiece]) -> Result<Release> {
        Ok(self.ref_window(pieces)?.release(pieces))
    }

    /// Whether no block is shared at all: the overlay holds nothing and the trees hold no
    /// entry (known without a read once found, else one descent). Exact: with the overlay
    /// empty every count change is in the trees, and the checkpointer has none left to
    /// apply; the trees gain an entry only from a record logged later, which sets
    /// `trees_may_hold` again first.
    ///
    /// # Errors
    /// As [`Self::ref_pieces`].
    pub fn nothing_shared(&mut self) -> Result<bool> {
        if !self.refs.is_empty() {
            return Ok(false);
        }
        if !self.refs.trees_may_hold() {
            return Ok(true);
        }
        let empty = stripefs_meta::refcount::is_empty(self.state.store()).map_err(FsError::from)?;
        if empty {
            // Under the metadata lock, where every count is logged: no record can set
            // the flag between the look at the overlay and this.
            self.refs.inner.lock().trees_may_hold = false;
        }
        Ok(empty)
    }

    /// The whole index, the trees with the overlay over them, read one entry at a time
    /// (tests and tools that already read every inode: memory follows the index here).
    ///
    /// # Errors
    /// As [`Self::ref_pieces`].
    pub fn ref_index(&self, targets: u32) -> Result<RefcountIndex> {
        let mut idx = RefcountIndex::new();
        let may_hold = self.refs.trees_may_hold();
        for t in (0..targets).map(TargetId).filter(|_| may_hold) {
            let trees = stripefs_meta::refcount::shared(self.state.store(), t, 0, u64::MAX)
                .map_err(FsError::from)?;
            for (s, e) in trees {
                idx.set(t, s, e.len, e.count);
            }
        }
        for (t, s, end, count) in self.refs.all() {
            idx.set(t, s, end - s, count);
        }
        Ok(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TargetId = TargetId(0);

    #[test]
    fn runs_cut_and_drop_by_transaction() {
        let o = RefcountOverlay::new(false);
        o.set(T, 0, 10, 2, 5);
        o.set(T, 4, 2, 1, 6);
        assert_eq!(o.over(T, 0, 10), vec![(0, 4, 2), (4, 6, 1), (6, 10, 2)]);
        o.drop_applied(5);
        assert_eq!(
            o.over(T, 0, 10),
            vec![(4, 6, 1)],
            "transaction 5 is in the trees"
        );
        o.drop_applied(6);
        assert!(o.is_empty());
        let o = o.inner.lock();
        assert!(
            o.trees_may_hold,
            "a count of 2 was logged: the trees may hold it"
        );
    }
}

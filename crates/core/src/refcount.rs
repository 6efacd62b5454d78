//! The reference-count index: the physical ranges that two or more extents map
//! (`docs/design/reflink.md`).
//!
//! As XFS's refcount btree, the index holds only counts of 2 and more: a mapped block
//! absent from it has exactly one owner, so "is this block shared?" and "does exactly one
//! extent own it?" are one lookup, and files that share nothing cost nothing. Entries are
//! kept canonical (no overlap, no zero length, neighbours with the same count merged), so
//! the in-memory model and the `refcount` tree's items agree entry for entry. The runtime
//! holds no whole index: it builds small ones over just the ranges a clone or a release
//! involves (its overlay over the trees) and asks them [`RefcountIndex::share`] and
//! [`RefcountIndex::release`], so these rules have one implementation.
//!
//! Counts change only through `Record::RefcountSet` (an absolute count over a range, so
//! records stay idempotent "set" operations). Within a transaction a clone logs its
//! increments before the extent records that map the blocks again, and every release
//! logs its decrements after the extent records that unmap them: a record that maps or
//! unmaps blocks takes or frees in the space books exactly the blocks the index does not
//! hold at that moment.

use std::collections::BTreeMap;

use crate::record::Record;
use crate::TargetId;

/// One shared range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shared {
    /// Length in blocks (> 0).
    pub len: u64,
    /// Extents mapping each block of the range (>= 2).
    pub count: u32,
}

/// Physical blocks of one target: `(target, first block, blocks)`.
pub type PhysPiece = (TargetId, u64, u64);

/// The shared ranges of every target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefcountIndex {
    map: BTreeMap<(TargetId, u64), Shared>,
}

/// What releasing pieces of extents does: the records lowering shared counts (to log
/// after the extent records that unmap the pieces) and the blocks whose last owner let
/// go (to free).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Release {
    pub records: Vec<Record>,
    pub freed: Vec<PhysPiece>,
}

impl RefcountIndex {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is shared.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every entry in order: `(target, first block, range)`.
    pub fn iter(&self) -> impl Iterator<Item = (TargetId, u64, Shared)> + '_ {
        self.map.iter().map(|(&(t, s), &e)| (t, s, e))
    }

    /// Blocks held by entries (each shared block once).
    #[must_use]
    pub fn shared_blocks(&self) -> u64 {
        self.map.values().map(|e| e.len).sum()
    }

    /// Adds an entry after every entry of its target, as it is: how an index read back
    /// from storage is rebuilt exactly.
    ///
    /// # Errors
    /// A description when the entry is empty, overflows, has a count below 2 or does not
    /// start at or after the end of the previous entry of its target.
    pub fn append(&mut self, t: TargetId, start: u64, e: Shared) -> Result<(), String> {
        let end = self
            .map
            .range(..(TargetId(t.0.saturating_add(1)), 0))
            .next_back()
            .filter(|((pt, _), _)| *pt == t)
            .map_or(0, |(&(_, s), p)| s + p.len);
        if e.len == 0 || start.checked_add(e.len).is_none() || start < end || e.count < 2 {
            return Err(format!(
                "shared range of {} blocks at target {t} block {start} with count {} \
                 after the previous range's end {end}",
                e.len, e.count
            ));
        }
        self.map.insert((t, start), e);
        Ok(())
    }

    /// The extents mapping `block` of `t` if it is mapped at all: 2 or more when the
    /// index holds it, else 1.
    #[must_use]
    pub fn owners(&self, t: TargetId, block: u64) -> u32 {
        match self.map.range(..=(t, block)).next_back() {
            Some((&(pt, s), e)) if pt == t && block < s + e.len => e.count,
            _ => 1,
        }
    }

    /// Whether any block of `[start, start + len)` on `t` is shared.
    #[must_use]
    pub fn is_shared(&self, t: TargetId, start: u64, len: u64) -> bool {
        self.pieces(t, start, len).iter().any(|p| p.2 >= 2)
    }

    /// `[start, start + len)` of `t` cut where the count changes: `(first, blocks, count)`
    /// in order, count 1 where the index holds nothing.
    #[must_use]
    pub fn pieces(&self, t: TargetId, start: u64, len: u64) -> Vec<(u64, u64, u32)> {
        let end = start.saturating_add(len);
        let mut out = Vec::new();
        let mut at = start;
        let first = match self.map.range(..=(t, start)).next_back() {
            Some((&(pt, s), e)) if pt == t && start < s + e.len => s,
            _ => start,
        };
        for (&(_, s), e) in self.map.range((t, first)..(t, end)) {
            if s > at {
                out.push((at, s - at, 1));
            }
            let lo = s.max(at);
            let hi = (s + e.len).min(end);
            if hi > lo {
                out.push((lo, hi - lo, e.count));
                at = hi;
            }
        }
        if at < end {
            out.push((at, end - at, 1));
        }
        out
    }

    /// Sets the count of `[start, start + len)` on `t` (1 or 0: not shared, dropped from
    /// the index), merging with neighbours of the same count.
    pub fn set(&mut self, t: TargetId, start: u64, len: u64, count: u32) {
        if len == 0 {
            return;
        }
        let end = start + len;
        // Split an entry reaching into the range from below.
        if let Some((&(pt, s), &e)) = self.map.range(..(t, start)).next_back() {
            if pt == t && s + e.len > start {
                self.map.insert(
                    (t, s),
                    Shared {
                        len: start - s,
                        ..e
                    },
                );
                self.map.insert(
                    (t, start),
                    Shared {
                        len: s + e.len - start,
                        ..e
                    },
                );
            }
        }
        let inside: Vec<u64> = self
            .map
            .range((t, start)..(t, end))
            .map(|(&(_, s), _)| s)
            .collect();
        for s in inside {
            let e = self.map.remove(&(t, s)).expect("just listed");
            if s + e.len > end {
                self.map.insert(
                    (t, end),
                    Shared {
                        len: s + e.len - end,
                        ..e
                    },
                );
            }
        }
        if count < 2 {
            return;
        }
        let (mut s, mut l) = (start, len);
        if let Some((&(pt, ps), &pe)) = self.map.range(..(t, start)).next_back() {
            if pt == t && ps + pe.len == start && pe.count == count {
                self.map.remove(&(t, ps));
                s = ps;
                l += pe.len;
            }
        }
        if let Some(&ne) = self.map.get(&(t, end)) {
            if ne.count == count {
                self.map.remove(&(t, end));
                l += ne.len;
            }
        }
        self.map.insert((t, s), Shared { len: l, count });
    }

    /// A scratch copy holding the entries over `pieces` (what a plan needs to read).
    fn scratch(&self, pieces: &[PhysPiece]) -> RefcountIndex {
        let mut s = RefcountIndex::new();
        for &(t, start, len) in pieces {
            for (p, l, c) in self.pieces(t, start, len) {
                if c >= 2 {
                    s.set(t, p, l, c);
                }
            }
        }
        s
    }

    /// The records that add one owner to every block of `pieces` (mapped blocks: each
    /// has at least its current owner). Log them before the extent records that map the
    /// blocks again.
    #[must_use]
    pub fn share(&self, pieces: &[PhysPiece]) -> Vec<Record> {
        let mut s = self.scratch(pieces);
        let mut out = Vec::new();
        for &(t, start, len) in pieces {
            for (p, l, c) in s.pieces(t, start, len) {
                let count = c.saturating_add(1);
                s.set(t, p, l, count);
                out.push(Record::RefcountSet {
                    target: t,
                    phys: p,
                    len: l,
                    count,
                });
            }
        }
        out
    }

    /// What unmapping `pieces` (one owner each) does: shared blocks lose an owner, the
    /// others are free.
    #[must_use]
    pub fn release(&self, pieces: &[PhysPiece]) -> Release {
        let mut s = self.scratch(pieces);
        let mut r = Release::default();
        for &(t, start, len) in pieces {
            for (p, l, c) in s.pieces(t, start, len) {
                if c >= 2 {
                    s.set(t, p, l, c - 1);
                    r.records.push(Record::RefcountSet {
                        target: t,
                        phys: p,
                        len: l,
                        count: c - 1,
                    });
                } else {
                    r.freed.push((t, p, l));
                }
            }
        }
        r
    }

    /// The index derived from extents: every `(target, first block, blocks)` one extent
    /// maps, counted. What fsck and the model tests compare the index with.
    #[must_use]
    pub fn derive(extents: impl IntoIterator<Item = PhysPiece>) -> RefcountIndex {
        // Sweep of +1/-1 events per target.
        let mut events: BTreeMap<(TargetId, u64), i64> = BTreeMap::new();
        for (t, s, l) in extents {
            if l == 0 {
                continue;
            }
            *events.entry((t, s)).or_default() += 1;
            *events.entry((t, s.saturating_add(l))).or_default() -= 1;
        }
        let mut out = RefcountIndex::new();
        let mut depth = 0i64;
        let mut prev: Option<(TargetId, u64)> = None;
        for ((t, at), d) in events {
            if let Some((pt, ps)) = prev {
                if pt == t && depth >= 2 && at > ps {
                    let c = u32::try_from(depth).unwrap_or(u32::MAX);
                    out.set(t, ps, at - ps, c);
                }
                if pt != t {
                    depth = 0;
                }
            }
            depth += d;
            prev = Some((t, at));
        }
        out
    }

    /// The first difference between `self` (the index) and `derived` (counts from the
    /// extents), worded for fsck.
    #[must_use]
    pub fn first_difference(&self, derived: &RefcountIndex) -> Option<String> {
        let a: Vec<_> = self.iter().collect();
        let b: Vec<_> = derived.iter().collect();
        for i in 0..a.len().max(b.len()) {
            match (a.get(i), b.get(i)) {
                (Some(x), Some(y)) if x == y => {}
                (Some((t, s, e)), other) => {
                    let found = other.map_or_else(
                        || "nothing more".to_string(),
                        |(dt, ds, de)| {
                            format!(
                                "target {dt} blocks {ds}..{} mapped {} times",
                                ds + de.len,
                                de.count
                            )
                        },
                    );
                    return Some(format!(
                        "refcount index says target {t} blocks {s}..{} have {} owners, \
                         the extents give {found}",
                        s + e.len,
                        e.count
                    ));
                }
                (None, Some((t, s, e))) => {
                    return Some(format!(
                        "target {t} blocks {s}..{} are mapped {} times but the refcount \
                         index does not hold them",
                        s + e.len,
                        e.count
                    ));
                }
                (None, None) => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TargetId = TargetId(0);

    #[test]
    fn set_splits_merges_and_drops() {
        let mut x = RefcountIndex::new();
        x.set(T, 10, 10, 2);
        x.set(T, 20, 5, 2);
        assert_eq!(x.len(), 1, "same count next door merges");
        x.set(T, 12, 3, 3);
        assert_eq!(
            x.pieces(T, 8, 20),
            vec![(8, 2, 1), (10, 2, 2), (12, 3, 3), (15, 10, 2), (25, 3, 1)]
        );
        x.set(T, 12, 3, 2);
        assert_eq!(x.len(), 1, "back to one range");
        x.set(T, 0, 100, 1);
        assert!(x.is_empty());
        assert_eq!(x.owners(T, 11), 1);
    }

    #[test]
    fn share_then_release_round_trips_and_frees_last_owner() {
        let x = RefcountIndex::new();
        // Two pieces over the same blocks: the second sees the first's increment.
        let recs = x.share(&[(T, 0, 4), (T, 2, 4)]);
        let mut y = x.clone();
        for r in &recs {
            if let Record::RefcountSet {
                target,
                phys,
                len,
                count,
            } = *r
            {
                y.set(target, phys, len, count);
            }
        }
        assert_eq!(y.pieces(T, 0, 6), vec![(0, 2, 2), (2, 2, 3), (4, 2, 2)]);
        let r = y.release(&[(T, 0, 6), (T, 2, 2)]);
        assert!(r.freed.is_empty(), "every block kept an owner");
        let mut z = y.clone();
        for rec in &r.records {
            if let Record::RefcountSet {
                target,
                phys,
                len,
                count,
            } = *rec
            {
                z.set(target, phys, len, count);
            }
        }
        assert!(z.is_empty());
        let last = z.release(&[(T, 0, 6)]);
        assert_eq!(last.freed, vec![(T, 0, 6)]);
    }

    #[test]
    fn derive_counts_overlaps() {
        let d = RefcountIndex::derive([(T, 0, 10), (T, 5, 10), (TargetId(1), 0, 3), (T, 5, 2)]);
        assert_eq!(
            d.pieces(T, 0, 16),
            vec![(0, 5, 1), (5, 2, 3), (7, 3, 2), (10, 6, 1)]
        );
        assert!(!d.is_shared(TargetId(1), 0, 3));
        let mut idx = RefcountIndex::new();
        idx.set(T, 5, 2, 3);
        assert!(idx.first_difference(&d).is_some());
        idx.set(T, 7, 3, 2);
        assert_eq!(idx.first_difference(&d), None);
    }
}

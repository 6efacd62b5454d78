//! Delayed allocations: object block ranges that have dirty data in the page cache and
//! space reserved on a target, but no blocks yet. In memory only (never on disk): a
//! crash loses them along with the dirty cache they stand for.
//!
//! Each range remembers the target its reservation was taken on (the object's home
//! target, or another one when the home target was read-only at the write: decision
//! 101), so whatever gives a reservation back gives it to the target that holds it,
//! whatever the targets' states are by then.

use std::collections::BTreeMap;

use stripefs_core::TargetId;

/// One delayed-allocation range: its length and the target holding its reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delayed {
    pub len: u64,
    pub target: TargetId,
}

/// Reserved blocks per target that a removal took out of a map: what goes back to the
/// allocator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "the reservations removed must be given back"]
pub(crate) struct Removed(Vec<(TargetId, u64)>);

impl Removed {
    fn add(&mut self, t: TargetId, n: u64) {
        match self.0.iter_mut().find(|(x, _)| *x == t) {
            Some((_, c)) => *c += n,
            None => self.0.push((t, n)),
        }
    }

    /// Blocks removed on every target.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// Blocks removed on `t`.
    pub fn on(&self, t: TargetId) -> u64 {
        self.0.iter().filter(|(x, _)| *x == t).map(|(_, n)| n).sum()
    }

    /// Gives every removed reservation back to `alloc`.
    pub fn unreserve(self, alloc: &mut stripefs_core::alloc::Allocator) {
        for (t, n) in self.0 {
            alloc.unreserve(t, n);
        }
    }
}

/// Delayed-allocation ranges of one object: start block -> range, non-overlapping,
/// adjacent ranges on the same target merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DelallocMap {
    map: BTreeMap<u64, Delayed>,
}

impl DelallocMap {
    /// The range covering `block`, as (start, len, target).
    pub fn covering(&self, block: u64) -> Option<(u64, u64, TargetId)> {
        let (&s, d) = self.map.range(..=block).next_back()?;
        (block < s + d.len).then_some((s, d.len, d.target))
    }

    /// Start of the first range after `block`.
    pub fn next_after(&self, block: u64) -> Option<u64> {
        self.map.range(block + 1..).next().map(|(&s, _)| s)
    }

    /// Adds `[start, start + len)` reserved on `target`, which must not overlap an
    /// existing range.
    pub fn insert(&mut self, start: u64, len: u64, target: TargetId) {
        debug_assert!(len > 0);
        debug_assert!(self.overlap(start, len) == 0, "delalloc ranges overlap");
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pd)) = self.map.range(..start).next_back() {
            if ps + pd.len == start && pd.target == target {
                self.map.remove(&ps);
                s = ps;
                l += pd.len;
            }
        }
        if let Some(&nd) = self.map.get(&(start + len)) {
            if nd.target == target {
                self.map.remove(&(start + len));
                l += nd.len;
            }
        }
        self.map.insert(s, Delayed { len: l, target });
    }

    /// Blocks of `[start, start + len)` that are delalloc.
    pub fn overlap(&self, start: u64, len: u64) -> u64 {
        let end = start + len;
        let first = self.covering(start).map_or(start, |(s, _, _)| s);
        self.map
            .range(first..end)
            .map(|(&s, d)| (s + d.len).min(end) - s.max(start))
            .sum()
    }

    /// Removes `[start, start + len)`; returns the reservations it held, per target.
    pub fn remove(&mut self, start: u64, len: u64) -> Removed {
        let end = start + len;
        let mut removed = Removed::default();
        let first = self.covering(start).map_or(start, |(s, _, _)| s);
        let keys: Vec<(u64, Delayed)> = self.map.range(first..end).map(|(&s, &d)| (s, d)).collect();
        for (s, d) in keys {
            self.map.remove(&s);
            removed.add(d.target, (s + d.len).min(end) - s.max(start));
            if s < start {
                self.map.insert(
                    s,
                    Delayed {
                        len: start - s,
                        ..d
                    },
                );
            }
            if s + d.len > end {
                self.map.insert(
                    end,
                    Delayed {
                        len: s + d.len - end,
                        ..d
                    },
                );
            }
        }
        removed
    }

    /// All ranges, as (start, len, target).
    pub fn ranges(&self) -> Vec<(u64, u64, TargetId)> {
        self.map
            .iter()
            .map(|(&s, d)| (s, d.len, d.target))
            .collect()
    }

    /// The ranges reserved on `t`, as (start, len).
    pub fn ranges_on(&self, t: TargetId) -> Vec<(u64, u64)> {
        self.map
            .iter()
            .filter(|(_, d)| d.target == t)
            .map(|(&s, d)| (s, d.len))
            .collect()
    }

    /// Every reservation of the map, per target (what freeing the inode gives back).
    pub fn all(&self) -> Removed {
        let mut r = Removed::default();
        for d in self.map.values() {
            r.add(d.target, d.len);
        }
        r
    }

    /// Total delalloc blocks.
    pub fn total(&self) -> u64 {
        self.map.values().map(|d| d.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: TargetId = TargetId(0);
    const T1: TargetId = TargetId(1);

    #[test]
    fn insert_merge_remove_split() {
        let mut d = DelallocMap::default();
        d.insert(10, 5, T0);
        d.insert(15, 5, T0);
        d.insert(30, 2, T0);
        assert_eq!(d.ranges(), vec![(10, 10, T0), (30, 2, T0)]);
        assert_eq!(d.covering(19), Some((10, 10, T0)));
        assert_eq!(d.next_after(19), Some(30));
        assert_eq!(d.remove(12, 20).total(), 10);
        assert_eq!(d.ranges(), vec![(10, 2, T0)]);
        assert_eq!(d.total(), 2);
    }

    #[test]
    fn ranges_on_different_targets_stay_apart_and_give_back_to_their_own() {
        let mut d = DelallocMap::default();
        d.insert(0, 4, T0);
        d.insert(4, 4, T1);
        d.insert(8, 4, T0);
        assert_eq!(d.ranges().len(), 3, "no merge across targets");
        let r = d.remove(2, 8);
        assert_eq!(r, Removed(vec![(T0, 4), (T1, 4)]));
        assert_eq!(d.ranges(), vec![(0, 2, T0), (10, 2, T0)]);
        assert_eq!(d.all(), Removed(vec![(T0, 4)]));
    }
}

//! Delayed allocations: object block ranges that have dirty data in the page cache and
//! space reserved on their target, but no blocks yet. In memory only (never on disk): a
//! crash loses them along with the dirty cache they stand for.

use std::collections::BTreeMap;

/// Delayed-allocation ranges of one object: start block -> length, non-overlapping,
/// adjacent ranges merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DelallocMap {
    map: BTreeMap<u64, u64>,
}

impl DelallocMap {
    /// The range covering `block`, as (start, len).
    pub fn covering(&self, block: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.map.range(..=block).next_back()?;
        (block < s + l).then_some((s, l))
    }

    /// Start of the first range after `block`.
    pub fn next_after(&self, block: u64) -> Option<u64> {
        self.map.range(block + 1..).next().map(|(&s, _)| s)
    }

    /// Adds `[start, start + len)`, which must not overlap an existing range.
    pub fn insert(&mut self, start: u64, len: u64) {
        debug_assert!(len > 0);
        debug_assert!(self.overlap(start, len) == 0, "delalloc ranges overlap");
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.map.range(..start).next_back() {
            if ps + pl == start {
                self.map.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.map.get(&(start + len)) {
            self.map.remove(&(start + len));
            l += nl;
        }
        self.map.insert(s, l);
    }

    /// Blocks of `[start, start + len)` that are delalloc.
    pub fn overlap(&self, start: u64, len: u64) -> u64 {
        let end = start + len;
        let first = self.covering(start).map_or(start, |(s, _)| s);
        self.map
            .range(first..end)
            .map(|(&s, &l)| (s + l).min(end) - s.max(start))
            .sum()
    }

    /// Removes `[start, start + len)`; returns how many blocks were delalloc.
    pub fn remove(&mut self, start: u64, len: u64) -> u64 {
        let end = start + len;
        let removed = self.overlap(start, len);
        let first = self.covering(start).map_or(start, |(s, _)| s);
        let keys: Vec<(u64, u64)> = self.map.range(first..end).map(|(&s, &l)| (s, l)).collect();
        for (s, l) in keys {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, start - s);
            }
            if s + l > end {
                self.map.insert(end, s + l - end);
            }
        }
        removed
    }

    /// All ranges.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.map.iter().map(|(&s, &l)| (s, l)).collect()
    }

    /// Total delalloc blocks.
    pub fn total(&self) -> u64 {
        self.map.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_merge_remove_split() {
        let mut d = DelallocMap::default();
        d.insert(10, 5);
        d.insert(15, 5);
        d.insert(30, 2);
        assert_eq!(d.ranges(), vec![(10, 10), (30, 2)]);
        assert_eq!(d.covering(19), Some((10, 10)));
        assert_eq!(d.next_after(19), Some(30));
        assert_eq!(d.remove(12, 20), 10);
        assert_eq!(
            d.ranges(),
            vec![(10, 2), (32, 0)]
                .into_iter()
                .filter(|r| r.1 > 0)
                .collect::<Vec<_>>()
        );
        assert_eq!(d.total(), 2);
    }
}

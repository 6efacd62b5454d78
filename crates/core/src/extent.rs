//! Per-object extent maps: object block ranges mapped to physical blocks on one target.
//!
//! An extent is unwritten (allocated, reads as zeros, converted to written at I/O
//! completion) or written. Delalloc exists only in memory (in the page cache layer) and is
//! never stored here. Each extent names the target its blocks are on (format version 3):
//! an object's blocks usually lie on its home target (`StripeLayout::target_of`), but a
//! write whose home target is read-only, or an evacuation, puts them on another one.
//! How many files own a block is the reference-count index's (`crate::refcount`).
//!
//! Invariants (checked by `debug_check` in tests and by fsck): extents do not overlap,
//! have non-zero length, and adjacent extents that could merge are merged.

use std::collections::BTreeMap;

use crate::TargetId;

/// The state of an allocated extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentState {
    /// Allocated, never written: reads return zeros.
    Unwritten,
    /// Holds file data.
    Written,
}

impl ExtentState {
    /// On-disk code.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            ExtentState::Unwritten => 1,
            ExtentState::Written => 2,
        }
    }

    /// Decodes an on-disk code.
    #[must_use]
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(ExtentState::Unwritten),
            2 => Some(ExtentState::Written),
            _ => None,
        }
    }
}

/// One mapped range of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length in blocks (> 0).
    pub len: u64,
    /// First physical block on `target`.
    pub phys: u64,
    pub state: ExtentState,
    /// The target holding the blocks.
    pub target: TargetId,
}

/// A physical range released from a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhysRange {
    pub target: TargetId,
    pub phys: u64,
    pub len: u64,
}

/// What lies at an object block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Mapped: the extent starting at `start` covers the block.
    Mapped { start: u64, ext: Extent },
    /// A hole up to (not including) `next`, or to infinity.
    Hole { next: Option<u64> },
}

/// The extent map of one object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtentMap {
    map: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    /// An empty map.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// What lies at `block`.
    #[must_use]
    pub fn lookup(&self, block: u64) -> Lookup {
        if let Some((&start, ext)) = self.map.range(..=block).next_back() {
            if block < start + ext.len {
                return Lookup::Mapped { start, ext: *ext };
            }
        }
        Lookup::Hole {
            next: self.map.range(block..).next().map(|(&s, _)| s),
        }
    }

    /// Maps `[start, start + len)` to `phys..` with `state`, replacing whatever was mapped
    /// there; returns the physical ranges that were displaced (possibly identical to the new
    /// mapping, as for an unwritten-to-written conversion: the caller decides what to free).
    pub fn set(&mut self, start: u64, ext: Extent) -> Vec<PhysRange> {
        assert!(ext.len > 0, "zero-length extent");
        let displaced = self.clear(start, ext.len);
        self.map.insert(start, ext);
        self.merge_around(start);
        displaced
    }

    /// Unmaps `[start, start + len)`; returns the physical ranges released.
    pub fn clear(&mut self, start: u64, len: u64) -> Vec<PhysRange> {
        let end = start + len;
        let mut out = Vec::new();
        // An extent starting before `start` may reach into the range: split it.
        if let Some((&s, &e)) = self.map.range(..start).next_back() {
            if s + e.len > start {
                self.map.insert(
                    s,
                    Extent {
                        len: start - s,
                        ..e
                    },
                );
                let tail_phys = e.phys + (start - s);
                self.map.insert(
                    start,
                    Extent {
                        len: e.len - (start - s),
                        phys: tail_phys,
                        ..e
                    },
                );
            }
        }
        let keys: Vec<u64> = self.map.range(start..end).map(|(&k, _)| k).collect();
        for k in keys {
            let e = self.map.remove(&k).expect("key just listed");
            let stop = (k + e.len).min(end);
            out.push(PhysRange {
                target: e.target,
                phys: e.phys,
                len: stop - k,
            });
            if k + e.len > end {
                let cut = end - k;
                self.map.insert(
                    end,
                    Extent {
                        len: e.len - cut,
                        phys: e.phys + cut,
                        ..e
                    },
                );
            }
        }
        out
    }

    /// Adds `ext` at `start` after every extent of the map, as it is (no merging): how a
    /// map read back from storage is rebuilt exactly.
    ///
    /// # Errors
    /// A description when `ext` is empty, overflows, or does not start at or after the
    /// end of the last extent.
    pub fn append(&mut self, start: u64, ext: Extent) -> Result<(), String> {
        let end = self.map.iter().next_back().map_or(0, |(&s, e)| s + e.len);
        if ext.len == 0 || start.checked_add(ext.len).is_none() || start < end {
            return Err(format!(
                "extent of {} blocks at object block {start} after the map's end {end}",
                ext.len
            ));
        }
        self.map.insert(start, ext);
        Ok(())
    }

    /// Unmaps everything from `block` on.
    pub fn truncate_from(&mut self, block: u64) -> Vec<PhysRange> {
        let Some(last) = self.map.iter().next_back().map(|(&s, e)| s + e.len) else {
            return Vec::new();
        };
        if last <= block {
            return Vec::new();
        }
        self.clear(block, last - block)
    }

    fn merge_around(&mut self, start: u64) {
        let mergeable = |a_start: u64, a: &Extent, b_start: u64, b: &Extent| {
            a_start + a.len == b_start
                && a.phys + a.len == b.phys
                && a.state == b.state
                && a.target == b.target
        };
        let cur = self.map[&start];
        let mut s = start;
        let mut e = cur;
        if let Some((&ps, &pe)) = self.map.range(..start).next_back() {
            if mergeable(ps, &pe, s, &e) {
                self.map.remove(&s);
                e = Extent {
                    len: pe.len + e.len,
                    ..pe
                };
                s = ps;
                self.map.insert(s, e);
            }
        }
        let next_key = s + e.len;
        if let Some(&ne) = self.map.get(&next_key) {
            if mergeable(s, &e, next_key, &ne) {
                self.map.remove(&next_key);
                self.map.insert(
                    s,
                    Extent {
                        len: e.len + ne.len,
                        ..e
                    },
                );
            }
        }
    }

    /// All extents in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Extent)> + '_ {
        self.map.iter().map(|(&s, e)| (s, e))
    }

    /// Extents overlapping `[start, start + len)`, in order.
    pub fn range(&self, start: u64, len: u64) -> impl Iterator<Item = (u64, &Extent)> + '_ {
        let first = match self.lookup(start) {
            Lookup::Mapped { start: s, .. } => s,
            Lookup::Hole { .. } => start,
        };
        self.map.range(first..start + len).map(|(&s, e)| (s, e))
    }

    /// The physical ranges mapped inside `[start, start + len)`: what [`Self::set`] or
    /// [`Self::clear`] over that range would displace, without changing the map.
    #[must_use]
    pub fn mapped_in(&self, start: u64, len: u64) -> Vec<PhysRange> {
        let end = start.saturating_add(len);
        self.range(start, len)
            .map(|(s, e)| {
                let lo = s.max(start);
                let hi = (s + e.len).min(end);
                PhysRange {
                    target: e.target,
                    phys: e.phys + (lo - s),
                    len: hi - lo,
                }
            })
            .collect()
    }

    /// Number of extents.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is mapped.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Total mapped blocks.
    #[must_use]
    pub fn mapped_blocks(&self) -> u64 {
        self.map.values().map(|e| e.len).sum()
    }

    /// Checks the structural invariants; returns a description of the first violation.
    #[must_use]
    pub fn check(&self) -> Option<String> {
        let mut prev_end = 0u64;
        for (i, (&s, e)) in self.map.iter().enumerate() {
            if e.len == 0 {
                return Some(format!("extent at object block {s} has length 0"));
            }
            if i > 0 && s < prev_end {
                return Some(format!(
                    "extent at object block {s} overlaps the previous one"
                ));
            }
            prev_end = s.checked_add(e.len)?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExtentState::{Unwritten, Written};

    fn ext(len: u64, phys: u64, state: ExtentState) -> Extent {
        Extent {
            len,
            phys,
            state,
            target: TargetId(0),
        }
    }

    #[test]
    fn append_keeps_extents_as_given_and_refuses_overlap() {
        let mut m = ExtentMap::new();
        m.append(0, ext(4, 100, Written)).unwrap();
        m.append(4, ext(4, 104, Written)).unwrap();
        assert_eq!(m.len(), 2, "no merging: the map is what was stored");
        assert!(m.append(7, ext(1, 1, Written)).is_err(), "overlap");
        assert!(m.append(9, ext(0, 1, Written)).is_err(), "empty");
        assert!(m.append(u64::MAX, ext(2, 1, Written)).is_err(), "overflow");
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn set_merges_and_clear_splits() {
        let mut m = ExtentMap::new();
        m.set(0, ext(4, 100, Written));
        m.set(4, ext(4, 104, Written));
        assert_eq!(m.len(), 1, "contiguous extents merge");
        let freed = m.clear(2, 3);
        assert_eq!(
            freed,
            vec![PhysRange {
                target: TargetId(0),
                phys: 102,
                len: 3
            }]
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            m.lookup(6),
            Lookup::Mapped {
                start: 5,
                ext: Extent {
                    len: 3,
                    phys: 105,
                    state: Written,
                    target: TargetId(0)
                }
            }
        );
        assert_eq!(m.lookup(3), Lookup::Hole { next: Some(5) });
        assert!(m.check().is_none());
    }

    #[test]
    fn conversion_displaces_same_range() {
        let mut m = ExtentMap::new();
        m.set(10, ext(8, 500, Unwritten));
        let d = m.set(12, ext(2, 502, Written));
        assert_eq!(
            d,
            vec![PhysRange {
                target: TargetId(0),
                phys: 502,
                len: 2
            }]
        );
        assert_eq!(m.len(), 3);
        m.set(10, ext(2, 500, Written));
        m.set(14, ext(4, 504, Written));
        assert_eq!(m.len(), 1, "fully converted extent merges back");
    }

    #[test]
    fn truncate_from_middle() {
        let mut m = ExtentMap::new();
        m.set(0, ext(10, 1000, Written));
        m.set(20, ext(5, 2000, Written));
        let f = m.truncate_from(5);
        assert_eq!(
            f,
            vec![
                PhysRange {
                    target: TargetId(0),
                    phys: 1005,
                    len: 5
                },
                PhysRange {
                    target: TargetId(0),
                    phys: 2000,
                    len: 5
                }
            ]
        );
        assert_eq!(m.mapped_blocks(), 5);
    }
}

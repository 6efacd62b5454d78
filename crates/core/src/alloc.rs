//! Per-target free-space management.
//!
//! Free space is derived at mount from the extent maps (every data block not in an extent
//! is free) and kept in memory as a map of free ranges per target. Allocation prefers the
//! goal block (right after the file's previous extent on that target), so sequential files
//! stay contiguous; then the first range at or after the goal that fits; then the first
//! range anywhere that fits; then the largest range (a partial allocation).
//!
//! Blocks freed by a transaction are *busy* until that transaction is on disk: reusing them
//! earlier could let new data overwrite blocks that a crash would hand back to their old
//! owner (XFS's busy extents).

use std::collections::BTreeMap;

use crate::geometry::Geometry;
use crate::{CoreError, TargetId};

/// Free space of one target.
#[derive(Debug, Clone, Default)]
struct TargetSpace {
    /// Free ranges: start -> length, non-overlapping, non-adjacent.
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    /// Free blocks promised to delayed allocations (not yet placed).
    reserved: u64,
    data_start: u64,
    blocks: u64,
}

impl TargetSpace {
    /// The counts' invariant after every change: promises never exceed the free blocks
    /// (so "available" = free - reserved is never negative) and the free blocks never
    /// exceed the data area.
    fn debug_check(&self, target: TargetId) {
        debug_assert!(
            self.reserved <= self.free_blocks,
            "target {target}: {} blocks reserved but only {} free",
            self.reserved,
            self.free_blocks
        );
        debug_assert!(
            self.free_blocks <= self.blocks - self.data_start,
            "target {target}: {} free blocks in a {}-block data area",
            self.free_blocks,
            self.blocks - self.data_start
        );
    }
}

/// A freed range that may not be reused before transaction `seq` is durable.
#[derive(Debug, Clone, Copy)]
struct Busy {
    target: TargetId,
    start: u64,
    len: u64,
    seq: u64,
}

/// Free-space maps of every target.
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    targets: Vec<TargetSpace>,
    busy: Vec<Busy>,
}

impl Allocator {
    /// Every data block of every target free.
    #[must_use]
    pub fn new(geo: &Geometry) -> Self {
        let targets = geo
            .targets
            .iter()
            .map(|t| {
                let mut free = BTreeMap::new();
                free.insert(t.data_start, t.data_blocks());
                TargetSpace {
                    free,
                    free_blocks: t.data_blocks(),
                    reserved: 0,
                    data_start: t.data_start,
                    blocks: t.blocks,
                }
            })
            .collect();
        Self {
            targets,
            busy: Vec::new(),
        }
    }

    /// Marks `[start, start + len)` on `target` in use (building from extent maps).
    ///
    /// # Errors
    /// `Corrupted` if the range is outside the data area or not entirely free (two extents
    /// claim the same block).
    pub fn mark_used(&mut self, target: TargetId, start: u64, len: u64) -> Result<(), CoreError> {
        let what = || format!("extent at target {target} block {start} (+{len})");
        let t = self
            .targets
            .get_mut(target.index())
            .ok_or_else(|| CoreError::corrupted(what(), "no such target"))?;
        let end = start
            .checked_add(len)
            .ok_or_else(|| CoreError::corrupted(what(), "length overflows"))?;
        if start < t.data_start || end > t.blocks {
            return Err(CoreError::corrupted(
                what(),
                format!("outside the data area {}..{}", t.data_start, t.blocks),
            ));
        }
        let Some((&fs, &fl)) = t.free.range(..=start).next_back() else {
            return Err(CoreError::corrupted(
                what(),
                "overlaps blocks already in use",
            ));
        };
        if fs + fl < end {
            return Err(CoreError::corrupted(
                what(),
                "overlaps blocks already in use",
            ));
        }
        t.free.remove(&fs);
        if fs < start {
            t.free.insert(fs, start - fs);
        }
        if end < fs + fl {
            t.free.insert(end, fs + fl - end);
        }
        t.free_blocks -= len;
        t.debug_check(target);
        Ok(())
    }

    /// Allocates up to `want` blocks on `target`, preferring `goal`. Returns `(start, len)`
    /// with `1 <= len <= want`, or `None` when the target is full.
    pub fn alloc(&mut self, target: TargetId, goal: Option<u64>, want: u64) -> Option<(u64, u64)> {
        assert!(want > 0, "zero-block allocation");
        let t = &mut self.targets[target.index()];
        // Never hand out blocks promised to delayed allocations.
        let want = want.min(t.free_blocks - t.reserved);
        if want == 0 {
            return None;
        }
        let (fs, fl) = pick(&t.free, goal, want)?;
        let start = match goal {
            Some(g) if g >= fs && g < fs + fl => g,
            _ => fs,
        };
        let len = want.min(fs + fl - start);
        t.free.remove(&fs);
        if fs < start {
            t.free.insert(fs, start - fs);
        }
        if start + len < fs + fl {
            t.free.insert(start + len, fs + fl - start - len);
        }
        t.free_blocks -= len;
        t.debug_check(target);
        Some((start, len))
    }

    /// Promises `n` free blocks of `target` to delayed allocations; false if fewer than
    /// `n` are free and unpromised.
    pub fn reserve(&mut self, target: TargetId, n: u64) -> bool {
        let t = &mut self.targets[target.index()];
        if t.free_blocks - t.reserved < n {
            return false;
        }
        t.reserved += n;
        t.debug_check(target);
        true
    }

    /// Returns `n` promised blocks (the delayed allocation was dropped or placed).
    ///
    /// # Panics
    /// Panics if more is returned than was reserved (an accounting bug).
    pub fn unreserve(&mut self, target: TargetId, n: u64) {
        let t = &mut self.targets[target.index()];
        assert!(
            t.reserved >= n,
            "unreserving {n} of {} reserved blocks on target {target}",
            t.reserved
        );
        t.reserved -= n;
        t.debug_check(target);
    }

    /// Blocks promised to delayed allocations on `target`.
    #[must_use]
    pub fn reserved_blocks(&self, target: TargetId) -> u64 {
        self.targets[target.index()].reserved
    }

    /// Free blocks not promised to delayed allocations.
    #[must_use]
    pub fn available_blocks(&self, target: TargetId) -> u64 {
        let t = &self.targets[target.index()];
        t.free_blocks - t.reserved
    }

    /// Returns a range to the free map at once (it was never visible on disk).
    pub fn free_now(&mut self, target: TargetId, start: u64, len: u64) {
        let t = &mut self.targets[target.index()];
        assert!(
            start >= t.data_start && start + len <= t.blocks,
            "freeing outside the data area"
        );
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = t.free.range(..start).next_back() {
            assert!(
                ps + pl <= start,
                "double free at target {target} block {start}"
            );
            if ps + pl == start {
                t.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some((&ns, &nl)) = t.free.range(start..).next() {
            assert!(
                start + len <= ns,
                "double free at target {target} block {start}"
            );
            if start + len == ns {
                t.free.remove(&ns);
                l += nl;
            }
        }
        t.free.insert(s, l);
        t.free_blocks += len;
        t.debug_check(target);
    }

    /// Frees a range once transaction `seq` is durable (see [`Self::release_busy`]).
    pub fn free_after(&mut self, target: TargetId, start: u64, len: u64, seq: u64) {
        self.busy.push(Busy {
            target,
            start,
            len,
            seq,
        });
    }

    /// Makes busy ranges of transactions up to `committed_seq` allocatable.
    pub fn release_busy(&mut self, committed_seq: u64) {
        let (ready, keep): (Vec<Busy>, Vec<Busy>) =
            self.busy.iter().partition(|b| b.seq <= committed_seq);
        self.busy = keep;
        for b in ready {
            self.free_now(b.target, b.start, b.len);
        }
    }

    /// Free blocks on `target` (busy blocks not counted).
    #[must_use]
    pub fn free_blocks(&self, target: TargetId) -> u64 {
        self.targets[target.index()].free_blocks
    }

    /// Blocks waiting in the busy list.
    #[must_use]
    pub fn busy_blocks(&self) -> u64 {
        self.busy.iter().map(|b| b.len).sum()
    }

    /// Blocks of `target` waiting in the busy list.
    #[must_use]
    pub fn busy_blocks_on(&self, target: TargetId) -> u64 {
        self.busy
            .iter()
            .filter(|b| b.target == target)
            .map(|b| b.len)
            .sum()
    }

    /// Data blocks on `target`.
    #[must_use]
    pub fn data_blocks(&self, target: TargetId) -> u64 {
        let t = &self.targets[target.index()];
        t.blocks - t.data_start
    }

    /// Number of free ranges on `target` (fragmentation indicator).
    #[must_use]
    pub fn free_ranges(&self, target: TargetId) -> usize {
        self.targets[target.index()].free.len()
    }
}

fn pick(free: &BTreeMap<u64, u64>, goal: Option<u64>, want: u64) -> Option<(u64, u64)> {
    if let Some(g) = goal {
        if let Some((&s, &l)) = free.range(..=g).next_back() {
            if g < s + l {
                return Some((s, l));
            }
        }
        if let Some((&s, &l)) = free.range(g..).find(|(_, &l)| l >= want) {
            return Some((s, l));
        }
    }
    if let Some((&s, &l)) = free.iter().find(|(_, &l)| l >= want) {
        return Some((s, l));
    }
    free.iter().max_by_key(|(_, &l)| l).map(|(&s, &l)| (s, l))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::MkfsParams;
    use crate::{BlockSize, Uuid};

    fn geo() -> Geometry {
        Geometry::plan(&MkfsParams {
            uuid: Uuid([1; 16]),
            block_size: BlockSize::new(4096).unwrap(),
            sector_size: 512,
            target_bytes: vec![64 << 20, 64 << 20],
            stripe_unit: 65536,
            stripe_count: 2,
            journal_bytes: None,
            ckpt_bytes: None,
            mkfs_time_sec: 0,
        })
        .unwrap()
    }

    /// Marking blocks used that were promised to delayed allocations would leave more
    /// reserved than free (a negative "available"): the counts' check stops it where it
    /// happens, in debug builds.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "reserved but only")]
    fn promises_never_exceed_the_free_blocks() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(0);
        let all = a.available_blocks(t);
        assert!(a.reserve(t, all));
        let start = g.targets[0].data_start;
        a.mark_used(t, start, 1).unwrap();
    }

    #[test]
    fn goal_keeps_allocation_contiguous() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(1);
        let (s1, l1) = a.alloc(t, None, 16).unwrap();
        let (s2, _) = a.alloc(t, Some(s1 + l1), 16).unwrap();
        assert_eq!(s2, s1 + l1);
        a.free_now(t, s1, 32);
        assert_eq!(a.free_blocks(t), a.data_blocks(t));
        assert_eq!(a.free_ranges(t), 1, "freed range coalesces");
    }

    #[test]
    fn busy_blocks_wait_for_commit_and_overlap_is_corruption() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(0);
        let (s, l) = a.alloc(t, None, 8).unwrap();
        a.free_after(t, s, l, 5);
        assert_eq!(a.busy_blocks(), 8);
        a.release_busy(4);
        assert_eq!(a.busy_blocks(), 8);
        a.release_busy(5);
        assert_eq!(a.busy_blocks(), 0);
        a.mark_used(t, s, 4).unwrap();
        assert!(a.mark_used(t, s + 2, 4).is_err());
        assert!(a.mark_used(t, 0, 1).is_err(), "metadata area is not data");
    }
}

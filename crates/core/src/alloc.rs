//! Per-target free-space management.
//!
//! Free space is read at mount from the space tree's free runs ([`Allocator::from_free_runs`];
//! `docs/design/metadata.md`, "Persisted free space") and kept in memory as a map of free
//! ranges per target. Allocation prefers the
//! goal block (right after the file's previous extent on that target), so sequential files
//! stay contiguous; then the first range at or after the goal that fits; then the first
//! range anywhere that fits; then the largest range (a partial allocation).
//!
//! Blocks freed by a transaction are *busy* until that transaction is on disk: reusing them
//! earlier could let new data overwrite blocks that a crash would hand back to their old
//! owner (XFS's busy extents). Metadata pages ([`Draw::Meta`]) wait longer: until the
//! transaction is also applied to the metadata trees ([`Allocator::applied`]), so a page
//! never takes a block that the space tree of the checkpoint writing it still shows in an
//! extent (`docs/design/metadata.md`, "Persisted free space").
//!
//! Each target may hold back a *metadata reserve*: free blocks that data allocations and
//! delayed-allocation promises cannot take and metadata page allocations can
//! (`docs/design/metadata.md`, "Space"). A checkpoint writes its pages to fresh blocks
//! before it frees the ones they replace, so it needs room even when users have filled
//! the file system; the reserve is that room.

use std::collections::BTreeMap;

use crate::geometry::{Geometry, TargetGeometry};
use crate::{BlockSize, CoreError, TargetId};

/// Whose free blocks an allocation draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    /// New data: free blocks that are neither promised nor part of the metadata reserve.
    Data,
    /// Blocks promised earlier by [`Allocator::reserve`] (a delayed allocation or a
    /// direct write being placed): the promise shrinks by what is placed. Never refused
    /// for the metadata reserve: the promise was taken outside it, and metadata
    /// allocations do not take promised blocks.
    Promised,
    /// Metadata pages: any free block not promised, the metadata reserve included.
    Meta,
}

/// Free space of one target.
#[derive(Debug, Clone, Default)]
struct TargetSpace {
    /// Free ranges: start -> length, non-overlapping, non-adjacent.
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    /// Free blocks promised to delayed allocations (not yet placed).
    reserved: u64,
    /// Free blocks only [`Draw::Meta`] may take (while that many are free and unpromised).
    meta_reserve: u64,
    data_start: u64,
    blocks: u64,
}

impl TargetSpace {
    /// The counts' invariant after every change: promises never exceed the free blocks
    /// (so "available" = free - reserved is never negative) and the free blocks never
    /// exceed the data area.
    fn debug_check(&self, target: TargetId) {
        debug_assert!(
            self.meta_reserve <= self.blocks - self.data_start,
            "target {target}: metadata reserve {} over the data area",
            self.meta_reserve
        );
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
    /// Released ranges whose transaction is not yet applied to the metadata trees:
    /// free for data, not for metadata pages.
    unapplied: Vec<Busy>,
}

impl TargetSpace {
    /// A target whose whole data area is free.
    fn all_free(t: TargetGeometry) -> Self {
        let mut free = BTreeMap::new();
        if t.data_blocks() > 0 {
            free.insert(t.data_start, t.data_blocks());
        }
        TargetSpace {
            free,
            free_blocks: t.data_blocks(),
            reserved: 0,
            meta_reserve: 0,
            data_start: t.data_start,
            blocks: t.blocks,
        }
    }
}

impl Allocator {
    /// Target `target` joins with its whole data area free (`Record::TargetAdd`).
    ///
    /// # Errors
    /// `Limit` unless `target` is the next index.
    pub fn add_target(&mut self, target: TargetId, geo: TargetGeometry) -> Result<(), CoreError> {
        if target.index() != self.targets.len() {
            return Err(CoreError::Limit(format!(
                "target {target} added to an allocator of {} targets",
                self.targets.len()
            )));
        }
        self.targets.push(TargetSpace::all_free(geo));
        Ok(())
    }

    /// Target `target` leaves (`TargetState::Retired`): its data area, wholly free, no
    /// longer counts; nothing can be allocated, reserved or freed there afterwards.
    ///
    /// # Errors
    /// `Limit` naming what it still holds: blocks in use, promised, or busy (freed by a
    /// transaction not yet durable, or not yet applied to the trees).
    pub fn retire(&mut self, target: TargetId) -> Result<(), CoreError> {
        let busy = self.busy_blocks_on(target)
            + self
                .unapplied
                .iter()
                .filter(|u| u.target == target)
                .map(|u| u.len)
                .sum::<u64>();
        let t = &mut self.targets[target.index()];
        let area = t.blocks - t.data_start;
        if t.free_blocks != area || t.reserved != 0 || busy != 0 {
            return Err(CoreError::Limit(format!(
                "target {target} cannot be retired: {} of its {area} data blocks are in use, {} promised, {busy} freed but not yet durable",
                area - t.free_blocks,
                t.reserved
            )));
        }
        *t = TargetSpace::default();
        Ok(())
    }

    /// Targets the allocator knows.
    #[must_use]
    pub fn target_count(&self) -> u32 {
        self.targets.len() as u32
    }

    /// Every data block of every target free.
    #[must_use]
    pub fn new(geo: &Geometry) -> Self {
        let targets = geo
            .targets
            .iter()
            .map(|t| TargetSpace::all_free(*t))
            .collect();
        Self {
            targets,
            busy: Vec::new(),
            unapplied: Vec::new(),
        }
    }

    /// The allocator whose free blocks are exactly `runs` (`(target, first block,
    /// blocks)`, as the space tree lists them), no metadata reserve set.
    ///
    /// # Errors
    /// `Corrupted` naming the run when one is empty, outside its target's data area,
    /// overlapping or touching another (the space tree merges neighbours), or of no target.
    pub fn from_free_runs(
        geo: &Geometry,
        runs: impl IntoIterator<Item = (TargetId, u64, u64)>,
    ) -> Result<Self, CoreError> {
        let mut a = Allocator::new(geo);
        for t in &mut a.targets {
            t.free.clear();
            t.free_blocks = 0;
        }
        for (target, start, len) in runs {
            let what = || format!("free run at target {target} block {start} (+{len})");
            let t = a
                .targets
                .get_mut(target.index())
                .ok_or_else(|| CoreError::corrupted(what(), "no such target"))?;
            let end = start.checked_add(len).filter(|_| len > 0);
            let Some(end) = end.filter(|&e| start >= t.data_start && e <= t.blocks) else {
                return Err(CoreError::corrupted(
                    what(),
                    format!(
                        "empty or outside the data area {}..{}",
                        t.data_start, t.blocks
                    ),
                ));
            };
            if let Some((&ps, &pl)) = t.free.range(..=start).next_back() {
                if ps + pl >= start {
                    return Err(CoreError::corrupted(
                        what(),
                        "overlaps or touches the run before",
                    ));
                }
            }
            if let Some((&ns, _)) = t.free.range(start..).next() {
                if ns <= end {
                    return Err(CoreError::corrupted(
                        what(),
                        "overlaps or touches the run after",
                    ));
                }
            }
            t.free.insert(start, len);
            t.free_blocks += len;
        }
        Ok(a)
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

    /// The metadata reserve for a target of `data_blocks` data blocks of `block` bytes:
    /// 1/64 of the data area, at least 1 MiB and at most 1 GiB, and never more than an
    /// eighth of the data area (tiny test targets). See `docs/design/decisions.md`.
    #[must_use]
    pub fn meta_reserve_for(data_blocks: u64, block: BlockSize) -> u64 {
        let (min, max) = (block.block_of(1 << 20).max(1), block.block_of(1 << 30));
        (data_blocks / 64).clamp(min, max).min(data_blocks / 8)
    }

    /// Holds back `blocks` free blocks of `target` for metadata pages (see [`Draw`]).
    /// It may be set when fewer are free: data then gets nothing until blocks are freed,
    /// and freed blocks refill the reserve first.
    pub fn set_meta_reserve(&mut self, target: TargetId, blocks: u64) {
        let t = &mut self.targets[target.index()];
        t.meta_reserve = blocks;
        t.debug_check(target);
    }

    /// The metadata reserve of `target`, as set.
    #[must_use]
    pub fn meta_reserve(&self, target: TargetId) -> u64 {
        self.targets[target.index()].meta_reserve
    }

    /// Free, unpromised blocks of `target` held back for metadata pages: the reserve, or
    /// less once metadata pages have used part of it. Neither available nor in use.
    #[must_use]
    pub fn meta_held_blocks(&self, target: TargetId) -> u64 {
        let t = &self.targets[target.index()];
        t.meta_reserve.min(t.free_blocks - t.reserved)
    }

    /// Allocates up to `want` blocks of new data on `target`, preferring `goal`
    /// ([`Self::alloc_from`] with [`Draw::Data`]).
    pub fn alloc(&mut self, target: TargetId, goal: Option<u64>, want: u64) -> Option<(u64, u64)> {
        self.alloc_from(target, goal, want, Draw::Data)
    }

    /// Allocates up to `want` blocks on `target` from the blocks `draw` may take,
    /// preferring `goal`. Returns `(start, len)` with `1 <= len <= want`, or `None` when
    /// there are none.
    ///
    /// # Panics
    /// Panics if `want` is zero, or with [`Draw::Promised`] over more than is promised.
    pub fn alloc_from(
        &mut self,
        target: TargetId,
        goal: Option<u64>,
        want: u64,
        draw: Draw,
    ) -> Option<(u64, u64)> {
        assert!(want > 0, "zero-block allocation");
        assert!(
            draw != Draw::Meta,
            "metadata pages are taken by alloc_meta_lowest"
        );
        self.take_from(target, goal, want, draw)
    }

    /// Allocates up to `want` blocks for metadata pages on `target` ([`Draw::Meta`]), in
    /// whole pieces of `piece` blocks, from its lowest free ranges first: the ranges
    /// taken, each a multiple of `piece` long, ascending (empty when none is free).
    ///
    /// Lowest first, and in as many ranges as it takes, so a checkpoint refills the
    /// holes the pages it replaced left behind before it touches fresh space: the
    /// blocks a target has ever had written stay close to the metadata's live size.
    /// With one contiguous range per request, each checkpoint passed over those holes
    /// and moved on into unwritten space, and a sparse target file grew by what every
    /// checkpoint wrote (29 GB of host disk at 4.5 million files, and the host's
    /// `ENOSPC` stopped a 10-million-file run; decisions.md, 124).
    ///
    /// # Panics
    /// Panics if `piece` is zero.
    pub fn alloc_meta_lowest(
        &mut self,
        target: TargetId,
        want: u64,
        piece: u64,
    ) -> Vec<(u64, u64)> {
        assert!(piece > 0, "zero-block metadata piece");
        let hidden = self.hide_unapplied(target);
        let t = &mut self.targets[target.index()];
        let mut left = want.min(t.free_blocks - t.reserved) / piece * piece;
        let mut got = Vec::new();
        let mut from = 0;
        while left > 0 {
            let Some((&fs, &fl)) = t.free.range(from..).find(|(_, &l)| l >= piece) else {
                break;
            };
            let len = left.min(fl / piece * piece);
            t.free.remove(&fs);
            if len < fl {
                t.free.insert(fs + len, fl - len);
            }
            t.free_blocks -= len;
            left -= len;
            got.push((fs, len));
            from = fs + len;
        }
        for (s, l) in hidden {
            insert_merged(&mut t.free, s, l);
        }
        t.debug_check(target);
        got
    }

    /// Removes from `target`'s free map (not from its counts) the free parts of ranges
    /// released but not yet applied to the trees; returns them to put back.
    fn hide_unapplied(&mut self, target: TargetId) -> Vec<(u64, u64)> {
        let t = &mut self.targets[target.index()];
        let mut hidden = Vec::new();
        for u in self.unapplied.iter().filter(|u| u.target == target) {
            let end = u.start + u.len;
            let first = t
                .free
                .range(..u.start)
                .next_back()
                .map_or(u.start, |(&s, _)| s);
            let overlapping: Vec<(u64, u64)> = t
                .free
                .range(first..end)
                .map(|(&s, &l)| (s, l))
                .filter(|&(s, l)| s + l > u.start)
                .collect();
            for (s, l) in overlapping {
                t.free.remove(&s);
                let (a, b) = (s.max(u.start), (s + l).min(end));
                if s < a {
                    t.free.insert(s, a - s);
                }
                if b < s + l {
                    t.free.insert(b, s + l - b);
                }
                hidden.push((a, b - a));
            }
        }
        hidden
    }

    fn take_from(
        &mut self,
        target: TargetId,
        goal: Option<u64>,
        want: u64,
        draw: Draw,
    ) -> Option<(u64, u64)> {
        let t = &mut self.targets[target.index()];
        let room = match draw {
            // Never hand out blocks promised to delayed allocations.
            Draw::Data => (t.free_blocks - t.reserved).saturating_sub(t.meta_reserve),
            Draw::Promised => {
                assert!(
                    want <= t.reserved,
                    "placing {want} promised blocks of {} on target {target}",
                    t.reserved
                );
                want
            }
            Draw::Meta => unreachable!("metadata pages are taken by alloc_meta_lowest"),
        };
        let want = want.min(room);
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
        if draw == Draw::Promised {
            t.reserved -= len;
        }
        t.debug_check(target);
        Some((start, len))
    }

    /// Promises `n` free blocks of `target` to delayed allocations; false if fewer than
    /// `n` are available (free, unpromised, outside the metadata reserve).
    pub fn reserve(&mut self, target: TargetId, n: u64) -> bool {
        if self.available_blocks(target) < n {
            return false;
        }
        let t = &mut self.targets[target.index()];
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

    /// Free blocks that new data may take: not promised to delayed allocations and not
    /// held for metadata pages.
    #[must_use]
    pub fn available_blocks(&self, target: TargetId) -> u64 {
        let t = &self.targets[target.index()];
        (t.free_blocks - t.reserved).saturating_sub(t.meta_reserve)
    }

    /// What users may still count on for data on `target` (`statfs`, `fallocate`'s
    /// check): the available blocks plus the busy ones, which are free once their
    /// transaction commits, less what those must first give back to the metadata
    /// reserve.
    #[must_use]
    pub fn user_free_blocks(&self, target: TargetId) -> u64 {
        let t = &self.targets[target.index()];
        (t.free_blocks + self.busy_blocks_on(target) - t.reserved).saturating_sub(t.meta_reserve)
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

    /// Makes busy ranges of transactions up to `committed_seq` allocatable (by data;
    /// by metadata pages once [`Self::applied`] says their transaction is in the trees).
    pub fn release_busy(&mut self, committed_seq: u64) {
        let (ready, keep): (Vec<Busy>, Vec<Busy>) =
            self.busy.iter().partition(|b| b.seq <= committed_seq);
        self.busy = keep;
        for b in ready {
            self.free_now(b.target, b.start, b.len);
            self.unapplied.push(b);
        }
    }

    /// Frees a range whose freeing transaction `seq` is durable already: data may take it
    /// now, metadata pages once `seq` is applied ([`Self::applied`]).
    pub fn free_committed(&mut self, target: TargetId, start: u64, len: u64, seq: u64) {
        self.free_now(target, start, len);
        self.unapplied.push(Busy {
            target,
            start,
            len,
            seq,
        });
    }

    /// Transactions up to `seq` are applied to the metadata trees: the blocks they freed
    /// are free in the space tree too, so metadata pages may take them.
    pub fn applied(&mut self, seq: u64) {
        self.unapplied.retain(|u| u.seq > seq);
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

    /// The data area of `target`, `(data_start, blocks)` (both 0 once it is retired).
    #[must_use]
    pub fn data_area(&self, target: TargetId) -> (u64, u64) {
        let t = &self.targets[target.index()];
        (t.data_start, t.blocks)
    }

    /// Data blocks on `target`.
    #[must_use]
    pub fn data_blocks(&self, target: TargetId) -> u64 {
        let t = &self.targets[target.index()];
        t.blocks - t.data_start
    }

    /// The start of the first free range on `target` at least `len` blocks long, `None` if
    /// there is none: where a caller placing many small allocations side by side starts
    /// (the file system's multi-file writeback, as ext4's locality-group preallocation
    /// takes a chunk), rather than in the first hole. O(free ranges), like [`Self::alloc`]
    /// without a goal.
    #[must_use]
    pub fn first_range_at_least(&self, target: TargetId, len: u64) -> Option<u64> {
        self.targets[target.index()]
            .free
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&s, _)| s)
    }

    /// Every free range, `(target, first block, blocks)` in target and block order (busy
    /// ranges are not free yet).
    #[must_use]
    pub fn free_runs(&self) -> Vec<(TargetId, u64, u64)> {
        self.targets
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                t.free
                    .iter()
                    .map(move |(&s, &l)| (TargetId(i as u32), s, l))
            })
            .collect()
    }

    /// Number of free ranges on `target` (fragmentation indicator).
    #[must_use]
    pub fn free_ranges(&self, target: TargetId) -> usize {
        self.targets[target.index()].free.len()
    }
}

/// Inserts a range known not to overlap the map, merged with touching neighbours.
fn insert_merged(free: &mut BTreeMap<u64, u64>, start: u64, len: u64) {
    let (mut s, mut l) = (start, len);
    if let Some((&ps, &pl)) = free.range(..start).next_back() {
        if ps + pl == start {
            free.remove(&ps);
            s = ps;
            l += pl;
        }
    }
    if let Some(nl) = free.remove(&(start + len)) {
        l += nl;
    }
    free.insert(s, l);
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

    /// Blocks a committed transaction freed are data's at once, and metadata pages' only
    /// once the transaction is applied to the trees.
    #[test]
    fn pages_take_freed_blocks_only_once_their_free_is_applied() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(0);
        let all = a.free_blocks(t);
        let (s, l) = a.alloc(t, None, all).unwrap();
        assert_eq!((l, a.free_blocks(t)), (all, 0));
        a.free_after(t, s + 10, 4, 7);
        a.release_busy(7);
        assert_eq!(a.free_blocks(t), 4);
        assert_eq!(a.alloc_meta_lowest(t, 1, 1), vec![], "not applied yet");
        assert_eq!(a.free_ranges(t), 1, "the hidden range is back");
        let (d, _) = a.alloc(t, None, 1).unwrap();
        assert_eq!(d, s + 10, "data may take it");
        a.applied(6);
        assert_eq!(a.alloc_meta_lowest(t, 1, 1), vec![]);
        a.applied(7);
        assert_eq!(a.alloc_meta_lowest(t, 8, 1), vec![(s + 11, 3)]);
    }

    #[test]
    fn from_free_runs_checks_the_runs() {
        let g = geo();
        let d = g.targets[0].data_start;
        let t = TargetId(0);
        let a = Allocator::from_free_runs(&g, [(t, d, 5), (t, d + 10, 2)]).unwrap();
        assert_eq!(a.free_blocks(t), 7);
        assert_eq!(a.free_blocks(TargetId(1)), 0);
        assert_eq!(a.free_ranges(t), 2);
        for bad in [
            vec![(t, d, 5), (t, d + 5, 1)],
            vec![(t, d + 3, 5), (t, d, 4)],
            vec![(t, 0, 1)],
            vec![(t, d, 0)],
            vec![(TargetId(9), d, 1)],
            vec![(t, g.targets[0].blocks - 1, 2)],
        ] {
            let e = Allocator::from_free_runs(&g, bad.clone())
                .unwrap_err()
                .to_string();
            assert!(e.contains("free run"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn first_range_at_least_skips_short_holes() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(1);
        let (s, l) = a.alloc(t, None, 10).unwrap();
        assert_eq!(l, 10);
        a.free_now(t, s + 2, 1);
        a.free_now(t, s + 5, 2);
        assert_eq!(a.first_range_at_least(t, 1), Some(s + 2));
        assert_eq!(a.first_range_at_least(t, 2), Some(s + 5));
        assert_eq!(a.first_range_at_least(t, 3), Some(s + 10));
        assert_eq!(a.first_range_at_least(t, u64::MAX), None);
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

    /// The books of one target balance: available + promised + held for metadata +
    /// allocated = data blocks.
    fn balanced(a: &Allocator, t: TargetId, used: u64) {
        let sum = a.available_blocks(t) + a.reserved_blocks(t) + a.meta_held_blocks(t) + used;
        assert_eq!(sum, a.data_blocks(t), "books of target {t}");
    }

    #[test]
    fn data_stops_at_the_metadata_reserve_and_pages_do_not() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(0);
        let data = a.data_blocks(t);
        a.set_meta_reserve(t, 100);
        assert_eq!(a.available_blocks(t), data - 100);
        assert_eq!(a.meta_held_blocks(t), 100);
        balanced(&a, t, 0);
        let mut used = 0;
        while let Some((_, l)) = a.alloc(t, None, 1000) {
            used += l;
            balanced(&a, t, used);
        }
        assert_eq!(used, data - 100, "data takes everything but the reserve");
        assert!(!a.reserve(t, 1), "no promise out of the reserve");
        assert_eq!(
            a.user_free_blocks(t),
            0,
            "statfs reports the reserve as used"
        );
        let mut pages = 0;
        loop {
            let got: u64 = a.alloc_meta_lowest(t, 7, 1).iter().map(|r| r.1).sum();
            if got == 0 {
                break;
            }
            pages += got;
            balanced(&a, t, used + pages);
        }
        assert_eq!(pages, 100, "metadata pages take the reserve");
        assert_eq!(a.free_blocks(t), 0);
    }

    /// Pages refill the lowest holes first, in whole pieces, across as many ranges as it
    /// takes, before they touch the untouched space above (decisions.md, 124).
    #[test]
    fn pages_refill_the_lowest_holes_first() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(0);
        let all = a.free_blocks(t);
        let (s, _) = a.alloc(t, None, all).unwrap();
        // Holes of 3, 1 and 8 blocks low down, and 100 blocks far above them.
        for (at, len) in [(10, 3), (20, 1), (30, 8), (1000, 100)] {
            a.free_now(t, s + at, len);
        }
        assert_eq!(
            a.alloc_meta_lowest(t, 12, 2),
            vec![(s + 10, 2), (s + 30, 8), (s + 1000, 2)],
            "pieces of 2 blocks: the 1-block hole and the odd block are left"
        );
        assert_eq!(a.free_blocks(t), 3 + 1 + 8 + 100 - 12);
        assert_eq!(
            a.alloc_meta_lowest(t, 3, 1),
            vec![(s + 12, 1), (s + 20, 1), (s + 1002, 1)]
        );
    }

    /// A promise taken outside the reserve is honoured even after metadata pages used
    /// the reserve (giving the promise back and allocating it as new data would be
    /// refused: writeback would meet ENOSPC for data it accepted).
    #[test]
    fn a_promise_is_placed_after_pages_took_the_reserve() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(1);
        a.set_meta_reserve(t, 64);
        let avail = a.available_blocks(t);
        assert!(a.reserve(t, 50));
        assert!(a.alloc(t, None, avail - 50).is_some());
        assert_eq!(a.available_blocks(t), 0);
        while !a.alloc_meta_lowest(t, 64, 1).is_empty() {}
        assert_eq!(a.free_blocks(t), 50, "only the promised blocks are left");
        assert_eq!(a.meta_held_blocks(t), 0);
        let (_, l) = a.alloc_from(t, None, 50, Draw::Promised).unwrap();
        assert_eq!(l, 50);
        assert_eq!(a.reserved_blocks(t), 0);
        assert_eq!(a.free_blocks(t), 0);
    }

    #[test]
    fn freed_blocks_refill_the_reserve_before_users_see_them() {
        let g = geo();
        let mut a = Allocator::new(&g);
        let t = TargetId(0);
        a.set_meta_reserve(t, 40);
        let avail = a.available_blocks(t);
        let (s, l) = a.alloc(t, None, avail).unwrap();
        assert_eq!(l, avail);
        let (ps, _) = a.alloc_meta_lowest(t, 30, 1)[0];
        a.free_after(t, s, 20, 9);
        assert_eq!(
            a.user_free_blocks(t),
            0,
            "20 busy blocks refill 30 used of the reserve"
        );
        a.free_after(t, s + 20, 20, 9);
        assert_eq!(a.user_free_blocks(t), 10);
        a.release_busy(9);
        assert_eq!(a.available_blocks(t), 10);
        assert_eq!(a.meta_held_blocks(t), 40);
        a.free_now(t, ps, 30);
        assert_eq!(a.available_blocks(t), 40);
    }

    #[test]
    fn the_reserve_is_a_bounded_fraction_of_the_data_area() {
        let bs = BlockSize::new(4096).unwrap();
        let mib = 256; // blocks
        assert_eq!(
            Allocator::meta_reserve_for(64 * mib, bs),
            mib,
            "at least 1 MiB"
        );
        assert_eq!(
            Allocator::meta_reserve_for(4 * mib, bs),
            mib / 2,
            "an eighth of 4 MiB"
        );
        assert_eq!(
            Allocator::meta_reserve_for(1024 * mib, bs),
            16 * mib,
            "1/64 of 1 GiB"
        );
        assert_eq!(Allocator::meta_reserve_for(16 * 1024 * mib, bs), 256 * mib);
        assert_eq!(
            Allocator::meta_reserve_for(1 << 30, bs),
            1024 * mib,
            "capped at 1 GiB"
        );
        assert_eq!(Allocator::meta_reserve_for(40, bs), 5, "tiny: an eighth");
    }
}

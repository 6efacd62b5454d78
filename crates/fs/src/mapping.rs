//! The file system's side of the mapping contract: file range -> stripe piece -> extent.
//!
//! `begin` resolves one stripe piece of the range (never crossing a stripe unit, so never
//! crossing a target) against the object's extent map and delalloc map under the metadata
//! lock:
//! - `Write` (unbuffered) and `Writeback` allocate holes; `Writeback` turns delalloc into
//!   blocks out of its reservation, preferring the block after the previous extent;
//! - `BufferedWrite` reserves space for holes and records them as delalloc (so `ENOSPC`
//!   is returned by `write()`, never discovered by writeback); `end` releases what the
//!   write did not use (I-002-6);
//! - `Read` and `Report` never allocate.
//!
//! Allocated blocks are not recorded in the extent map here: the I/O paths record them
//! written only once the data is on the target, which is what keeps stale blocks invisible.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use stripefs_core::alloc::Draw;
use stripefs_core::extent::{ExtentState, Lookup};
use stripefs_core::inode::FileKind;
use stripefs_core::layout::StripeLayout;
use stripefs_core::record::Record;
use stripefs_core::{BlockSize, Ino, TargetId};
use stripefs_iomap::{Iomap, IomapFlags, IomapKind, IomapOp, IomapOps};
use stripefs_target::IoOp;

use crate::direct::DioLock;
use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::inner::MetaCore;
use crate::namespace::inode;
use crate::nocow::Found;
use crate::wbgroup::{WbPlug, GROUP_CHUNK_BYTES};

/// Where a mapping lives on the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DevAddr {
    pub target: TargetId,
    /// Stripe object holding the mapping.
    pub object: u32,
    /// Object block of the mapping's first byte.
    pub obj_block: u64,
    /// Physical block of the mapping's first byte (0 for holes and delalloc).
    pub phys: u64,
}

/// The extent record of `[pos, pos + len)` of mapping `map` (block aligned, inside it)
/// in `state`: how every path records what it wrote or allocated (direct-write and
/// writeback completion, preallocation).
pub(crate) fn piece_record(
    bs: BlockSize,
    ino: Ino,
    map: &Iomap<DevAddr>,
    pos: u64,
    len: u64,
    state: ExtentState,
) -> Record {
    debug_assert!(
        map.offset <= pos && pos + len <= map.end() && bs.offset_in_block(pos) == 0,
        "a recorded piece is whole blocks inside its mapping"
    );
    let skip = bs.block_of(pos - map.offset);
    Record::ExtentSet {
        ino,
        object: map.addr.object,
        block: map.addr.obj_block + skip,
        len: bs.blocks_for(len),
        phys: map.addr.phys + skip,
        state,
        target: map.addr.target,
    }
}

/// Blocks allocated by `begin` and not yet recorded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewBlocks {
    pub target: TargetId,
    pub phys: u64,
    pub len: u64,
    /// The writeback batch that closed this allocation (0: not closed yet).
    pub wb_batch: u32,
}

/// What becomes of a writeback batch's allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Recorded: forget them.
    Keep,
    /// Never recorded: free them.
    Free,
}

/// Blocks one operation allocated and has not recorded yet. Dropped, it returns them to
/// the free map (they were never visible, so they are not busy); `commit` forgets them
/// once they are recorded. An early return can therefore never leak them. A caller that
/// retries with the same mapper after a failure releases first, so that the retry's
/// commit keeps only its own blocks.
#[derive(Debug)]
pub(crate) struct Allocated<'a> {
    fs: &'a Fs,
    blocks: RefCell<Vec<NewBlocks>>,
    /// Writeback batches closed (submitted) and settled (completed) so far; blocks carry
    /// the number of the batch that closed them (two counters, not a queue, so the mapper
    /// stays small).
    wb_closed: Cell<u32>,
    wb_settled: Cell<u32>,
}

impl<'a> Allocated<'a> {
    fn new(fs: &'a Fs) -> Self {
        Self {
            fs,
            blocks: RefCell::new(Vec::new()),
            wb_closed: Cell::new(0),
            wb_settled: Cell::new(0),
        }
    }

    fn push(&self, n: NewBlocks) {
        self.blocks.borrow_mut().push(n);
    }

    /// Returns the blocks from `phys` to the end of their allocation on `target` (the
    /// caller did not use them and freed them already): they are no longer this
    /// operation's.
    fn forget_from(&self, target: TargetId, phys: u64) {
        let mut blocks = self.blocks.borrow_mut();
        if let Some(a) = blocks
            .iter_mut()
            .find(|a| a.target == target && a.phys <= phys && phys < a.phys + a.len)
        {
            a.len = phys - a.phys;
        }
        blocks.retain(|a| a.len > 0);
    }

    /// Closes the set of a submitted writeback batch: the blocks allocated since the last
    /// close are that batch's (see [`stripefs_iomap::CacheIo::writeback_submitted`]).
    pub fn close_batch(&self) {
        let batch = self.wb_closed.get() + 1;
        self.wb_closed.set(batch);
        for n in self.blocks.borrow_mut().iter_mut() {
            if n.wb_batch == 0 {
                n.wb_batch = batch;
            }
        }
    }

    /// Settles the oldest unsettled writeback batch (batches complete in the order they
    /// were closed): its blocks are kept (`Keep`: recorded) or freed (`Free`: the batch
    /// failed before recording them); later batches' blocks, maybe in flight, stay.
    pub fn settle_batch(&self, how: Settle) {
        let batch = self.wb_settled.get() + 1;
        debug_assert!(
            batch <= self.wb_closed.get(),
            "a writeback batch completed that was never closed"
        );
        self.wb_settled.set(batch);
        let mut blocks = self.blocks.borrow_mut();
        let (mine, rest): (Vec<NewBlocks>, Vec<NewBlocks>) =
            blocks.drain(..).partition(|n| n.wb_batch == batch);
        *blocks = rest;
        drop(blocks);
        if how == Settle::Free && !mine.is_empty() {
            let mut m = self.fs.inner.meta.lock();
            for n in mine {
                m.alloc.free_now(n.target, n.phys, n.len);
            }
        }
    }

    /// The blocks were recorded: they stay allocated.
    pub fn commit(&self) {
        self.blocks.borrow_mut().clear();
    }

    /// Returns every block to the free map now (the operation failed before recording
    /// them). Dropping does the same.
    pub fn release(&self) {
        let mut blocks = self.blocks.borrow_mut();
        if blocks.is_empty() {
            return;
        }
        let mut m = self.fs.inner.meta.lock();
        for n in blocks.drain(..) {
            m.alloc.free_now(n.target, n.phys, n.len);
        }
    }
}

impl Drop for Allocated<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Free blocks reserved per target for one operation (a direct write's holes), a value:
/// allocations draw on it, and what is left goes back to the allocator when it is
/// dropped.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    fs: &'a Fs,
    left: HashMap<TargetId, u64>,
}

impl<'a> Reservation<'a> {
    /// Reserves `need` blocks per target, all or nothing (`None`: some target lacks them).
    pub fn take(fs: &'a Fs, need: HashMap<TargetId, u64>) -> Option<Self> {
        let mut m = fs.inner.meta.lock();
        let mut taken = Vec::new();
        for (&t, &n) in &need {
            if !m.alloc.reserve(t, n) {
                for (t, n) in taken {
                    m.alloc.unreserve(t, n);
                }
                return None;
            }
            taken.push((t, n));
        }
        Some(Self { fs, left: need })
    }

    /// Blocks still reserved on `target`.
    fn left_on(&self, target: TargetId) -> u64 {
        self.left.get(&target).copied().unwrap_or(0)
    }

    /// `n` reserved blocks on `target` were allocated: they are no longer promised.
    fn spent(&mut self, target: TargetId, n: u64) {
        let left = self.left.entry(target).or_default();
        debug_assert!(
            *left >= n,
            "spent {n} of {left} reserved blocks on {target}"
        );
        *left -= n;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.left.values().all(|&n| n == 0) {
            return;
        }
        let mut m = self.fs.inner.meta.lock();
        for (&t, &n) in &self.left {
            m.alloc.unreserve(t, n);
        }
    }
}

/// Where the blocks of an allocation come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Funding {
    /// Free space.
    Free,
    /// A reservation (delayed allocation's, or a direct write's): the blocks placed stop
    /// being reserved; what could not be placed stays reserved.
    Reserved,
}

/// A data write held back by an `fsync`'s writeback mapper: the target's index and the
/// operation.
pub(crate) type HeldWrite = Option<(usize, IoOp)>;

/// Maps one file for one operation.
#[derive(Debug)]
pub(crate) struct FileMapper<'a> {
    pub fs: &'a Fs,
    pub ino: Ino,
    pub layout: StripeLayout,
    /// Per object: where the last allocation of this operation ended (object block,
    /// target, phys).
    hint: RefCell<HashMap<u32, (u64, TargetId, u64)>>,
    /// Every allocation made by this operation and not recorded yet (freed unless
    /// committed).
    pub allocated: Allocated<'a>,
    /// Blocks reserved for this direct write; `Write` allocations draw on it.
    /// (Boxed: only direct writes over holes have one, and the mapper stays small
    /// enough to travel by value in the direct path's lock guard.)
    dio_reserved: RefCell<Option<Box<Reservation<'a>>>>,
    /// The inode lock of the direct write this mapper serves, if any.
    dio_lock: Option<DioLock>,
    /// The multi-file writeback group this mapper serves, if any: its writes are queued
    /// there, and its allocations follow the group's cursor.
    plug: Option<&'a WbPlug>,
    /// Under `fsync` ([`FileMapper::last_write_here`]): the writeback batch's latest
    /// data write (target index, operation), held back until the next one comes (then
    /// it goes to its engine) or the batch is complete (then it runs on this thread,
    /// which waits for the batch next; decision 141). `None`: writes are not held.
    /// (Boxed, as `dio_reserved`: only `fsync`'s writeback has one.)
    held: Option<Box<RefCell<HeldWrite>>>,
    /// The file is copy on write with data checksums (`stripefs_core::csum::datacow`):
    /// its written blocks are never written in place, its writes' checksums are kept
    /// for their completion, its reads are verified.
    pub datacow: bool,
    /// The in-place writes this operation was admitted for (I-001-3), left when the
    /// mapper is dropped, after the operation submitted them. Declared last: dropped
    /// after everything else the operation holds.
    pub(crate) in_place: crate::placement::InPlaceWriters<'a>,
}

impl<'a> FileMapper<'a> {
    /// A mapper for regular file `ino`.
    ///
    /// # Errors
    /// `IsDir` / `Invalid` for non-files, `Stale` for missing inodes.
    pub fn new(fs: &'a Fs, ino: Ino) -> Result<Self> {
        let m = fs.inner.meta.lock();
        let i = inode(&m, ino)?;
        match i.attrs.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(FsError::IsDir),
            _ => return Err(FsError::invalid("not a regular file")),
        }
        let layout = i.attrs.layout;
        let datacow = stripefs_core::csum::datacow(&i.attrs);
        Ok(Self {
            fs,
            ino,
            layout,
            datacow,
            hint: RefCell::new(HashMap::new()),
            allocated: Allocated::new(fs),
            dio_reserved: RefCell::new(None),
            dio_lock: None,
            plug: None,
            held: None,
            in_place: crate::placement::InPlaceWriters::new(&fs.inner.states),
        })
    }

    /// Each writeback batch's last data write runs on the calling thread: the caller
    /// waits for the writeback this mapper serves (`fsync`).
    #[must_use]
    pub fn last_write_here(mut self) -> Self {
        self.held = Some(Box::new(RefCell::new(None)));
        self
    }

    /// Where the batch's latest write waits, if this mapper holds one back.
    pub fn held_write(&self) -> Option<&RefCell<HeldWrite>> {
        self.held.as_deref()
    }

    /// This mapper serves a direct write under `lock`.
    #[must_use]
    pub fn with_dio_lock(mut self, lock: DioLock) -> Self {
        self.dio_lock = Some(lock);
        self
    }

    /// This mapper serves a multi-file writeback group.
    #[must_use]
    pub fn with_plug(mut self, plug: &'a WbPlug) -> Self {
        self.plug = Some(plug);
        self
    }

    /// The multi-file writeback group this mapper serves, if any.
    pub fn plug(&self) -> Option<&'a WbPlug> {
        self.plug
    }

    /// The inode lock of the direct write this mapper serves, if any.
    pub fn dio_lock(&self) -> Option<DioLock> {
        self.dio_lock
    }

    /// Hands this operation a reservation for its `Write` allocations; what they do not
    /// use goes back when the mapper is dropped.
    pub fn set_dio_reservation(&self, r: Reservation<'a>) {
        *self.dio_reserved.borrow_mut() = Some(Box::new(r));
    }

    /// The home target of `object` (`StripeLayout::target_of`): where its delayed
    /// allocations are reserved and its new blocks placed.
    pub(crate) fn home(&self, object: u32) -> TargetId {
        self.layout.target_of(object, self.fs.inner.target_count())
    }

    /// Where on `target` to look for free blocks first: right after the previous object
    /// block's extent, if that is on `target`, else where this operation's last
    /// allocation for the object ended.
    fn goal(
        &self,
        m: &MetaCore,
        (target, object, obj_block): (TargetId, u32, u64),
    ) -> Result<Option<u64>> {
        let map = &inode(m, self.ino)?.objects[object as usize];
        Ok(match obj_block.checked_sub(1).map(|b| map.lookup(b)) {
            Some(Lookup::Mapped { start, ext }) if ext.target == target => {
                Some(ext.phys + (obj_block - start))
            }
            _ => self
                .hint
                .borrow()
                .get(&object)
                .filter(|&&(b, t, _)| b == obj_block && t == target)
                .map(|&(_, _, p)| p),
        })
    }

    /// Allocates up to `want` blocks, out of free space or of a reservation.
    fn allocate(
        &self,
        m: &mut MetaCore,
        target: TargetId,
        object: u32,
        obj_block: u64,
        want: u64,
        funding: Funding,
    ) -> Result<(u64, u64)> {
        self.fs.inner.alloc_fault(target)?;
        // A file's own neighbour first; in a writeback group, right after the group's
        // previous allocation on this target, so the group's writes are contiguous.
        let goal = match (self.goal(m, (target, object, obj_block))?, self.plug) {
            (Some(g), _) => Some(g),
            (None, Some(p)) => {
                let bs = self.fs.inner.geo.block_size;
                p.goal(target, &m.alloc, bs.blocks_for(GROUP_CHUNK_BYTES))
            }
            (None, None) => None,
        };
        // Whatever a reservation could not place stays promised to it.
        let draw = match funding {
            Funding::Free => Draw::Data,
            Funding::Reserved => Draw::Promised,
        };
        let got = m.alloc.alloc_from(target, goal, want, draw);
        let (phys, len) =
            got.ok_or_else(|| FsError::NoSpace(format!("target {target} is full")))?;
        if funding == Funding::Reserved {
            // Placed: these blocks stop being delalloc now, since their reservation is
            // spent. Success records them written; failure frees them (the cache data
            // they carried is gone either way).
            let spent = m
                .delalloc_mut(self.ino, object, self.layout.count)
                .remove(obj_block, len);
            debug_assert_eq!(
                spent.on(target),
                spent.total(),
                "a reservation spent elsewhere"
            );
        }
        self.hint
            .borrow_mut()
            .insert(object, (obj_block + len, target, phys + len));
        if let Some(p) = self.plug {
            p.allocated(target, phys + len);
        }
        self.allocated.push(NewBlocks {
            target,
            phys,
            len,
            wb_batch: 0,
        });
        Ok((phys, len))
    }

    /// The first offset in `[pos, end]` whose block holds written data or a delayed
    /// allocation (`end` if none): per object, one look at its extent and delalloc maps
    /// over the object range `[pos, end)` covers (a contiguous range, since every stripe
    /// unit between the ends is wholly inside). Cost: objects x extents in range, never
    /// the size of the range.
    pub fn next_stored(&self, pos: u64, end: u64) -> Result<u64> {
        if pos >= end {
            return Ok(end);
        }
        let bs = self.fs.inner.geo.block_size;
        let l = self.layout;
        let m = self.fs.inner.meta.lock();
        let i = inode(&m, self.ino)?;
        let mut first = end;
        for object in 0..l.count {
            let b0 = bs.block_of(l.object_len(object, bs.round_down(pos)));
            let b1 = bs.blocks_for(l.object_len(object, end));
            if b0 >= b1 {
                continue;
            }
            let written = i.objects[object as usize]
                .range(b0, b1 - b0)
                .find(|(_, e)| e.state == ExtentState::Written)
                .map(|(s, _)| s.max(b0));
            let delayed = m
                .delalloc_of(self.ino, object as usize)
                .and_then(|d| d.covering(b0).map(|_| b0).or_else(|| d.next_after(b0)))
                .filter(|&b| b < b1);
            if let Some(b) = [written, delayed].into_iter().flatten().min() {
                first = first.min(l.file_off(object, bs.to_bytes(b)).max(pos));
            }
        }
        Ok(first)
    }

    /// In-core size.
    pub fn size(&self) -> u64 {
        self.fs.inner.meta.lock().size_of(self.ino).unwrap_or(0)
    }
}

impl IomapOps for FileMapper<'_> {
    type Addr = DevAddr;
    type Error = FsError;

    fn begin(&self, pos: u64, len: u64, op: IomapOp) -> Result<Iomap<DevAddr>> {
        let bs = self.fs.inner.geo.block_size;
        let start = bs.round_down(pos);
        let piece = self.layout.piece(start, bs.round_up(pos + len) - start);
        let object = piece.object;
        let home = self.home(object);
        let obj_block = bs.block_of(piece.obj_off);
        let want = bs.block_of(piece.len);
        self.fs.inner.map_lookups.fetch_add(1, Ordering::Relaxed);
        // The in-place or copy decision's checks run without the metadata lock (I-001-2,
        // `nocow.rs`); `m` is held from the last look at the extent on.
        let (mut m, seq, found) = self.lookup_decided(op, (object, obj_block), want)?;
        // Under the hold the allocation happens in (`placement.rs`).
        let place = self.fs.inner.place(home)?;
        let (kind, flags, target, phys, blocks) = match found {
            Found::Mapped {
                state,
                target,
                phys,
                blocks,
                copy,
            } => {
                let kind = match state {
                    ExtentState::Written => IomapKind::Mapped,
                    ExtentState::Unwritten => IomapKind::Unwritten,
                };
                // Shared (counting a count a transaction not yet durable changed,
                // decision 94), checksummed, or a datacow file's written blocks: never
                // written in place (I-001-1; a datacow file's checksums could not be kept
                // crash-consistent, decision 70).
                if copy {
                    self.map_shared(
                        &mut m,
                        op,
                        (place, object, obj_block),
                        kind,
                        (target, phys),
                        blocks,
                    )?
                } else {
                    if op == IomapOp::Writeback {
                        // A copy-on-write reservation whose blocks stopped being shared
                        // (the other owners let go): written in place, the promise goes back.
                        let da = m.delalloc_mut(self.ino, object, self.layout.count);
                        if da.covering(obj_block).is_some() {
                            da.remove(obj_block, blocks).unreserve(&mut m.alloc);
                        }
                    }
                    (kind, IomapFlags::NONE, target, phys, blocks)
                }
            }
            Found::Hole { next } => {
                let hole = next.map_or(want, |n| (n - obj_block).min(want));
                self.map_hole(&mut m, op, (place, object, obj_block), hole)?
            }
        };
        let unit = u64::from(self.layout.unit_bytes);
        let ends_unit = start + bs.to_bytes(blocks) == (start / unit + 1) * unit;
        let flags = if ends_unit {
            flags.with(IomapFlags::BOUNDARY)
        } else {
            flags
        };
        debug_assert!(
            !flags.contains(IomapFlags::NEW) || kind == IomapKind::Mapped,
            "NEW means allocated by this begin, never reserved"
        );
        debug_assert!(
            !flags.contains(IomapFlags::RESERVED) || op == IomapOp::BufferedWrite,
            "only a buffered write reserves"
        );
        debug_assert!(
            !(op == IomapOp::Write
                && self.dio_lock == Some(DioLock::Shared)
                && flags.contains(IomapFlags::NEW)),
            "a shared-lock direct write allocated at {pos}"
        );
        let addr = DevAddr {
            target,
            object,
            obj_block,
            phys,
        };
        let map = Iomap {
            offset: start,
            length: bs.to_bytes(blocks),
            kind,
            flags,
            addr,
            seq,
        };
        debug_assert!(map.covers(pos), "mapping {map:?} does not cover {pos}");
        debug_assert!(
            start % unit + map.length <= unit,
            "mapping {map:?} crosses a stripe unit"
        );
        Ok(map)
    }

    fn end(&self, map: &Iomap<DevAddr>, pos: u64, used: u64, op: IomapOp) -> Result<()> {
        debug_assert!(
            map.covers(pos) && pos + used <= map.end(),
            "end of {map:?} at {pos} with {used} bytes used"
        );
        if !map.flags.contains(IomapFlags::NEW) && !map.flags.contains(IomapFlags::RESERVED) {
            return Ok(());
        }
        let bs = self.fs.inner.geo.block_size;
        let used_blocks = if used == 0 {
            0
        } else {
            bs.block_of(bs.round_up(pos + used) - map.offset)
        };
        let total = bs.block_of(map.length);
        if used_blocks >= total {
            return Ok(());
        }
        let (first, count) = (used_blocks, total - used_blocks);
        let mut m = self.fs.inner.meta.lock();
        if map.flags.contains(IomapFlags::RESERVED) {
            debug_assert_eq!(op, IomapOp::BufferedWrite, "only buffered writes reserve");
            // I-002-6: reservations no dirty block keeps go back.
            let objects = self.layout.count;
            m.delalloc_mut(self.ino, map.addr.object, objects)
                .remove(map.addr.obj_block + first, count)
                .unreserve(&mut m.alloc);
            return Ok(());
        }
        let phys = map.addr.phys + first;
        m.alloc.free_now(map.addr.target, phys, count);
        drop(m);
        self.allocated.forget_from(map.addr.target, phys);
        Ok(())
    }

    fn still_valid(&self, map: &Iomap<DevAddr>) -> bool {
        self.fs
            .inner
            .meta
            .lock()
            .inodes
            .get(self.ino)
            .is_some_and(|c| c.map_gen == map.seq)
    }
}

impl FileMapper<'_> {
    /// Allocates up to `blocks` blocks no delayed allocation paid for: out of this direct
    /// write's reservation while it has some on `target`, else out of free space (a
    /// direct write that could not reserve, writeback of blocks no write reserved).
    fn allocate_unreserved(
        &self,
        m: &mut MetaCore,
        target: TargetId,
        object: u32,
        obj_block: u64,
        blocks: u64,
    ) -> Result<(u64, u64)> {
        let mut reservation = self.dio_reserved.borrow_mut();
        let reserved = reservation.as_ref().map_or(0, |r| r.left_on(target));
        match reservation.as_mut() {
            Some(r) if reserved > 0 => {
                let want = blocks.min(reserved);
                let got = self.allocate(m, target, object, obj_block, want, Funding::Reserved)?;
                r.spent(target, got.1);
                Ok(got)
            }
            _ => self.allocate(m, target, object, obj_block, blocks, Funding::Free),
        }
    }

    /// Maps `blocks` blocks at `obj_block` (from `phys` of `at`) that `op` must not write
    /// in place (shared, checksummed, a datacow file's, or on a read-only target) for
    /// `op` (`docs/design/reflink.md`, "Copy on write"): reads use them; a buffered write
    /// reserves a block for each on `place` (kept as a delayed allocation over the mapped
    /// blocks, so writeback never meets `ENOSPC`); writeback and direct writes get new
    /// blocks, which their completion records in place of the old ones
    /// (`Fs::log_remapped`).
    fn map_shared(
        &self,
        m: &mut MetaCore,
        op: IomapOp,
        (place, object, obj_block): (TargetId, u32, u64),
        kind: IomapKind,
        (at, phys): (TargetId, u64),
        blocks: u64,
    ) -> Result<(IomapKind, IomapFlags, TargetId, u64, u64)> {
        let objects = self.layout.count;
        match op {
            IomapOp::Read | IomapOp::Report => Ok((kind, IomapFlags::SHARED, at, phys, blocks)),
            // `Write` without a direct write's lock is preallocation (`fallocate`): the
            // blocks are allocated already and stay shared.
            IomapOp::Write if self.dio_lock.is_none() => {
                Ok((kind, IomapFlags::SHARED, at, phys, blocks))
            }
            IomapOp::BufferedWrite => {
                let da = m.delalloc_mut(self.ino, object, objects);
                if let Some((s, l, _)) = da.covering(obj_block) {
                    let n = (s + l - obj_block).min(blocks);
                    return Ok((kind, IomapFlags::SHARED, at, phys, n));
                }
                let n = da
                    .next_after(obj_block)
                    .map_or(blocks, |x| (x - obj_block).min(blocks));
                let got = self.reserve_delayed(m, (place, object, obj_block), n)?;
                let flags = IomapFlags::SHARED.with(IomapFlags::RESERVED);
                Ok((kind, flags, at, phys, got))
            }
            IomapOp::Writeback | IomapOp::Write => {
                let da = m.delalloc_mut(self.ino, object, objects);
                let (covered, next) = (da.covering(obj_block), da.next_after(obj_block));
                let (target, (new, got)) = match covered {
                    Some((s, l, rt)) => {
                        let n = (s + l - obj_block).min(blocks);
                        self.allocate_delayed(m, (rt, object, obj_block), n)?
                    }
                    // Up to the next reserved block: that one is paid for by its
                    // reservation, which completion would otherwise leave promised.
                    // A direct write draws on its reservation, which counted these
                    // blocks (`Fs::reserve_dio_space`); blocks written in place until
                    // now take free space (I-001-5).
                    None => {
                        let n = next.map_or(blocks, |x| (x - obj_block).min(blocks));
                        (
                            place,
                            self.allocate_unreserved(m, place, object, obj_block, n)?,
                        )
                    }
                };
                Ok((IomapKind::Mapped, IomapFlags::NEW, target, new, got))
            }
        }
    }

    /// Reserves up to `want` blocks on `place` for a buffered write at `obj_block` of
    /// `object`, kept as a delayed allocation there. Returns how many.
    fn reserve_delayed(
        &self,
        m: &mut MetaCore,
        (place, object, obj_block): (TargetId, u32, u64),
        want: u64,
    ) -> Result<u64> {
        let got = want.min(m.alloc.available_blocks(place));
        if got == 0 {
            return Err(FsError::NoSpace(format!("target {place} is full")));
        }
        self.fs.inner.alloc_fault(place)?;
        assert!(m.alloc.reserve(place, got));
        m.delalloc_mut(self.ino, object, self.layout.count)
            .insert(obj_block, got, place);
        Ok(got)
    }

    /// Allocates up to `want` blocks for the delayed allocation at `obj_block`, whose
    /// reservation is on `reserved_on`: out of it while that target is writable; if it
    /// went read-only since, the promise is given back there and the blocks come from
    /// free space on the target placement picks (decision 101). Returns the target and
    /// `(phys, blocks)`.
    fn allocate_delayed(
        &self,
        m: &mut MetaCore,
        (reserved_on, object, obj_block): (TargetId, u32, u64),
        want: u64,
    ) -> Result<(TargetId, (u64, u64))> {
        let place = self.fs.inner.place(reserved_on)?;
        if place == reserved_on {
            let got = self.allocate(m, place, object, obj_block, want, Funding::Reserved)?;
            return Ok((place, got));
        }
        let (phys, got) = self.allocate(m, place, object, obj_block, want, Funding::Free)?;
        m.delalloc_mut(self.ino, object, self.layout.count)
            .remove(obj_block, got)
            .unreserve(&mut m.alloc);
        Ok((place, (phys, got)))
    }

    /// Maps `hole` blocks of hole at `obj_block` (possibly covered by delalloc) for `op`;
    /// new blocks and reservations go to `place`.
    fn map_hole(
        &self,
        m: &mut MetaCore,
        op: IomapOp,
        (place, object, obj_block): (TargetId, u32, u64),
        hole: u64,
    ) -> Result<(IomapKind, IomapFlags, TargetId, u64, u64)> {
        let objects = self.layout.count;
        let da = m.delalloc_mut(self.ino, object, objects);
        if let Some((s, l, rt)) = da.covering(obj_block) {
            let blocks = (s + l - obj_block).min(hole);
            if op == IomapOp::Writeback {
                let (t, (phys, got)) = self.allocate_delayed(m, (rt, object, obj_block), blocks)?;
                return Ok((IomapKind::Mapped, IomapFlags::NEW, t, phys, got));
            }
            return Ok((IomapKind::Delalloc, IomapFlags::NONE, rt, 0, blocks));
        }
        let blocks = da
            .next_after(obj_block)
            .map_or(hole, |n| (n - obj_block).min(hole));
        match op {
            IomapOp::Write | IomapOp::Writeback => {
                let (phys, got) = self.allocate_unreserved(m, place, object, obj_block, blocks)?;
                Ok((IomapKind::Mapped, IomapFlags::NEW, place, phys, got))
            }
            IomapOp::BufferedWrite => {
                let got = self.reserve_delayed(m, (place, object, obj_block), blocks)?;
                Ok((IomapKind::Delalloc, IomapFlags::RESERVED, place, 0, got))
            }
            IomapOp::Read | IomapOp::Report => {
                Ok((IomapKind::Hole, IomapFlags::NONE, place, 0, blocks))
            }
        }
    }
}

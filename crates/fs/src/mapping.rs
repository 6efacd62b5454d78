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

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use stripefs_core::extent::{ExtentState, Lookup};
use stripefs_core::inode::FileKind;
use stripefs_core::layout::StripeLayout;
use stripefs_core::{Ino, TargetId};
use stripefs_iomap::{Iomap, IomapFlags, IomapKind, IomapOp, IomapOps};
use stripefs_target::FaultPoint;

use crate::direct::DioLock;
use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::inner::MetaCore;
use crate::namespace::inode;

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

/// Blocks allocated by `begin` and not yet recorded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewBlocks {
    pub target: TargetId,
    pub phys: u64,
    pub len: u64,
}

/// Maps one file for one operation.
#[derive(Debug)]
pub(crate) struct FileMapper<'a> {
    pub fs: &'a Fs,
    pub ino: Ino,
    pub layout: StripeLayout,
    /// Per object: where the last allocation of this operation ended (object block, phys).
    hint: RefCell<HashMap<u32, (u64, u64)>>,
    /// Every allocation made by this operation (freed if it fails).
    pub allocated: RefCell<Vec<NewBlocks>>,
    /// Blocks reserved per target for this direct write; `Write` allocations draw on it.
    dio_reserved: RefCell<HashMap<TargetId, u64>>,
    /// The inode lock of the direct write this mapper serves, if any.
    dio_lock: Option<DioLock>,
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
        Ok(Self {
            fs,
            ino,
            layout,
            hint: RefCell::new(HashMap::new()),
            allocated: RefCell::new(Vec::new()),
            dio_reserved: RefCell::new(HashMap::new()),
            dio_lock: None,
        })
    }

    /// This mapper serves a direct write under `lock`.
    #[must_use]
    pub fn with_dio_lock(mut self, lock: DioLock) -> Self {
        self.dio_lock = Some(lock);
        self
    }

    /// The inode lock of the direct write this mapper serves, if any.
    pub fn dio_lock(&self) -> Option<DioLock> {
        self.dio_lock
    }

    /// Returns every allocation of this operation to the free map (the operation failed
    /// before recording them, so they were never visible).
    pub fn release_new(&self) {
        let mut m = self.fs.inner.meta.lock();
        for n in self.allocated.borrow_mut().drain(..) {
            m.alloc.free_now(n.target, n.phys, n.len);
        }
    }

    /// Hands this operation a reservation (blocks per target) for its allocations.
    pub fn set_dio_reservation(&self, r: HashMap<TargetId, u64>) {
        *self.dio_reserved.borrow_mut() = r;
    }

    /// Returns whatever of the reservation was not allocated.
    pub fn release_dio_reservation(&self) {
        let left = std::mem::take(&mut *self.dio_reserved.borrow_mut());
        if left.values().all(|&n| n == 0) {
            return;
        }
        let mut m = self.fs.inner.meta.lock();
        for (t, n) in left {
            m.alloc.unreserve(t, n);
        }
    }

    /// Forgets the allocations of this operation (they were recorded).
    pub fn keep_new(&self) {
        self.allocated.borrow_mut().clear();
    }

    fn goal(&self, m: &MetaCore, object: u32, obj_block: u64) -> Result<Option<u64>> {
        let map = &inode(m, self.ino)?.objects[object as usize];
        Ok(match obj_block.checked_sub(1).map(|b| map.lookup(b)) {
            Some(Lookup::Mapped { start, ext }) => Some(ext.phys + (obj_block - start)),
            _ => self
                .hint
                .borrow()
                .get(&object)
                .filter(|(b, _)| *b == obj_block)
                .map(|&(_, p)| p),
        })
    }

    /// Allocates up to `want` blocks; `reserved` blocks of them come out of a delalloc
    /// reservation.
    fn allocate(
        &self,
        m: &mut MetaCore,
        target: TargetId,
        object: u32,
        obj_block: u64,
        want: u64,
        reserved: bool,
    ) -> Result<(u64, u64)> {
        self.fs
            .inner
            .fault(FaultPoint::Alloc)
            .map_err(|_| FsError::NoSpace(format!("allocation on target {target} (injected)")))?;
        let goal = self.goal(m, object, obj_block)?;
        if reserved {
            m.alloc.unreserve(target, want);
        }
        let got = m.alloc.alloc(target, goal, want);
        if reserved {
            // Whatever was not placed stays promised to the delalloc range.
            let placed = got.map_or(0, |(_, l)| l);
            assert!(
                m.alloc.reserve(target, want - placed),
                "re-reserving just-released blocks"
            );
        }
        let (phys, len) =
            got.ok_or_else(|| FsError::NoSpace(format!("target {target} is full")))?;
        if reserved {
            // Placed: these blocks stop being delalloc now, since their reservation is
            // spent. Success records them written; failure frees them (the cache data
            // they carried is gone either way).
            m.delalloc_mut(self.ino, object, self.layout.count)
                .remove(obj_block, len);
        }
        self.hint
            .borrow_mut()
            .insert(object, (obj_block + len, phys + len));
        self.allocated
            .borrow_mut()
            .push(NewBlocks { target, phys, len });
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
                .delalloc
                .get(&self.ino)
                .and_then(|v| v.get(object as usize))
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
        let target = self
            .layout
            .target_of(object, self.fs.inner.geo.target_count());
        let obj_block = bs.block_of(piece.obj_off);
        let want = bs.block_of(piece.len);
        self.fs.inner.map_lookups.fetch_add(1, Ordering::Relaxed);
        let mut m = self.fs.inner.meta.lock();
        let seq = m.map_gen.get(&self.ino).copied().unwrap_or(0);
        let found = inode(&m, self.ino)?.objects[object as usize].lookup(obj_block);
        let (kind, flags, phys, blocks) = match found {
            Lookup::Mapped { start: es, ext } => {
                let kind = match ext.state {
                    ExtentState::Written => IomapKind::Mapped,
                    ExtentState::Unwritten => IomapKind::Unwritten,
                };
                let off_in = obj_block - es;
                (
                    kind,
                    IomapFlags::NONE,
                    ext.phys + off_in,
                    (ext.len - off_in).min(want),
                )
            }
            Lookup::Hole { next } => {
                let hole = next.map_or(want, |n| (n - obj_block).min(want));
                self.map_hole(&mut m, op, target, object, obj_block, hole)?
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
            !flags.contains(IomapFlags::RESERVED)
                || (kind == IomapKind::Delalloc && op == IomapOp::BufferedWrite),
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
        Ok(Iomap {
            offset: start,
            length: bs.to_bytes(blocks),
            kind,
            flags,
            addr,
            seq,
        })
    }

    fn end(&self, map: &Iomap<DevAddr>, pos: u64, used: u64, op: IomapOp) -> Result<()> {
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
            let removed = m
                .delalloc_mut(self.ino, map.addr.object, objects)
                .remove(map.addr.obj_block + first, count);
            m.alloc.unreserve(map.addr.target, removed);
            return Ok(());
        }
        let phys = map.addr.phys + first;
        m.alloc.free_now(map.addr.target, phys, count);
        let mut allocated = self.allocated.borrow_mut();
        if let Some(a) = allocated
            .iter_mut()
            .find(|a| a.target == map.addr.target && a.phys <= phys && phys < a.phys + a.len)
        {
            a.len = phys - a.phys;
        }
        allocated.retain(|a| a.len > 0);
        Ok(())
    }

    fn still_valid(&self, map: &Iomap<DevAddr>) -> bool {
        self.fs
            .inner
            .meta
            .lock()
            .map_gen
            .get(&self.ino)
            .copied()
            .unwrap_or(0)
            == map.seq
    }
}

impl FileMapper<'_> {
    /// Maps `hole` blocks of hole at `obj_block` (possibly covered by delalloc) for `op`.
    fn map_hole(
        &self,
        m: &mut MetaCore,
        op: IomapOp,
        target: TargetId,
        object: u32,
        obj_block: u64,
        hole: u64,
    ) -> Result<(IomapKind, IomapFlags, u64, u64)> {
        let objects = self.layout.count;
        let da = m.delalloc_mut(self.ino, object, objects);
        if let Some((s, l)) = da.covering(obj_block) {
            let blocks = (s + l - obj_block).min(hole);
            if op == IomapOp::Writeback {
                let (phys, got) = self.allocate(m, target, object, obj_block, blocks, true)?;
                return Ok((IomapKind::Mapped, IomapFlags::NEW, phys, got));
            }
            return Ok((IomapKind::Delalloc, IomapFlags::NONE, 0, blocks));
        }
        let blocks = da
            .next_after(obj_block)
            .map_or(hole, |n| (n - obj_block).min(hole));
        match op {
            IomapOp::Write | IomapOp::Writeback => {
                let reserved = self
                    .dio_reserved
                    .borrow()
                    .get(&target)
                    .copied()
                    .unwrap_or(0);
                let (phys, got) = if reserved > 0 {
                    let want = blocks.min(reserved);
                    let r = self.allocate(m, target, object, obj_block, want, true)?;
                    *self.dio_reserved.borrow_mut().entry(target).or_default() -= r.1;
                    r
                } else {
                    self.allocate(m, target, object, obj_block, blocks, false)?
                };
                Ok((IomapKind::Mapped, IomapFlags::NEW, phys, got))
            }
            IomapOp::BufferedWrite => {
                let avail = m.alloc.available_blocks(target);
                let got = blocks.min(avail);
                if got == 0 || self.fs.inner.fault(FaultPoint::Alloc).is_err() {
                    return Err(FsError::NoSpace(format!("target {target} is full")));
                }
                assert!(m.alloc.reserve(target, got));
                m.delalloc_mut(self.ino, object, objects)
                    .insert(obj_block, got);
                Ok((IomapKind::Delalloc, IomapFlags::RESERVED, 0, got))
            }
            IomapOp::Read | IomapOp::Report => Ok((IomapKind::Hole, IomapFlags::NONE, 0, blocks)),
        }
    }
}

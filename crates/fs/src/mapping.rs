//! The file system's side of the mapping contract: file range -> stripe piece -> extent.
//!
//! `begin` resolves one stripe piece of the range (never crossing a stripe unit, so never
//! crossing a target) against the object's extent map under the metadata lock, and for
//! writes into holes allocates blocks, contiguous with the previous extent when it can.
//! Allocated blocks are not recorded in the extent map here: the write path records them
//! once the data is on the target, which is what keeps stale blocks invisible.

use std::cell::RefCell;
use std::collections::HashMap;

use stripefs_core::extent::{ExtentState, Lookup};
use stripefs_core::inode::FileKind;
use stripefs_core::layout::StripeLayout;
use stripefs_core::{Ino, TargetId};
use stripefs_iomap::{Iomap, IomapFlags, IomapKind, IomapOp, IomapOps};
use stripefs_target::FaultPoint;

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::namespace::inode;

/// Where a mapping lives on the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DevAddr {
    pub target: TargetId,
    /// Stripe object holding the mapping.
    pub object: u32,
    /// Object block of the mapping's first byte.
    pub obj_block: u64,
    /// Physical block of the mapping's first byte.
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
    fs: &'a Fs,
    ino: Ino,
    layout: StripeLayout,
    /// Per object: where the last allocation of this operation ended (object block, phys).
    hint: RefCell<HashMap<u32, (u64, u64)>>,
    /// Every allocation made by this operation (freed if it fails).
    pub allocated: RefCell<Vec<NewBlocks>>,
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
        })
    }

    /// Returns every allocation of this operation to the free map (the operation failed
    /// before recording them, so they were never visible).
    pub fn release_new(&self) {
        let mut m = self.fs.inner.meta.lock();
        for n in self.allocated.borrow_mut().drain(..) {
            m.alloc.free_now(n.target, n.phys, n.len);
        }
    }

    fn allocate(
        &self,
        m: &mut crate::inner::MetaCore,
        target: TargetId,
        object: u32,
        obj_block: u64,
        want: u64,
    ) -> Result<(u64, u64)> {
        self.fs
            .inner
            .fault(FaultPoint::Alloc)
            .map_err(|_| FsError::NoSpace(format!("allocation on target {target} (injected)")))?;
        let map = &inode(m, self.ino)?.objects[object as usize];
        let goal = match obj_block.checked_sub(1).map(|b| map.lookup(b)) {
            Some(Lookup::Mapped { start, ext }) => Some(ext.phys + (obj_block - start)),
            _ => self
                .hint
                .borrow()
                .get(&object)
                .filter(|(b, _)| *b == obj_block)
                .map(|&(_, p)| p),
        };
        let (phys, len) = m
            .alloc
            .alloc(target, goal, want)
            .ok_or_else(|| FsError::NoSpace(format!("target {target} is full")))?;
        self.hint
            .borrow_mut()
            .insert(object, (obj_block + len, phys + len));
        self.allocated
            .borrow_mut()
            .push(NewBlocks { target, phys, len });
        Ok((phys, len))
    }
}

impl IomapOps for FileMapper<'_> {
    type Addr = DevAddr;
    type Error = FsError;

    fn begin(&self, pos: u64, len: u64, op: IomapOp) -> Result<Iomap<DevAddr>> {
        let bs = self.fs.inner.geo.block_size;
        let start = bs.round_down(pos);
        let piece = self.layout.piece(start, bs.round_up(pos + len) - start);
        let target = self
            .layout
            .target_of(piece.object, self.fs.inner.geo.target_count());
        let obj_block = bs.block_of(piece.obj_off);
        let want = bs.block_of(piece.len);
        let mut m = self.fs.inner.meta.lock();
        let seq = m.map_gen.get(&self.ino).copied().unwrap_or(0);
        let found = inode(&m, self.ino)?.objects[piece.object as usize].lookup(obj_block);
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
                let blocks = next.map_or(want, |n| (n - obj_block).min(want));
                if op == IomapOp::Write {
                    let (phys, got) =
                        self.allocate(&mut m, target, piece.object, obj_block, blocks)?;
                    (IomapKind::Mapped, IomapFlags::NEW, phys, got)
                } else {
                    (IomapKind::Hole, IomapFlags::NONE, 0, blocks)
                }
            }
        };
        let unit = u64::from(self.layout.unit_bytes);
        let ends_unit = start + bs.to_bytes(blocks) == (start / unit + 1) * unit;
        let flags = if ends_unit {
            flags.with(IomapFlags::BOUNDARY)
        } else {
            flags
        };
        let addr = DevAddr {
            target,
            object: piece.object,
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

    fn end(&self, map: &Iomap<DevAddr>, pos: u64, used: u64, _op: IomapOp) -> Result<()> {
        if !map.flags.contains(IomapFlags::NEW) {
            return Ok(());
        }
        let bs = self.fs.inner.geo.block_size;
        let used_blocks = if used == 0 {
            0
        } else {
            bs.block_of(bs.round_up(pos + used) - map.offset)
        };
        let total = bs.block_of(map.length);
        if used_blocks < total {
            let (phys, len) = (map.addr.phys + used_blocks, total - used_blocks);
            self.fs
                .inner
                .meta
                .lock()
                .alloc
                .free_now(map.addr.target, phys, len);
            let mut allocated = self.allocated.borrow_mut();
            if let Some(a) = allocated
                .iter_mut()
                .find(|a| a.target == map.addr.target && a.phys <= phys && phys < a.phys + a.len)
            {
                a.len = phys - a.phys;
            }
            allocated.retain(|a| a.len > 0);
        }
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

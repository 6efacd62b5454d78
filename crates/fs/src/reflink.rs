//! Shared extents (`docs/design/reflink.md`): clones with `FICLONERANGE` semantics,
//! `copy_file_range` by sharing, and the release of the blocks a copy-on-write write
//! replaced.
//!
//! A clone maps the destination's range onto the source's blocks wherever the two files
//! place that range on the same target (the same stripe geometry and position, or an
//! empty destination that takes the source's layout); the rest is copied through the
//! page cache after the shared part is in place. One transaction releases the
//! destination's old extents, raises the counts and maps the destination.

use stripefs_core::alloc::Draw;
use stripefs_core::extent::ExtentState;
use stripefs_core::record::Record;
use stripefs_core::Ino;
use stripefs_iomap::{Iomap, WbWait};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::inner::{Freed, MetaCore};
use crate::mapping::{DevAddr, FileMapper};
use crate::namespace::{data_changed, inode};

/// Bytes moved per read and write when a range is copied rather than shared.
const COPY_CHUNK: usize = 1 << 20;

impl Fs {
    /// Clones `[src_off, src_off + len)` of `src` onto `dst` at `dst_off` (`FICLONERANGE`):
    /// afterwards the destination range reads what the source range held, sharing its
    /// blocks where both files place the range on the same target, and the destination's
    /// old extents there are released. `len` 0 means to the source's end. Offsets and
    /// length are whole blocks, except that a range ending at the source's EOF may end
    /// inside a block when it also reaches or passes the destination's EOF. Returns the
    /// bytes cloned.
    ///
    /// # Errors
    /// `Invalid` for unaligned offsets or length, a range past the source's EOF, or
    /// overlapping ranges of one file; `IsDir`/`Invalid` for non-files; `FileTooBig`;
    /// `NoSpace` for the copied part; I/O errors; `Poisoned`.
    pub fn clone_range(
        &self,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.inner.check()?;
        let change = self.begin_change()?;
        let smapper = FileMapper::new(self, src)?;
        let dmapper = FileMapper::new(self, dst)?;
        if smapper.datacow != dmapper.datacow {
            // As btrfs: a clone never makes a file partly checksummed (nor a NOCOW file
            // own checksummed blocks it could later overwrite in place).
            return Err(FsError::invalid(
                "clone between a copy-on-write file and a NOCOW file",
            ));
        }
        let b = self.inner.geo.block_size.bytes_u64();
        // Inode locks in inode order (one for a file cloned onto itself), in-flight direct
        // I/O drained, dirty cache of both files written back: what is shared is on the
        // targets, and sizes are settled.
        let (first, second) = (src.min(dst), src.max(dst));
        let io_first = self.inner.io_lock(first);
        let io_second = (first != second).then(|| self.inner.io_lock(second));
        let g1 = io_first.write();
        let g2 = io_second.as_ref().map(|io| io.write());
        io_first.dio.drain();
        if let Some(io) = &io_second {
            io.dio.drain();
        }
        self.writeback_file(src, WbWait::Busy)?;
        if dst != src {
            self.writeback_file(dst, WbWait::Busy)?;
        }
        let (src_size, dst_size) = {
            let m = self.inner.meta.lock();
            let s = m.size_of(src).ok_or(FsError::Stale(src.0))?;
            let d = m.size_of(dst).ok_or(FsError::Stale(dst.0))?;
            (s, d)
        };
        let len = if len == 0 {
            src_size.saturating_sub(src_off)
        } else {
            len
        };
        let src_end = src_off
            .checked_add(len)
            .filter(|&e| e <= src_size)
            .ok_or_else(|| FsError::invalid("clone range passes the source's end"))?;
        let eof_tail = src_end == src_size && !len.is_multiple_of(b);
        if !src_off.is_multiple_of(b) || !dst_off.is_multiple_of(b) {
            return Err(FsError::invalid("clone offsets must be block aligned"));
        }
        if !len.is_multiple_of(b) && !eof_tail {
            return Err(FsError::invalid("clone length must be block aligned"));
        }
        let span = self.inner.geo.block_size.round_up(len);
        let dst_end = dst_off
            .checked_add(span)
            .filter(|&e| e <= crate::MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        if eof_tail && dst_off + len < dst_size {
            return Err(FsError::invalid(
                "a clone ending inside the source's EOF block must reach the destination's EOF",
            ));
        }
        if src == dst && src_off < dst_end && dst_off < src_off + span {
            return Err(FsError::invalid("clone ranges of one file overlap"));
        }
        if len == 0 {
            return Ok(0);
        }
        // Bytes between the destination's EOF and the range read as zeros.
        if self.zero_eof_to(&dmapper, dst_off)? {
            self.writeback_file(dst, WbWait::Busy)?;
        }
        if let Some(fc) = self.inner.cache.existing(dst.0) {
            stripefs_iomap::invalidate_range(&self.inner.cache, &fc, dst_off, dst_end);
        }
        drop((smapper, dmapper));
        {
            let mut m = self.inner.meta.lock();
            self.clone_extents(&mut m, (src, src_off), (dst, dst_off), len)?;
        }
        drop((g1, g2, change));
        Ok(len)
    }

    /// Clones the whole of `src` onto `dst` (`FICLONE`): `dst` reads as `src` and takes
    /// its size.
    ///
    /// # Errors
    /// As [`Self::clone_range`].
    pub fn clone_file(&self, src: Ino, dst: Ino) -> Result<u64> {
        if src == dst {
            return Err(FsError::invalid("a file cloned onto itself"));
        }
        if !self.same_datacow(src, dst)? {
            // Refused before the destination is truncated (`clone_range` refuses too).
            return Err(FsError::invalid(
                "clone between a copy-on-write file and a NOCOW file",
            ));
        }
        self.set_len(dst, 0)?;
        self.clone_range(src, 0, dst, 0, 0)
    }

    /// `copy_file_range`: copies up to `len` bytes (fewer at the source's EOF) from `src`
    /// at `src_off` to `dst` at `dst_off`, sharing the blocks of the block-aligned middle
    /// ([`Self::clone_range`]) and copying the unaligned edges through the page cache;
    /// offsets that differ within a block are copied whole. Returns the bytes copied.
    ///
    /// # Errors
    /// `Invalid` for overlapping ranges of one file; as [`Self::clone_range`].
    pub fn copy_file_range(
        &self,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.inner.check()?;
        let size = self
            .inner
            .meta
            .lock()
            .size_of(src)
            .ok_or(FsError::Stale(src.0))?;
        if src_off >= size || len == 0 {
            return Ok(0);
        }
        let len = len.min(size - src_off);
        if src == dst && src_off < dst_off.saturating_add(len) && dst_off < src_off + len {
            return Err(FsError::invalid("copy ranges of one file overlap"));
        }
        let b = self.inner.geo.block_size.bytes_u64();
        if src_off % b != dst_off % b || !self.same_datacow(src, dst)? {
            // Offsets that differ within a block, or a copy-on-write file and a NOCOW
            // one (which share no blocks): copied.
            self.copy_bytes(src, src_off, dst, dst_off, len)?;
            return Ok(len);
        }
        let head = ((b - src_off % b) % b).min(len);
        self.copy_bytes(src, src_off, dst, dst_off, head)?;
        let (s, d, rest) = (src_off + head, dst_off + head, len - head);
        let whole = rest / b * b;
        // The tail too when it is the source's EOF block and reaches the destination's
        // EOF; else the tail is copied.
        let mut shared = 0;
        if rest > whole && s + rest == size {
            match self.clone_range(src, s, dst, d, rest) {
                Ok(_) => shared = rest,
                Err(FsError::Invalid(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if shared == 0 && whole > 0 {
            self.clone_range(src, s, dst, d, whole)?;
            shared = whole;
        }
        self.copy_bytes(src, s + shared, dst, d + shared, rest - shared)?;
        Ok(len)
    }

    /// Whether `a` and `b` are both copy-on-write files or both NOCOW.
    fn same_datacow(&self, a: Ino, b: Ino) -> Result<bool> {
        let m = self.inner.meta.lock();
        let flag = |i: Ino| -> Result<bool> {
            Ok(stripefs_core::csum::datacow(
                &m.state.get(i)?.ok_or(FsError::Stale(i.0))?.attrs,
            ))
        };
        Ok(flag(a)? == flag(b)?)
    }

    /// Copies `n` bytes through the page cache.
    fn copy_bytes(&self, src: Ino, mut so: u64, dst: Ino, mut d: u64, mut n: u64) -> Result<()> {
        let mut buf = vec![0u8; COPY_CHUNK.min(usize::try_from(n).unwrap_or(COPY_CHUNK))];
        while n > 0 {
            let want = buf.len().min(usize::try_from(n).unwrap_or(buf.len()));
            let got = self.read_at(src, so, &mut buf[..want])?;
            if got == 0 {
                return Ok(()); // the source shrank meanwhile
            }
            let mut done = 0;
            while done < got {
                done += self.write_at(dst, d + done as u64, &buf[done..got])?;
            }
            so += got as u64;
            d += got as u64;
            n -= got as u64;
        }
        Ok(())
    }

    /// The metadata side of a clone, in one transaction under the metadata lock: the
    /// destination range's delayed allocations and extents released, the source's
    /// written extents shared (increments, then the destination's extent records, which
    /// name the source's targets whatever the destination's layout), the size grown.
    fn clone_extents(
        &self,
        m: &mut MetaCore,
        (src, src_off): (Ino, u64),
        (dst, dst_off): (Ino, u64),
        len: u64,
    ) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let span = bs.round_up(len);
        let sl = inode(m, src)?.attrs.layout;
        // An empty destination takes the source's layout: then everything is shared.
        let d = inode(m, dst)?;
        let empty = dst != src
            && d.attrs.size == 0
            && d.objects
                .iter()
                .all(stripefs_core::extent::ExtentMap::is_empty)
            && m.delalloc_blocks(dst) == 0
            && d.attrs.layout.count == sl.count;
        if empty && d.attrs.layout != sl {
            let mut a = d.attrs.clone();
            a.layout = sl;
            self.inner.log_all(m, vec![Record::InodeSet(a)])?;
        }
        let dl = inode(m, dst)?.attrs.layout;
        for object in 0..dl.count {
            let b0 = bs.block_of(dl.object_len(object, dst_off));
            let b1 = bs.block_of(dl.object_len(object, dst_off + span));
            if b1 > b0 {
                let removed = m.delalloc_mut(dst, object, dl.count).remove(b0, b1 - b0);
                removed.unreserve(&mut m.alloc);
                self.clear_object_range(m, dst, object, (b0, b1 - b0), None)?;
            }
        }
        let si = inode(m, src)?;
        let mut share = Vec::new();
        let mut sets = Vec::new();
        let mut off = 0;
        while off < span {
            let sp = sl.piece(src_off + off, span - off);
            let dp = dl.piece(dst_off + off, span - off);
            let step = sp.len.min(dp.len);
            let (sb, db, nb) = (
                bs.block_of(sp.obj_off),
                bs.block_of(dp.obj_off),
                bs.block_of(step),
            );
            for (s, e) in si.objects[sp.object as usize].range(sb, nb) {
                if e.state != ExtentState::Written {
                    continue; // unwritten: the destination gets a hole (zeros)
                }
                let lo = s.max(sb);
                let hi = (s + e.len).min(sb + nb);
                let phys = e.phys + (lo - s);
                share.push((e.target, phys, hi - lo));
                sets.push(Record::ExtentSet {
                    ino: dst,
                    object: dp.object,
                    block: db + (lo - sb),
                    len: hi - lo,
                    phys,
                    state: ExtentState::Written,
                    target: e.target,
                });
            }
            off += step;
        }
        let mut recs = self.inner.refs_ok(m.ref_share(&share))?;
        recs.extend(sets);
        let mut a = data_changed(m, dst)?;
        if dst_off + len > a.size {
            a.size = dst_off + len;
            m.set_isize(dst, None);
            m.mark_data(dst);
        }
        recs.push(Record::InodeSet(a));
        self.inner.log_all(m, recs)?;
        Ok(())
    }

    /// Logs `recs`, the records of completed writes of `ino`, and releases the blocks
    /// their `ExtentSet`s replace with other blocks (a copy-on-write of shared blocks):
    /// shared ones lose this owner (decrements logged after the extent records), others
    /// are freed once the transaction is durable. In one transaction.
    pub(crate) fn log_remapped(&self, m: &mut MetaCore, ino: Ino, recs: Vec<Record>) -> Result<()> {
        let seq = m.txn.seq;
        let datacow = m.is_datacow(ino)?;
        let mut freed = Vec::new();
        for rec in recs {
            let mut old = Vec::new();
            let mut csums = Vec::new();
            if let (
                Record::ExtentSet {
                    object,
                    block,
                    len,
                    phys,
                    target: t,
                    ..
                },
                Some(i),
            ) = (&rec, m.state.get(ino)?)
            {
                let t = *t;
                if datacow
                    && matches!(rec, Record::ExtentSet { state, .. } if state == ExtentState::Written)
                {
                    // The checksums of the bytes written, in the same transaction.
                    csums = self.csum_records(t, *phys, *len);
                }
                // A map the record does not fit is refused when it is logged.
                if let Some(map) = i.objects.get(*object as usize) {
                    for (s, e) in map.range(*block, *len) {
                        let lo = s.max(*block);
                        let hi = (s + e.len).min(block + len);
                        let (was, now) = (e.phys + (lo - s), phys + (lo - block));
                        if lo < hi && (e.target, was) != (t, now) {
                            old.push(Freed {
                                target: e.target,
                                phys: was,
                                len: hi - lo,
                            });
                        }
                    }
                }
            }
            self.inner.log_all(m, vec![rec])?;
            self.inner.log_all(m, csums)?;
            // Each replaced piece's decrements right after the record (`log_released`).
            for f in old {
                let r = self
                    .inner
                    .refs_ok(m.ref_release(&[(f.target, f.phys, f.len)]))?;
                self.inner.log_all(m, r.records)?;
                if datacow {
                    self.inner.log_all(m, csum_clears(&r.freed))?;
                }
                freed.extend(r.freed);
            }
        }
        for (t, phys, len) in freed {
            m.alloc.free_after(t, phys, len, seq);
        }
        Ok(())
    }

    /// Copies the shared block of `map` holding `pos` to a new block on the same target,
    /// changed by `modify`, and maps it in place of the shared one (a partial-block write
    /// that bypasses the cache: truncate's EOF block, the edges of a direct write). The
    /// caller holds the inode lock exclusively.
    pub(crate) fn cow_block(
        &self,
        ino: Ino,
        map: &Iomap<DevAddr>,
        pos: u64,
        modify: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        self.cow_block_sized(ino, map, pos, modify, None)
    }

    /// [`Fs::cow_block`], growing the file's size to `grow_to` in the same transaction
    /// if that passes it (a datacow file's direct write merged into its last block). A
    /// datacow file's block is verified against its checksum when read, and the copy's
    /// checksum logged with its remap.
    pub(crate) fn cow_block_sized(
        &self,
        ino: Ino,
        map: &Iomap<DevAddr>,
        pos: u64,
        modify: impl FnOnce(&mut [u8]),
        grow_to: Option<u64>,
    ) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let skip = bs.block_of(bs.round_down(pos) - map.offset);
        let t = map.addr.target;
        let target = self.inner.targets[t.index()].as_ref();
        let old = map.addr.phys + skip;
        let mut block = target.read_sync(bs.to_bytes(old), bs.bytes() as usize)?;
        let datacow = self.inner.meta.lock().is_datacow(ino)?;
        if datacow {
            self.verify_block(ino, bs.round_down(pos), t, old, &block)?;
        }
        modify(&mut block);
        let csum = stripefs_core::csum::BlockCsum::of(&block);
        self.inner.alloc_fault(t)?;
        let (nt, new) = self.alloc_copy_block(t)?;
        let dest = self.inner.targets[nt.index()].as_ref();
        if let Err(e) = dest.write_sync(bs.to_bytes(new), block) {
            self.inner.meta.lock().alloc.free_now(nt, new, 1);
            return Err(e.into());
        }
        self.inner.mark_dirty(nt.index());
        if datacow {
            self.inner.write_csums.put(nt, new, csum);
        }
        let r = self.log_cow_block(ino, map, skip, (nt, new), grow_to);
        if r.is_err() && datacow {
            // Never logged: forget it (decision 91).
            self.inner.write_csums.forget(nt, new, 1);
        }
        r
    }

    /// The records of a copied block (`cow_block_sized`): the copy mapped in place of the
    /// old block, the size grown to `grow_to` if that passes it.
    fn log_cow_block(
        &self,
        ino: Ino,
        map: &Iomap<DevAddr>,
        skip: u64,
        (nt, new): (stripefs_core::TargetId, u64),
        grow_to: Option<u64>,
    ) -> Result<()> {
        let mut m = self.inner.meta.lock();
        let rec = Record::ExtentSet {
            ino,
            object: map.addr.object,
            block: map.addr.obj_block + skip,
            len: 1,
            phys: new,
            state: ExtentState::Written,
            target: nt,
        };
        let mut recs = vec![rec];
        if let Some(end) = grow_to {
            let i = m.state.get(ino)?.ok_or(FsError::Stale(ino.0))?;
            if end > i.attrs.size {
                let mut a = i.attrs.clone();
                a.size = end;
                if m.size_of(ino).is_some_and(|s| s <= end) {
                    m.set_isize(ino, None);
                }
                recs.push(Record::InodeSet(a));
            }
        }
        self.log_remapped(&mut m, ino, recs)
    }
}

impl Fs {
    /// One block on `t` for a copy (`cow_block`): out of free space, or, when the only free
    /// blocks are busy (freed by a transaction not yet durable), after a commit, retried
    /// once (decision 90).
    /// One free block for a copy of a block of `near`: on `near` unless it is read-only
    /// (`placement.rs`). Returns where.
    fn alloc_copy_block(
        &self,
        near: stripefs_core::TargetId,
    ) -> Result<(stripefs_core::TargetId, u64)> {
        let take = || -> Result<Option<(stripefs_core::TargetId, u64)>> {
            let mut m = self.inner.meta.lock();
            let t = self.inner.place(near)?;
            Ok(m.alloc
                .alloc_from(t, None, 1, Draw::Data)
                .map(|(p, _)| (t, p)))
        };
        self.take_or_commit(take, || {
            format!("no room for a copy of a block of target {near}")
        })
    }
}

/// The `CsumClear` records of freed blocks of a datacow file: a block loses its
/// checksums in the transaction that frees it.
pub(crate) fn csum_clears(freed: &[stripefs_core::refcount::PhysPiece]) -> Vec<Record> {
    freed
        .iter()
        .map(|&(target, phys, len)| Record::CsumClear { target, phys, len })
        .collect()
}

//! Unbuffered file I/O (the direct path), truncate, preallocation, punch, zero and sync.
//!
//! The direct paths write back and invalidate overlapping cache first (and invalidate again
//! after a write), so cached and direct I/O stay coherent. Both walk the range through the
//! mapping contract, submit one I/O per mapping to
//! its target, and wait once for the whole request ("submit every stripe, then wait once").
//! Writes never expose stale blocks: new and unwritten blocks are written whole, zero-filled
//! around the data, and become visible (extent recorded written, size grown) only after
//! every piece completed; the journal commit then flushes the data before the record.
//! A write that fails in any piece returns the error, records nothing, and frees what it
//! allocated: the range's content is then undefined, as for write(2).

use stripefs_core::extent::ExtentState;
use stripefs_core::inode::Timespec;
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino, TargetId};
use stripefs_iomap::{iterate, Iomap, IomapFlags, IomapKind, IomapOp, IterError};
use stripefs_target::{Batch, IoDone, IoOp};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::journal::CommitMode;
use crate::mapping::{DevAddr, FileMapper};
use crate::namespace::inode;
use crate::types::FallocMode;

/// Largest file size (bytes): offsets stay far from u64 overflow in every unit.
pub const MAX_FILE_BYTES: u64 = 1 << 60;

/// A written range to record once its I/O completed.
#[derive(Debug, Clone, Copy)]
struct IoEnd {
    object: u32,
    obj_block: u64,
    blocks: u64,
    phys: u64,
    /// True when the blocks were new or unwritten and must be recorded written.
    convert: bool,
    target: TargetId,
}

fn iter_err(e: IterError<FsError>) -> FsError {
    match e {
        IterError::Failed { error, .. } => error,
        IterError::Contract(msg) => CoreError::corrupted("mapping contract", msg).into(),
    }
}

fn first_error(done: &[IoDone]) -> Result<()> {
    for d in done {
        d.result.clone()?;
    }
    Ok(())
}

impl Fs {
    /// Reads up to `buf.len()` bytes at `off` bypassing the cache (after writing back
    /// any dirty cache over the range); returns the bytes read (0 at or past EOF).
    ///
    /// # Errors
    /// `IsDir`, `Invalid` (not a file), `Stale`, target I/O errors, `Poisoned`.
    pub fn read_direct(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.inner.check()?;
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        let mapper = FileMapper::new(self, ino)?;
        self.writeback_file(ino, stripefs_iomap::WbWait::Busy)?;
        let size = mapper.size();
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - off) as usize;
        let batch = Batch::new();
        let mut copies = Vec::new();
        iterate(&mapper, off, n as u64, IomapOp::Read, |map, pos, len| {
            let dst = (pos - off) as usize..(pos - off + len) as usize;
            match map.kind {
                IomapKind::Mapped => {
                    let (slot, skip) = self.submit_read(&batch, map, pos, len);
                    copies.push((slot, skip, dst));
                }
                IomapKind::Hole
                | IomapKind::Unwritten
                | IomapKind::Delalloc
                | IomapKind::Shared => buf[dst].fill(0),
            }
            Ok(len)
        })
        .map_err(iter_err)?;
        let done = batch.wait();
        let res = first_error(&done);
        if res.is_ok() {
            for (slot, skip, dst) in copies {
                let src = &done[slot].bufs[0];
                buf[dst.clone()].copy_from_slice(&src[skip..skip + dst.len()]);
            }
        }
        self.inner
            .bufs
            .put_all(done.into_iter().flat_map(|d| d.bufs));
        res.map(|()| n)
    }

    fn submit_read(
        &self,
        batch: &Batch,
        map: &Iomap<DevAddr>,
        pos: u64,
        len: u64,
    ) -> (usize, usize) {
        let bs = self.inner.geo.block_size;
        let first = bs.round_down(pos);
        let last = bs.round_up(pos + len);
        let offset = bs.to_bytes(map.addr.phys) + (first - map.offset);
        let target = self.inner.targets[map.addr.target.index()].as_ref();
        let slot = batch.submit(
            target,
            IoOp::Read {
                offset,
                // The device fills the whole buffer: a recycled one needs no clearing.
                bufs: vec![self.inner.bufs.get((last - first) as usize)],
            },
        );
        (slot, (pos - first) as usize)
    }

    /// Writes `data` at `off` bypassing the cache; returns `data.len()` (all or error).
    /// Dirty cache over the range is written back first and the range invalidated before
    /// and after, so buffered readers see the new data.
    ///
    /// # Errors
    /// `FileTooBig`, `NoSpace`, `IsDir`, `Invalid`, `Stale`, target I/O errors, `Poisoned`.
    pub fn write_direct(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.inner.check()?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        let unit = u64::from(self.inner.geo.stripe_unit);
        self.reserve_metadata(64 * (2 + data.len() as u64 / unit))?;
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        let mapper = FileMapper::new(self, ino)?;
        let size = mapper.size();
        if off > size {
            // EOF zeroing first (I-004-7), also of bytes a crash may have left past EOF on
            // disk; it may dirty cache over the range about to be written directly (a whole
            // folio with folio tracking), so coherence comes after it.
            let fc = self.inner.cache.file(ino.0);
            stripefs_iomap::zero_range(
                &self.inner.cache,
                &mapper,
                &fc,
                size,
                off - size,
                self.inner.opts.eof_zeroing,
            )?;
            self.writeback_file(ino, stripefs_iomap::WbWait::Busy)?;
        }
        // Dirty cache over the range goes to disk and the range leaves the cache, so the
        // direct write is neither overwritten by later writeback nor hidden from readers.
        self.coherent_range(ino, off, data.len() as u64)?;
        let batch = Batch::new();
        let mut ioends = Vec::new();
        let walked = iterate(
            &mapper,
            off,
            data.len() as u64,
            IomapOp::Write,
            |map, pos, len| {
                let src = &data[(pos - off) as usize..(pos - off + len) as usize];
                ioends.push(self.submit_write(&batch, map, pos, src)?);
                Ok(len)
            },
        );
        // Wait even after an error: no I/O of this call may outlive it (I-003-1).
        let done = batch.wait();
        let res = walked.map_err(iter_err).and_then(|_| first_error(&done));
        self.inner
            .bufs
            .put_all(done.into_iter().flat_map(|d| d.bufs));
        if let Err(e) = res {
            mapper.release_new();
            return Err(e);
        }
        self.complete_write(ino, end, &ioends)?;
        self.coherent_range(ino, off, data.len() as u64)?;
        Ok(data.len())
    }

    /// Writes back dirty cache over `[off, off + len)` and drops the cached range.
    fn coherent_range(&self, ino: Ino, off: u64, len: u64) -> Result<()> {
        let Some(fc) = self.inner.cache.existing(ino.0) else {
            return Ok(());
        };
        let mapper = FileMapper::new(self, ino)?;
        let fb = u64::from(self.inner.cache.config().folio_bytes);
        let (a, b) = (off / fb * fb, (off + len).div_ceil(fb) * fb);
        stripefs_iomap::writeback(
            &self.inner.cache,
            &mapper,
            &fc,
            a,
            b,
            stripefs_iomap::WbWait::Busy,
        )?;
        stripefs_iomap::invalidate_range(&self.inner.cache, &fc, a, b);
        Ok(())
    }

    /// Builds and submits the whole-block write for one mapping piece.
    fn submit_write(
        &self,
        batch: &Batch,
        map: &Iomap<DevAddr>,
        pos: u64,
        data: &[u8],
    ) -> Result<IoEnd> {
        let bs = self.inner.geo.block_size;
        let first = bs.round_down(pos);
        let last = bs.round_up(pos + data.len() as u64);
        let skip_blocks = bs.block_of(first - map.offset);
        let offset = bs.to_bytes(map.addr.phys + skip_blocks);
        let target = self.inner.targets[map.addr.target.index()].as_ref();
        // A recycled buffer: every byte is set below (data, read-back blocks or zeros).
        let mut buf = self.inner.bufs.get((last - first) as usize);
        let head = (pos - first) as usize;
        let tail = head + data.len();
        let written = map.kind == IomapKind::Mapped && !map.flags.contains(IomapFlags::NEW);
        if !written {
            // New and unwritten blocks are written whole: zeros around the data, never stale.
            buf[..head].fill(0);
            buf[tail..].fill(0);
        } else {
            // Read-modify-write of the partial first and last blocks.
            let blk = bs.bytes() as usize;
            if head != 0 {
                buf[..blk].copy_from_slice(&target.read_sync(offset, blk)?);
            }
            let tail_at = buf.len() - blk;
            if !(pos + data.len() as u64).is_multiple_of(bs.bytes_u64())
                && (tail_at != 0 || head == 0)
            {
                buf[tail_at..].copy_from_slice(&target.read_sync(offset + tail_at as u64, blk)?);
            }
        }
        buf[head..tail].copy_from_slice(data);
        self.inner
            .data_bytes_written
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        batch.submit(
            target,
            IoOp::Write {
                offset,
                bufs: vec![buf],
            },
        );
        Ok(IoEnd {
            object: map.addr.object,
            obj_block: map.addr.obj_block + skip_blocks,
            blocks: bs.block_of(last - first),
            phys: map.addr.phys + skip_blocks,
            convert: !written,
            target: map.addr.target,
        })
    }

    /// Makes a completed write visible: extents recorded written, size and times updated.
    fn complete_write(&self, ino: Ino, end: u64, ioends: &[IoEnd]) -> Result<()> {
        for e in ioends {
            self.inner.mark_dirty(e.target.index());
        }
        let mut m = self.inner.meta.lock();
        let mut recs: Vec<Record> = ioends
            .iter()
            .filter(|e| e.convert)
            .map(|e| Record::ExtentSet {
                ino,
                object: e.object,
                block: e.obj_block,
                len: e.blocks,
                phys: e.phys,
                state: ExtentState::Written,
                refcount: 1,
            })
            .collect();
        let mut a = inode(&m, ino)?.attrs.clone();
        let now = Timespec::now();
        a.mtime = now;
        a.ctime = now;
        if end > a.size {
            a.size = end;
            m.mark_data(ino);
            if m.isize.get(&ino).is_some_and(|&s| s <= end) {
                m.isize.remove(&ino);
            }
        }
        recs.push(Record::InodeSet(a));
        self.inner.log_all(&mut m, recs)
    }

    /// Sets the file size: truncating frees blocks past the new end and zeroes the rest of
    /// the new last block on disk; extending leaves a hole.
    ///
    /// # Errors
    /// `FileTooBig`, `IsDir`, `Invalid`, `Stale`, target I/O errors, `Poisoned`.
    pub fn set_len(&self, ino: Ino, size: u64) -> Result<()> {
        self.inner.check()?;
        if size > MAX_FILE_BYTES {
            return Err(FsError::FileTooBig);
        }
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        let mapper = FileMapper::new(self, ino)?;
        let old = mapper.size();
        let bs = self.inner.geo.block_size;
        if size < old {
            // Cache first: nothing past the new EOF survives, and the rest of its block
            // reads zero if the file grows again; then the same on disk.
            self.discard_cache_from(ino, bs.round_up(size));
            if let Some(fc) = self.inner.cache.existing(ino.0) {
                stripefs_iomap::zero_cached(&self.inner.cache, &fc, size, bs.round_up(size));
            }
            self.zero_block_tail(&mapper, size)?;
        } else if size > old {
            {
                // EOF zeroing, also of bytes a crash may have left past EOF on disk.
                let fc = self.inner.cache.file(ino.0);
                stripefs_iomap::zero_range(
                    &self.inner.cache,
                    &mapper,
                    &fc,
                    old,
                    size - old,
                    self.inner.opts.eof_zeroing,
                )?;
            }
        }
        let mut m = self.inner.meta.lock();
        let i = inode(&m, ino)?.clone();
        let mut recs = Vec::new();
        if size < old {
            for object in 0..i.attrs.layout.count {
                let keep = bs.blocks_for(i.attrs.layout.object_len(object, size));
                self.clear_object_range(&mut m, ino, object, (keep, u64::MAX), None, &mut recs)?;
            }
        }
        let mut a = i.attrs;
        let now = Timespec::now();
        a.size = size;
        a.mtime = now;
        a.ctime = now;
        recs.push(Record::InodeSet(a));
        m.isize.remove(&ino);
        m.mark_data(ino);
        self.inner.log_all(&mut m, recs)
    }

    /// Zeroes `[size, end of its block)` on disk if that block holds written data, keeping
    /// the invariant that bytes past EOF in the EOF block read as zero.
    fn zero_block_tail(&self, mapper: &FileMapper<'_>, size: u64) -> Result<()> {
        let bs = self.inner.geo.block_size;
        if bs.offset_in_block(size) == 0 {
            return Ok(());
        }
        let map = mapper.begin_report(size)?;
        if map.kind != IomapKind::Mapped {
            return Ok(());
        }
        let first = bs.round_down(size);
        let offset = bs.to_bytes(map.addr.phys) + (first - map.offset);
        let target = self.inner.targets[map.addr.target.index()].as_ref();
        let mut block = target.read_sync(offset, bs.bytes() as usize)?;
        block[bs.offset_in_block(size) as usize..].fill(0);
        target.write_sync(offset, block)?;
        self.inner.mark_dirty(map.addr.target.index());
        Ok(())
    }

    /// `fallocate`: preallocate (`Allocate`, `KeepSize`: holes get unwritten extents,
    /// which read as zeros), `PunchHole` (deallocate; partial blocks zeroed), `ZeroRange`
    /// (partial blocks zeroed through the cache, whole blocks become unwritten). Collapse,
    /// insert and unshare are not implemented and return `NotSupported` for every range.
    ///
    /// # Errors
    /// `NotSupported`, `Invalid` (zero length), `NoSpace`, `FileTooBig`, `Stale`.
    pub fn fallocate(&self, ino: Ino, mode: FallocMode, off: u64, len: u64) -> Result<()> {
        self.inner.check()?;
        if matches!(
            mode,
            FallocMode::CollapseRange | FallocMode::InsertRange | FallocMode::UnshareRange
        ) {
            return Err(FsError::NotSupported(format!(
                "fallocate mode {mode:?} is not implemented"
            )));
        }
        if len == 0 {
            return Err(FsError::invalid("fallocate length 0"));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        let unit = u64::from(self.inner.geo.stripe_unit);
        self.reserve_metadata(64 * (2 + len / unit))?;
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        let mapper = FileMapper::new(self, ino)?;
        let size = mapper.size();
        match mode {
            FallocMode::Allocate | FallocMode::KeepSize => {
                self.allocate_unwritten(&mapper, off, len)?;
                self.falloc_size(&mapper, end, mode == FallocMode::KeepSize)
            }
            FallocMode::PunchHole => {
                let (a, b) = self.zero_partial_blocks(&mapper, off, end, size)?;
                if a < b {
                    self.drop_blocks(&mapper, a, b, BlockFate::Free)?;
                }
                self.falloc_size(&mapper, size, true)
            }
            FallocMode::ZeroRange { keep_size } => {
                if self.inner.opts.force_zero_via_cache {
                    let fc = self.inner.cache.file(ino.0);
                    if off < size {
                        stripefs_iomap::zero_range(
                            &self.inner.cache,
                            &mapper,
                            &fc,
                            off,
                            end.min(size) - off,
                            self.inner.opts.eof_zeroing,
                        )?;
                    }
                } else {
                    let (a, b) = self.zero_partial_blocks(&mapper, off, end, size)?;
                    if a < b {
                        self.drop_blocks(&mapper, a, b, BlockFate::Unwritten)?;
                        self.allocate_unwritten(&mapper, a, b - a)?;
                    }
                }
                self.falloc_size(&mapper, end, keep_size)
            }
            FallocMode::CollapseRange | FallocMode::InsertRange | FallocMode::UnshareRange => {
                unreachable!("refused above")
            }
        }
    }

    /// Gives holes in `[off, off + len)` unwritten extents.
    fn allocate_unwritten(&self, mapper: &FileMapper<'_>, off: u64, len: u64) -> Result<()> {
        let ino = mapper.ino;
        let mut fresh = Vec::new();
        let walked = iterate(mapper, off, len, IomapOp::Write, |map, _pos, n| {
            if map.flags.contains(IomapFlags::NEW) {
                fresh.push((map.addr, map.length));
            }
            Ok(n)
        });
        if let Err(e) = walked {
            mapper.release_new();
            return Err(iter_err(e));
        }
        mapper.keep_new();
        let bs = self.inner.geo.block_size;
        let recs: Vec<Record> = fresh
            .iter()
            .map(|(a, bytes)| Record::ExtentSet {
                ino,
                object: a.object,
                block: a.obj_block,
                len: bs.block_of(*bytes),
                phys: a.phys,
                state: ExtentState::Unwritten,
                refcount: 1,
            })
            .collect();
        let mut m = self.inner.meta.lock();
        self.inner.log_all(&mut m, recs)
    }

    /// Updates size and times after a fallocate that ends at `end`: with `keep`, the size
    /// stays and preallocation past EOF marks the file (its preallocation is never
    /// trimmed); without, the size grows to `end`.
    fn falloc_size(&self, mapper: &FileMapper<'_>, end: u64, keep: bool) -> Result<()> {
        let ino = mapper.ino;
        let old = mapper.size();
        if !keep && end > old {
            // EOF zeroing: whatever the cache holds past the old EOF must read zero.
            {
                // EOF zeroing, also of bytes a crash may have left past EOF on disk.
                let fc = self.inner.cache.file(ino.0);
                stripefs_iomap::zero_range(
                    &self.inner.cache,
                    mapper,
                    &fc,
                    old,
                    end - old,
                    self.inner.opts.eof_zeroing,
                )?;
            }
        }
        let mut m = self.inner.meta.lock();
        let size = m.size_of(ino).ok_or(FsError::Stale(ino.0))?;
        let mut a = inode(&m, ino)?.attrs.clone();
        let now = Timespec::now();
        a.mtime = now;
        a.ctime = now;
        if keep && end > size {
            a.flags |= crate::buffered::FLAG_PREALLOC;
        }
        if !keep && end > size {
            a.size = end;
            m.isize.remove(&ino);
            m.mark_data(ino);
        }
        self.inner.log_all(&mut m, vec![Record::InodeSet(a)])
    }

    /// Zeroes the partial blocks at both ends of `[off, end)` (inside EOF) through the
    /// cache; returns the whole-block range `[a, b)` in between.
    fn zero_partial_blocks(
        &self,
        mapper: &FileMapper<'_>,
        off: u64,
        end: u64,
        size: u64,
    ) -> Result<(u64, u64)> {
        let bs = self.inner.geo.block_size;
        let (a, b) = (bs.round_up(off), bs.round_down(end));
        let fc = self.inner.cache.file(mapper.ino.0);
        let mode = self.inner.opts.eof_zeroing;
        let zero = |s: u64, e: u64| -> Result<()> {
            let e = e.min(size);
            if s < e {
                stripefs_iomap::zero_range(&self.inner.cache, mapper, &fc, s, e - s, mode)?;
            }
            Ok(())
        };
        if a >= b {
            zero(off, end)?;
            return Ok((a, a));
        }
        zero(off, a)?;
        zero(b, end)?;
        Ok((a, b))
    }

    /// Discards cache and delayed allocations over whole blocks `[a, b)` and frees their
    /// extents or turns written ones unwritten.
    fn drop_blocks(&self, mapper: &FileMapper<'_>, a: u64, b: u64, fate: BlockFate) -> Result<()> {
        let ino = mapper.ino;
        if let Some(fc) = self.inner.cache.existing(ino.0) {
            stripefs_iomap::invalidate_range(&self.inner.cache, &fc, a, b);
        }
        let bs = self.inner.geo.block_size;
        let l = mapper.layout;
        let n = self.inner.geo.target_count();
        let mut m = self.inner.meta.lock();
        let mut recs = Vec::new();
        let mut pos = a;
        while pos < b {
            let p = l.piece(pos, b - pos);
            pos += p.len;
            let (object, block, blocks) = (p.object, bs.block_of(p.obj_off), bs.block_of(p.len));
            let removed = m.delalloc_mut(ino, object, l.count).remove(block, blocks);
            m.alloc.unreserve(l.target_of(object, n), removed);
            match fate {
                BlockFate::Free => {
                    self.clear_object_range(&mut m, ino, object, (block, blocks), None, &mut recs)?
                }
                BlockFate::Unwritten => {
                    recs.extend(self.unwritten_records(&m, ino, object, block, blocks)?)
                }
            }
        }
        self.inner.log_all(&mut m, recs)
    }

    /// Records turning the written extents of object blocks `[block, block + blocks)`
    /// unwritten (same blocks; reads become zeros).
    fn unwritten_records(
        &self,
        m: &crate::inner::MetaCore,
        ino: Ino,
        object: u32,
        block: u64,
        blocks: u64,
    ) -> Result<Vec<Record>> {
        let i = inode(m, ino)?;
        Ok(i.objects[object as usize]
            .range(block, blocks)
            .filter(|(_, e)| e.state == ExtentState::Written)
            .map(|(s, e)| {
                let from = s.max(block);
                let len = (s + e.len).min(block + blocks) - from;
                Record::ExtentSet {
                    ino,
                    object,
                    block: from,
                    len,
                    phys: e.phys + (from - s),
                    state: ExtentState::Unwritten,
                    refcount: e.refcount,
                }
            })
            .collect())
    }

    /// Makes the file's data and metadata durable (`fsync`), or its data and the metadata
    /// needed to read it (`fdatasync`): writeback of its dirty cache, one data flush and,
    /// if needed, one journal commit. A writeback error that inode-based callers have not
    /// been told about is reported (once).
    ///
    /// # Errors
    /// `WritebackFailed`, I/O errors (the file system is then poisoned) or `Poisoned`.
    pub fn fsync(&self, ino: Ino, datasync: bool) -> Result<()> {
        let mut seen = self.inner.anon_seen.lock().get(&ino).copied().unwrap_or(0);
        let r = self.sync_file(ino, datasync, &mut seen);
        self.inner.anon_seen.lock().insert(ino, seen);
        r
    }

    /// Writes back, reports an unseen writeback error, and commits.
    pub(crate) fn sync_file(&self, ino: Ino, datasync: bool, seen: &mut u64) -> Result<()> {
        self.inner.check()?;
        let wb = self.writeback_file(ino, stripefs_iomap::WbWait::Busy);
        let need = {
            let m = self.inner.meta.lock();
            inode(&m, ino)?;
            if datasync {
                m.data_seq.get(&ino).copied()
            } else {
                m.meta_seq.get(&ino).copied()
            }
        };
        match need {
            Some(seq) if seq > self.inner.journal.committed() => {
                self.inner
                    .journal
                    .commit(&self.inner, seq, CommitMode::Append)?
            }
            _ => self
                .inner
                .flush_dirty()
                .inspect_err(|e| self.inner.poison(&format!("data flush failed: {e}")))?,
        }
        let unseen = self
            .inner
            .cache
            .existing(ino.0)
            .and_then(|fc| fc.check_error(seen));
        if let Some(errno) = unseen {
            return Err(FsError::WritebackFailed(errno));
        }
        // An error this call's own writeback hit is in the error sequence and was reported
        // just above; anything else (mapping) is returned as is.
        match wb {
            Err(FsError::Io(_)) => Ok(()),
            other => other,
        }
    }
}

/// What happens to whole blocks dropped from a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockFate {
    /// Deallocate (punch hole).
    Free,
    /// Keep allocated, read as zeros (zero range).
    Unwritten,
}

impl FileMapper<'_> {
    /// The mapping at `pos` without allocating.
    pub(crate) fn begin_report(&self, pos: u64) -> Result<Iomap<DevAddr>> {
        use stripefs_iomap::IomapOps;
        let map = self.begin(pos, 1, IomapOp::Report)?;
        self.end(&map, pos, 0, IomapOp::Report)?;
        Ok(map)
    }
}

/// One mapped range of a file, for `bmap`/`fiemap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedRange {
    /// File byte offset.
    pub file_off: u64,
    /// Bytes.
    pub len: u64,
    /// Target holding the range.
    pub target: u32,
    /// Byte offset on the target.
    pub target_off: u64,
    /// False for unwritten (preallocated) ranges.
    pub written: bool,
}

impl Fs {
    /// The file's allocated ranges in file order (adjacent ranges contiguous on the same
    /// target and in the same state merged).
    ///
    /// # Errors
    /// `Stale`; `IsDir`/`Invalid` for non-files.
    pub fn extents(&self, ino: Ino) -> Result<Vec<MappedRange>> {
        self.inner.check()?;
        FileMapper::new(self, ino)?;
        let m = self.inner.meta.lock();
        let i = inode(&m, ino)?;
        let bs = self.inner.geo.block_size;
        let l = i.attrs.layout;
        let unit = u64::from(l.unit_bytes);
        let mut out = Vec::new();
        for (object, map) in i.objects.iter().enumerate() {
            let target = l.target_of(object as u32, self.inner.geo.target_count()).0;
            for (block, e) in map.iter() {
                let (mut obj_off, end) = (bs.to_bytes(block), bs.to_bytes(block + e.len));
                while obj_off < end {
                    let len = (unit - obj_off % unit).min(end - obj_off);
                    out.push(MappedRange {
                        file_off: l.file_off(object as u32, obj_off),
                        len,
                        target,
                        target_off: bs.to_bytes(e.phys) + (obj_off - bs.to_bytes(block)),
                        written: e.state == ExtentState::Written,
                    });
                    obj_off += len;
                }
            }
        }
        out.sort_by_key(|r| r.file_off);
        let mut merged: Vec<MappedRange> = Vec::with_capacity(out.len());
        for r in out {
            match merged.last_mut() {
                Some(p)
                    if p.file_off + p.len == r.file_off
                        && p.target == r.target
                        && p.target_off + p.len == r.target_off
                        && p.written == r.written =>
                {
                    p.len += r.len
                }
                _ => merged.push(r),
            }
        }
        Ok(merged)
    }
}

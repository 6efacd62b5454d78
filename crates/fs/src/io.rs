//! Size changes, preallocation, punch, zero range, sync and extent listing. (Direct I/O
//! is `direct.rs` over the generic engine; buffered I/O is `buffered.rs`.)

use std::time::{Duration, Instant};

use stripefs_core::extent::ExtentState;
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino};
use stripefs_iomap::{iterate, Iomap, IomapFlags, IomapOp};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::journal::CommitMode;
use crate::mapping::{piece_record, DevAddr, FileMapper};
use crate::namespace::{data_changed, inode};
use crate::types::{FallocMode, SyncScope};

/// Largest file size (bytes): offsets stay far from u64 overflow in every unit.
pub const MAX_FILE_BYTES: u64 = 1 << 60;

impl Fs {
    /// Sets the file size: truncating frees blocks past the new end and zeroes the rest of
    /// the new last block on disk; extending leaves a hole.
    ///
    /// # Errors
    /// `FileTooBig`, `IsDir`, `Invalid`, `Stale`, target I/O errors, `Poisoned`.
    pub fn set_len(&self, ino: Ino, size: u64) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        if size > MAX_FILE_BYTES {
            return Err(FsError::FileTooBig);
        }
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        lock.dio.drain();
        let mapper = FileMapper::new(self, ino)?;
        let old = mapper.size();
        let bs = self.inner.geo.block_size;
        if size < old {
            // Cache first: nothing past the new EOF survives, and the rest of its block
            // reads zero if the file grows again; then the same on disk.
            // The tail of the new EOF block: in cache and on disk, after any writeback
            // write of the block in flight (taken at the old size) has landed.
            self.discard_cache_from(ino, bs.round_up(size));
            match self.inner.cache.existing(ino.0) {
                Some(fc) => {
                    stripefs_iomap::zero_tail_settled(&fc, size, bs.round_up(size), || {
                        self.zero_block_tail(&mapper, size)
                    })?
                }
                None => self.zero_block_tail(&mapper, size)?,
            }
        } else {
            self.zero_eof_to(&mapper, size)?;
        }
        let mut m = self.inner.meta.lock();
        let i = inode(&m, ino)?.clone();
        let mut recs = Vec::new();
        if size < old {
            for object in 0..i.attrs.layout.count {
                let keep = bs.blocks_for(i.attrs.layout.object_len(object, size));
                self.clear_object_range(&mut m, ino, object, (keep, u64::MAX), None)?;
            }
        }
        let mut a = data_changed(&m, ino)?;
        a.size = size;
        recs.push(Record::InodeSet(a));
        m.set_isize(ino, None);
        m.mark_data(ino);
        self.inner.log_all(&mut m, recs)
    }

    /// Zeroes `[size, end of its block)` on disk if that block holds written data, keeping
    /// the invariant that bytes past EOF in the EOF block read as zero; in place only if
    /// the block is not shared and its target admits the write.
    fn zero_block_tail(&self, mapper: &FileMapper<'_>, size: u64) -> Result<()> {
        let bs = self.inner.geo.block_size;
        if bs.offset_in_block(size) == 0 {
            return Ok(());
        }
        let map = mapper.begin_report(size)?;
        if !map.is_written() {
            return Ok(());
        }
        let shared = map.flags.contains(stripefs_iomap::IomapFlags::SHARED);
        if shared || !mapper.in_place.enter(map.addr.target) {
            // Never in place on a shared block, nor on a read-only target (I-001-3):
            // zeroed in a copy of its own.
            let at = bs.offset_in_block(size) as usize;
            return self.cow_block(mapper.ino, &map, size, |b| b[at..].fill(0));
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
        let _change = self.begin_change()?;
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
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        lock.dio.drain();
        let mapper = FileMapper::new(self, ino)?;
        let size = mapper.size();
        match mode {
            FallocMode::Allocate | FallocMode::KeepSize => {
                self.allocate_unwritten(&mapper, off, len)?;
                self.falloc_size(
                    &mapper,
                    end,
                    if mode == FallocMode::KeepSize {
                        FallocSize::Keep
                    } else {
                        FallocSize::Extend
                    },
                )
            }
            FallocMode::PunchHole => {
                let (a, b) = self.zero_partial_blocks(&mapper, off, end, size)?;
                if a < b {
                    self.drop_blocks(&mapper, a, b, BlockFate::Free)?;
                }
                self.falloc_size(&mapper, size, FallocSize::Keep)
            }
            FallocMode::ZeroRange { keep_size } => {
                if self.inner.opts.force_zero_via_cache {
                    let fc = self.inner.file_cache(ino);
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
                    let bs = self.inner.geo.block_size;
                    let (a, b) = (bs.round_up(off), bs.round_down(end));
                    if a < b {
                        // Shared blocks in the range are let go and replaced by blocks
                        // of the file's own: they need space too, checked before
                        // anything changes.
                        self.check_hole_space(&mapper, a, b, SharedBlocks::Replaced)?;
                    }
                    self.zero_partial_blocks(&mapper, off, end, size)?;
                    if a < b {
                        self.drop_blocks(&mapper, a, b, BlockFate::Unwritten)?;
                        self.allocate_unwritten(&mapper, a, b - a)?;
                    }
                }
                self.falloc_size(
                    &mapper,
                    end,
                    if keep_size {
                        FallocSize::Keep
                    } else {
                        FallocSize::Extend
                    },
                )
            }
            FallocMode::CollapseRange | FallocMode::InsertRange | FallocMode::UnshareRange => {
                unreachable!("refused above")
            }
        }
    }

    /// Gives holes in `[off, off + len)` unwritten extents; on `ENOSPC` with freed blocks
    /// waiting for a commit, commits and tries once more.
    fn allocate_unwritten(&self, mapper: &FileMapper<'_>, off: u64, len: u64) -> Result<()> {
        let bs = self.inner.geo.block_size;
        self.check_hole_space(
            mapper,
            bs.round_down(off),
            bs.round_up(off + len),
            SharedBlocks::Kept,
        )?;
        match self.try_allocate_unwritten(mapper, off, len) {
            Err(FsError::NoSpace(e)) => {
                if self.commit_for_space()? {
                    self.try_allocate_unwritten(mapper, off, len)
                } else {
                    Err(FsError::NoSpace(e))
                }
            }
            r => r,
        }
    }

    /// `ENOSPC` at once, before anything changes, if giving every hole of whole blocks
    /// `[a, b)` a block would need more than some target has free (busy blocks included:
    /// a commit frees them). Delayed allocations count as filled: `fallocate` leaves them,
    /// and zero range returns their reservation before allocating in their place. With
    /// [`SharedBlocks::Replaced`] (zero range) written blocks other files share count as
    /// holes: they are let go and given blocks of the file's own. Cost: objects x extents
    /// in the range, so a huge sparse range fails fast instead of allocating everything
    /// and giving it back.
    fn check_hole_space(
        &self,
        mapper: &FileMapper<'_>,
        a: u64,
        b: u64,
        shared: SharedBlocks,
    ) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let l = mapper.layout;
        let n = self.inner.target_count();
        let m = self.inner.meta.lock();
        let i = inode(&m, mapper.ino)?;
        let mut need = vec![0u64; n as usize];
        for object in 0..l.count {
            let b0 = bs.block_of(l.object_len(object, a));
            let b1 = bs.block_of(l.object_len(object, b));
            if b0 >= b1 {
                continue;
            }
            let t = self.inner.place(l.target_of(object, n))?;
            let mapped: u64 = i.objects[object as usize]
                .range(b0, b1 - b0)
                .map(|(s, e)| -> Result<u64> {
                    let (from, to) = (s.max(b0), (s + e.len).min(b1));
                    let replaced = match shared {
                        SharedBlocks::Replaced if e.state == ExtentState::Written => self
                            .inner
                            .refs_ok(m.ref_pieces(e.target, e.phys + (from - s), to - from))?
                            .into_iter()
                            .filter(|&(_, _, c)| c >= 2)
                            .map(|(_, len, _)| len)
                            .sum(),
                        _ => 0,
                    };
                    Ok(to - from - replaced)
                })
                .sum::<Result<u64>>()?;
            let delayed = m
                .delalloc_of(mapper.ino, object as usize)
                .map_or(0, |d| d.overlap(b0, b1 - b0));
            // Copy-on-write reservations are delayed allocations over mapped blocks:
            // counted in both, so the holes are at least this many.
            need[t.index()] += (b1 - b0).saturating_sub(mapped + delayed);
        }
        for (t, &want) in need.iter().enumerate() {
            let id = stripefs_core::TargetId(t as u32);
            let free = m.alloc.user_free_blocks(id);
            if want > free {
                return Err(FsError::NoSpace(format!(
                    "fallocate needs {want} blocks on target {t}, which has {free} free"
                )));
            }
        }
        Ok(())
    }

    fn try_allocate_unwritten(&self, mapper: &FileMapper<'_>, off: u64, len: u64) -> Result<()> {
        let ino = mapper.ino;
        let mut fresh = Vec::new();
        let walked = iterate(mapper, off, len, IomapOp::Write, |map, _pos, n| {
            if map.flags.contains(IomapFlags::NEW) {
                fresh.push(*map);
            }
            Ok(n)
        });
        if let Err(e) = walked {
            // Now, not when the mapper is dropped: the caller may retry with it after a
            // commit, and that attempt's commit must not keep these.
            mapper.allocated.release();
            return Err(e.into());
        }
        let bs = self.inner.geo.block_size;
        let recs: Vec<Record> = fresh
            .iter()
            .map(|map| piece_record(bs, ino, map, map.offset, map.length, ExtentState::Unwritten))
            .collect();
        let mut m = self.inner.meta.lock();
        self.inner.log_all(&mut m, recs)?;
        mapper.allocated.commit();
        Ok(())
    }

    /// Updates size and times after a fallocate that ends at `end`: with `Keep`, the size
    /// stays and preallocation past EOF marks the file (its preallocation is never
    /// trimmed); with `Extend`, the size grows to `end`.
    fn falloc_size(&self, mapper: &FileMapper<'_>, end: u64, how: FallocSize) -> Result<()> {
        let ino = mapper.ino;
        let keep = how == FallocSize::Keep;
        if !keep {
            self.zero_eof_to(mapper, end)?;
        }
        let mut m = self.inner.meta.lock();
        let size = m.size_of(ino).ok_or(FsError::Stale(ino.0))?;
        let mut a = data_changed(&m, ino)?;
        if keep && end > size {
            a.flags |= crate::buffered::FLAG_PREALLOC;
        }
        if !keep && end > size {
            a.size = end;
            m.set_isize(ino, None);
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
        let fc = self.inner.file_cache(mapper.ino);
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
        let mut m = self.inner.meta.lock();
        let mut recs = Vec::new();
        // Per object, `[a, b)` is one contiguous object range (every stripe unit between
        // the ends lies wholly inside), so the cost follows the extents, not the size.
        for object in 0..l.count {
            let block = bs.block_of(l.object_len(object, a));
            let blocks = bs.block_of(l.object_len(object, b)) - block;
            if blocks == 0 {
                continue;
            }
            let removed = m.delalloc_mut(ino, object, l.count).remove(block, blocks);
            removed.unreserve(&mut m.alloc);
            match fate {
                BlockFate::Free => {
                    self.clear_object_range(&mut m, ino, object, (block, blocks), None)?
                }
                BlockFate::Unwritten => {
                    let (conv, shared) =
                        self.unwritten_records(&m, ino, object, (block, blocks), mapper.datacow)?;
                    recs.extend(conv);
                    // Shared blocks are not turned unwritten (a later write would land on
                    // them in place): this file lets go of them; the range is a hole. A
                    // datacow file's written blocks likewise (their checksums go with
                    // them: no unwritten block has one).
                    for (b, len) in shared {
                        self.clear_object_range(&mut m, ino, object, (b, len), None)?;
                    }
                }
            }
        }
        self.inner.log_all(&mut m, recs)
    }

    /// Records turning the written extents of object blocks `[block, block + blocks)`
    /// unwritten (same blocks; reads become zeros), and the object ranges over shared
    /// blocks, which are left out.
    fn unwritten_records(
        &self,
        m: &crate::inner::MetaCore,
        ino: Ino,
        object: u32,
        (block, blocks): (u64, u64),
        datacow: bool,
    ) -> Result<(Vec<Record>, Vec<ObjectRange>)> {
        let i = inode(m, ino)?;
        let mut recs = Vec::new();
        let mut shared = Vec::new();
        for (s, e) in i.objects[object as usize].range(block, blocks) {
            if e.state != ExtentState::Written {
                continue;
            }
            let from = s.max(block);
            let len = (s + e.len).min(block + blocks) - from;
            let phys = e.phys + (from - s);
            for (p, l, c) in self.inner.refs_ok(m.ref_pieces(e.target, phys, len))? {
                let at = from + (p - phys);
                if c >= 2 || datacow {
                    shared.push((at, l));
                    continue;
                }
                recs.push(Record::ExtentSet {
                    ino,
                    object,
                    block: at,
                    len: l,
                    phys: p,
                    state: ExtentState::Unwritten,
                    target: e.target,
                });
            }
        }
        Ok((recs, shared))
    }

    /// Makes the file's data and metadata durable (`fsync`), or its data and the metadata
    /// needed to read it (`fdatasync`): writeback of its dirty cache, one data flush and,
    /// if needed, one journal commit. A writeback error that inode-based callers have not
    /// been told about is reported (once).
    ///
    /// # Errors
    /// `WritebackFailed`, I/O errors (the file system is then poisoned) or `Poisoned`.
    pub fn fsync(&self, ino: Ino, scope: SyncScope) -> Result<()> {
        // The in-core inode is pinned meanwhile, so what it has seen is not lost.
        let t0 = Instant::now();
        let io = self.inner.io_lock(ino);
        let mut seen = self.inner.meta.lock().inodes.entry(ino).anon_seen;
        let locked = t0.elapsed();
        if locked >= SLOW_SYNC {
            tracing::debug!(
                ms = locked.as_secs_f64() * 1e3,
                "slow fsync: waiting for the file's I/O lock and the metadata lock"
            );
        }
        let r = self.sync_file(ino, scope, &mut seen);
        self.inner.meta.lock().inodes.entry(ino).anon_seen = seen;
        drop(io);
        r
    }

    /// Writes back, reports an unseen writeback error, and commits.
    pub(crate) fn sync_file(&self, ino: Ino, scope: SyncScope, seen: &mut u64) -> Result<()> {
        let t0 = Instant::now();
        self.inner.check()?;
        let wb = self.writeback_file_for_sync(ino);
        let t_wb = Instant::now();
        let need = {
            let mut m = self.inner.meta.lock();
            inode(&m, ino)?;
            if scope == SyncScope::All {
                self.write_lazy_atimes(&mut m, Some(ino))?;
            }
            // An inode without in-core state gets it at the table's floor: an evicted
            // inode's unflushed change still commits.
            let c = m.inodes.entry(ino);
            let seq = match scope {
                SyncScope::Data => c.data_seq,
                SyncScope::All => c.meta_seq,
            };
            self.inner.sweep_inodes_if_due(&mut m);
            seq
        };
        let t_meta = Instant::now();
        match need {
            seq if seq > self.inner.journal.committed() => {
                self.inner
                    .journal
                    .commit(&self.inner, seq, CommitMode::Append)?
            }
            _ => self
                .inner
                .flush_dirty()
                .inspect_err(|e| self.inner.poison(&format!("data flush failed: {e}")))?,
        }
        report_slow_sync(t0, t_wb, t_meta);
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

/// An `fsync` slower than this logs where its time went (`STRIPEFS_LOG=stripefs::io=debug`);
/// the same bound as a commit's, so a slow `fsync` whose time was its commit finds that
/// commit's phases logged too (`stripefs::journal`).
const SLOW_SYNC: Duration = crate::journal::SLOW_COMMIT;

/// Logs a slow `sync_file`: its check and writeback (from `t0` to `t_wb`), the metadata lock with
/// the lazy times and the inode sweep (to `t_meta`), and the commit or data flush (to now).
fn report_slow_sync(t0: Instant, t_wb: Instant, t_meta: Instant) {
    let now = Instant::now();
    if now - t0 < SLOW_SYNC {
        return;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(
        total_ms = ms(now - t0),
        writeback_ms = ms(t_wb - t0),
        meta_ms = ms(t_meta - t_wb),
        commit_ms = ms(now - t_meta),
        "slow fsync"
    );
}

/// What a fallocate does to the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FallocSize {
    /// The size stays (`FALLOC_FL_KEEP_SIZE`).
    Keep,
    /// The size grows to the end of the range.
    Extend,
}

/// What a space check counts shared blocks in the range as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SharedBlocks {
    /// Allocated: they stay (preallocation leaves them).
    Kept,
    /// Holes: they are let go and replaced by blocks of the file's own (zero range).
    Replaced,
}

/// What happens to whole blocks dropped from a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockFate {
    /// Deallocate (punch hole).
    Free,
    /// Keep allocated, read as zeros (zero range).
    Unwritten,
}

/// Object blocks `(first, count)` of one stripe object.
type ObjectRange = (u64, u64);

impl FileMapper<'_> {
    /// The mapping at `pos` without allocating.
    pub(crate) fn begin_report(&self, pos: u64) -> Result<Iomap<DevAddr>> {
        let mut found = None;
        iterate(self, pos, 1, IomapOp::Report, |map, _, _| {
            found = Some(*map);
            Ok(stripefs_iomap::Step::Done(0))
        })?;
        found.ok_or_else(|| {
            CoreError::corrupted("mapping contract", format!("no mapping at {pos}")).into()
        })
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
            for (block, e) in map.iter() {
                let target = e.target.0;
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

//! Buffered file I/O: the page cache in front of the targets, writeback completion, the
//! background flusher, speculative preallocation, and `SEEK_DATA`/`SEEK_HOLE`.
//!
//! Sizes: the model's inode size is the on-disk size; buffered writes grow an in-core size
//! (the in-core inode's `isize`) and the on-disk size follows at writeback completion, in the same
//! transaction as the extents that hold the data (ordered data, like ext4's `i_disksize`).

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stripefs_core::extent::ExtentState;
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino};
use stripefs_iomap::cache::Flusher;
use stripefs_iomap::{
    self as iomap, CacheIo, FileIo, IoDir, Iomap, IomapFlags, IomapKind, IomapOp, WbEnd, WbOutcome,
    WbWait,
};
use stripefs_target::{Batch, BufPool, IoBuf, IoOp, TargetError};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::inner::FsInner;
use crate::mapping::piece_record;
use crate::mapping::{DevAddr, FileMapper, Settle};
use crate::namespace::{data_times, inode};
use crate::wbgroup::WbBatch;

pub(crate) use stripefs_core::inode::FLAG_PREALLOC;

/// Files smaller than this get no speculative preallocation: likely written once and
/// closed, they would allocate 16 times their size at 4 KiB and give it back at close
/// (as XFS, which skips files below its 64 KiB minimum preallocation; issue 15).
const PREALLOC_MIN_SIZE: u64 = 64 << 10;

/// How long a file must go without writes before the flusher trims its speculative
/// preallocation.
const IDLE_TRIM: Duration = Duration::from_secs(30);

/// Where each writeback batch's last data write runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LastWrite {
    /// Through the target's engine, as every other.
    Engine,
    /// On the calling thread, which waits for the batch next.
    Here,
}

impl FileIo for FileMapper<'_> {
    fn size(&self) -> u64 {
        FileMapper::size(self)
    }

    fn extend_size(&self, end: u64) {
        let mut m = self.fs.inner.meta.lock();
        if m.size_of(self.ino).is_some_and(|s| end > s) {
            m.set_isize(self.ino, Some(end));
        }
    }

    fn submit(
        &self,
        batch: &Batch,
        map: &Iomap<DevAddr>,
        pos: u64,
        dir: IoDir,
        bufs: Vec<IoBuf>,
    ) -> usize {
        let bs = self.fs.inner.geo.block_size;
        let offset = bs.to_bytes(map.addr.phys) + (pos - map.offset);
        let target = self.fs.inner.targets[map.addr.target.index()].as_ref();
        let counter = match dir {
            IoDir::Write => &self.fs.inner.data_bytes_written,
            IoDir::Read => &self.fs.inner.data_bytes_read,
        };
        let bytes: usize = bufs.iter().map(|b| b.len()).sum();
        counter.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        let first = map.addr.phys + bs.block_of(pos - map.offset);
        if self.datacow && dir == IoDir::Write {
            // From the bytes submitted, for the completion's `CsumSet` (`csum.rs`).
            self.fs
                .inner
                .write_csums
                .compute(map.addr.target, first, &bufs, bs.bytes() as usize);
        }
        if self.datacow && dir == IoDir::Read && map.is_written() {
            return self.submit_verified(batch, map, pos, offset, bufs);
        }
        if let (Some(plug), IoDir::Write) = (self.plug(), dir) {
            // A multi-file writeback group: queued, merged and submitted with the group's.
            plug.push(map.addr.target, offset, bufs);
            return 0;
        }
        match (dir, self.held_write()) {
            (IoDir::Write, Some(held)) => {
                // Only the batch's last write runs on this thread (`writeback_submitted`):
                // the one it replaces goes to its engine now, in parallel with the rest.
                let op = IoOp::Write { offset, bufs };
                if let Some((t, prev)) = held.replace(Some((map.addr.target.index(), op))) {
                    batch.submit(self.fs.inner.targets[t].as_ref(), prev);
                }
                // Like a plugged write, its slot is not known yet (writeback ignores it).
                0
            }
            (IoDir::Write, None) => batch.submit(target, IoOp::Write { offset, bufs }),
            (IoDir::Read, _) => batch.submit(target, IoOp::Read { offset, bufs }),
        }
    }

    fn buffers(&self) -> &BufPool {
        &self.fs.inner.bufs
    }

    fn io_error(&self, e: TargetError) -> FsError {
        e.into()
    }

    fn contract_error(&self, what: String) -> FsError {
        CoreError::corrupted("mapping contract", what).into()
    }
}

impl CacheIo for FileMapper<'_> {
    fn errno(&self, e: &FsError) -> i32 {
        e.errno()
    }

    fn writeback_done(&self, ends: &[WbEnd<DevAddr>], outcome: WbOutcome) -> Result<()> {
        if outcome == WbOutcome::Failed {
            if self.datacow {
                // Their checksums will never be logged.
                let bs = self.fs.inner.geo.block_size;
                for e in ends {
                    let w = &self.fs.inner.write_csums;
                    w.forget_write(bs, &e.map, e.pos, e.len);
                }
            }
            self.allocated.settle_batch(Settle::Free);
            self.fs.reconcile_delalloc(self.ino);
            return Ok(());
        }
        match self.fs.record_writeback(self.ino, ends) {
            Ok(()) => {
                self.allocated.settle_batch(Settle::Keep);
                Ok(())
            }
            // The file was freed while its writeback was in flight: nothing to record.
            Err(FsError::Stale(_)) => {
                self.allocated.settle_batch(Settle::Free);
                Ok(())
            }
            Err(e) => {
                self.allocated.settle_batch(Settle::Free);
                Err(e)
            }
        }
    }

    fn writeback_submitted(&self, batch: &Batch) {
        if let Some((t, op)) = self.held_write().and_then(RefCell::take) {
            batch.submit_here(self.fs.inner.targets[t].as_ref(), op);
        }
        self.allocated.close_batch();
    }

    fn next_stored(&self, pos: u64, end: u64) -> Result<u64> {
        FileMapper::next_stored(self, pos, end)
    }
}

impl Fs {
    /// Reads up to `buf.len()` bytes at `off` through the page cache; returns the bytes
    /// read (0 at or past EOF).
    ///
    /// # Errors
    /// `IsDir`, `Invalid` (not a file), `Stale`, target I/O errors, `Poisoned`.
    pub fn read_at(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.inner.check()?;
        let lock = self.inner.io_lock(ino);
        let _shared = lock.read();
        let mapper = FileMapper::new(self, ino)?;
        if !buf.is_empty() {
            self.touch_atime(ino);
        }
        let fc = lock.file_cache(&self.inner.cache);
        iomap::read(&self.inner.cache, &mapper, &fc, off, buf)
    }

    /// Writes `data` at `off` into the page cache; returns the bytes written (short only if
    /// an error struck after some bytes were written). Space is reserved now (`ENOSPC`
    /// here, never at writeback); the data reaches the targets at writeback (fsync, memory
    /// pressure, the background flusher, unmount). Large writes are throttled every quarter
    /// of the dirty limit, so one call cannot dirty more memory than the limit allows.
    ///
    /// # Errors
    /// `FileTooBig`, `NoSpace`, `IsDir`, `Invalid`, `Stale`, I/O errors reading a partial
    /// block, `Poisoned` (when nothing was written).
    pub fn write_at(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        if data.is_empty() {
            return Ok(0);
        }
        off.checked_add(data.len() as u64)
            .filter(|&e| e <= crate::MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        let cfg = self.inner.cache.config();
        let step = (cfg.dirty_limit_bytes / 4).max(u64::from(cfg.folio_bytes)) as usize;
        let mut done = 0;
        let mut committed = false;
        while done < data.len() {
            let n = step.min(data.len() - done);
            let (w, err) = match self.write_chunk(ino, off + done as u64, &data[done..done + n]) {
                Ok(w) => (w, None),
                Err(e) => (0, Some(e)),
            };
            done += w;
            if w == n {
                continue;
            }
            // Short or failed: if space ran out while freed blocks wait for a commit, commit
            // once and go on (the reservation failed; nothing of the rest was written).
            let mut err = err;
            if !committed && matches!(err, None | Some(FsError::NoSpace(_))) {
                committed = true;
                match self.commit_for_space() {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => err = Some(e),
                }
            }
            return match err {
                Some(e) if done == 0 => Err(e),
                _ => Ok(done),
            };
        }
        Ok(done)
    }

    /// Whether a flusher thread runs for throttled writers to wait for.
    fn flusher(&self) -> Flusher {
        if self.inner.bg.flusher_running.load(Ordering::Acquire) {
            Flusher::Running
        } else {
            Flusher::Absent
        }
    }

    fn write_chunk(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        let end = off + data.len() as u64;
        let lock = self.inner.io_lock(ino);
        let size = self
            .inner
            .meta
            .lock()
            .size_of(ino)
            .ok_or(FsError::Stale(ino.0))?;
        // Writes inside EOF share the inode (the folio locks order them); extending writes
        // take it exclusively for EOF zeroing and the size change (I-004-7).
        let _shared;
        let _excl;
        if end <= size {
            _shared = lock.read();
            if end > self.inner.meta.lock().size_of(ino).unwrap_or(0) {
                drop(_shared);
                return self.write_at(ino, off, data);
            }
        } else {
            _excl = lock.write();
        }
        let mapper = FileMapper::new(self, ino)?;
        let before = mapper.size();
        let fc = lock.file_cache(&self.inner.cache);
        let n = iomap::write(
            &self.inner.cache,
            &mapper,
            &fc,
            off,
            data,
            self.inner.opts.eof_zeroing,
        )?;
        self.after_write(ino, before, off + n as u64)?;
        // Past half the dirty limit the flusher starts now (it overlaps with this writer);
        // at the limit the writer is throttled. A writeback error is recorded for fsync:
        // the write itself succeeded.
        if self.inner.cache.over_background_threshold() {
            self.inner.bg.kick_flusher();
        }
        let _ = iomap::balance_dirty(&self.inner.cache, &mapper, &fc, self.flusher());
        Ok(n)
    }

    /// After a buffered write that ended at `end` into a file `before` bytes long: the
    /// in-core size (which the write grew folio by folio, `FileIo::extend_size`, and a
    /// writeback completion may already have made the on-disk size), speculative
    /// preallocation for an extending write, and the times.
    fn after_write(&self, ino: Ino, before: u64, end: u64) -> Result<()> {
        let mut m = self.inner.meta.lock();
        let disk = inode(&m, ino)?.attrs.size;
        let size = m.size_of(ino).unwrap_or(disk).max(end);
        if size != disk {
            m.set_isize(ino, Some(size));
        }
        let added =
            if size > before && size >= PREALLOC_MIN_SIZE && self.inner.opts.speculative_prealloc {
                self.speculative_prealloc(&mut m, ino)?
            } else {
                0
            };
        // Idle detection (and the in-core inode's pin) only while the file holds
        // speculative preallocation its last trim has not seen.
        let c = m.inodes.entry(ino);
        if added > 0 || c.last_write.is_some() {
            c.last_write = Some(Instant::now());
        }
        match data_times(&mut m, ino)? {
            Some(a) => self.inner.log_all(&mut m, vec![Record::InodeSet(a)]),
            None => Ok(()),
        }
    }

    /// Writes back the dirty cache of `ino` and waits for it.
    ///
    /// # Errors
    /// The writeback error (also recorded for every open handle).
    pub(crate) fn writeback_file(&self, ino: Ino, wait: WbWait) -> Result<()> {
        self.writeback_file_by(ino, wait, LastWrite::Engine)
    }

    /// [`Fs::writeback_file`] for `fsync`, which waits for it at once: each batch's last
    /// data write runs on this thread (decision 141).
    pub(crate) fn writeback_file_for_sync(&self, ino: Ino) -> Result<()> {
        self.writeback_file_by(ino, WbWait::Busy, LastWrite::Here)
    }

    fn writeback_file_by(&self, ino: Ino, wait: WbWait, last: LastWrite) -> Result<()> {
        let Some(fc) = self.inner.cache.existing(ino.0) else {
            return Ok(());
        };
        let mapper = match FileMapper::new(self, ino) {
            Ok(m) if last == LastWrite::Here => m.last_write_here(),
            Ok(m) => m,
            Err(FsError::Stale(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let wb = iomap::writeback(&self.inner.cache, &mapper, &fc, 0, u64::MAX, wait);
        debug_assert!(
            mapper.held_write().is_none_or(|h| h.borrow().is_none()),
            "every held write was submitted with its batch"
        );
        wb?;
        self.settle_size(ino, &fc)
    }

    /// Once no dirty cache remains inside EOF, the on-disk size catches up with the
    /// in-core size. Writeback completion grows it only as far as data was written; a tail
    /// whose dirty data was punched, zeroed or never existed (holes, unwritten blocks)
    /// would otherwise keep it short forever. Raising it can only expose blocks that read
    /// as zeros, never stale data.
    pub(crate) fn settle_size(
        &self,
        ino: Ino,
        fc: &stripefs_iomap::cache::FileCache,
    ) -> Result<()> {
        let size = match self.inner.meta.lock().isize_of(ino) {
            Some(s) => s,
            None => return Ok(()),
        };
        if fc.has_dirty_below(&self.inner.cache, size) {
            return Ok(());
        }
        let mut m = self.inner.meta.lock();
        if m.isize_of(ino) != Some(size) || m.delalloc_blocks(ino) > 0 {
            return Ok(());
        }
        let mut a = inode(&m, ino)?.attrs.clone();
        m.set_isize(ino, None);
        if a.size < size {
            a.size = size;
            m.mark_data(ino);
            self.inner.log_all(&mut m, vec![Record::InodeSet(a)])?;
        }
        Ok(())
    }

    /// Writes back every dirty file. With [`WbWait::Busy`] it also waits for writeback
    /// that others started (the flusher's, another `fsync`'s) on files with nothing
    /// dirty left: between taking a file's folios and recording them, that writeback's
    /// data is neither dirty nor in the journal, and a sync that passed it would commit
    /// without it (as Linux's sync waits for every inode under writeback).
    ///
    /// # Errors
    /// The first writeback error.
    pub(crate) fn writeback_all(&self, wait: WbWait) -> Result<()> {
        let cache = &self.inner.cache;
        let mut files: Vec<Ino> = cache.dirty_files().iter().map(|fc| Ino(fc.key)).collect();
        if wait == WbWait::Busy {
            files.extend(cache.writeback_files().iter().map(|fc| Ino(fc.key)));
        }
        // Files whose in-core size is ahead with nothing dirty still need settling.
        files.extend(
            self.inner
                .meta
                .lock()
                .inodes
                .iter()
                .filter(|(_, c)| c.isize.is_some())
                .map(|(i, _)| i),
        );
        files.sort_unstable();
        files.dedup();
        if self.inner.opts.wb_batch == WbBatch::Files {
            return self.writeback_files_grouped(&files, wait);
        }
        let mut first = None;
        for ino in files {
            let r = match self.inner.cache.existing(ino.0) {
                Some(_) => self.writeback_file(ino, wait),
                None => self.settle_size(ino, &self.inner.file_cache(ino)),
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Records completed writeback: extents written, delalloc placed, on-disk size grown.
    fn record_writeback(&self, ino: Ino, ends: &[WbEnd<DevAddr>]) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let mut m = self.inner.meta.lock();
        let objects = inode(&m, ino)?.attrs.layout.count;
        let mut recs = Vec::new();
        let mut end_max = 0;
        for e in ends {
            self.inner.mark_dirty(e.map.addr.target.index());
            end_max = end_max.max(e.pos + e.len);
            let new = e.map.flags.contains(IomapFlags::NEW);
            if e.map.kind != IomapKind::Unwritten && !new {
                continue;
            }
            let rec = piece_record(bs, ino, &e.map, e.pos, e.len, ExtentState::Written);
            if let (true, Record::ExtentSet { block, len, .. }) = (new, &rec) {
                // As before decision 101: what a completion finds still delayed here
                // is not given back (a concurrent re-reservation's accounting).
                let _ = m
                    .delalloc_mut(ino, e.map.addr.object, objects)
                    .remove(*block, *len);
            }
            recs.push(rec);
        }
        let mut a = inode(&m, ino)?.attrs.clone();
        let size = m.size_of(ino).unwrap_or(a.size);
        let grown = end_max.min(size);
        if grown > a.size {
            a.size = grown;
            if grown == size {
                m.set_isize(ino, None);
            }
            recs.push(Record::InodeSet(a));
        }
        self.log_remapped(&mut m, ino, recs)
    }

    /// Speculative preallocation for an extending write: when nothing is mapped or delayed
    /// right after the new EOF, allocates unwritten extents beyond it, as much as the file's
    /// size (64 KiB to 8 MiB, so it grows with the file; none below
    /// [`PREALLOC_MIN_SIZE`]). Later extending writes land in
    /// them without allocating; unused space is trimmed at last close, when idle, and at
    /// unmount. Best effort: a full target just means no preallocation. Returns the
    /// extents added.
    fn speculative_prealloc(&self, m: &mut crate::inner::MetaCore, ino: Ino) -> Result<usize> {
        let bs = self.inner.geo.block_size;
        let i = inode(m, ino)?;
        if i.attrs.flags & FLAG_PREALLOC != 0 {
            return Ok(0);
        }
        let size = m.size_of(ino).unwrap_or(i.attrs.size);
        let (from, want) = (
            bs.round_up(size),
            bs.round_up(size.clamp(64 << 10, 8 << 20)),
        );
        let next = i.attrs.layout.piece(from, 1);
        let next_block = bs.block_of(next.obj_off);
        let mapped = matches!(
            i.objects[next.object as usize].lookup(next_block),
            stripefs_core::extent::Lookup::Mapped { .. }
        );
        let delayed = m
            .delalloc_of(ino, next.object as usize)
            .is_some_and(|d| d.covering(next_block).is_some());
        if mapped || delayed {
            return Ok(0);
        }
        let l = i.attrs.layout;
        let n = self.inner.target_count();
        let mut recs = Vec::new();
        let mut pos = from;
        while pos < from + want {
            let p = l.piece(pos, from + want - pos);
            let (object, block, blocks) = (p.object, bs.block_of(p.obj_off), bs.block_of(p.len));
            pos += p.len;
            let map = &inode(m, ino)?.objects[object as usize];
            let da = m.delalloc_of(ino, object as usize);
            let free = map.range(block, blocks).next().is_none()
                && da.is_none_or(|d| d.overlap(block, blocks) == 0);
            if !free {
                continue;
            }
            let target = self.inner.place(l.target_of(object, n))?;
            let goal = match block.checked_sub(1).map(|b| map.lookup(b)) {
                Some(stripefs_core::extent::Lookup::Mapped { start, ext })
                    if ext.target == target =>
                {
                    Some(ext.phys + (block - start))
                }
                _ => None,
            };
            let Some((phys, got)) = m.alloc.alloc(target, goal, blocks) else {
                break;
            };
            recs.push(Record::ExtentSet {
                ino,
                object,
                block,
                len: got,
                phys,
                state: ExtentState::Unwritten,
                target,
            });
        }
        let added = recs.len();
        self.inner.log_all(m, recs)?;
        Ok(added)
    }

    /// Frees unwritten extents wholly beyond EOF unless the file has explicit
    /// preallocation (the speculative preallocation was not used).
    pub(crate) fn trim_prealloc(&self, m: &mut crate::inner::MetaCore, ino: Ino) -> Result<()> {
        let bs = self.inner.geo.block_size;
        // Trimmed now: nothing is left for the idle trim (and the in-core inode is no
        // longer pinned for it).
        if let Some(c) = m.inodes.get_mut(ino) {
            c.last_write = None;
        }
        let Some(i) = m.state.get(ino)? else {
            return Ok(());
        };
        if i.attrs.flags & FLAG_PREALLOC != 0
            || i.attrs.kind != stripefs_core::inode::FileKind::Regular
        {
            return Ok(());
        }
        let size = m.size_of(ino).unwrap_or(i.attrs.size);
        let l = i.attrs.layout;
        for object in 0..l.count {
            let keep = bs.blocks_for(l.object_len(object, size));
            self.clear_object_range(
                m,
                ino,
                object,
                (keep, u64::MAX),
                Some(ExtentState::Unwritten),
            )?;
        }
        Ok(())
    }

    /// Drops delalloc ranges that no dirty cache block backs any more (after a failed
    /// writeback dropped the data), returning their reservations.
    pub(crate) fn reconcile_delalloc(&self, ino: Ino) {
        let bs = self.inner.geo.block_size.bytes_u64();
        let fc = self.inner.cache.existing(ino.0);
        let (l, maps) = {
            let m = self.inner.meta.lock();
            let Ok(Some(i)) = m.state.get(ino) else {
                return;
            };
            let Some(maps) = m
                .inodes
                .get(ino)
                .filter(|c| !c.delalloc.is_empty())
                .map(|c| c.delalloc.clone())
            else {
                return;
            };
            (i.attrs.layout, maps)
        };
        // Folio locks are taken without the metadata lock (folio before metadata).
        let mut orphaned = Vec::new();
        for (object, da) in maps.iter().enumerate() {
            for (start, len, _) in da.ranges() {
                for b in start..start + len {
                    let pos = l.file_off(object as u32, b * bs);
                    if !fc
                        .as_ref()
                        .is_some_and(|fc| fc.block_dirty(&self.inner.cache, pos))
                    {
                        orphaned.push((object as u32, b));
                    }
                }
            }
        }
        let mut m = self.inner.meta.lock();
        for (object, b) in orphaned {
            let removed = m.delalloc_mut(ino, object, l.count).remove(b, 1);
            removed.unreserve(&mut m.alloc);
        }
    }

    /// Discards all cache and delayed allocations of `ino` at or beyond file offset `from`
    /// (truncate, unlink): returns the reservations.
    pub(crate) fn discard_cache_from(&self, ino: Ino, from: u64) {
        if let Some(fc) = self.inner.cache.existing(ino.0) {
            iomap::invalidate_range(&self.inner.cache, &fc, from, u64::MAX);
        }
        let bs = self.inner.geo.block_size;
        let mut m = self.inner.meta.lock();
        let Ok(Some(i)) = m.state.get(ino) else {
            return;
        };
        let l = i.attrs.layout;
        for object in 0..l.count {
            let keep = bs.blocks_for(l.object_len(object, from));
            let removed = m
                .delalloc_mut(ino, object, l.count)
                .remove(keep, u64::MAX / 2);
            removed.unreserve(&mut m.alloc);
        }
    }
}

/// Clears `BgControl::flusher_running` when the flusher thread ends, however it ends
/// (a throttled writer must not wait for a flusher that is gone).
struct FlusherRunning<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for FlusherRunning<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The background flusher: writes back dirty files every `interval` or when the cache is
/// over its background threshold (a writer kicks it there), and trims speculative
/// preallocation of idle files.
pub(crate) fn flusher(
    weak: std::sync::Weak<FsInner>,
    bg: Arc<crate::inner::BgControl>,
    interval: Duration,
) {
    let _running = FlusherRunning(&bg.flusher_running);
    let mut last_full = Instant::now();
    loop {
        if bg.wait_for_flush_kick(Duration::from_millis(200)) {
            return;
        }
        let Some(inner) = weak.upgrade() else { return };
        if inner.is_poisoned() {
            continue;
        }
        let fs = Fs { inner };
        if fs.inner.cache.over_background_threshold() || last_full.elapsed() >= interval {
            // Errors are recorded in each file's error sequence for fsync to report.
            let _ = fs.writeback_all(WbWait::SkipBusy);
            last_full = Instant::now();
            fs.trim_idle();
        }
        fs.reap_dead();
    }
}

impl Fs {
    fn trim_idle(&self) {
        let idle: Vec<Ino> = {
            let m = self.inner.meta.lock();
            m.inodes
                .iter()
                .filter(|(_, c)| c.last_write.is_some_and(|t| t.elapsed() >= IDLE_TRIM))
                .map(|(i, _)| i)
                .collect()
        };
        for ino in idle {
            let lock = self.inner.io_lock(ino);
            let Some(_excl) = lock.try_write() else {
                continue;
            };
            let mut m = self.inner.meta.lock();
            if let Err(e) = self.trim_prealloc(&mut m, ino) {
                tracing::warn!(ino = ino.0, error = %e, "trimming preallocation failed");
            }
        }
    }

    /// The offset of the next data (`Data`) or hole (`Hole`) at or after `off`, as
    /// `lseek(SEEK_DATA / SEEK_HOLE)`. Unwritten extents are holes unless dirty cache lies
    /// over them; delalloc is data.
    ///
    /// # Errors
    /// `NoSuchOffset` (ENXIO) at or past EOF, or when no data follows `off`.
    pub fn seek(&self, ino: Ino, off: u64, what: Whence) -> Result<u64> {
        self.inner.check()?;
        let lock = self.inner.io_lock(ino);
        let _shared = lock.read();
        let mapper = FileMapper::new(self, ino)?;
        let size = mapper.size();
        if off >= size {
            return Err(FsError::NoSuchOffset);
        }
        let fc = self.inner.cache.existing(ino.0);
        let bs = self.inner.geo.block_size.bytes_u64();
        let mut cur = off;
        while cur < size {
            // A run with nothing cached and only holes or unwritten blocks is a hole, found
            // in one step however long it is (a file truncated up to 2^60 bytes).
            let cached = match &fc {
                Some(fc) if fc.get(cur).is_some() => cur,
                Some(fc) => fc.next_folio_after(cur).map_or(size, |p| p.min(size)),
                None => size,
            };
            let hole_end = mapper.next_stored(cur, cached)?;
            if hole_end > cur {
                if what == Whence::Hole {
                    return Ok(cur);
                }
                cur = hole_end;
                continue;
            }
            // One mapping: the first block of the wanted kind in it, or its end.
            let mut found = None;
            cur += iomap::iterate(&mapper, cur, size - cur, IomapOp::Report, |map, p, n| {
                let mut b = p;
                while b < p + n {
                    let data = match map.kind {
                        IomapKind::Mapped | IomapKind::Delalloc | IomapKind::Shared => true,
                        // Data the device does not hold yet: dirty, or being written
                        // back (the flusher runs without the inode lock, and a block it
                        // took is neither dirty nor recorded until its write completes).
                        IomapKind::Hole | IomapKind::Unwritten => fc
                            .as_ref()
                            .is_some_and(|fc| fc.block_pending(&self.inner.cache, b)),
                    };
                    if data == (what == Whence::Data) {
                        found = Some(b);
                        return Ok(iomap::Step::Done(0));
                    }
                    b = (b / bs + 1) * bs;
                }
                Ok(iomap::Step::Done(n))
            })?;
            if let Some(b) = found {
                return Ok(b);
            }
        }
        match what {
            Whence::Data => Err(FsError::NoSuchOffset),
            Whence::Hole => Ok(size),
        }
    }
}

impl Fs {
    /// Test hook modelling fsx's EOF pollution (`-e 1`): writes garbage into the cached
    /// EOF folio past EOF and marks it dirty, as an mmap store past EOF in the EOF page
    /// would (I-002-4: such a store dirties the whole folio). Size-changing operations must
    /// then zero it. No-op if EOF is at the end of the folio holding the last byte.
    ///
    /// # Errors
    /// Mapping or device errors bringing the EOF folio in.
    #[doc(hidden)]
    pub fn debug_pollute_past_eof(&self, ino: Ino, seed: u8) -> Result<()> {
        let lock = self.inner.io_lock(ino);
        let _excl = lock.write();
        let mapper = FileMapper::new(self, ino)?;
        let size = mapper.size();
        if size == 0 {
            return Ok(());
        }
        let fc = lock.file_cache(&self.inner.cache);
        let cells = iomap::fill(&self.inner.cache, &mapper, &fc, size - 1, 1)?;
        let mut g = cells[0].lock();
        let off = (size - g.pos) as usize;
        if off == g.data.len() {
            return Ok(());
        }
        for (i, b) in g.data[off..].iter_mut().enumerate() {
            *b = seed.wrapping_add(i as u8) | 0x80;
        }
        let blocks = g.state().blocks();
        g.set_uptodate(0, blocks);
        self.inner.cache.set_dirty(&mut g, 0, blocks);
        Ok(())
    }
}

/// What [`Fs::seek`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    /// `SEEK_DATA`.
    Data,
    /// `SEEK_HOLE`.
    Hole,
}

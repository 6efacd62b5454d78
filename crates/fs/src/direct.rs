//! Direct I/O, the file system's side: alignment, the lock decision, draining, EOF zeroing,
//! space reservation and recording completions. The request lifecycle itself (cache
//! coherence, in-flight accounting, fan-out of pieces, one completion fan-in) is the
//! generic engine's, `stripefs_iomap::direct`, as Linux's XFS and ext4 leave it to
//! `__iomap_dio_rw`.
//!
//! Offsets and lengths must be multiples of the targets' logical sector (the smallest
//! legal direct I/O unit); anything else is `EINVAL` (no bounce for misaligned offsets).
//! The caller's memory is always copied through aligned buffers, so its alignment does
//! not matter.
//!
//! A write goes down once (`Fs::submit_write_direct`, reached through [`Fs::write`]; [`Fs::write_direct`] is it plus a
//! wait):
//! 1. checks (alignment, size limit, metadata space);
//! 2. the lock, decided once before anything is submitted (ext4 style, I-000-4), cheap
//!    checks first: a write ending past EOF, or a sub-block write under
//!    `dio_unaligned = exclusive`, is exclusive without a look at the mappings; otherwise,
//!    under the shared lock, the mappings say whether it is a pure overwrite inside EOF
//!    (written blocks, or unwritten blocks covered whole: shared, I-000-2) or not
//!    (exclusive: the shared lock is dropped, nothing having been submitted);
//! 3. shared: the engine starts the write and returns; the completion records it on a
//!    target's completion thread, the in-flight count keeping exclusive operations out
//!    (I-000-5);
//! 4. exclusive: drain in-flight direct I/O (I-000-5), zero `[EOF, pos)` for a write
//!    starting past EOF (I-004-7), then the engine, waited for under the lock (I-003-4,
//!    I-003-5): its `prepare_write` reserves space on each target for every hole in the
//!    range and every block it copies on write (I-003-3, decision 90; committing once
//!    first if freed blocks are busy), or, if some target lacks it, submits serially so
//!    that running out ends the write short and contiguous. On failure nothing is
//!    recorded and what was allocated is freed (I-003-2); on success new and unwritten
//!    blocks are recorded written and the size grows (I-000-6).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use stripefs_core::extent::ExtentState;
use stripefs_core::record::Record;
use stripefs_core::{Ino, TargetId};
use stripefs_iomap::cache::PageCache;
use stripefs_iomap::direct::{
    dio_read, dio_read_wait, dio_write, dio_write_wait, Answer, DioCount, DioEndIo, DioOps,
    DioPiece, DioSubmit,
};
use stripefs_iomap::{iterate, IomapKind, IomapOp, Step};
use stripefs_target::{BufPool, TargetError};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::icache::InodeIo;
use crate::mapping::{piece_record, DevAddr, FileMapper, Reservation};
use crate::namespace::{data_times, inode};
use crate::options::UnalignedPolicy;

/// The inode lock a direct write needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DioLock {
    /// Concurrent with other shared direct writes and with readers.
    Shared,
    /// Alone, after draining in-flight direct I/O.
    Exclusive,
}

/// The lock a direct write holds, decided once. (The shared variant carries the mapper by
/// value: boxing it would allocate on every direct write, for one move of the guard.)
#[allow(clippy::large_enum_variant)]
enum DioGuard<'a> {
    /// Shared, with the mapper that decided it.
    Shared(parking_lot::RwLockReadGuard<'a, ()>, FileMapper<'a>),
    Exclusive(parking_lot::RwLockWriteGuard<'a, ()>),
}

/// The completion side of one direct I/O (the engine's `DioEndIo`).
pub(crate) struct DioDone {
    fs: Fs,
    ino: Ino,
    io: Arc<InodeIo>,
    /// The file is datacow: its writes' checksums are kept until recorded (`WriteCsums`).
    datacow: bool,
}

impl DioEndIo<DevAddr> for DioDone {
    type Error = FsError;

    fn page_cache(&self) -> (&PageCache, u64) {
        (&self.fs.inner.cache, self.ino.0)
    }

    fn in_flight(&self) -> &DioCount {
        &self.io.dio
    }

    fn buffers(&self) -> &BufPool {
        &self.fs.inner.bufs
    }

    fn io_error(&self, e: TargetError) -> FsError {
        e.into()
    }

    fn write_done(&self, pieces: &[DioPiece<DevAddr>], end: u64) -> Result<()> {
        self.fs.record_dio(self.ino, pieces, end)
    }

    fn write_failed(&self, pieces: &[DioPiece<DevAddr>]) {
        if !self.datacow {
            return; // no checksums computed
        }
        // Their checksums will never be logged (decision 91).
        let bs = self.fs.inner.geo.block_size;
        for e in pieces {
            let w = &self.fs.inner.write_csums;
            w.forget_write(bs, &e.map, e.pos, e.len);
        }
    }

    fn submitted(&self, pieces: u64) {
        self.fs
            .inner
            .dio_pieces
            .fetch_add(pieces, Ordering::Relaxed);
    }

    fn read_copied(&self, bytes: u64) {
        self.fs
            .inner
            .dio_read_copied
            .fetch_add(bytes, Ordering::Relaxed);
    }
}

impl DioOps for FileMapper<'_> {
    type End = DioDone;

    fn end_io(&self) -> DioDone {
        DioDone {
            fs: self.fs.clone(),
            ino: self.ino,
            io: self.fs.inner.io_lock(self.ino),
            datacow: self.datacow,
        }
    }

    fn prepare_write(&self, pos: u64, len: u64) -> Result<DioSubmit> {
        let want = self.fs.inner.opts.dio_submit;
        if self.dio_lock() == Some(DioLock::Shared) {
            return Ok(want); // A pure overwrite: allocates nothing.
        }
        Ok(if self.fs.reserve_dio_space(self, pos, len)? {
            want
        } else {
            DioSubmit::Serial
        })
    }

    fn read_submit(&self) -> DioSubmit {
        self.fs.inner.opts.dio_submit
    }

    fn ends_short(&self, e: &FsError) -> bool {
        matches!(e, FsError::NoSpace(_))
    }

    fn block_bytes(&self) -> u64 {
        self.fs.inner.geo.block_size.bytes_u64()
    }
}

impl Fs {
    pub(crate) fn check_dio_alignment(&self, off: u64, len: usize) -> Result<()> {
        let s = u64::from(self.inner.geo.sector_size);
        if !off.is_multiple_of(s) || !(len as u64).is_multiple_of(s) {
            return Err(FsError::invalid(format!(
                "direct I/O of {len} bytes at {off} is not aligned to the {s}-byte logical sector"
            )));
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `off` bypassing the cache (dirty cache over the
    /// range is written back first). `off` and `buf.len()` must be sector multiples.
    ///
    /// # Errors
    /// `Invalid` for misalignment or non-files, `Stale`, target I/O errors, `Poisoned`.
    pub fn read_direct(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        let sector = u64::from(self.inner.geo.sector_size);
        self.with_dio_reader(ino, off, buf.len(), |mapper| {
            dio_read_wait(mapper, off, buf, sector)
        })?
    }

    /// Starts a direct read of up to `len` bytes at `off` (as [`Fs::read_direct`]);
    /// `done` gets the bytes read (fewer at EOF) exactly once, on a target completion
    /// thread or, when the read cannot start or needs no I/O, on this thread before
    /// returning.
    pub(crate) fn submit_read_direct<F>(&self, ino: Ino, off: u64, len: usize, done: F)
    where
        F: FnOnce(Result<Vec<u8>>) + Send + 'static,
    {
        let sector = u64::from(self.inner.geo.sector_size);
        let mut done = Some(done);
        let r = self.with_dio_reader(ino, off, len, |mapper| {
            let done = done.take().expect("answered once");
            dio_read(mapper, off, len, sector, done);
        });
        if let (Err(e), Some(done)) = (r, done) {
            done(Err(e));
        }
    }

    /// Checks a direct read and runs `f` under the shared inode lock with the file's
    /// mapper.
    fn with_dio_reader<R>(
        &self,
        ino: Ino,
        off: u64,
        len: usize,
        f: impl FnOnce(&FileMapper<'_>) -> R,
    ) -> Result<R> {
        self.inner.check()?;
        self.check_dio_alignment(off, len)?;
        let io = self.inner.io_lock(ino);
        let _shared = io.read();
        let mapper = FileMapper::new(self, ino)?;
        if len > 0 {
            self.touch_atime(ino);
        }
        Ok(f(&mapper))
    }

    /// Writes `data` at `off` bypassing the cache (see the module documentation for the
    /// protocol): `Fs::submit_write_direct` and a wait for its answer. `off` and
    /// `data.len()` must be sector multiples. Returns `data.len()`, or fewer bytes only
    /// when space ran out part way (a contiguous prefix was written).
    ///
    /// # Errors
    /// `Invalid` (misaligned), `FileTooBig`, `NoSpace` (nothing written), target I/O
    /// errors (nothing recorded; the range's content is undefined), `Stale`, `Poisoned`.
    pub fn write_direct(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        let answer = Arc::new(Answer::default());
        let put = Arc::clone(&answer);
        self.submit_write_direct(ino, off, data, move |r| put.put(r));
        answer.wait()
    }

    /// Starts a direct write of `data` at `off` (see the module documentation) and returns
    /// without waiting when it can run under the shared lock; `done` gets the result
    /// exactly once, on a target completion thread, or on this thread before returning
    /// when the write runs under the exclusive lock (Linux's `IOMAP_DIO_FORCE_WAIT`), had
    /// to wait for a window or could not start. `data` is copied before this returns.
    pub(crate) fn submit_write_direct<F>(&self, ino: Ino, off: u64, data: &[u8], done: F)
    where
        F: FnOnce(Result<usize>) + Send + 'static,
    {
        let change = match self.dio_write_checks(off, data.len()) {
            Ok(g) => g,
            Err(e) => return done(Err(e)),
        };
        if data.is_empty() {
            return done(Ok(0));
        }
        let io = self.inner.io_lock(ino);
        let lock = self.dio_write_lock(&io, ino, off, data.len() as u64);
        match lock {
            Ok(DioGuard::Shared(shared, mapper)) => {
                self.inner.dio_shared.fetch_add(1, Ordering::Relaxed);
                match self.touch_mtime(ino) {
                    Ok(()) => dio_write(&mapper, off, data, done),
                    Err(e) => done(Err(e)),
                }
                // In flight (counted) from here: a switch to read-only drains it.
                drop((mapper, shared, change));
            }
            Ok(DioGuard::Exclusive(excl)) => {
                let r = self.write_direct_exclusive(&io, ino, off, data);
                drop((excl, change));
                done(r);
            }
            Err(e) => done(Err(e)),
        }
    }

    /// What is checked before any lock: alignment, the size limit, metadata space. Returns
    /// the guard that keeps the file system writable for the write.
    fn dio_write_checks(
        &self,
        off: u64,
        len: usize,
    ) -> Result<parking_lot::RwLockReadGuard<'_, crate::types::Access>> {
        self.inner.check()?;
        let change = self.begin_change()?;
        if len == 0 {
            return Ok(change);
        }
        self.check_dio_alignment(off, len)?;
        off.checked_add(len as u64)
            .filter(|&e| e <= crate::MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        Ok(change)
    }

    /// Takes the inode lock a direct write of `[off, off + len)` needs, decided once,
    /// cheap checks first (I-000-2, I-000-6; see the module documentation).
    fn dio_write_lock<'a>(
        &'a self,
        io: &'a InodeIo,
        ino: Ino,
        off: u64,
        len: u64,
    ) -> Result<DioGuard<'a>> {
        let end = off + len;
        let bs = self.inner.geo.block_size.bytes_u64();
        let unaligned = !off.is_multiple_of(bs) || !end.is_multiple_of(bs);
        let size_guess = self
            .inner
            .meta
            .lock()
            .size_of(ino)
            .ok_or(FsError::Stale(ino.0))?;
        let exclusive_anyway = end > size_guess
            || (unaligned && self.inner.opts.dio_unaligned == UnalignedPolicy::Exclusive);
        if !exclusive_anyway {
            let shared = io.read();
            let mapper = FileMapper::new(self, ino)?.with_dio_lock(DioLock::Shared);
            // A datacow file's direct writes always allocate (or convert unwritten blocks
            // whose dirty cache the engine's coherence may write back first, copying them
            // on write): never under the shared lock.
            if end <= mapper.size() && !mapper.datacow && self.overwrites_only(&mapper, off, len)? {
                return Ok(DioGuard::Shared(shared, mapper));
            }
        }
        Ok(DioGuard::Exclusive(io.write()))
    }

    /// True when every mapping of `[off, off + len)` holds written blocks, or unwritten
    /// blocks the write covers whole, on targets that admit the write in place (I-001-3:
    /// admitted here, for the mapper's life, so a target going read-only meanwhile waits
    /// for this write): the write then writes only its own sectors and allocates nothing.
    fn overwrites_only(&self, mapper: &FileMapper<'_>, off: u64, len: u64) -> Result<bool> {
        let bs = self.inner.geo.block_size.bytes_u64();
        let mut only = true;
        iterate(mapper, off, len, IomapOp::Report, |map, p, n| {
            let whole_blocks = p.is_multiple_of(bs) && (p + n).is_multiple_of(bs);
            // Shared blocks are never written in place: the write allocates.
            let shared = map.flags.contains(stripefs_iomap::IomapFlags::SHARED);
            only = match map.kind {
                IomapKind::Mapped => !shared,
                IomapKind::Unwritten => whole_blocks && !shared,
                IomapKind::Hole | IomapKind::Delalloc | IomapKind::Shared => false,
            } && mapper.in_place.enter(map.addr.target);
            Ok(if only {
                Step::Advance(n)
            } else {
                Step::Done(0)
            })
        })?;
        Ok(only)
    }

    /// The exclusive path: drain, EOF zeroing, then the engine, waited for under the lock;
    /// what the write allocated is kept only if it was recorded.
    fn write_direct_exclusive(
        &self,
        io: &InodeIo,
        ino: Ino,
        off: u64,
        data: &[u8],
    ) -> Result<usize> {
        io.dio.drain();
        self.inner.dio_exclusive.fetch_add(1, Ordering::Relaxed);
        let mapper = FileMapper::new(self, ino)?.with_dio_lock(DioLock::Exclusive);
        if self.zero_eof_to(&mapper, off)? {
            // The direct write bypasses the cache: the zeros reach the disk before its
            // size change can expose the gap.
            self.writeback_file(ino, stripefs_iomap::WbWait::Busy)?;
        }
        self.touch_mtime(ino)?;
        let r = if mapper.datacow {
            self.write_direct_datacow(&mapper, off, data)
        } else {
            self.cow_partial_edges(&mapper, off, data.len() as u64)?;
            dio_write_wait(&mapper, off, data)
        };
        if r.is_ok() {
            // Recorded at completion; otherwise dropping the mapper frees them, and what
            // is left of the reservation goes back with it.
            mapper.allocated.commit();
        }
        r
    }

    /// A direct write covering part of a written block that is shared, or on a target
    /// that refuses in-place writes (read-only, I-001-3): that block is copied to a block
    /// of its own first (`cow_block`, which keeps the block's other bytes), so the write
    /// lands on it in place; whole blocks get new blocks from the mapping (copy on
    /// write). Left to the mapping, a partial block on a read-only target would get a new
    /// block holding only the write's bytes.
    fn cow_partial_edges(&self, mapper: &FileMapper<'_>, off: u64, len: u64) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let end = off + len;
        let first = bs.round_down(off);
        let last = bs.round_down(end - 1);
        let partial_first = off != first || end < first + bs.bytes_u64();
        let partial_last = last != first && bs.offset_in_block(end) != 0;
        if !partial_first && !partial_last {
            return Ok(());
        }
        let none = self.inner.meta.lock().nothing_shared();
        let maybe_shared = !self.inner.refs_ok(none)?;
        if !maybe_shared && self.admitted_everywhere(mapper) {
            return Ok(()); // nothing to copy whatever the edges map: no walk
        }
        for (pos, partial) in [(first, partial_first), (last, partial_last)] {
            if !partial || pos >= mapper.size() {
                continue;
            }
            let map = mapper.begin_report(pos)?;
            if self.edge_copies(mapper, &map, maybe_shared) {
                self.cow_block(mapper.ino, &map, pos, |_| {})?;
            }
        }
        Ok(())
    }

    /// Admits the write in place on every target (held by the mapper until the write is
    /// submitted: an evacuation beginning meanwhile waits for it); false if one refuses.
    /// Cheaper than looking the edges up, for the common case of no read-only target.
    fn admitted_everywhere(&self, mapper: &FileMapper<'_>) -> bool {
        // A retired target holds no block, so no write lands there: it is not asked.
        (0..self.inner.target_count())
            .map(TargetId)
            .filter(|&t| !self.inner.states.is_retired(t))
            .all(|t| mapper.in_place.enter(t))
    }

    /// Whether a direct write's partial block in `map` must be copied before the write:
    /// written and shared, or written on a target that does not admit this operation in
    /// place. An admission granted here is the mapper's until the write is submitted, so
    /// a target going read-only after this look still waits for the write.
    fn edge_copies(
        &self,
        mapper: &FileMapper<'_>,
        map: &stripefs_iomap::Iomap<DevAddr>,
        maybe_shared: bool,
    ) -> bool {
        if maybe_shared && map.flags.contains(stripefs_iomap::IomapFlags::SHARED) {
            return true;
        }
        if map.kind != IomapKind::Mapped {
            return false;
        }
        if mapper.in_place.enter(map.addr.target) {
            return false;
        }
        self.inner.nocow.read_only.fetch_add(1, Ordering::Relaxed);
        self.inner.nocow.cow.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A datacow file's direct write: its partial blocks over written data are merged
    /// into copies (`datacow_edge`); the whole blocks between go through the engine as
    /// new blocks. The last partial block is merged only once the engine wrote everything
    /// before it, so a write that runs out of space part way changes nothing past the
    /// bytes it reports: the answer is the contiguous prefix written (issue 12: it was
    /// the whole request), an error only if nothing was written.
    fn write_direct_datacow(
        &self,
        mapper: &FileMapper<'_>,
        off: u64,
        data: &[u8],
    ) -> Result<usize> {
        let bs = self.inner.geo.block_size;
        let end = off + data.len() as u64;
        let first = bs.round_down(off);
        let last = bs.round_down(end - 1);
        let partial_first = off != first || end < first + bs.bytes_u64();
        let partial_last = last != first && bs.offset_in_block(end) != 0;
        if partial_first || partial_last {
            self.datacow_coherent(mapper, off, end)?;
        }
        let mut lo = off;
        if partial_first && self.datacow_edge(mapper, off, data, first)? {
            lo = end.min(first + bs.bytes_u64());
        }
        // From here `[off, lo)` may be recorded, and a recorded copy is not undone: any
        // later failure ends the write short there (a contiguous short write, the answer
        // equal to what the file reads; the caller's retry of the rest meets the error).
        let short = |at: u64, e: FsError| -> Result<usize> {
            if at > off {
                Ok(usize::try_from(at - off).expect("inside the write"))
            } else {
                Err(e)
            }
        };
        // The last block is merged after the middle if it holds written data; otherwise
        // the engine writes it whole, zero-padded.
        let merge_last = partial_last
            && lo <= last
            && match self.written_at(mapper, last) {
                Ok(w) => w,
                Err(e) => return short(lo, e),
            };
        let hi = if merge_last { last } else { end };
        if lo < hi {
            let at = usize::try_from(lo - off).expect("inside the write");
            let to = usize::try_from(hi - off).expect("inside the write");
            let n = match dio_write_wait(mapper, lo, &data[at..to]) {
                Ok(n) => n,
                Err(e) => return short(lo, e),
            };
            // Recorded: the last edge's failure must not free them with the mapper.
            mapper.allocated.commit();
            if n < to - at {
                return Ok(at + n); // out of space: a contiguous short write
            }
        }
        if merge_last {
            if let Err(e) = self.datacow_edge(mapper, off, data, last) {
                return short(last, e);
            }
        }
        Ok(data.len())
    }

    /// Coherence before a datacow write's edges are merged, as the engine's: dirty cache
    /// over the range written back and dropped, since the merge reads the blocks from the
    /// device.
    fn datacow_coherent(&self, mapper: &FileMapper<'_>, off: u64, end: u64) -> Result<()> {
        if let Some(fc) = self.inner.cache.existing(mapper.ino.0) {
            let fb = u64::from(self.inner.cache.config().folio_bytes);
            let (a, b) = (off / fb * fb, end.div_ceil(fb) * fb);
            stripefs_iomap::writeback(
                &self.inner.cache,
                mapper,
                &fc,
                a,
                b,
                stripefs_iomap::WbWait::Busy,
            )?;
            stripefs_iomap::invalidate_range(&self.inner.cache, &fc, a, b);
        }
        Ok(())
    }

    /// Whether the block at `block_at` (inside EOF) holds written data.
    fn written_at(&self, mapper: &FileMapper<'_>, block_at: u64) -> Result<bool> {
        Ok(block_at < mapper.size() && mapper.begin_report(block_at)?.is_written())
    }

    /// A datacow file's direct write covering part of the written block at `block_at`:
    /// the block is read (verified), the write's bytes merged in, and the result written
    /// to a new block remapped in one transaction with its checksum (and the size, if the
    /// write passes it there): a written block is never written in place, and the
    /// engine's whole-block writes of new blocks would lose the rest of the block.
    /// Returns false (nothing done) when the block is not written data inside EOF.
    fn datacow_edge(
        &self,
        mapper: &FileMapper<'_>,
        off: u64,
        data: &[u8],
        block_at: u64,
    ) -> Result<bool> {
        if block_at >= mapper.size() {
            return Ok(false);
        }
        let map = mapper.begin_report(block_at)?;
        if !map.is_written() {
            return Ok(false);
        }
        let bs = self.inner.geo.block_size;
        let end = off + data.len() as u64;
        let from = off.max(block_at);
        let to = end.min(block_at + bs.bytes_u64());
        let src = &data[usize::try_from(from - off).expect("inside")
            ..usize::try_from(to - off).expect("inside")];
        let at = usize::try_from(from - block_at).expect("inside the block");
        self.cow_block_sized(
            mapper.ino,
            &map,
            block_at,
            |b| b[at..at + src.len()].copy_from_slice(src),
            Some(to),
        )?;
        Ok(true)
    }

    /// Reserves, per target, the blocks the write allocates: every hole in the range, and
    /// every block it copies on write (shared blocks, a datacow file's written blocks;
    /// decision 90). Blocks freed by transactions not yet durable become reservable after
    /// a commit, which is made and the reservation retried once. Keyed by where the new
    /// blocks will go (the object's placement, `placement.rs`), not where copied blocks
    /// are. False if some target still lacks the space (the caller then goes piece by
    /// piece).
    fn reserve_dio_space(&self, mapper: &FileMapper<'_>, off: u64, len: u64) -> Result<bool> {
        let bs = self.inner.geo.block_size;
        let mut need: std::collections::HashMap<TargetId, u64> = std::collections::HashMap::new();
        iterate(mapper, off, len, IomapOp::Report, |map, p, n| {
            let copied = map.flags.contains(stripefs_iomap::IomapFlags::SHARED);
            if copied || matches!(map.kind, IomapKind::Hole) {
                let to = self.inner.place(mapper.home(map.addr.object))?;
                *need.entry(to).or_default() += bs.blocks_for(p + n - bs.round_down(p));
            }
            Ok(n)
        })?;
        let reservation = match Reservation::take(mapper.fs, need.clone()) {
            Some(r) => Some(r),
            None if self.commit_for_space()? => Reservation::take(mapper.fs, need),
            None => None,
        };
        let Some(reservation) = reservation else {
            return Ok(false);
        };
        mapper.set_dio_reservation(reservation);
        Ok(true)
    }

    /// Records a completed direct write: new and unwritten blocks written, size grown to
    /// `end` if it passed EOF.
    pub(crate) fn record_dio(
        &self,
        ino: Ino,
        pieces: &[DioPiece<DevAddr>],
        end: u64,
    ) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let mut m = self.inner.meta.lock();
        let mut recs = Vec::new();
        for e in pieces {
            self.inner.mark_dirty(e.map.addr.target.index());
            if !e.convert {
                continue;
            }
            recs.push(piece_record(
                bs,
                ino,
                &e.map,
                e.pos,
                e.len,
                ExtentState::Written,
            ));
        }
        let mut a = inode(&m, ino)?.attrs.clone();
        if end > a.size {
            a.size = end;
            if m.isize_of(ino).is_some_and(|s| s <= end) {
                m.set_isize(ino, None);
            }
            m.mark_data(ino);
            recs.push(Record::InodeSet(a));
        }
        self.log_remapped(&mut m, ino, recs)
    }

    pub(crate) fn touch_mtime(&self, ino: Ino) -> Result<()> {
        let mut m = self.inner.meta.lock();
        match data_times(&mut m, ino)? {
            Some(a) => self.inner.log_all(&mut m, vec![Record::InodeSet(a)]),
            None => Ok(()),
        }
    }

    /// EOF zeroing before the size grows to `to` (a write starting past EOF, an extending
    /// truncate or fallocate): whatever the cache holds past the old EOF, and whatever a
    /// crash may have left there on disk, must read zero (I-004-7). Returns whether there
    /// was a gap to zero. The caller holds the inode lock exclusively.
    pub(crate) fn zero_eof_to(&self, mapper: &FileMapper<'_>, to: u64) -> Result<bool> {
        let size = mapper.size();
        if to <= size {
            return Ok(false);
        }
        let fc = self.inner.file_cache(mapper.ino);
        stripefs_iomap::zero_range(
            &self.inner.cache,
            mapper,
            &fc,
            size,
            to - size,
            self.inner.opts.eof_zeroing,
        )?;
        Ok(true)
    }
}

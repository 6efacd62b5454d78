//! The direct-I/O engine (Linux's `__iomap_dio_rw`): the lifecycle of one direct read or
//! write, written once for both the waiting and the callback form.
//!
//! What the engine does, in order:
//! 1. coherence with the page cache: dirty cache over the range is written back (a read
//!    sees it; a write is not overwritten by it later) and, for a write, dropped;
//! 2. in-flight accounting ([`DioCount`], Linux's `inode_dio_begin`), which the file
//!    system's exclusive operations drain;
//! 3. fan-out: one device I/O per mapping piece ([`iterate`]), every piece of a window
//!    submitted before one wait (I-003-1), or, with [`DioSubmit::Serial`], one piece at a
//!    time, reads and writes alike (a mapping error the file system calls "short" after
//!    progress ends a write there: a contiguous short write, I-003-3);
//! 4. one completion fan-in: the first error wins; on success the file system records the
//!    write ([`DioEndIo::write_done`]), on failure it is told which pieces will never be
//!    recorded ([`DioEndIo::write_failed`]); buffers go back, the in-flight count drops, and for
//!    writes the clean cache over the range is dropped (a buffered reader may have cached
//!    old bytes meanwhile); then the caller's answer. A read's pieces are copied into the
//!    caller's buffer as each completes, so the copy overlaps the transfers still in
//!    flight: by the thread that waits for the window (`Batch::wait_each`), or, for the
//!    callback form's last window, by the completion threads one at a time
//!    (`Batch::finish_each`); the fan-in then only answers.
//!
//! The waiting form is the callback form whose last window is waited for on the calling
//! thread instead of completing on a target's completion thread: the same fan-out and the
//! same fan-in. Requests larger than [`DIO_WINDOW_BYTES`] go window by window (bounce
//! buffers bounded, I-003-7); every window but the last is waited for where it was
//! submitted.
//!
//! What stays with the file system (as in Linux, where XFS and ext4 differ on it):
//! alignment, the inode lock and its decision, draining, EOF zeroing, space reservation
//! ([`DioOps::prepare_write`]) and recording completions.
//!
//! I/O construction: a written mapping gets exactly the sectors of the write (no
//! read-modify-write, which is what makes a shared-lock overwrite safe); a new or
//! unwritten mapping gets whole blocks, the bytes around the data zeroed, so no stale byte
//! can ever become visible when the blocks are recorded written.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use stripefs_target::{Batch, BufPool, IoDone, TargetError};

use crate::cache::PageCache;
use crate::writeback::{writeback, WbWait};
use crate::zero::invalidate_range;
use crate::{iterate, CacheIo, IoDir, Iomap, IomapOp, IterError};

/// Most bytes of one direct I/O in flight at once (bounce buffers included).
pub const DIO_WINDOW_BYTES: u64 = 64 << 20;

/// How a direct read or write submits its pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DioSubmit {
    /// Submit every piece of a window, then wait once (Lustre LU-13798).
    #[default]
    Parallel,
    /// Submit one piece and wait before the next.
    Serial,
}

/// Direct I/Os of one file started and not finished, completion work included (Linux's
/// `i_dio_count`).
#[derive(Debug, Default)]
pub struct DioCount {
    n: Mutex<u64>,
    idle: Condvar,
}

impl DioCount {
    /// A direct I/O starts (the caller holds the inode lock, shared or exclusive).
    pub fn begin(&self) {
        *self.n.lock() += 1;
    }

    /// Whether no direct I/O is in flight.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        *self.n.lock() == 0
    }

    /// A direct I/O finished, completion work included.
    pub fn end(&self) {
        let mut n = self.n.lock();
        debug_assert!(*n > 0, "direct I/O count goes negative");
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until no direct I/O is in flight (`inode_dio_wait`). Proves something only
    /// while the caller holds the inode lock exclusively, which stops new direct I/O
    /// (I-000-5).
    pub fn drain(&self) {
        let mut n = self.n.lock();
        while *n != 0 {
            self.idle.wait(&mut n);
        }
    }
}

/// A piece of a direct write, for completion processing.
#[derive(Debug, Clone, Copy)]
pub struct DioPiece<A> {
    pub map: Iomap<A>,
    /// Device-write start and length (whole blocks for new/unwritten mappings).
    pub pos: u64,
    pub len: u64,
    /// The blocks must be recorded written at completion (new or unwritten).
    pub convert: bool,
}

/// The file system's side of a direct I/O, at submission (borrowed for the call).
pub trait DioOps: CacheIo {
    /// The completion side: owned, it runs where the last piece completes.
    type End: DioEndIo<Self::Addr, Error = Self::Error>;

    /// The completion side of this request.
    fn end_io(&self) -> Self::End;

    /// Called once per write, after coherence and before any piece is submitted: reserve
    /// what the write may allocate, and say how to submit (serial when the space could
    /// not be reserved: the write then ends short where it runs out).
    ///
    /// # Errors
    /// The file system's error.
    fn prepare_write(&self, pos: u64, len: u64) -> Result<DioSubmit, Self::Error>;

    /// How a direct read submits its pieces: every piece of a window before one wait, or
    /// one piece at a time.
    fn read_submit(&self) -> DioSubmit;

    /// True when this mapping error, met by a serial write after some bytes were written,
    /// ends the write short rather than failing it (out of space).
    fn ends_short(&self, e: &Self::Error) -> bool;

    /// The file system's block size: new and unwritten mappings are written in whole
    /// blocks, zero-padded.
    fn block_bytes(&self) -> u64;
}

/// The file system's side of a direct I/O at completion (Linux's `iomap_dio_ops`), owned
/// so that it can run on a target's completion thread.
pub trait DioEndIo<A>: Send + 'static {
    /// The file system's error type.
    type Error: Send + 'static;

    /// The page cache and this file's key in it.
    fn page_cache(&self) -> (&PageCache, u64);
    /// The file's in-flight direct-I/O count.
    fn in_flight(&self) -> &DioCount;
    /// Recycled I/O buffers.
    fn buffers(&self) -> &BufPool;
    /// Converts a device error.
    fn io_error(&self, e: TargetError) -> Self::Error;
    /// Every piece of a write completed: record `pieces` (those with `convert` become
    /// written) and grow the size to `end` if it passed EOF.
    ///
    /// # Errors
    /// The file system's error.
    fn write_done(&self, pieces: &[DioPiece<A>], end: u64) -> Result<(), Self::Error>;
    /// A write failed, or its recording did: nothing more of `pieces` will be recorded
    /// (`write_done` may have recorded some before failing). Called once per failed
    /// piece, at its failure when the write goes one piece at a time (before its mapping
    /// ends and gives back what it allocated), and once at completion for every other
    /// piece submitted, before the call answers. The file system forgets what it keeps
    /// for their recording (the engine knows nothing of it).
    fn write_failed(&self, pieces: &[DioPiece<A>]);
    /// Pieces submitted to the targets (statistics).
    fn submitted(&self, _pieces: u64) {}
    /// A direct read's piece of `bytes` was copied into the caller's buffer (statistics).
    fn read_copied(&self, _bytes: u64) {}
}

type EndErr<O> = <O as crate::IomapOps>::Error;

/// Starts a direct write of `data` at `pos`; `done` gets the bytes written (fewer only
/// when a serial write ran out of space) or the error, exactly once: on a target's
/// completion thread, or on this thread before returning when a window or a piece had to
/// be waited for here or nothing could start. `data` is copied before this returns.
pub fn dio_write<O, F>(ops: &O, pos: u64, data: &[u8], done: F)
where
    O: DioOps,
    O::Addr: Send + 'static,
    O::Error: Send + 'static,
    F: FnOnce(Result<usize, EndErr<O>>) + Send + 'static,
{
    let end = ops.end_io();
    match write_fan_out(ops, &end, pos, data) {
        Fanned::Pending(run, batch) => {
            batch.finish_with(move |last| done(write_fan_in(&end, pos, run, last)));
        }
        Fanned::Waited(run) => done(write_fan_in(&end, pos, run, Vec::new())),
        Fanned::NotStarted(e) => done(Err(e)),
    }
}

/// [`dio_write`], waiting for the result on this thread.
///
/// # Errors
/// As the answer of [`dio_write`].
pub fn dio_write_wait<O: DioOps>(ops: &O, pos: u64, data: &[u8]) -> Result<usize, EndErr<O>> {
    let end = ops.end_io();
    match write_fan_out(ops, &end, pos, data) {
        Fanned::Pending(run, batch) => {
            let last = batch.wait();
            write_fan_in(&end, pos, run, last)
        }
        Fanned::Waited(run) => write_fan_in(&end, pos, run, Vec::new()),
        Fanned::NotStarted(e) => Err(e),
    }
}

/// A write in progress: the pieces submitted so far, the bytes they cover, the request's
/// length and the first error.
struct WriteRun<A, E> {
    pieces: Vec<DioPiece<A>>,
    written: u64,
    len: u64,
    error: Option<E>,
}

/// Where a fan-out left the request.
enum Fanned<R, E> {
    /// The last window's pieces are in flight on this batch.
    Pending(R, Batch),
    /// Everything has completed (waited for here).
    Waited(R),
    /// Refused before anything was in flight (nothing to complete).
    NotStarted(E),
}

/// Coherence, in-flight accounting and every window's submission; every window but the
/// last is waited for here.
fn write_fan_out<O: DioOps>(
    ops: &O,
    end: &O::End,
    pos: u64,
    data: &[u8],
) -> Fanned<WriteRun<O::Addr, O::Error>, O::Error> {
    let len = data.len() as u64;
    let submit = match coherent(ops, end, pos, len, Coherence::WriteBackAndDrop)
        .and_then(|()| ops.prepare_write(pos, len))
    {
        Ok(s) => s,
        Err(e) => return Fanned::NotStarted(e),
    };
    end.in_flight().begin();
    let mut run = WriteRun {
        pieces: Vec::new(),
        written: 0,
        len,
        error: None,
    };
    if submit == DioSubmit::Serial {
        write_serial(ops, end, pos, data, &mut run);
        return Fanned::Waited(run);
    }
    let windows = len.div_ceil(DIO_WINDOW_BYTES);
    for w in 0..windows {
        let at = pos + w * DIO_WINDOW_BYTES;
        let n = (pos + len - at).min(DIO_WINDOW_BYTES);
        let batch = Batch::new();
        let walked = iterate(ops, at, n, IomapOp::Write, |map, p, k| {
            let src = &data[(p - pos) as usize..(p - pos + k) as usize];
            run.pieces
                .push(submit_write_piece(ops, &batch, map, p, src));
            Ok(k)
        });
        end.submitted(batch.submitted() as u64);
        match walked {
            Ok(k) => run.written += k,
            Err(e) => run.error = Some(e.into_parts(|m| ops.contract_error(m)).1),
        }
        if w + 1 == windows && run.error.is_none() {
            return Fanned::Pending(run, batch);
        }
        let ios = batch.wait();
        if let Err(e) = first_error(end, &ios) {
            run.error.get_or_insert(e);
        }
        end.buffers().put_all(ios.into_iter().flat_map(|d| d.bufs));
        if run.error.is_some() {
            break;
        }
    }
    Fanned::Waited(run)
}

/// One piece at a time: submit, wait, next. A mapping error the file system calls short,
/// after progress, ends the write there (contiguous, never a gap).
fn write_serial<O: DioOps>(
    ops: &O,
    end: &O::End,
    pos: u64,
    data: &[u8],
    run: &mut WriteRun<O::Addr, O::Error>,
) {
    let walked = iterate(ops, pos, run.len, IomapOp::Write, |map, p, k| {
        let batch = Batch::new();
        let src = &data[(p - pos) as usize..(p - pos + k) as usize];
        let piece = submit_write_piece(ops, &batch, map, p, src);
        end.submitted(1);
        let ios = batch.wait();
        let r = first_error(end, &ios);
        end.buffers().put_all(ios.into_iter().flat_map(|d| d.bufs));
        if r.is_err() {
            // Now, while its mapping still holds what it allocated: the error ends the
            // mapping, which gives that back for any writer to take.
            end.write_failed(&[piece]);
        }
        r.map(|()| {
            run.pieces.push(piece);
            k
        })
    });
    match walked {
        Ok(k) => run.written = k,
        Err(IterError::Failed { done, error }) if done > 0 && ops.ends_short(&error) => {
            run.written = done;
        }
        Err(e) => run.error = Some(e.into_parts(|m| ops.contract_error(m)).1),
    }
}

/// The one completion of a write: first error, recording, buffers, accounting, cache.
fn write_fan_in<A, E, D: DioEndIo<A, Error = E>>(
    end: &D,
    pos: u64,
    run: WriteRun<A, E>,
    last: Vec<IoDone>,
) -> Result<usize, E> {
    let len = run.len;
    let mut r = match run.error {
        Some(e) => Err(e),
        None => first_error(end, &last),
    };
    end.buffers().put_all(last.into_iter().flat_map(|d| d.bufs));
    if r.is_ok() {
        debug_assert!(run.written <= len, "wrote more than asked");
        r = end.write_done(&run.pieces, pos + run.written);
    }
    if r.is_err() {
        end.write_failed(&run.pieces);
    }
    end.in_flight().end();
    let (cache, key) = end.page_cache();
    if let Some(fc) = cache.existing(key) {
        cache.drop_clean(&fc, pos, pos + len);
    }
    r.map(|()| run.written as usize)
}

/// Starts a direct read of up to `len` bytes at `pos` (`pos` and `len` multiples of
/// `align`, the file system's direct-I/O unit); `done` gets the bytes read (fewer at EOF)
/// exactly once, on a target's completion thread or, when nothing needs reading, the read
/// could not start or an earlier window had to be waited for, on this thread.
pub fn dio_read<O, F>(ops: &O, pos: u64, len: usize, align: u64, done: F)
where
    O: DioOps,
    O::Error: Send + 'static,
    F: FnOnce(Result<Vec<u8>, EndErr<O>>) + Send + 'static,
{
    let end = ops.end_io();
    let mut buf = vec![0u8; len];
    match read_fan_out(ops, &end, pos, &mut buf, align) {
        Fanned::Pending(mut run, batch) => {
            let pieces = std::mem::take(&mut run.pieces);
            let copy = PieceCopy::new(&pieces, &mut buf);
            batch.finish_each(
                (end, copy, buf),
                |(end, copy, buf), slot, d| copy.piece(end, buf, slot, d),
                move |(end, copy, mut buf)| {
                    let r = read_fan_in(&end, run, copy.result).map(|n| {
                        buf.truncate(n);
                        buf
                    });
                    done(r);
                },
            );
        }
        Fanned::Waited(run) => done(read_fan_in(&end, run, Ok(())).map(|n| {
            buf.truncate(n);
            buf
        })),
        Fanned::NotStarted(e) => done(Err(e)),
    }
}

/// [`dio_read`] into `buf`, waiting on this thread.
///
/// # Errors
/// As the answer of [`dio_read`].
pub fn dio_read_wait<O: DioOps>(
    ops: &O,
    pos: u64,
    buf: &mut [u8],
    align: u64,
) -> Result<usize, EndErr<O>> {
    let end = ops.end_io();
    match read_fan_out(ops, &end, pos, buf, align) {
        Fanned::Pending(run, batch) => {
            let copied = copy_each(&end, &run.pieces, batch, buf);
            read_fan_in(&end, run, copied)
        }
        Fanned::Waited(run) => read_fan_in(&end, run, Ok(())),
        Fanned::NotStarted(e) => Err(e),
    }
}

/// A read in progress: the last window's pieces (completion slot or zeros, offset in the
/// caller's buffer, length), the bytes before EOF, whether it is in flight, the first error.
struct ReadRun<E> {
    pieces: Vec<(Option<usize>, usize, usize)>,
    bytes: usize,
    started: bool,
    error: Option<E>,
}

/// Coherence, EOF clipping, in-flight accounting and every window's submission; every
/// window but the last is waited for (and copied into `buf`) here.
fn read_fan_out<O: DioOps>(
    ops: &O,
    end: &O::End,
    pos: u64,
    buf: &mut [u8],
    align: u64,
) -> Fanned<ReadRun<O::Error>, O::Error> {
    debug_assert!(pos.is_multiple_of(align) && (buf.len() as u64).is_multiple_of(align));
    if let Err(e) = coherent(ops, end, pos, buf.len() as u64, Coherence::WriteBack) {
        return Fanned::NotStarted(e);
    }
    let size = ops.size();
    let mut run = ReadRun {
        pieces: Vec::new(),
        bytes: 0,
        started: false,
        error: None,
    };
    if pos >= size || buf.is_empty() {
        return Fanned::Waited(run);
    }
    let n = (buf.len() as u64).min(size - pos);
    // The EOF sector is read whole; the caller gets the bytes before EOF.
    let span = n.next_multiple_of(align).min(buf.len() as u64);
    run.bytes = n as usize;
    run.started = true;
    end.in_flight().begin();
    if ops.read_submit() == DioSubmit::Serial {
        read_serial(ops, end, pos, span, buf, &mut run);
        return Fanned::Waited(run);
    }
    let windows = span.div_ceil(DIO_WINDOW_BYTES);
    for w in 0..windows {
        let at = pos + w * DIO_WINDOW_BYTES;
        let k = (pos + span - at).min(DIO_WINDOW_BYTES);
        let batch = Batch::new();
        run.pieces.clear();
        let walked = iterate(ops, at, k, IomapOp::Read, |map, p, m| {
            let slot = map.is_written().then(|| {
                ops.submit(
                    &batch,
                    map,
                    p,
                    IoDir::Read,
                    vec![ops.buffers().get(m as usize)],
                )
            });
            run.pieces.push((slot, (p - pos) as usize, m as usize));
            Ok(m)
        });
        if let Err(e) = walked {
            run.error = Some(e.into_parts(|m| ops.contract_error(m)).1);
        }
        if w + 1 == windows && run.error.is_none() {
            return Fanned::Pending(run, batch);
        }
        if let Err(e) = copy_each(end, &run.pieces, batch, buf) {
            run.error.get_or_insert(e);
        }
        run.pieces.clear();
        if run.error.is_some() {
            break;
        }
    }
    Fanned::Waited(run)
}

/// One piece at a time: submit, wait, copy into `buf`, next.
fn read_serial<O: DioOps>(
    ops: &O,
    end: &O::End,
    pos: u64,
    span: u64,
    buf: &mut [u8],
    run: &mut ReadRun<O::Error>,
) {
    let walked = iterate(ops, pos, span, IomapOp::Read, |map, p, m| {
        let batch = Batch::new();
        let slot = map.is_written().then(|| {
            ops.submit(
                &batch,
                map,
                p,
                IoDir::Read,
                vec![ops.buffers().get(m as usize)],
            )
        });
        let piece = [(slot, (p - pos) as usize, m as usize)];
        copy_out(end, &piece, batch.wait(), buf).map(|()| m)
    });
    if let Err(e) = walked {
        run.error = Some(e.into_parts(|m| ops.contract_error(m)).1);
    }
}

/// The one completion of a read, once the last window's bytes are copied (`copied`, the
/// first device error if any): accounting, the answer.
fn read_fan_in<E, A, D: DioEndIo<A, Error = E>>(
    end: &D,
    run: ReadRun<E>,
    copied: Result<(), E>,
) -> Result<usize, E> {
    if run.started {
        end.in_flight().end();
    }
    match run.error {
        Some(e) => Err(e),
        None => copied.map(|()| run.bytes),
    }
}

/// Waits for one window's pieces and copies each into its own part of `buf` as its
/// completion arrives (zeros where nothing was read, at once), so the copy overlaps the
/// transfers still in flight; buffers go back as each piece is copied. The first device
/// error if any: after it nothing more is copied (the read fails whole).
fn copy_each<A, E, D: DioEndIo<A, Error = E>>(
    end: &D,
    pieces: &[(Option<usize>, usize, usize)],
    batch: Batch,
    buf: &mut [u8],
) -> Result<(), E> {
    let mut copy = PieceCopy::new(pieces, buf);
    batch.wait_each(|slot, d| copy.piece(end, buf, slot, d));
    copy.result
}

/// Copies a window's read pieces into their own ranges of the caller's buffer, one
/// completion at a time, in any order; the first device error.
struct PieceCopy<E> {
    /// Per completion slot: offset in the caller's buffer and length.
    by_slot: Vec<(usize, usize)>,
    result: Result<(), E>,
}

impl<E> PieceCopy<E> {
    /// Zero-fills the pieces nothing is read for (holes, unwritten) at once.
    fn new(pieces: &[(Option<usize>, usize, usize)], buf: &mut [u8]) -> Self {
        let mut by_slot = Vec::with_capacity(pieces.len());
        for &(slot, at, n) in pieces {
            match slot {
                Some(s) => {
                    debug_assert_eq!(s, by_slot.len(), "pieces are in slot order");
                    by_slot.push((at, n));
                }
                None => buf[at..at + n].fill(0),
            }
        }
        Self {
            by_slot,
            result: Ok(()),
        }
    }

    /// Piece `slot` completed: its bytes into its range of `buf` (nothing after an
    /// error: the read fails whole), its buffer back to the pool.
    fn piece<A, D: DioEndIo<A, Error = E>>(
        &mut self,
        end: &D,
        buf: &mut [u8],
        slot: usize,
        d: IoDone,
    ) {
        match (&self.result, d.result) {
            (Ok(()), Ok(())) => {
                let (at, n) = self.by_slot[slot];
                buf[at..at + n].copy_from_slice(&d.bufs[0][..n]);
                end.read_copied(n as u64);
            }
            (Ok(()), Err(e)) => self.result = Err(end.io_error(e)),
            (Err(_), _) => {}
        }
        end.buffers().put_all(d.bufs);
    }
}

/// Copies completed read pieces into `buf` (zeros where nothing was read); the first
/// device error if any.
fn copy_out<A, E, D: DioEndIo<A, Error = E>>(
    end: &D,
    pieces: &[(Option<usize>, usize, usize)],
    ios: Vec<IoDone>,
    buf: &mut [u8],
) -> Result<(), E> {
    let r = first_error(end, &ios);
    if r.is_ok() {
        for &(slot, at, n) in pieces {
            match slot {
                Some(s) => {
                    buf[at..at + n].copy_from_slice(&ios[s].bufs[0][..n]);
                    end.read_copied(n as u64);
                }
                None => buf[at..at + n].fill(0),
            }
        }
    }
    end.buffers().put_all(ios.into_iter().flat_map(|d| d.bufs));
    r
}

/// How a direct I/O makes the page cache coherent before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coherence {
    /// Reads: dirty cache over the range reaches the device first.
    WriteBack,
    /// Writes: and the cached range is dropped, so later writeback cannot overwrite the
    /// direct write and readers do not see old bytes.
    WriteBackAndDrop,
}

fn coherent<O: DioOps>(
    ops: &O,
    end: &O::End,
    pos: u64,
    len: u64,
    how: Coherence,
) -> Result<(), O::Error> {
    let (cache, key) = end.page_cache();
    let Some(fc) = cache.existing(key) else {
        return Ok(());
    };
    let fb = u64::from(cache.config().folio_bytes);
    let (a, b) = (pos / fb * fb, (pos + len).div_ceil(fb) * fb);
    writeback(cache, ops, &fc, a, b, WbWait::Busy)?;
    if how == Coherence::WriteBackAndDrop {
        invalidate_range(cache, &fc, a, b);
    }
    Ok(())
}

fn first_error<A, E, D: DioEndIo<A, Error = E>>(end: &D, ios: &[IoDone]) -> Result<(), E> {
    match ios.iter().find_map(|d| d.result.clone().err()) {
        Some(e) => Err(end.io_error(e)),
        None => Ok(()),
    }
}

/// Builds and submits the write of `data` (file position `p`) inside mapping `map`.
fn submit_write_piece<O: DioOps>(
    ops: &O,
    batch: &Batch,
    map: &Iomap<O::Addr>,
    p: u64,
    data: &[u8],
) -> DioPiece<O::Addr> {
    let block = ops.block_bytes();
    let written = map.is_written();
    let (start, end) = if written {
        (p, p + data.len() as u64)
    } else {
        (
            p / block * block,
            (p + data.len() as u64).div_ceil(block) * block,
        )
    };
    debug_assert!(
        map.offset <= start && end <= map.end(),
        "piece inside its mapping"
    );
    let mut buf = ops.buffers().get((end - start) as usize);
    let head = (p - start) as usize;
    let tail = head + data.len();
    buf[..head].fill(0);
    buf[head..tail].copy_from_slice(data);
    buf[tail..].fill(0);
    ops.submit(batch, map, start, IoDir::Write, vec![buf]);
    DioPiece {
        map: *map,
        pos: start,
        len: end - start,
        convert: !written,
    }
}

/// A request's result delivered to a waiting thread (the callback forms' answer turned
/// into a return value).
#[derive(Debug)]
pub struct Answer<T> {
    slot: Mutex<Option<T>>,
    cv: Condvar,
}

impl<T> Default for Answer<T> {
    fn default() -> Self {
        Self {
            slot: Mutex::new(None),
            cv: Condvar::new(),
        }
    }
}

impl<T> Answer<T> {
    /// Delivers the answer.
    pub fn put(&self, v: T) {
        *self.slot.lock() = Some(v);
        self.cv.notify_all();
    }

    /// Waits for the answer.
    pub fn wait(self: Arc<Self>) -> T {
        let mut g = self.slot.lock();
        loop {
            if let Some(v) = g.take() {
                return v;
            }
            self.cv.wait(&mut g);
        }
    }
}

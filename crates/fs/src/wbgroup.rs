//! Multi-file writeback (`wb_batch = files`, the default): the flusher, `sync` and
//! unmount write back many small dirty files as one group instead of one file per device
//! round trip (issue 15, small files).
//!
//! A group is up to [`GROUP_FILES`] files of at most [`SMALL_FILE_BYTES`] cached each, and
//! at most [`GROUP_BYTES`] in all, taken in ascending inode order. For each file in turn
//! the page cache takes its dirty blocks and maps them (`iomap::writeback_start`); the
//! delayed allocations of the whole group are placed from one allocation cursor per
//! target, so consecutive files land in consecutive blocks (the cursor starts in the
//! first free range of at least [`GROUP_CHUNK_BYTES`], not in the first hole). Their writes are not issued
//! one by one: the mappers queue them in a [`WbPlug`] (Linux's block plug idea), which
//! then sorts them by target and address, merges neighbours into one vectored write, and
//! submits them all into one batch that is waited for once. Each file is then settled on
//! its own (`iomap::writeback_finish`): its pieces recorded in the running transaction, or
//! on failure its placed blocks freed and the error entered in its own error sequence.
//!
//! Errors stay with their file: a merged write that fails is retried piece by piece, each
//! piece alone, and a piece that fails again charges the error to its own file only (the
//! others' pieces were written by the retry). When no piece fails again, the error cannot
//! be put on one file and every file of the merged write gets it: an error is never
//! dropped because a retry succeeded (decision 48). Ordered data is unchanged: the
//! records are logged only after the writes completed, and the commit carrying them
//! flushes the data targets first.
//!
//! `wb_batch = single` brings back one file at a time (`Fs::writeback_file` per file).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use stripefs_core::alloc::Allocator;
use stripefs_core::{Ino, TargetId};
use stripefs_iomap::cache::FileCache;
use stripefs_iomap::{self as iomap, WbStart, WbStarted, WbWait};
use stripefs_target::{Batch, IoBuf, IoOp, TargetError};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::mapping::FileMapper;

/// Files with more than this cached are written back alone (`iomap::writeback`).
pub(crate) const SMALL_FILE_BYTES: u64 = 1 << 20;
/// Most files in one group.
pub(crate) const GROUP_FILES: usize = 1024;
/// Most cached bytes of the files of one group.
pub(crate) const GROUP_BYTES: u64 = 32 << 20;
/// Most buffers merged into one vectored write (below the kernel's `UIO_MAXIOV`).
const MERGE_BUFS: usize = 256;
/// Most bytes merged into one write.
const MERGE_BYTES: u64 = 8 << 20;
/// A group's first allocation on a target starts in a free range of at least this much.
pub(crate) const GROUP_CHUNK_BYTES: u64 = 2 << 20;

/// How the flusher, `sync` and unmount write dirty files back (mount option `wb_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WbBatch {
    /// Many small files per device round trip, allocated adjacently, writes merged.
    #[default]
    Files,
    /// One file after the other, each waited for (the behaviour before issue 15's
    /// multi-file writeback).
    Single,
}

/// A write queued by a mapper of the group (one mapping piece: one or more buffers,
/// e.g. windows of neighbouring folios).
#[derive(Debug)]
struct Piece {
    target: TargetId,
    offset: u64,
    bufs: Vec<IoBuf>,
    /// Index of the file in the group.
    file: usize,
}

impl Piece {
    fn len(&self) -> u64 {
        self.bufs.iter().map(|b| b.len() as u64).sum()
    }
}

/// Where a piece sits in a (possibly merged) write: its file, address and buffer count.
#[derive(Debug, Clone, Copy)]
struct PieceAt {
    file: usize,
    offset: u64,
    bufs: usize,
}

/// What a submitted write carries: its target and its pieces, in buffer order.
type Carried = (TargetId, Vec<PieceAt>);

/// The group's queue of writes and its allocation cursor. Single-threaded (the group runs
/// on one thread; mappers are not shared).
#[derive(Debug, Default)]
pub(crate) struct WbPlug {
    pieces: RefCell<Vec<Piece>>,
    /// Per target: the physical block after the group's last allocation there.
    cursor: RefCell<HashMap<TargetId, u64>>,
    /// The file whose writes are being queued.
    file: std::cell::Cell<usize>,
}

impl WbPlug {
    /// Queues a write of the current file.
    pub fn push(&self, target: TargetId, offset: u64, bufs: Vec<IoBuf>) {
        self.pieces.borrow_mut().push(Piece {
            target,
            offset,
            bufs,
            file: self.file.get(),
        });
    }

    /// Where the next allocation on `target` should start: right after the group's last
    /// there; for the group's first, at the first free range of at least `chunk` blocks
    /// (so a group on aged space is not scattered over the holes freed files left, each a
    /// write of its own; ext4's locality groups take such a chunk for small files).
    pub fn goal(&self, target: TargetId, alloc: &Allocator, chunk: u64) -> Option<u64> {
        let cursor = self.cursor.borrow().get(&target).copied();
        cursor.or_else(|| alloc.first_range_at_least(target, chunk))
    }

    /// An allocation on `target` ended at physical block `end`.
    pub fn allocated(&self, target: TargetId, end: u64) {
        self.cursor.borrow_mut().insert(target, end);
    }

    /// Sorts the queued writes by target and address, merges neighbours and submits them
    /// into `batch`; returns what each submission slot carries.
    fn submit(&self, fs: &Fs, batch: &Batch) -> Vec<Carried> {
        let mut pieces = std::mem::take(&mut *self.pieces.borrow_mut());
        pieces.sort_by_key(|p| (p.target, p.offset));
        let mut slots = Vec::new();
        let mut it = pieces.into_iter().peekable();
        while let Some(first) = it.next() {
            let (target, offset) = (first.target, first.offset);
            let mut end = offset + first.len();
            let mut carried = vec![PieceAt {
                file: first.file,
                offset,
                bufs: first.bufs.len(),
            }];
            let mut bufs = first.bufs;
            while let Some(next) = it.next_if(|p| {
                p.target == target
                    && p.offset == end
                    && bufs.len() + p.bufs.len() <= MERGE_BUFS
                    && end + p.len() - offset <= MERGE_BYTES
            }) {
                carried.push(PieceAt {
                    file: next.file,
                    offset: next.offset,
                    bufs: next.bufs.len(),
                });
                end += next.len();
                bufs.extend(next.bufs);
            }
            let t = fs.inner.targets[target.index()].as_ref();
            let slot = batch.submit(t, IoOp::Write { offset, bufs });
            debug_assert_eq!(slot, slots.len(), "one slot per submitted write");
            slots.push((target, carried));
        }
        slots
    }
}

/// A file of the group, started.
struct Member<'a> {
    ino: Ino,
    fc: Arc<FileCache>,
    mapper: FileMapper<'a>,
    started: WbStarted<FileMapper<'a>>,
}

impl Fs {
    /// Writes back `files` (ascending) in groups; files too large for a group are written
    /// back alone. Returns the first error; every error is also in its file's error
    /// sequence.
    pub(crate) fn writeback_files_grouped(&self, files: &[Ino], wait: WbWait) -> Result<()> {
        let mut first = None;
        let mut rest = files;
        while !rest.is_empty() {
            let (taken, r) = self.writeback_group(rest, wait);
            rest = &rest[taken..];
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Writes back one group from the front of `files`; returns how many files it took
    /// and the first error.
    fn writeback_group(&self, files: &[Ino], wait: WbWait) -> (usize, Result<()>) {
        let plug = WbPlug::default();
        let batch = Batch::new();
        let mut members: Vec<Member<'_>> = Vec::new();
        let mut first: Option<FsError> = None;
        let mut bytes = 0;
        let mut taken = 0;
        for &ino in files {
            if members.len() >= GROUP_FILES || bytes >= GROUP_BYTES {
                break;
            }
            taken += 1;
            let taken_before = members.len();
            let r = match self.inner.cache.existing(ino.0) {
                Some(fc) => self.start_member(&plug, &batch, ino, fc, wait, &mut members),
                None => self.settle_size(ino, &self.inner.file_cache(ino)),
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
            bytes += members.get(taken_before).map_or(0, |m| m.started.bytes());
        }
        let slots = plug.submit(self, &batch);
        if !members.is_empty() {
            let inner = &self.inner;
            inner.wb_groups.fetch_add(1, Ordering::Relaxed);
            inner
                .wb_group_files
                .fetch_add(members.len() as u64, Ordering::Relaxed);
            inner
                .wb_group_writes
                .fetch_add(slots.len() as u64, Ordering::Relaxed);
        }
        let errors = self.attribute(batch.wait(), &slots, members.len());
        for (m, io) in members.into_iter().zip(errors) {
            let r = iomap::writeback_finish(&self.inner.cache, &m.mapper, &m.fc, m.started, io)
                .map(|_| ())
                .and_then(|()| self.settle_size(m.ino, &m.fc));
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        (taken, first.map_or(Ok(()), Err))
    }

    /// Starts the writeback of one file of a group (a large file is written back alone,
    /// at once).
    fn start_member<'a>(
        &'a self,
        plug: &'a WbPlug,
        batch: &Batch,
        ino: Ino,
        fc: Arc<FileCache>,
        wait: WbWait,
        members: &mut Vec<Member<'a>>,
    ) -> Result<()> {
        let mapper = match FileMapper::new(self, ino) {
            Ok(m) => m.with_plug(plug),
            Err(FsError::Stale(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        plug.file.set(members.len());
        match iomap::writeback_start(
            &self.inner.cache,
            &mapper,
            &fc,
            wait,
            SMALL_FILE_BYTES,
            batch,
        ) {
            WbStart::Started(started) => {
                members.push(Member {
                    ino,
                    fc,
                    mapper,
                    started,
                });
                Ok(())
            }
            WbStart::Clean => self.settle_size(ino, &fc),
            WbStart::TooLarge => {
                drop(mapper);
                self.writeback_file(ino, wait)
            }
        }
    }

    /// The device error of each of `n` files from the group's completions. A failed write
    /// that carried pieces of several files is retried piece by piece, each alone: a
    /// piece that fails again charges its error to its own file only, and the others,
    /// written now, are not charged. If no piece fails again, the error cannot be put on
    /// one file and is charged to every file of the merged write (reported, never
    /// dropped). Returns the buffers to the pool.
    fn attribute(
        &self,
        done: Vec<stripefs_target::IoDone>,
        slots: &[Carried],
        n: usize,
    ) -> Vec<Option<TargetError>> {
        let mut errors: Vec<Option<TargetError>> = vec![None; n];
        for (d, (target, carried)) in done.into_iter().zip(slots) {
            match d.result {
                Ok(()) => self.inner.bufs.put_all(d.bufs),
                Err(e) if carried.len() == 1 => {
                    errors[carried[0].file].get_or_insert(e);
                    self.inner.bufs.put_all(d.bufs);
                }
                Err(e) => {
                    let again = self.retry_pieces(*target, carried, d.bufs);
                    let charged = again.iter().any(Option::is_some);
                    for (at, r) in carried.iter().zip(again) {
                        let r = if charged { r } else { Some(e.clone()) };
                        if let Some(r) = r {
                            errors[at.file].get_or_insert(r);
                        }
                    }
                }
            }
        }
        errors
    }

    /// Writes each piece of a failed merged write alone (all submitted, one wait);
    /// returns each piece's result, in order.
    fn retry_pieces(
        &self,
        target: TargetId,
        carried: &[PieceAt],
        bufs: Vec<IoBuf>,
    ) -> Vec<Option<TargetError>> {
        debug_assert_eq!(
            carried.iter().map(|a| a.bufs).sum::<usize>(),
            bufs.len(),
            "a failed write gives back the buffers it was given"
        );
        let t = self.inner.targets[target.index()].as_ref();
        let again = Batch::new();
        let mut bufs = bufs.into_iter();
        for at in carried {
            let piece: Vec<IoBuf> = bufs.by_ref().take(at.bufs).collect();
            again.submit(
                t,
                IoOp::Write {
                    offset: at.offset,
                    bufs: piece,
                },
            );
        }
        again
            .wait()
            .into_iter()
            .map(|d| {
                self.inner.bufs.put_all(d.bufs);
                d.result.err()
            })
            .collect()
    }
}

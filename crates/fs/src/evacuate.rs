//! Online evacuation of a target: every block on it moved to the others while the file
//! system stays mounted and busy, so that the disk can be retired (issue 13; seed 001's
//! read-only block group, I-001-3; `docs/design/reflink.md`, "Evacuation").
//!
//! 1. [`Fs::evacuate_begin`]: the target goes read-only (`placement.rs`: no new block,
//!    reservation or metadata page goes there, and no write is admitted in place there
//!    any more); the in-place writers admitted before wait to drain; everything dirty is
//!    written back (delayed allocations reserved there take blocks elsewhere).
//! 2. [`Fs::evacuate_step`], repeated: inode by inode, the file's extents on the target
//!    are moved by copy on write. Under the file's I/O lock, held exclusively (no write,
//!    truncate or clone of the file meanwhile), after its direct I/O drained and its
//!    writeback in flight finished, as btrfs's relocation waits for ordered extents:
//!    blocks are allocated on another target, the data read (verified against its
//!    checksums for a copy-on-write file), written, and the extent remapped in one
//!    transaction with the old blocks released (`Fs::log_remapped`: a shared block loses
//!    this owner only). The remap is logged only if the extent still maps the blocks that
//!    were read; otherwise the copy is freed.
//! 3. [`Fs::evacuate_finish`]: every metadata page on the target is rewritten elsewhere
//!    (`Store::relocate_pages`, then checkpoints), and the target is checked empty.
//!
//! Crash safety comes from the ordinary protocol: each remap is one journal transaction,
//! committed only after the copy's target is flushed (`DirtyTargets`), and the old blocks
//! are freed only once it is durable. A crash leaves each extent on the old or the new
//! blocks; running the evacuation again moves what is left. The read-only state is
//! persisted (a `TargetState` record committed by the begin, decision 106): after a
//! remount the target is still read-only until the evacuation is cancelled. An emptied
//! target can then be retired (`Fs::retire_target`, `targets.md`).
//!
//! Limits: target 0 holds the journal and the root records and cannot be evacuated; a
//! block several files share is copied once per file that maps it (the sharing is lost,
//! and the free space check counts it per owner).

use std::time::Instant;

use stripefs_core::extent::ExtentState;
use stripefs_core::inode::FileKind;
use stripefs_core::record::{Record, TargetState};
use stripefs_core::{Ino, TargetId};
use stripefs_iomap::WbWait;

use crate::error::{FsError, Result};
use crate::namespace::inode;
use crate::Fs;

/// Most blocks moved by one read and one write.
const COPY_CHUNK_BLOCKS: u64 = 1024;

/// What one [`Fs::evacuate_step`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvacuateStep {
    /// The inode to resume from; `None`: no file has blocks on the target any more.
    pub next: Option<u64>,
    /// Blocks moved off the target (each file's copy counted).
    pub blocks: u64,
    /// Files whose blocks this step moved.
    pub files: u64,
    /// The next inode number the file system would hand out (the cursor's range, for
    /// progress).
    pub ino_limit: u64,
}

/// What a whole evacuation did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvacuateReport {
    pub target: u32,
    /// File blocks moved, and the files they belonged to.
    pub blocks: u64,
    pub files: u64,
    /// Metadata tree paths rewritten elsewhere.
    pub meta_paths: u64,
    /// Passes over the inodes (more than one when clones or writes raced the first).
    pub passes: u32,
    pub seconds: f64,
}

/// Progress of [`Fs::evacuate`], reported after every step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvacuateProgress {
    pub blocks: u64,
    pub files: u64,
    /// The inode cursor and its range.
    pub ino: u64,
    pub ino_limit: u64,
}

/// One extent piece on the target being evacuated.
#[derive(Debug, Clone, Copy)]
struct Piece {
    object: u32,
    block: u64,
    phys: u64,
    len: u64,
    state: ExtentState,
}

/// Passes over the inodes before `evacuate` gives up on a target that keeps getting
/// blocks back (a clone of a file not yet visited onto one already visited).
const MAX_PASSES: u32 = 8;

impl Fs {
    /// Starts (or resumes) the evacuation of `target`: makes it read-only, waits for the
    /// in-place writers admitted before, and writes back everything dirty.
    ///
    /// # Errors
    /// `Invalid` for target 0 (journal and root records) or a target that does not
    /// exist, `NoSpace` when the other targets cannot hold what it holds, `ReadOnly`,
    /// `Poisoned`, or the writeback's error.
    pub fn evacuate_begin(&self, target: TargetId) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        let n = self.inner.target_count();
        if target.0 >= n {
            return Err(FsError::invalid(format!(
                "target {target} does not exist (the file system has {n})"
            )));
        }
        if target.0 == 0 {
            return Err(FsError::invalid(
                "target 0 holds the journal and the root records and cannot be evacuated",
            ));
        }
        if self.inner.states.is_retired(target) {
            return Err(FsError::invalid(format!(
                "target {target} is retired: it holds nothing"
            )));
        }
        {
            let mut m = self.inner.meta.lock();
            self.room_elsewhere(&m, target)?;
            let newly = self.inner.states.set_read_only(target);
            if let Err(e) = self.move_reservations(&mut m, target) {
                if newly {
                    self.inner.states.clear_read_only(target);
                }
                return Err(e);
            }
            if newly {
                // Persisted (decision 106): after a remount the target stays read-only
                // until the evacuation is finished or cancelled. Committed by the sync.
                let rec = Record::TargetState {
                    target,
                    state: TargetState::ReadOnly,
                };
                self.inner.log_all(&mut m, vec![rec])?;
            }
        }
        self.inner.states.wait_drained(target);
        self.sync()
    }

    /// Moves every delayed allocation reserved on `from` (read-only now) to a writable
    /// target with room, under the metadata lock hold that made it read-only: the
    /// promise keeps protecting the writeback of that dirty data (otherwise writeback
    /// would give it back and take free space, which other writers may have taken).
    ///
    /// # Errors
    /// `NoSpace` when no writable target can take a range's reservation (those moved
    /// before stay moved: the books balance either way).
    fn move_reservations(&self, m: &mut crate::inner::MetaCore, from: TargetId) -> Result<()> {
        let n = self.inner.target_count();
        let held: Vec<(Ino, usize)> = m
            .inodes
            .iter()
            .flat_map(|(ino, c)| {
                c.delalloc
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| !d.ranges_on(from).is_empty())
                    .map(move |(o, _)| (ino, o))
            })
            .collect();
        for (ino, object) in held {
            let ranges = m.inodes.entry(ino).delalloc[object].ranges_on(from);
            for (start, len) in ranges {
                let first = self.inner.place(from)?;
                let to = (0..n)
                    .map(|k| TargetId((first.0 + k) % n))
                    .find(|&t| {
                        !self.inner.states.is_read_only(t) && m.alloc.available_blocks(t) >= len
                    })
                    .ok_or_else(|| {
                        FsError::NoSpace(format!(
                            "no writable target can take {len} blocks reserved on target {from}"
                        ))
                    })?;
                assert!(m.alloc.reserve(to, len), "available blocks were checked");
                let d = &mut m.inodes.entry(ino).delalloc[object];
                let removed = d.remove(start, len);
                d.insert(start, len, to);
                removed.unreserve(&mut m.alloc);
            }
        }
        Ok(())
    }

    /// Gives up an evacuation: `target` takes new blocks again, also after a remount
    /// (the change is committed before this returns).
    ///
    /// # Errors
    /// `Invalid` for a target that does not exist or is retired; `ReadOnly`, `Poisoned`,
    /// the commit's error.
    pub fn evacuate_cancel(&self, target: TargetId) -> Result<()> {
        self.inner.check()?;
        // Serialised with retirements (and adds), which check the state first.
        let _switch = self.inner.access_switch.lock();
        let _change = self.begin_change()?;
        let seq = {
            let mut m = self.inner.meta.lock();
            if target.0 >= self.inner.target_count() || self.inner.states.is_retired(target) {
                return Err(FsError::invalid(format!(
                    "target {target} is not a target that can be made writable (retired, or not a member)"
                )));
            }
            if !self.inner.states.is_read_only(target) {
                return Ok(());
            }
            self.inner.states.clear_read_only(target);
            let rec = Record::TargetState {
                target,
                state: TargetState::Writable,
            };
            self.inner.log_all(&mut m, vec![rec])?;
            m.txn.seq
        };
        self.inner
            .journal
            .commit(&self.inner, seq, crate::journal::CommitMode::Append)
    }

    /// Whether `target` is retired (`Fs::retire_target`).
    #[must_use]
    pub fn target_retired(&self, target: TargetId) -> bool {
        target.0 < self.inner.target_count() && self.inner.states.is_retired(target)
    }

    /// Whether `target` is read-only (being or done being evacuated).
    #[must_use]
    pub fn target_read_only(&self, target: TargetId) -> bool {
        target.0 < self.inner.target_count() && self.inner.states.is_read_only(target)
    }

    /// What `target` holds, from the allocator's counters (no tree read: callers hold the
    /// metadata lock): blocks in extents, in metadata pages, and reserved for delayed
    /// allocations.
    pub(crate) fn usage(&self, m: &crate::inner::MetaCore, target: TargetId) -> Usage {
        let a = &m.alloc;
        let dead: u64 = m
            .dead
            .iter()
            .flat_map(|d| &d.blocks)
            .filter(|f| f.target == target)
            .map(|f| f.len)
            .sum();
        let pages = self.inner.pages.live_blocks(target);
        let used = a
            .data_blocks(target)
            .saturating_sub(a.free_blocks(target) + a.busy_blocks_on(target) + dead);
        Usage {
            extent_blocks: used.saturating_sub(pages),
            page_blocks: pages,
            reserved_blocks: a.reserved_blocks(target),
        }
    }

    /// `NoSpace` unless the writable targets other than `target` have as many available
    /// blocks as `target` has in extents, metadata pages and reservations.
    fn room_elsewhere(&self, m: &crate::inner::MetaCore, target: TargetId) -> Result<()> {
        let u = self.usage(m, target);
        let need = u.extent_blocks + u.page_blocks + u.reserved_blocks;
        let have: u64 = (0..self.inner.target_count())
            .map(TargetId)
            .filter(|&t| t != target && !self.inner.states.is_read_only(t))
            .map(|t| m.alloc.available_blocks(t))
            .sum();
        if need > have {
            return Err(FsError::NoSpace(format!(
                "target {target} holds {need} blocks but the other writable targets have {have} available"
            )));
        }
        Ok(())
    }

    /// Moves the blocks of the next file(s) from inode `from` on that have blocks on
    /// `target`, at most about `budget` blocks (at least one extent piece), and returns
    /// where to resume. The evacuation must have begun ([`Fs::evacuate_begin`]).
    ///
    /// # Errors
    /// `Invalid` if `target` is not read-only; the trees' errors; a read, write or
    /// checksum error of a block being moved (`Io`, naming the file), after which nothing
    /// of that piece changed.
    pub fn evacuate_step(&self, target: TargetId, from: u64, budget: u64) -> Result<EvacuateStep> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        if !self.target_read_only(target) {
            return Err(FsError::invalid(format!(
                "target {target} is not being evacuated (begin the evacuation first)"
            )));
        }
        let budget = budget.max(1);
        let mut out = EvacuateStep::default();
        let mut at = from;
        loop {
            let (next, limit) = self.next_ino_from(at)?;
            out.ino_limit = limit;
            let Some(ino) = next else {
                out.next = None;
                return Ok(out);
            };
            let moved = self.evacuate_file(ino, target, budget - out.blocks.min(budget - 1))?;
            if moved.blocks > 0 {
                out.files += 1;
                out.blocks += moved.blocks;
            }
            at = if moved.more { ino.0 } else { ino.0 + 1 };
            if out.blocks >= budget || moved.more {
                out.next = Some(at);
                return Ok(out);
            }
        }
    }

    /// Rewrites every metadata page on `target` elsewhere and checks that nothing is left
    /// on it. Returns the tree paths rewritten.
    ///
    /// # Errors
    /// `Invalid` if `target` is not read-only or still holds file blocks or pages after
    /// the rewrite (a change raced the evacuation: step again); the trees' and the
    /// checkpoint's errors.
    pub fn evacuate_finish(&self, target: TargetId) -> Result<u64> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        if !self.target_read_only(target) {
            return Err(FsError::invalid(format!(
                "target {target} is not being evacuated (begin the evacuation first)"
            )));
        }
        self.sync()?;
        let mut paths = 0u64;
        // A checkpoint already under way may have placed pages before the target went
        // read-only: rewrite after it, and again until no page is left there.
        for _ in 0..4 {
            self.checkpoint()?;
            if self.inner.pages.live_blocks(target) == 0 {
                break;
            }
            for tree in stripefs_core::btree::TreeId::ALL {
                let mut from = Some(stripefs_core::btree::Key::MIN);
                while let Some(k) = from {
                    let (n, next) = self.inner.store.relocate_pages(tree, target, k, 256)?;
                    paths += n as u64;
                    from = next;
                }
            }
        }
        self.checkpoint()?;
        let u = self.usage(&self.inner.meta.lock(), target);
        if u.extent_blocks + u.page_blocks + u.reserved_blocks > 0 {
            return Err(FsError::invalid(format!(
                "target {target} still holds {} blocks in extents, {} in metadata pages and {} reserved: evacuate again",
                u.extent_blocks, u.page_blocks, u.reserved_blocks
            )));
        }
        Ok(paths)
    }

    /// The whole evacuation of `target`: begin, steps over every inode (passes until no
    /// file has blocks there), finish. `progress` is called after every step.
    ///
    /// # Errors
    /// As the three parts; an evacuation that fails leaves the target read-only (call
    /// [`Fs::evacuate_cancel`] to give up, or evacuate again to resume).
    pub fn evacuate(
        &self,
        target: TargetId,
        progress: &mut dyn FnMut(EvacuateProgress),
    ) -> Result<EvacuateReport> {
        let start = Instant::now();
        self.evacuate_begin(target)?;
        let mut report = EvacuateReport {
            target: target.0,
            ..EvacuateReport::default()
        };
        loop {
            report.passes += 1;
            let moved_before = report.blocks;
            let mut at = Some(Ino::ROOT.0);
            while let Some(from) = at {
                let s = self.evacuate_step(target, from, COPY_CHUNK_BLOCKS * 16)?;
                report.blocks += s.blocks;
                report.files += s.files;
                at = s.next;
                progress(EvacuateProgress {
                    blocks: report.blocks,
                    files: report.files,
                    ino: at.unwrap_or(s.ino_limit),
                    ino_limit: s.ino_limit,
                });
            }
            // Another pass only if this one moved something: a file may have gained
            // blocks there behind the cursor (a clone of a file not yet visited).
            if report.blocks == moved_before || report.passes >= MAX_PASSES {
                break;
            }
        }
        report.meta_paths = self.evacuate_finish(target)?;
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Moves up to `budget` blocks of `ino` off `target` (at least one piece).
    fn evacuate_file(&self, ino: Ino, target: TargetId, budget: u64) -> Result<Moved> {
        if self.pieces_on(ino, target, 1)?.is_empty() {
            return Ok(Moved::default());
        }
        let io = self.inner.io_lock(ino);
        let _excl = io.write();
        io.dio.drain();
        self.writeback_file(ino, WbWait::Busy)?;
        let pieces = self.pieces_on(ino, target, budget)?;
        let mut moved = Moved::default();
        for p in &pieces {
            moved.blocks += self.move_piece(ino, target, *p)?;
        }
        // A step that moved nothing (every piece changed under its copy) goes on to the
        // next file rather than loop: the next pass comes back.
        moved.more = moved.blocks > 0 && !self.pieces_on(ino, target, 1)?.is_empty();
        Ok(moved)
    }

    /// The extent pieces of `ino` on `target`, in object and block order, up to about
    /// `budget` blocks (whole pieces, at least one). Empty for anything but a regular file.
    fn pieces_on(&self, ino: Ino, target: TargetId, budget: u64) -> Result<Vec<Piece>> {
        let m = self.inner.meta.lock();
        let i = match inode(&m, ino) {
            Ok(i) => i,
            Err(FsError::Stale(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        if i.attrs.kind != FileKind::Regular {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut total = 0;
        for (object, map) in i.objects.iter().enumerate() {
            for (block, e) in map.iter().filter(|(_, e)| e.target == target) {
                out.push(Piece {
                    object: object as u32,
                    block,
                    phys: e.phys,
                    len: e.len,
                    state: e.state,
                });
                total += e.len;
                if total >= budget {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Moves one piece in chunks; returns the blocks moved (fewer if the file changed
    /// under a chunk: what is left is found again by the next step).
    fn move_piece(&self, ino: Ino, from: TargetId, p: Piece) -> Result<u64> {
        let mut done = 0;
        while done < p.len {
            let want = (p.len - done).min(COPY_CHUNK_BLOCKS);
            let chunk = Piece {
                block: p.block + done,
                phys: p.phys + done,
                len: want,
                ..p
            };
            let got = self.move_chunk(ino, from, chunk)?;
            if got == 0 {
                break;
            }
            done += got;
        }
        Ok(done)
    }

    /// Copies one chunk to new blocks and remaps it; returns the blocks moved (0: the
    /// extent changed meanwhile, nothing logged, the copy freed).
    fn move_chunk(&self, ino: Ino, from: TargetId, c: Piece) -> Result<u64> {
        let (to, phys, len) = match self.alloc_for_move(ino, from, c) {
            Ok(a) => a,
            // Unlinked meanwhile: its blocks are being freed, nothing to move.
            Err(FsError::Stale(_)) => return Ok(0),
            Err(e) => return Err(e),
        };
        let copied = if c.state == ExtentState::Written {
            self.copy_blocks(ino, (from, c.phys), (to, phys), len, c)
        } else {
            Ok(())
        };
        if let Err(e) = copied {
            self.inner.meta.lock().alloc.free_now(to, phys, len);
            self.inner.write_csums.forget(to, phys, len);
            return match e {
                FsError::Stale(_) => Ok(0),
                e => Err(e),
            };
        }
        let mut m = self.inner.meta.lock();
        if !still_maps(&m, ino, from, Piece { len, ..c })? {
            m.alloc.free_now(to, phys, len);
            drop(m);
            self.inner.write_csums.forget(to, phys, len);
            return Ok(0);
        }
        let rec = Record::ExtentSet {
            ino,
            object: c.object,
            block: c.block,
            len,
            phys,
            state: c.state,
            target: to,
        };
        if let Err(e) = self.log_remapped(&mut m, ino, vec![rec]) {
            m.alloc.free_now(to, phys, len);
            drop(m);
            self.inner.write_csums.forget(to, phys, len);
            return Err(e);
        }
        self.inner
            .evacuated_blocks
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        Ok(len)
    }

    /// New blocks for a chunk of `c` (at most its length) on the target its object's
    /// blocks now go to; committing for busy space once if none are free.
    fn alloc_for_move(&self, ino: Ino, from: TargetId, c: Piece) -> Result<(TargetId, u64, u64)> {
        let take = || -> Result<Option<(TargetId, u64, u64)>> {
            let mut m = self.inner.meta.lock();
            // An unlinked file (`free_inode` takes no I/O lock) is the caller's `Stale`.
            let layout = inode(&m, ino)?.attrs.layout;
            let home = layout.target_of(c.object, self.inner.target_count());
            let to = self.inner.place(home)?;
            if to == from {
                return Err(FsError::invalid(format!(
                    "the evacuation of target {from} was cancelled"
                )));
            }
            self.inner.alloc_fault(to)?;
            Ok(m.alloc
                .alloc_from(to, None, c.len, stripefs_core::alloc::Draw::Data)
                .map(|(p, l)| (to, p, l)))
        };
        self.take_or_commit(take, || {
            format!("no room elsewhere for inode {ino}'s blocks on target {from}")
        })
    }

    /// Reads `len` blocks at `src`, verifies them if the file is copy on write (and keeps
    /// their checksums for the remap), and writes them at `dst`.
    fn copy_blocks(
        &self,
        ino: Ino,
        (st, sp): (TargetId, u64),
        (dt, dp): (TargetId, u64),
        len: u64,
        c: Piece,
    ) -> Result<()> {
        let bs = self.inner.geo.block_size;
        let data =
            self.inner.targets[st.index()].read_sync(bs.to_bytes(sp), bs.to_bytes(len) as usize)?;
        let datacow = self.inner.meta.lock().is_datacow(ino)?;
        if datacow {
            let layout = inode(&self.inner.meta.lock(), ino)?.attrs.layout;
            for (i, block) in data.chunks(bs.bytes() as usize).enumerate() {
                let i = i as u64;
                let file_off = layout.file_off(c.object, bs.to_bytes(c.block + i));
                self.verify_block(ino, file_off, st, sp + i, block)?;
                self.inner
                    .write_csums
                    .put(dt, dp + i, stripefs_core::csum::BlockCsum::of(block));
            }
        }
        self.inner.targets[dt.index()].write_sync(bs.to_bytes(dp), data)?;
        self.inner.mark_dirty(dt.index());
        self.inner
            .data_bytes_written
            .fetch_add(bs.to_bytes(len), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// What a target holds (`Fs::usage`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub extent_blocks: u64,
    pub page_blocks: u64,
    pub reserved_blocks: u64,
}

/// Blocks moved from one file, and whether it still has some on the target.
#[derive(Debug, Default)]
struct Moved {
    blocks: u64,
    more: bool,
}

/// Whether `ino` still maps object blocks `[c.block, +c.len)` to `[c.phys, +c.len)` of
/// `target` in `c.state`: the remap of a copy is logged only then.
fn still_maps(m: &crate::inner::MetaCore, ino: Ino, target: TargetId, c: Piece) -> Result<bool> {
    let i = match inode(m, ino) {
        Ok(i) => i,
        Err(FsError::Stale(_)) => return Ok(false),
        Err(e) => return Err(e),
    };
    let Some(map) = i.objects.get(c.object as usize) else {
        return Ok(false);
    };
    let mut covered = 0;
    for (s, e) in map.range(c.block, c.len) {
        let lo = s.max(c.block);
        let hi = (s + e.len).min(c.block + c.len);
        let ok = e.target == target
            && e.state == c.state
            && e.phys + (lo - s) == c.phys + (lo - c.block);
        if !ok {
            return Ok(false);
        }
        covered += hi - lo;
    }
    Ok(covered == c.len)
}

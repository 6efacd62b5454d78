//! Offline consistency check: load read-only (replaying the journal in memory), then verify
//! every invariant of the format. Nothing is written.

use std::sync::Arc;

use stripefs_core::check;
use stripefs_core::checkpoint;
use stripefs_core::meta::MetaState;
use stripefs_core::Ino;
use stripefs_target::Target;

use crate::error::Result;
use crate::recovery;

/// Stages reported to a progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsckStage {
    /// Superblocks, checkpoint and journal read and verified.
    Loaded { inodes: u64, journal_txns: u64 },
    /// Invariants checked.
    Checked,
}

/// What fsck found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// Violated invariants, one sentence each. Empty means clean.
    pub problems: Vec<String>,
    /// Facts that are not errors (pending journal replay, orphans to free, crash leftovers
    /// past EOF).
    pub notes: Vec<String>,
    /// Damage that leaves the file system correct and usable but less protected, and that
    /// the file system repairs by itself (a damaged inactive checkpoint area: the next
    /// checkpoint rewrites it). Not problems: [`FsckReport::is_clean`] ignores them.
    pub warnings: Vec<String>,
    /// Files with non-zero bytes past EOF in their last block (none after a clean unmount).
    pub eof_tails_not_zero: Vec<u64>,
    pub inodes: u64,
    pub extents: u64,
    pub data_blocks_used: u64,
    pub data_blocks: u64,
}

impl FsckReport {
    /// True when no invariant is violated.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the file system on `targets` without modifying it.
///
/// # Errors
/// Load failures (damaged superblock, checkpoint or journal; missing or foreign targets)
/// are returned as errors naming what is wrong; invariant violations are in the report.
pub fn fsck(
    targets: Vec<Arc<dyn Target>>,
    progress: &mut dyn FnMut(FsckStage),
) -> Result<FsckReport> {
    let mut l = recovery::load(targets)?;
    progress(FsckStage::Loaded {
        inodes: l.state.inodes.len() as u64,
        journal_txns: l.replayed_txns,
    });
    let mut notes = Vec::new();
    if l.replayed_txns > 0 {
        notes.push(format!(
            "journal holds {} committed transactions; the next mount replays them",
            l.replayed_txns
        ));
    }
    let orphans: Vec<Ino> = l
        .state
        .inodes
        .values()
        .filter(|i| i.attrs.nlink == 0)
        .map(|i| i.attrs.ino)
        .collect();
    if !orphans.is_empty() {
        notes.push(format!(
            "{} unlinked inodes were open at the crash; the next mount frees them",
            orphans.len()
        ));
        for o in orphans {
            l.state.inodes.remove(&o);
        }
    }
    let r = check::check(&l.state, &l.geo);
    let tails = eof_tails_not_zero(&l)?;
    if !tails.is_empty() {
        notes.push(format!(
            "{} files hold non-zero bytes past EOF in their last block (left by a crash; zeroed before they can become file content): inodes {tails:?}",
            tails.len()
        ));
    }
    let warnings = inactive_checkpoint(&l)?.into_iter().collect();
    progress(FsckStage::Checked);
    let data_blocks = l.geo.targets.iter().map(|t| t.data_blocks()).sum();
    Ok(FsckReport {
        eof_tails_not_zero: tails,
        problems: r.problems,
        notes,
        warnings,
        inodes: r.inodes,
        extents: r.extents,
        data_blocks_used: r.data_blocks_used,
        data_blocks,
    })
}

/// Whether the checkpoint area not in charge is damaged. It holds the previous checkpoint
/// (the fallback should the active one become unreadable) and receives the next one; only
/// right after mkfs has it never been written (all zeros, active generation 1).
///
/// # Errors
/// Target read errors.
fn inactive_checkpoint(l: &recovery::Loaded) -> Result<Option<String>> {
    let geo = &l.geo;
    let bs = geo.block_size;
    let area = 1 - l.ckpt.area as usize;
    let start = geo.ckpt_start[area];
    let t0 = l.targets[0].as_ref();
    let what = format!("inactive checkpoint area {area} (target 0 block {start})");
    let consequence = "the file system is usable, but has no older checkpoint to fall back \
        on should the active one become unreadable; the next checkpoint (at the latest the \
        next unmount) rewrites this area";
    let hdr_block = t0.read_sync(bs.to_bytes(start), bs.bytes() as usize)?;
    let hdr = match checkpoint::decode_header(&hdr_block, geo.uuid, start, geo.ckpt_blocks - 1) {
        Ok(Some(h)) => h,
        Ok(None) if l.ckpt.generation == 1 && hdr_block.iter().all(|&b| b == 0) => {
            return Ok(None); // never written: mkfs wrote only the first checkpoint
        }
        Ok(None) => {
            return Ok(Some(format!(
                "{what}: no valid checkpoint header (torn or damaged); {consequence}"
            )))
        }
        Err(e) => return Ok(Some(format!("{what}: {e}; {consequence}"))),
    };
    let len = bs.to_bytes(hdr.payload_blocks) as usize;
    let blocks = t0.read_sync(bs.to_bytes(start + 1), len)?;
    let loaded = checkpoint::decode_payload(&hdr, geo.uuid, bs.bytes(), &blocks)
        .and_then(|p| MetaState::from_snapshot(&p, hdr.next_ino));
    Ok(loaded.err().map(|e| {
        format!(
            "{what}: checkpoint generation {} is damaged ({e}); {consequence}",
            hdr.generation
        )
    }))
}

/// Files whose last block holds non-zero bytes past EOF on disk. After a clean unmount
/// there are none (writeback and truncate zero them); after a crash an extension's data can
/// be on disk without its size, which is harmless because every extension zeroes that tail
/// first (format invariant 4).
fn eof_tails_not_zero(l: &recovery::Loaded) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    use stripefs_core::extent::{ExtentState, Lookup};
    let bs = l.geo.block_size;
    for inode in l.state.inodes.values() {
        let a = &inode.attrs;
        let tail = bs.offset_in_block(a.size);
        if a.kind != stripefs_core::inode::FileKind::Regular || tail == 0 {
            continue;
        }
        let eof_block = bs.round_down(a.size);
        let piece = a.layout.piece(eof_block, 1);
        let Some(map) = inode.objects.get(piece.object as usize) else {
            continue;
        };
        let Lookup::Mapped { start, ext } = map.lookup(bs.block_of(piece.obj_off)) else {
            continue;
        };
        if ext.state != ExtentState::Written {
            continue;
        }
        let phys = ext.phys + (bs.block_of(piece.obj_off) - start);
        let target = l.targets[a
            .layout
            .target_of(piece.object, l.geo.target_count())
            .index()]
        .as_ref();
        let block = target.read_sync(bs.to_bytes(phys), bs.bytes() as usize)?;
        if block[tail as usize..].iter().any(|&b| b != 0) {
            out.push(a.ino.0);
        }
    }
    Ok(out)
}

/// A read-only look at a file system's on-disk state, for `stripefs inspect`.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub superblocks: Vec<stripefs_core::superblock::Superblock>,
    pub target_names: Vec<String>,
    /// Both checkpoint headers (`None`: empty or torn).
    pub checkpoints: [Option<stripefs_core::checkpoint::CheckpointHeader>; 2],
    /// The one in charge.
    pub active: stripefs_core::checkpoint::CheckpointHeader,
    /// Journal transactions after the active checkpoint.
    pub journal_txns: u64,
    pub journal_records: u64,
    /// Journal units in use and in all.
    pub journal_used_units: u64,
    pub journal_units: u64,
    pub inodes: u64,
    pub extents: u64,
    /// Per target: (data blocks, free blocks, free ranges).
    pub space: Vec<(u64, u64, usize)>,
    pub block_size: u32,
}

/// Reads everything `inspect` shows, writing nothing.
///
/// # Errors
/// As [`fsck`].
pub fn inspect(targets: Vec<Arc<dyn Target>>) -> Result<Inspection> {
    let l = recovery::load(targets)?;
    let t0 = l.targets[0].as_ref();
    let geo = &l.geo;
    let bs = geo.block_size;
    let mut checkpoints = [None, None];
    for (i, start) in geo.ckpt_start.iter().enumerate() {
        let buf = t0.read_sync(bs.to_bytes(*start), bs.bytes() as usize)?;
        checkpoints[i] =
            stripefs_core::checkpoint::decode_header(&buf, geo.uuid, *start, geo.ckpt_blocks - 1)
                .ok()
                .flatten();
    }
    let (_, sbs) = recovery::read_superblocks(l.targets.clone())?;
    let r = check::check(&l.state, geo);
    let space = (0..geo.target_count())
        .map(|t| {
            let id = stripefs_core::TargetId(t);
            (
                r.allocator.data_blocks(id),
                r.allocator.free_blocks(id),
                r.allocator.free_ranges(id),
            )
        })
        .collect();
    Ok(Inspection {
        superblocks: sbs,
        target_names: l
            .targets
            .iter()
            .map(|t| t.info().name.to_string())
            .collect(),
        checkpoints,
        active: l.ckpt,
        journal_txns: l.replayed_txns,
        journal_records: l.replayed_records,
        journal_used_units: l.head - l.ckpt.journal_tail,
        journal_units: geo.journal_units(),
        inodes: r.inodes,
        extents: r.extents,
        space,
        block_size: bs.bytes(),
    })
}

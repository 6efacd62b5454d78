//! Offline consistency check: load read-only (the metadata trees, then the journal replayed
//! in memory), walk and verify every page of every tree, then verify every invariant of the
//! format, including that no block is both a page and in an extent. Nothing is written.

use std::sync::Arc;

use stripefs_core::btree::root::RootRecord;
use stripefs_core::btree::TreeId;
use stripefs_core::check;
use stripefs_core::Ino;
use stripefs_target::Target;

use crate::error::Result;
use crate::options::MetaCacheBytes;
use crate::recovery;

/// Stages reported to a progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsckStage {
    /// Superblocks, metadata trees and journal read and verified.
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
    /// the file system repairs by itself (a damaged older root record slot: the next
    /// checkpoint rewrites it). Not problems: [`FsckReport::is_clean`] ignores them.
    pub warnings: Vec<String>,
    /// Files with non-zero bytes past EOF in their last block (none after a clean unmount).
    pub eof_tails_not_zero: Vec<u64>,
    pub inodes: u64,
    pub extents: u64,
    pub data_blocks_used: u64,
    pub data_blocks: u64,
    /// Pages of the metadata trees (all verified).
    pub meta_pages: u64,
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
    let mut l = recovery::load(targets, MetaCacheBytes::DEFAULT)?;
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
    // Every page the durable root reaches was read and verified when loading (magic,
    // checksum, address, tree, level, generation, key order and bounds).
    let pages = &l.tree_pages;
    let mut r = check::check(&l.state, &l.geo);
    let pb = l.geo.page_blocks();
    for (tree, at) in pages {
        if let Err(e) = r.allocator.mark_used(at.target, at.block.0, pb) {
            r.problems.push(format!(
                "metadata page of tree {tree} at {at} (+{pb} blocks): {e}"
            ));
        }
    }
    let tails = eof_tails_not_zero(&l)?;
    if !tails.is_empty() {
        notes.push(format!(
            "{} files hold non-zero bytes past EOF in their last block (left by a crash; zeroed before they can become file content): inodes {tails:?}",
            tails.len()
        ));
    }
    let warnings = older_root_slot(&l)?.into_iter().collect();
    progress(FsckStage::Checked);
    let data_blocks = l.geo.targets.iter().map(|t| t.data_blocks()).sum();
    Ok(FsckReport {
        eof_tails_not_zero: tails,
        problems: r.problems,
        notes,
        warnings,
        inodes: r.inodes,
        extents: r.extents,
        data_blocks_used: r.data_blocks_used + pages.len() as u64 * pb,
        data_blocks,
        meta_pages: pages.len() as u64,
    })
}

/// The root records in the two slots (`None`: never written or torn), and the slot of
/// the one in charge.
///
/// # Errors
/// Target read errors.
fn root_slots(
    l: &recovery::Loaded,
) -> Result<[std::result::Result<Option<RootRecord>, String>; 2]> {
    let t0 = l.targets[0].as_ref();
    let len = (t0.info().sector_size as usize).max(stripefs_core::btree::root::ROOT_RECORD_BYTES);
    let mut out = [Ok(None), Ok(None)];
    for (slot, off) in l.geo.root_slot_offsets().iter().enumerate() {
        let buf = t0.read_sync(*off, len)?;
        out[slot] = RootRecord::decode(&buf, l.geo.uuid, slot as u32).map_err(|e| e.to_string());
        if out[slot] == Ok(None) && buf.iter().any(|&b| b != 0) {
            out[slot] = Err(format!(
                "metadata root record slot {slot}: no valid record (torn or damaged)"
            ));
        }
    }
    Ok(out)
}

/// Whether the root record slot not in charge is damaged. It holds the previous
/// generation (the fallback should the newest become unreadable) and receives the next
/// one; only right after mkfs has it never been written (all zeros, generation 1).
///
/// # Errors
/// Target read errors.
fn older_root_slot(l: &recovery::Loaded) -> Result<Option<String>> {
    let active = l.store.durable_generation();
    let older = 1 - RootRecord::slot_of(active) as usize;
    let consequence = "the file system is usable, but has no older root record to fall \
        back on should the newest one be torn or damaged; the next checkpoint (at the \
        latest the next unmount) rewrites this slot";
    let slots = root_slots(l)?;
    Ok(match &slots[older] {
        Ok(Some(_)) => None,
        Ok(None) if active.0 == 1 => None, // never written: mkfs wrote generation 1 only
        Ok(None) => Some(format!(
            "metadata root record slot {older}: never written; {consequence}"
        )),
        Err(e) => Some(format!("{e}; {consequence}")),
    })
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

/// One tree's shape, for `inspect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeShape {
    pub tree: TreeId,
    /// Level of the root (0: the root is a leaf).
    pub root_level: u8,
    pub pages: u64,
}

/// A read-only look at a file system's on-disk state, for `stripefs inspect`.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub superblocks: Vec<stripefs_core::superblock::Superblock>,
    pub target_names: Vec<String>,
    /// Both root record slots (`Ok(None)`: never written; `Err`: torn or damaged).
    pub root_slots: [std::result::Result<Option<RootRecord>, String>; 2],
    /// The generation of the metadata trees in charge.
    pub generation: u64,
    /// Where its root record says journal replay starts (unit, next sequence).
    pub journal_mark: (u64, u64),
    pub trees: Vec<TreeShape>,
    /// The store's page cache after loading and walking.
    pub meta_cache: stripefs_meta::CacheStats,
    /// Journal transactions after the root record's mark.
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
    let l = recovery::load(targets, MetaCacheBytes::DEFAULT)?;
    let geo = &l.geo;
    let root_slots = root_slots(&l)?;
    let (_, sbs) = recovery::read_superblocks(l.targets.clone())?;
    let mut r = check::check(&l.state, geo);
    let levels = l.store.stats().trees;
    let mut trees = Vec::new();
    for tree in TreeId::ALL {
        let mut pages = 0u64;
        for (_, at) in l.tree_pages.iter().filter(|(t, _)| *t == tree) {
            pages += 1;
            let _ = r
                .allocator
                .mark_used(at.target, at.block.0, geo.page_blocks());
        }
        let root_level = levels.iter().find(|t| t.0 == tree).map_or(0, |t| t.1);
        trees.push(TreeShape {
            tree,
            root_level,
            pages,
        });
    }
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
        root_slots,
        generation: l.store.durable_generation().0,
        journal_mark: (l.mark.tail, l.mark.seq),
        trees,
        meta_cache: l.store.stats().cache,
        journal_txns: l.replayed_txns,
        journal_records: l.replayed.len() as u64,
        journal_used_units: l.head - l.mark.tail,
        journal_units: geo.journal_units(),
        inodes: r.inodes,
        extents: r.extents,
        space,
        block_size: geo.block_size.bytes(),
    })
}

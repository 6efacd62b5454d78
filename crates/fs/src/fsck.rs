//! Offline consistency check, streaming: the trees are walked in key order and each
//! inode's items checked as they pass, keeping only bounded per-inode state ([`tally`]:
//! a few bytes per inode, and 2 bits per data block); then the journal after the durable
//! mark is applied to the trees in memory, each transaction checked as mount checks it
//! ([`replay`]). Nothing is written, and no whole model (`MetaState`) is loaded.
//!
//! Order: superblocks and the root record; the journal read and verified (its records
//! kept: bounded by the journal size); each tree walked (`Store::walk`: every page read
//! and verified, its blocks claimed; the fs tree's items checked as the leaves pass, the
//! space tree last, its `FreeSpace` items checked against the complement of what is in
//! use); the rules that need every inode (link counts, reachability) from the tallies;
//! then the journal's transactions applied and checked.

mod links;
mod replay;
pub mod tally;
mod walk;

use std::collections::BTreeSet;
use std::sync::Arc;

use stripefs_core::btree::root::RootRecord;
use stripefs_core::btree::tree::Items;
use stripefs_core::btree::{PageAddr, TreeId};
use stripefs_core::record::{Record, TargetState};
use stripefs_core::{Ino, TargetId};
use stripefs_meta::Store;
use stripefs_target::Target;

use crate::error::{FsError, Result};
use crate::options::MetaCacheBytes;
use crate::recovery::{self, TxnAt};

pub use walk::Problem;

/// Stages reported to a progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsckStage {
    /// Superblocks, root record and journal read and verified.
    Loaded { journal_txns: u64 },
    /// The walk of the fs tree reached inode number `done` of `total` (the counter: the
    /// walk goes in inode order). Reported at every leaf page.
    Walking { pages: u64, done: u64, total: u64 },
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
    /// The largest per-inode state the check held, in bytes ([`tally`]: it grows with
    /// the inode count by at most [`tally::TALLY_BYTES`] per inode).
    pub tracked_bytes: usize,
    /// Bytes of the block bitmaps (bounded by the device size).
    pub bitmap_bytes: usize,
}

impl FsckReport {
    /// True when no invariant is violated.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What the walk and the replay found, before it becomes a report.
struct Checked {
    opened: recovery::Opened,
    problems: Vec<String>,
    notes: Vec<String>,
    eof_tails: Vec<u64>,
    inodes: u64,
    extents: u64,
    /// Per tree: pages.
    pages: Vec<(TreeId, u64)>,
    used: Vec<u64>,
    free: Vec<(u64, usize)>,
    journal_txns: u64,
    journal_records: u64,
    journal_head: u64,
    tracked_bytes: usize,
    bitmap_bytes: usize,
}

/// Checks the file system on `targets` without modifying it.
///
/// # Errors
/// Load failures (damaged superblock, root records, tree pages or journal; missing or
/// foreign targets) and journal transactions that break a rule are returned as errors
/// naming what is wrong; invariant violations of the trees are in the report.
pub fn fsck(
    targets: Vec<Arc<dyn Target>>,
    progress: &mut dyn FnMut(FsckStage),
) -> Result<FsckReport> {
    let c = check(targets, progress)?;
    let warnings = older_root_slot(&c.opened)?.into_iter().collect();
    progress(FsckStage::Checked);
    let geo = &c.opened.geo;
    let data_blocks = geo.targets.iter().map(|t| t.data_blocks()).sum();
    Ok(FsckReport {
        eof_tails_not_zero: c.eof_tails,
        problems: c.problems,
        notes: c.notes,
        warnings,
        inodes: c.inodes,
        extents: c.extents,
        data_blocks_used: c.used.iter().sum(),
        data_blocks,
        meta_pages: c.pages.iter().map(|p| p.1).sum(),
        tracked_bytes: c.tracked_bytes,
        bitmap_bytes: c.bitmap_bytes,
    })
}

/// The walk, the journal and every rule.
fn check(targets: Vec<Arc<dyn Target>>, progress: &mut dyn FnMut(FsckStage)) -> Result<Checked> {
    let mut opened = recovery::open(targets, MetaCacheBytes::DEFAULT)?;
    let mark = opened.store.journal_mark();
    let mut txns: Vec<(TxnAt, Vec<Record>)> = Vec::new();
    let t0 = Arc::clone(&opened.targets[0]);
    let end = recovery::read_journal(t0.as_ref(), &opened.geo, mark, &mut |at, r| {
        txns.push((at, r));
        Ok(())
    })?;
    join_added(&mut opened, &txns)?;
    retired_in_journal(&mut opened, &txns)?;
    let (geo, store) = (&opened.geo, &opened.store);
    progress(FsckStage::Loaded {
        journal_txns: end.txns,
    });
    let mut c = walk::Checker::new(geo, geo.uuid, &opened.targets);
    match stripefs_meta::refcount::load(store) {
        Ok(refs) => c.set_refs(refs),
        Err(e) => c.problem(None, format!("the refcount tree does not load: {e}")),
    }
    let mut pages = Vec::new();
    // The space tree last: its free runs are checked against every claim.
    for tree in [TreeId::Fs, TreeId::Refcount, TreeId::Csum, TreeId::Space] {
        pages.push((tree, walk_tree(&mut c, store, tree, progress)?));
        if tree == TreeId::Csum {
            c.check_csums_complete();
        }
        if tree == TreeId::Fs {
            c.finish_group()?;
            c.check_refcounts();
            for o in std::mem::take(&mut c.orphan_index) {
                c.problem(
                    Some(Ino(o)),
                    format!("an orphan item names inode {o}, which does not exist"),
                );
            }
        }
    }
    c.page_owners(store)?;
    c.persisted_free_space(store)?;
    c.free_space_complement(store.members());
    links::link_problems(&mut c);
    links::reachability(&mut c, store)?;
    links::bad_entries(&mut c, store)?;
    // The journal, applied to the trees in memory and checked transaction by transaction.
    let mut touched = BTreeSet::new();
    let journal_records = txns.iter().map(|t| t.1.len() as u64).sum();
    for (at, recs) in &txns {
        replay::apply_txn(&mut c, store, *at, recs, &mut touched)?;
    }
    drop(txns);
    let mut notes = Vec::new();
    if end.txns > 0 {
        notes.push(format!(
            "journal holds {} committed transactions; the next mount replays them",
            end.txns
        ));
    }
    let orphans = c
        .tallies
        .inodes
        .values()
        .filter(|t| t.kind().is_some() && t.nlink == 0)
        .count();
    if orphans > 0 {
        notes.push(format!(
            "{orphans} unlinked inodes were open at the crash; the next mount frees them"
        ));
    }
    let mut eof_tails: Vec<u64> = c
        .eof_tails
        .iter()
        .copied()
        .filter(|i| !touched.contains(&Ino(*i)))
        .collect();
    eof_tails.extend(replayed_eof_tails(&c, store, &touched)?);
    eof_tails.sort_unstable();
    if !eof_tails.is_empty() {
        notes.push(format!(
            "{} files hold non-zero bytes past EOF in their last block (left by a crash; zeroed before they can become file content): inodes {eof_tails:?}",
            eof_tails.len()
        ));
    }
    let inodes = c
        .tallies
        .inodes
        .values()
        .filter(|t| t.kind().is_some() && t.nlink != 0)
        .count() as u64;
    let used = (0..geo.target_count())
        .map(|t| c.blocks.used(TargetId(t)))
        .collect();
    let free = (0..geo.target_count())
        .map(|t| {
            let runs = c.blocks.unused_runs(TargetId(t));
            (runs.iter().map(|r| r.1).sum(), runs.len())
        })
        .collect();
    let problems = c.problems.iter().map(|p| p.text.clone()).collect();
    let (tracked_bytes, bitmap_bytes, extents) = (
        c.peak_bytes.max(c.tracked_bytes()),
        c.blocks.bytes(),
        c.extents,
    );
    let eof = eof_tails;
    drop(c);
    Ok(Checked {
        problems,
        notes,
        eof_tails: eof,
        inodes,
        extents,
        pages,
        used,
        free,
        journal_txns: end.txns,
        journal_records,
        journal_head: end.head,
        tracked_bytes,
        bitmap_bytes,
        opened,
    })
}
/// The targets the journal's `TargetAdd` records add, given before the walk so that its
/// block map covers their blocks (the replay below applies the records themselves).
///
/// # Errors
/// As [`recovery::Candidates::take`]; a target past the store's capacity.
fn join_added(o: &mut recovery::Opened, txns: &[(TxnAt, Vec<Record>)]) -> Result<()> {
    for (at, recs) in txns {
        for rec in recs {
            if let Some(j) = recovery::Joining::of(rec) {
                let (_, t) = o.candidates.take(&at.to_string(), j)?;
                o.store.give_target(Arc::clone(&t))?;
                o.geo.targets.push(j.geometry());
                o.targets.push(t);
            }
        }
    }
    Ok(())
}

/// Every member given no device must be retired, in the trees or by a journal record
/// the replay below applies. One retired by the journal only still has its free run in
/// the trees: its data area (from the record) is given back to the geometry so that the
/// walk can claim that run; the replayed record then checks that nothing else is there.
///
/// # Errors
/// `Invalid` naming an absent member that is not retired; the trees' errors.
fn retired_in_journal(o: &mut recovery::Opened, txns: &[(TxnAt, Vec<Record>)]) -> Result<()> {
    let members = o.store.members();
    let mut states = (0..members)
        .map(|t| o.store.target_state(TargetId(t)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut journal_only = Vec::new();
    for rec in txns.iter().flat_map(|t| &t.1) {
        if let Record::TargetState { target, state } = rec {
            if let Some(s) = states.get_mut(target.index()) {
                if !matches!(s, TargetState::Retired { .. }) {
                    if let TargetState::Retired { data_start, blocks } = state {
                        journal_only.push((*target, *data_start, *blocks));
                    }
                }
                *s = *state;
            }
        }
    }
    o.absent.check_retired(o.geo.uuid, &states)?;
    for (t, data_start, blocks) in journal_only {
        if let Some(g) = o.geo.targets.get_mut(t.index()) {
            *g = stripefs_core::geometry::TargetGeometry { blocks, data_start };
        }
    }
    Ok(())
}

/// Walks tree `tree`: every page verified and its blocks claimed, every item checked in
/// key order. Returns the number of pages.
///
/// # Errors
/// A page read's error or verification failure; a target read's error.
fn walk_tree(
    c: &mut walk::Checker<'_>,
    store: &Store,
    tree: TreeId,
    progress: &mut dyn FnMut(FsckStage),
) -> Result<u64> {
    let mut pages = 0u64;
    let mut failed: Option<FsError> = None;
    store.walk(tree, &mut |at: PageAddr, node| {
        pages += 1;
        c.page(tree, at);
        let Items::Leaf(items) = &node.items else {
            return;
        };
        for (k, v) in items.iter() {
            if failed.is_none() {
                if let Err(e) = c.item(tree, k, v) {
                    failed = Some(e);
                }
            }
        }
        if tree == TreeId::Fs {
            let done = items.keys().last().map_or(0, |k| k.object);
            progress(FsckStage::Walking {
                pages,
                done,
                total: c.next_ino.max(done),
            });
        }
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(pages),
    }
}

/// The files a journal transaction changed whose last block holds non-zero bytes past
/// EOF, read from the trees after replay.
///
/// # Errors
/// A page or target read's error.
fn replayed_eof_tails(
    c: &walk::Checker<'_>,
    store: &Store,
    touched: &BTreeSet<Ino>,
) -> Result<Vec<u64>> {
    use stripefs_core::btree::schema::{decode_extent, decode_inode, extent_key, inode_key};
    use stripefs_core::btree::KeyKind;
    use stripefs_core::extent::ExtentState;
    use stripefs_core::inode::FileKind;
    let bs = c.geo.block_size;
    let mut out = Vec::new();
    for &ino in touched {
        let key = inode_key(ino);
        let Some(v) = store.get(&key)? else {
            continue;
        };
        let a = decode_inode(&key, &v)?;
        let ok = stripefs_core::check::layout_problem(&a, a.layout.count as usize, c.geo).is_none();
        if a.kind != FileKind::Regular || !ok || a.nlink == 0 || bs.offset_in_block(a.size) == 0 {
            continue;
        }
        let piece = a.layout.piece(bs.round_down(a.size), 1);
        let ob = bs.block_of(piece.obj_off);
        let Some((k, v)) = store.floor(&extent_key(ino, piece.object, ob))? else {
            continue;
        };
        if k.object != ino.0 || k.kind != KeyKind::Extent as u8 || k.a != u64::from(piece.object) {
            continue;
        }
        let e = decode_extent(&k, &v)?;
        if e.state != ExtentState::Written || ob - k.b >= e.len {
            continue;
        }
        if c.eof_tail_dirty(e.target, e.phys + (ob - k.b), a.size)? {
            out.push(ino.0);
        }
    }
    Ok(out)
}

/// The root records in the two slots (`None`: never written or torn), and the slot of
/// the one in charge.
///
/// # Errors
/// Target read errors.
fn root_slots(
    l: &recovery::Opened,
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
fn older_root_slot(l: &recovery::Opened) -> Result<Option<String>> {
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
    /// Per member: its persisted state (as of the durable trees) and whether its device
    /// was given (a retired one need not be).
    pub states: Vec<(stripefs_core::record::TargetState, bool)>,
}

/// Reads everything `inspect` shows, writing nothing (the same streaming walk as
/// [`fsck`]).
///
/// # Errors
/// As [`fsck`].
pub fn inspect(targets: Vec<Arc<dyn Target>>) -> Result<Inspection> {
    let c = check(targets, &mut |_| {})?;
    let o = &c.opened;
    let geo = &o.geo;
    let root_slots = root_slots(o)?;
    let given = o
        .targets
        .iter()
        .enumerate()
        .filter(|(i, _)| !o.absent.contains(*i as u32))
        .map(|(_, t)| Arc::clone(t))
        .collect();
    let sbs = recovery::read_superblocks(given)?.superblocks;
    let stats = o.store.stats();
    let trees = c
        .pages
        .iter()
        .map(|&(tree, pages)| TreeShape {
            tree,
            root_level: stats.trees.iter().find(|t| t.0 == tree).map_or(0, |t| t.1),
            pages,
        })
        .collect();
    let space = (0..geo.target_count() as usize)
        .map(|t| (geo.targets[t].data_blocks(), c.free[t].0, c.free[t].1))
        .collect();
    let mark = o.store.journal_mark();
    Ok(Inspection {
        superblocks: sbs,
        target_names: o
            .targets
            .iter()
            .map(|t| t.info().name.to_string())
            .collect(),
        root_slots,
        generation: o.store.durable_generation().0,
        journal_mark: (mark.tail, mark.seq),
        trees,
        meta_cache: stats.cache,
        journal_txns: c.journal_txns,
        journal_records: c.journal_records,
        journal_used_units: c.journal_head - mark.tail,
        journal_units: geo.journal_units(),
        inodes: c.inodes,
        extents: c.extents,
        space,
        block_size: geo.block_size.bytes(),
        states: (0..o.store.members())
            .map(|t| {
                let state = o.store.target_state(TargetId(t))?;
                Ok((state, !o.absent.contains(t)))
            })
            .collect::<Result<_>>()?,
    })
}

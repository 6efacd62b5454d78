//! Persisted free space (`docs/design/metadata.md`, "Persisted free space").
//!
//! With [`SpaceBooks::Kept`], the space tree's `FreeSpace` items are the free runs of
//! every target's data area: blocks that no extent of the fs tree holds and no metadata
//! page holds. Extent records change them as they are applied ([`extent_change`], called
//! by `items::apply_record` in the same applied transaction as the extent items), and a
//! generation's page log ([`stripefs_core::btree::pagelog`]) changes them for the pages
//! that generation allocated and freed: the store folds a log into the open generation
//! once its root record is durable (or the trees are opened at it), before anything else
//! changes the space tree (`Store::fold_pending`). So the
//! space tree of generation `G` holds the data as of `G`'s cut and the pages as of
//! `G - 1`, and `G`'s log brings the pages up to `G`.
//!
//! Every change checks the set it changes: a run taken must be free, a run given back
//! must not be; a violation is `Corrupted` naming the blocks, never a silent repair.

use std::collections::BTreeMap;

use stripefs_core::btree::pagelog::{LogEntry, LogOp};
use stripefs_core::btree::schema::{decode_free_space, free_space_item};
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_core::extent::ExtentMap;
use stripefs_core::{CoreError, TargetId};

use crate::{MetaError, Store};

/// Whether the store keeps the free space of the data area in its space tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceBooks {
    /// No: the trees hold no free space and checkpoints write no page log (trees used
    /// without a file system's data area: tests, tools).
    Off,
    /// Yes: `FreeSpace` items and a page log with every checkpoint.
    Kept,
}

/// Items fetched per scan.
const BATCH: usize = 1024;

fn key(t: TargetId, start: u64) -> Key {
    Key::new(u64::from(t.0), KeyKind::FreeSpace, start, 0)
}

fn misfit(t: TargetId, start: u64, len: u64, why: &str) -> MetaError {
    CoreError::corrupted(
        format!("free space of target {t}"),
        format!("blocks {start}..{}: {why}", start.saturating_add(len)),
    )
    .into()
}

/// The free run of `t` that starts at or below `start`, if any.
fn run_at_or_below(
    store: &Store,
    t: TargetId,
    start: u64,
) -> Result<Option<(u64, u64)>, MetaError> {
    match store.floor(&key(t, start))? {
        Some((k, v)) if k.kind == KeyKind::FreeSpace as u8 && k.object == u64::from(t.0) => {
            let (_, s, l) = decode_free_space(&k, &v)?;
            Ok(Some((s, l)))
        }
        _ => Ok(None),
    }
}

/// The first free run of `t` starting at or after `start`.
fn run_from(store: &Store, t: TargetId, start: u64) -> Result<Option<(u64, u64)>, MetaError> {
    let to = key(t, u64::MAX).successor();
    let found = store.scan(TreeId::Space, key(t, start), to, 1)?;
    match found.first() {
        Some((k, v)) => {
            let (_, s, l) = decode_free_space(k, v)?;
            Ok(Some((s, l)))
        }
        None => Ok(None),
    }
}

/// Marks `[start, start + len)` of `t` in use.
///
/// # Errors
/// `Corrupted` if any of it is not free.
pub(crate) fn take(store: &Store, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
    let end = start
        .checked_add(len)
        .ok_or_else(|| misfit(t, start, len, "overflow"))?;
    let Some((s, l)) = run_at_or_below(store, t, start)? else {
        return Err(misfit(t, start, len, "taken but not free"));
    };
    if s + l < end {
        return Err(misfit(t, start, len, "taken but not free"));
    }
    store.remove(&key(t, s))?;
    if s < start {
        let (k, v) = free_space_item(t, s, start - s);
        store.insert(k, &v)?;
    }
    if end < s + l {
        let (k, v) = free_space_item(t, end, s + l - end);
        store.insert(k, &v)?;
    }
    Ok(())
}

/// Takes the whole data area `[data_start, blocks)` of `t` out of the free space (the
/// target is retired): it must be exactly one free run.
///
/// # Errors
/// `Corrupted` naming what else the target's free space holds.
pub(crate) fn take_whole_area(
    store: &Store,
    t: TargetId,
    data_start: u64,
    blocks: u64,
) -> Result<(), MetaError> {
    let to = key(t, u64::MAX).successor();
    let runs = store.scan(TreeId::Space, key(t, 0), to, 2)?;
    let first = runs
        .first()
        .map(|(k, v)| decode_free_space(k, v))
        .transpose()?;
    if runs.len() != 1 || first.map(|(_, s, l)| (s, s + l)) != Some((data_start, blocks)) {
        let found = first.map_or_else(
            || "no free run".to_string(),
            |(_, s, l)| format!("a free run {s}..{}", s + l),
        );
        return Err(misfit(
            t,
            data_start,
            blocks - data_start,
            &format!("retired, but its free space is not its whole data area ({found}, {} runs at least)", runs.len()),
        ));
    }
    store.remove(&key(t, data_start))?;
    Ok(())
}

/// Gives back the blocks of `[start, start + len)` that the reference-count index does
/// not hold (an extent left to an inode's free).
///
/// # Errors
/// As [`give`].
pub(crate) fn give_unshared(
    store: &Store,
    t: TargetId,
    start: u64,
    len: u64,
) -> Result<(), MetaError> {
    let run = [(start, start + len)];
    let shared = crate::refcount::shared_runs(store, t, &run)?;
    for (s, e) in minus(&run, &shared) {
        give(store, t, s, e - s)?;
    }
    Ok(())
}

/// Marks `[start, start + len)` of `t` free, merging with its neighbours.
///
/// # Errors
/// `Corrupted` if any of it is free already.
pub(crate) fn give(store: &Store, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
    let end = start
        .checked_add(len)
        .ok_or_else(|| misfit(t, start, len, "overflow"))?;
    let (mut s, mut e) = (start, end);
    if let Some((ps, pl)) = run_at_or_below(store, t, start)? {
        if ps + pl > start {
            return Err(misfit(t, start, len, "freed but already free"));
        }
        if ps + pl == start {
            store.remove(&key(t, ps))?;
            s = ps;
        }
    }
    if let Some((ns, nl)) = run_from(store, t, start)? {
        if ns < end {
            return Err(misfit(t, start, len, "freed but already free"));
        }
        if ns == end {
            store.remove(&key(t, ns))?;
            e = ns + nl;
        }
    }
    let (k, v) = free_space_item(t, s, e - s);
    store.insert(k, &v)?;
    Ok(())
}

/// Records the free runs of a new file system (mkfs): `(target, first block, blocks)`.
///
/// # Errors
/// As [`Store::insert`].
pub fn init(store: &Store, runs: &[(TargetId, u64, u64)]) -> Result<(), MetaError> {
    for &(t, s, l) in runs {
        give(store, t, s, l)?;
    }
    Ok(())
}

/// The persisted free space, `(target, first block, blocks)` in target and block order:
/// the space tree's free runs as of the open generation with the durable generation's
/// page log applied (in memory when it is not folded into the tree yet, so that reading
/// the free space of freshly opened trees changes nothing: a mount and unmount with no
/// change writes no new generation).
///
/// # Errors
/// A page read's error; `Corrupted` for an item that does not decode, or a page log that
/// does not fit the free runs.
pub fn free_runs(store: &Store) -> Result<Vec<(TargetId, u64, u64)>, MetaError> {
    let mut runs = MapRuns(
        tree_runs(store)?
            .into_iter()
            .map(|(t, s, l)| ((t, s), l))
            .collect(),
    );
    fold_into(&mut runs, &store.pending_log(), store.page_blocks())?;
    Ok(runs.0.into_iter().map(|((t, s), l)| (t, s, l)).collect())
}

/// The free runs the space tree holds.
fn tree_runs(store: &Store) -> Result<Vec<(TargetId, u64, u64)>, MetaError> {
    let mut out = Vec::new();
    let mut from = Key::new(0, KeyKind::FreeSpace, 0, 0);
    loop {
        let items = store.scan(TreeId::Space, from, None, BATCH)?;
        let Some((last, _)) = items.last() else {
            return Ok(out);
        };
        let next = last.successor();
        for (k, v) in &items {
            if k.kind == KeyKind::FreeSpace as u8 {
                out.push(decode_free_space(k, v)?);
            }
        }
        match next {
            Some(k) => from = k,
            None => return Ok(out),
        }
    }
}

/// Physical runs of an extent map window on target `t`, sorted and merged.
fn phys_runs(map: &ExtentMap, t: TargetId) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = map
        .iter()
        .filter(|(_, e)| e.target == t)
        .map(|(_, e)| (e.phys, e.phys + e.len))
        .collect();
    v.sort_unstable();
    merged(v)
}

/// Sorted `[start, end)` pairs, overlapping or touching ones merged.
fn merged(v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `a` minus `b`, both sorted and merged.
fn minus(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(mut s, e) in a {
        for &(bs, be) in b {
            if be <= s || bs >= e {
                continue;
            }
            if bs > s {
                out.push((s, bs));
            }
            s = s.max(be);
            if s >= e {
                break;
            }
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

/// The free-space side of an extent record: blocks the window of one object's map held
/// before and no longer holds are free, blocks it holds now and did not are used; blocks
/// the reference-count index holds are neither (other extents map them: a clone logs its
/// increments before its extent records, a release its decrements after them).
///
/// # Errors
/// `Corrupted` when a block freed is free already or a block used is not free (two
/// extents claiming a block, or an extent over a metadata page).
pub(crate) fn extent_change(
    store: &Store,
    before: &ExtentMap,
    after: &ExtentMap,
) -> Result<(), MetaError> {
    let mut targets: Vec<TargetId> = before
        .iter()
        .chain(after.iter())
        .map(|(_, e)| e.target)
        .collect();
    targets.sort_unstable();
    targets.dedup();
    for t in targets {
        target_change(store, t, before, after)?;
    }
    Ok(())
}

/// [`extent_change`] on one target.
fn target_change(
    store: &Store,
    t: TargetId,
    before: &ExtentMap,
    after: &ExtentMap,
) -> Result<(), MetaError> {
    let (old, new) = (phys_runs(before, t), phys_runs(after, t));
    let mut all: Vec<(u64, u64)> = old.iter().chain(new.iter()).copied().collect();
    all.sort_unstable();
    let shared = crate::refcount::shared_runs(store, t, &merged(all))?;
    let (old, new) = (minus(&old, &shared), minus(&new, &shared));
    for (s, e) in minus(&old, &new) {
        give(store, t, s, e - s)?;
    }
    for (s, e) in minus(&new, &old) {
        take(store, t, s, e - s)?;
    }
    Ok(())
}

/// A set of free runs that a page log can change.
trait RunSet {
    fn take(&mut self, t: TargetId, start: u64, len: u64) -> Result<(), MetaError>;
    fn give(&mut self, t: TargetId, start: u64, len: u64) -> Result<(), MetaError>;
}

/// The space tree's runs.
struct TreeRuns<'a>(&'a Store);

impl RunSet for TreeRuns<'_> {
    fn take(&mut self, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
        take(self.0, t, start, len)
    }
    fn give(&mut self, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
        give(self.0, t, start, len)
    }
}

/// Runs in memory, with the tree's rules (checked, merged).
struct MapRuns(BTreeMap<(TargetId, u64), u64>);

impl RunSet for MapRuns {
    fn take(&mut self, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
        let end = start
            .checked_add(len)
            .ok_or_else(|| misfit(t, start, len, "overflow"))?;
        let found = self.0.range(..=(t, start)).next_back();
        let Some((&(ft, s), &l)) = found.filter(|((ft, s), l)| *ft == t && s + *l >= end) else {
            return Err(misfit(t, start, len, "taken but not free"));
        };
        self.0.remove(&(ft, s));
        if s < start {
            self.0.insert((t, s), start - s);
        }
        if end < s + l {
            self.0.insert((t, end), s + l - end);
        }
        Ok(())
    }
    fn give(&mut self, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
        let end = start
            .checked_add(len)
            .ok_or_else(|| misfit(t, start, len, "overflow"))?;
        let (mut s, mut e) = (start, end);
        if let Some((&(pt, ps), &pl)) = self.0.range(..=(t, start)).next_back() {
            if pt == t && ps + pl > start {
                return Err(misfit(t, start, len, "freed but already free"));
            }
            if pt == t && ps + pl == start {
                self.0.remove(&(t, ps));
                s = ps;
            }
        }
        if let Some((&(nt, ns), &nl)) = self.0.range((t, start)..).next() {
            if nt == t && ns < end {
                return Err(misfit(t, start, len, "freed but already free"));
            }
            if nt == t && ns == end {
                self.0.remove(&(t, ns));
                e = ns + nl;
            }
        }
        self.0.insert((t, s), e - s);
        Ok(())
    }
}

/// Applies a page log to the space tree: its freed pages become free, its allocated
/// pages used.
///
/// # Errors
/// `Corrupted` when the log frees a block that is free or allocates one that is not.
pub(crate) fn fold(store: &Store, entries: &[LogEntry], page_blocks: u64) -> Result<(), MetaError> {
    fold_into(&mut TreeRuns(store), entries, page_blocks)
}

/// Applies a page log to a set of runs. Pages next to each other with the same change
/// are one run.
fn fold_into(
    set: &mut impl RunSet,
    entries: &[LogEntry],
    page_blocks: u64,
) -> Result<(), MetaError> {
    let mut by: BTreeMap<(LogOp, TargetId, u64), ()> = BTreeMap::new();
    for e in entries {
        by.insert((e.op, e.at.target, e.at.block.0), ());
    }
    let mut run: Option<(LogOp, TargetId, u64, u64)> = None;
    let mut flush = |r: (LogOp, TargetId, u64, u64)| match r.0 {
        LogOp::Freed => set.give(r.1, r.2, r.3),
        LogOp::Allocated => set.take(r.1, r.2, r.3),
    };
    for &(op, t, b) in by.keys() {
        run = match run {
            Some((o, rt, s, l)) if o == op && rt == t && s + l == b => {
                Some((o, rt, s, l + page_blocks))
            }
            Some(r) => {
                flush(r)?;
                Some((op, t, b, page_blocks))
            }
            None => Some((op, t, b, page_blocks)),
        };
    }
    if let Some(r) = run {
        flush(r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_in_memory_keep_the_rules() {
        let t = TargetId(1);
        let mut r = MapRuns(BTreeMap::new());
        r.give(t, 10, 10).unwrap();
        r.give(TargetId(0), 20, 5).unwrap();
        r.give(t, 20, 5).unwrap();
        assert_eq!(r.0.get(&(t, 10)), Some(&15), "merged with the run before");
        assert!(r.give(t, 24, 2).is_err(), "double free");
        r.take(t, 12, 3).unwrap();
        assert_eq!(r.0.get(&(t, 10)), Some(&2));
        assert_eq!(r.0.get(&(t, 15)), Some(&10));
        assert!(r.take(t, 11, 2).is_err(), "not free");
        assert!(r.take(TargetId(0), 24, 2).is_err(), "past the run");
        r.give(t, 12, 3).unwrap();
        assert_eq!(r.0.get(&(t, 10)), Some(&15), "merged both sides");
    }

    #[test]
    fn minus_of_runs() {
        assert_eq!(
            minus(&[(0, 10)], &[(2, 4), (6, 7)]),
            vec![(0, 2), (4, 6), (7, 10)]
        );
        assert_eq!(minus(&[(0, 10)], &[(0, 10)]), vec![]);
        assert_eq!(
            minus(&[(5, 10), (20, 30)], &[(0, 6), (25, 40)]),
            vec![(6, 10), (20, 25)]
        );
    }
}

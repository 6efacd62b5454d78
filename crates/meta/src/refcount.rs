//! The reference-count index as items of the `refcount` tree (`docs/design/reflink.md`):
//! `(target, Refcount, first block, 0)` -> length u64, count u32, only for counts of 2 and
//! more, kept canonical exactly as `stripefs_core::refcount::RefcountIndex` keeps them (a
//! `RefcountSet` reads the entries around its range into an index, sets, and writes the
//! difference), so the items and the in-memory model agree entry for entry.

use std::collections::BTreeMap;

use stripefs_core::btree::schema::{decode_refcount, refcount_item, refcount_key};
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_core::refcount::{RefcountIndex, Shared};
use stripefs_core::TargetId;

use crate::{MetaError, Store};

/// Items fetched per scan.
const BATCH: usize = 1024;

fn is_ours(k: &Key, t: TargetId) -> bool {
    k.kind == KeyKind::Refcount as u8 && k.object == u64::from(t.0)
}

/// The entries of `t` that a change of `[start, end)` can read or change: the last one
/// starting below `start` (split, or merged with) and those starting in `[start, end]`
/// (removed, trimmed, or merged with at `end`).
fn window(store: &Store, t: TargetId, start: u64, end: u64) -> Result<RefcountIndex, MetaError> {
    let mut found = Vec::new();
    if let Some(below) = start.checked_sub(1) {
        if let Some((k, v)) = store.floor(&refcount_key(t, below))? {
            if is_ours(&k, t) {
                found.push((k, v));
            }
        }
    }
    let to = refcount_key(t, end).successor();
    found.extend(store.scan(TreeId::Refcount, refcount_key(t, start), to, usize::MAX)?);
    let mut idx = RefcountIndex::new();
    for (k, v) in found {
        let (kt, s, e) = decode_refcount(&k, &v)?;
        idx.append(kt, s, e)
            .map_err(|d| stripefs_core::CoreError::corrupted(format!("refcount item {k:?}"), d))?;
    }
    Ok(idx)
}

/// Applies a `RefcountSet`: the count of `[start, start + len)` on `t` becomes `count`.
///
/// # Errors
/// A page read's error; `Corrupted` for an item that does not decode or entries that
/// overlap.
pub(crate) fn set(
    store: &Store,
    t: TargetId,
    start: u64,
    len: u64,
    count: u32,
) -> Result<(), MetaError> {
    let end = start.saturating_add(len);
    let before = window(store, t, start, end)?;
    let mut after = before.clone();
    after.set(t, start, len, count);
    let old: BTreeMap<u64, Shared> = before.iter().map(|(_, s, e)| (s, e)).collect();
    let new: BTreeMap<u64, Shared> = after.iter().map(|(_, s, e)| (s, e)).collect();
    for s in old.keys().filter(|s| !new.contains_key(s)) {
        store.remove(&refcount_key(t, *s))?;
    }
    for (s, e) in new.iter().filter(|(s, e)| old.get(s) != Some(e)) {
        let (k, v) = refcount_item(t, *s, *e);
        store.insert(k, &v)?;
    }
    Ok(())
}

/// The shared runs of `t` overlapping `runs` (sorted, merged `[start, end)` pairs),
/// as sorted, merged `[start, end)` pairs.
///
/// # Errors
/// As [`set`].
pub(crate) fn shared_runs(
    store: &Store,
    t: TargetId,
    runs: &[(u64, u64)],
) -> Result<Vec<(u64, u64)>, MetaError> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(s, e) in runs {
        for (_, ks, sh) in window(store, t, s, e)?.iter() {
            let (lo, hi) = (ks.max(s), (ks + sh.len).min(e));
            if lo < hi {
                match out.last_mut() {
                    Some(last) if last.1 >= lo => last.1 = last.1.max(hi),
                    _ => out.push((lo, hi)),
                }
            }
        }
    }
    Ok(out)
}

/// The whole index (the runtime keeps it in memory: only shared ranges, merged).
///
/// # Errors
/// A page read's error; `Corrupted` for an item that does not decode or entries that
/// overlap.
pub fn load(store: &Store) -> Result<RefcountIndex, MetaError> {
    let mut idx = RefcountIndex::new();
    let mut from = Key::new(0, KeyKind::Refcount, 0, 0);
    loop {
        let items = store.scan(TreeId::Refcount, from, None, BATCH)?;
        let Some((last, _)) = items.last() else {
            return Ok(idx);
        };
        let next = last.successor();
        for (k, v) in &items {
            let (t, s, e) = decode_refcount(k, v)?;
            idx.append(t, s, e).map_err(|d| {
                stripefs_core::CoreError::corrupted(format!("refcount item {k:?}"), d)
            })?;
        }
        match next {
            Some(k) => from = k,
            None => return Ok(idx),
        }
    }
}

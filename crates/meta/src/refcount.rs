//! The reference-count index as items of the `refcount` tree (`docs/design/reflink.md`):
//! `(target, Refcount, first block, 0)` -> length u64, count u32, only for counts of 2 and
//! more, kept canonical exactly as `stripefs_core::refcount::RefcountIndex` keeps them (a
//! `RefcountSet` reads the entries around its range into an index, sets, and writes the
//! difference), so the items and the in-memory model agree entry for entry.
//!
//! # Readers while a record is applied
//!
//! The runtime does not hold the index in memory: it asks these items for every block
//! its overlay of unapplied records does not hold (`crates/fs/src/refcount.rs`), while
//! the checkpointer applies records here with no lock of the file system. So a reader
//! of a block `b` outside the range `R` of the record being applied must find `b`'s
//! count at every moment of [`set`]. Readers use only [`Store::floor`], which is one
//! atomic look at the tree (it restarts from the root after a miss): the count of `b`
//! is that of the item with the greatest key at or below `b` if it reaches `b`, else 1
//! ([`counts`], walking down from the end of its range one floor per entry). A scan is
//! not used: it resumes after a page miss, so its items are not all seen at one moment.
//!
//! Let `O` be the entries before the record and `N` after (both canonical). Every key
//! holds, at any moment, nothing, its `O` value or its `N` value. For `b` outside `R`
//! the count is the same in `O` and `N`, so an `O` or `N` entry reaching `b` always
//! gives the right count, and a block of count 1 is reached by none: the only failure is
//! that the floor of `b` is an item that does not reach `b` although `b` is shared. With
//! `ko` the key of `b`'s entry in `O` and `kn` in `N`, [`set`] writes in three phases:
//!
//! 1. insert the keys of `N` that `O` lacks, in **descending** key order;
//! 2. overwrite the keys in both whose entry changed;
//! 3. remove the keys of `O` that `N` lacks, in **ascending** key order.
//!
//! - `ko == kn`: the key is never absent, and both its values reach `b`.
//! - `ko < kn`: `kn` is new (no key of `O` lies in `(ko, b]`), and the only keys in
//!   `(ko, b]` are new keys at or below `kn`. Until `kn` is inserted, descending order
//!   means no such key is present yet and `ko` still holds its `O` value (phase 2 has
//!   not begun): the floor is `ko`. From then on it is `kn`, which never changes again.
//! - `kn < ko`: `ko` is stale (no key of `N` lies in `(kn, b]`), and the only keys in
//!   `(kn, b]` are stale keys at or below `ko`. Until `ko` is removed it holds its `O`
//!   value and is the floor; ascending removal has removed every stale key below it
//!   first, so afterwards the floor is `kn`, which holds its `N` value since phase 2.
//!
//! The order the file system used before (stale keys removed first, then changed and
//! new keys written in ascending order) fails the first split: setting `[5, 6)` of
//! `[0, 10)` count 2 to 1 rewrote key 0 as `[0, 5)` before inserting key 6, so a reader
//! of block 8 in between found count 1 (`tests/refcount_concurrent.rs`). Blocks inside
//! `R` are not covered by this argument: the runtime's overlay answers for them until
//! the record is applied.

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
    // The order readers rely on (module documentation): new keys from the highest down,
    // then changed keys, then stale keys from the lowest up.
    for (s, e) in new.iter().rev().filter(|(s, _)| !old.contains_key(s)) {
        let (k, v) = refcount_item(t, *s, *e);
        store.insert(k, &v)?;
    }
    for (s, e) in new
        .iter()
        .filter(|(s, e)| old.get(s).is_some_and(|o| o != *e))
    {
        let (k, v) = refcount_item(t, *s, *e);
        store.insert(k, &v)?;
    }
    for s in old.keys().filter(|s| !new.contains_key(s)) {
        store.remove(&refcount_key(t, *s))?;
    }
    Ok(())
}

/// The entries of `t` over `[start, end)`, cut to it, in block order: `(first block,
/// range)`; blocks no entry reaches have one owner. Read one [`Store::floor`] per entry,
/// from the end down, so that a reader without the caller's locks gets the count of
/// every block the record being applied does not change (module documentation). The
/// entries may not be canonical while a record is applied (two neighbours with one
/// count): callers canonicalise.
///
/// # Errors
/// A page read's error; `Corrupted` for an item that does not decode.
pub fn shared(
    store: &Store,
    t: TargetId,
    start: u64,
    end: u64,
) -> Result<Vec<(u64, Shared)>, MetaError> {
    let mut out = Vec::new();
    let mut pos = end;
    while pos > start {
        let Some((k, v)) = store.floor(&refcount_key(t, pos - 1))? else {
            break;
        };
        if !is_ours(&k, t) {
            break;
        }
        let (_, s, e) = decode_refcount(&k, &v)?;
        let (lo, hi) = (s.max(start), s.saturating_add(e.len).min(pos));
        if hi > lo {
            out.push((
                lo,
                Shared {
                    len: hi - lo,
                    count: e.count,
                },
            ));
        }
        pos = s;
    }
    out.reverse();
    Ok(out)
}

/// Whether the tree holds no entry at all (one descent).
///
/// # Errors
/// As [`shared`].
pub fn is_empty(store: &Store) -> Result<bool, MetaError> {
    let from = Key::new(0, KeyKind::Refcount, 0, 0);
    Ok(store.scan(TreeId::Refcount, from, None, 1)?.is_empty())
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

/// The whole index, by one scan (fsck and tests; the runtime reads entries on demand
/// with [`shared`]). Not for a reader racing the checkpointer: a scan may see an entry
/// and the entry that replaces it at once.
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

//! The data checksum index as items of the `csum` tree (`docs/design/reflink.md`, "Data
//! checksums"): `(target, DataCsum, first block, 0)` -> crc32c u32 per block of a run of 1
//! to `CSUM_RUN_MAX` blocks. Runs never overlap once a record is applied; where they start
//! is not canonical (a clear trims runs, a set writes runs of at most `CSUM_RUN_MAX`
//! from its first block), so comparisons are per block ([`each`]).
//!
//! Readers do not take the file system's metadata lock (`lookup`, `any`): the checksum of
//! a block a file maps does not change while it is mapped, and a record's changes are
//! ordered so that a block whose checksum the record does not change is covered by some
//! item at every moment (new runs are inserted before the runs they trim are shortened or
//! removed; a trimmed run that keeps its first block is rewritten in place by one insert).
//! A reader may see two items cover a block for a moment; they agree on it.

use stripefs_core::btree::schema::{csum_item, csum_key, decode_csum};
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_core::csum::{BlockCsum, CSUM_RUN_MAX};
use stripefs_core::TargetId;

use crate::{MetaError, Store};

/// Items fetched per scan.
const BATCH: usize = 256;

fn is_ours(k: &Key, t: TargetId) -> bool {
    k.kind == KeyKind::DataCsum as u8 && k.object == u64::from(t.0)
}

/// One stored run. `decode_csum` refuses a run passing `PHYS_BLOCKS_MAX` (decision 93),
/// so `start + len` and iterating `start..` over a decoded run cannot overflow.
type Run = (u64, Vec<BlockCsum>);

/// The runs of `t` overlapping `[start, end)`, in key order (the one starting below
/// `start` first, if it reaches `start`).
fn overlapping(store: &Store, t: TargetId, start: u64, end: u64) -> Result<Vec<Run>, MetaError> {
    let mut out = Vec::new();
    if let Some(below) = start.checked_sub(1) {
        if let Some((k, v)) = store.floor(&csum_key(t, below))? {
            if is_ours(&k, t) {
                let (_, s, c) = decode_csum(&k, &v)?;
                if s + c.len() as u64 > start {
                    out.push((s, c));
                }
            }
        }
    }
    let mut from = csum_key(t, start);
    let to = Some(csum_key(t, end));
    loop {
        let items = store.scan(TreeId::Csum, from, to, BATCH)?;
        let Some((last, _)) = items.last() else {
            return Ok(out);
        };
        let next = last.successor();
        for (k, v) in &items {
            let (_, s, c) = decode_csum(k, v)?;
            out.push((s, c));
        }
        if items.len() < BATCH {
            return Ok(out);
        }
        match next {
            Some(k) => from = k,
            None => return Ok(out),
        }
    }
}

/// Replaces the checksums of `[start, end)` on `t` by `new` (`None`: no checksums; else
/// exactly `end - start` of them). Order, so that a concurrent reader finds every block
/// the change does not touch covered by some run at every moment: the tail of a run
/// passing `end` is written at `end` first; then the new runs; then a run starting
/// below `start` is shortened in place (one insert over its key); last, the runs keyed
/// inside `[start, end)` that no new run replaced are removed.
fn replace(
    store: &Store,
    t: TargetId,
    start: u64,
    end: u64,
    new: Option<&[BlockCsum]>,
) -> Result<(), MetaError> {
    let old = overlapping(store, t, start, end)?;
    let at = |s: u64, b: u64| usize::try_from(b - s).expect("inside the run");
    for (s, c) in &old {
        let run_end = s + c.len() as u64;
        if run_end > end {
            let (k, v) = csum_item(t, end, &c[at(*s, end)..]);
            store.insert(k, &v)?;
        }
    }
    let mut new_keys = Vec::new();
    if let Some(csums) = new {
        let mut b = start;
        for chunk in csums.chunks(CSUM_RUN_MAX) {
            let (k, v) = csum_item(t, b, chunk);
            store.insert(k, &v)?;
            new_keys.push(b);
            b += chunk.len() as u64;
        }
    }
    for (s, c) in &old {
        if *s < start {
            let (k, v) = csum_item(t, *s, &c[..at(*s, start)]);
            store.insert(k, &v)?;
        } else if !new_keys.contains(s) {
            store.remove(&csum_key(t, *s))?;
        }
    }
    Ok(())
}

/// Applies a `CsumSet`: the checksums of `[start, start + csums.len())` on `t`.
///
/// # Errors
/// A page read's error; `Corrupted` for an item that does not decode.
pub(crate) fn set(
    store: &Store,
    t: TargetId,
    start: u64,
    csums: &[BlockCsum],
) -> Result<(), MetaError> {
    let end = start.saturating_add(csums.len() as u64);
    replace(store, t, start, end, Some(csums))
}

/// Applies a `CsumClear`: no checksum for `[start, start + len)` on `t`.
///
/// # Errors
/// As [`set`].
pub(crate) fn clear(store: &Store, t: TargetId, start: u64, len: u64) -> Result<(), MetaError> {
    replace(store, t, start, start.saturating_add(len), None)
}

/// The checksum of each block of `[start, start + len)` on `t` (`None`: the block has
/// none), read from the trees without any lock of the caller's.
///
/// # Errors
/// As [`set`].
pub fn lookup(
    store: &Store,
    t: TargetId,
    start: u64,
    len: u64,
) -> Result<Vec<Option<BlockCsum>>, MetaError> {
    let end = start.saturating_add(len);
    let n = usize::try_from(len).map_err(|_| {
        MetaError::from(stripefs_core::CoreError::Limit(format!(
            "checksum lookup of {len} blocks"
        )))
    })?;
    let mut out = vec![None; n];
    for (s, c) in overlapping(store, t, start, end)? {
        for (b, v) in (s..).zip(&c) {
            if (start..end).contains(&b) {
                let slot = &mut out[usize::try_from(b - start).expect("inside the range")];
                slot.get_or_insert(*v);
            }
        }
    }
    Ok(out)
}

/// Whether any block of `[start, start + len)` on `t` has a checksum in the trees: one
/// floor and a scan of at most one item (issue 13's "do checksums exist for this
/// extent?"). The item found is decoded: a damaged one is `Corrupted`, not a yes.
///
/// # Errors
/// As [`set`].
pub fn any(store: &Store, t: TargetId, start: u64, len: u64) -> Result<bool, MetaError> {
    let end = start.saturating_add(len);
    if let Some(below) = start.checked_sub(1) {
        if let Some((k, v)) = store.floor(&csum_key(t, below))? {
            if is_ours(&k, t) {
                let (_, s, c) = decode_csum(&k, &v)?;
                if s + c.len() as u64 > start {
                    return Ok(true);
                }
            }
        }
    }
    let items = store.scan(TreeId::Csum, csum_key(t, start), Some(csum_key(t, end)), 1)?;
    for (k, v) in &items {
        decode_csum(k, v)?;
    }
    Ok(!items.is_empty())
}

/// Every checksum of the trees in block order, a batch of items at a time (memory
/// follows the batch, not the index): `(target, block, checksum)`.
///
/// # Errors
/// As [`set`]; also `Corrupted` when runs overlap or are out of order.
pub fn each(
    store: &Store,
    f: &mut dyn FnMut(TargetId, u64, BlockCsum) -> Result<(), MetaError>,
) -> Result<(), MetaError> {
    let mut from = Key::new(0, KeyKind::DataCsum, 0, 0);
    let mut last_end: Option<(TargetId, u64)> = None;
    loop {
        let items = store.scan(TreeId::Csum, from, None, BATCH)?;
        let Some((last, _)) = items.last() else {
            return Ok(());
        };
        let next = last.successor();
        for (k, v) in &items {
            let (t, s, c) = decode_csum(k, v)?;
            if let Some((lt, le)) = last_end {
                if lt == t && s < le {
                    return Err(stripefs_core::CoreError::corrupted(
                        format!("checksum item {k}"),
                        format!("run at block {s} overlaps the previous run, which ends at {le}"),
                    )
                    .into());
                }
            }
            last_end = Some((t, s + c.len() as u64));
            for (b, x) in (s..).zip(&c) {
                f(t, b, *x)?;
            }
        }
        match next {
            Some(k) => from = k,
            None => return Ok(()),
        }
    }
}

/// The whole index in a model's form (tests, small file systems only).
///
/// # Errors
/// As [`each`].
pub fn load(store: &Store) -> Result<stripefs_core::csum::CsumMap, MetaError> {
    let mut m = stripefs_core::csum::CsumMap::new();
    each(store, &mut |t, b, c| {
        m.set(t, b, &[c]);
        Ok(())
    })?;
    Ok(m)
}

//! The journal after the durable root record's mark, applied to the trees in memory
//! (`items::apply_record`: dirty pages in the store's cache, nothing written; bounded by
//! the journal's size), each transaction checked against the rules of
//! `stripefs_core::check::ReplayCheck`, restricted to what it touched, with the trees and
//! the walk's [`Tallies`] and [`BlockMap`] in place of a whole `MetaState`. A transaction
//! that breaks a rule is corruption naming it, as at mount.

use std::collections::BTreeSet;

use stripefs_core::btree::key::COLLISIONS_MAX;
use stripefs_core::btree::schema::{
    decode_dir_entry, decode_extent, decode_inode, dir_entry_key, extent_key, inode_key,
};
use stripefs_core::btree::{name_hash, Key, KeyKind, TreeId};
use stripefs_core::check::{extent_problem, layout_problem, name_problem};
use stripefs_core::extent::Extent;
use stripefs_core::inode::{FileKind, InodeAttrs};
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino};
use stripefs_meta::{items, Store};

use super::tally::Claimant;
use super::walk::Checker;
use crate::error::Result;
use crate::recovery::TxnAt;

/// What one transaction touched, checked at its end.
#[derive(Debug, Default)]
pub struct Touched {
    pub inodes: BTreeSet<Ino>,
    pub entries: BTreeSet<(Ino, Vec<u8>)>,
}

/// Applies one transaction to the trees in memory, checking it.
///
/// # Errors
/// `Corrupted` naming the transaction when a record does not apply or the transaction
/// breaks a rule; a page read's error.
pub fn apply_txn(
    c: &mut Checker<'_>,
    store: &Store,
    at: TxnAt,
    recs: &[Record],
    touched_all: &mut BTreeSet<Ino>,
) -> Result<()> {
    let named = |e: String| CoreError::corrupted(at.to_string(), e);
    let mut t = Touched::default();
    for rec in recs {
        let mut r = Txn {
            c,
            store,
            t: &mut t,
        };
        r.before(rec)?.map_err(named)?;
        items::apply_record(store, rec).map_err(|e| named(e.to_string()))?;
        r.after(rec)?;
    }
    let mut problems = Vec::new();
    let mut r = Txn {
        c,
        store,
        t: &mut t,
    };
    r.end(&mut problems)?;
    touched_all.extend(t.inodes.iter().copied());
    if problems.is_empty() {
        Ok(())
    } else {
        Err(named(problems.join("; ")).into())
    }
}

struct Txn<'c, 'a, 's> {
    c: &'c mut Checker<'a>,
    store: &'s Store,
    t: &'c mut Touched,
}

/// A rule a record breaks.
type Broken = std::result::Result<(), String>;

impl Txn<'_, '_, '_> {
    fn attrs(&self, ino: Ino) -> Result<Option<InodeAttrs>> {
        if ino.0 == 0 {
            return Ok(None);
        }
        let key = inode_key(ino);
        Ok(match self.store.get(&key)? {
            Some(v) => Some(decode_inode(&key, &v)?),
            None => None,
        })
    }

    /// The extents of `ino` object `obj` overlapping `start..end` (all: `None`).
    fn extents(&self, ino: Ino, obj: u32, range: Option<(u64, u64)>) -> Result<Vec<(u64, Extent)>> {
        let (start, end) = range.unwrap_or((0, u64::MAX));
        let mut out = Vec::new();
        if let Some(below) = start.checked_sub(1) {
            if let Some((k, v)) = self.store.floor(&extent_key(ino, obj, below))? {
                if k.object == ino.0 && k.kind == KeyKind::Extent as u8 && k.a == u64::from(obj) {
                    let e = decode_extent(&k, &v)?;
                    if k.b.saturating_add(e.len) > start {
                        out.push((k.b, e));
                    }
                }
            }
        }
        let from = extent_key(ino, obj, start);
        let to = if end == u64::MAX {
            Key::new(ino.0, KeyKind::Extent, u64::from(obj), u64::MAX).successor()
        } else {
            Some(extent_key(ino, obj, end))
        };
        for (k, v) in self.store.scan(TreeId::Fs, from, to, usize::MAX)? {
            out.push((k.b, decode_extent(&k, &v)?));
        }
        Ok(out)
    }

    /// Frees the blocks mapped in `start..end` of an object in the block map.
    fn release(&mut self, a: &InodeAttrs, obj: u32, range: Option<(u64, u64)>) -> Result<()> {
        for (s, e) in self.extents(a.ino, obj, range)? {
            let target = e.target;
            let (lo, hi) = range.unwrap_or((0, u64::MAX));
            let from = s.max(lo);
            let to = (s + e.len).min(hi);
            if from < to {
                // Shared blocks stay claimed (by the index's range) while owners remain.
                for (p, l, c) in self.c.refs.pieces(target, e.phys + (from - s), to - from) {
                    if c < 2 {
                        self.c.blocks.release(target, p, l);
                    }
                }
            }
        }
        Ok(())
    }

    /// Claims the unshared blocks of `[phys, phys + len)` (shared ones are the index's).
    fn claim(&mut self, t: stripefs_core::TargetId, phys: u64, len: u64) -> Broken {
        for (p, l, c) in self.c.refs.pieces(t, phys, len) {
            if c < 2 {
                self.c
                    .blocks
                    .claim(t, p, l, Claimant::Extent)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn objects(a: &InodeAttrs) -> u32 {
        if a.kind == FileKind::Regular {
            a.layout.count
        } else {
            0
        }
    }

    /// The regular file owning object `obj` of `ino`, as `ReplayCheck` words it.
    fn owner(&self, ino: Ino, obj: u32) -> Result<std::result::Result<InodeAttrs, String>> {
        let Some(a) = self.attrs(ino)? else {
            return Ok(Err(format!("extent record for missing inode {ino}")));
        };
        if a.kind != FileKind::Regular {
            return Ok(Err(format!(
                "inode {ino} of type {:?} owns extents",
                a.kind
            )));
        }
        if obj >= a.layout.count
            || layout_problem(&a, a.layout.count as usize, self.c.geo).is_some()
        {
            return Ok(Err(format!("inode {ino} has no object {obj}")));
        }
        Ok(Ok(a))
    }

    /// The entry `name` of `dir`, if any.
    fn entry(&self, dir: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
        let h = name_hash(self.store.uuid(), name);
        let from = dir_entry_key(dir, h, 0);
        let to = dir_entry_key(dir, h, COLLISIONS_MAX).successor();
        for (k, v) in self.store.scan(TreeId::Fs, from, to, usize::MAX)? {
            let e = decode_dir_entry(&k, &v)?;
            if e.name == name {
                return Ok(Some((e.ino, e.kind)));
            }
        }
        Ok(None)
    }

    fn unlink_entry(&mut self, dir: Ino, name: &[u8]) -> Result<()> {
        if let Some((ino, kind)) = self.entry(dir, name)? {
            self.c.tallies.remove_entry(dir, ino, kind);
            self.t.inodes.insert(ino);
        }
        Ok(())
    }

    /// Per-record rules, before `rec` is applied, and the bookkeeping that needs the
    /// trees as they were.
    fn before(&mut self, rec: &Record) -> Result<Broken> {
        match rec {
            Record::InodeSet(a) => {
                self.t.inodes.insert(a.ino);
                return self.set_attrs(a);
            }
            Record::InodeFree(ino) => {
                if *ino == Ino::ROOT {
                    return Ok(Err("root inode 1 is freed".into()));
                }
                self.t.inodes.insert(*ino);
                if let Some(a) = self.attrs(*ino)? {
                    self.release_all(&a)?;
                    let mut gone = Vec::new();
                    super::links::entries_of(self.store, *ino, &mut |e, k| gone.push((e, k)))?;
                    for (e, k) in gone {
                        self.c.tallies.remove_entry(*ino, e, k);
                        self.t.inodes.insert(e);
                    }
                }
            }
            Record::ExtentSet {
                ino,
                object,
                block,
                len,
                phys,
                state,
                target,
            } => {
                let a = match self.owner(*ino, *object)? {
                    Ok(a) => a,
                    Err(p) => return Ok(Err(p)),
                };
                let e = Extent {
                    len: *len,
                    phys: *phys,
                    state: *state,
                    target: *target,
                };
                let n = self.c.geo.target_count();
                if let Some(p) = extent_problem(*ino, *object, *block, &e, n) {
                    return Ok(Err(p));
                }
                self.release(&a, *object, Some((*block, *block + *len)))?;
                self.c.extents = self
                    .c
                    .extents
                    .saturating_sub(self.window(&a, *object, *block, *len)?);
                if let Err(err) = self.claim(*target, *phys, *len) {
                    return Ok(Err(format!(
                        "inode {ino} object {object} block {block}: {err}"
                    )));
                }
            }
            Record::ExtentClear {
                ino,
                object,
                block,
                len,
            } => {
                let a = match self.owner(*ino, *object)? {
                    Ok(a) => a,
                    Err(p) => return Ok(Err(p)),
                };
                let Some(end) = block.checked_add(*len) else {
                    return Ok(Err(format!(
                        "inode {ino} object {object}: clear of {len} blocks at block {block}"
                    )));
                };
                self.release(&a, *object, Some((*block, end)))?;
                self.c.extents = self
                    .c
                    .extents
                    .saturating_sub(self.window(&a, *object, *block, *len)?);
            }
            Record::DirAdd {
                dir,
                name,
                ino,
                kind,
            } => {
                if let Some(p) = name_problem(*dir, name) {
                    return Ok(Err(p));
                }
                self.unlink_entry(*dir, name)?;
                self.c.tallies.add_entry(*dir, *ino, *kind);
                self.t.inodes.extend([*dir, *ino]);
                self.t.entries.insert((*dir, name.clone()));
            }
            Record::DirRemove { dir, name } => {
                self.unlink_entry(*dir, name)?;
                self.t.inodes.insert(*dir);
            }
            Record::SymlinkSet { ino, .. } => {
                self.t.inodes.insert(*ino);
            }
            Record::XattrSet { .. } | Record::XattrRemove { .. } => {}
            // Its target joined before the walk (`fsck::join_added`); the store checks
            // that it is the next member when the record is applied.
            Record::TargetAdd { .. } => {}
            Record::TargetState {
                target,
                state: stripefs_core::record::TargetState::Retired { .. },
            } => {
                let used = self.c.blocks.used(*target);
                if used > 0 {
                    return Ok(Err(format!(
                        "target {target} is retired while {used} of its blocks are in use"
                    )));
                }
            }
            Record::TargetState { .. } => {}
            Record::RefcountSet {
                target,
                phys,
                len,
                count,
            } => {
                let Some(g) = self.c.geo.targets.get(target.index()) else {
                    return Ok(Err(format!("refcount of missing target {target}")));
                };
                if *phys < g.data_start || phys.saturating_add(*len) > g.blocks {
                    return Ok(Err(format!(
                        "refcount of target {target} blocks {phys}..+{len} outside the data area"
                    )));
                }
                self.c.refs.set(*target, *phys, *len, *count);
            }
            Record::CsumSet { target, phys, .. } | Record::CsumClear { target, phys, .. } => {
                let len = match rec {
                    Record::CsumSet { csums, .. } => csums.len() as u64,
                    Record::CsumClear { len, .. } => *len,
                    _ => unreachable!("matched above"),
                };
                let Some(g) = self.c.geo.targets.get(target.index()) else {
                    return Ok(Err(format!("checksums of missing target {target}")));
                };
                if *phys < g.data_start || phys.saturating_add(len) > g.blocks {
                    return Ok(Err(format!(
                        "checksums of target {target} blocks {phys}..+{len} outside the data area"
                    )));
                }
            }
        }
        Ok(Ok(()))
    }

    /// Extent items in the window an extent record reads (to count them before and
    /// after it: the walk's count follows the trees).
    /// From one block below to one block past the range: an extent ending where the
    /// range starts or starting where it ends may merge with the new one.
    fn window(&self, a: &InodeAttrs, obj: u32, block: u64, len: u64) -> Result<u64> {
        let end = block.saturating_add(len).saturating_add(1);
        let start = block.saturating_sub(1);
        Ok(self.extents(a.ino, obj, Some((start, end)))?.len() as u64)
    }

    /// After `rec` was applied: the extent count of its window.
    fn after(&mut self, rec: &Record) -> Result<()> {
        if let Record::ExtentSet {
            ino,
            object,
            block,
            len,
            ..
        }
        | Record::ExtentClear {
            ino,
            object,
            block,
            len,
        } = rec
        {
            if let Some(a) = self.attrs(*ino)? {
                self.c.extents += self.window(&a, *object, *block, *len)?;
            }
        }
        Ok(())
    }

    fn release_all(&mut self, a: &InodeAttrs) -> Result<()> {
        for obj in 0..Self::objects(a) {
            self.c.extents = self
                .c
                .extents
                .saturating_sub(self.extents(a.ino, obj, None)?.len() as u64);
            self.release(a, obj, None)?;
        }
        Ok(())
    }

    /// New attributes: the layout rule (a layout change moves no block: extents name
    /// their targets).
    fn set_attrs(&mut self, a: &InodeAttrs) -> Result<Broken> {
        let old = self.attrs(a.ino)?;
        let objects = old.as_ref().map_or_else(|| Self::objects(a), Self::objects);
        if let Some(p) = layout_problem(a, objects as usize, self.c.geo) {
            return Ok(Err(p));
        }
        Ok(Ok(()))
    }

    /// End-of-transaction rules for every inode and entry it touched.
    fn end(&mut self, out: &mut Vec<String>) -> Result<()> {
        for (dir, name) in std::mem::take(&mut self.t.entries) {
            let Some((ino, kind)) = self.entry(dir, &name)? else {
                continue;
            };
            let shown = String::from_utf8_lossy(&name);
            match self.attrs(ino)? {
                None => out.push(format!(
                    "directory {dir} entry {shown:?} points to missing inode {ino}"
                )),
                Some(t) if t.kind != kind => out.push(format!(
                    "directory {dir} entry {shown:?} says {kind:?} but inode {ino} is {:?}",
                    t.kind
                )),
                Some(_) => {}
            }
        }
        for ino in self.t.inodes.clone() {
            self.inode_end(ino, out)?;
        }
        Ok(())
    }

    fn inode_end(&mut self, ino: Ino, out: &mut Vec<String>) -> Result<()> {
        let attrs = self.attrs(ino)?;
        let t = self.c.tallies.inode(ino);
        let count = t.refs;
        let Some(a) = attrs else {
            t.clear_inode();
            if count > 0 {
                out.push(format!(
                    "inode {ino} is freed but {count} entries still reference it"
                ));
            }
            return Ok(());
        };
        t.set_inode(a.kind, a.nlink);
        if a.kind == FileKind::Directory {
            self.c.tallies.dir(ino).parent = a.parent;
        }
        if a.nlink == 0 {
            if count > 0 {
                out.push(format!(
                    "inode {ino} has link count 0, but {count} entries reference it"
                ));
            }
            return Ok(());
        }
        if a.kind == FileKind::Directory {
            let d = *self.c.tallies.dir(ino);
            let want = 2 + d.subdirs;
            if a.nlink != want {
                out.push(format!(
                    "directory {ino} has link count {}, expected {want}",
                    a.nlink
                ));
            }
            let expected = u32::from(ino != Ino::ROOT);
            if count != expected {
                out.push(format!(
                    "directory {ino} is referenced by {count} entries, expected {expected}"
                ));
            }
            if d.lives_in.0 != 0 && d.lives_in != a.parent {
                out.push(format!(
                    "directory {ino} says its parent is {} but it lives in {}",
                    a.parent, d.lives_in
                ));
            }
            if !self.reaches_root(ino)? {
                out.push(format!("inode {ino} is not reachable from the root"));
            }
        } else if a.nlink != count {
            out.push(format!(
                "inode {ino} has link count {}, but {count} entries reference it",
                a.nlink
            ));
        }
        if a.kind == FileKind::Symlink {
            let k = Key::new(ino.0, KeyKind::Symlink, 0, 0);
            if self.store.get(&k)?.is_none() {
                out.push(format!("symlink {ino} has an empty target"));
            }
        }
        Ok(())
    }

    /// Whether directory `ino` reaches the root through its parent pointers (which the
    /// parent rule ties to its entry), each a linked directory.
    fn reaches_root(&self, mut ino: Ino) -> Result<bool> {
        for _ in 0..=self.c.tallies.dirs.len() {
            if ino == Ino::ROOT {
                return Ok(true);
            }
            match self.attrs(ino)? {
                Some(a) if a.kind == FileKind::Directory && a.nlink != 0 => ino = a.parent,
                _ => return Ok(false),
            }
        }
        Ok(false) // a cycle of parent pointers
    }
}

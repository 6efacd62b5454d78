//! Consistency checks over a metadata model: the invariants fsck verifies, and the same
//! rules applied to journal transactions as recovery replays them.
//!
//! Checked: the root exists and is a directory; every entry names an existing inode of the
//! entry's type with a valid name; link counts equal the entries that reference an inode
//! (directories: 2 + subdirectories); every directory is referenced exactly once and its
//! parent pointer agrees; everything is reachable from the root; no inode has link count 0
//! (an orphan that recovery should have freed); striping layouts are valid; extents are
//! well formed, unshared, lie in their target's data area, and no block is claimed twice.
//!
//! [`check`] verifies a whole model (fsck). [`ReplayCheck`] verifies each replayed
//! transaction with the same rule functions, restricted to what the transaction touched,
//! so that mount refuses, naming the transaction, exactly the records fsck would reject.

use std::collections::{BTreeMap, BTreeSet};

use crate::alloc::Allocator;
use crate::extent::Extent;
use crate::geometry::Geometry;
use crate::inode::{DirEntry, FileKind, Inode, InodeAttrs, NAME_MAX};
use crate::meta::MetaState;
use crate::record::Record;
use crate::refcount::RefcountIndex;
use crate::Ino;

/// The outcome of checking a model.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// One sentence per violated invariant.
    pub problems: Vec<String>,
    pub inodes: u64,
    pub extents: u64,
    pub data_blocks_used: u64,
    pub allocator: Allocator,
}

impl CheckReport {
    /// True when no invariant is violated.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every invariant of `meta` against `geo`.
#[must_use]
pub fn check(meta: &MetaState, geo: &Geometry) -> CheckReport {
    let mut r = CheckReport {
        allocator: Allocator::new(geo),
        ..CheckReport::default()
    };
    match meta.get(Ino::ROOT) {
        Some(root) if root.attrs.kind == FileKind::Directory => {}
        Some(_) => r.problems.push("root inode 1 is not a directory".into()),
        None => r.problems.push("root inode 1 is missing".into()),
    }
    for dir in directories(meta) {
        for (name, e) in &dir.entries {
            entry_problems(meta, dir.attrs.ino, name, e, &mut r.problems);
        }
    }
    let refs = references(meta);
    let shared_problems = claim_shared(&mut r.allocator, &meta.refs, geo);
    r.problems.extend(shared_problems);
    for inode in meta.inodes.values() {
        r.inodes += 1;
        link_problems(inode, refs.get(&inode.attrs.ino), &mut r.problems);
        r.problems
            .extend(layout_problem(&inode.attrs, inode.objects.len(), geo));
        check_extents(inode, &meta.refs, geo, &mut r);
        if inode.attrs.ino.0 >= meta.next_ino {
            r.problems.push(format!(
                "inode {} is not below the next inode number {}",
                inode.attrs.ino, meta.next_ino
            ));
        }
    }
    check_reachable(meta, &mut r.problems);
    r.problems
        .extend(meta.refs.first_difference(&derived_refs(meta)));
    r.problems.extend(csum_problem(meta));
    r
}

/// The checksum rule (`crate::csum`): checksums exist exactly for the written blocks of
/// copy-on-write files' extents: none for a free, unwritten or NOCOW block, none missing
/// for a written block of a datacow file. The first violation, described.
#[must_use]
pub fn csum_problem(meta: &MetaState) -> Option<String> {
    let mut want = BTreeSet::new();
    for i in meta.inodes.values() {
        if !crate::csum::datacow(&i.attrs) {
            continue;
        }
        for map in &i.objects {
            for (_, e) in map.iter() {
                if e.state == crate::extent::ExtentState::Written {
                    let t = e.target;
                    want.extend((e.phys..e.phys.saturating_add(e.len)).map(|b| (t, b)));
                }
            }
        }
    }
    for (t, b, c) in meta.csums.iter() {
        if !want.remove(&(t, b)) {
            return Some(format!(
                "checksum {c} of target {t} block {b}, which no written extent of a \
                 copy-on-write file maps"
            ));
        }
    }
    want.first().map(|(t, b)| {
        format!("target {t} block {b}: written block of a copy-on-write file without a checksum")
    })
}

/// Whether `[phys, phys + len)` of `t` leaves its target's data area (or the target
/// does not exist).
fn outside_data(geo: &Geometry, t: crate::TargetId, phys: u64, len: u64) -> bool {
    t.index() >= geo.targets.len()
        || phys.checked_add(len).is_none()
        || geo.targets[t.index()].data_start > phys
        || phys + len > geo.targets[t.index()].blocks
}

fn directories(meta: &MetaState) -> impl Iterator<Item = &Inode> {
    meta.inodes
        .values()
        .filter(|i| i.attrs.kind == FileKind::Directory)
}

/// Entries referencing one inode.
#[derive(Debug, Clone, Default)]
struct Refs {
    /// Entries naming the inode.
    count: u32,
    /// Entries of kind directory in the inode (if it is a directory).
    subdirs: u32,
    /// The directories holding those entries (one per entry).
    parents: Vec<Ino>,
}

fn references(meta: &MetaState) -> BTreeMap<Ino, Refs> {
    let mut refs: BTreeMap<Ino, Refs> = BTreeMap::new();
    for dir in directories(meta) {
        for e in dir.entries.values() {
            add_ref(&mut refs, dir.attrs.ino, e);
        }
    }
    refs
}

fn add_ref(refs: &mut BTreeMap<Ino, Refs>, dir: Ino, e: &DirEntry) {
    let r = refs.entry(e.ino).or_default();
    r.count += 1;
    r.parents.push(dir);
    if e.kind == FileKind::Directory {
        refs.entry(dir).or_default().subdirs += 1;
    }
}

fn remove_ref(refs: &mut BTreeMap<Ino, Refs>, dir: Ino, e: &DirEntry) {
    if let Some(r) = refs.get_mut(&e.ino) {
        r.count = r.count.saturating_sub(1);
        if let Some(at) = r.parents.iter().position(|&p| p == dir) {
            r.parents.swap_remove(at);
        }
    }
    if e.kind == FileKind::Directory {
        if let Some(r) = refs.get_mut(&dir) {
            r.subdirs = r.subdirs.saturating_sub(1);
        }
    }
}

/// Whether `name` may be a directory entry (the problem naming `dir` if not).
#[must_use]
pub fn name_problem(dir: Ino, name: &[u8]) -> Option<String> {
    let bad = name.is_empty()
        || name.len() > NAME_MAX
        || name.contains(&b'/')
        || name.contains(&0)
        || name == b"."
        || name == b"..";
    bad.then(|| {
        format!(
            "directory {dir} has an invalid entry name {:?}",
            String::from_utf8_lossy(name)
        )
    })
}

/// Rules for one directory entry: a valid name naming an existing inode of its type.
fn entry_problems(meta: &MetaState, d: Ino, name: &[u8], e: &DirEntry, out: &mut Vec<String>) {
    out.extend(name_problem(d, name));
    let shown = String::from_utf8_lossy(name);
    match meta.get(e.ino) {
        None => out.push(format!(
            "directory {d} entry {shown:?} points to missing inode {}",
            e.ino
        )),
        Some(t) if t.attrs.kind != e.kind => {
            out.push(format!(
                "directory {d} entry {shown:?} says {:?} but inode {} is {:?}",
                e.kind, e.ino, t.attrs.kind
            ));
        }
        Some(_) => {}
    }
}

/// Rules for one inode's links: its link count against the entries naming it, a
/// directory's single parent, a symlink's target.
fn link_problems(inode: &Inode, r: Option<&Refs>, problems: &mut Vec<String>) {
    let a = &inode.attrs;
    let count = r.map_or(0, |r| r.count);
    if a.nlink == 0 {
        problems.push(format!(
            "inode {} has link count 0 (an orphan that recovery did not free)",
            a.ino
        ));
        return;
    }
    if a.kind == FileKind::Directory {
        let want = 2 + r.map_or(0, |r| r.subdirs);
        if a.nlink != want {
            problems.push(format!(
                "directory {} has link count {}, expected {want}",
                a.ino, a.nlink
            ));
        }
        let expected_refs = u32::from(a.ino != Ino::ROOT);
        if count != expected_refs {
            problems.push(format!(
                "directory {} is referenced by {count} entries, expected {expected_refs}",
                a.ino
            ));
        }
        if let Some(p) = r.and_then(|r| r.parents.first()) {
            if *p != a.parent {
                problems.push(format!(
                    "directory {} says its parent is {} but it lives in {p}",
                    a.ino, a.parent
                ));
            }
        }
    } else if a.nlink != count {
        problems.push(format!(
            "inode {} has link count {}, but {count} entries reference it",
            a.ino, a.nlink
        ));
    }
    if a.kind == FileKind::Symlink && inode.symlink.is_empty() {
        problems.push(format!("symlink {} has an empty target", a.ino));
    }
}

/// Rules for a striping layout: only regular files have one, it fits the targets, and the
/// inode has one extent map per object. `objects` is the number of maps the inode has.
#[must_use]
pub fn layout_problem(a: &InodeAttrs, objects: usize, geo: &Geometry) -> Option<String> {
    if a.kind != FileKind::Regular {
        return (objects != 0)
            .then(|| format!("inode {} of type {:?} owns extents", a.ino, a.kind));
    }
    let l = a.layout;
    let ok = l.count >= 1
        && l.count <= geo.target_count()
        && l.unit_bytes > 0
        && l.unit_bytes.is_multiple_of(geo.block_size.bytes())
        && l.first_target < geo.target_count()
        && objects == l.count as usize;
    (!ok).then(|| format!("inode {} has an invalid stripe layout {l:?}", a.ino))
}

/// Rules for one extent on its own: non-empty, no overflow, on a target of the file
/// system's `targets`.
#[must_use]
pub fn extent_problem(ino: Ino, obj: u32, block: u64, e: &Extent, targets: u32) -> Option<String> {
    let at = || format!("inode {ino} object {obj} block {block}");
    if e.len == 0 || block.checked_add(e.len).is_none() || e.phys.checked_add(e.len).is_none() {
        return Some(format!(
            "{}: extent of {} blocks at physical block {} does not fit",
            at(),
            e.len,
            e.phys
        ));
    }
    (e.target.0 >= targets).then(|| {
        format!(
            "{}: extent on target {}, of {targets} targets",
            at(),
            e.target
        )
    })
}

/// Claims an extent's unshared blocks: they must lie in the target's data area and be
/// claimed by no other extent. Its shared blocks (those `refs` holds) are claimed once,
/// by the index's own range ([`claim_shared`]).
fn claim(
    alloc: &mut Allocator,
    refs: &RefcountIndex,
    inode: &InodeAttrs,
    obj: u32,
    block: u64,
    e: &Extent,
    geo: &Geometry,
) -> Option<String> {
    let target = e.target;
    if target.0 >= geo.target_count() {
        return Some(format!(
            "inode {} object {obj} block {block}: extent on target {target}, of {} targets",
            inode.ino,
            geo.target_count()
        ));
    }
    if refs.is_empty() || e.phys.checked_add(e.len).is_none() {
        return alloc
            .mark_used(target, e.phys, e.len)
            .err()
            .map(|err| format!("inode {} object {obj} block {block}: {err}", inode.ino));
    }
    for (p, l, c) in refs.pieces(target, e.phys, e.len) {
        if c >= 2 {
            continue;
        }
        if let Err(err) = alloc.mark_used(target, p, l) {
            return Some(format!(
                "inode {} object {obj} block {block}: {err}",
                inode.ino
            ));
        }
    }
    None
}

/// Claims the blocks of every entry of the reference-count index (once each).
fn claim_shared(alloc: &mut Allocator, refs: &RefcountIndex, geo: &Geometry) -> Vec<String> {
    let mut out = Vec::new();
    for (t, s, e) in refs.iter() {
        if t.index() >= geo.targets.len() {
            out.push(format!("refcount index names missing target {t}"));
            continue;
        }
        if let Err(err) = alloc.mark_used(t, s, e.len) {
            out.push(format!("refcount index range {s}..{}: {err}", s + e.len));
        }
    }
    out
}

/// The index derived from every extent of `meta`.
#[must_use]
pub fn derived_refs(meta: &MetaState) -> RefcountIndex {
    RefcountIndex::derive(meta.inodes.values().flat_map(|i| {
        i.objects
            .iter()
            .flat_map(|map| map.iter().map(|(_, e)| (e.target, e.phys, e.len)))
    }))
}

fn check_extents(inode: &Inode, refs: &RefcountIndex, geo: &Geometry, r: &mut CheckReport) {
    let a = &inode.attrs;
    for (obj, map) in inode.objects.iter().enumerate() {
        if let Some(p) = map.check() {
            r.problems
                .push(format!("inode {} object {obj}: {p}", a.ino));
        }
        for (block, e) in map.iter() {
            r.extents += 1;
            r.data_blocks_used += e.len;
            r.problems.extend(extent_problem(
                a.ino,
                obj as u32,
                block,
                e,
                geo.target_count(),
            ));
            r.problems
                .extend(claim(&mut r.allocator, refs, a, obj as u32, block, e, geo));
        }
    }
}

fn check_reachable(meta: &MetaState, problems: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    let mut stack = vec![Ino::ROOT];
    while let Some(d) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        if let Some(dir) = meta.get(d) {
            for e in dir.entries.values() {
                if e.kind == FileKind::Directory {
                    stack.push(e.ino);
                } else {
                    seen.insert(e.ino);
                }
            }
        }
    }
    for ino in meta.inodes.keys() {
        if !seen.contains(ino) && meta.inodes[ino].attrs.nlink != 0 {
            problems.push(format!("inode {ino} is not reachable from the root"));
        }
    }
}

/// The rules of [`check`] applied to journal transactions as replay applies them.
///
/// Built from the checkpoint's model (every extent claimed, every entry counted), it keeps
/// the block claims and entry counts up to date record by record, so each transaction is
/// checked in time proportional to what it touched: per record, the extent and layout
/// rules (before the record is applied, so that nothing out of range reaches the model);
/// at the end of the transaction, the entry, link-count, parent and reachability rules for
/// every inode and entry it touched (a transaction is one or more whole operations, so
/// those hold only at its end). Orphans (link count 0, no entries) are allowed: the mount
/// frees them, and fsck reports them as notes.
#[derive(Debug, Clone)]
pub struct ReplayCheck {
    refs: BTreeMap<Ino, Refs>,
    alloc: Allocator,
}

/// What a transaction touched, checked at its end.
#[derive(Debug, Default)]
struct Touched {
    inodes: BTreeSet<Ino>,
    entries: BTreeSet<(Ino, Vec<u8>)>,
}

impl ReplayCheck {
    /// Starts from `meta`, the model the transactions apply to.
    ///
    /// # Errors
    /// The first extent of `meta` that lies outside its target's data area or claims a
    /// block another extent claims.
    pub fn new(meta: &MetaState, geo: &Geometry) -> Result<Self, String> {
        let mut alloc = Allocator::new(geo);
        if let Some(p) = claim_shared(&mut alloc, &meta.refs, geo).into_iter().next() {
            return Err(p);
        }
        for inode in meta.inodes.values() {
            for (obj, map) in inode.objects.iter().enumerate() {
                for (block, e) in map.iter() {
                    let a = &inode.attrs;
                    if let Some(p) = claim(&mut alloc, &meta.refs, a, obj as u32, block, e, geo) {
                        return Err(p);
                    }
                }
            }
        }
        Ok(Self {
            refs: references(meta),
            alloc,
        })
    }

    /// Checks and applies one transaction's records to `meta`.
    ///
    /// # Errors
    /// Every rule the transaction breaks, one sentence each, joined; `meta` and `self` are
    /// then partly updated and must be discarded.
    pub fn apply_txn(
        &mut self,
        meta: &mut MetaState,
        geo: &Geometry,
        recs: &[Record],
    ) -> Result<(), String> {
        let mut touched = Touched::default();
        for rec in recs {
            self.before(meta, geo, rec, &mut touched)?;
            meta.apply(rec).map_err(|e| e.to_string())?;
        }
        let mut problems = Vec::new();
        for (dir, name) in &touched.entries {
            if let Some(e) = meta.get(*dir).and_then(|d| d.entries.get(name)) {
                entry_problems(meta, *dir, name, e, &mut problems);
            }
        }
        for ino in &touched.inodes {
            self.inode_problems(meta, *ino, &mut problems);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Per-record rules, checked before `rec` is applied, and the bookkeeping that needs the
    /// model as it was.
    fn before(
        &mut self,
        meta: &MetaState,
        geo: &Geometry,
        rec: &Record,
        t: &mut Touched,
    ) -> Result<(), String> {
        match rec {
            Record::InodeSet(a) => {
                t.inodes.insert(a.ino);
                self.set_attrs(meta, geo, a)?;
            }
            Record::InodeFree(ino) => {
                if *ino == Ino::ROOT {
                    return Err("root inode 1 is freed".into());
                }
                t.inodes.insert(*ino);
                if let Some(i) = meta.get(*ino) {
                    self.release_all(i, &meta.refs);
                    for e in i.entries.values() {
                        remove_ref(&mut self.refs, *ino, e);
                        t.inodes.insert(e.ino);
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
                let i = extent_owner(meta, *ino, *object)?;
                let e = Extent {
                    len: *len,
                    phys: *phys,
                    state: *state,
                    target: *target,
                };
                if let Some(p) = extent_problem(*ino, *object, *block, &e, geo.target_count()) {
                    return Err(p);
                }
                self.release(i, &meta.refs, (*object, *block, *len));
                if let Some(p) = claim(
                    &mut self.alloc,
                    &meta.refs,
                    &i.attrs,
                    *object,
                    *block,
                    &e,
                    geo,
                ) {
                    return Err(p);
                }
            }
            Record::ExtentClear {
                ino,
                object,
                block,
                len,
            } => {
                let i = extent_owner(meta, *ino, *object)?;
                if block.checked_add(*len).is_none() {
                    return Err(format!(
                        "inode {ino} object {object}: clear of {len} blocks at block {block}"
                    ));
                }
                self.release(i, &meta.refs, (*object, *block, *len));
            }
            Record::DirAdd {
                dir,
                name,
                ino,
                kind,
            } => {
                if let Some(p) = name_problem(*dir, name) {
                    return Err(p);
                }
                self.unlink_entry(meta, *dir, name, t);
                add_ref(
                    &mut self.refs,
                    *dir,
                    &DirEntry {
                        ino: *ino,
                        kind: *kind,
                    },
                );
                t.inodes.extend([*dir, *ino]);
                t.entries.insert((*dir, name.clone()));
            }
            Record::DirRemove { dir, name } => {
                self.unlink_entry(meta, *dir, name, t);
                t.inodes.insert(*dir);
            }
            Record::SymlinkSet { ino, .. } => {
                t.inodes.insert(*ino);
            }
            Record::RefcountSet {
                target, phys, len, ..
            }
            | Record::CsumClear { target, phys, len } => {
                if outside_data(geo, *target, *phys, *len) {
                    let what = match rec {
                        Record::RefcountSet { .. } => "refcount",
                        _ => "checksum clear",
                    };
                    return Err(format!(
                        "{what} of target {target} blocks {phys}..+{len} outside the data area"
                    ));
                }
            }
            Record::CsumSet {
                target,
                phys,
                csums,
            } => {
                let len = csums.len() as u64;
                if outside_data(geo, *target, *phys, len) {
                    return Err(format!(
                        "checksums of target {target} blocks {phys}..+{len} outside the data area"
                    ));
                }
            }
            Record::TargetAdd { target, .. } if target.0 != geo.target_count() => {
                return Err(format!(
                    "adds target {target} to a file system of {} targets",
                    geo.target_count()
                ));
            }
            Record::TargetState { target, .. }
                if target.0 == 0 || target.0 >= geo.target_count() =>
            {
                return Err(format!(
                    "changes the state of target {target} of a file system of {} targets (target 0 is never read-only)",
                    geo.target_count()
                ));
            }
            Record::XattrSet { .. }
            | Record::XattrRemove { .. }
            | Record::TargetAdd { .. }
            | Record::TargetState { .. } => {}
        }
        Ok(())
    }

    /// New attributes: the layout rule (a layout change moves no block: extents name
    /// their targets).
    fn set_attrs(
        &mut self,
        meta: &MetaState,
        geo: &Geometry,
        a: &InodeAttrs,
    ) -> Result<(), String> {
        let old = meta.get(a.ino);
        let objects = old.map_or_else(
            || {
                if a.kind == FileKind::Regular {
                    a.layout.count as usize
                } else {
                    0
                }
            },
            |i| i.objects.len(),
        );
        if let Some(p) = layout_problem(a, objects, geo) {
            return Err(p);
        }
        Ok(())
    }

    /// Drops the entry `name` of `dir` (if any) from the counts.
    fn unlink_entry(&mut self, meta: &MetaState, dir: Ino, name: &[u8], t: &mut Touched) {
        if let Some(old) = meta.get(dir).and_then(|d| d.entries.get(name)) {
            remove_ref(&mut self.refs, dir, old);
            t.inodes.insert(old.ino);
        }
    }

    /// Returns the unshared blocks mapped in `[block, block + len)` of an object (shared
    /// ones stay claimed by the index's range).
    fn release(&mut self, i: &Inode, refs: &RefcountIndex, (obj, block, len): (u32, u64, u64)) {
        for r in i.objects[obj as usize].mapped_in(block, len) {
            self.free_unshared(refs, r.target, r.phys, r.len);
        }
    }

    fn free_unshared(&mut self, refs: &RefcountIndex, t: crate::TargetId, phys: u64, len: u64) {
        for (p, l, c) in refs.pieces(t, phys, len) {
            if c < 2 {
                self.alloc.free_now(t, p, l);
            }
        }
    }

    /// Returns every unshared block of an inode.
    fn release_all(&mut self, i: &Inode, refs: &RefcountIndex) {
        for map in &i.objects {
            for (_, e) in map.iter() {
                self.free_unshared(refs, e.target, e.phys, e.len);
            }
        }
    }

    /// End-of-transaction rules for one touched inode.
    fn inode_problems(&self, meta: &MetaState, ino: Ino, out: &mut Vec<String>) {
        let r = self.refs.get(&ino);
        let count = r.map_or(0, |r| r.count);
        let Some(inode) = meta.get(ino) else {
            if count > 0 {
                out.push(format!(
                    "inode {ino} is freed but {count} entries still reference it"
                ));
            }
            return;
        };
        if inode.attrs.nlink == 0 {
            if count > 0 {
                out.push(format!(
                    "inode {ino} has link count 0, but {count} entries reference it"
                ));
            }
            return;
        }
        link_problems(inode, r, out);
        if !self.reachable(meta, inode) {
            out.push(format!("inode {ino} is not reachable from the root"));
        }
    }

    /// Whether a linked inode is reachable from the root: a directory through its parent
    /// pointers (which [`link_problems`] ties to its entry), anything else through one of
    /// the directories naming it.
    fn reachable(&self, meta: &MetaState, inode: &Inode) -> bool {
        let dir_reachable = |mut d: Ino| {
            for _ in 0..=meta.inodes.len() {
                if d == Ino::ROOT {
                    return true;
                }
                match meta.get(d) {
                    Some(i) if i.attrs.kind == FileKind::Directory && i.attrs.nlink != 0 => {
                        d = i.attrs.parent;
                    }
                    _ => return false,
                }
            }
            false // a cycle of parent pointers
        };
        if inode.attrs.kind == FileKind::Directory {
            return dir_reachable(inode.attrs.ino);
        }
        self.refs
            .get(&inode.attrs.ino)
            .is_some_and(|r| r.parents.iter().any(|&p| dir_reachable(p)))
    }
}

/// The regular file owning object `obj` of inode `ino`.
fn extent_owner(meta: &MetaState, ino: Ino, obj: u32) -> Result<&Inode, String> {
    let i = meta
        .get(ino)
        .ok_or_else(|| format!("extent record for missing inode {ino}"))?;
    if i.attrs.kind != FileKind::Regular {
        return Err(format!(
            "inode {ino} of type {:?} owns extents",
            i.attrs.kind
        ));
    }
    if obj as usize >= i.objects.len() {
        return Err(format!("inode {ino} has no object {obj}"));
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent::ExtentState;
    use crate::geometry::MkfsParams;
    use crate::inode::Timespec;
    use crate::layout::StripeLayout;
    use crate::{BlockSize, TargetId, Uuid};

    fn geo() -> Geometry {
        Geometry::plan(&MkfsParams {
            uuid: Uuid([7; 16]),
            block_size: BlockSize::new(4096).unwrap(),
            sector_size: 512,
            target_bytes: vec![8 << 20, 8 << 20],
            stripe_unit: 16384,
            stripe_count: 2,
            journal_bytes: None,
            mkfs_time_sec: 0,
        })
        .unwrap()
    }

    fn attrs(ino: u64, kind: FileKind, nlink: u32, parent: u64) -> InodeAttrs {
        let layout = if kind == FileKind::Regular {
            StripeLayout {
                count: 2,
                unit_bytes: 16384,
                first_target: 0,
            }
        } else {
            StripeLayout {
                count: 0,
                unit_bytes: 0,
                first_target: 0,
            }
        };
        InodeAttrs {
            ino: Ino(ino),
            kind,
            perm: 0o755,
            uid: 0,
            gid: 0,
            nlink,
            size: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            crtime: Timespec::default(),
            rdev: 0,
            parent: Ino(parent),
            layout,
            // Regular files are NOCOW here (no checksums): the checksum rule has its
            // own test (`checksums_exist_exactly_for_written_datacow_blocks`).
            flags: if kind == FileKind::Regular {
                crate::inode::FLAG_NOCOW
            } else {
                0
            },
        }
    }

    const ROOT: u64 = 1;
    const D: u64 = 2;
    const F: u64 = 3;
    const S: u64 = 4;

    fn add(dir: u64, name: &str, ino: u64, kind: FileKind) -> Record {
        Record::DirAdd {
            dir: Ino(dir),
            name: name.as_bytes().to_vec(),
            ino: Ino(ino),
            kind,
        }
    }

    fn remove(dir: u64, name: &str) -> Record {
        Record::DirRemove {
            dir: Ino(dir),
            name: name.as_bytes().to_vec(),
        }
    }

    /// An extent of `F`'s object `object` on target `target`.
    fn ext(object: u32, block: u64, len: u64, phys: u64, target: u32) -> Record {
        Record::ExtentSet {
            ino: Ino(F),
            object,
            block,
            len,
            phys,
            state: ExtentState::Written,
            target: TargetId(target),
        }
    }

    /// Root holding directory `d` and file `f` (4 blocks in each of its two objects);
    /// `d` holds symlink `s`.
    fn base(g: &Geometry) -> MetaState {
        let d0 = g.targets[0].data_start;
        let d1 = g.targets[1].data_start;
        let mut m = MetaState::new();
        let recs = [
            Record::InodeSet(attrs(ROOT, FileKind::Directory, 3, ROOT)),
            Record::InodeSet(attrs(D, FileKind::Directory, 2, ROOT)),
            Record::InodeSet(attrs(F, FileKind::Regular, 1, 0)),
            Record::InodeSet(attrs(S, FileKind::Symlink, 1, 0)),
            Record::SymlinkSet {
                ino: Ino(S),
                target: b"f".to_vec(),
            },
            add(ROOT, "d", D, FileKind::Directory),
            add(ROOT, "f", F, FileKind::Regular),
            add(D, "s", S, FileKind::Symlink),
            ext(0, 0, 4, d0, 0),
            ext(1, 0, 4, d1, 1),
        ];
        for r in &recs {
            m.apply(r).unwrap();
        }
        m
    }

    /// fsck's verdict on `recs` applied to `m`: refused if a record does not apply or the
    /// result breaks an invariant (orphans are removed first, as fsck does).
    fn fsck_refuses(m: &MetaState, g: &Geometry, recs: &[Record]) -> bool {
        let mut m = m.clone();
        if recs.iter().any(|r| m.apply(r).is_err()) {
            return true;
        }
        m.inodes.retain(|_, i| i.attrs.nlink != 0);
        !check(&m, g).is_clean()
    }

    fn replay_refuses(m: &MetaState, g: &Geometry, recs: &[Record]) -> Option<String> {
        let mut rc = ReplayCheck::new(m, g).unwrap();
        rc.apply_txn(&mut m.clone(), g, recs).err()
    }

    /// Transactions the runtime can write, and crafted ones (checksums are not the
    /// question here) breaking each kind of rule.
    fn cases(g: &Geometry) -> Vec<(&'static str, bool, Vec<Record>)> {
        let (d0, end0) = (g.targets[0].data_start, g.targets[0].blocks);
        let free0 = d0 + 4;
        let mut g_file = attrs(5, FileKind::Regular, 1, 0);
        g_file.size = 10;
        let set = |a: InodeAttrs| Record::InodeSet(a);
        let mut wider = attrs(F, FileKind::Regular, 1, 0);
        wider.layout.count = 1;
        let mut huge = attrs(6, FileKind::Regular, 1, 0);
        huge.layout.count = 9;
        let mut moved_first = attrs(F, FileKind::Regular, 1, 0);
        moved_first.layout.first_target = 1;
        vec![
            (
                "create",
                true,
                vec![set(g_file.clone()), add(ROOT, "g", 5, FileKind::Regular)],
            ),
            (
                "mkdir",
                true,
                vec![
                    set(attrs(5, FileKind::Directory, 2, ROOT)),
                    add(ROOT, "e", 5, FileKind::Directory),
                    set(attrs(ROOT, FileKind::Directory, 4, ROOT)),
                ],
            ),
            (
                "rename file",
                true,
                vec![remove(ROOT, "f"), add(D, "f2", F, FileKind::Regular)],
            ),
            (
                "unlink open file",
                true,
                vec![remove(ROOT, "f"), set(attrs(F, FileKind::Regular, 0, 0))],
            ),
            (
                "unlink and free",
                true,
                vec![remove(ROOT, "f"), Record::InodeFree(Ino(F))],
            ),
            (
                "hard link",
                true,
                vec![
                    add(D, "h", F, FileKind::Regular),
                    set(attrs(F, FileKind::Regular, 2, 0)),
                ],
            ),
            ("append extent", true, vec![ext(0, 4, 4, free0, 0)]),
            (
                "unwritten to written",
                true,
                vec![
                    Record::ExtentSet {
                        ino: Ino(F),
                        object: 0,
                        block: 0,
                        len: 2,
                        phys: d0,
                        state: ExtentState::Unwritten,
                        target: TargetId(0),
                    },
                    ext(0, 0, 2, d0, 0),
                ],
            ),
            (
                "punch then reuse blocks",
                true,
                vec![
                    Record::ExtentClear {
                        ino: Ino(F),
                        object: 0,
                        block: 0,
                        len: 2,
                    },
                    ext(0, 8, 2, d0, 0),
                ],
            ),
            (
                "rmdir",
                true,
                vec![
                    remove(D, "s"),
                    Record::InodeFree(Ino(S)),
                    remove(ROOT, "d"),
                    Record::InodeFree(Ino(D)),
                    set(attrs(ROOT, FileKind::Directory, 2, ROOT)),
                ],
            ),
            (
                "xattr",
                true,
                vec![Record::XattrSet {
                    ino: Ino(F),
                    name: b"user.a".to_vec(),
                    value: b"1".to_vec(),
                }],
            ),
            (
                "extent on a target that is not there",
                false,
                vec![ext(0, 0, 4, d0, 3)],
            ),
            (
                "extent over the metadata area",
                false,
                vec![ext(0, 4, 1, 0, 0)],
            ),
            (
                "extent past the target end",
                false,
                vec![ext(0, 4, 4, end0 - 2, 0)],
            ),
            (
                "extent claiming used blocks",
                false,
                vec![ext(0, 8, 2, d0 + 1, 0)],
            ),
            ("zero-length extent", false, vec![ext(0, 8, 0, free0, 0)]),
            (
                "extent overflowing the object",
                false,
                vec![ext(0, u64::MAX - 1, 4, free0, 0)],
            ),
            (
                "extent of a missing object",
                false,
                vec![ext(2, 0, 1, free0, 0)],
            ),
            (
                "extent of a directory",
                false,
                vec![Record::ExtentSet {
                    ino: Ino(D),
                    object: 0,
                    block: 0,
                    len: 1,
                    phys: free0,
                    state: ExtentState::Written,
                    target: TargetId(0),
                }],
            ),
            (
                "extent of a missing inode",
                false,
                vec![Record::ExtentSet {
                    ino: Ino(99),
                    object: 0,
                    block: 0,
                    len: 1,
                    phys: free0,
                    state: ExtentState::Written,
                    target: TargetId(0),
                }],
            ),
            ("layout losing an object", false, vec![set(wider)]),
            (
                "layout wider than the targets",
                false,
                vec![set(huge), add(ROOT, "x", 6, FileKind::Regular)],
            ),
            // fsck has no rule against a layout change as such: extents name their targets,
            // so a new home target moves no block.
            (
                "layout changing the home targets",
                true,
                vec![set(moved_first)],
            ),
            (
                "entry to a missing inode",
                false,
                vec![add(ROOT, "x", 99, FileKind::Regular)],
            ),
            (
                "entry of the wrong type",
                false,
                vec![
                    add(D, "x", F, FileKind::Symlink),
                    set(attrs(F, FileKind::Regular, 2, 0)),
                ],
            ),
            (
                "invalid entry name",
                false,
                vec![
                    add(D, "a/b", F, FileKind::Regular),
                    set(attrs(F, FileKind::Regular, 2, 0)),
                ],
            ),
            (
                "free a linked inode",
                false,
                vec![Record::InodeFree(Ino(F))],
            ),
            ("free the root", false, vec![Record::InodeFree(Ino(ROOT))]),
            ("unlink without link count", false, vec![remove(ROOT, "f")]),
            (
                "link count too high",
                false,
                vec![set(attrs(F, FileKind::Regular, 2, 0))],
            ),
            (
                "mkdir without parent link",
                false,
                vec![
                    set(attrs(5, FileKind::Directory, 2, ROOT)),
                    add(ROOT, "e", 5, FileKind::Directory),
                ],
            ),
            (
                "directory with a wrong parent",
                false,
                vec![set(attrs(D, FileKind::Directory, 2, F))],
            ),
            (
                "directory moved into itself",
                false,
                vec![
                    remove(ROOT, "d"),
                    add(D, "d2", D, FileKind::Directory),
                    set(attrs(D, FileKind::Directory, 3, D)),
                    set(attrs(ROOT, FileKind::Directory, 2, ROOT)),
                ],
            ),
            ("new inode in no directory", false, vec![set(g_file)]),
            (
                "empty symlink",
                false,
                vec![Record::SymlinkSet {
                    ino: Ino(S),
                    target: Vec::new(),
                }],
            ),
            (
                "a clone within the file: counted, then mapped again",
                true,
                vec![
                    Record::RefcountSet {
                        target: crate::TargetId(0),
                        phys: d0,
                        len: 4,
                        count: 2,
                    },
                    ext(0, 8, 4, d0, 0),
                ],
            ),
            (
                "blocks mapped again without a count",
                false,
                vec![ext(0, 8, 4, d0, 0)],
            ),
        ]
    }

    /// fsck compares the index with the counts the extents derive, both ways.
    #[test]
    fn refcounts_must_equal_what_extents_derive() {
        let g = geo();
        let d0 = g.targets[0].data_start;
        let count = |n| Record::RefcountSet {
            target: crate::TargetId(0),
            phys: d0,
            len: 4,
            count: n,
        };
        let mut m = base(&g);
        m.apply(&count(2)).unwrap();
        let r = check(&m, &g);
        assert!(
            r.problems.iter().any(|p| p.contains("have 2 owners")),
            "a count no second extent backs: {:?}",
            r.problems
        );
        m.apply(&ext(0, 8, 4, d0, 0)).unwrap();
        assert!(check(&m, &g).is_clean());
        m.apply(&count(3)).unwrap();
        assert!(!check(&m, &g).is_clean(), "count 3, two extents");
        m.apply(&count(2)).unwrap();
        m.apply(&Record::ExtentClear {
            ino: Ino(F),
            object: 0,
            block: 8,
            len: 4,
        })
        .unwrap();
        assert!(!check(&m, &g).is_clean(), "the clone gone, the count left");
    }

    #[test]
    fn checksums_exist_exactly_for_written_datacow_blocks() {
        use crate::csum::BlockCsum;
        use crate::extent::ExtentState;
        let g = geo();
        let mut m = base(&g);
        let (ino, obj) = m
            .inodes
            .values()
            .find_map(|i| {
                i.objects
                    .iter()
                    .position(|o| !o.is_empty())
                    .map(|o| (i.attrs.ino, o as u32))
            })
            .expect("a file with extents");
        let mut a = m.get(ino).unwrap().attrs.clone();
        let e = *m.get(ino).unwrap().objects[obj as usize]
            .iter()
            .next()
            .unwrap()
            .1;
        let t = e.target;
        // NOCOW: no checksum allowed.
        m.apply(&Record::CsumSet {
            target: t,
            phys: e.phys,
            csums: vec![BlockCsum(1)],
        })
        .unwrap();
        assert!(csum_problem(&m).is_some_and(|p| p.contains("no written extent")));
        // Datacow: every written block needs one.
        a.flags = 0;
        m.apply(&Record::InodeSet(a)).unwrap();
        let written: u64 = m
            .get(ino)
            .unwrap()
            .objects
            .iter()
            .flat_map(|map| map.iter())
            .filter(|(_, e)| e.state == ExtentState::Written)
            .map(|(_, e)| e.len)
            .sum();
        if written > 1 {
            assert!(csum_problem(&m).is_some_and(|p| p.contains("without a checksum")));
        }
        let i = m.get(ino).unwrap().clone();
        for map in &i.objects {
            for (_, e) in map.iter() {
                let t = e.target;
                if e.state == ExtentState::Written {
                    let csums = vec![BlockCsum(7); e.len as usize];
                    m.csums.set(t, e.phys, &csums);
                } else {
                    m.csums.clear(t, e.phys, e.len);
                }
            }
        }
        assert_eq!(csum_problem(&m), None);
        assert!(check(&m, &g).is_clean(), "{:?}", check(&m, &g).problems);
        // A checksum on a free block.
        m.csums
            .set(t, g.targets[t.index()].blocks - 1, &[BlockCsum(3)]);
        assert!(csum_problem(&m).is_some());
    }

    #[test]
    fn base_model_is_clean() {
        let g = geo();
        let r = check(&base(&g), &g);
        assert!(r.is_clean(), "{:?}", r.problems);
    }

    /// Replay validation and fsck agree on every case: both accept what the runtime
    /// writes, both refuse each kind of broken record.
    #[test]
    fn replay_validation_equals_fsck_verdict() {
        let g = geo();
        let m = base(&g);
        for (name, valid, recs) in cases(&g) {
            let fsck = fsck_refuses(&m, &g, &recs);
            let replay = replay_refuses(&m, &g, &recs);
            assert_eq!(
                fsck,
                replay.is_some(),
                "{name}: fsck refuses {fsck}, replay {replay:?}"
            );
            assert_eq!(
                valid, !fsck,
                "{name}: expected valid={valid}, replay {replay:?}"
            );
        }
    }

    /// Transactions in sequence keep the counts and claims exact: each of the valid cases
    /// followed by one that re-uses what it freed or claimed.
    #[test]
    fn replay_state_follows_the_model() {
        let g = geo();
        let mut m = base(&g);
        let mut rc = ReplayCheck::new(&m, &g).unwrap();
        let d0 = g.targets[0].data_start;
        // Punch, then in a later transaction give the blocks to another file.
        let punch = [Record::ExtentClear {
            ino: Ino(F),
            object: 0,
            block: 0,
            len: 4,
        }];
        rc.apply_txn(&mut m, &g, &punch).unwrap();
        let reuse = [
            Record::InodeSet(attrs(5, FileKind::Regular, 1, 0)),
            add(ROOT, "g", 5, FileKind::Regular),
            Record::ExtentSet {
                ino: Ino(5),
                object: 0,
                block: 0,
                len: 4,
                phys: d0,
                state: ExtentState::Written,
                target: TargetId(0),
            },
        ];
        rc.apply_txn(&mut m, &g, &reuse).unwrap();
        // Those blocks are now claimed again.
        let mut again = m.clone();
        let err = rc
            .clone()
            .apply_txn(&mut again, &g, &[ext(0, 0, 1, d0, 0)])
            .unwrap_err();
        assert!(err.contains("overlaps blocks already in use"), "{err}");
        // Unlink g and free it; its name can be reused for a new hard link of f.
        let gone = [remove(ROOT, "g"), Record::InodeFree(Ino(5))];
        rc.apply_txn(&mut m, &g, &gone).unwrap();
        let relink = [
            add(ROOT, "g", F, FileKind::Regular),
            Record::InodeSet(attrs(F, FileKind::Regular, 2, 0)),
        ];
        rc.apply_txn(&mut m, &g, &relink).unwrap();
        assert!(check(&m, &g).is_clean(), "{:?}", check(&m, &g).problems);
    }
}

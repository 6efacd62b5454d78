//! Consistency checks over a metadata model: the invariants fsck verifies.
//!
//! Checked: the root exists and is a directory; every entry names an existing inode of the
//! entry's type with a valid name; link counts equal the entries that reference an inode
//! (directories: 2 + subdirectories); every directory is referenced exactly once and its
//! parent pointer agrees; everything is reachable from the root; no inode has link count 0
//! (an orphan that recovery should have freed); striping layouts are valid; extents are
//! well formed, lie in their target's data area, and no block is claimed twice.

use std::collections::{BTreeMap, BTreeSet};

use crate::alloc::Allocator;
use crate::geometry::Geometry;
use crate::inode::{FileKind, Inode, NAME_MAX};
use crate::meta::MetaState;
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
    let refs = check_entries(meta, &mut r.problems);
    for inode in meta.inodes.values() {
        r.inodes += 1;
        check_links(inode, &refs, &mut r.problems);
        check_layout(inode, geo, &mut r.problems);
        check_extents(inode, geo, &mut r);
        if inode.attrs.ino.0 >= meta.next_ino {
            r.problems.push(format!(
                "inode {} is not below the next inode number {}",
                inode.attrs.ino, meta.next_ino
            ));
        }
    }
    check_reachable(meta, &mut r.problems);
    r
}

/// Entries referencing each inode: (count, subdirectory count of the inode if a dir,
/// referencing directories).
#[derive(Debug, Default)]
struct Refs {
    count: u32,
    subdirs: u32,
    parents: Vec<Ino>,
}

fn check_entries(meta: &MetaState, problems: &mut Vec<String>) -> BTreeMap<Ino, Refs> {
    let mut refs: BTreeMap<Ino, Refs> = BTreeMap::new();
    for dir in meta
        .inodes
        .values()
        .filter(|i| i.attrs.kind == FileKind::Directory)
    {
        let d = dir.attrs.ino;
        for (name, e) in &dir.entries {
            let shown = String::from_utf8_lossy(name);
            if name.is_empty()
                || name.len() > NAME_MAX
                || name.contains(&b'/')
                || name.contains(&0)
                || name == b"."
                || name == b".."
            {
                problems.push(format!("directory {d} has an invalid entry name {shown:?}"));
            }
            match meta.get(e.ino) {
                None => problems.push(format!(
                    "directory {d} entry {shown:?} points to missing inode {}",
                    e.ino
                )),
                Some(t) if t.attrs.kind != e.kind => {
                    problems.push(format!(
                        "directory {d} entry {shown:?} says {:?} but inode {} is {:?}",
                        e.kind, e.ino, t.attrs.kind
                    ));
                }
                Some(_) => {}
            }
            let r = refs.entry(e.ino).or_default();
            r.count += 1;
            r.parents.push(d);
            if e.kind == FileKind::Directory {
                refs.entry(d).or_default().subdirs += 1;
            }
        }
    }
    refs
}

fn check_links(inode: &Inode, refs: &BTreeMap<Ino, Refs>, problems: &mut Vec<String>) {
    let a = &inode.attrs;
    let r = refs.get(&a.ino);
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

fn check_layout(inode: &Inode, geo: &Geometry, problems: &mut Vec<String>) {
    let a = &inode.attrs;
    if a.kind != FileKind::Regular {
        if !inode.objects.is_empty() {
            problems.push(format!("inode {} of type {:?} owns extents", a.ino, a.kind));
        }
        return;
    }
    let l = a.layout;
    let ok = l.count >= 1
        && l.count <= geo.target_count()
        && l.unit_bytes > 0
        && l.unit_bytes.is_multiple_of(geo.block_size.bytes())
        && l.first_target < geo.target_count()
        && inode.objects.len() == l.count as usize;
    if !ok {
        problems.push(format!(
            "inode {} has an invalid stripe layout {l:?}",
            a.ino
        ));
    }
}

fn check_extents(inode: &Inode, geo: &Geometry, r: &mut CheckReport) {
    let a = &inode.attrs;
    for (obj, map) in inode.objects.iter().enumerate() {
        if let Some(p) = map.check() {
            r.problems
                .push(format!("inode {} object {obj}: {p}", a.ino));
        }
        let target = a.layout.target_of(obj as u32, geo.target_count());
        for (block, e) in map.iter() {
            r.extents += 1;
            r.data_blocks_used += e.len;
            if e.refcount != 1 {
                r.problems.push(format!(
                    "inode {} object {obj} block {block}: refcount {} but sharing is not enabled",
                    a.ino, e.refcount
                ));
            }
            if let Err(err) = r.allocator.mark_used(target, e.phys, e.len) {
                r.problems
                    .push(format!("inode {} object {obj} block {block}: {err}", a.ino));
            }
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

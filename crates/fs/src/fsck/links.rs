//! The rules that need every inode: link counts, the single entry and parent of a
//! directory, entries naming existing inodes of their type, reachability from the root.
//! Checked from the [`Tallies`] once the walk is done; only when one fails are the entries
//! concerned looked for again (a second scan of the fs tree), to name them.

use std::collections::{BTreeSet, HashMap};

use stripefs_core::btree::schema::decode_dir_entry;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_core::inode::FileKind;
use stripefs_core::Ino;
use stripefs_meta::Store;

use super::tally::{DirTally, Tally};
use super::walk::Checker;
use crate::error::Result;

/// Items fetched per scan.
const BATCH: usize = 512;

/// Link counts of linked inodes, orphans' references, directories' entries and parents.
pub fn link_problems(c: &mut Checker<'_>) {
    match c.tallies.inodes.get(&Ino::ROOT.0).and_then(Tally::kind) {
        Some(FileKind::Directory) => {}
        Some(_) => c.problem(Some(Ino::ROOT), "root inode 1 is not a directory".into()),
        None => c.problem(Some(Ino::ROOT), "root inode 1 is missing".into()),
    }
    let mut out = Vec::new();
    for (&n, t) in &c.tallies.inodes {
        let ino = Ino(n);
        let Some(kind) = t.kind() else {
            continue; // entries naming a missing inode: named by `bad_entries`
        };
        let count = t.refs;
        if t.nlink == 0 {
            if count > 0 {
                out.push((
                    ino,
                    format!("inode {ino} has link count 0, but {count} entries reference it"),
                ));
            }
            continue;
        }
        if kind != FileKind::Directory {
            if t.nlink != count {
                out.push((
                    ino,
                    format!(
                        "inode {ino} has link count {}, but {count} entries reference it",
                        t.nlink
                    ),
                ));
            }
            continue;
        }
        let expected = u32::from(ino != Ino::ROOT);
        if count != expected {
            out.push((
                ino,
                format!("directory {ino} is referenced by {count} entries, expected {expected}"),
            ));
        }
        let d = c.tallies.dirs.get(&n).copied().unwrap_or_default();
        if d.lives_in.0 != 0 && d.lives_in != d.parent {
            out.push((
                ino,
                format!(
                    "directory {ino} says its parent is {} but it lives in {}",
                    d.parent, d.lives_in
                ),
            ));
        }
    }
    out.sort();
    for (ino, p) in out {
        c.problem(Some(ino), p);
    }
}

/// Whether each linked directory reaches the root through the directories whose entries
/// name them; returns the linked directories that do not (in a cycle, or below a
/// directory no entry names).
fn unreachable_dirs(inodes: &HashMap<u64, Tally>, dirs: &HashMap<u64, DirTally>) -> BTreeSet<u64> {
    #[derive(Clone, Copy, PartialEq)]
    enum Seen {
        Yes,
        No,
    }
    let mut known: HashMap<u64, Seen> = HashMap::new();
    known.insert(Ino::ROOT.0, Seen::Yes);
    let linked_dir = |n: u64| {
        inodes
            .get(&n)
            .is_some_and(|t| t.kind() == Some(FileKind::Directory) && t.nlink != 0)
    };
    for &start in dirs.keys().filter(|&&n| linked_dir(n)) {
        let mut path = Vec::new();
        let mut at = start;
        let verdict = loop {
            if let Some(v) = known.get(&at) {
                break *v;
            }
            if path.contains(&at) || path.len() > dirs.len() || !linked_dir(at) {
                break Seen::No;
            }
            path.push(at);
            at = dirs.get(&at).map_or(0, |d| d.lives_in.0);
        };
        for p in path {
            known.insert(p, verdict);
        }
    }
    known
        .into_iter()
        .filter(|(n, v)| *v == Seen::No && linked_dir(*n))
        .map(|(n, _)| n)
        .collect()
}

/// Every linked inode is reachable from the root: a directory through the entries naming
/// it, anything else through an entry in a reachable directory (the entries of the
/// unreachable directories are read again to tell).
///
/// # Errors
/// A page read's error.
pub fn reachability(c: &mut Checker<'_>, store: &Store) -> Result<()> {
    let lost = unreachable_dirs(&c.tallies.inodes, &c.tallies.dirs);
    if lost.is_empty() {
        return Ok(());
    }
    let mut lost_refs: HashMap<u64, u32> = HashMap::new();
    for &d in &lost {
        for_each_entry(store, Some(d), &mut |_, e_ino, _, _| {
            *lost_refs.entry(e_ino.0).or_default() += 1;
        })?;
    }
    let mut out: BTreeSet<u64> = lost;
    for (n, k) in lost_refs {
        let t = c.tallies.inodes.get(&n).copied().unwrap_or_default();
        let file = t.kind().is_some_and(|k| k != FileKind::Directory);
        if file && t.nlink != 0 && k >= t.refs {
            out.insert(n);
        }
    }
    for n in out {
        c.problem(
            Some(Ino(n)),
            format!("inode {n} is not reachable from the root"),
        );
    }
    Ok(())
}

/// Entries naming a missing inode or giving an inode another type than its own, named:
/// found by scanning the entries again, only when the tallies say there are some.
///
/// # Errors
/// A page read's error.
pub fn bad_entries(c: &mut Checker<'_>, store: &Store) -> Result<()> {
    let bad: HashMap<u64, Option<FileKind>> = c
        .tallies
        .inodes
        .iter()
        .filter(|(_, t)| t.kind_disagrees())
        .map(|(&n, t)| (n, t.kind()))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let mut out = Vec::new();
    for_each_entry(store, None, &mut |dir, ino, kind, name| {
        let Some(have) = bad.get(&ino.0) else {
            return;
        };
        let shown = String::from_utf8_lossy(name);
        match have {
            None => out.push((
                dir,
                format!("directory {dir} entry {shown:?} points to missing inode {ino}"),
            )),
            Some(k) if *k != kind => out.push((
                dir,
                format!("directory {dir} entry {shown:?} says {kind:?} but inode {ino} is {k:?}"),
            )),
            Some(_) => {}
        }
    })?;
    for (dir, p) in out {
        c.problem(Some(dir), p);
    }
    Ok(())
}

/// A visitor of directory entries: (directory, inode, type, name).
type EntryVisit<'a> = dyn FnMut(Ino, Ino, FileKind, &[u8]) + 'a;

/// Calls `f(dir, ino, kind, name)` for every decodable entry of `dir` (or of every
/// directory), in key order.
fn for_each_entry(store: &Store, dir: Option<u64>, f: &mut EntryVisit<'_>) -> Result<()> {
    let (mut at, to) = match dir {
        Some(d) => (
            Key::new(d, KeyKind::DirEntry, 0, 0),
            Key::new(d, KeyKind::DirEntry, u64::MAX, u64::MAX).successor(),
        ),
        None => (Key::MIN, None),
    };
    loop {
        let items = store.scan(TreeId::Fs, at, to, BATCH)?;
        let Some(&(last, _)) = items.last() else {
            return Ok(());
        };
        for (k, v) in &items {
            if k.kind != KeyKind::DirEntry as u8 {
                continue;
            }
            if let Ok(e) = decode_dir_entry(k, v) {
                f(Ino(k.object), e.ino, e.kind, &e.name);
            }
        }
        match last.successor() {
            Some(k) => at = k,
            None => return Ok(()),
        }
    }
}

/// Calls `f(ino, kind)` for every decodable entry of directory `dir`.
///
/// # Errors
/// A page read's error.
pub fn entries_of(store: &Store, dir: Ino, f: &mut dyn FnMut(Ino, FileKind)) -> Result<()> {
    for_each_entry(store, Some(dir.0), &mut |_, ino, kind, _| f(ino, kind))
}

//! Mount-time replay into the metadata trees (issue 11 stage 2: no whole model at mount).
//!
//! Each journal transaction after the durable root record's mark is checked, then applied
//! to the trees in memory with `items::apply_record`, the function the checkpointer uses
//! (dirty pages in the store's cache; the mount's checkpoint writes them, and a crash
//! before it replays again from the same mark, on the same durable trees). The checks see
//! only what the replay touches: the inodes its records name (without their directory
//! entries) and the entries its records add or remove, read from the trees as they stand
//! before each record and kept, changed, in a partial `MetaState`; so mount reads what the
//! journal names, not the file system, nor a whole directory. The partial model is kept
//! from one window (below) to the next while what it holds (the inodes looked up and the
//! names added) is within the mount's in-core inode bound, so a journal that changes the
//! same files again and again decodes each once; past the bound it is let go after the
//! window: every record is in the trees by then, so a later window reads again what it
//! names, and the replay holds the bound plus one window's worth, not every inode a full
//! journal names (decisions.md, 121 and 135).
//!
//! Rules checked per record (as `ReplayCheck` does): the record fits (`MetaState::apply`:
//! existing inode, object in range, entry in a directory, no change of type), entry
//! names, stripe layouts, extents on their own (length, overflow, sharing) and inside the
//! data area; at the end of each transaction, every entry it added names an existing inode
//! of its type, and an inode created by the replay has as many links as entries naming it.
//! Rules that need the whole file system (links of an inode created before the mark,
//! reachability, two files claiming one block) are fsck's (decisions.md, 55).
//!
//! Page reads (decisions.md, 79): each record names an inode, and after a crash the
//! inodes a journal names are spread over the whole fs tree, so applying records one by
//! one made nearly every record a synchronous page read (10.2 s for 200 transactions at a
//! million files). Transactions are therefore gathered into windows: the keys each
//! record will read ([`items::record_keys`]) are collected, the store reads their pages
//! with many reads in flight ([`Store::prefetch`]: sorted, each page once), and only then
//! is the window checked and applied, record by record in journal order, from memory.
//! The order of application never changes; the read-ahead only moves the reads earlier.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use stripefs_core::alloc::Allocator;
use stripefs_core::btree::Key;
use stripefs_core::check::{extent_problem, layout_problem, name_problem};
use stripefs_core::extent::Extent;
use stripefs_core::geometry::Geometry;
use stripefs_core::inode::FileKind;
use stripefs_core::meta::MetaState;
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino};
use stripefs_meta::{items, Store};
use stripefs_target::Target;

use crate::error::Result;
use crate::recovery::{Candidates, TxnAt};

/// The replay's view of the inodes it touched.
pub(crate) struct Replayer<'a> {
    store: &'a Store,
    /// The members' geometry, grown by each replayed `TargetAdd`.
    geo: Geometry,
    /// Targets given past the members, for replayed `TargetAdd`s.
    candidates: Candidates,
    /// Targets replayed `TargetAdd`s made members, in index order.
    added: Vec<Arc<dyn Target>>,
    /// Every inode a record named since the model was last let go, as the replay left it
    /// (absent: freed, or not in the trees).
    partial: MetaState,
    /// Inodes looked up since then (present in `partial` or known absent).
    seen: BTreeSet<Ino>,
    /// Names added to `partial`'s directories since then (read from the trees or by
    /// records): with `seen`, what the model's size is judged by.
    names_held: usize,
    /// Inodes the trees held when the replay first named them.
    existed: BTreeSet<Ino>,
    /// The most inodes `partial` held at once.
    pub peak_inodes: u64,
    /// Inodes read from the trees into `partial`.
    pub inode_reads: u64,
    /// Keys given to the store to read ahead.
    pub keys_read_ahead: u64,
    /// Inodes the replay created, with the entries naming them (by the replay).
    created: BTreeMap<Ino, u32>,
    /// A scratch map for the data-area check of extents (each claim is given back).
    area: Allocator,
    /// Records applied.
    pub records: u64,
    /// Transactions read and not yet applied (the window), in journal order.
    window: Vec<(TxnAt, Vec<Record>)>,
    /// The keys the window's records will read.
    keys: Vec<Key>,
    /// The keys earlier windows read ahead: at most two per inode the partial model may
    /// keep plus one window's (an inode's item and orphan key), emptied past it.
    recent: HashSet<Key>,
    /// Distinct keys a window gathers before it is read ahead and applied.
    window_keys: usize,
    /// What the partial model keeps from one window to the next, in inodes looked up plus
    /// names added: past it the model is let go after a window (the mount's in-core inode
    /// bound, the memory the mounted file system gives decoded inodes anyway).
    keep_inodes: usize,
    /// What applying the records remembers from one to the next (`items::ApplyMemo`:
    /// the replay is the trees' only applier while it runs).
    memo: items::ApplyMemo,
}

type Broken = std::result::Result<(), String>;

/// What a replay leaves of the membership.
pub(crate) struct Members {
    /// The members' geometry.
    pub geo: Geometry,
    /// Targets replayed `TargetAdd`s made members, in index order.
    pub added: Vec<Arc<dyn Target>>,
    /// Targets given that no replayed record made members (adds that never committed).
    pub left: Candidates,
}

/// What one transaction touched, checked at its end.
#[derive(Default)]
struct Touched {
    inodes: BTreeSet<Ino>,
    entries: Vec<(Ino, Vec<u8>)>,
}

impl<'a> Replayer<'a> {
    /// A replayer that reads ahead the pages of up to `window_keys` distinct keys at a
    /// time (at least 1) and keeps up to `keep_inodes` decoded inodes across windows.
    pub fn new(
        store: &'a Store,
        geo: Geometry,
        candidates: Candidates,
        window_keys: usize,
        keep_inodes: usize,
    ) -> Self {
        Self {
            store,
            area: Allocator::new(&geo),
            geo,
            candidates,
            added: Vec::new(),
            partial: MetaState::new(),
            seen: BTreeSet::new(),
            names_held: 0,
            existed: BTreeSet::new(),
            created: BTreeMap::new(),
            peak_inodes: 0,
            inode_reads: 0,
            keys_read_ahead: 0,
            records: 0,
            window: Vec::new(),
            keys: Vec::new(),
            recent: HashSet::new(),
            window_keys: window_keys.max(1),
            keep_inodes,
            memo: items::ApplyMemo::default(),
        }
    }

    /// Adds a transaction to the window; when the window's keys reach its size, reads
    /// their pages ahead and checks and applies the window ([`Self::finish`] applies the
    /// rest).
    ///
    /// # Errors
    /// As [`Self::apply_txn`], for the window's transactions.
    pub fn push(&mut self, at: TxnAt, recs: Vec<Record>) -> Result<()> {
        let uuid = self.store.uuid();
        self.keys
            .extend(recs.iter().flat_map(|r| items::record_keys(uuid, r)));
        self.window.push((at, recs));
        if self.keys.len() >= self.window_keys {
            self.keys.sort_unstable();
            self.keys.dedup();
            if self.keys.len() >= self.window_keys {
                return self.flush();
            }
        }
        Ok(())
    }

    /// The members after the replay.
    pub fn into_members(self) -> Members {
        Members {
            geo: self.geo,
            added: self.added,
            left: self.candidates,
        }
    }

    /// A replayed `TargetAdd`: its target, given at mount, joins the store, the
    /// geometry and the scratch map before the record is applied to the trees.
    fn join(&mut self, at: TxnAt, j: crate::recovery::Joining) -> Result<()> {
        let target = j.target;
        if target.0 != self.geo.target_count() {
            let d = format!(
                "adds target {target} to a file system of {} targets",
                self.geo.target_count()
            );
            return Err(CoreError::corrupted(at.to_string(), d).into());
        }
        let (_, t) = self.candidates.take(&at.to_string(), j)?;
        self.store.give_target(Arc::clone(&t))?;
        let g = j.geometry();
        self.geo.targets.push(g);
        self.area.add_target(target, g)?;
        self.added.push(t);
        Ok(())
    }

    /// Checks and applies what the window still holds.
    ///
    /// # Errors
    /// As [`Self::apply_txn`].
    pub fn finish(&mut self) -> Result<()> {
        self.flush()
    }

    /// Reads the window's pages ahead (many in flight, each once), then checks and
    /// applies its transactions in journal order.
    fn flush(&mut self) -> Result<()> {
        let mut keys = std::mem::take(&mut self.keys);
        let window = std::mem::take(&mut self.window);
        // A key an earlier window read ahead is on a page replay has since read and most
        // likely dirtied (dirty pages stay until the mount's checkpoint), so its path
        // is in memory: walking it again to find that out was a fifth of a replay that
        // changes the same files again and again. A hint either way: a page not in
        // memory is read by the record that needs it.
        keys.retain(|k| !self.recent.contains(k));
        self.keys_read_ahead += keys.len() as u64;
        // Counted in the cache's statistics (`read_ahead`).
        let ahead = self.store.prefetch(&keys)?;
        let recent_bound = self
            .keep_inodes
            .saturating_mul(2)
            .saturating_add(self.window_keys);
        if self.recent.len() + keys.len() > recent_bound {
            self.recent.clear();
        }
        self.recent.extend(keys);
        for (at, recs) in window {
            self.apply_txn(at, &recs)?;
        }
        drop(ahead);
        // The trees hold everything the window's records did, and the checks' partial
        // model is a copy of what they say about the inodes it holds: kept while it is
        // within its bound (a journal that changes the same files again and again reads
        // each once), else let go, and the next window reads again what it names. The
        // bound counts the inodes looked up, present or absent, and the names added, so
        // a journal of short-lived files or of many names in one directory is let go
        // too. `existed` and `created` stay: they are about the replay as a whole.
        if self.seen.len().saturating_add(self.names_held) > self.keep_inodes {
            self.partial = MetaState::new();
            self.seen.clear();
            self.names_held = 0;
        }
        Ok(())
    }

    /// Reads `ino` from the trees into the partial model on its first mention, without
    /// its directory entries (a directory of any size costs its attributes).
    fn touch(&mut self, ino: Ino) -> Result<()> {
        if self.seen.insert(ino) {
            self.inode_reads += 1;
            if let Some(i) = items::load_inode_without_entries(self.store, ino)? {
                self.partial.inodes.insert(ino, i);
                // One the replay created is in the trees from its window on.
                if !self.created.contains_key(&ino) {
                    self.existed.insert(ino);
                }
            }
        }
        Ok(())
    }

    /// Reads the entry `name` of `dir` from the trees into the partial model, unless it
    /// holds it already. The trees and the partial model agree on every name (each
    /// replayed record is applied to both), so an entry the model lacks is the trees'.
    fn touch_entry(&mut self, dir: Ino, name: &[u8]) -> Result<()> {
        let Some(d) = self.partial.inodes.get_mut(&dir) else {
            return Ok(());
        };
        if d.entries.contains_key(name) {
            return Ok(());
        }
        if let Some(e) = items::lookup_entry(self.store, dir, name)? {
            let e = stripefs_core::inode::DirEntry {
                ino: e.ino,
                kind: e.kind,
            };
            d.entries.insert(name.to_vec(), e);
            self.names_held += 1;
        }
        Ok(())
    }

    /// Checks and applies one transaction.
    ///
    /// # Errors
    /// `Corrupted` naming the transaction for a record that does not fit or a rule the
    /// transaction breaks; a page read's error.
    pub fn apply_txn(&mut self, at: TxnAt, recs: &[Record]) -> Result<()> {
        let named = |e: String| CoreError::corrupted(at.to_string(), e);
        let mut t = Touched::default();
        for rec in recs {
            if let Some(ino) = rec.subject() {
                self.touch(ino)?;
            }
            if let Record::DirAdd { ino, .. } = rec {
                self.touch(*ino)?;
            }
            if let Record::DirAdd { dir, name, .. } | Record::DirRemove { dir, name } = rec {
                self.touch_entry(*dir, name)?;
                self.touch_unlinked(*dir, name)?;
            }
            if let Some(j) = crate::recovery::Joining::of(rec) {
                self.join(at, j)?;
            }
            self.before(rec).map_err(named)?;
            self.unlinked(rec, &mut t);
            // Checksums and reference counts are about blocks, not the inodes this
            // partial model checks, and no check reads them: the trees get them, the
            // model does not keep them (it would hold every block a replayed journal
            // wrote or shared).
            if !matches!(
                rec,
                Record::CsumSet { .. } | Record::CsumClear { .. } | Record::RefcountSet { .. }
            ) {
                self.partial.apply(rec).map_err(|e| named(e.to_string()))?;
            }
            if let Record::DirAdd { .. } = rec {
                self.names_held += 1;
            }
            self.after(rec, &mut t);
            items::apply_records_with(self.store, std::slice::from_ref(rec), &mut self.memo)
                .map_err(|e| named(e.to_string()))?;
            self.records += 1;
            let held = u64::try_from(self.partial.inodes.len()).unwrap_or(u64::MAX);
            self.peak_inodes = self.peak_inodes.max(held);
        }
        self.end(&t).map_err(named)?;
        Ok(())
    }

    /// Reads the inode the entry `name` of `dir` names, if the replay created it: the
    /// entry is about to be replaced or removed, and the end of the transaction checks
    /// that inode's link count ([`Self::end`]), which needs it in the partial model even
    /// when an earlier window read it.
    fn touch_unlinked(&mut self, dir: Ino, name: &[u8]) -> Result<()> {
        let old = self
            .partial
            .get(dir)
            .and_then(|d| d.entries.get(name))
            .map(|e| e.ino);
        match old {
            Some(ino) if self.created.contains_key(&ino) => self.touch(ino),
            _ => Ok(()),
        }
    }

    /// The entry `rec` replaces or removes no longer names its inode.
    fn unlinked(&mut self, rec: &Record, t: &mut Touched) {
        let (Record::DirAdd { dir, name, .. } | Record::DirRemove { dir, name }) = rec else {
            return;
        };
        let Some(old) = self.partial.get(*dir).and_then(|d| d.entries.get(name)) else {
            return;
        };
        let ino = old.ino;
        t.inodes.insert(ino);
        if let Some(n) = self.created.get_mut(&ino) {
            *n = n.saturating_sub(1);
        }
    }

    fn before(&mut self, rec: &Record) -> Broken {
        match rec {
            Record::InodeSet(a) => {
                let objects = self.partial.get(a.ino).map_or_else(
                    || match a.kind {
                        FileKind::Regular => a.layout.count as usize,
                        _ => 0,
                    },
                    |i| i.objects.len(),
                );
                layout_problem(a, objects, &self.geo).map_or(Ok(()), Err)
            }
            Record::InodeFree(ino) if *ino == Ino::ROOT => Err("root inode 1 is freed".into()),
            Record::ExtentSet {
                ino,
                object,
                block,
                len,
                phys,
                state,
                target,
            } => {
                let e = Extent {
                    len: *len,
                    phys: *phys,
                    state: *state,
                    target: *target,
                };
                if let Some(p) = extent_problem(*ino, *object, *block, &e, self.geo.target_count())
                {
                    return Err(p);
                }
                self.in_data_area(*ino, *object, *block, &e)
            }
            Record::DirAdd { dir, name, .. } => name_problem(*dir, name).map_or(Ok(()), Err),
            _ => Ok(()),
        }
    }

    /// An extent's blocks lie in its target's data area.
    fn in_data_area(&mut self, ino: Ino, obj: u32, block: u64, e: &Extent) -> Broken {
        if self.partial.get(ino).is_none() {
            return Ok(()); // `apply` names the missing inode
        }
        let target = e.target;
        if target.index() >= self.geo.targets.len() {
            return Ok(()); // `extent_problem` names it
        }
        match self.area.mark_used(target, e.phys, e.len) {
            Ok(()) => {
                self.area.free_now(target, e.phys, e.len);
                Ok(())
            }
            Err(err) => Err(format!("inode {ino} object {obj} block {block}: {err}")),
        }
    }

    /// Bookkeeping after `rec` was applied to the partial model.
    fn after(&mut self, rec: &Record, t: &mut Touched) {
        match rec {
            Record::InodeSet(a) => {
                t.inodes.insert(a.ino);
                if !self.existed.contains(&a.ino) {
                    // New: the trees did not hold it when the replay first named it.
                    self.created.entry(a.ino).or_insert(0);
                }
            }
            Record::DirAdd { dir, name, ino, .. } => {
                t.entries.push((*dir, name.clone()));
                t.inodes.insert(*ino);
                if let Some(n) = self.created.get_mut(ino) {
                    *n += 1;
                }
            }
            _ => {}
        }
    }

    /// End-of-transaction rules for what it touched.
    fn end(&self, t: &Touched) -> Broken {
        let mut problems = Vec::new();
        for (dir, name) in &t.entries {
            let Some(e) = self.partial.get(*dir).and_then(|d| d.entries.get(name)) else {
                continue;
            };
            let shown = String::from_utf8_lossy(name);
            match self.partial.get(e.ino) {
                None => problems.push(format!(
                    "directory {dir} entry {shown:?} points to missing inode {}",
                    e.ino
                )),
                Some(t) if t.attrs.kind != e.kind => problems.push(format!(
                    "directory {dir} entry {shown:?} says {:?} but inode {} is {:?}",
                    e.kind, e.ino, t.attrs.kind
                )),
                Some(_) => {}
            }
        }
        for ino in &t.inodes {
            let (Some(&links), Some(i)) = (self.created.get(ino), self.partial.get(*ino)) else {
                continue;
            };
            let a = &i.attrs;
            if a.kind != FileKind::Directory && a.nlink != 0 && a.nlink != links {
                problems.push(format!(
                    "inode {ino} has link count {}, but {links} entries reference it",
                    a.nlink
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

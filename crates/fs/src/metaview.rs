//! The decoded on-disk inodes the mount holds in core (issue 11 stage 2,
//! `docs/design/metadata.md`): attributes, symlink target, xattrs and every stripe
//! object's extent map, read from the metadata trees the first time an inode is used and
//! kept while it is used. A directory's entries are not part of it: a name is looked up
//! in the trees (one name hash's items) and only the entries changed by records not yet
//! applied to the trees are held, per directory and name ([`DirOverlay`],
//! "Directory entries" in metadata.md).
//!
//! Contract: for an inode it holds, the view is the authority (the trees may lag: records
//! reach them when the checkpointer applies the journal); for one it does not hold, the
//! trees are, because an inode leaves core only once every record that changed it has
//! been applied to them ([`MetaView::sweep`]). A freed inode leaves a tombstone until its
//! `InodeFree` is applied, so a lookup cannot bring back the trees' stale copy.
//!
//! Lookups ([`MetaView::get`]) take `&self`, so every path that reads an inode under the
//! metadata lock keeps its borrows as before. Inserting through `&self` is safe because
//! entries are boxed and never moved or removed through a shared reference: only
//! `&mut self` methods (apply, sweep, fill) change or drop them, and the borrow checker
//! rules those out while any `&Inode` handed out lives.
//!
//! Misses without the metadata lock (`docs/design/metadata.md`, "Inode misses"): the hot
//! paths make their inodes resident first ([`crate::inner::FsInner::meta_with`]): under
//! the lock, [`MetaView::miss`] takes a [`MissTicket`] (the inode and the view's removal
//! epoch); the lock is dropped while `items::load_inode_without_entries` reads the trees; under the lock
//! again, [`MetaView::fill`] inserts the read only if the ticket is still valid: the inode
//! is still absent from core and no inode left core meanwhile (the epoch is unchanged).
//! Invariant: an inode absent from core has every record about it in the trees, and a
//! new record about it needs it in core; so a read made while it stayed out of core saw
//! no record about it being applied, and is what the trees held throughout. Any inode
//! that entered and left core meanwhile bumped the epoch (eviction or free), so the read
//! is discarded and retried; [`MetaView::get`] (a read under the lock) is the fallback
//! after a few stale reads, so progress is guaranteed.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use stripefs_core::btree::schema::{DirEntryItem, COOKIE_FIRST};
use stripefs_core::idhash::IdMap;
use stripefs_core::inode::{DirEntry, FileKind, Inode};
use stripefs_core::meta::{apply_to, new_inode};
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino};
use stripefs_meta::{items, Store};

use crate::error::{FsError, Result};
use crate::types::DirCookie;

/// A directory entry as readdir positions it: its target and its cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub entry: DirEntry,
    pub cookie: DirCookie,
}

impl Placed {
    /// The entry and cookie of a tree's entry item.
    pub fn of(e: &DirEntryItem) -> Self {
        Placed {
            entry: DirEntry {
                ino: e.ino,
                kind: e.kind,
            },
            cookie: DirCookie(e.cookie),
        }
    }
}

/// One name's change that the trees may not hold yet: what the name is now (`None`:
/// removed) and the transaction of the record that made it so.
#[derive(Debug, Clone, Copy)]
struct NameChange {
    now: Option<Placed>,
    seq: u64,
}

/// The directory entries changed by records not yet applied to the trees, per directory
/// and name. For a name it holds, the overlay is the authority; for any other, the trees
/// are (no unapplied record touches it). A change leaves once its transaction is applied
/// ([`MetaView::settle_overlay`], whenever the metadata lock is released), so the overlay
/// holds at most one change per record the journal has not applied: its size does not
/// depend on the size of any directory.
#[derive(Debug, Default)]
struct DirOverlay {
    dirs: IdMap<Ino, HashMap<Vec<u8>, NameChange>>,
    /// Every change made, in log order (transactions ascending): what to drop when the
    /// trees have applied them (a name changed again is dropped by its last change).
    order: std::collections::VecDeque<(u64, Ino, Vec<u8>)>,
    /// Names held, over every directory.
    len: usize,
    /// Removal epochs by directory bucket ([`drop_bucket`]): bumped whenever a change of
    /// a directory in the bucket leaves (the trees hold it now), so a readdir page read
    /// from the trees without the lock can tell whether it may be stale ([`EntriesTicket`]).
    drops: [u64; DROP_BUCKETS],
}

/// Buckets of [`DirOverlay::drops`]: a change leaving in one directory makes a page read
/// unlocked in another directory of the same bucket retry (harmless, only slower).
const DROP_BUCKETS: usize = 32;

fn drop_bucket(dir: Ino) -> usize {
    (dir.0 % DROP_BUCKETS as u64) as usize
}

/// Slots of [`LookedUp`].
const LOOKED_SLOTS: usize = 64;

/// The trees' answers to the last entry lookups of names the overlay did not hold, a
/// few slots by (directory, name): a create looks its name up, and its `DirAdd` asks
/// again under the same lock hold (the cookie of a replaced entry stays), and through the
/// mount a negative `LOOKUP` precedes each `CREATE`. Each answer is kept with its
/// directory's bucket epoch ([`DirOverlay::drops`]) as it was when the answer was known
/// current, and is used only while that epoch is unchanged and the overlay still does not
/// hold the name: then no record changed the name since (one logged meanwhile would be in
/// the overlay until it left, and leaving bumps the epoch), so the trees still answer the
/// same. A slot another name takes is only a miss.
#[derive(Debug)]
struct LookedUp {
    slots: std::cell::RefCell<Vec<Option<Looked>>>,
    /// Names are the callers' (seeded, as every map keyed by names).
    hasher: std::collections::hash_map::RandomState,
}

#[derive(Debug)]
struct Looked {
    dir: Ino,
    name: Box<[u8]>,
    found: Option<Placed>,
    epoch: u64,
}

impl Default for LookedUp {
    fn default() -> Self {
        Self {
            slots: std::cell::RefCell::new((0..LOOKED_SLOTS).map(|_| None).collect()),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl LookedUp {
    fn slot(&self, dir: Ino, name: &[u8]) -> usize {
        use std::hash::BuildHasher;
        (self.hasher.hash_one((dir.0, name)) % LOOKED_SLOTS as u64) as usize
    }

    /// The kept answer for `name` in `dir`, if its epoch is still `epoch`.
    fn get(&self, dir: Ino, name: &[u8], epoch: u64) -> Option<Option<Placed>> {
        let slots = self.slots.borrow();
        let l = slots[self.slot(dir, name)].as_ref()?;
        (l.dir == dir && l.epoch == epoch && *l.name == *name).then_some(l.found)
    }

    fn put(&self, dir: Ino, name: &[u8], found: Option<Placed>, epoch: u64) {
        let at = self.slot(dir, name);
        self.slots.borrow_mut()[at] = Some(Looked {
            dir,
            name: name.into(),
            found,
            epoch,
        });
    }
}

impl DirOverlay {
    fn names(&self, dir: Ino) -> Option<&HashMap<Vec<u8>, NameChange>> {
        self.dirs.get(&dir)
    }

    fn set(&mut self, dir: Ino, name: &[u8], c: NameChange) {
        let names = self.dirs.entry(dir).or_default();
        if names.insert(name.to_vec(), c).is_none() {
            self.len += 1;
        }
        self.order.push_back((c.seq, dir, name.to_vec()));
    }

    /// Drops the changes of transactions at or below `applied`: constant time when there
    /// are none, one step per change dropped otherwise.
    fn drop_applied(&mut self, applied: u64) {
        while let Some((seq, dir, name)) = self.order.front() {
            if *seq > applied {
                return;
            }
            if let Some(names) = self.dirs.get_mut(dir) {
                // Only if this was the name's last change (a later one keeps it).
                if names.get(name).is_some_and(|c| c.seq <= applied) {
                    names.remove(name);
                    self.len -= 1;
                    self.drops[drop_bucket(*dir)] += 1;
                    if names.is_empty() {
                        self.dirs.remove(dir);
                    }
                }
            }
            self.order.pop_front();
        }
    }
}

/// One in-core inode: the decoded inode and the last transaction that changed it (0: as
/// the trees hold it).
#[derive(Debug)]
struct Slot {
    inode: Inode,
    seq: u64,
    /// Used since the last sweep (second chance).
    used: Cell<bool>,
}

/// The in-core decoded inodes (see the module documentation).
pub(crate) struct MetaView {
    /// Owned boxes (`Box::into_raw`), inserted through `&self`, changed and dropped only
    /// through `&mut self`.
    slots: UnsafeCell<IdMap<Ino, NonNull<Slot>>>,
    /// Freed inodes whose `InodeFree` (of the transaction given) the trees do not have yet.
    gone: IdMap<Ino, u64>,
    /// Next inode number to hand out (inode numbers are never reused).
    next_ino: u64,
    /// Inodes in the file system.
    count: u64,
    store: Arc<Store>,
    /// Inodes read from the trees since mount.
    loads: Cell<u64>,
    /// Sweep when more inodes than this are in core.
    bound: usize,
    sweep_at: usize,
    peak: Cell<usize>,
    evicted: u64,
    /// Bumped whenever an inode leaves core (evicted or freed): a read made without the
    /// lock across a bump may be stale ([`MissTicket`]).
    epoch: u64,
    /// Reads made without the lock and discarded as possibly stale.
    stale_reads: u64,
    /// Directory entries changed by records the trees do not hold yet.
    overlay: DirOverlay,
    /// The cookie the next new entry of a directory takes, remembered from its last
    /// `DirAdd` so that a run of creates does not search the trees for the highest
    /// cookie each time; forgotten when an entry of the directory is removed (the
    /// highest may go) and when the directory leaves core (bounded with the inodes).
    next_cookies: IdMap<Ino, DirCookie>,
    /// The trees' last answers for names the overlay does not hold ([`LookedUp`]).
    looked: LookedUp,
}

/// A miss to be read from the trees without the metadata lock: the inode and the view's
/// removal epoch when the miss was seen (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) struct MissTicket {
    pub ino: Ino,
    epoch: u64,
}

/// A readdir page to be read from the trees without the metadata lock: the directory and
/// its bucket's overlay removal epoch when the read started ([`MetaView::dir_ticket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) struct EntriesTicket {
    dir: Ino,
    epoch: u64,
}

/// What [`MetaView::fill`] did with a read made without the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filled {
    /// The read is in core now, or the inode is (another thread's read or a change).
    Resident,
    /// The trees hold no such inode (remembered as gone until the next sweep).
    Absent,
    /// An inode left core while the read ran: it may be stale, and was discarded.
    Stale,
}

// SAFETY: the view owns every `Slot` its raw pointers name (nothing else points at them
// once a shared borrow of the view ends), so moving it to another thread moves plain owned
// data. It is not `Sync` (`UnsafeCell`, `Cell`): it lives under the metadata mutex.
unsafe impl Send for MetaView {}

impl std::fmt::Debug for MetaView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaView")
            .field("resident", &self.resident_count())
            .field("gone", &self.gone.len())
            .field("next_ino", &self.next_ino)
            .field("count", &self.count)
            .field("overlay_names", &self.overlay.len)
            .finish_non_exhaustive()
    }
}

impl Drop for MetaView {
    fn drop(&mut self) {
        for (_, p) in self.slots.get_mut().drain() {
            // SAFETY: `p` came from `Box::into_raw` and is dropped once, here.
            drop(unsafe { Box::from_raw(p.as_ptr()) });
        }
    }
}

/// What [`MetaView::sweep`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ViewSwept {
    pub evicted: usize,
    pub kept: usize,
}

impl MetaView {
    /// The trees the view reads (also what the reference-count lookups read).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// A view over `store` holding nothing yet, for a file system whose next inode number
    /// is `next_ino` and which has `count` inodes; swept past `bound` in-core inodes.
    pub fn new(store: Arc<Store>, next_ino: u64, count: u64, bound: usize) -> Self {
        Self {
            slots: UnsafeCell::new(IdMap::default()),
            gone: IdMap::default(),
            next_ino,
            count,
            store,
            loads: Cell::new(0),
            bound,
            sweep_at: bound,
            peak: Cell::new(0),
            evicted: 0,
            epoch: 0,
            stale_reads: 0,
            overlay: DirOverlay::default(),
            next_cookies: IdMap::default(),
            looked: LookedUp::default(),
        }
    }

    fn map(&self) -> &IdMap<Ino, NonNull<Slot>> {
        // SAFETY: the map is changed only by `insert_shared` (which holds no reference to
        // it across the change and is not reentrant) and by `&mut self` methods.
        unsafe { &*self.slots.get() }
    }

    fn slot(&self, ino: Ino) -> Option<&Slot> {
        // SAFETY: a slot lives until a `&mut self` method drops it; the returned borrow
        // is tied to `&self`, which rules those out meanwhile. It is derived from the raw
        // pointer, not from the map, so inserting other slots does not invalidate it.
        self.map().get(&ino).map(|p| unsafe { p.as_ref() })
    }

    fn slot_mut(&mut self, ino: Ino) -> Option<&mut Slot> {
        // SAFETY: `&mut self` guarantees no other borrow of any slot exists.
        self.slots
            .get_mut()
            .get_mut(&ino)
            .map(|p| unsafe { p.as_mut() })
    }

    fn insert_shared(&self, ino: Ino, inode: Inode, seq: u64) -> &Slot {
        debug_assert!(
            inode.entries.is_empty(),
            "directory entries live in the trees and the overlay, not in a decoded inode"
        );
        let p = NonNull::from(Box::leak(Box::new(Slot {
            inode,
            seq,
            used: Cell::new(true),
        })));
        // SAFETY: no reference into the map is alive (`map()`'s borrows end with the
        // statements that take them; slot borrows point at the boxes, not the map), and
        // the view is not `Sync`, so nothing else touches it meanwhile.
        let map = unsafe { &mut *self.slots.get() };
        let old = map.insert(ino, p);
        debug_assert!(old.is_none(), "inode {ino} inserted twice");
        self.peak.set(self.peak.get().max(map.len()));
        // SAFETY: just inserted; lives as `slot` explains.
        unsafe { p.as_ref() }
    }

    fn insert(&mut self, ino: Ino, inode: Inode, seq: u64) {
        self.insert_shared(ino, inode, seq);
    }

    /// The inode `ino`, read from the trees if it is not in core; `None` if it does not
    /// exist.
    ///
    /// # Errors
    /// The trees' read or decode error (`Corrupted` names the item).
    pub fn get(&self, ino: Ino) -> Result<Option<&Inode>> {
        if let Some(s) = self.slot(ino) {
            s.used.set(true);
            return Ok(Some(&s.inode));
        }
        if ino.0 == 0 || ino.0 >= self.next_ino || self.gone.contains_key(&ino) {
            return Ok(None);
        }
        let Some(inode) =
            items::load_inode_without_entries(&self.store, ino).map_err(FsError::from)?
        else {
            return Ok(None);
        };
        self.loads.set(self.loads.get() + 1);
        Ok(Some(&self.insert_shared(ino, inode, 0).inode))
    }

    /// A ticket to read `ino` without the lock, if it must be read: `None` when it is in
    /// core or cannot exist (number 0 or never handed out, or freed).
    pub fn miss(&self, ino: Ino) -> Option<MissTicket> {
        let absent = ino.0 == 0 || ino.0 >= self.next_ino || self.gone.contains_key(&ino);
        (self.slot(ino).is_none() && !absent).then_some(MissTicket {
            ino,
            epoch: self.epoch,
        })
    }

    /// Whether a read made for `t` without the lock still describes the trees: nothing
    /// left core since the ticket was taken, and `t.ino` is not in core (if it is, the
    /// view is its authority and the read may have seen its records being applied).
    pub fn still_valid(&self, t: MissTicket) -> bool {
        t.epoch == self.epoch && self.slot(t.ino).is_none()
    }

    /// Inserts `read`, the trees' copy of `t.ino` read without the lock, if the ticket is
    /// still valid and the inode is still absent from core (module documentation).
    pub fn fill(&mut self, t: MissTicket, read: Option<Inode>) -> Filled {
        if let Some(s) = self.slot(t.ino) {
            s.used.set(true);
            return Filled::Resident;
        }
        if !self.still_valid(t) {
            self.stale_reads += 1;
            return Filled::Stale;
        }
        if self.gone.contains_key(&t.ino) {
            return Filled::Absent;
        }
        let Some(inode) = read else {
            // Freed and applied (inode numbers are not reused): absent for good. Seq 0
            // lets the next sweep drop the tombstone; a later miss reads again.
            self.gone.insert(t.ino, 0);
            return Filled::Absent;
        };
        self.loads.set(self.loads.get() + 1);
        self.insert(t.ino, inode, 0);
        Filled::Resident
    }

    /// Reads made without the lock and discarded as possibly stale (inode misses and
    /// readdir pages), since mount.
    pub fn stale_reads(&self) -> u64 {
        self.stale_reads
    }

    /// The inode `ino` if it is in core (no read).
    pub fn resident(&self, ino: Ino) -> Option<&Inode> {
        self.slot(ino).map(|s| &s.inode)
    }

    /// Inode numbers in core.
    pub fn resident_inos(&self) -> Vec<Ino> {
        self.map().keys().copied().collect()
    }

    /// Extents of the inodes in core.
    pub fn resident_extents(&self) -> usize {
        self.map()
            .keys()
            .filter_map(|&i| self.resident(i))
            .flat_map(|i| i.objects.iter())
            .map(stripefs_core::extent::ExtentMap::len)
            .sum()
    }

    /// Visits every inode of the file system: those in core, then the others as the
    /// trees hold them (a scan of the whole fs tree, one inode in memory at a time; for
    /// the space books and tools, not for operations).
    ///
    /// # Errors
    /// The trees' read or decode error.
    pub fn each_inode(&self, f: &mut dyn FnMut(&Inode)) -> Result<()> {
        for ino in self.resident_inos() {
            if let Some(i) = self.resident(ino) {
                f(i);
            }
        }
        items::each_inode(&self.store, &mut |i| {
            let ino = i.attrs.ino;
            if self.slot(ino).is_none() && !self.gone.contains_key(&ino) {
                f(&i);
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Inodes in core now.
    pub fn resident_count(&self) -> usize {
        self.map().len()
    }

    /// The bound the sweep keeps the resident inodes to (`-o inode_cache`).
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// Most inodes in core at once since mount.
    pub fn peak(&self) -> usize {
        self.peak.get()
    }

    /// Inodes read from the trees since mount.
    pub fn loads(&self) -> u64 {
        self.loads.get()
    }

    /// Inodes evicted since mount.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Next inode number to hand out.
    pub fn next_ino(&self) -> u64 {
        self.next_ino
    }

    /// Inodes in the file system.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Applies `rec`, logged in transaction `seq`, to the inode it is about (read first
    /// if it is not in core). The only way the view changes.
    ///
    /// # Errors
    /// `Corrupted` if the record does not fit (as `MetaState::apply`); a read error.
    pub fn apply(&mut self, rec: &Record, seq: u64) -> Result<()> {
        let Some(ino) = rec.subject() else {
            return Err(CoreError::corrupted(
                "metadata record",
                format!("{rec:?} applied to the inodes"),
            )
            .into());
        };
        let exists = self.get(ino)?.is_some();
        match rec {
            Record::DirAdd {
                dir,
                name,
                ino: target,
                kind,
            } => return self.dir_add(rec, *dir, name, *target, *kind, seq),
            Record::DirRemove { dir, name } => return self.dir_remove(rec, *dir, name, seq),
            Record::InodeFree(_) if exists => {
                let p = self.slots.get_mut().remove(&ino).expect("just read");
                // SAFETY: from `Box::into_raw`, removed from the map: dropped once.
                drop(unsafe { Box::from_raw(p.as_ptr()) });
                self.gone.insert(ino, seq);
                self.next_cookies.remove(&ino);
                self.epoch += 1;
                self.count -= 1;
                return Ok(());
            }
            Record::InodeSet(a) if !exists => {
                let i = new_inode(rec)?;
                self.next_ino = self.next_ino.max(a.ino.0 + 1);
                self.count += 1;
                self.insert(ino, i, seq);
                return Ok(());
            }
            _ => {}
        }
        let Some(s) = self.slot_mut(ino) else {
            return Err(CoreError::corrupted(
                "metadata record",
                format!("{rec:?} refers to missing inode {ino}"),
            )
            .into());
        };
        apply_to(&mut s.inode, rec)?;
        s.seq = seq;
        Ok(())
    }

    fn dir_add(
        &mut self,
        rec: &Record,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        kind: FileKind,
        seq: u64,
    ) -> Result<()> {
        match self.get(dir)? {
            Some(d) if d.attrs.kind == FileKind::Directory => {}
            Some(_) => return Err(misfit(format!("entry added to non-directory {dir}"))),
            None => return Err(missing(rec, dir)),
        }
        // A replaced entry keeps its cookie (as `items::apply_record` keeps it); a new one
        // takes the cookie the trees will give it when the record is applied.
        let cookie = match self.entry(dir, name)? {
            Some(p) => p.cookie,
            None => {
                let c = match self.next_cookies.get(&dir) {
                    Some(&c) => c,
                    None => self.next_cookie(dir)?,
                };
                if cfg!(debug_assertions) {
                    // A read error here is the trees' to report elsewhere.
                    if let Ok(searched) = self.next_cookie(dir) {
                        assert_eq!(c, searched, "directory {dir}'s remembered next cookie");
                    }
                }
                // At the last cookie nothing is remembered: the next create searches
                // and meets the limit.
                match c.0.checked_add(1) {
                    Some(n) => self.next_cookies.insert(dir, DirCookie(n)),
                    None => self.next_cookies.remove(&dir),
                };
                c
            }
        };
        let now = Some(Placed {
            entry: DirEntry { ino, kind },
            cookie,
        });
        self.overlay.set(dir, name, NameChange { now, seq });
        Ok(())
    }

    fn dir_remove(&mut self, rec: &Record, dir: Ino, name: &[u8], seq: u64) -> Result<()> {
        if self.get(dir)?.is_none() {
            return Err(missing(rec, dir));
        }
        if self.entry(dir, name)?.is_none() {
            return Err(misfit(format!(
                "directory {dir} has no entry {:?} to remove",
                String::from_utf8_lossy(name)
            )));
        }
        self.overlay.set(dir, name, NameChange { now: None, seq });
        self.next_cookies.remove(&dir);
        Ok(())
    }

    /// The entry `name` of directory `dir`: the overlay's change of it, or else the
    /// trees' item (one name hash's items: O(log n) page reads in a directory of `n`).
    ///
    /// # Errors
    /// The trees' read or decode error.
    pub fn entry(&self, dir: Ino, name: &[u8]) -> Result<Option<Placed>> {
        if let Some(now) = self.overlay_entry(dir, name) {
            return Ok(now);
        }
        let epoch = self.bucket_epoch(dir);
        if let Some(found) = self.looked.get(dir, name, epoch) {
            if cfg!(debug_assertions) {
                // A read error here is the trees' to report elsewhere.
                if let Ok(tree) = items::lookup_entry(&self.store, dir, name) {
                    assert_eq!(
                        found,
                        tree.as_ref().map(Placed::of),
                        "directory {dir}'s kept answer for {:?}",
                        String::from_utf8_lossy(name)
                    );
                }
            }
            return Ok(found);
        }
        let e = items::lookup_entry(&self.store, dir, name).map_err(FsError::from)?;
        let found = e.as_ref().map(Placed::of);
        self.looked.put(dir, name, found, epoch);
        Ok(found)
    }

    /// What is known of entry `name` in `dir` without reading the trees: the overlay's
    /// change of it, or a kept tree answer still valid ([`LookedUp`]); `None` if neither.
    pub fn known_entry(&self, dir: Ino, name: &[u8]) -> Option<Option<Placed>> {
        self.overlay_entry(dir, name)
            .or_else(|| self.looked.get(dir, name, self.bucket_epoch(dir)))
    }

    /// Whether the cookie of `dir`'s next new entry is remembered (a `DirAdd` in it then
    /// searches no tree page).
    pub fn remembers_next_cookie(&self, dir: Ino) -> bool {
        self.next_cookies.contains_key(&dir)
    }

    /// Keeps `found`, the trees' answer for `name` in `dir` read without the lock under
    /// ticket `t` (checked valid, the overlay not holding the name), for the next lookup
    /// of it ([`LookedUp`]).
    pub fn keep_entry(&self, t: EntriesTicket, name: &[u8], found: Option<Placed>) {
        debug_assert!(self.dir_ticket_valid(t) && self.overlay_entry(t.dir, name).is_none());
        self.looked.put(t.dir, name, found, t.epoch);
    }

    /// The overlay's change of `name` in `dir`, if it holds one (`Some(None)`: removed).
    pub fn overlay_entry(&self, dir: Ino, name: &[u8]) -> Option<Option<Placed>> {
        self.overlay
            .names(dir)
            .and_then(|n| n.get(name))
            .map(|c| c.now)
    }

    /// Whether directory `dir` has no entry: none added in the overlay, and none in the
    /// trees that the overlay does not change (a scan of at most one item more than the
    /// overlay holds for `dir`, however large the directory).
    ///
    /// # Errors
    /// The trees' read or decode error.
    pub fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        let names = self.overlay.names(dir);
        if names.is_some_and(|n| n.values().any(|c| c.now.is_some())) {
            return Ok(false);
        }
        let changed = names.map_or(0, HashMap::len);
        let tree = items::dir_cookies(&self.store, dir, 0, changed + 1).map_err(FsError::from)?;
        Ok(tree
            .iter()
            .all(|e| names.is_some_and(|n| n.contains_key(&e.name))))
    }

    /// Up to `limit` entries of directory `dir` with cookies above `after`, in cookie
    /// order: the trees' cookie items for names the overlay does not change, merged with
    /// the overlay's present entries. An entry keeps its cookie for its whole life (a
    /// replacement by rename keeps it too), so a listing resumed from the last cookie it
    /// returned gives every entry present throughout exactly once. Reads the trees under
    /// the metadata lock: the fallback of `FsInner::dir_page`, which reads without it.
    ///
    /// # Errors
    /// The trees' read or decode error.
    pub fn dir_page(
        &self,
        dir: Ino,
        after: DirCookie,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Placed)>> {
        let mut tree = Vec::new();
        let mut at = after.0;
        let mut want = limit;
        loop {
            let batch = items::dir_cookies(&self.store, dir, at, want).map_err(FsError::from)?;
            let exhausted = batch.len() < want;
            if let Some(last) = batch.last() {
                at = last.cookie;
            }
            tree.extend(batch);
            let kept = self.dir_unchanged(dir, &tree);
            if exhausted || kept >= limit {
                return Ok(self.merge_dir_page(dir, after, limit, tree));
            }
            want = (limit - kept).max(16);
        }
    }

    /// A ticket to read cookie items of directory `dir` from the trees without the lock
    /// (`FsInner::dir_page`).
    pub fn dir_ticket(&self, dir: Ino) -> EntriesTicket {
        EntriesTicket {
            dir,
            epoch: self.bucket_epoch(dir),
        }
    }

    /// Whether cookie items read from the trees since `t` was taken can be merged with
    /// the overlay as it is now: no change of the directory left the overlay meanwhile.
    /// Then, for a name the overlay holds now, the overlay is the authority; for any
    /// other, no unapplied record touched it when the read started (the trees held its
    /// state then, and only records logged since can have changed it there, each a state
    /// the name had during the read). A change that left would break this: the read may
    /// have seen the trees before they applied it (metadata.md, "Directory entries").
    pub fn dir_ticket_valid(&self, t: EntriesTicket) -> bool {
        self.bucket_epoch(t.dir) == t.epoch
    }

    /// The overlay's removal epoch of `dir`'s bucket ([`DirOverlay::drops`]).
    fn bucket_epoch(&self, dir: Ino) -> u64 {
        self.overlay.drops[drop_bucket(dir)]
    }

    /// Counts a readdir read discarded as possibly stale.
    pub fn note_stale_dir_read(&mut self) {
        self.stale_reads += 1;
    }

    /// How many of `tree` (cookie items of `dir`) the overlay does not change.
    pub fn dir_unchanged(&self, dir: Ino, tree: &[DirEntryItem]) -> usize {
        match self.overlay.names(dir) {
            None => tree.len(),
            Some(n) => tree.iter().filter(|e| !n.contains_key(&e.name)).count(),
        }
    }

    /// The readdir page of `dir` after `after`: `tree`, cookie items read in order from
    /// `after` on (all there are, or at least `limit` that the overlay does not change),
    /// without the names the overlay changes, merged with the overlay's present entries.
    /// Only `tree` is decoded: the page costs what it returns plus the overlay of `dir`.
    pub fn merge_dir_page(
        &self,
        dir: Ino,
        after: DirCookie,
        limit: usize,
        tree: Vec<DirEntryItem>,
    ) -> Vec<(Vec<u8>, Placed)> {
        let names = self.overlay.names(dir);
        let mut out: Vec<(Vec<u8>, Placed)> = Vec::with_capacity(tree.len().min(limit));
        for e in tree {
            if !names.is_some_and(|n| n.contains_key(&e.name)) {
                let p = Placed::of(&e);
                out.push((e.name, p));
            }
        }
        if let Some(n) = names {
            for (name, c) in n {
                if let Some(p) = c.now.filter(|p| p.cookie > after) {
                    out.push((name.clone(), p));
                }
            }
            out.sort_by_key(|(_, p)| p.cookie);
        }
        // With fewer tree items than there are, at least `limit` unchanged ones precede
        // any overlay entry past the last item read, so the cut drops those.
        out.truncate(limit);
        out
    }

    /// The cookie the next new entry of `dir` takes: one above the highest cookie of the
    /// directory's entries as the records so far leave them, at least [`COOKIE_FIRST`]
    /// (the rule `items::apply_record` follows when it applies the `DirAdd`, so both give
    /// the entry the same cookie). The trees' highest cookie items are skipped while they
    /// are above the overlay's highest present cookie and the overlay changes their
    /// names (removed entries): one `floor`, plus one per such removal.
    fn next_cookie(&self, dir: Ino) -> Result<DirCookie> {
        let names = self.overlay.names(dir);
        let mut top = names
            .into_iter()
            .flat_map(HashMap::values)
            .filter_map(|c| c.now.map(|p| p.cookie.0))
            .max()
            .unwrap_or(0);
        let mut at = u64::MAX;
        while let Some(e) =
            items::cookie_at_or_below(&self.store, dir, at).map_err(FsError::from)?
        {
            // Items at or below the overlay's highest cannot raise it.
            if e.cookie <= top || !names.is_some_and(|n| n.contains_key(&e.name)) {
                top = top.max(e.cookie);
                break;
            }
            let Some(below) = e.cookie.checked_sub(1) else {
                break;
            };
            at = below;
        }
        let next = top.checked_add(1).ok_or_else(|| {
            FsError::from(CoreError::Limit(format!(
                "directory {dir} has used every readdir cookie"
            )))
        })?;
        Ok(DirCookie(next.max(COOKIE_FIRST)))
    }

    /// Directory entries the overlay holds (changed by records the trees do not hold yet).
    pub fn overlay_names(&self) -> usize {
        self.overlay.len
    }

    /// Whether the view holds more inodes than its bound (and than what the last sweep
    /// kept plus half the bound).
    pub fn sweep_due(&self) -> bool {
        self.resident_count() > self.sweep_at
    }

    /// Drops the overlay's changes that the trees hold (transaction at or below
    /// `applied`), oldest first: constant time when there are none, so it runs whenever
    /// the metadata lock is released.
    pub fn settle_overlay(&mut self, applied: u64) {
        self.overlay.drop_applied(applied);
    }

    /// Evicts inodes whose every change the trees hold (last change at or below
    /// `applied`, the last transaction applied to them) and that `pinned` does not keep:
    /// those unused since the last sweep (second chance), then, while over the bound,
    /// others until half the bound is left. Tombstones of frees the trees hold go too.
    pub fn sweep(&mut self, applied: u64, pinned: impl Fn(Ino) -> bool) -> ViewSwept {
        self.gone.retain(|_, s| *s > applied);
        self.overlay.drop_applied(applied);
        let before = self.resident_count();
        self.evict_where(|ino, s| {
            let recent = s.used.replace(false);
            !recent && s.seq <= applied && !pinned(ino)
        });
        let mut excess = self.resident_count().saturating_sub(self.bound / 2);
        if self.resident_count() > self.bound {
            self.evict_where(|ino, s| {
                let go = excess > 0 && s.seq <= applied && !pinned(ino);
                excess -= usize::from(go);
                go
            });
        }
        let kept = self.resident_count();
        self.evicted += (before - kept) as u64;
        if kept < before {
            self.epoch += 1;
        }
        // The next sweep once half a bound more is in core: at most the bound plus what
        // the sweep could not evict (pinned by unapplied records or runtime state) plus
        // half a bound, where doubling what it kept let the view reach four times the
        // bound. Each sweep walks what it kept, so with pins bounded by a few bounds
        // (decision 62) a sweep costs a few steps per inode inserted since the last.
        self.sweep_at = self.bound.max(kept + self.bound / 2);
        ViewSwept {
            evicted: before - kept,
            kept,
        }
    }

    fn evict_where(&mut self, mut evict: impl FnMut(Ino, &Slot) -> bool) {
        self.slots.get_mut().retain(|&ino, p| {
            // SAFETY: `&mut self`: no other borrow of a slot exists.
            let s = unsafe { p.as_ref() };
            if !evict(ino, s) {
                return true;
            }
            // SAFETY: from `Box::into_raw`, leaving the map: dropped once.
            drop(unsafe { Box::from_raw(p.as_ptr()) });
            false
        });
        let slots = self.slots.get_mut();
        self.next_cookies.retain(|ino, _| slots.contains_key(ino));
    }
}

fn misfit(detail: String) -> FsError {
    CoreError::corrupted("metadata record", detail).into()
}

fn missing(rec: &Record, ino: Ino) -> FsError {
    misfit(format!("{rec:?} refers to missing inode {ino}"))
}

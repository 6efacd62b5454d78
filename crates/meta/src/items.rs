//! The metadata records as items of the fs tree (issue 11, stage 1; `docs/design/format.md`,
//! "Metadata keyspace").
//!
//! [`apply_record`] is the tree-side twin of `MetaState::apply`: it turns one journal
//! record into puts and deletes, reading only the items the record touches (the inode, one
//! name hash's entries, the extents around one range), so its cost does not grow with the
//! size of a directory or a file. [`load_state`] reads the whole fs tree back into a
//! `MetaState`. The same valid record sequence applied to both gives
//! `load_state(store) == state` (`tests/items_model.rs`).
//!
//! Records are applied by one thread at a time (the journal's applier): a record's reads
//! and writes are several store calls, and cookie and collision choices assume no other
//! record changes the same directory meanwhile. A record that does not fit the trees is
//! refused with `Corrupted` before anything is written.

use std::collections::BTreeMap;

use stripefs_core::btree::key::COLLISIONS_MAX;
use stripefs_core::btree::schema::{
    assemble_symlink, counter_key, decode_counter, decode_dir_cookie, decode_dir_entry,
    decode_extent, decode_inode, decode_xattr, dir_cookie_key, dir_entry_items, dir_entry_key,
    encode_counter, encode_extent, encode_inode, extent_key, free_collision, inode_key, orphan_key,
    orphan_range, symlink_items, xattr_items, Counter, DirEntryItem, COOKIE_FIRST,
};
use stripefs_core::btree::{name_hash, Key, KeyKind, TreeId};
use stripefs_core::extent::{Extent, ExtentMap};
use stripefs_core::idhash::IdMap;
use stripefs_core::inode::{
    DirEntry, FileKind, Inode, InodeAttrs, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};
use stripefs_core::meta::MetaState;
use stripefs_core::record::Record;
use stripefs_core::{CoreError, Ino, Uuid};

use crate::{MetaError, Store};

/// The function that orders names (a seam so that a test can force collisions).
type NameHash = fn(Uuid, &[u8]) -> u64;

/// Items fetched per scan while loading or freeing.
const BATCH: usize = 512;

/// Applies one journal record to the trees as puts/deletes (the tree-side twin of
/// `MetaState::apply`). Same record sequence => `load_state()` equals the `MetaState`.
///
/// # Errors
/// `Corrupted` when the record does not fit the trees (missing inode, entry in a
/// non-directory, object index out of range, a name the items cannot hold...) or an
/// item read does not decode; a page read's error; `Poisoned`.
pub fn apply_record(store: &Store, rec: &Record) -> Result<(), MetaError> {
    apply_records(store, std::slice::from_ref(rec))
}

/// Applies `recs` in order, as [`apply_record`] one by one would, reading the counter
/// item (next inode number, inode count) once and writing it once at the end instead of
/// around every inode record: the journal's applier hands over a whole transaction. A
/// record that fails leaves the ones before it applied (the counter item included) and
/// itself unwritten.
///
/// Until it returns, the counter item may lag the inode items of `recs`: a reader of
/// [`load_inode`] must not ask for an inode that `recs` create before they are applied
/// (the file system's in-core inodes are pinned until the transaction that changed them
/// is applied, `metaview.rs`).
///
/// # Errors
/// As [`apply_record`], for the first record that fails.
pub fn apply_records(store: &Store, recs: &[Record]) -> Result<(), MetaError> {
    apply_records_with(store, recs, &mut ApplyMemo::default())
}

/// What an applier remembers of the items from one transaction to the next, so that a
/// run of creates does not read its directory's inode and search for its highest cookie
/// once per entry: the attributes of inodes records had to read (directories taking
/// entries, files taking extents), per directory the cookie of its next new entry, and
/// the counter item.
/// Valid only while every change of those items goes through the applier that owns it:
/// one applier at a time, and one memo per applier (the journal keeps its applier's
/// under its applying lock). Bounded: past [`ApplyMemo::BOUND`] inodes it keeps only
/// the directories (and only the counter if they alone pass it), and it is emptied after
/// a record fails.
#[derive(Debug, Default)]
pub struct ApplyMemo {
    /// Inodes' attributes as the tree holds them (`None`: no such inode).
    attrs: IdMap<Ino, Option<InodeAttrs>>,
    /// The cookie a directory's next new entry takes (one above the last one given);
    /// forgotten when the directory loses an entry, whose cookie may have been the
    /// highest.
    cookies: IdMap<Ino, u64>,
    /// The counter item as the tree holds it (replay applies one record per call, and
    /// read it from the tree for each).
    counter: Option<Counter>,
}

impl ApplyMemo {
    /// Inodes remembered at most (about 1.5 MiB).
    pub const BOUND: usize = 8192;

    /// Past the bound, forgets all but the directories (a run of writes to new files
    /// remembers each file once; the directories are what the next records need), and
    /// everything if they alone pass it.
    fn trim(&mut self) {
        if self.attrs.len() > Self::BOUND {
            self.attrs
                .retain(|_, a| a.as_ref().is_some_and(|a| a.kind == FileKind::Directory));
        }
        if self.attrs.len() > Self::BOUND || self.cookies.len() > Self::BOUND {
            *self = Self {
                counter: self.counter,
                ..Self::default()
            };
        }
    }
}

/// [`apply_records`] with `memo`, what the caller's earlier calls remembered (see
/// [`ApplyMemo`] for who may keep one across calls).
///
/// # Errors
/// As [`apply_records`]; `memo` is emptied then.
pub fn apply_records_with(
    store: &Store,
    recs: &[Record],
    memo: &mut ApplyMemo,
) -> Result<(), MetaError> {
    store.fold_pending()?;
    let items = Items::new(store, name_hash, std::mem::take(memo));
    let res = recs.iter().try_for_each(|r| items.apply(r));
    let res = items.write_counter().and(res);
    if res.is_ok() {
        let counter = items.counter.get().map(|(now, _)| now);
        *memo = items.memo.into_inner();
        // A call whose records did not read the counter left it as the memo had it.
        if counter.is_some() {
            memo.counter = counter;
        }
        memo.trim();
    }
    res
}

/// The keys whose leaves applying `rec` ([`apply_records`]) and reading the inodes it
/// names ([`load_inode_without_entries`], [`lookup_entry`]) start from: the counter item,
/// each named inode's first item and orphan item, the entry's name hash and the
/// directory's highest cookie, the extent window, the xattr's name hash, the symlink, the
/// refcount, the checksum runs. A read-ahead list for [`Store::prefetch`] (replay gathers them for many
/// records, then reads their pages together), not a promise: an item a record finds only
/// through another (the cookie of a removed entry, the free-space runs around an
/// extent's blocks, the later leaves of a long scan) is read when the record is applied.
#[must_use]
pub fn record_keys(uuid: Uuid, rec: &Record) -> Vec<Key> {
    let inode = |ino: Ino| [inode_key(ino), orphan_key(ino)];
    let mut keys = vec![counter_key()];
    if let Some(ino) = rec.subject() {
        keys.extend(inode(ino));
    }
    match rec {
        Record::DirAdd { dir, name, ino, .. } => {
            keys.extend(inode(*ino));
            keys.push(dir_entry_key(*dir, name_hash(uuid, name), 0));
            keys.push(dir_cookie_key(*dir, u64::MAX));
            keys.push(Key::first_of(dir.0, KeyKind::Xattr, 0));
        }
        Record::DirRemove { dir, name } => {
            keys.push(dir_entry_key(*dir, name_hash(uuid, name), 0));
            keys.push(Key::first_of(dir.0, KeyKind::Xattr, 0));
        }
        Record::ExtentSet {
            ino, object, block, ..
        }
        | Record::ExtentClear {
            ino, object, block, ..
        } => {
            keys.push(extent_key(*ino, *object, block.saturating_sub(1)));
            keys.push(extent_key(*ino, *object, *block));
        }
        Record::XattrSet { ino, name, .. } | Record::XattrRemove { ino, name } => {
            keys.push(Key::new(ino.0, KeyKind::Xattr, name_hash(uuid, name), 0));
        }
        Record::SymlinkSet { ino, .. } => keys.push(Key::new(ino.0, KeyKind::Symlink, 0, 0)),
        Record::RefcountSet { target, phys, .. } => {
            keys.push(stripefs_core::btree::schema::refcount_key(*target, *phys));
        }
        Record::CsumSet { target, phys, .. } | Record::CsumClear { target, phys, .. } => {
            let k = stripefs_core::btree::schema::csum_key;
            keys.push(k(*target, phys.saturating_sub(1)));
            keys.push(k(*target, *phys));
        }
        Record::TargetState { target, .. } => {
            keys.push(stripefs_core::btree::schema::target_state_key(*target));
        }
        Record::TargetAdd { target, .. } => {
            keys.push(stripefs_core::btree::schema::target_member_key(*target));
        }
        Record::InodeSet(_) | Record::InodeFree(_) => {}
    }
    keys
}

/// Reads the whole fs tree into a `MetaState` (stage 1: the file system keeps a full
/// in-memory copy).
///
/// # Errors
/// `Corrupted` naming the item when an item does not decode or the items disagree
/// (an entry without its cookie item, an orphan item of a linked inode, items of a
/// missing inode...); a page read's error; `Poisoned`.
pub fn load_state(store: &Store) -> Result<MetaState, MetaError> {
    load_with(store, name_hash)
}

/// Reads inode `ino` from the fs tree (a scan of its key prefix), with the same decoder
/// and checks as [`load_state`]; `None` if the trees do not hold it. The file system's
/// in-core inodes load from here on a miss.
///
/// # Errors
/// As [`load_state`], for `ino`'s items.
pub fn load_inode(store: &Store, ino: Ino) -> Result<Option<Inode>, MetaError> {
    load_inode_with(store, name_hash, ino)
}

/// Every inode with an orphan item (link count 0), from the orphan index at object 0.
///
/// # Errors
/// A page read's error; `Corrupted` for an orphan item with a value.
pub fn orphans(store: &Store) -> Result<Vec<Ino>, MetaError> {
    let (mut at, to) = orphan_range();
    let mut out = Vec::new();
    loop {
        let items = store.scan(TreeId::Fs, at, to, BATCH)?;
        let Some(&(last, _)) = items.last() else {
            return Ok(out);
        };
        for (k, v) in items {
            if !v.is_empty() || k.b != 0 {
                return Err(bad_item(&k, "an orphan item with a value"));
            }
            out.push(Ino(k.a));
        }
        match last.successor() {
            Some(k) => at = k,
            None => return Ok(out),
        }
    }
}

/// The counter item: next inode number and inode count (a mount reads only this).
///
/// # Errors
/// A page read's error; `Corrupted` if the item does not decode.
pub fn counter(store: &Store) -> Result<Counter, MetaError> {
    Items::new(store, name_hash, ApplyMemo::default()).counter()
}

/// Reads inode `ino` without its directory entries (`Inode::entries` left empty): the
/// inode's items before [`KeyKind::DirEntry`] and from [`KeyKind::Xattr`] on, so a
/// directory of any size costs what its attributes and xattrs cost. The file system's
/// in-core inodes load from here; their entries are looked up one name at a time
/// ([`lookup_entry`]) and listed by cookie ([`dir_cookies`]).
///
/// # Errors
/// As [`load_inode`], for the items read.
pub fn load_inode_without_entries(store: &Store, ino: Ino) -> Result<Option<Inode>, MetaError> {
    let head = Key::first_of(ino.0, KeyKind::DirEntry, 0);
    let tail = Key::first_of(ino.0, KeyKind::Xattr, 0);
    load_ranges(
        store,
        name_hash,
        ino,
        &[(None, Some(head)), (Some(tail), None)],
    )
}

/// The entry `name` of directory `dir` as the trees hold it (the items of one name hash:
/// a few leaves at most, whatever the directory's size).
///
/// # Errors
/// A page read's error; `Corrupted` if an entry item does not decode.
pub fn lookup_entry(
    store: &Store,
    dir: Ino,
    name: &[u8],
) -> Result<Option<DirEntryItem>, MetaError> {
    let i = Items::new(store, name_hash, ApplyMemo::default());
    Ok(i.find_entry(dir, i.hash(name), name)?.hit.map(|(_, e)| e))
}

/// Up to `limit` entries of directory `dir` with cookies above `after`, in cookie order
/// (its [`KeyKind::DirCookie`] items: a readdir resumed from a cookie reads from there).
///
/// # Errors
/// A page read's error; `Corrupted` if a cookie item does not decode.
pub fn dir_cookies(
    store: &Store,
    dir: Ino,
    after: u64,
    limit: usize,
) -> Result<Vec<DirEntryItem>, MetaError> {
    let Some(from) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let to = Key::first_of(dir.0, KeyKind::Xattr, 0);
    let items = store.scan(TreeId::Fs, dir_cookie_key(dir, from), Some(to), limit)?;
    items
        .into_iter()
        .map(|(k, v)| Ok(decode_dir_cookie(&k, &v)?.0))
        .collect()
}

/// The entry of directory `dir` with the highest cookie at or below `cookie`, if any (one
/// `floor`; the file system walks down from the top to find the highest cookie in use).
///
/// # Errors
/// As [`dir_cookies`].
pub fn cookie_at_or_below(
    store: &Store,
    dir: Ino,
    cookie: u64,
) -> Result<Option<DirEntryItem>, MetaError> {
    let Some((k, v)) = store.floor(&dir_cookie_key(dir, cookie))? else {
        return Ok(None);
    };
    if k.object != dir.0 || k.kind != KeyKind::DirCookie as u8 {
        return Ok(None);
    }
    Ok(Some(decode_dir_cookie(&k, &v)?.0))
}

fn load_inode_with(store: &Store, hash: NameHash, ino: Ino) -> Result<Option<Inode>, MetaError> {
    load_ranges(store, hash, ino, &[(None, None)])
}

/// Reads the items of `ino` in the given ranges of its key prefix (`None`: the prefix's
/// start or end), in key order, into one inode.
fn load_ranges(
    store: &Store,
    hash: NameHash,
    ino: Ino,
    ranges: &[(Option<Key>, Option<Key>)],
) -> Result<Option<Inode>, MetaError> {
    if ino.0 == 0 {
        return Ok(None);
    }
    let mut l = Loader::new(store, hash);
    l.next_ino = Items::new(store, hash, ApplyMemo::default())
        .counter()?
        .next_ino;
    if store.get(&orphan_key(ino))?.is_some() {
        l.orphans.insert(ino.0);
    }
    let first = Key {
        object: ino.0,
        ..Key::MIN
    };
    let end = Key {
        object: ino.0,
        ..Key::MAX
    }
    .successor();
    for &(from, to) in ranges {
        let mut at = from.unwrap_or(first);
        let to = to.or(end);
        loop {
            let items = store.scan(TreeId::Fs, at, to, BATCH)?;
            let Some(&(last, _)) = items.last() else {
                break;
            };
            for (k, v) in items {
                l.item(k, &v)?;
            }
            match last.successor() {
                Some(k) => at = k,
                None => break,
            }
        }
    }
    l.finish()?;
    Ok(l.inodes.remove(&ino))
}

fn bad(detail: String) -> MetaError {
    CoreError::corrupted("metadata record", detail).into()
}

fn bad_item(key: &Key, detail: impl Into<String>) -> MetaError {
    CoreError::corrupted(format!("metadata item {key}"), detail).into()
}

/// What an extent record does to the window of the map it reads.
enum ExtentOp {
    Set(Extent),
    Clear,
}

/// What a search among the items of one name hash found: the collision index and
/// contents of the name searched for, and every collision index in use.
struct Found<T> {
    hit: Option<(u64, T)>,
    taken: Vec<u64>,
}

struct Items<'a> {
    store: &'a Store,
    hash: NameHash,
    /// The counter item as the records applied so far leave it, and as the tree holds
    /// it (read once, written by [`Items::write_counter`]).
    counter: std::cell::Cell<Option<(Counter, Counter)>>,
    /// What the applier remembers, kept up to date by every record applied.
    memo: std::cell::RefCell<ApplyMemo>,
}

impl<'a> Items<'a> {
    fn new(store: &'a Store, hash: NameHash, memo: ApplyMemo) -> Self {
        Items {
            store,
            hash,
            counter: std::cell::Cell::new(None),
            memo: std::cell::RefCell::new(memo),
        }
    }

    fn hash(&self, name: &[u8]) -> u64 {
        (self.hash)(self.store.uuid(), name)
    }

    fn apply(&self, rec: &Record) -> Result<(), MetaError> {
        if let Some(why) = rec.range_misfit() {
            return Err(bad(why));
        }
        match rec {
            Record::InodeSet(a) => self.inode_set(a),
            Record::InodeFree(ino) => self.inode_free(*ino),
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
                self.extent_op(rec, *ino, *object, *block, *len, &ExtentOp::Set(e))
            }
            Record::ExtentClear {
                ino,
                object,
                block,
                len,
            } => self.extent_op(rec, *ino, *object, *block, *len, &ExtentOp::Clear),
            Record::DirAdd {
                dir,
                name,
                ino,
                kind,
            } => self.dir_add(rec, *dir, name, *ino, *kind),
            Record::DirRemove { dir, name } => self.dir_remove(rec, *dir, name),
            Record::XattrSet { ino, name, value } => self.xattr_set(rec, *ino, name, value),
            Record::XattrRemove { ino, name } => self.xattr_remove(rec, *ino, name),
            Record::SymlinkSet { ino, target } => self.symlink_set(rec, *ino, target),
            Record::RefcountSet {
                target,
                phys,
                len,
                count,
            } => crate::refcount::set(self.store, *target, *phys, *len, *count),
            Record::CsumSet {
                target,
                phys,
                csums,
            } => crate::csum::set(self.store, *target, *phys, csums),
            Record::CsumClear { target, phys, len } => {
                crate::csum::clear(self.store, *target, *phys, *len)
            }
            Record::TargetAdd {
                target,
                blocks,
                data_start,
                member_id,
            } => self
                .store
                .add_member(*target, (*data_start, *blocks), *member_id),
            Record::TargetState { target, state } => self.store.set_target_state(*target, *state),
        }
    }

    fn attrs(&self, ino: Ino) -> Result<Option<InodeAttrs>, MetaError> {
        if ino.0 == 0 {
            return Ok(None);
        }
        if let Some(a) = self.memo.borrow().attrs.get(&ino) {
            if cfg!(debug_assertions) {
                // A read error here is the trees' to report elsewhere.
                if let Ok(tree) = self.read_attrs(ino) {
                    assert_eq!(a, &tree, "inode {ino}'s remembered attributes");
                }
            }
            return Ok(a.clone());
        }
        let a = self.read_attrs(ino)?;
        self.memo.borrow_mut().attrs.insert(ino, a.clone());
        Ok(a)
    }

    fn read_attrs(&self, ino: Ino) -> Result<Option<InodeAttrs>, MetaError> {
        let key = inode_key(ino);
        match self.store.get(&key)? {
            Some(v) => Ok(Some(decode_inode(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// The attributes of `ino`, which `rec` needs to exist.
    fn existing(&self, rec: &Record, ino: Ino) -> Result<InodeAttrs, MetaError> {
        self.attrs(ino)?
            .ok_or_else(|| bad(format!("{rec:?} refers to missing inode {ino}")))
    }

    fn counter(&self) -> Result<Counter, MetaError> {
        if let Some((now, _)) = self.counter.get() {
            return Ok(now);
        }
        let remembered = self.memo.borrow().counter;
        let c = match remembered {
            Some(c) => {
                if cfg!(debug_assertions) {
                    if let Ok(tree) = self.read_counter() {
                        assert_eq!(c, tree, "the remembered counter item");
                    }
                }
                c
            }
            None => self.read_counter()?,
        };
        self.counter.set(Some((c, c)));
        Ok(c)
    }

    fn read_counter(&self) -> Result<Counter, MetaError> {
        let key = counter_key();
        Ok(match self.store.get(&key)? {
            Some(v) => decode_counter(&key, &v)?,
            None => Counter::EMPTY,
        })
    }

    /// Sets the counter for the records after this one; the tree gets it from
    /// [`Items::write_counter`].
    fn set_counter(&self, c: Counter) -> Result<(), MetaError> {
        let (_, stored) = match self.counter.get() {
            Some(v) => v,
            None => {
                let now = self.counter()?;
                (now, now)
            }
        };
        self.counter.set(Some((c, stored)));
        Ok(())
    }

    /// Writes the counter item if the records changed it.
    fn write_counter(&self) -> Result<(), MetaError> {
        match self.counter.get() {
            Some((now, stored)) if now != stored => {
                self.store.insert(counter_key(), &encode_counter(now))?;
                self.counter.set(Some((now, now)));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn inode_set(&self, a: &InodeAttrs) -> Result<(), MetaError> {
        if a.ino.0 == 0 {
            return Err(bad("inode number 0 (the counter item's object)".into()));
        }
        if a.ino.0 == u64::MAX {
            return Err(bad(format!("inode number {}", a.ino)));
        }
        // Written first, its previous value read by the same descent; put back if the
        // record is refused, so that nothing of it stays written.
        let key = inode_key(a.ino);
        let value = encode_inode(a);
        let prev = self.store.insert(key, &value)?;
        let checked = match &prev {
            Some(v) => decode_inode(&key, v)
                .map_err(MetaError::from)
                .and_then(|o| Self::inode_set_checks(a, Some(&o)).map(|()| Some(o))),
            None => Self::inode_set_checks(a, None).map(|()| None),
        };
        let old = match checked {
            Ok(old) => old,
            Err(e) => {
                match &prev {
                    Some(v) => self.store.insert(key, v)?,
                    None => self.store.remove(&key)?,
                };
                return Err(e);
            }
        };
        // Only inodes records read are remembered: a new file's own record is no reason.
        // As a reader of the item would decode it: a value the decoder refuses is
        // forgotten, so the next record that reads it reports it as before.
        let mut memo = self.memo.borrow_mut();
        if let std::collections::hash_map::Entry::Occupied(mut m) = memo.attrs.entry(a.ino) {
            match decode_inode(&key, &value) {
                Ok(d) => *m.get_mut() = Some(d),
                Err(_) => drop(m.remove()),
            }
        }
        drop(memo);
        let was = self.counter()?;
        let mut c = was;
        c.next_ino = c.next_ino.max(a.ino.0 + 1);
        c.inodes += u64::from(old.is_none());
        if c != was {
            self.set_counter(c)?;
        }
        let was_orphan = old.as_ref().is_some_and(|o| o.nlink == 0);
        if a.nlink == 0 && !was_orphan {
            self.store.insert(orphan_key(a.ino), &[])?;
        } else if a.nlink > 0 && was_orphan {
            self.store.remove(&orphan_key(a.ino))?;
        }
        Ok(())
    }

    /// What an inode record may not do to the inode it replaces (`old`).
    fn inode_set_checks(a: &InodeAttrs, old: Option<&InodeAttrs>) -> Result<(), MetaError> {
        match old {
            Some(o) if o.kind != a.kind => {
                return Err(bad(format!("inode {} changes type", a.ino)));
            }
            Some(o) if a.kind == FileKind::Regular && o.layout.count != a.layout.count => {
                return Err(bad(format!(
                    "regular file {} changes its stripe count from {} to {}",
                    a.ino, o.layout.count, a.layout.count
                )));
            }
            None if a.kind == FileKind::Regular && a.layout.count == 0 => {
                return Err(bad(format!("regular file {} has no stripes", a.ino)));
            }
            _ => {}
        }
        Ok(())
    }

    /// Removes every item of `ino`, in batches.
    fn inode_free(&self, ino: Ino) -> Result<(), MetaError> {
        if self.attrs(ino)?.is_none() {
            return Err(bad(format!("free of missing inode {ino}")));
        }
        let mut c = self.counter()?;
        c.inodes = c
            .inodes
            .checked_sub(1)
            .ok_or_else(|| bad(format!("free of inode {ino} with no inodes counted")))?;
        self.set_counter(c)?;
        {
            let mut memo = self.memo.borrow_mut();
            memo.attrs.remove(&ino);
            memo.cookies.remove(&ino);
        }
        self.store.remove(&orphan_key(ino))?;
        let from = Key {
            object: ino.0,
            ..Key::MIN
        };
        let to = Key {
            object: ino.0,
            ..Key::MAX
        }
        .successor();
        loop {
            let items = self.store.scan(TreeId::Fs, from, to, BATCH)?;
            if items.is_empty() {
                return Ok(());
            }
            for (k, v) in items {
                self.store.remove(&k)?;
                // Extents left to the free (a record stream normally clears them first).
                if self.store.keeps_space() && k.kind == KeyKind::Extent as u8 {
                    let e = checked_extent(&k, &v, self.store.targets_given())?;
                    crate::space::give_unshared(self.store, e.target, e.phys, e.len)?;
                }
            }
        }
    }

    fn extent_op(
        &self,
        rec: &Record,
        ino: Ino,
        object: u32,
        start: u64,
        len: u64,
        op: &ExtentOp,
    ) -> Result<(), MetaError> {
        let a = self.existing(rec, ino)?;
        let objects = if a.kind == FileKind::Regular {
            a.layout.count
        } else {
            0
        };
        if object >= objects {
            return Err(bad(format!("inode {ino} has no object {object}")));
        }
        let before = self.extent_window(ino, object, start, start + len)?;
        let mut after = before.clone();
        match op {
            ExtentOp::Set(e) => {
                after.set(start, *e);
            }
            ExtentOp::Clear => {
                after.clear(start, len);
            }
        }
        self.write_extent_diff(ino, object, &before, &after)?;
        if self.store.keeps_space() {
            crate::space::extent_change(self.store, &before, &after)
        } else {
            Ok(())
        }
    }

    /// The extents `ExtentMap::set` or `clear` over `[start, end)` can read or change:
    /// the last one starting below `start` (it may be split, or merged with), and those
    /// starting in `[start, end]` (removed, trimmed, or merged with at `end`).
    fn extent_window(
        &self,
        ino: Ino,
        object: u32,
        start: u64,
        end: u64,
    ) -> Result<ExtentMap, MetaError> {
        let mut found = Vec::new();
        if let Some(below) = start.checked_sub(1) {
            if let Some((k, v)) = self.store.floor(&extent_key(ino, object, below))? {
                let same = k.object == ino.0
                    && k.kind == KeyKind::Extent as u8
                    && k.a == u64::from(object);
                if same {
                    found.push((k, v));
                }
            }
        }
        let to = extent_key(ino, object, end).successor();
        let from = extent_key(ino, object, start);
        found.extend(self.store.scan(TreeId::Fs, from, to, usize::MAX)?);
        let mut map = ExtentMap::new();
        for (k, v) in found {
            let e = checked_extent(&k, &v, self.store.targets_given())?;
            map.append(k.b, e).map_err(|d| bad_item(&k, d))?;
        }
        Ok(map)
    }

    /// Writes what changed between two windows of an extent map.
    fn write_extent_diff(
        &self,
        ino: Ino,
        object: u32,
        before: &ExtentMap,
        after: &ExtentMap,
    ) -> Result<(), MetaError> {
        let old: BTreeMap<u64, Extent> = before.iter().map(|(s, e)| (s, *e)).collect();
        let new: BTreeMap<u64, Extent> = after.iter().map(|(s, e)| (s, *e)).collect();
        for s in old.keys().filter(|s| !new.contains_key(s)) {
            self.store.remove(&extent_key(ino, object, *s))?;
        }
        for (s, e) in new.iter().filter(|(s, e)| old.get(s) != Some(e)) {
            self.store
                .insert(extent_key(ino, object, *s), &encode_extent(e))?;
        }
        Ok(())
    }

    /// The entry `name` of `dir` among those of its hash, and the collision indices taken.
    fn find_entry(
        &self,
        dir: Ino,
        hash: u64,
        name: &[u8],
    ) -> Result<Found<DirEntryItem>, MetaError> {
        let from = dir_entry_key(dir, hash, 0);
        let to = dir_entry_key(dir, hash, COLLISIONS_MAX).successor();
        let mut found = Found {
            hit: None,
            taken: Vec::new(),
        };
        for (k, v) in self.store.scan(TreeId::Fs, from, to, usize::MAX)? {
            let e = decode_dir_entry(&k, &v)?;
            found.taken.push(k.b);
            if e.name == name {
                found.hit = Some((k.b, e));
            }
        }
        Ok(found)
    }

    /// One above the highest cookie of `dir`, at least [`COOKIE_FIRST`]: remembered from
    /// the applier's last `DirAdd` in `dir` ([`ApplyMemo`]), or else searched for.
    fn next_cookie(&self, dir: Ino) -> Result<u64, MetaError> {
        if let Some(&c) = self.memo.borrow().cookies.get(&dir) {
            if cfg!(debug_assertions) {
                // A read error here is the trees' to report elsewhere.
                if let Ok(searched) = self.search_next_cookie(dir) {
                    assert_eq!(c, searched, "directory {dir}'s remembered next cookie");
                }
            }
            return Ok(c);
        }
        self.search_next_cookie(dir)
    }

    fn search_next_cookie(&self, dir: Ino) -> Result<u64, MetaError> {
        let Some((k, _)) = self.store.floor(&dir_cookie_key(dir, u64::MAX))? else {
            return Ok(COOKIE_FIRST);
        };
        if k.object != dir.0 || k.kind != KeyKind::DirCookie as u8 {
            return Ok(COOKIE_FIRST);
        }
        let next = k.a.checked_add(1).ok_or_else(|| {
            MetaError::from(CoreError::Limit(format!(
                "directory {dir} has used every readdir cookie"
            )))
        })?;
        Ok(next.max(COOKIE_FIRST))
    }

    fn dir_add(
        &self,
        rec: &Record,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        kind: FileKind,
    ) -> Result<(), MetaError> {
        if name.is_empty() || name.len() > NAME_MAX {
            return Err(bad(format!(
                "entry name of {} bytes in directory {dir}",
                name.len()
            )));
        }
        if self.existing(rec, dir)?.kind != FileKind::Directory {
            return Err(bad(format!("entry added to non-directory {dir}")));
        }
        let hash = self.hash(name);
        let Found { hit, taken } = self.find_entry(dir, hash, name)?;
        // A replaced entry keeps its cookie: a readdir in progress neither sees the
        // name twice nor misses it (decisions.md).
        let (collision, cookie, fresh) = match hit {
            Some((c, old)) => (c, old.cookie, false),
            None => (free_collision(taken)?, self.next_cookie(dir)?, true),
        };
        let item = DirEntryItem {
            ino,
            kind,
            cookie,
            name: name.to_vec(),
        };
        for (k, v) in dir_entry_items(dir, hash, collision, &item) {
            self.store.insert(k, &v)?;
        }
        if fresh {
            // At the last cookie nothing is remembered: the next search meets the limit.
            let cookies = &mut self.memo.borrow_mut().cookies;
            match cookie.checked_add(1) {
                Some(n) => cookies.insert(dir, n),
                None => cookies.remove(&dir),
            };
        }
        Ok(())
    }

    fn dir_remove(&self, rec: &Record, dir: Ino, name: &[u8]) -> Result<(), MetaError> {
        self.existing(rec, dir)?;
        let hash = self.hash(name);
        let Some((collision, e)) = self.find_entry(dir, hash, name)?.hit else {
            return Err(bad(format!(
                "directory {dir} has no entry {:?} to remove",
                String::from_utf8_lossy(name)
            )));
        };
        self.memo.borrow_mut().cookies.remove(&dir);
        self.store.remove(&dir_entry_key(dir, hash, collision))?;
        self.store.remove(&dir_cookie_key(dir, e.cookie))?;
        Ok(())
    }

    /// The keys of xattr `name` of `ino` among those of its hash, and the collision
    /// indices taken.
    fn find_xattr(&self, ino: Ino, hash: u64, name: &[u8]) -> Result<Found<Vec<Key>>, MetaError> {
        let from = Key::new(ino.0, KeyKind::Xattr, hash, 0);
        let to = Key::new(ino.0, KeyKind::Xattr, hash, u64::MAX).successor();
        let mut groups: BTreeMap<u64, Vec<(Key, Vec<u8>)>> = BTreeMap::new();
        for (k, v) in self.store.scan(TreeId::Fs, from, to, usize::MAX)? {
            groups.entry(k.b >> 16).or_default().push((k, v));
        }
        let mut found = Found {
            hit: None,
            taken: groups.keys().copied().collect(),
        };
        for (c, items) in groups {
            if decode_xattr(&items)?.0 == name {
                found.hit = Some((c, items.into_iter().map(|(k, _)| k).collect()));
            }
        }
        Ok(found)
    }

    fn xattr_set(
        &self,
        rec: &Record,
        ino: Ino,
        name: &[u8],
        value: &[u8],
    ) -> Result<(), MetaError> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX || value.len() > XATTR_VALUE_MAX {
            return Err(bad(format!(
                "inode {ino}: xattr name of {} bytes, value of {} bytes",
                name.len(),
                value.len()
            )));
        }
        self.existing(rec, ino)?;
        let hash = self.hash(name);
        let Found { hit, taken } = self.find_xattr(ino, hash, name)?;
        let (collision, old) = match hit {
            Some((c, keys)) => (c, keys),
            None => (free_collision(taken)?, Vec::new()),
        };
        self.replace(&old, xattr_items(ino, hash, collision, name, value))
    }

    fn xattr_remove(&self, rec: &Record, ino: Ino, name: &[u8]) -> Result<(), MetaError> {
        self.existing(rec, ino)?;
        let hash = self.hash(name);
        let Some((_, keys)) = self.find_xattr(ino, hash, name)?.hit else {
            return Err(bad(format!("inode {ino} has no xattr to remove")));
        };
        self.replace(&keys, Vec::new())
    }

    fn symlink_set(&self, rec: &Record, ino: Ino, target: &[u8]) -> Result<(), MetaError> {
        if target.len() > SYMLINK_MAX {
            return Err(bad(format!(
                "inode {ino}: symlink target of {} bytes",
                target.len()
            )));
        }
        self.existing(rec, ino)?;
        let from = Key::new(ino.0, KeyKind::Symlink, 0, 0);
        let to = Key::new(ino.0, KeyKind::Symlink, u64::MAX, u64::MAX).successor();
        let old: Vec<Key> = (self.store.scan(TreeId::Fs, from, to, usize::MAX)?)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        // An empty target is no items: what `MetaState` holds for a non-symlink.
        let new = if target.is_empty() {
            Vec::new()
        } else {
            symlink_items(ino, target)
        };
        self.replace(&old, new)
    }

    /// Replaces the items `old` by `new`: removes the keys `new` does not overwrite.
    fn replace(&self, old: &[Key], new: Vec<(Key, Vec<u8>)>) -> Result<(), MetaError> {
        for k in old.iter().filter(|k| !new.iter().any(|(n, _)| n == *k)) {
            self.store.remove(k)?;
        }
        for (k, v) in new {
            self.store.insert(k, &v)?;
        }
        Ok(())
    }
}

fn load_with(store: &Store, hash: NameHash) -> Result<MetaState, MetaError> {
    let mut inodes = BTreeMap::new();
    let next_ino = stream(store, hash, &mut |i| {
        inodes.insert(i.attrs.ino, i);
        Ok(())
    })?;
    Ok(MetaState {
        inodes,
        next_ino,
        refs: crate::refcount::load(store)?,
        csums: crate::csum::load(store)?,
    })
}

/// Hands every inode of the fs tree to `f`, in inode order, holding one at a time
/// (bounded memory: a scan batch and the inode being built), with the same checks as
/// [`load_state`].
///
/// # Errors
/// As [`load_state`]; `f`'s error.
pub fn each_inode(
    store: &Store,
    f: &mut dyn FnMut(Inode) -> Result<(), MetaError>,
) -> Result<(), MetaError> {
    stream(store, name_hash, f).map(|_| ())
}

/// Decodes the fs tree in key order, handing each finished inode to `f`; returns the
/// counter item's next inode number.
fn stream(
    store: &Store,
    hash: NameHash,
    f: &mut dyn FnMut(Inode) -> Result<(), MetaError>,
) -> Result<u64, MetaError> {
    let mut l = Loader::new(store, hash);
    let mut seen = 0u64;
    let mut f = |i: Inode| {
        seen += 1;
        f(i)
    };
    let mut at = Key::MIN;
    loop {
        let items = store.scan(TreeId::Fs, at, None, BATCH)?;
        let Some(&(last, _)) = items.last() else {
            break;
        };
        for (k, v) in items {
            l.item(k, &v)?;
        }
        for (_, i) in std::mem::take(&mut l.inodes) {
            f(i)?;
        }
        match last.successor() {
            Some(k) => at = k,
            None => break,
        }
    }
    l.finish()?;
    for (_, i) in std::mem::take(&mut l.inodes) {
        f(i)?;
    }
    if let Some(&o) = l.orphans.first() {
        return Err(bad_item(
            &orphan_key(Ino(o)),
            "an orphan item of a missing inode",
        ));
    }
    let (key, inodes) = l.counted.unwrap_or((counter_key(), 0));
    if inodes != seen {
        let d = format!("counts {inodes} inodes, the tree holds {seen}");
        return Err(bad_item(&key, d));
    }
    Ok(l.next_ino)
}

/// An inode being rebuilt from its items (which come in key order: inode, symlink,
/// orphan, entries, cookies, xattrs, extents).
struct Building {
    inode: Inode,
    orphan: bool,
    symlink: Vec<(Key, Vec<u8>)>,
    /// The chunks of the xattr being read.
    xattr: Vec<(Key, Vec<u8>)>,
    /// Each entry's (hash, collision, cookie), to check the cookie items against.
    entries: BTreeMap<Vec<u8>, (u64, u64, u64)>,
    cookies: usize,
}

/// An extent item, decoded and checked to name one of the store's `targets` (format
/// version 3: the target is stored, so a damaged item could name any).
fn checked_extent(k: &Key, v: &[u8], targets: u32) -> Result<Extent, MetaError> {
    let e = decode_extent(k, v)?;
    if e.target.0 >= targets {
        return Err(bad_item(
            k,
            format!(
                "extent on target {} of a file system of {targets}",
                e.target
            ),
        ));
    }
    Ok(e)
}

struct Loader {
    uuid: Uuid,
    /// Targets the store was given: an extent naming another is corruption.
    targets: u32,
    hash: NameHash,
    inodes: BTreeMap<Ino, Inode>,
    /// The counter item's next inode number (every inode is below it).
    next_ino: u64,
    /// The counter item and its inode count (checked when the whole tree is read).
    counted: Option<(Key, u64)>,
    /// Orphan index items not yet matched with their inode (object 0 comes first).
    orphans: std::collections::BTreeSet<u64>,
    cur: Option<Building>,
}

impl Loader {
    fn new(store: &Store, hash: NameHash) -> Self {
        Loader {
            uuid: store.uuid(),
            targets: store.targets_given(),
            hash,
            inodes: BTreeMap::new(),
            next_ino: Ino::ROOT.0,
            counted: None,
            orphans: std::collections::BTreeSet::new(),
            cur: None,
        }
    }

    fn item(&mut self, k: Key, v: &[u8]) -> Result<(), MetaError> {
        if k.object == 0 {
            if k.kind == KeyKind::Orphan as u8 && k.b == 0 && v.is_empty() {
                self.orphans.insert(k.a);
                return Ok(());
            }
            if k != counter_key() {
                return Err(bad_item(
                    &k,
                    "an item of object 0 other than the counter and the orphan index",
                ));
            }
            let c = decode_counter(&k, v)?;
            self.next_ino = c.next_ino;
            self.counted = Some((k, c.inodes));
            return Ok(());
        }
        if self
            .cur
            .as_ref()
            .is_some_and(|b| b.inode.attrs.ino.0 != k.object)
        {
            self.finish()?;
        }
        let Some(b) = self.cur.as_mut() else {
            return self.start(k, v);
        };
        match KeyKind::from_code(k.kind) {
            Some(KeyKind::Symlink) => b.symlink.push((k, v.to_vec())),
            Some(KeyKind::DirEntry) => entry(b, self.uuid, self.hash, k, v)?,
            Some(KeyKind::DirCookie) => cookie(b, k, v)?,
            Some(KeyKind::Xattr) => {
                let next_name = b
                    .xattr
                    .first()
                    .is_some_and(|(f, _)| (f.a, f.b >> 16) != (k.a, k.b >> 16));
                if next_name {
                    xattr_done(b, self.uuid, self.hash)?;
                }
                b.xattr.push((k, v.to_vec()));
            }
            Some(KeyKind::Extent) => {
                let e = checked_extent(&k, v, self.targets)?;
                let map = usize::try_from(k.a)
                    .ok()
                    .and_then(|i| b.inode.objects.get_mut(i))
                    .ok_or_else(|| bad_item(&k, "extent of an object the inode does not have"))?;
                map.append(k.b, e).map_err(|d| bad_item(&k, d))?;
            }
            _ => {
                return Err(bad_item(
                    &k,
                    format!("unexpected item of {} bytes", v.len()),
                ))
            }
        }
        Ok(())
    }

    /// The first item of an inode must be its attributes.
    fn start(&mut self, k: Key, v: &[u8]) -> Result<(), MetaError> {
        if k.kind != KeyKind::Inode as u8 {
            return Err(bad_item(&k, "belongs to no inode"));
        }
        let attrs = decode_inode(&k, v)?;
        if attrs.ino.0 >= self.next_ino {
            return Err(bad_item(
                &k,
                format!("inode at or above the next inode number {}", self.next_ino),
            ));
        }
        self.cur = Some(Building {
            inode: Inode::new(attrs),
            orphan: false,
            symlink: Vec::new(),
            xattr: Vec::new(),
            entries: BTreeMap::new(),
            cookies: 0,
        });
        Ok(())
    }

    /// Checks and stores the inode being built.
    fn finish(&mut self) -> Result<(), MetaError> {
        let Some(mut b) = self.cur.take() else {
            return Ok(());
        };
        xattr_done(&mut b, self.uuid, self.hash)?;
        let ino = b.inode.attrs.ino;
        if !b.symlink.is_empty() {
            b.inode.symlink = assemble_symlink(ino, &b.symlink)?;
        }
        let what = format!("metadata items of inode {ino}");
        b.orphan = self.orphans.remove(&ino.0);
        if b.orphan != (b.inode.attrs.nlink == 0) {
            let d = format!(
                "orphan item {}, link count {}",
                b.orphan, b.inode.attrs.nlink
            );
            return Err(CoreError::corrupted(what, d).into());
        }
        if b.cookies != b.entries.len() {
            let d = format!("{} entries, {} cookie items", b.entries.len(), b.cookies);
            return Err(CoreError::corrupted(what, d).into());
        }
        if !b.entries.is_empty() && b.inode.attrs.kind != FileKind::Directory {
            return Err(CoreError::corrupted(what, "entries in a non-directory").into());
        }
        for (i, map) in b.inode.objects.iter().enumerate() {
            if let Some(d) = map.check() {
                return Err(CoreError::corrupted(format!("{what}, object {i}"), d).into());
            }
        }
        self.inodes.insert(ino, b.inode);
        Ok(())
    }
}

fn entry(b: &mut Building, uuid: Uuid, hash: NameHash, k: Key, v: &[u8]) -> Result<(), MetaError> {
    let e = decode_dir_entry(&k, v)?;
    if hash(uuid, &e.name) != k.a || e.cookie < COOKIE_FIRST {
        return Err(bad_item(
            &k,
            format!(
                "entry with cookie {} under the wrong hash or cookie",
                e.cookie
            ),
        ));
    }
    if b.entries
        .insert(e.name.clone(), (k.a, k.b, e.cookie))
        .is_some()
    {
        return Err(bad_item(&k, "a second entry of the same name"));
    }
    let d = DirEntry {
        ino: e.ino,
        kind: e.kind,
    };
    b.inode.entries.insert(e.name, d);
    Ok(())
}

fn cookie(b: &mut Building, k: Key, v: &[u8]) -> Result<(), MetaError> {
    let (e, hash, collision) = decode_dir_cookie(&k, v)?;
    let by_name = b.entries.get(&e.name).copied();
    let target = b.inode.entries.get(&e.name).copied();
    let matches = by_name == Some((hash, collision, e.cookie))
        && target
            == Some(DirEntry {
                ino: e.ino,
                kind: e.kind,
            });
    if !matches || k.b != 0 {
        return Err(bad_item(&k, "a cookie item its entry item does not match"));
    }
    b.cookies += 1;
    Ok(())
}

/// Decodes the xattr whose chunks were collected, if any.
fn xattr_done(b: &mut Building, uuid: Uuid, hash: NameHash) -> Result<(), MetaError> {
    let items = std::mem::take(&mut b.xattr);
    let Some(&(k0, _)) = items.first() else {
        return Ok(());
    };
    let (name, value) = decode_xattr(&items)?;
    if hash(uuid, &name) != k0.a || b.inode.xattrs.insert(name, value).is_some() {
        return Err(bad_item(&k0, "xattr under the wrong hash, or twice"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! stripefs-meta: the runtime of the paged metadata trees (`docs/design/metadata.md`).
//!
//! [`Store`] holds the trees of `stripefs_core::btree`, a [`PageCache`] of clean pages
//! under a byte budget, and reads and writes pages only through the `Target` trait.
//! Page addresses come from a [`PageAlloc`] (the file system's allocator after
//! integration). [`Store::checkpoint`] writes the pages dirtied since the last one to
//! fresh addresses, flushes, and commits with a FUA write of the root record.
//!
//! Concurrency rule: no lock is held across a page read or write. An operation that
//! misses the cache drops its locks, reads and verifies the page, inserts it and
//! restarts from the root; lookups of other pages proceed meanwhile. A checkpoint takes
//! the tree locks only to freeze and to publish.

mod cache;
pub mod csum;
pub mod items;
mod pagelog;
pub mod refcount;
pub mod region;
pub mod space;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use stripefs_core::btree::page::{decode, Expect, Generation, PageAddr, PageRef, PageSize};
use stripefs_core::btree::root::{RootRecord, ROOT_RECORD_BYTES};
use stripefs_core::btree::schema;
use stripefs_core::btree::tree::{Miss, Node, PageSource, Tree, WritePlan, WrittenPage};
use stripefs_core::btree::{Key, TreeId};
use stripefs_core::idhash::IdMap;
use stripefs_core::record::TargetState;
use stripefs_core::{BlockSize, CoreError, TargetId, Uuid};
use stripefs_target::{Batch, IoBuf, IoOp, Target, TargetError, TargetSet};

pub use cache::{CacheStats, PageCache};
pub use space::SpaceBooks;

/// Pages one checkpoint write carries at most (one buffer each: within the kernel's
/// limit of buffers per vectored write).
const PAGES_PER_WRITE: usize = 256;

/// Pages a checkpoint has in flight at most (encoded in write buffers): 4 MiB of 4 KiB
/// pages, four full writes.
const WRITE_WINDOW_PAGES: usize = 4 * PAGES_PER_WRITE;

/// An error of the metadata store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetaError {
    /// A page or root record failed verification.
    #[error(transparent)]
    Corrupted(#[from] CoreError),
    /// A device operation failed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// No page could be allocated for a checkpoint.
    #[error("no space for metadata pages: {0}")]
    NoSpace(String),
    /// An earlier checkpoint failed; the trees must be reopened.
    #[error("metadata store poisoned by an earlier failed checkpoint")]
    Poisoned,
    /// The trees are on target `target`, a member (added after mkfs: the durable
    /// generation `generation` counts it), which was not given.
    #[error("target {target} is a member of this file system (checkpoint generation {generation} counts {members} targets) but was not given: give its path too")]
    TargetNotGiven {
        target: TargetId,
        members: u32,
        generation: u64,
    },
}

/// Where pages come from and go back to.
pub trait PageAlloc: Send + Sync + fmt::Debug {
    /// `n` page addresses that no durable or in-flight tree reaches.
    ///
    /// # Errors
    /// `NoSpace` when fewer are free.
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError>;

    /// Pages no tree reaches any more (their generation's successor is durable).
    fn free(&self, pages: &[PageAddr]);

    /// Target `target` became a member (a `TargetAdd` applied to the trees): pages may
    /// go there from now on. Nothing by default.
    fn add_member(&self, _target: TargetId) {}
}

/// Where the two root record slots are: byte offsets on one target, each one sector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootSlots {
    pub target: TargetId,
    pub offsets: [u64; 2],
}

/// What a store needs to know about its file system.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    pub uuid: Uuid,
    pub page_size: PageSize,
    /// The file-system block size: a page address is a block number.
    pub block_size: BlockSize,
    /// Bytes of pages the cache may hold, pinned dirty and frozen pages included.
    pub cache_bytes: usize,
    pub slots: RootSlots,
    /// Whether the space tree keeps the data area's free space (with a page log per
    /// checkpoint).
    pub space: SpaceBooks,
}

/// The journal position a checkpoint covers, stored in its root record: after the
/// checkpoint is durable, recovery replays the journal from `tail`, expecting the
/// transaction numbered `seq` first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalMark {
    /// Journal unit replay starts from.
    pub tail: u64,
    /// Sequence number of the next transaction (the first one replay applies).
    pub seq: u64,
}

/// The metadata trees of one file system.
#[derive(Debug)]
pub struct Store {
    cfg: StoreConfig,
    /// Every target given (members first, then targets a replayed `TargetAdd` may make
    /// members); the members are the page log's count (`Store::members`).
    targets: TargetSet,
    alloc: Arc<dyn PageAlloc>,
    trees: Vec<RwLock<Tree>>,
    /// Per tree (as `trees`), its page counts as its last change under the write lock
    /// left them: what [`Store::pinned`] and the page log's sizing read on every
    /// admission check and page fill, without taking the tree locks the applier's
    /// inserts hold (a profile of creates found the creating threads spinning on them).
    counts: Vec<TreeCounts>,
    cache: PageCache,
    /// Serialises checkpoints.
    checkpoint: Mutex<()>,
    /// The journal mark of the durable root record (its own lock: read without waiting
    /// for a running checkpoint).
    mark: Mutex<JournalMark>,
    /// The durable generation's page log (with [`SpaceBooks::Kept`]).
    log: Mutex<pagelog::Durable>,
    /// Pages read ahead by [`Store::prefetch`], each held while a [`Prefetched`] that
    /// read or found it lives: an operation that misses one takes it from here instead
    /// of reading it again.
    ahead: Mutex<IdMap<PageAddr, AheadPage>>,
    poisoned: AtomicBool,
}

/// One tree's page counts, kept by whoever changes the tree under its write lock.
#[derive(Debug)]
struct TreeCounts {
    /// Dirty and frozen pages.
    pinned: std::sync::atomic::AtomicUsize,
    /// Dirty and superseded pages.
    changed: std::sync::atomic::AtomicUsize,
}

impl TreeCounts {
    fn of(t: &Tree) -> Self {
        let c = TreeCounts {
            pinned: std::sync::atomic::AtomicUsize::new(0),
            changed: std::sync::atomic::AtomicUsize::new(0),
        };
        c.note(t);
        c
    }

    /// Records `t`'s counts (call holding its write lock, after a change).
    fn note(&self, t: &Tree) {
        self.pinned
            .store(t.dirty_count() + t.frozen_count(), Ordering::Release);
        self.changed
            .store(t.dirty_count() + t.superseded_count(), Ordering::Release);
    }
}

/// A page read ahead, and how many live [`Prefetched`] hold it.
#[derive(Debug)]
struct AheadPage {
    generation: Generation,
    node: Arc<Node>,
    holders: usize,
}

/// Pages [`Store::prefetch`] read or found read ahead, held until this is dropped (the
/// cache alone could evict them before they are used when pinned pages fill its budget).
/// Each guard releases only its own holds: concurrent changes each keep theirs.
#[derive(Debug)]
#[must_use = "the pages read ahead are held only while this lives"]
pub struct Prefetched<'a> {
    store: &'a Store,
    /// Pages read from disk (those already in memory are not counted).
    pub pages_read: usize,
    /// The pages this guard holds in `Store::ahead` (one hold each).
    held: Vec<PageAddr>,
}

impl Prefetched<'_> {
    /// Takes one hold on each of `addrs` (in `ahead`, locked by the caller).
    fn hold(&mut self, ahead: &mut IdMap<PageAddr, AheadPage>, addrs: &[PageAddr]) {
        for a in addrs {
            if let Some(p) = ahead.get_mut(a) {
                p.holders += 1;
                self.held.push(*a);
            }
        }
    }
}

impl Drop for Prefetched<'_> {
    fn drop(&mut self) {
        let mut ahead = self.store.ahead.lock();
        for a in self.held.drain(..) {
            let Some(p) = ahead.get_mut(&a) else {
                debug_assert!(false, "a held page left the read-ahead set");
                continue;
            };
            p.holders -= 1;
            if p.holders == 0 {
                ahead.remove(&a);
            }
        }
    }
}

/// Counters and shapes, for `inspect` and tests.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    pub cache: CacheStats,
    /// Per tree: root level, dirty pages, frozen pages.
    pub trees: Vec<(TreeId, u8, usize, usize)>,
    /// Bytes of pages pinned in memory (dirty and frozen), as [`Store::dirty_bytes`].
    pub pinned_bytes: usize,
}

impl Store {
    /// New empty trees (nothing on disk until the first [`Store::checkpoint`], which
    /// writes generation 1).
    #[must_use]
    pub fn create(
        cfg: StoreConfig,
        targets: Vec<Arc<dyn Target>>,
        alloc: Arc<dyn PageAlloc>,
    ) -> Store {
        let trees = TreeId::ALL
            .iter()
            .map(|t| RwLock::new(Tree::create(*t, cfg.page_size, Generation(1))))
            .collect();
        let log = pagelog::Durable::empty(targets.len());
        let targets = target_set(targets).expect("mkfs refuses more than MAX_TARGETS targets");
        Store::with_trees(cfg, targets, alloc, trees, JournalMark::default(), log)
    }

    /// The trees as the newest valid root record leaves them. Reads two sectors: its
    /// time does not depend on the size of the trees.
    ///
    /// # Errors
    /// The read's error, or `Corrupted` when neither slot holds a valid record or the
    /// record does not fit the configuration.
    pub fn open(
        cfg: StoreConfig,
        targets: Vec<Arc<dyn Target>>,
        alloc: Arc<dyn PageAlloc>,
    ) -> Result<Store, MetaError> {
        let rec = read_root(&cfg, &targets)?;
        let given = targets.clone();
        let targets = target_set(targets)?;
        if rec.page_size != cfg.page_size {
            let d = format!("page size {} on disk", rec.page_size.bytes());
            return Err(CoreError::corrupted("metadata root record", d).into());
        }
        let open = rec.generation.next();
        let mut trees = Vec::new();
        for t in TreeId::ALL {
            let Some(root) = rec.root(t) else {
                let d = format!("no root for tree {t}");
                return Err(CoreError::corrupted("metadata root record", d).into());
            };
            trees.push(RwLock::new(Tree::open(t, cfg.page_size, root, open)));
        }
        let mark = JournalMark {
            tail: rec.journal_tail,
            seq: rec.journal_seq,
        };
        let log = pagelog::Durable::empty(targets.len());
        let mut store = Store::with_trees(cfg, targets, alloc, trees, mark, log);
        if cfg.space == SpaceBooks::Kept {
            pagelog::open(&store, &rec)?;
            // Targets past the members wait for a replayed `TargetAdd`, which gives
            // them again (`Store::give_target`) in its order.
            let members = store.members() as usize;
            if members < given.len() {
                store.targets = target_set(given[..members].to_vec())?;
            }
        }
        Ok(store)
    }

    fn with_trees(
        cfg: StoreConfig,
        targets: TargetSet,
        alloc: Arc<dyn PageAlloc>,
        trees: Vec<RwLock<Tree>>,
        mark: JournalMark,
        log: pagelog::Durable,
    ) -> Store {
        Store {
            cache: PageCache::new(cfg.cache_bytes),
            cfg,
            targets,
            alloc,
            counts: trees.iter().map(|t| TreeCounts::of(&t.read())).collect(),
            trees,
            checkpoint: Mutex::new(()),
            mark: Mutex::new(mark),
            log: Mutex::new(log),
            ahead: Mutex::new(IdMap::default()),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Gives the store `t` as its next target (index [`Store::targets_given`] before the
    /// call): a target a `TargetAdd` will make a member (`add-target`, or a replayed
    /// one). Pages go there only once it is a member.
    ///
    /// # Errors
    /// `Corrupted(Limit)` past [`stripefs_core::btree::pagelog::MAX_TARGETS`].
    pub fn give_target(&self, t: Arc<dyn Target>) -> Result<TargetId, MetaError> {
        let i = self
            .targets
            .push(t)
            .map_err(|e| MetaError::Corrupted(CoreError::Limit(e.to_string())))?;
        Ok(TargetId(i as u32))
    }

    /// Targets given to the store (members and those waiting to become members).
    #[must_use]
    pub fn targets_given(&self) -> u32 {
        self.targets.len() as u32
    }

    /// Members: the targets the trees' free space covers (the page log's count; grows
    /// when a `TargetAdd` is applied).
    #[must_use]
    pub fn members(&self) -> u32 {
        self.log.lock().pages.len() as u32
    }

    /// Applies a `TargetAdd`: `target`, given already, becomes a member, its data area
    /// `[data_start, blocks)` free space.
    ///
    /// # Errors
    /// `Corrupted` unless `target` is the next member; `TargetNotGiven` when it was not
    /// given; the space tree's errors.
    pub(crate) fn add_member(
        &self,
        target: TargetId,
        (data_start, blocks): (u64, u64),
        member_id: u64,
    ) -> Result<(), MetaError> {
        let members = self.members();
        if target.0 != members {
            let d = format!("adds target {target} to {members} members");
            return Err(CoreError::corrupted("target add record", d).into());
        }
        if target.0 >= self.targets_given() {
            return Err(MetaError::TargetNotGiven {
                target,
                members: members + 1,
                generation: self.durable_generation().0,
            });
        }
        if self.keeps_space() {
            space::give(self, target, data_start, blocks - data_start)?;
        }
        if member_id != 0 {
            let key = schema::target_member_key(target);
            self.insert(key, &member_id.to_le_bytes())?;
        }
        self.log.lock().pages.push(0);
        self.alloc.add_member(target);
        Ok(())
    }

    /// The persisted state of member `target` (`Writable` when it has no item).
    ///
    /// # Errors
    /// A page read's error; `Corrupted` for an item that does not decode or names
    /// another target.
    pub fn target_state(&self, target: TargetId) -> Result<TargetState, MetaError> {
        let key = schema::target_state_key(target);
        match self.get(&key)? {
            None => Ok(TargetState::Writable),
            Some(v) => Ok(schema::decode_target_state(&key, &v)?.1),
        }
    }

    /// The member id `target` joined with (`add-target`), `None` for a target mkfs made
    /// or one added by a build before member ids.
    ///
    /// # Errors
    /// A page read's error; `Corrupted` for an item that does not decode.
    pub fn target_member_id(&self, target: TargetId) -> Result<Option<u64>, MetaError> {
        let key = schema::target_member_key(target);
        match self.get(&key)? {
            None => Ok(None),
            Some(v) => Ok(Some(schema::decode_target_member(&key, &v)?.1)),
        }
    }

    /// Applies a `TargetState` record. `Retired` takes the target's data area out of the
    /// free space, which must hold exactly that area as one free run (nothing on it).
    ///
    /// # Errors
    /// `Corrupted` when `target` is not a member or is retired already, or when its free
    /// space is not its whole data area; the trees' errors.
    pub(crate) fn set_target_state(
        &self,
        target: TargetId,
        state: TargetState,
    ) -> Result<(), MetaError> {
        let what = || format!("target state record of target {target}");
        if target.0 == 0 || target.0 >= self.members() {
            let d = format!(
                "{state} but there are {} members, and target 0 is always writable",
                self.members()
            );
            return Err(CoreError::corrupted(what(), d).into());
        }
        if let TargetState::Retired { .. } = self.target_state(target)? {
            let d = format!("{state} but it is retired already");
            return Err(CoreError::corrupted(what(), d).into());
        }
        if let TargetState::Retired { data_start, blocks } = state {
            if self.keeps_space() {
                space::take_whole_area(self, target, data_start, blocks)?;
            }
        }
        let key = schema::target_state_key(target);
        match state {
            TargetState::Writable => {
                self.remove(&key)?;
            }
            _ => {
                let (k, v) = schema::target_state_item(target, state);
                self.insert(k, &v)?;
            }
        }
        Ok(())
    }

    fn tree(&self, t: TreeId) -> &RwLock<Tree> {
        &self.trees[Self::tree_index(t)]
    }

    fn tree_index(t: TreeId) -> usize {
        TreeId::ALL
            .iter()
            .position(|x| *x == t)
            .expect("every tree")
    }

    fn live(&self) -> Result<(), MetaError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(MetaError::Poisoned);
        }
        Ok(())
    }

    /// Bytes of pages pinned in memory (dirty and frozen): what the next checkpoint
    /// will write, plus what a running one is writing. Takes no lock (the counts the
    /// trees' writers keep, `TreeCounts`).
    #[must_use]
    pub fn dirty_bytes(&self) -> usize {
        self.pinned()
    }

    /// Pages the next checkpoint allocates if `more` pages are dirtied before it: the
    /// pinned pages (dirty, and a running checkpoint's frozen ones, already allocated:
    /// counted to stay on the safe side), the `more`, two per entry of a page log not yet
    /// folded into the space tree (the fold dirties space-tree pages: the same coarse
    /// bound as the file system's per record), and the page log's pages as the
    /// checkpoint sizes them. What metadata admission must find free (metadata.md,
    /// "Space").
    #[must_use]
    pub fn checkpoint_pages(&self, more: usize) -> usize {
        let fold = 2 * self.pending_len();
        let more = more.saturating_add(fold);
        self.pinned() / self.cfg.page_size.bytes() + more + self.log_pages(more)
    }

    /// The journal position the durable root record covers (zero for trees created and
    /// not yet checkpointed): where recovery starts replaying.
    #[must_use]
    pub fn journal_mark(&self) -> JournalMark {
        *self.mark.lock()
    }

    fn pinned(&self) -> usize {
        let pages: usize = self
            .counts
            .iter()
            .map(|c| c.pinned.load(Ordering::Acquire))
            .sum();
        pages * self.cfg.page_size.bytes()
    }

    /// Pages the open generations changed so far: dirty, or superseded (their page logs
    /// free them), over every tree.
    fn changed_pages(&self) -> usize {
        self.counts
            .iter()
            .map(|c| c.changed.load(Ordering::Acquire))
            .sum()
    }

    /// The target a page address (read from disk) names, or `Corrupted`.
    fn page_target(&self, tree: TreeId, at: PageAddr) -> Result<&Arc<dyn Target>, MetaError> {
        self.targets.get(at.target.index()).ok_or_else(|| {
            let what = format!("metadata page of tree {tree} at {at}");
            CoreError::corrupted(what, "no such target").into()
        })
    }

    /// Reads, verifies and caches the page a traversal missed. No lock is held.
    /// Returns the page for the operation's [`Held`] set.
    fn fill(&self, m: Miss) -> Result<(PageRef, Arc<Node>), MetaError> {
        let e = m.0;
        let ahead = self
            .ahead
            .lock()
            .get(&e.at.addr)
            .map(|p| (p.generation, Arc::clone(&p.node)));
        let node = match ahead {
            // Read ahead and verified against the same expectations: a page address is
            // written once per generation, so the generation identifies the content.
            Some((g, node)) if g == e.at.generation => node,
            _ => {
                let target = self.page_target(e.tree, e.at.addr)?;
                let offset = self.cfg.block_size.to_bytes(e.at.addr.block.0);
                let buf = target.read_sync(offset, self.cfg.page_size.bytes())?;
                self.cache.note_reads(1, 0);
                let page =
                    decode(self.cfg.page_size, self.cfg.uuid, &e, &buf).map_err(CoreError::from)?;
                Arc::new(Node::from_page(page))
            }
        };
        let pinned = self.pinned();
        self.cache.insert(e.at, Arc::clone(&node), pinned);
        Ok((e.at, node))
    }

    /// Reads the pages that lookups of `keys` need and memory lacks, many in flight at
    /// once: the keys are sorted and descended together, a level at a time, and each
    /// level's missing pages (each once, in address order) are read in one batch
    /// through `Target`, verified as every read is, and cached. The pages are also held
    /// until the returned [`Prefetched`] is dropped, and an operation that misses one
    /// takes it from there, so later operations on these keys read nothing while it
    /// lives (a key whose path changes meanwhile may still miss: it reads as usual).
    /// Memory: the pages read, beyond the cache's budget, until the drop.
    ///
    /// A hint: a page that fails to read or verify is skipped, and the operation that
    /// needs it reads it and reports the error as usual.
    ///
    /// # Errors
    /// `Poisoned`.
    pub fn prefetch(&self, keys: &[Key]) -> Result<Prefetched<'_>, MetaError> {
        self.live()?;
        let mut by_tree: BTreeMap<usize, Vec<Key>> = BTreeMap::new();
        for k in keys {
            let t = tree_of(k);
            let i = TreeId::ALL
                .iter()
                .position(|x| *x == t)
                .expect("every tree");
            by_tree.entry(i).or_default().push(*k);
        }
        let mut out = Prefetched {
            store: self,
            pages_read: 0,
            held: Vec::new(),
        };
        for (i, mut pending) in by_tree {
            pending.sort_unstable();
            pending.dedup();
            while !pending.is_empty() {
                let mut want: BTreeMap<PageAddr, Expect> = BTreeMap::new();
                let mut next = Vec::new();
                {
                    let mut ahead = self.ahead.lock();
                    let src = Ahead {
                        cache: &self.cache,
                        ahead: &ahead,
                        found: RefCell::new(Vec::new()),
                    };
                    let tree = self.trees[i].read();
                    for k in &pending {
                        if let Err(Miss(e)) = tree.probe(&src, k) {
                            want.entry(e.at.addr).or_insert(e);
                            next.push(*k);
                        }
                    }
                    // Pages another change read ahead are held for this one too.
                    let mut found = src.found.into_inner();
                    found.sort_unstable();
                    found.dedup();
                    out.hold(&mut ahead, &found);
                }
                let want: Vec<Expect> = want.into_values().collect();
                let mut progress = false;
                for (e, node) in want.iter().zip(self.read_each(&want)) {
                    let Ok((node, read)) = node else { continue };
                    progress = true;
                    out.pages_read += usize::from(read);
                    let pinned = self.pinned();
                    self.cache.insert(e.at, Arc::clone(&node), pinned);
                    let mut ahead = self.ahead.lock();
                    let p = ahead.entry(e.at.addr).or_insert_with(|| AheadPage {
                        generation: e.at.generation,
                        node: Arc::clone(&node),
                        holders: 0,
                    });
                    // A page address is written once per generation: a newer one
                    // replaces what another change holds (its key's path moved anyway).
                    p.generation = e.at.generation;
                    p.node = node;
                    out.hold(&mut ahead, &[e.at.addr]);
                }
                if !progress {
                    break; // every read failed: the operations report it
                }
                pending = next;
            }
        }
        self.cache.note_reads(0, out.pages_read as u64);
        Ok(out)
    }

    /// Runs `op` on tree `t` under its read lock, filling misses without any lock.
    fn read_op<T>(
        &self,
        t: TreeId,
        op: impl Fn(&Tree, &Held<'_>) -> Result<T, Miss>,
    ) -> Result<T, MetaError> {
        let mut held = Held::new(&self.cache);
        loop {
            self.live()?;
            let r = op(&self.tree(t).read(), &held);
            match r {
                Ok(v) => return Ok(v),
                Err(m) => held.take(self, m)?,
            }
        }
    }

    /// Runs `change` on the tree at index `i` under its write lock, then records the
    /// tree's page counts ([`TreeCounts`]): the one way the store changes a tree.
    fn change_tree<R>(&self, i: usize, change: impl FnOnce(&mut Tree) -> R) -> R {
        let mut tree = self.trees[i].write();
        let r = change(&mut tree);
        self.counts[i].note(&tree);
        r
    }

    /// Runs `op` on tree `t` under its write lock, filling misses without any lock.
    fn write_op<T>(
        &self,
        t: TreeId,
        mut op: impl FnMut(&mut Tree, &Held<'_>) -> Result<T, Miss>,
    ) -> Result<T, MetaError> {
        let mut held = Held::new(&self.cache);
        let i = Self::tree_index(t);
        loop {
            self.live()?;
            let r = self.change_tree(i, |tree| op(tree, &held));
            match r {
                Ok(v) => return Ok(v),
                Err(m) => held.take(self, m)?,
            }
        }
    }

    /// The value of `key` (in the tree its kind belongs to).
    ///
    /// # Errors
    /// A page read's error or verification failure; `Poisoned`.
    pub fn get(&self, key: &Key) -> Result<Option<Vec<u8>>, MetaError> {
        self.read_op(tree_of(key), |t, src| t.get(src, key))
    }

    /// The item with the greatest key at or below `key`, in the tree of `key`'s kind
    /// (it may be of another object or kind: callers check the prefix).
    ///
    /// # Errors
    /// As [`Store::get`].
    pub fn floor(&self, key: &Key) -> Result<Option<(Key, Vec<u8>)>, MetaError> {
        self.read_op(tree_of(key), |t, src| t.floor(src, key))
    }

    /// Items of tree `tree` with keys in `from..to`, at most `limit`.
    ///
    /// # Errors
    /// As [`Store::get`].
    pub fn scan(
        &self,
        tree: TreeId,
        from: Key,
        to: Option<Key>,
        limit: usize,
    ) -> Result<Vec<(Key, Vec<u8>)>, MetaError> {
        let mut out = Vec::new();
        let mut at = from;
        let mut held = Held::new(&self.cache);
        loop {
            self.live()?;
            let s = self
                .tree(tree)
                .read()
                .scan(&held, at, to, limit - out.len());
            if !s.items.is_empty() {
                // Progress is kept by key: only the path to the next leaf needs holding.
                held.pages.clear();
            }
            out.extend(s.items);
            if let Some(m) = s.miss {
                held.take(self, m)?;
            }
            match s.resume {
                Some(k) if out.len() < limit => at = k,
                _ => return Ok(out),
            }
        }
    }

    /// Inserts or replaces; returns the previous value.
    ///
    /// # Errors
    /// As [`Store::get`].
    pub fn insert(&self, key: Key, value: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        self.write_op(tree_of(&key), |t, src| t.insert(src, key, value.to_vec()))
    }

    /// Removes `key`; returns its value.
    ///
    /// # Errors
    /// As [`Store::get`].
    pub fn remove(&self, key: &Key) -> Result<Option<Vec<u8>>, MetaError> {
        self.write_op(tree_of(key), |t, src| t.remove(src, key))
    }

    /// Relocates the pages of `tree` on `target`, at most `leaves` leaf paths from `from`:
    /// every path with such a page is made dirty (`Tree::relocate_path`), so the next
    /// checkpoint writes it wherever the page allocator places pages (which must no longer
    /// pick `target`) and frees the old pages. Returns the paths dirtied and where to
    /// resume (`None`: the tree is done).
    ///
    /// # Errors
    /// As [`Store::get`].
    pub fn relocate_pages(
        &self,
        tree: TreeId,
        target: TargetId,
        from: Key,
        leaves: usize,
    ) -> Result<(usize, Option<Key>), MetaError> {
        let off = |a: PageAddr| a.target == target;
        let mut at = Some(from);
        let mut dirtied = 0;
        for _ in 0..leaves.max(1) {
            let Some(k) = at else { break };
            let (picked, next) = self.write_op(tree, |t, src| t.relocate_path(src, &k, &off))?;
            dirtied += usize::from(picked);
            at = next;
        }
        Ok((dirtied, at))
    }

    /// The file system's uuid (it seeds the name hash of directory entries and xattrs).
    #[must_use]
    pub fn uuid(&self) -> Uuid {
        self.cfg.uuid
    }

    /// The generation of the last durable checkpoint (0: none yet).
    #[must_use]
    pub fn durable_generation(&self) -> Generation {
        let open = self.trees[0].read().open_generation();
        let frozen = usize::from(self.trees[0].read().frozen_count() > 0) as u64;
        Generation(open.0 - 1 - frozen)
    }

    /// Counters and tree shapes.
    #[must_use]
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            cache: self.cache.stats(),
            trees: self
                .trees
                .iter()
                .map(|t| {
                    let t = t.read();
                    (t.id(), t.root_level(), t.dirty_count(), t.frozen_count())
                })
                .collect(),
            pinned_bytes: self.pinned(),
        }
    }

    /// [`Store::checkpoint_at`] keeping the journal mark of the last checkpoint (for
    /// users of the trees without a journal).
    ///
    /// # Errors
    /// As [`Store::checkpoint_at`].
    pub fn checkpoint(&self) -> Result<Generation, MetaError> {
        self.checkpoint_at(self.journal_mark())
    }

    /// Writes every page dirtied since the last checkpoint and commits them with the
    /// root record, which records `mark`: the caller has applied to the trees every
    /// journal transaction before `mark` and none after it (the cut, metadata.md
    /// "Integration"). Returns the generation now durable; [`Store::journal_mark`]
    /// returns `mark` from then on. A failure poisons the store.
    ///
    /// # Errors
    /// The first allocation, write or flush error; `Poisoned`.
    pub fn checkpoint_at(&self, mark: JournalMark) -> Result<Generation, MetaError> {
        let _serial = self.checkpoint.lock();
        self.live()?;
        debug_assert!(
            {
                let d = self.journal_mark();
                mark.tail >= d.tail && mark.seq >= d.seq
            },
            "journal mark {mark:?} goes back"
        );
        // The last generation's page log reaches the space tree this one writes.
        self.fold_pending()?;
        // Pages first, while nothing is frozen: a shortage is `NoSpace` and leaves the
        // store as it was (usable, nothing poisoned), as "Failure cases" promises.
        let mut addrs = self.alloc_pages()?;
        let mut log_addrs = match self.alloc_log() {
            Ok(a) => a,
            Err(e) => {
                addrs.iter().for_each(|a| self.alloc.free(a));
                return Err(e);
            }
        };
        // Freeze: each tree's lock for a moment; nothing is copied.
        let frozen: Vec<_> = (0..self.trees.len())
            .map(|i| self.change_tree(i, Tree::freeze))
            .collect();
        let generation = frozen[0].generation;
        let result = self.fit_pages(&frozen, &mut addrs).and_then(|()| {
            let log = self.log_of(&frozen, &addrs, &mut log_addrs)?;
            self.write_generation(&frozen, &addrs, mark, log.as_ref())
                .map(|p| (p, log))
        });
        let (plans, log) = match result {
            Ok(p) => p,
            Err(e) => {
                self.poisoned.store(true, Ordering::Release);
                return Err(e);
            }
        };
        *self.mark.lock() = mark;
        // Publish: each tree's lock for a moment.
        for (i, plan) in plans.iter().enumerate() {
            let out = self.change_tree(i, |t| t.publish(plan));
            for a in &out.freed {
                self.cache.remove(*a);
            }
            self.alloc.free(&out.freed);
            let pinned = self.pinned();
            for (at, node) in out.clean {
                self.cache.insert(at, node, pinned);
            }
        }
        if let Some(log) = log {
            // Folded into the open space tree before any later record is applied or
            // checkpoint written (metadata.md, "Persisted free space").
            self.publish_log(log);
        }
        Ok(generation)
    }

    /// Steps 2 and 3 of the protocol, with no tree lock held.
    /// Addresses for every tree's dirty pages, allocated before the freeze. On a
    /// shortage, what was taken is given back and nothing else changes.
    fn alloc_pages(&self) -> Result<Vec<Vec<PageAddr>>, MetaError> {
        let mut out: Vec<Vec<PageAddr>> = Vec::with_capacity(self.trees.len());
        for t in &self.trees {
            let want = t.read().dirty_count();
            match self.alloc.alloc(want) {
                Ok(a) => out.push(a),
                Err(e) => {
                    out.iter().for_each(|a| self.alloc.free(a));
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Matches the addresses to what was frozen: another thread's change between the
    /// count and the freeze dirtied more pages (allocate the difference) or fewer (give
    /// back the surplus).
    fn fit_pages(
        &self,
        frozen: &[Arc<stripefs_core::btree::tree::Frozen>],
        addrs: &mut [Vec<PageAddr>],
    ) -> Result<(), MetaError> {
        for (f, a) in frozen.iter().zip(addrs.iter_mut()) {
            let need = f.page_count();
            if need > a.len() {
                a.extend(self.alloc.alloc(need - a.len())?);
            } else {
                self.alloc.free(&a.split_off(need));
            }
        }
        Ok(())
    }

    fn write_generation(
        &self,
        frozen: &[Arc<stripefs_core::btree::tree::Frozen>],
        addrs: &[Vec<PageAddr>],
        mark: JournalMark,
        log: Option<&pagelog::Written>,
    ) -> Result<Vec<WritePlan>, MetaError> {
        let generation = frozen[0].generation;
        let mut plans = Vec::with_capacity(frozen.len());
        for ((f, tree), a) in frozen.iter().zip(TreeId::ALL).zip(addrs) {
            plans.push(f.plan(tree, a));
        }
        // Each page is encoded from its node straight into its write buffer, and at most
        // `WRITE_WINDOW_PAGES` are in flight: a checkpoint holds its pages decoded once
        // (the frozen nodes) and encoded at most a window's worth, whatever its size.
        let page_bytes = self.cfg.page_size.bytes();
        let mut batch = Batch::new();
        let mut in_flight = 0;
        // Targets written since their last flush: every page is flushed before the root
        // record names it.
        let mut unflushed = vec![false; self.targets.len()];
        for run in self.page_runs(&plans) {
            if in_flight + run.len() > WRITE_WINDOW_PAGES {
                std::mem::replace(&mut batch, Batch::new())
                    .wait()
                    .into_iter()
                    .try_for_each(|d| d.result)?;
                // Flushed window by window: a device with a write-back cache then holds
                // at most a window of this checkpoint unflushed, and a journal append
                // (a FUA write, carried out as a write and a cache flush where the
                // device has no FUA) waits behind that much, not the whole checkpoint.
                self.flush_targets(&mut unflushed)?;
                in_flight = 0;
            }
            let t = run[0].at.addr.target.index();
            unflushed[t] = true;
            let offset = self.cfg.block_size.to_bytes(run[0].at.addr.block.0);
            let bufs = run
                .iter()
                .map(|p| {
                    let mut b = IoBuf::zeroed(page_bytes);
                    p.encode_into(self.cfg.page_size, self.cfg.uuid, &mut b);
                    b
                })
                .collect();
            batch.submit(&*self.targets[t], IoOp::Write { offset, bufs });
            in_flight += run.len();
        }
        for (at, bytes) in log.iter().flat_map(|l| l.blocks()) {
            let t = at.target.index();
            unflushed[t] = true;
            let offset = self.cfg.block_size.to_bytes(at.block.0);
            let bufs = vec![IoBuf::from_slice(bytes)];
            batch.submit(&*self.targets[t], IoOp::Write { offset, bufs });
        }
        batch.wait().into_iter().try_for_each(|d| d.result)?;
        self.flush_targets(&mut unflushed)?;
        let slot = RootRecord::slot_of(generation);
        let rec = RootRecord {
            slot,
            generation,
            page_size: self.cfg.page_size,
            journal_tail: mark.tail,
            journal_seq: mark.seq,
            roots: TreeId::ALL
                .iter()
                .copied()
                .zip(plans.iter().map(WritePlan::root_ref))
                .collect(),
            log: log.map(pagelog::Written::root_ref),
        };
        let target = &self.targets[self.cfg.slots.target.index()];
        let mut sector = vec![0u8; (target.info().sector_size as usize).max(ROOT_RECORD_BYTES)];
        sector[..ROOT_RECORD_BYTES].copy_from_slice(&rec.encode(self.cfg.uuid));
        let offset = self.cfg.slots.offsets[slot as usize];
        target.write_fua_sync(offset, IoBuf::from_slice(&sector))?;
        Ok(plans)
    }

    /// Flushes the targets marked in `unflushed`, at once, and clears the marks.
    fn flush_targets(&self, unflushed: &mut [bool]) -> Result<(), MetaError> {
        let flushes = Batch::new();
        for (t, u) in unflushed.iter_mut().enumerate() {
            if std::mem::take(u) {
                flushes.submit(&*self.targets[t], IoOp::Flush);
            }
        }
        flushes.wait().into_iter().try_for_each(|d| d.result)?;
        Ok(())
    }

    /// The pages of `plans` in address order, cut into runs of adjacent pages on one
    /// target (at most [`PAGES_PER_WRITE`] each): each run goes out as one vectored
    /// write, so a checkpoint issues about as many writes as the allocator handed out
    /// extents, not one per page. The runs of different targets alternate.
    fn page_runs<'p>(&self, plans: &'p [WritePlan]) -> Vec<Vec<&'p WrittenPage>> {
        let mut pages: Vec<&WrittenPage> = plans.iter().flat_map(|p| &p.pages).collect();
        pages.sort_unstable_by_key(|p| (p.at.addr.target, p.at.addr.block));
        let offset = |p: &WrittenPage| self.cfg.block_size.to_bytes(p.at.addr.block.0);
        let page = self.cfg.page_size.bytes() as u64;
        let mut runs: Vec<Vec<&WrittenPage>> = Vec::new();
        for p in pages {
            match runs.last_mut() {
                Some(run)
                    if run.len() < PAGES_PER_WRITE
                        && run.last().is_some_and(|q| {
                            q.at.addr.target == p.at.addr.target && offset(q) + page == offset(p)
                        }) =>
                {
                    run.push(p);
                }
                _ => runs.push(vec![p]),
            }
        }
        // Interleaved across targets (the first run of each, then the second...), so the
        // writes in flight at once reach every target.
        let mut nth = vec![0usize; self.targets.len()];
        let mut order: Vec<(usize, usize)> = runs
            .iter()
            .map(|r| {
                let t = r[0].at.addr.target.index();
                nth[t] += 1;
                (nth[t], t)
            })
            .collect();
        let mut keyed: Vec<_> = order.drain(..).zip(runs).collect();
        keyed.sort_by_key(|(k, _)| *k);
        keyed.into_iter().map(|(_, r)| r).collect()
    }

    /// Visits every page of tree `tree` reachable from its last durable root, depth
    /// first. A page in the cache is taken from it (it was verified when it was read);
    /// the others are read from disk and verified, the children of a branch all at once
    /// (one batch per branch, not one round trip per page), and not cached (a walk
    /// must not evict the working set). Memory is bounded by the depth times the
    /// fanout. For fsck and for rebuilding an allocator at open.
    ///
    /// # Errors
    /// The first read error or verification failure.
    ///
    /// # Panics
    /// Panics if the tree has changes not yet checkpointed (call it on an opened store).
    pub fn walk(
        &self,
        tree: TreeId,
        visit: &mut dyn FnMut(PageAddr, &Node),
    ) -> Result<(), MetaError> {
        let root = self
            .tree(tree)
            .read()
            .clean_root()
            .expect("walk a checkpointed tree");
        let e = stripefs_core::btree::Expect {
            tree,
            at: root.at,
            level: root.level,
            low: Key::MIN,
            high: None,
        };
        let node = self.read_pages(&[e])?.pop().expect("one page");
        self.walk_page(&e, &node, visit)
    }

    fn walk_page(
        &self,
        e: &stripefs_core::btree::Expect,
        node: &Node,
        visit: &mut dyn FnMut(PageAddr, &Node),
    ) -> Result<(), MetaError> {
        visit(e.at.addr, node);
        let stripefs_core::btree::tree::Items::Branch(v) = &node.items else {
            return Ok(());
        };
        let kids: Vec<_> = v
            .iter()
            .enumerate()
            .map(|(i, (k, c))| {
                let stripefs_core::btree::tree::Child::Page(at) = c else {
                    unreachable!("a page's children are pages")
                };
                stripefs_core::btree::Expect {
                    tree: e.tree,
                    at: *at,
                    level: e.level - 1,
                    low: if i == 0 { e.low } else { *k },
                    high: v.get(i + 1).map_or(e.high, |(k, _)| Some(*k)),
                }
            })
            .collect();
        let nodes = self.read_pages(&kids)?;
        for (k, n) in kids.iter().zip(&nodes) {
            self.walk_page(k, n, visit)?;
        }
        Ok(())
    }

    /// The pages `want` names, from the cache or read and verified in one batch, in
    /// order.
    fn read_pages(&self, want: &[Expect]) -> Result<Vec<Arc<Node>>, MetaError> {
        self.read_each(want)
            .into_iter()
            .map(|r| r.map(|(node, _)| node))
            .collect()
    }

    /// Each page `want` names, from the cache or read and verified (all reads in one
    /// batch, submitted before any is waited for), with whether it was read; or its own
    /// error.
    fn read_each(&self, want: &[Expect]) -> Vec<PageRead> {
        let mut out: Vec<Option<PageRead>> = want
            .iter()
            .map(|e| self.cache.page(&e.at).map(|n| Ok((n, false))))
            .collect();
        let batch = Batch::new();
        let mut missing = Vec::new();
        for (i, e) in want.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            match self.page_target(e.tree, e.at.addr) {
                Ok(target) => {
                    let offset = self.cfg.block_size.to_bytes(e.at.addr.block.0);
                    let bufs = vec![IoBuf::zeroed(self.cfg.page_size.bytes())];
                    batch.submit(&**target, IoOp::Read { offset, bufs });
                    missing.push(i);
                }
                Err(err) => out[i] = Some(Err(err)),
            }
        }
        for (&i, d) in missing.iter().zip(batch.wait()) {
            let node = d.result.map_err(MetaError::from).and_then(|()| {
                let buf = d
                    .bufs
                    .into_iter()
                    .next()
                    .expect("a read returns its buffer");
                let page = decode(self.cfg.page_size, self.cfg.uuid, &want[i], &buf)
                    .map_err(CoreError::from)?;
                Ok((Arc::new(Node::from_page(page)), true))
            });
            out[i] = Some(node);
        }
        out.into_iter()
            .map(|r| r.expect("every page found, read or failed"))
            .collect()
    }
}

/// The pages one operation has read, held until it completes: the cache may evict them
/// (its budget can be smaller than a path when dirty pages fill it), but the restarted
/// operation still finds them, so every restart makes progress.
struct Held<'a> {
    cache: &'a PageCache,
    pages: Vec<(PageRef, Arc<Node>)>,
    /// A page that failed verification once.
    suspect: Option<PageRef>,
}

impl<'a> Held<'a> {
    fn new(cache: &'a PageCache) -> Held<'a> {
        Held {
            cache,
            pages: Vec::new(),
            suspect: None,
        }
    }

    /// Reads the missed page into the set. A page that fails verification is reported
    /// only when the restarted operation needs the same page again: a checkpoint may have
    /// freed it and a later one rewritten it while this operation was reading (no lock
    /// is held across the read), and then the restart from the root no longer reaches it.
    fn take(&mut self, store: &Store, m: Miss) -> Result<(), MetaError> {
        match store.fill(m) {
            Ok(page) => {
                self.pages.push(page);
                Ok(())
            }
            Err(MetaError::Corrupted(_)) if self.suspect != Some(m.0.at) => {
                self.suspect = Some(m.0.at);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl PageSource for Held<'_> {
    fn page(&self, r: &PageRef) -> Option<Arc<Node>> {
        let held = self.pages.iter().find(|(at, _)| at == r);
        held.map(|(_, n)| Arc::clone(n))
            .or_else(|| self.cache.page(r))
    }
}

/// A page from [`Store::read_each`]: the node and whether it was read from disk.
type PageRead = Result<(Arc<Node>, bool), MetaError>;

/// The cache, then the pages read ahead; remembers which of those it served.
struct Ahead<'a> {
    cache: &'a PageCache,
    ahead: &'a IdMap<PageAddr, AheadPage>,
    found: RefCell<Vec<PageAddr>>,
}

impl PageSource for Ahead<'_> {
    fn page(&self, r: &PageRef) -> Option<Arc<Node>> {
        match self.ahead.get(&r.addr) {
            Some(p) if p.generation == r.generation => {
                self.found.borrow_mut().push(r.addr);
                Some(Arc::clone(&p.node))
            }
            _ => self.cache.page(r),
        }
    }
}

fn tree_of(key: &Key) -> TreeId {
    stripefs_core::btree::KeyKind::from_code(key.kind)
        .map_or_else(|| panic!("key {key} of no known kind"), |k| k.tree())
}

/// The store's target list, with room for every target a file system may have.
fn target_set(targets: Vec<Arc<dyn Target>>) -> Result<TargetSet, MetaError> {
    TargetSet::new(stripefs_core::btree::pagelog::MAX_TARGETS, targets)
        .map_err(|e| MetaError::Corrupted(CoreError::Limit(e.to_string())))
}

/// Reads both slots and returns the newest valid record.
fn read_root(cfg: &StoreConfig, targets: &[Arc<dyn Target>]) -> Result<RootRecord, MetaError> {
    let target = targets
        .get(cfg.slots.target.index())
        .ok_or_else(|| CoreError::corrupted("metadata root records", "no such target"))?;
    let len = (target.info().sector_size as usize).max(ROOT_RECORD_BYTES);
    let mut found = [None, None];
    for (slot, offset) in cfg.slots.offsets.iter().enumerate() {
        let buf = target.read_sync(*offset, len)?;
        found[slot] = RootRecord::decode(&buf, cfg.uuid, slot as u32)?;
    }
    let [a, b] = found;
    Ok(RootRecord::newest(a, b)?)
}

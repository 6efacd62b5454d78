//! The copy-on-write B+tree over an abstract page source: lookups, range scans, insert
//! with splits, delete with merges and borrowing, and the generation bookkeeping of
//! incremental checkpoints (freeze, write plan, publish).
//!
//! Nothing here reads a device. A node that is not in memory is a **miss**: the
//! operation returns [`Miss`] (the page's address and what it must verify as) without
//! having changed anything, and the caller reads the page, verifies it with
//! [`super::page::decode`], makes it available through its [`PageSource`] and runs the
//! operation again from the root (`docs/design/metadata.md`, invariants 4 and 5).

use std::sync::Arc;

use super::key::{Key, TreeId};
use super::leaf::LeafItems;
use super::page::{self, Expect, Generation, Page, PageAddr, PageBody, PageRef, PageSize};
use crate::Uuid;

/// A node of the open or the frozen generation, known by number until it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u64);

type NodeMap<V> = crate::idhash::IdMap<NodeId, V>;

/// A pointer to a child (or the root): a written page, or a node in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    Page(PageRef),
    Mem(NodeId),
}

/// The content of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Items {
    Leaf(LeafItems),
    Branch(Vec<(Key, Child)>),
}

/// A node in memory: a decoded clean page, or a dirty or frozen node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub level: u8,
    pub items: Items,
}

impl Node {
    /// The node of a verified page (children are pages).
    #[must_use]
    pub fn from_page(p: Page) -> Node {
        let items = match p.body {
            PageBody::Leaf(v) => Items::Leaf(v),
            PageBody::Branch(v) => {
                Items::Branch(v.into_iter().map(|(k, r)| (k, Child::Page(r))).collect())
            }
        };
        Node {
            level: p.level,
            items,
        }
    }

    /// Bytes of memory this node occupies decoded (what a cache budget counts): the
    /// node and its buffers.
    #[must_use]
    pub fn mem_bytes(&self) -> usize {
        let entries = match &self.items {
            Items::Leaf(v) => v.mem_bytes(),
            Items::Branch(v) => v.capacity() * std::mem::size_of::<(Key, Child)>(),
        };
        std::mem::size_of::<Node>() + entries
    }

    fn empty_leaf() -> Node {
        Node {
            level: 0,
            items: Items::Leaf(LeafItems::new()),
        }
    }

    /// Body bytes this node encodes to.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        match &self.items {
            Items::Leaf(v) => v.encoded_len(),
            Items::Branch(v) => v.len() * page::BRANCH_ENTRY_BYTES,
        }
    }

    fn len(&self) -> usize {
        match &self.items {
            Items::Leaf(v) => v.len(),
            Items::Branch(v) => v.len(),
        }
    }

    fn branch(&self) -> &[(Key, Child)] {
        match &self.items {
            Items::Branch(v) => v,
            Items::Leaf(_) => panic!("branch expected at level {}", self.level),
        }
    }

    fn branch_mut(&mut self) -> &mut Vec<(Key, Child)> {
        match &mut self.items {
            Items::Branch(v) => v,
            Items::Leaf(_) => panic!("branch expected"),
        }
    }

    fn leaf_mut(&mut self) -> &mut LeafItems {
        match &mut self.items {
            Items::Leaf(v) => v,
            Items::Branch(_) => panic!("leaf expected"),
        }
    }

    /// Index of the child whose range holds `key`.
    fn child_index(&self, key: &Key) -> usize {
        self.branch()
            .partition_point(|(k, _)| k <= key)
            .saturating_sub(1)
    }
}

/// Where clean pages come from: the runtime's page cache. A page is returned only if
/// the cache holds it at `r.addr` with generation `r.generation`.
pub trait PageSource {
    fn page(&self, r: &PageRef) -> Option<Arc<Node>>;
}

/// A page the operation needs that is not in memory: read it, verify it against this,
/// make it available, and run the operation again from the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss(pub Expect);

/// A page superseded in some generation, to be freed when that generation is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    Page(PageAddr),
    /// A frozen node, whose address is known once its checkpoint has written it.
    Frozen(NodeId),
}

/// The frozen generation: immutable nodes a checkpoint is writing.
#[derive(Debug)]
pub struct Frozen {
    pub generation: Generation,
    root: Child,
    root_level: u8,
    nodes: NodeMap<Arc<Node>>,
    gone: Vec<Gone>,
}

impl Frozen {
    /// Pages this checkpoint writes.
    #[must_use]
    pub fn page_count(&self) -> usize {
        self.nodes.len()
    }

    /// Pages this generation superseded (reached by the previous durable generation and
    /// not by this one): free once this generation is durable (its page log lists them).
    #[must_use]
    pub fn superseded(&self) -> Vec<PageAddr> {
        self.gone
            .iter()
            .map(|g| match g {
                Gone::Page(a) => *a,
                Gone::Frozen(_) => unreachable!("resolved when the previous generation published"),
            })
            .collect()
    }
}

/// One page a checkpoint writes, and what the cache holds for it afterwards: a leaf's
/// frozen node itself (shared, not copied), a branch's copy with its children as the
/// pages they are written to. The page's bytes are encoded from it by
/// [`WrittenPage::encode_into`] into the write buffer, so a checkpoint holds its pages
/// once decoded (the frozen nodes, which the cache keeps afterwards) and at most once
/// encoded (the buffers of the writes in flight).
#[derive(Debug)]
pub struct WrittenPage {
    pub at: PageRef,
    pub node: Arc<Node>,
    tree: TreeId,
}

impl WrittenPage {
    /// Encodes the page into `out` (one page) for a file system `uuid`.
    ///
    /// # Panics
    /// As [`page::encode_into`].
    pub fn encode_into(&self, size: PageSize, uuid: Uuid, out: &mut [u8]) {
        let head = page::PageHead {
            tree: self.tree,
            level: self.node.level,
            generation: self.at.generation,
        };
        match &self.node.items {
            Items::Leaf(v) => {
                page::encode_into(size, uuid, self.at.addr, head, page::BodyRef::Leaf(v), out)
            }
            Items::Branch(v) => {
                let children: Vec<(Key, PageRef)> = v
                    .iter()
                    .map(|(k, c)| match c {
                        Child::Page(r) => (*k, *r),
                        Child::Mem(_) => unreachable!("a planned branch points at pages"),
                    })
                    .collect();
                page::encode_into(
                    size,
                    uuid,
                    self.at.addr,
                    head,
                    page::BodyRef::Branch(&children),
                    out,
                );
            }
        }
    }
}

/// The encoded pages of a frozen generation at their new addresses, children first.
#[derive(Debug)]
pub struct WritePlan {
    pub generation: Generation,
    pub pages: Vec<WrittenPage>,
    pub root: PageRef,
    pub root_level: u8,
    placed: NodeMap<PageRef>,
}

/// What publishing a written generation gives back.
#[derive(Debug)]
pub struct Published {
    /// Pages now clean, for the cache.
    pub clean: Vec<(PageRef, Arc<Node>)>,
    /// Pages no tree reaches any more since this generation is durable: free them (and
    /// drop them from the cache) now.
    pub freed: Vec<PageAddr>,
}

/// A root as a root record stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootRef {
    pub at: PageRef,
    pub level: u8,
}

/// One tree: its root, the open generation's dirty nodes, the frozen generation.
#[derive(Debug)]
pub struct Tree {
    id: TreeId,
    size: PageSize,
    root: Child,
    root_level: u8,
    open: Generation,
    dirty: NodeMap<Arc<Node>>,
    gone: Vec<Gone>,
    frozen: Option<Arc<Frozen>>,
    next_id: u64,
}

/// Result of a range scan: the items found and where to go on.
#[derive(Debug, Default)]
pub struct Scan {
    pub items: Vec<(Key, Vec<u8>)>,
    /// `None` when the range is exhausted; else scan again from this key (after reading
    /// `miss`, if set).
    pub resume: Option<Key>,
    pub miss: Option<Miss>,
}

/// A step of a descent: the node, and the range of keys it covers.
#[derive(Debug, Clone)]
struct Hop {
    child: Child,
    node: Arc<Node>,
    low: Key,
    high: Option<Key>,
    /// Index of the next hop's child in this node (branches).
    idx: usize,
}

/// Per level of a path: the sibling a merge or borrow at that level needs.
type Siblings = Vec<Option<Arc<Node>>>;

/// What happens at one level of a delete, decided before anything changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    None,
    /// Merge with or borrow from the sibling at this index of the parent.
    With(usize),
}

impl Tree {
    /// A new empty tree (an empty leaf, dirty in generation `open`).
    #[must_use]
    pub fn create(id: TreeId, size: PageSize, open: Generation) -> Tree {
        let mut t = Tree::with_root(id, size, Child::Mem(NodeId(0)), 0, open);
        t.dirty.insert(NodeId(0), Arc::new(Node::empty_leaf()));
        t.next_id = 1;
        t
    }

    /// The tree whose root a durable root record names; `open` is the generation after
    /// that record's.
    #[must_use]
    pub fn open(id: TreeId, size: PageSize, root: RootRef, open: Generation) -> Tree {
        Tree::with_root(id, size, Child::Page(root.at), root.level, open)
    }

    fn with_root(id: TreeId, size: PageSize, root: Child, level: u8, open: Generation) -> Tree {
        Tree {
            id,
            size,
            root,
            root_level: level,
            open,
            dirty: NodeMap::default(),
            gone: Vec::new(),
            frozen: None,
            next_id: 0,
        }
    }

    /// Which tree this is.
    #[must_use]
    pub fn id(&self) -> TreeId {
        self.id
    }

    /// Levels above the leaves (0: the root is a leaf).
    #[must_use]
    pub fn root_level(&self) -> u8 {
        self.root_level
    }

    /// The generation being modified.
    #[must_use]
    pub fn open_generation(&self) -> Generation {
        self.open
    }

    /// Nodes dirtied in the open generation (pinned until their checkpoint).
    #[must_use]
    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Pages the open generation superseded so far (its page log will free them).
    #[must_use]
    pub fn superseded_count(&self) -> usize {
        self.gone.len()
    }

    /// Nodes of the frozen generation (pinned until published).
    #[must_use]
    pub fn frozen_count(&self) -> usize {
        self.frozen.as_ref().map_or(0, |f| f.nodes.len())
    }

    fn load(
        &self,
        src: &dyn PageSource,
        child: Child,
        level: u8,
        low: Key,
        high: Option<Key>,
    ) -> Result<Arc<Node>, Miss> {
        match child {
            Child::Mem(id) => Ok(self.mem(id)),
            Child::Page(r) => src.page(&r).ok_or(Miss(Expect {
                tree: self.id,
                at: r,
                level,
                low,
                high,
            })),
        }
    }

    fn mem(&self, id: NodeId) -> Arc<Node> {
        let frozen = self.frozen.as_ref().and_then(|f| f.nodes.get(&id));
        Arc::clone(
            self.dirty
                .get(&id)
                .or(frozen)
                .expect("a node in memory is dirty or frozen"),
        )
    }

    /// The path from the root to the leaf whose range holds `key`.
    fn descend(&self, src: &dyn PageSource, key: &Key) -> Result<Vec<Hop>, Miss> {
        let mut path = Vec::with_capacity(usize::from(self.root_level) + 1);
        self.walk(src, key, |hop| path.push(hop))?;
        Ok(path)
    }

    /// Visits each hop from the root to the leaf whose range holds `key`, in order.
    fn walk(
        &self,
        src: &dyn PageSource,
        key: &Key,
        mut visit: impl FnMut(Hop),
    ) -> Result<(), Miss> {
        let (mut child, mut low, mut high) = (self.root, Key::MIN, None);
        let mut level = self.root_level;
        loop {
            let node = self.load(src, child, level, low, high)?;
            debug_assert_eq!(node.level, level, "levels decrease by one");
            if level == 0 {
                visit(Hop {
                    child,
                    node,
                    low,
                    high,
                    idx: 0,
                });
                return Ok(());
            }
            let idx = node.child_index(key);
            let (clow, chigh) = child_range(&node, idx, low, high);
            let next = node.branch()[idx].1;
            visit(Hop {
                child,
                node,
                low,
                high,
                idx,
            });
            (child, low, high, level) = (next, clow, chigh, level - 1);
        }
    }

    /// Whether every page on the way to `key`'s leaf is in memory: a [`Self::get`]
    /// without building the path or copying the value (read-ahead asks this of each
    /// key a change will look up).
    ///
    /// # Errors
    /// [`Miss`] for the first page on the way that is not in memory.
    pub fn probe(&self, src: &dyn PageSource, key: &Key) -> Result<(), Miss> {
        self.walk(src, key, drop)
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`Miss`] when a page on the way is not in memory.
    pub fn get(&self, src: &dyn PageSource, key: &Key) -> Result<Option<Vec<u8>>, Miss> {
        let path = self.descend(src, key)?;
        let leaf = &path.last().expect("a path reaches a leaf").node;
        let Items::Leaf(items) = &leaf.items else {
            unreachable!("level 0 is a leaf")
        };
        Ok(items.search(key).ok().map(|i| items.value(i).to_vec()))
    }

    /// The item with the greatest key at or below `key` (an extent lookup: the extent
    /// starting at or before a block).
    ///
    /// # Errors
    /// [`Miss`] when a page on the way is not in memory.
    pub fn floor(&self, src: &dyn PageSource, key: &Key) -> Result<Option<(Key, Vec<u8>)>, Miss> {
        let mut at = *key;
        loop {
            let path = self.descend(src, &at)?;
            let leaf = path.last().expect("a path reaches a leaf");
            let Items::Leaf(items) = &leaf.node.items else {
                unreachable!("level 0 is a leaf")
            };
            let n = items.partition_point(|k| *k <= at);
            if n > 0 {
                let (k, v) = items.get(n - 1);
                return Ok(Some((k, v.to_vec())));
            }
            // Everything here is above `at`: look in the leaf before this one.
            match leaf.low.predecessor() {
                Some(p) => at = p,
                None => return Ok(None),
            }
        }
    }

    /// Items with keys in `from..to` (`to: None`: to the end), at most `limit` of them.
    /// A miss ends the scan early with what was found before it; scan again from
    /// `resume` after reading the page (progress is kept across misses).
    #[must_use]
    pub fn scan(&self, src: &dyn PageSource, from: Key, to: Option<Key>, limit: usize) -> Scan {
        let mut out = Scan::default();
        let mut at = from;
        loop {
            let path = match self.descend(src, &at) {
                Ok(p) => p,
                Err(m) => {
                    out.resume = Some(at);
                    out.miss = Some(m);
                    return out;
                }
            };
            let leaf = path.last().expect("a path reaches a leaf");
            let Items::Leaf(items) = &leaf.node.items else {
                unreachable!("level 0 is a leaf")
            };
            let start = items.partition_point(|k| *k < at);
            for (k, v) in items.iter_from(start) {
                if to.is_some_and(|t| k >= t) {
                    return out;
                }
                if out.items.len() == limit {
                    out.resume = Some(k);
                    return out;
                }
                out.items.push((k, v.to_vec()));
            }
            // Continue at the start of the next leaf's range: the high bound of this one.
            match leaf.high {
                Some(h) if to.is_none_or(|t| h < t) => at = h,
                _ => return out,
            }
        }
    }

    /// Relocation of the pages `off` picks (a target being emptied): looks at the path
    /// to the leaf whose range holds `at` and, if a written page on it is one `off`
    /// picks, makes the whole path dirty, so the next checkpoint writes copies wherever
    /// the page allocator places them and frees these pages. Nothing else changes.
    /// Returns whether it dirtied the path and the low bound of the next leaf (`None`:
    /// this was the last). Called leaf by leaf from `Key::MIN`, it reaches every written
    /// page of the tree: each lies on the path to some leaf.
    ///
    /// # Errors
    /// [`Miss`] when a page on the path is not in memory (nothing was changed).
    pub fn relocate_path(
        &mut self,
        src: &dyn PageSource,
        at: &Key,
        off: &dyn Fn(PageAddr) -> bool,
    ) -> Result<(bool, Option<Key>), Miss> {
        let path = self.descend(src, at)?;
        let next = path.last().expect("a path reaches a leaf").high;
        let picked = path
            .iter()
            .any(|h| matches!(h.child, Child::Page(r) if off(r.addr)));
        if picked {
            self.cow_path(path);
        }
        Ok((picked, next))
    }

    /// Inserts or replaces; returns the previous value.
    ///
    /// # Errors
    /// [`Miss`] when a page on the path is not in memory (nothing was changed).
    ///
    /// # Panics
    /// Panics if `value` is longer than [`super::VALUE_MAX`] or the key's kind is not of
    /// this tree (callers build both).
    pub fn insert(
        &mut self,
        src: &dyn PageSource,
        key: Key,
        value: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Miss> {
        assert!(
            value.len() <= super::VALUE_MAX,
            "value of {} bytes",
            value.len()
        );
        assert!(self.id.holds(key.kind), "{key} in tree {}", self.id);
        let path = self.descend(src, &key)?;
        let Items::Leaf(items) = &path.last().expect("path").node.items else {
            unreachable!("level 0 is a leaf")
        };
        // A smaller replacement value shrinks the leaf like a remove does.
        let shrink = items
            .search(&key)
            .map_or(0, |i| items.value(i).len().saturating_sub(value.len()));
        let (fixes, siblings) = self.plan_shrink(src, &path, shrink)?;
        let ids = self.cow_path(path);
        let sib_ids = self.cow_siblings(&ids, &fixes, &siblings);
        let leaf = self.node_mut(*ids.last().expect("path"));
        let items = leaf.leaf_mut();
        let (old, at) = match items.search(&key) {
            Ok(i) => (Some(items.replace(i, &value)), i),
            Err(i) => {
                items.insert(i, key, &value);
                (None, i)
            }
        };
        let at_end = if at + 1 == items.len() {
            Fill::Append
        } else {
            Fill::Even
        };
        if shrink > 0 {
            self.rebalance_upward(&ids, &fixes, &sib_ids);
            self.collapse_root();
        } else {
            self.split_upward(&ids, at_end);
        }
        Ok(old)
    }

    /// Removes `key`; returns its value.
    ///
    /// # Errors
    /// [`Miss`] when a page on the path, or a sibling a merge needs, is not in memory
    /// (nothing was changed).
    pub fn remove(&mut self, src: &dyn PageSource, key: &Key) -> Result<Option<Vec<u8>>, Miss> {
        let path = self.descend(src, key)?;
        let leaf = &path.last().expect("path").node;
        let Items::Leaf(items) = &leaf.items else {
            unreachable!("level 0 is a leaf")
        };
        let Ok(pos) = items.search(key) else {
            return Ok(None);
        };
        let removed = items.item_bytes(pos);
        let (fixes, siblings) = self.plan_shrink(src, &path, removed)?;
        let ids = self.cow_path(path);
        let sib_ids = self.cow_siblings(&ids, &fixes, &siblings);
        let value = self
            .node_mut(*ids.last().expect("path"))
            .leaf_mut()
            .remove(pos)
            .1;
        self.rebalance_upward(&ids, &fixes, &sib_ids);
        self.collapse_root();
        Ok(Some(value))
    }

    /// Decides, before anything changes, which levels will merge or borrow when the
    /// leaf of `path` loses `removed_bytes`, and loads the siblings they need.
    fn plan_shrink(
        &self,
        src: &dyn PageSource,
        path: &[Hop],
        removed_bytes: usize,
    ) -> Result<(Vec<Fix>, Siblings), Miss> {
        let floor = self.size.body() / 4;
        let mut fixes = vec![Fix::None; path.len()];
        let mut siblings = vec![None; path.len()];
        let mut loses = removed_bytes;
        if loses == 0 {
            return Ok((fixes, siblings));
        }
        for d in (1..path.len()).rev() {
            let len = path[d].node.encoded_len() - loses;
            if len >= floor {
                break;
            }
            let parent = &path[d - 1];
            let entries = parent.node.branch();
            let s = if parent.idx > 0 {
                parent.idx - 1
            } else {
                parent.idx + 1
            };
            if s >= entries.len() {
                break; // an only child: the root collapses over it instead
            }
            let (low, high) = child_range(&parent.node, s, parent.low, parent.high);
            let sib = self.load(src, entries[s].1, path[d].node.level, low, high)?;
            let merges = len + sib.encoded_len() <= self.size.body();
            fixes[d] = Fix::With(s);
            siblings[d] = Some(sib);
            if !merges {
                break;
            }
            loses = page::BRANCH_ENTRY_BYTES;
        }
        Ok((fixes, siblings))
    }

    /// Makes every node of `path` dirty in the open generation (copying clean and frozen
    /// ones and pointing their parents at the copies); returns their ids, root first.
    ///
    /// Takes the path by value and drops each hop's reference once it is copied: a dirty
    /// node the path still referenced would be shared, and changing it (`node_mut`) would
    /// copy the whole node again, a branch per level on every insert into an already
    /// dirty path (the costliest step of applying a record, by profile).
    fn cow_path(&mut self, path: Vec<Hop>) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = Vec::with_capacity(path.len());
        let mut parent_idx = 0;
        for hop in path {
            let id = self.make_dirty(hop.child, &hop.node);
            drop(hop.node);
            match ids.last() {
                None => self.root = Child::Mem(id),
                Some(&parent) => {
                    if self.node(parent).branch()[parent_idx].1 != Child::Mem(id) {
                        self.node_mut(parent).branch_mut()[parent_idx].1 = Child::Mem(id);
                    }
                }
            }
            debug_assert_eq!(
                Arc::strong_count(&self.dirty[&id]),
                1,
                "a dirty node on the path is not shared"
            );
            parent_idx = hop.idx;
            ids.push(id);
        }
        ids
    }

    fn cow_siblings(
        &mut self,
        ids: &[NodeId],
        fixes: &[Fix],
        siblings: &[Option<Arc<Node>>],
    ) -> Vec<Option<NodeId>> {
        let mut out = vec![None; ids.len()];
        for d in 1..ids.len() {
            if let (Fix::With(s), Some(node)) = (fixes[d], &siblings[d]) {
                let child = self.node(ids[d - 1]).branch()[s].1;
                let id = self.make_dirty(child, node);
                self.node_mut(ids[d - 1]).branch_mut()[s].1 = Child::Mem(id);
                out[d] = Some(id);
            }
        }
        out
    }

    /// The id of a dirty copy of `node` (itself if it already is dirty).
    fn make_dirty(&mut self, child: Child, node: &Arc<Node>) -> NodeId {
        match child {
            Child::Mem(id) if self.dirty.contains_key(&id) => return id,
            Child::Mem(id) => self.gone.push(Gone::Frozen(id)),
            Child::Page(r) => self.gone.push(Gone::Page(r.addr)),
        }
        self.add((**node).clone())
    }

    fn add(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.next_id);
        self.next_id += 1;
        self.dirty.insert(id, Arc::new(node));
        id
    }

    fn node(&self, id: NodeId) -> &Node {
        self.dirty.get(&id).expect("dirty node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        Arc::make_mut(self.dirty.get_mut(&id).expect("dirty node"))
    }

    /// Splits overflowing nodes from the leaf up, growing a new root if needed.
    fn split_upward(&mut self, ids: &[NodeId], mut fill: Fill) {
        for d in (0..ids.len()).rev() {
            if self.node(ids[d]).encoded_len() <= self.size.body() {
                return;
            }
            let (sep, right) = self.split(ids[d], fill);
            if d == 0 {
                let level = self.node(ids[0]).level + 1;
                let root = Node {
                    level,
                    items: Items::Branch(vec![
                        (Key::MIN, Child::Mem(ids[0])),
                        (sep, Child::Mem(right)),
                    ]),
                };
                self.root = Child::Mem(self.add(root));
                self.root_level = level;
                return;
            }
            let parent = self.node_mut(ids[d - 1]);
            let at = parent.child_index(&sep) + 1;
            parent.branch_mut().insert(at, (sep, Child::Mem(right)));
            fill = if at + 1 == parent.len() {
                Fill::Append
            } else {
                Fill::Even
            };
        }
    }

    /// Moves the upper part of node `id` into a new node; returns its lowest key and id.
    fn split(&mut self, id: NodeId, fill: Fill) -> (Key, NodeId) {
        let floor = self.size.body() / 4;
        let node = self.node_mut(id);
        let level = node.level;
        let items = match &mut node.items {
            Items::Leaf(v) => {
                let sizes: Vec<usize> = (0..v.len()).map(|i| v.item_bytes(i)).collect();
                Items::Leaf(v.split_off(split_point(&sizes, floor, fill)))
            }
            Items::Branch(v) => {
                let sizes = vec![page::BRANCH_ENTRY_BYTES; v.len()];
                Items::Branch(v.split_off(split_point(&sizes, floor, fill)))
            }
        };
        let sep = match &items {
            Items::Leaf(v) => v.key(0),
            Items::Branch(v) => v[0].0,
        };
        let right = self.add(Node { level, items });
        debug_assert!(self.node(id).encoded_len() <= self.size.body());
        debug_assert!(self.node(right).encoded_len() <= self.size.body());
        (sep, right)
    }

    fn rebalance_upward(&mut self, ids: &[NodeId], fixes: &[Fix], sibs: &[Option<NodeId>]) {
        for d in (1..ids.len()).rev() {
            let (Fix::With(s), Some(sib)) = (fixes[d], sibs[d]) else {
                return;
            };
            let parent = ids[d - 1];
            let idx = self.node(parent).child_index_of(ids[d]);
            let (left, right, ridx) = if s < idx {
                (sib, ids[d], idx)
            } else {
                (ids[d], sib, s)
            };
            // The right node's first key becomes interior: make it its true lower bound.
            let sep = self.node(parent).branch()[ridx].0;
            if let Items::Branch(v) = &mut self.node_mut(right).items {
                v[0].0 = sep;
            }
            let merged =
                self.node(left).encoded_len() + self.node(right).encoded_len() <= self.size.body();
            if merged {
                let moved = std::mem::replace(
                    &mut self.node_mut(right).items,
                    Items::Leaf(LeafItems::new()),
                );
                append(&mut self.node_mut(left).items, moved);
                self.dirty.remove(&right);
                self.node_mut(parent).branch_mut().remove(ridx);
            } else {
                let sep = self.borrow(left, right);
                self.node_mut(parent).branch_mut()[ridx].0 = sep;
                return;
            }
        }
    }

    /// Evens out two siblings by bytes; returns the right one's new lowest key.
    fn borrow(&mut self, left: NodeId, right: NodeId) -> Key {
        let target = (self.node(left).encoded_len() + self.node(right).encoded_len()) / 2;
        let mut l = std::mem::replace(
            &mut self.node_mut(left).items,
            Items::Leaf(LeafItems::new()),
        );
        let mut r = std::mem::replace(
            &mut self.node_mut(right).items,
            Items::Leaf(LeafItems::new()),
        );
        match (&mut l, &mut r) {
            (Items::Leaf(l), Items::Leaf(r)) => even_out_leaves(l, r, target),
            (Items::Branch(l), Items::Branch(r)) => {
                even_out(l, r, target, |_| page::BRANCH_ENTRY_BYTES)
            }
            _ => unreachable!("siblings are at one level"),
        }
        let sep = match &r {
            Items::Leaf(v) => v.key(0),
            Items::Branch(v) => v[0].0,
        };
        self.node_mut(left).items = l;
        self.node_mut(right).items = r;
        sep
    }

    /// Replaces a root branch with one child by that child, repeatedly.
    fn collapse_root(&mut self) {
        while self.root_level > 0 {
            let Child::Mem(id) = self.root else {
                return;
            };
            let node = self.node(id);
            if node.len() != 1 {
                return;
            }
            let only = node.branch()[0].1;
            self.dirty.remove(&id);
            self.root = only;
            self.root_level -= 1;
        }
    }

    /// Starts a checkpoint of the open generation: its nodes become immutable and the
    /// next generation opens. Short: moves maps, copies nothing.
    ///
    /// # Panics
    /// Panics if a frozen generation is still unpublished (checkpoints are serial).
    pub fn freeze(&mut self) -> Arc<Frozen> {
        assert!(self.frozen.is_none(), "one checkpoint at a time");
        let f = Arc::new(Frozen {
            generation: self.open,
            root: self.root,
            root_level: self.root_level,
            nodes: std::mem::take(&mut self.dirty),
            gone: std::mem::take(&mut self.gone),
        });
        self.open = self.open.next();
        self.frozen = Some(Arc::clone(&f));
        f
    }

    /// Publishes a written and durable generation: returns the pages that become clean
    /// and the pages that are free from now on.
    ///
    /// # Panics
    /// Panics unless `plan` is the plan of the frozen generation.
    pub fn publish(&mut self, plan: &WritePlan) -> Published {
        let f = self.frozen.take().expect("a frozen generation");
        assert_eq!(
            f.generation, plan.generation,
            "plan of the frozen generation"
        );
        let resolve = |c: &mut Child| {
            if let Child::Mem(id) = *c {
                if let Some(r) = plan.placed.get(&id) {
                    *c = Child::Page(*r);
                }
            }
        };
        resolve(&mut self.root);
        for node in self.dirty.values_mut() {
            if let Items::Branch(v) = &mut Arc::make_mut(node).items {
                v.iter_mut().for_each(|(_, c)| resolve(c));
            }
        }
        for g in &mut self.gone {
            if let Gone::Frozen(id) = *g {
                *g = Gone::Page(plan.placed[&id].addr);
            }
        }
        let freed = f
            .gone
            .iter()
            .map(|g| match g {
                Gone::Page(a) => *a,
                Gone::Frozen(_) => unreachable!("resolved when the previous generation published"),
            })
            .collect();
        let clean = plan
            .pages
            .iter()
            .map(|p| (p.at, Arc::clone(&p.node)))
            .collect();
        Published { clean, freed }
    }

    /// The root a root record stores for the open generation's predecessor, when nothing
    /// is dirty (a tree unchanged since its last checkpoint).
    #[must_use]
    pub fn clean_root(&self) -> Option<RootRef> {
        match self.root {
            Child::Page(at) => Some(RootRef {
                at,
                level: self.root_level,
            }),
            Child::Mem(_) => None,
        }
    }

    /// Page-size of this tree.
    #[must_use]
    pub fn page_size(&self) -> PageSize {
        self.size
    }
}

impl Node {
    fn child_index_of(&self, id: NodeId) -> usize {
        self.branch()
            .iter()
            .position(|(_, c)| *c == Child::Mem(id))
            .expect("child of its parent")
    }
}

impl Frozen {
    /// Places the frozen nodes of tree `tree` at the addresses `addrs` (one per node, in
    /// the order children-first of the walk from the root), for the checkpoint to encode
    /// and write ([`WrittenPage::encode_into`]). Pure: the caller allocated the addresses
    /// and writes the pages. Copies only the branches (their children become pages).
    ///
    /// # Panics
    /// Panics unless `addrs.len() == self.page_count()`.
    #[must_use]
    pub fn plan(&self, tree: TreeId, addrs: &[PageAddr]) -> WritePlan {
        assert_eq!(addrs.len(), self.nodes.len(), "one address per frozen node");
        let mut plan = WritePlan {
            generation: self.generation,
            pages: Vec::with_capacity(addrs.len()),
            root: PageRef {
                addr: PageAddr::default(),
                generation: self.generation,
            },
            root_level: self.root_level,
            placed: NodeMap::with_capacity_and_hasher(addrs.len(), Default::default()),
        };
        let mut next = addrs.iter();
        plan.root = match self.root {
            Child::Page(r) => r,
            Child::Mem(id) => self.place(id, tree, &mut next, &mut plan),
        };
        debug_assert_eq!(
            plan.pages.len(),
            self.nodes.len(),
            "every frozen node reachable"
        );
        plan
    }

    fn place(
        &self,
        id: NodeId,
        tree: TreeId,
        addrs: &mut std::slice::Iter<'_, PageAddr>,
        plan: &mut WritePlan,
    ) -> PageRef {
        let node = &self.nodes[&id];
        let written = match &node.items {
            // A leaf is written as it is: the cache keeps the frozen node itself.
            Items::Leaf(_) => Arc::clone(node),
            Items::Branch(v) => {
                let children = v
                    .iter()
                    .map(|(k, c)| {
                        let r = match *c {
                            Child::Page(r) => r,
                            Child::Mem(cid) => self.place(cid, tree, addrs, plan),
                        };
                        (*k, Child::Page(r))
                    })
                    .collect();
                Arc::new(Node {
                    level: node.level,
                    items: Items::Branch(children),
                })
            }
        };
        let at = PageRef {
            addr: *addrs.next().expect("an address per node"),
            generation: self.generation,
        };
        plan.placed.insert(id, at);
        plan.pages.push(WrittenPage {
            at,
            node: written,
            tree,
        });
        at
    }
}

impl WritePlan {
    /// The root for the root record.
    #[must_use]
    pub fn root_ref(&self) -> RootRef {
        RootRef {
            at: self.root,
            level: self.root_level,
        }
    }
}

/// The key range of child `idx` of `node`, which covers `low..high`.
fn child_range(node: &Node, idx: usize, low: Key, high: Option<Key>) -> (Key, Option<Key>) {
    let v = node.branch();
    let clow = if idx == 0 { low } else { v[idx].0 };
    let chigh = v.get(idx + 1).map_or(high, |(k, _)| Some(*k));
    (clow, chigh)
}

/// How a split divides a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// At the byte midpoint.
    Even,
    /// The insert that overflowed the node was at its end (keys arriving in order, as
    /// new inodes do): the new right node gets just over a quarter, so the left one
    /// stays about three quarters full instead of half.
    Append,
}

/// Index of the first entry of the right node when a node of entries of `sizes` bytes
/// splits. Both parts are at least `floor` bytes (entries are at most `floor`, the node
/// is over four `floor`s) and at most the page body.
fn split_point(sizes: &[usize], floor: usize, fill: Fill) -> usize {
    let total: usize = sizes.iter().sum();
    let at = match fill {
        Fill::Even => {
            let (mut acc, mut at) = (0, 0);
            while at < sizes.len() - 1 && acc + sizes[at] <= total / 2 {
                acc += sizes[at];
                at += 1;
            }
            at
        }
        Fill::Append => {
            let (mut acc, mut at) = (0, sizes.len());
            while at > 1 && acc < floor {
                at -= 1;
                acc += sizes[at];
            }
            at
        }
    };
    at.clamp(1, sizes.len() - 1)
}

fn append(into: &mut Items, from: Items) {
    match (into, from) {
        (Items::Leaf(a), Items::Leaf(b)) => a.append(b),
        (Items::Branch(a), Items::Branch(b)) => a.extend(b),
        _ => unreachable!("siblings are at one level"),
    }
}

/// Moves entries between `l` and `r` (in key order) until `l` holds about `target` bytes;
/// both stay non-empty.
fn even_out<T>(l: &mut Vec<T>, r: &mut Vec<T>, target: usize, size: impl Fn(&T) -> usize) {
    let mut lbytes: usize = l.iter().map(&size).sum();
    while lbytes > target && l.len() > 1 {
        let last = l.pop().expect("non-empty");
        lbytes -= size(&last);
        r.insert(0, last);
    }
    while r.len() > 1 && lbytes + size(&r[0]) <= target {
        let first = r.remove(0);
        lbytes += size(&first);
        l.push(first);
    }
}

/// [`even_out`] for leaves: the same split, made by one cut of the joined items (the
/// items' bytes move once, not one item at a time).
fn even_out_leaves(l: &mut LeafItems, r: &mut LeafItems, target: usize) {
    let right = std::mem::take(r);
    l.append(right);
    // The longest prefix within `target`, but at least one item on each side.
    let (mut acc, mut at) = (0, 0);
    while at < l.len() && acc + l.item_bytes(at) <= target {
        acc += l.item_bytes(at);
        at += 1;
    }
    *r = l.split_off(at.clamp(1, l.len() - 1));
}

#[cfg(test)]
mod model_tests;

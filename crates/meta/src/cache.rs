//! The page cache: clean pages by address, evicted least recently used first under a
//! byte budget that also counts the pinned (dirty and frozen) pages the trees hold.
//! A clean page counts as the memory its decoded node takes (`Node::mem_bytes`), which
//! for leaves of many small values is more than the page size.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use stripefs_core::btree::tree::{Node, PageSource};
use stripefs_core::btree::{Generation, PageAddr, PageRef};
use stripefs_core::idhash::IdMap;

#[derive(Debug)]
struct Entry {
    generation: Generation,
    node: Arc<Node>,
    bytes: usize,
    tick: u64,
}

#[derive(Debug, Default)]
struct Inner {
    map: IdMap<PageAddr, Entry>,
    lru: BTreeMap<u64, PageAddr>,
    bytes: usize,
    tick: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    reads: u64,
    read_ahead: u64,
}

/// Counters of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub pages: usize,
    pub bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Pages read from disk one at a time, by an operation that missed (`Store::fill`).
    pub reads: u64,
    /// Pages read ahead, many in flight at once (`Store::prefetch`).
    pub read_ahead: u64,
}

/// Clean pages under a byte budget.
#[derive(Debug)]
pub struct PageCache {
    budget: usize,
    inner: Mutex<Inner>,
}

impl PageCache {
    /// A cache of at most `budget` bytes.
    #[must_use]
    pub fn new(budget: usize) -> PageCache {
        PageCache {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Adds a clean page, evicting the least recently used ones so that clean and
    /// `pinned` bytes stay within the budget. A page that cannot fit (everything is
    /// pinned) is not kept: the caller's operation still has it, and the next one reads
    /// it again.
    pub fn insert(&self, at: PageRef, node: Arc<Node>, pinned: usize) {
        let mut c = self.inner.lock();
        let room = self.budget.saturating_sub(pinned);
        if let Some(old) = c.map.remove(&at.addr) {
            c.lru.remove(&old.tick);
            c.bytes -= old.bytes;
        }
        let bytes = node.mem_bytes();
        while c.bytes + bytes > room {
            let Some((_, victim)) = c.lru.pop_first() else {
                return;
            };
            let gone = c.map.remove(&victim).expect("lru and map agree");
            c.bytes -= gone.bytes;
            c.evictions += 1;
        }
        c.bytes += bytes;
        c.tick += 1;
        let tick = c.tick;
        c.lru.insert(tick, at.addr);
        c.map.insert(
            at.addr,
            Entry {
                generation: at.generation,
                node,
                bytes,
                tick,
            },
        );
    }

    /// Drops a page (freed: its address may be reused).
    pub fn remove(&self, addr: PageAddr) {
        let mut c = self.inner.lock();
        if let Some(old) = c.map.remove(&addr) {
            c.lru.remove(&old.tick);
            c.bytes -= old.bytes;
        }
    }

    /// Counts pages read from disk: `one` by a missing operation, `ahead` by read-ahead.
    pub fn note_reads(&self, one: u64, ahead: u64) {
        let mut c = self.inner.lock();
        c.reads += one;
        c.read_ahead += ahead;
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        let c = self.inner.lock();
        CacheStats {
            pages: c.map.len(),
            bytes: c.bytes,
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            reads: c.reads,
            read_ahead: c.read_ahead,
        }
    }
}

impl PageSource for PageCache {
    fn page(&self, r: &PageRef) -> Option<Arc<Node>> {
        let mut c = self.inner.lock();
        let c = &mut *c;
        let slack = (c.map.len() / 8) as u64;
        let found = c
            .map
            .get_mut(&r.addr)
            .filter(|e| e.generation == r.generation);
        let Some(e) = found else {
            c.misses += 1;
            return None;
        };
        c.hits += 1;
        c.tick += 1;
        // A page used within the last eighth of the cache's length in accesses keeps its
        // place in the LRU order: the root and upper branches, hit by every descent, move
        // once in that many hits instead of on each (two ordered-map updates per hit were
        // a tenth of applying a record, by profile). A page hit at least that often is
        // never the least recently used; with fewer than 8 pages the order is exact.
        if c.tick - e.tick > slack {
            c.lru.remove(&e.tick);
            e.tick = c.tick;
            c.lru.insert(e.tick, r.addr);
        }
        Some(Arc::clone(&e.node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripefs_core::btree::tree::Items;
    use stripefs_core::btree::{Key, KeyKind};
    use stripefs_core::{PhysBlock, TargetId};

    fn at(block: u64) -> PageRef {
        PageRef {
            addr: PageAddr {
                target: TargetId(0),
                block: PhysBlock(block),
            },
            generation: Generation(1),
        }
    }

    /// A full 4 KiB leaf of 149 empty values (each item 27 bytes on the page).
    fn small_values_leaf() -> Arc<Node> {
        let items = (0..149).map(|i| (Key::new(i, KeyKind::Orphan, 0, 0), Vec::new()));
        Arc::new(Node {
            level: 0,
            items: Items::Leaf(items.collect()),
        })
    }

    #[test]
    fn budget_counts_decoded_bytes_and_evicts_least_recent() {
        let node = small_values_leaf();
        assert!(
            node.mem_bytes() > 4096,
            "decoded, it is larger than its page"
        );
        let cache = PageCache::new(4 * node.mem_bytes());
        for b in 0..4 {
            cache.insert(at(b), Arc::clone(&node), 0);
        }
        assert_eq!(cache.stats().pages, 4);
        assert!(cache.page(&at(0)).is_some(), "touch 0: 1 is now the oldest");
        cache.insert(at(9), Arc::clone(&node), 0);
        let s = cache.stats();
        assert!(s.bytes <= 4 * node.mem_bytes() && s.pages == 4 && s.evictions == 1);
        assert!(cache.page(&at(1)).is_none() && cache.page(&at(0)).is_some());
        // Pinned bytes shrink the room for clean pages.
        cache.insert(at(10), Arc::clone(&node), 3 * node.mem_bytes());
        assert_eq!(cache.stats().pages, 1);
        // A stale generation is a miss.
        let stale = PageRef {
            generation: Generation(2),
            ..at(10)
        };
        assert!(cache.page(&stale).is_none());
        cache.remove(at(10).addr);
        assert_eq!(cache.stats().bytes, 0);
    }
}

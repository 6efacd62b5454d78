//! The page cache: clean pages by address, evicted least recently used first under a
//! byte budget that also counts the pinned (dirty and frozen) pages the trees hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use stripefs_core::btree::tree::{Node, PageSource};
use stripefs_core::btree::{Generation, PageAddr, PageRef};

#[derive(Debug)]
struct Entry {
    generation: Generation,
    node: Arc<Node>,
    tick: u64,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<PageAddr, Entry>,
    lru: BTreeMap<u64, PageAddr>,
    tick: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
}

/// Counters of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub pages: usize,
    pub bytes: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Clean pages under a byte budget.
#[derive(Debug)]
pub struct PageCache {
    budget: usize,
    page_bytes: usize,
    inner: Mutex<Inner>,
}

impl PageCache {
    /// A cache of at most `budget` bytes of pages of `page_bytes` each.
    #[must_use]
    pub fn new(budget: usize, page_bytes: usize) -> PageCache {
        PageCache {
            budget,
            page_bytes,
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
        }
        while (c.map.len() + 1) * self.page_bytes > room {
            let Some((_, victim)) = c.lru.pop_first() else {
                return;
            };
            c.map.remove(&victim);
            c.evictions += 1;
        }
        c.tick += 1;
        let tick = c.tick;
        c.lru.insert(tick, at.addr);
        c.map.insert(
            at.addr,
            Entry {
                generation: at.generation,
                node,
                tick,
            },
        );
    }

    /// Drops a page (freed: its address may be reused).
    pub fn remove(&self, addr: PageAddr) {
        let mut c = self.inner.lock();
        if let Some(old) = c.map.remove(&addr) {
            c.lru.remove(&old.tick);
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        let c = self.inner.lock();
        CacheStats {
            pages: c.map.len(),
            bytes: c.map.len() * self.page_bytes,
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
        }
    }
}

impl PageSource for PageCache {
    fn page(&self, r: &PageRef) -> Option<Arc<Node>> {
        let mut c = self.inner.lock();
        let c = &mut *c;
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
        c.lru.remove(&e.tick);
        e.tick = c.tick;
        c.lru.insert(e.tick, r.addr);
        Some(Arc::clone(&e.node))
    }
}

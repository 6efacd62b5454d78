//! Reclaim lists of the page cache: every cached folio is on exactly one of three
//! doubly linked lists (clean, dirty, under writeback), most recently used at the front.
//!
//! Reclaim takes victims from the back of the clean list only, so it never visits a folio
//! it cannot evict for being dirty or under writeback; moving a folio between lists when
//! its state changes, moving it to the front when it is used, inserting and removing are
//! all O(1). The lists are a slab of nodes linked by index (no `unsafe`, no hashing): a
//! folio keeps the [`LruSlot`] of its node for its whole life in the cache, and each node
//! carries the folio's key so that reclaim, which reads the oldest node without holding the
//! folio, can find the folio and check it is still the same one.

/// Which list a folio is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LruList {
    /// Neither dirty nor under writeback: reclaim may evict it.
    Clean = 0,
    /// Some block is dirty: needs writeback before it can be evicted.
    Dirty = 1,
    /// Under writeback (and not dirty again): evictable once the I/O completed.
    Writeback = 2,
}

const LISTS: usize = 3;

/// The node of one folio in [`LruLists`], valid from insertion until removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LruSlot(u32);

/// What a node names: the file's cache key and the folio's position in the file.
pub type LruKey = (u64, u64);

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: LruKey,
    prev: u32,
    next: u32,
    /// `None` while the node is free.
    list: Option<LruList>,
}

#[derive(Debug, Clone, Copy)]
struct Ends {
    front: u32,
    back: u32,
    len: usize,
}

/// Three LRU lists over one slab of nodes.
#[derive(Debug)]
pub struct LruLists {
    nodes: Vec<Node>,
    free: Vec<u32>,
    ends: [Ends; LISTS],
}

impl Default for LruLists {
    fn default() -> Self {
        Self::new()
    }
}

impl LruLists {
    /// Empty lists.
    #[must_use]
    pub fn new() -> Self {
        let e = Ends {
            front: NIL,
            back: NIL,
            len: 0,
        };
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            ends: [e; LISTS],
        }
    }

    /// Folios on `list`.
    #[must_use]
    pub fn len(&self, list: LruList) -> usize {
        self.ends[list as usize].len
    }

    /// Adds `key` at the front of `list`.
    pub fn insert(&mut self, list: LruList, key: LruKey) -> LruSlot {
        let node = Node {
            key,
            prev: NIL,
            next: NIL,
            list: None,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                let i = u32::try_from(self.nodes.len()).expect("fewer than 2^32 cached folios");
                assert!(i != NIL, "fewer than 2^32 cached folios");
                self.nodes.push(node);
                i
            }
        };
        self.link_front(i, list);
        LruSlot(i)
    }

    /// Removes the node; the slot may be handed out again.
    pub fn remove(&mut self, slot: LruSlot) {
        self.unlink(slot.0);
        self.nodes[slot.0 as usize].list = None;
        self.free.push(slot.0);
    }

    /// Moves the node to the front of `list` (its own list or another).
    pub fn move_to_front(&mut self, slot: LruSlot, list: LruList) {
        let n = &self.nodes[slot.0 as usize];
        if n.list == Some(list) && self.ends[list as usize].front == slot.0 {
            return;
        }
        self.unlink(slot.0);
        self.link_front(slot.0, list);
    }

    /// Moves the node to the front of the list it is on (it was just used).
    pub fn touch(&mut self, slot: LruSlot) {
        if let Some(list) = self.list_of(slot) {
            self.move_to_front(slot, list);
        }
    }

    /// Moves the node to `list` unless it is already there (keeping its place then).
    pub fn set_list(&mut self, slot: LruSlot, list: LruList) {
        if self.list_of(slot) != Some(list) {
            self.move_to_front(slot, list);
        }
    }

    /// The list the node is on (`None` if it was removed).
    #[must_use]
    pub fn list_of(&self, slot: LruSlot) -> Option<LruList> {
        self.nodes.get(slot.0 as usize).and_then(|n| n.list)
    }

    /// The key of a live node.
    #[must_use]
    pub fn key(&self, slot: LruSlot) -> Option<LruKey> {
        self.nodes
            .get(slot.0 as usize)
            .filter(|n| n.list.is_some())
            .map(|n| n.key)
    }

    /// The least recently used node of `list`.
    #[must_use]
    pub fn oldest(&self, list: LruList) -> Option<(LruSlot, LruKey)> {
        let b = self.ends[list as usize].back;
        (b != NIL).then(|| (LruSlot(b), self.nodes[b as usize].key))
    }

    /// Keys on `list`, most recent first (O(length of that list)).
    pub fn keys(&self, list: LruList) -> impl Iterator<Item = LruKey> + '_ {
        let mut i = self.ends[list as usize].front;
        std::iter::from_fn(move || {
            (i != NIL).then(|| {
                let n = &self.nodes[i as usize];
                i = n.next;
                n.key
            })
        })
    }

    fn link_front(&mut self, i: u32, list: LruList) {
        let e = &mut self.ends[list as usize];
        let old = e.front;
        e.front = i;
        if old == NIL {
            e.back = i;
        }
        e.len += 1;
        if old != NIL {
            self.nodes[old as usize].prev = i;
        }
        let n = &mut self.nodes[i as usize];
        n.prev = NIL;
        n.next = old;
        n.list = Some(list);
    }

    fn unlink(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        let list = n.list.expect("unlinking a live node");
        if n.prev == NIL {
            self.ends[list as usize].front = n.next;
        } else {
            self.nodes[n.prev as usize].next = n.next;
        }
        if n.next == NIL {
            self.ends[list as usize].back = n.prev;
        } else {
            self.nodes[n.next as usize].prev = n.prev;
        }
        self.ends[list as usize].len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    const ALL: [LruList; 3] = [LruList::Clean, LruList::Dirty, LruList::Writeback];

    /// Random operations against a model of three deques.
    #[test]
    fn matches_a_model_of_three_deques() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut lists = LruLists::new();
        let mut model: [VecDeque<LruKey>; 3] = Default::default();
        let mut live: Vec<(LruSlot, LruKey)> = Vec::new();
        for step in 0..20_000u64 {
            let list = ALL[rnd(3) as usize];
            match rnd(5) {
                0 | 1 => {
                    let key = (rnd(8), step);
                    let slot = lists.insert(list, key);
                    model[list as usize].push_front(key);
                    live.push((slot, key));
                }
                2 if !live.is_empty() => {
                    let (slot, key) = live.swap_remove(rnd(live.len() as u64) as usize);
                    assert_eq!(lists.key(slot), Some(key));
                    lists.remove(slot);
                    assert_eq!(lists.key(slot), None);
                    for m in &mut model {
                        m.retain(|k| *k != key);
                    }
                }
                3 if !live.is_empty() => {
                    let (slot, key) = live[rnd(live.len() as u64) as usize];
                    lists.move_to_front(slot, list);
                    for m in &mut model {
                        m.retain(|k| *k != key);
                    }
                    model[list as usize].push_front(key);
                }
                _ if !live.is_empty() => {
                    let (slot, key) = live[rnd(live.len() as u64) as usize];
                    let was = lists.list_of(slot).expect("live");
                    lists.set_list(slot, list);
                    if was != list {
                        model[was as usize].retain(|k| *k != key);
                        model[list as usize].push_front(key);
                    }
                }
                _ => {}
            }
            for l in ALL {
                let m = &model[l as usize];
                assert_eq!(lists.len(l), m.len());
                assert_eq!(lists.oldest(l).map(|o| o.1), m.back().copied());
                if step % 97 == 0 {
                    assert!(lists.keys(l).eq(m.iter().copied()), "order of {l:?}");
                }
            }
        }
    }
}

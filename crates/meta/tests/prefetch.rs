//! `Store::prefetch`: the pages a set of keys needs are read together, each once, and
//! later lookups of those keys read nothing while the `Prefetched` guard lives, even
//! when the cache cannot keep them; a damaged page is skipped by the read-ahead and
//! named by the lookup that needs it.

mod common;

use std::sync::Arc;

use common::*;
use stripefs_core::btree::tree::Items;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::{MetaError, Store};
use stripefs_target::{SimTarget, Target};

const KEYS: u64 = 6000;

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

/// `KEYS` inodes of 90 bytes, checkpointed; reopened cold with a cache of `pages`.
fn cold(pages: usize) -> (Arc<SimTarget>, Store) {
    let sim = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let store = Store::create(
        config(64),
        vec![Arc::clone(&sim) as Arc<dyn Target>],
        region(1),
    );
    for i in 0..KEYS {
        store.insert(inode(i), &[i as u8; 90]).unwrap();
    }
    store.checkpoint().unwrap();
    drop(store);
    let (store, _) = reopen(vec![Arc::clone(&sim) as Arc<dyn Target>], pages);
    (sim, store)
}

/// (leaves, branches) of the fs tree.
fn shape(store: &Store) -> (usize, usize) {
    let mut n = (0, 0);
    store
        .walk(TreeId::Fs, &mut |_, node| match node.items {
            Items::Leaf(_) => n.0 += 1,
            Items::Branch(_) => n.1 += 1,
        })
        .unwrap();
    n
}

#[test]
fn keys_read_ahead_are_found_without_reads_while_held() {
    // A cache of 64 pages, smaller than the tree: the guard holds what it cannot keep.
    let (_sim, store) = cold(64);
    let (leaves, branches) = shape(&store);
    assert!(leaves > 64, "{leaves} leaves: more than the cache holds");
    // Every other key, in a scattered order: every leaf is named.
    let keys: Vec<Key> = (0..KEYS).rev().step_by(2).map(inode).collect();
    let ahead = store.prefetch(&keys).unwrap();
    assert_eq!(
        ahead.pages_read,
        leaves + branches,
        "each page of the tree read once"
    );
    let before = store.stats().cache;
    for k in &keys {
        assert_eq!(store.get(k).unwrap().unwrap(), vec![k.object as u8; 90]);
    }
    let after = store.stats().cache;
    assert_eq!(
        after.reads - before.reads,
        0,
        "lookups of keys read ahead read nothing"
    );
    drop(ahead);
    assert_eq!(after.read_ahead, (leaves + branches) as u64);
}

#[test]
fn a_damaged_page_is_skipped_by_the_read_ahead_and_named_by_the_lookup() {
    let (sim, store) = cold(4096);
    let mut leaf = None;
    store
        .walk(TreeId::Fs, &mut |a, node| {
            if let (Items::Leaf(v), None) = (&node.items, leaf) {
                if v.key(0).object > 100 {
                    leaf = Some((a, v.key(0)));
                }
            }
        })
        .unwrap();
    let (addr, first) = leaf.unwrap();
    drop(store);
    sim.corrupt(addr.block.0 * 4096 + 700, 0x20);
    // Opened without a walk (a walk would meet the damaged page).
    let store = Store::open(
        config(4096),
        vec![Arc::clone(&sim) as Arc<dyn Target>],
        region(1),
    )
    .unwrap();
    let keys: Vec<Key> = (0..KEYS).map(inode).collect();
    let ahead = store.prefetch(&keys).unwrap();
    assert!(ahead.pages_read > 10, "the other pages are read ahead");
    let e = store.get(&first).unwrap_err();
    assert!(matches!(e, MetaError::Corrupted(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("block {}", addr.block.0)) && msg.contains("checksum mismatch"),
        "{msg}"
    );
    assert_eq!(store.get(&inode(0)).unwrap().unwrap(), vec![0u8; 90]);
    drop(ahead);
}

/// Two changes read ahead at once (decision 119: creates in two directories): the one
/// that finishes first releases only its own pages, and the other's lookups still read
/// nothing, though the cache cannot keep the pages. A page both read ahead is held until
/// both are done.
#[test]
fn one_guard_dropped_keeps_the_pages_another_holds() {
    let (_sim, store) = cold(64);
    let (leaves, _) = shape(&store);
    assert!(leaves > 64, "{leaves} leaves: more than the cache holds");
    let low: Vec<Key> = (0..KEYS / 2).map(inode).collect();
    let high: Vec<Key> = (KEYS / 2..KEYS).map(inode).collect();
    let a = store.prefetch(&low).unwrap();
    let b = store.prefetch(&high).unwrap();
    assert!(b.pages_read > 0, "the second guard read its own leaves");
    drop(b);
    // Fill the cache with the other half, pushing the first half's pages out of it.
    for k in &high {
        store.get(k).unwrap().unwrap();
    }
    let before = store.stats().cache;
    for k in &low {
        assert_eq!(store.get(k).unwrap().unwrap(), vec![k.object as u8; 90]);
    }
    assert_eq!(
        store.stats().cache.reads - before.reads,
        0,
        "the first guard's pages are still held after the second was dropped"
    );
    drop(a);
    // Shared holds, from a cold cache so that the first guard reads every page: the
    // second finds them all read ahead, and dropping the first keeps them for it.
    let (_sim, store) = cold(64);
    let all: Vec<Key> = (0..KEYS).step_by(7).map(inode).collect();
    let c = store.prefetch(&all).unwrap();
    let d = store.prefetch(&all).unwrap();
    assert_eq!(
        d.pages_read, 0,
        "the second read ahead finds the first's pages"
    );
    drop(c);
    for k in &high {
        store.get(k).unwrap().unwrap();
    }
    let before = store.stats().cache;
    for k in &all {
        store.get(k).unwrap().unwrap();
    }
    assert_eq!(
        store.stats().cache.reads - before.reads,
        0,
        "pages both guards hold stay until the last is dropped"
    );
    drop(d);
}

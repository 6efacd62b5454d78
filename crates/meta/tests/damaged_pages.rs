//! Damaged tree pages of every kind (leaf, branch; bit rot, a misdirected page) and
//! damaged root records are refused with an error naming the tree, the page and the
//! check, never a panic; a damaged newest root record falls back to the previous one.

mod common;

use std::sync::Arc;

use common::*;
use stripefs_core::btree::tree::Items;
use stripefs_core::btree::{Key, KeyKind, PageAddr, TreeId};
use stripefs_meta::{MetaError, Store};
use stripefs_target::{IoBuf, SimTarget, Target};

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

/// A store with 3000 inodes checkpointed (generation 1), then 500 of them changed and
/// checkpointed again (generation 2). Returns the target and the oracle of each.
fn build() -> (Arc<SimTarget>, Oracle, Oracle) {
    let sim = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let store = Store::create(
        config(64),
        vec![Arc::clone(&sim) as Arc<dyn Target>],
        region(1),
    );
    let mut oracle = Oracle::new();
    for i in 0..3000u64 {
        store.insert(inode(i), &[i as u8; 90]).unwrap();
        oracle.insert(inode(i), vec![i as u8; 90]);
    }
    store.checkpoint().unwrap();
    let first = oracle.clone();
    for i in (0..3000u64).step_by(6) {
        store.insert(inode(i), b"new").unwrap();
        oracle.insert(inode(i), b"new".to_vec());
    }
    store.checkpoint().unwrap();
    (sim, first, oracle)
}

/// (address, level, first key) of every fs-tree page.
fn pages(sim: &Arc<SimTarget>) -> Vec<(PageAddr, u8, Key)> {
    let (store, _) = reopen(vec![Arc::clone(sim) as Arc<dyn Target>], 64);
    let mut out = Vec::new();
    store
        .walk(TreeId::Fs, &mut |a, n| {
            let first = match &n.items {
                Items::Leaf(v) => v.key(0),
                Items::Branch(v) => v[1].0,
            };
            out.push((a, n.level, first));
        })
        .unwrap();
    out
}

fn open_cold(sim: &Arc<SimTarget>) -> Result<Store, MetaError> {
    Store::open(
        config(64),
        vec![Arc::clone(sim) as Arc<dyn Target>],
        region(1),
    )
}

fn expect_named(e: &MetaError, addr: PageAddr, check: &str) {
    let msg = e.to_string();
    let page = format!("tree fs at target 0 block {}", addr.block.0);
    assert!(matches!(e, MetaError::Corrupted(_)), "{msg}");
    assert!(msg.contains(&page) && msg.contains(check), "{msg}");
}

#[test]
fn bit_rot_in_a_leaf_or_a_branch_is_named() {
    for level in [0u8, 1] {
        let (sim, _, _) = build();
        let (addr, _, first) = *pages(&sim).iter().find(|p| p.1 == level).unwrap();
        sim.corrupt(addr.block.0 * 4096 + 700, 0x20);
        let store = open_cold(&sim).unwrap();
        let e = store.get(&first).unwrap_err();
        expect_named(&e, addr, "checksum mismatch");
        let e = store.walk(TreeId::Fs, &mut |_, _| {}).unwrap_err();
        expect_named(&e, addr, "checksum mismatch");
        let e = store
            .scan(TreeId::Fs, Key::MIN, None, usize::MAX)
            .unwrap_err();
        expect_named(&e, addr, "checksum mismatch");
    }
}

#[test]
fn a_misdirected_page_is_named() {
    let (sim, _, _) = build();
    let leaves: Vec<_> = pages(&sim).into_iter().filter(|p| p.1 == 0).collect();
    let (a, b) = (leaves[1], leaves[2]);
    let bytes = sim.read_sync(a.0.block.0 * 4096, 4096).unwrap();
    sim.write_sync(b.0.block.0 * 4096, IoBuf::from_slice(&bytes))
        .unwrap();
    sim.flush_sync().unwrap();
    let store = open_cold(&sim).unwrap();
    assert!(
        store.get(&a.2).unwrap().is_some(),
        "the page copied from is fine"
    );
    let e = store.get(&b.2).unwrap_err();
    expect_named(&e, b.0, "misdirected");
}

#[test]
fn a_damaged_root_record_falls_back_then_is_refused() {
    let (sim, first, second) = build();
    let (store, _) = reopen(vec![Arc::clone(&sim) as Arc<dyn Target>], 64);
    assert_eq!(contents(&store), second);
    drop(store);
    // Generation 2 is in slot 0 (offset 4096): damage it; generation 1 is intact.
    sim.corrupt(4096 + 100, 1);
    let (store, _) = reopen(vec![Arc::clone(&sim) as Arc<dyn Target>], 64);
    assert_eq!(store.durable_generation().0, 1);
    assert_eq!(contents(&store), first);
    drop(store);
    sim.corrupt(8192 + 40, 1);
    let e = open_cold(&sim).unwrap_err().to_string();
    assert!(
        e.contains("root records") && e.contains("neither slot"),
        "{e}"
    );
}

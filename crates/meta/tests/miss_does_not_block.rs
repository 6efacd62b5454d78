//! A cache miss in one subtree does not stall operations elsewhere: while the read of
//! one leaf is held at the device, lookups and inserts whose pages are cached complete
//! (no lock is held across a page read, `docs/design/metadata.md` invariant 4).

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use stripefs_core::btree::tree::Items;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::Store;
use stripefs_target::{GateTarget, IoOp, SimTarget, Target};

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

#[test]
fn a_miss_in_one_subtree_does_not_block_another() {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let store = Store::create(config(64), vec![Arc::clone(&sim)], region(1));
    for i in 0..2000 {
        store.insert(inode(i), &[i as u8; 100]).unwrap();
    }
    store.checkpoint().unwrap();
    drop(store);
    let gate = Arc::new(GateTarget::new(sim));
    let (store, _) = reopen(vec![Arc::clone(&gate) as Arc<dyn Target>], 1024);
    // The leaf holding inode 0.
    let mut leaf_of_0 = None;
    store
        .walk(TreeId::Fs, &mut |a, n| {
            if let Items::Leaf(v) = &n.items {
                if v.iter().any(|(k, _)| k == inode(0)) {
                    leaf_of_0 = Some(a);
                }
            }
        })
        .unwrap();
    let leaf = leaf_of_0.expect("inode 0 is in some leaf");
    // Warm the path to inode 1999 (root and branches are shared with inode 0's path).
    assert_eq!(
        store.get(&inode(1999)).unwrap(),
        Some(vec![1999u16 as u8; 100])
    );
    let held_at = leaf.block.0 * 4096;
    gate.hold_next(move |op| matches!(op, IoOp::Read { offset, .. } if *offset == held_at));
    let store = Arc::new(store);
    let blocked = {
        let store = Arc::clone(&store);
        thread::spawn(move || store.get(&inode(0)).unwrap())
    };
    assert!(
        gate.wait_held(Duration::from_secs(60)),
        "the leaf read was held"
    );
    // inode 0's lookup is now inside its page read. Others must not wait for it.
    let (tx, rx) = mpsc::channel();
    {
        let store = Arc::clone(&store);
        thread::spawn(move || {
            let got = store.get(&inode(1999)).unwrap();
            store.insert(inode(1998), b"changed").unwrap();
            let scanned = store
                .scan(TreeId::Fs, inode(1990), None, 100)
                .unwrap()
                .len();
            tx.send((got, scanned)).unwrap();
        });
    }
    let done = rx.recv_timeout(Duration::from_secs(20));
    let still_held = gate.is_holding();
    gate.release();
    let (got, scanned) = done.expect("a lookup elsewhere completed while the miss was held");
    assert!(still_held, "the held read was still in progress");
    assert_eq!(got, Some(vec![1999u16 as u8; 100]));
    assert_eq!(scanned, 10);
    assert_eq!(blocked.join().unwrap(), Some(vec![0; 100]));
    assert_eq!(store.get(&inode(1998)).unwrap(), Some(b"changed".to_vec()));
}

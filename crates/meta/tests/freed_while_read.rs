//! A page freed by one checkpoint and rewritten by the next while a lookup was reading
//! it (no lock is held across a page read) is not reported as corruption: the lookup
//! restarts from the root, which no longer reaches it, and finds the current value.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use stripefs_core::btree::tree::Items;
use stripefs_core::btree::{Key, KeyKind, PageAddr, TreeId};
use stripefs_core::{PhysBlock, TargetId};
use stripefs_meta::{MetaError, PageAlloc, Store};
use stripefs_target::{GateTarget, IoOp, SimTarget, Target};

/// Hands out the most recently freed page first, so a freed page is rewritten at once.
#[derive(Debug)]
struct Lifo(Mutex<(Vec<PageAddr>, u64)>);

impl PageAlloc for Lifo {
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError> {
        let mut s = self.0.lock().unwrap();
        Ok((0..n)
            .map(|_| {
                s.0.pop().unwrap_or_else(|| {
                    s.1 += 1;
                    PageAddr {
                        target: TargetId(0),
                        block: PhysBlock(s.1),
                    }
                })
            })
            .collect())
    }

    fn free(&self, pages: &[PageAddr]) {
        self.0.lock().unwrap().0.extend_from_slice(pages);
    }
}

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

#[test]
fn a_page_rewritten_during_its_read_is_not_corruption() {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let gate = Arc::new(GateTarget::new(sim));
    let alloc = Arc::new(Lifo(Mutex::new((Vec::new(), 15))));
    let targets = vec![Arc::clone(&gate) as Arc<dyn Target>];
    let store = Store::create(config(1024), targets.clone(), alloc.clone());
    for i in 0..2000 {
        store.insert(inode(i), &[1; 100]).unwrap();
    }
    store.checkpoint().unwrap();
    drop(store);
    let store = Arc::new(Store::open(config(1024), targets, alloc).unwrap());
    let mut leaf = None;
    store
        .walk(TreeId::Fs, &mut |a, n| {
            if matches!(&n.items, Items::Leaf(v) if v.key(0) == inode(0)) {
                leaf = Some(a);
            }
        })
        .unwrap();
    let leaf = leaf.expect("the first leaf");
    assert!(
        store.get(&inode(1999)).unwrap().is_some(),
        "warm the branches"
    );
    let held_at = leaf.block.0 * 4096;
    gate.hold_next(move |op| matches!(op, IoOp::Read { offset, .. } if *offset == held_at));
    let reader = {
        let store = Arc::clone(&store);
        thread::spawn(move || store.get(&inode(0)))
    };
    assert!(
        gate.wait_held(Duration::from_secs(60)),
        "the leaf read was held"
    );
    // While the read is held: change the leaf, checkpoint (the old leaf is freed), change
    // it again and checkpoint (the freed address is rewritten with a newer page).
    store.insert(inode(0), b"two").unwrap();
    store.checkpoint().unwrap();
    store.insert(inode(0), b"three").unwrap();
    store.checkpoint().unwrap();
    gate.release();
    let got = reader.join().unwrap();
    assert_eq!(got.unwrap(), Some(b"three".to_vec()));
}

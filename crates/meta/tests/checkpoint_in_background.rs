//! A checkpoint holds no lock that other operations need while it writes: with its
//! first page write held at the device, lookups, inserts, removes and scans on other
//! threads complete (changing pages of the frozen generation copies them). The
//! checkpoint then commits exactly the state at its freeze; the changes made meanwhile
//! are in the next one.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use stripefs_core::btree::TreeId;
use stripefs_meta::Store;
use stripefs_target::{GateTarget, IoOp, Rng, SimTarget, Target};

#[test]
fn changes_proceed_while_a_checkpoint_writes() {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let gate = Arc::new(GateTarget::new(Arc::clone(&sim)));
    let pages = region(1);
    let targets = vec![Arc::clone(&gate) as Arc<dyn Target>];
    let store = Arc::new(Store::create(config(64), targets, pages.clone()));
    let mut rng = Rng::new(11);
    let mut oracle = Oracle::new();
    for _ in 0..1500 {
        let (k, v) = (random_key(&mut rng, 300), random_value(&mut rng));
        store.insert(k, &v).unwrap();
        oracle.insert(k, v);
    }
    store.checkpoint().unwrap();
    for _ in 0..300 {
        let k = random_key(&mut rng, 300);
        store.remove(&k).unwrap();
        oracle.remove(&k);
    }
    let at_freeze = oracle.clone();
    gate.hold_next(|op| matches!(op, IoOp::Write { .. }));
    let ckpt = {
        let store = Arc::clone(&store);
        thread::spawn(move || store.checkpoint().unwrap())
    };
    assert!(
        gate.wait_held(Duration::from_secs(60)),
        "a page write was held"
    );
    // The checkpoint is inside its first page write. Change things meanwhile.
    let (tx, rx) = mpsc::channel();
    {
        let store = Arc::clone(&store);
        let mut oracle = oracle.clone();
        thread::spawn(move || {
            let mut rng = Rng::new(12);
            for _ in 0..800 {
                let k = random_key(&mut rng, 300);
                if rng.one_in(3) {
                    assert_eq!(store.remove(&k).unwrap(), oracle.remove(&k));
                } else {
                    let v = random_value(&mut rng);
                    assert_eq!(store.insert(k, &v).unwrap(), oracle.insert(k, v));
                }
                let q = random_key(&mut rng, 300);
                assert_eq!(store.get(&q).unwrap().as_ref(), oracle.get(&q));
            }
            assert_eq!(contents(&store), oracle);
            tx.send(oracle).unwrap();
        });
    }
    let changed = rx.recv_timeout(Duration::from_secs(60));
    let still_writing = gate.is_holding();
    gate.release();
    let changed = changed.expect("changes completed while the checkpoint was writing");
    assert!(still_writing);
    let g = ckpt.join().unwrap();
    assert_eq!(contents(&store), changed, "the live store has every change");
    // What is durable is the state at the freeze.
    let (reopened, _) = reopen(vec![Arc::clone(&sim)], 64);
    assert_eq!(reopened.durable_generation(), g);
    assert_eq!(contents(&reopened), at_freeze);
    drop(reopened);
    // The next checkpoint makes the changes durable.
    store.checkpoint().unwrap();
    let (reopened, _) = reopen(vec![sim], 64);
    assert_eq!(contents(&reopened), changed);
    // No page leaked or freed early while frozen pages were being copied.
    let mut reachable = 0;
    for t in TreeId::ALL {
        reopened.walk(t, &mut |_, _| reachable += 1).unwrap();
    }
    assert_eq!(pages.used(), reachable);
}

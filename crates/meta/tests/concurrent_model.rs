//! Threads changing disjoint key ranges while checkpoints run back to back, with a
//! cache small enough that misses are constant: every thread's view matches its own
//! oracle throughout, the final contents are the union, the reopened store holds what
//! the last checkpoint committed, and no page leaked.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use common::*;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::Store;
use stripefs_target::{Rng, SimTarget, Target};

const THREADS: u64 = 3;
const SPACE: u64 = 600;

fn worker(store: &Store, t: u64, steps: usize) -> Oracle {
    let mut rng = Rng::new(100 + t);
    let mut oracle = Oracle::new();
    for step in 0..steps {
        let mut k = random_key(&mut rng, SPACE);
        k.object += t * SPACE; // disjoint ranges
        if rng.one_in(3) {
            assert_eq!(
                store.remove(&k).unwrap(),
                oracle.remove(&k),
                "thread {t} step {step}"
            );
        } else {
            let v = random_value(&mut rng);
            assert_eq!(
                store.insert(k, &v).unwrap(),
                oracle.insert(k, v),
                "thread {t} step {step}"
            );
        }
        if step % 40 == 39 {
            // Checkpoints are serial: this one runs while the other threads change things.
            store.checkpoint().unwrap();
        }
        if rng.one_in(5) {
            let from = Key::new(t * SPACE + rng.below(SPACE), KeyKind::Inode, 0, 0);
            let end = (from.object + 5).min((t + 1) * SPACE);
            let to = Key::new(end, KeyKind::Inode, 0, 0);
            let got = store.scan(TreeId::Fs, from, Some(to), usize::MAX).unwrap();
            let tree = |k: &Key| KeyKind::from_code(k.kind).map(KeyKind::tree);
            let want: Vec<_> = oracle
                .range(from..to)
                .filter(|(k, _)| tree(k) == Some(TreeId::Fs))
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            assert_eq!(got, want, "thread {t} step {step}");
        }
    }
    oracle
}

#[test]
fn threads_and_checkpoints_together() {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let pages = region(1);
    let store = Arc::new(Store::create(
        config(24),
        vec![Arc::clone(&sim)],
        pages.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let checkpointer = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                store.checkpoint().unwrap();
                n += 1;
            }
            n
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(&store);
            thread::spawn(move || worker(&store, t, 2000))
        })
        .collect();
    let mut all = Oracle::new();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    let checkpoints = checkpointer.join().unwrap();
    let s = store.stats().cache;
    eprintln!("{checkpoints} checkpoints alongside; cache {s:?}");
    assert!(s.misses > 300, "the cache misses constantly: {s:?}");
    assert_eq!(contents(&store), all);
    store.checkpoint().unwrap();
    let (reopened, _) = reopen(vec![sim], 64);
    assert_eq!(contents(&reopened), all);
    let mut reachable = 0;
    for t in TreeId::ALL {
        reopened.walk(t, &mut |_, _| reachable += 1).unwrap();
    }
    assert_eq!(pages.used(), reachable, "no page leaked or freed early");
}

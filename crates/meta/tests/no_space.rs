//! A checkpoint that cannot get pages fails with `NoSpace` before anything is frozen
//! or written: the store is not poisoned, keeps every change, and the next checkpoint,
//! once pages are there, makes them durable (`docs/design/metadata.md`, "Failure cases").

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use stripefs_core::btree::page::PageAddr;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::region::RegionAlloc;
use stripefs_meta::{MetaError, PageAlloc, Store};
use stripefs_target::{SimTarget, Target};

/// A region allocator that refuses every allocation while `full` is set.
#[derive(Debug)]
struct Full {
    region: Arc<RegionAlloc>,
    full: AtomicBool,
}

impl PageAlloc for Full {
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError> {
        if self.full.load(Ordering::SeqCst) && n > 0 {
            return Err(MetaError::NoSpace(format!("{n} pages: the test says full")));
        }
        self.region.alloc(n)
    }

    fn free(&self, pages: &[PageAddr]) {
        self.region.free(pages);
    }
}

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

#[test]
fn no_pages_is_no_space_not_poison_and_the_next_checkpoint_commits() {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let pages = Arc::new(Full {
        region: region(1),
        full: AtomicBool::new(false),
    });
    let store = Store::create(config(64), vec![Arc::clone(&sim)], pages.clone());
    for i in 0..500 {
        store.insert(inode(i), &[1; 100]).unwrap();
    }
    let g1 = store.checkpoint().unwrap();
    for i in 500..1000 {
        store.insert(inode(i), &[2; 100]).unwrap();
    }
    let used_before = pages.region.used();
    pages.full.store(true, Ordering::SeqCst);
    let err = store.checkpoint().unwrap_err();
    assert!(matches!(err, MetaError::NoSpace(_)), "{err}");
    assert_eq!(
        pages.region.used(),
        used_before,
        "nothing kept from the attempt"
    );
    assert_eq!(store.durable_generation(), g1);
    // Not poisoned: reads and changes go on, and nothing was lost.
    assert_eq!(store.get(&inode(999)).unwrap(), Some(vec![2; 100]));
    store.insert(inode(1000), &[3; 100]).unwrap();
    pages.full.store(false, Ordering::SeqCst);
    let g2 = store.checkpoint().unwrap();
    assert!(g2 > g1);
    drop(store);
    let (reopened, _) = reopen(vec![sim], 64);
    assert_eq!(reopened.durable_generation(), g2);
    let n = reopened
        .scan(TreeId::Fs, inode(0), None, 2000)
        .unwrap()
        .len();
    assert_eq!(
        n, 1001,
        "every change of the failed attempt reached the next checkpoint"
    );
}

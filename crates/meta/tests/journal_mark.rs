//! The journal position a checkpoint covers travels in its root record: a reopened
//! store returns the mark of the last durable checkpoint, whichever slot it is in.

mod common;

use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::{JournalMark, Store};
use stripefs_target::{CrashMode, SimTarget, Target};

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

#[test]
fn a_reopened_store_returns_the_mark_of_its_last_checkpoint() {
    let sim = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let targets = || vec![Arc::clone(&sim) as Arc<dyn Target>];
    let store = Store::create(config(32), targets(), region(1));
    assert_eq!(store.journal_mark(), JournalMark::default());
    // Generations 1..=5 alternate between the two slots; each reopen must find the
    // newest mark, not the other slot's.
    for g in 1..=5u64 {
        store.insert(inode(g), &[g as u8; 40]).unwrap();
        let mark = JournalMark {
            tail: 1000 * g + 17,
            seq: 10 * g + 3,
        };
        assert_eq!(store.checkpoint_at(mark).unwrap().0, g);
        assert_eq!(store.journal_mark(), mark);
        sim.crash(CrashMode::KeepUnflushed);
        let (reopened, _) = reopen(targets(), 32);
        assert_eq!(reopened.journal_mark(), mark, "generation {g}");
        assert_eq!(reopened.get(&inode(g)).unwrap(), Some(vec![g as u8; 40]));
    }
    // checkpoint() keeps the mark it has.
    let kept = store.journal_mark();
    store.insert(inode(99), b"x").unwrap();
    store.checkpoint().unwrap();
    drop(store);
    let (reopened, _) = reopen(targets(), 32);
    assert_eq!(reopened.journal_mark(), kept);
    assert_eq!(reopened.get(&inode(99)).unwrap(), Some(b"x".to_vec()));
}

#[test]
fn dirty_bytes_count_the_pages_the_next_checkpoint_writes() {
    let sim = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let store = Store::create(config(64), vec![sim as Arc<dyn Target>], region(1));
    // New trees: each one's empty root leaf is dirty.
    assert_eq!(store.dirty_bytes(), TreeId::ALL.len() * PAGE);
    store.checkpoint().unwrap();
    assert_eq!(store.dirty_bytes(), 0);
    for i in 0..500u64 {
        store.insert(inode(i), &[1; 100]).unwrap();
    }
    let dirty = store.dirty_bytes();
    assert!(
        dirty >= 2 * PAGE,
        "500 items of 100 bytes span pages: {dirty}"
    );
    assert_eq!(dirty % PAGE, 0);
    assert_eq!(store.stats().pinned_bytes, dirty);
    store.checkpoint().unwrap();
    assert_eq!(store.dirty_bytes(), 0);
}

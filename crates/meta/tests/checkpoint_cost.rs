//! A checkpoint writes the pages dirtied since the last one, not the tree: after one
//! changed key it writes one path (root level + 1 pages) and the root record, whether
//! the tree holds 2,000 or 40,000 items; after nothing changed, only the root record.

mod common;

use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::Store;
use stripefs_target::{SimStats, SimTarget, Target};

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

#[test]
fn checkpoint_work_is_proportional_to_what_changed() {
    for n in [2_000u64, 40_000] {
        let sim = Arc::new(SimTarget::new("t", 16 * TARGET_BYTES, SECTOR));
        let pages = Arc::new(stripefs_meta::region::RegionAlloc::new(1, 16, 1, 15_000));
        let store = Store::create(
            config(256),
            vec![Arc::clone(&sim) as Arc<dyn Target>],
            pages,
        );
        for i in 0..n {
            store.insert(inode(i), &[3; 100]).unwrap();
        }
        store.checkpoint().unwrap();
        let full = sim.stats();
        let level = store
            .stats()
            .trees
            .iter()
            .find(|t| t.0 == TreeId::Fs)
            .unwrap()
            .1;
        store.insert(inode(n / 2), b"changed").unwrap();
        store.checkpoint().unwrap();
        let one = sim.stats();
        assert_eq!(
            page_bytes(one) - page_bytes(full),
            (u64::from(level) + 1) * PAGE as u64,
            "{n} items, root level {level}"
        );
        assert_eq!(one.fua_writes - full.fua_writes, 1, "one root record");
        assert_eq!(
            one.flushes - full.flushes,
            1,
            "one flush of the one target written"
        );
        store.checkpoint().unwrap();
        let none = sim.stats();
        assert_eq!(
            none.writes - one.writes,
            1,
            "{n} items: nothing changed, only the root record"
        );
        assert!(
            page_bytes(full) > 40 * u64::from(level) * PAGE as u64,
            "the first wrote the tree"
        );
    }
}

/// Bytes of tree pages written: everything but the root records (one sector each).
fn page_bytes(s: SimStats) -> u64 {
    s.write_bytes - s.fua_writes * u64::from(SECTOR)
}

/// Address-adjacent pages go out as one vectored write each run, not one write per page:
/// a checkpoint of a few thousand pages from one contiguous region costs a handful of
/// target writes (the simulated target still keeps each page as its own unflushed
/// write, so the crash tests tear and reorder them page by page).
#[test]
fn adjacent_pages_go_out_in_few_writes() {
    let sim = Arc::new(SimTarget::new("t", 16 * TARGET_BYTES, SECTOR));
    let pages = Arc::new(stripefs_meta::region::RegionAlloc::new(1, 16, 1, 15_000));
    let store = Store::create(
        config(256),
        vec![Arc::clone(&sim) as Arc<dyn Target>],
        pages,
    );
    for i in 0..40_000 {
        store.insert(inode(i), &[3; 100]).unwrap();
    }
    store.checkpoint().unwrap();
    let s = sim.stats();
    let written = page_bytes(s) / PAGE as u64;
    let writes = s.writes - s.fua_writes;
    assert!(written > 1_000, "{written} pages");
    assert!(
        writes * 50 < written,
        "{written} adjacent pages took {writes} writes"
    );
    // The pages read back as the tree.
    drop(store);
    let (store, _) = reopen(vec![sim as Arc<dyn Target>], 256);
    assert_eq!(store.get(&inode(39_999)).unwrap(), Some(vec![3; 100]));
}

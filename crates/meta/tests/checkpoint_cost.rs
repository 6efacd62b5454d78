//! A checkpoint writes the pages dirtied since the last one, not the tree: after one
//! changed key it writes one path (root level + 1 pages) and the root record, whether
//! the tree holds 2,000 or 40,000 items; after nothing changed, only the root record.

mod common;

use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Key, KeyKind, TreeId};
use stripefs_meta::Store;
use stripefs_target::{SimTarget, Target};

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
        let page_writes = one.writes - one.fua_writes - (full.writes - full.fua_writes);
        assert_eq!(
            page_writes,
            u64::from(level) + 1,
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
            full.writes - full.fua_writes > 40 * u64::from(level),
            "the first wrote the tree"
        );
    }
}

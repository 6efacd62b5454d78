//! `Store::checkpoint_pages`, what the file system's metadata admission must find free,
//! covers every page a checkpoint allocates: its tree pages and its page log's.
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Key, KeyKind, PageAddr};
use stripefs_core::TargetId;
use stripefs_meta::region::RegionAlloc;
use stripefs_meta::{space, MetaError, PageAlloc, SpaceBooks, Store};
use stripefs_target::{SimTarget, Target};

const SLOTS: u64 = 900;
const FIRST: u64 = 16;

/// The region allocator, with the most pages ever outstanding since `reset`.
#[derive(Debug)]
struct Peak {
    inner: Arc<RegionAlloc>,
    out: AtomicUsize,
    peak: AtomicUsize,
}

impl Peak {
    fn reset(&self) {
        self.out.store(0, Ordering::SeqCst);
        self.peak.store(0, Ordering::SeqCst);
    }
}

impl PageAlloc for Peak {
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError> {
        let a = self.inner.alloc(n)?;
        let now = self.out.fetch_add(a.len(), Ordering::SeqCst) + a.len();
        self.peak.fetch_max(now, Ordering::SeqCst);
        Ok(a)
    }

    fn free(&self, pages: &[PageAddr]) {
        self.out.fetch_sub(pages.len(), Ordering::SeqCst);
        self.inner.free(pages);
    }
}

fn value(i: u64, round: u8) -> Vec<u8> {
    let mut v = vec![round; 100];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

#[test]
fn the_pages_a_checkpoint_allocates_include_its_page_log() {
    let targets: Vec<Arc<dyn Target>> = (0..2)
        .map(|i| Arc::new(SimTarget::new(&format!("t{i}"), TARGET_BYTES, SECTOR)) as _)
        .collect();
    let alloc = Arc::new(Peak {
        inner: Arc::new(RegionAlloc::new(2, FIRST, 1, SLOTS)),
        out: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
    });
    let cfg = stripefs_meta::StoreConfig {
        space: SpaceBooks::Kept,
        ..config(4096)
    };
    let store = Store::create(cfg, targets, alloc.clone());
    // The space tree holds the region as free: page allocations are taken from it.
    let runs: Vec<_> = (0..2).map(|t| (TargetId(t), FIRST, SLOTS)).collect();
    space::init(&store, &runs).unwrap();
    store.checkpoint().unwrap();
    // Three generations: the last one changes every leaf of the second (each dirty page
    // supersedes one), so its log has two entries per page and spans several pages.
    const KEYS: u64 = 10_000;
    for round in 1..=3u8 {
        for i in 0..KEYS {
            store
                .insert(Key::new(1 + i, KeyKind::Inode, 0, 0), &value(i, round))
                .unwrap();
        }
        // The last generation's log is folded into the space tree, as the file
        // system's applier does before each transaction.
        store.fold_pending().unwrap();
        let predicted = store.checkpoint_pages(0);
        let pinned = store.dirty_bytes() / PAGE;
        alloc.reset();
        store.checkpoint().unwrap();
        let peak = alloc.peak.load(Ordering::SeqCst);
        assert!(
            peak <= predicted,
            "round {round}: the checkpoint held {peak} new pages at its peak ({pinned} tree \
             pages), but checkpoint_pages counted {predicted}"
        );
        assert!(
            predicted <= peak + 1,
            "round {round}: checkpoint_pages counted {predicted}, the checkpoint took {peak}"
        );
        if round == 3 {
            assert!(
                peak >= pinned + 3,
                "a log of several pages: {peak} for {pinned}"
            );
        }
    }
}

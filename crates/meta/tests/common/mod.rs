//! Shared set-up of the store tests: simulated targets, a configuration, an oracle.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use stripefs_core::btree::{Key, KeyKind, PageSize, TreeId};
use stripefs_core::{BlockSize, TargetId, Uuid};
use stripefs_meta::region::RegionAlloc;
use stripefs_meta::{RootSlots, Store, StoreConfig};
use stripefs_target::{Recorder, RecordingTarget, Rng, SimTarget, Target};

pub const UUID: Uuid = Uuid([0x5a; 16]);
pub const TARGET_BYTES: u64 = 4 << 20;
pub const SECTOR: u32 = 512;
pub const PAGE: usize = 4096;

pub type Oracle = BTreeMap<Key, Vec<u8>>;

pub fn config(cache_pages: usize) -> StoreConfig {
    StoreConfig {
        uuid: UUID,
        page_size: PageSize::DEFAULT,
        block_size: BlockSize::new(4096).expect("block size"),
        cache_bytes: cache_pages * PAGE,
        slots: RootSlots {
            target: TargetId(0),
            offsets: [4096, 8192],
        },
        space: stripefs_meta::SpaceBooks::Off,
    }
}

/// `count` simulated targets of `bytes` each, every write and flush logged in `recorder`.
pub fn recording_targets(count: u32, bytes: u64, recorder: &Arc<Recorder>) -> Vec<Arc<dyn Target>> {
    (0..count)
        .map(|i| {
            let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", bytes, SECTOR));
            Arc::new(RecordingTarget::new(sim, i, Arc::clone(recorder))) as Arc<dyn Target>
        })
        .collect()
}

/// Pages from block 16 on, round robin over `targets` targets.
pub fn region(targets: u32) -> Arc<RegionAlloc> {
    Arc::new(RegionAlloc::new(targets, 16, 1, 1000))
}

/// Opens the store on `targets` and rebuilds its allocator from what the trees reach.
pub fn reopen(targets: Vec<Arc<dyn Target>>, cache_pages: usize) -> (Store, Arc<RegionAlloc>) {
    let alloc = region(targets.len() as u32);
    let store = Store::open(config(cache_pages), targets, alloc.clone()).expect("open");
    for t in TreeId::ALL {
        store.walk(t, &mut |a, _| alloc.mark_used(a)).expect("walk");
    }
    (store, alloc)
}

pub fn random_key(rng: &mut Rng, space: u64) -> Key {
    let kinds = [
        KeyKind::Inode,
        KeyKind::DirEntry,
        KeyKind::Extent,
        KeyKind::FreeSpace,
    ];
    let kind = kinds[rng.below(4) as usize];
    Key::new(rng.below(space), kind, rng.below(3), 0)
}

pub fn random_value(rng: &mut Rng) -> Vec<u8> {
    let len = if rng.one_in(8) {
        rng.below(960)
    } else {
        rng.below(200)
    };
    let mut v = vec![0u8; len as usize];
    rng.fill(&mut v);
    v
}

/// Every item of every tree, in tree order then key order.
pub fn contents(store: &Store) -> Oracle {
    let mut out = Oracle::new();
    for t in TreeId::ALL {
        out.extend(store.scan(t, Key::MIN, None, usize::MAX).expect("scan"));
    }
    out
}

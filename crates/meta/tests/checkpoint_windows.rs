//! A checkpoint larger than one write window (decision 128): its pages are flushed window
//! by window, and a crash at any flush point, or with its unflushed writes torn and
//! reordered, leaves the previous checkpoint or this one, never a mixture.

mod common;

use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Generation, Key, KeyKind};
use stripefs_meta::region::RegionAlloc;
use stripefs_meta::Store;
use stripefs_target::{Event, Recorder, SimTarget, Target, UnflushedPolicy};

/// Room for two generations of a few thousand pages on each of two targets.
const BIG_TARGET: u64 = 32 << 20;
/// Items of about 900 bytes: four to a leaf, so this many make well over the 1,024
/// pages of one write window.
const ITEMS: u64 = 6000;

fn region() -> Arc<RegionAlloc> {
    Arc::new(RegionAlloc::new(2, 16, 1, 7000))
}

fn open_images(images: Vec<Vec<u8>>) -> Result<(Store, Generation), stripefs_meta::MetaError> {
    let targets: Vec<Arc<dyn Target>> = images
        .into_iter()
        .map(|img| Arc::new(SimTarget::from_image("t", img, SECTOR)) as Arc<dyn Target>)
        .collect();
    let store = Store::open(config(256), targets, region())?;
    let g = store.durable_generation();
    Ok((store, g))
}

fn value(i: u64) -> Vec<u8> {
    (0..900u64).map(|j| (i * 31 + j) as u8).collect()
}

#[test]
fn a_checkpoint_of_many_windows_is_flushed_by_window_and_survives_a_crash_at_each() {
    let recorder = Recorder::new();
    let targets = recording_targets(2, BIG_TARGET, &recorder);
    let store = Store::create(config(64), targets, region());
    let mut small = Oracle::new();
    for i in 0..10 {
        let k = Key::new(i, KeyKind::Inode, 0, 0);
        store.insert(k, &value(i)).unwrap();
        small.insert(k, value(i));
    }
    let g1 = store.checkpoint().expect("small checkpoint");
    let root1 = recorder.events().len() - 1;
    let mut big = small.clone();
    for i in 10..ITEMS {
        let k = Key::new(i, KeyKind::Inode, 0, 0);
        store.insert(k, &value(i)).unwrap();
        big.insert(k, value(i));
    }
    let g2 = store.checkpoint().expect("big checkpoint");
    let events = recorder.events();
    let root2 = events.len() - 1;
    let ckpt = &events[root1 + 1..root2];
    let pages: usize = ckpt
        .iter()
        .map(|e| match e {
            Event::Write { data, .. } => data.len() / PAGE,
            _ => 0,
        })
        .sum();
    assert!(pages > 1024, "the checkpoint spans windows: {pages} pages");
    let first_flush = ckpt.iter().position(|e| matches!(e, Event::Flush { .. }));
    let last_write = ckpt.iter().rposition(|e| matches!(e, Event::Write { .. }));
    assert!(
        first_flush.is_some_and(|f| last_write.is_some_and(|w| f < w)),
        "a window is flushed before the next is written (first flush {first_flush:?}, \
         last write {last_write:?}, {pages} pages)"
    );
    drop(store);

    let initial = vec![vec![0u8; BIG_TARGET as usize]; 2];
    let points = recorder.durability_points();
    let mut checked = 0;
    for &at in points.iter().filter(|&&p| p >= root1) {
        for policy in [
            UnflushedPolicy::Drop,
            UnflushedPolicy::Tear { seed: at as u64 },
        ] {
            let images = recorder.images_at(&initial, at + 1, policy, SECTOR as usize);
            let (store, g) = open_images(images).expect("a durable root record");
            let (want_g, want) = if at >= root2 {
                (g2, &big)
            } else {
                (g1, &small)
            };
            assert_eq!(g, want_g, "crash after event {at} ({policy:?})");
            assert!(
                contents(&store) == *want,
                "crash after event {at} ({policy:?}): contents of {g:?}"
            );
            checked += 1;
        }
    }
    eprintln!("{checked} crash images checked");
    assert!(checked >= 8, "{checked} crash images checked");
}

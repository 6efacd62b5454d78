//! Guards the order of a `RefcountSet`'s item changes (`refcount.rs`, "Readers while a
//! record is applied"): the file system reads counts from the `refcount` tree with no
//! lock while the checkpointer applies records, so a reader of a block outside the
//! record's range must never see a wrong count. Before, splitting `[0, 10)` count 2 by
//! setting `[5, 6)` to 1 rewrote key 0 as `[0, 5)` before inserting key 6, and a reader
//! of block 8 in between found count 1.
//!
//! A writer sets random counts on "hot" ranges of many regions (splitting, trimming,
//! extending and merging the fixed entries around them, with checkpoints and a small
//! cache so pages are read and rewritten), while readers look up the fixed blocks with
//! `refcount::shared` and compare with the counts they never stop having.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use common::*;
use stripefs_core::record::Record;
use stripefs_core::TargetId;
use stripefs_meta::{items, refcount, Store};
use stripefs_target::{Rng, SimTarget, Target};

const T: TargetId = TargetId(0);
const REGIONS: u64 = 150;
const STRIDE: u64 = 64;
/// Ranges of each region the writer changes (offsets from the region's base): inside an
/// entry (split), at its edges (trim, extend, merge), across two entries, past the end.
const HOT: [(u64, u64); 6] = [(5, 6), (10, 13), (19, 21), (29, 31), (36, 38), (0, 1)];

/// The count every block not in a hot range keeps: `[1, 20)` 2, `[21, 29)` 3, `[31, 36)`
/// 2, the rest 1.
fn fixed(off: u64) -> u32 {
    match off {
        1..=19 => 2,
        21..=28 => 3,
        31..=35 => 2,
        _ => 1,
    }
}

fn is_hot(off: u64) -> bool {
    HOT.iter().any(|&(s, e)| (s..e).contains(&off))
}

fn set(store: &Store, phys: u64, len: u64, count: u32) {
    let rec = Record::RefcountSet {
        target: T,
        phys,
        len,
        count,
    };
    items::apply_record(store, &rec).expect("apply");
}

#[test]
fn readers_outside_a_changing_range_see_exact_counts() {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let store = Arc::new(Store::create(config(64), vec![sim], region(1)));
    for r in 0..REGIONS {
        let base = r * STRIDE;
        for off in 0..STRIDE {
            let c = if is_hot(off) { 2 } else { fixed(off) };
            if c >= 2 {
                set(&store, base + off, 1, c);
            }
        }
    }
    store.checkpoint().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2u64)
        .map(|i| {
            let (store, stop, reads) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&reads));
            thread::spawn(move || {
                let mut rng = Rng::new(7 + i);
                while !stop.load(Ordering::Relaxed) {
                    let base = rng.below(REGIONS) * STRIDE;
                    // A run of fixed blocks: one block, or all between two hot ranges.
                    let mut off = rng.below(STRIDE);
                    while is_hot(off) {
                        off = (off + 1) % STRIDE;
                    }
                    let mut end = off + 1;
                    if rng.one_in(2) {
                        while end < STRIDE && !is_hot(end) {
                            end += 1;
                        }
                    }
                    let got = refcount::shared(&store, T, base + off, base + end).unwrap();
                    for b in off..end {
                        let c = got
                            .iter()
                            .find(|(s, e)| (*s..s + e.len).contains(&(base + b)))
                            .map_or(1, |(_, e)| e.count);
                        assert_eq!(
                            c,
                            fixed(b),
                            "block {} (region offset {b}) read as {:?}",
                            base + b,
                            got
                        );
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut rng = Rng::new(3);
    let started = std::time::Instant::now();
    let mut records = 0u64;
    while started.elapsed() < std::time::Duration::from_secs(3) || records < 20_000 {
        if readers.iter().any(thread::JoinHandle::is_finished) {
            break; // a reader failed: its panic is reported below
        }
        let base = rng.below(REGIONS) * STRIDE;
        let (s, e) = HOT[rng.below(HOT.len() as u64) as usize];
        let count = [1, 2, 3, 4][rng.below(4) as usize];
        set(&store, base + s, e - s, count);
        records += 1;
        if records.is_multiple_of(500) {
            store.checkpoint().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader saw a wrong count");
    }
    assert!(
        reads.load(Ordering::Relaxed) > 1000,
        "readers ran {} lookups",
        reads.load(Ordering::Relaxed)
    );
    // What the readers relied on also holds at rest: the fixed blocks kept their counts.
    for r in 0..REGIONS {
        let base = r * STRIDE;
        let got = refcount::shared(&store, T, base, base + STRIDE).unwrap();
        for off in (0..STRIDE).filter(|o| !is_hot(*o)) {
            let c = got
                .iter()
                .find(|(s, e)| (*s..s + e.len).contains(&(base + off)))
                .map_or(1, |(_, e)| e.count);
            assert_eq!(c, fixed(off), "block {} at rest", base + off);
        }
    }
    eprintln!(
        "{records} records applied, {} lookups",
        reads.load(Ordering::Relaxed)
    );
}

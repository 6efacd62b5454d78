//! Dirty throttling (`balance_dirty`): under `DirtyThrottle::Wait` a writer over the
//! dirty limit leaves the writing to background writeback and only waits; it writes its
//! own file back when nobody else brings the total down within the bound, and at once
//! under `DirtyThrottle::Write`. Which thread wrote is read from the mapping calls the
//! writeback made.

mod common;

use common::Linear;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use stripefs_iomap::cache::{CacheConfig, DirtyThrottle, Flusher, PageCache, THROTTLE_WAIT_BOUND};
use stripefs_iomap::{self as iomap, IomapOp, WbWait, ZeroMode};
use stripefs_target::SimTarget;

const BS: u64 = 4096;
const FOLIO: u64 = 64 << 10;
const LIMIT: u64 = 1 << 20;
const FILE: u64 = 2 * LIMIT;

/// A cache and a file of `FILE` dirty bytes (twice the dirty limit), with the threads that
/// mapped blocks for writeback recorded.
fn over_the_limit(
    throttle: DirtyThrottle,
) -> (PageCache, Linear<SimTarget>, Arc<Mutex<Vec<ThreadId>>>) {
    let cache = PageCache::new(
        CacheConfig {
            folio_bytes: FOLIO as u32,
            budget_bytes: 4 * FILE,
            dirty_limit_bytes: LIMIT,
            dirty_throttle: throttle,
            ..CacheConfig::default()
        },
        BS as u32,
    );
    let writers = Arc::new(Mutex::new(Vec::new()));
    let mut fs = Linear::new(SimTarget::new("dev", FILE, 512), BS, 1 << 20);
    let seen = Arc::clone(&writers);
    fs.before_map = Some(Box::new(move |_, op| {
        if op == IomapOp::Writeback {
            seen.lock().unwrap().push(std::thread::current().id());
        }
    }));
    let fc = cache.file(1);
    let data = vec![b'd'; FILE as usize];
    assert_eq!(
        iomap::write(&cache, &fs, &fc, 0, &data, ZeroMode::Cache).unwrap(),
        data.len()
    );
    assert!(cache.over_dirty_limit());
    (cache, fs, writers)
}

#[test]
fn a_waiting_writer_leaves_writeback_to_the_flusher() {
    let (cache, fs, writers) = over_the_limit(DirtyThrottle::Wait);
    let fc = cache.file(1);
    let flusher = std::thread::scope(|s| {
        let flusher = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::SkipBusy).unwrap();
            std::thread::current().id()
        });
        iomap::balance_dirty(&cache, &fs, &fc, Flusher::Running).unwrap();
        assert!(
            !cache.over_dirty_limit(),
            "the writer went on over the limit"
        );
        flusher.join().expect("flusher")
    });
    let w = writers.lock().unwrap();
    assert!(!w.is_empty(), "nothing was written back");
    assert!(
        w.iter().all(|&t| t == flusher),
        "the throttled writer wrote back itself"
    );
}

#[test]
fn a_waiting_writer_with_nobody_writing_back_writes_its_own_file() {
    let (cache, fs, writers) = over_the_limit(DirtyThrottle::Wait);
    let fc = cache.file(1);
    let t = Instant::now();
    // A flusher is said to run, but none writes: the writer must not wait forever.
    iomap::balance_dirty(&cache, &fs, &fc, Flusher::Running).unwrap();
    assert!(
        t.elapsed() >= THROTTLE_WAIT_BOUND,
        "it waited for the bound first"
    );
    assert!(!cache.over_dirty_limit());
    let me = std::thread::current().id();
    assert!(writers.lock().unwrap().contains(&me));
}

/// The writer writes back itself, without waiting first, under `Write` and whenever no
/// flusher runs.
fn writes_its_own_file_at_once(throttle: DirtyThrottle, flusher: Flusher) {
    let (cache, fs, writers) = over_the_limit(throttle);
    let fc = cache.file(1);
    let t = Instant::now();
    iomap::balance_dirty(&cache, &fs, &fc, flusher).unwrap();
    assert!(
        t.elapsed() < THROTTLE_WAIT_BOUND,
        "{throttle:?}, {flusher:?}: it waited first"
    );
    assert!(!cache.over_dirty_limit());
    let me = std::thread::current().id();
    assert!(writers.lock().unwrap().contains(&me));
}

#[test]
fn a_writing_writer_writes_its_own_file_at_once() {
    writes_its_own_file_at_once(DirtyThrottle::Write, Flusher::Running);
    writes_its_own_file_at_once(DirtyThrottle::Write, Flusher::Absent);
}

#[test]
fn without_a_flusher_a_waiting_writer_writes_its_own_file_at_once() {
    writes_its_own_file_at_once(DirtyThrottle::Wait, Flusher::Absent);
}

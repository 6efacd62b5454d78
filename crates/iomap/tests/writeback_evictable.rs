//! A long writeback pass holds only the batch it is writing: a folio written early in the
//! pass is evictable as soon as its batch completed, so a writer allocating folios
//! meanwhile evicts it instead of scanning past it and growing the cache over its budget.
//!
//! Found in a 1 GiB sequential buffered write (`scripts/bench-seq`): the pass held every
//! folio of the file from its start, reclaim skipped 160,000 held clean folios, the cache
//! went 50 MiB over its budget and 4,600 folio buffers were allocated afresh (zeroed and
//! faulted in) instead of recycled.

mod common;

use common::Linear;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use stripefs_iomap::cache::{CacheConfig, PageCache, WbDepth};
use stripefs_iomap::{self as iomap, IomapOp, WbWait, ZeroMode, WRITEBACK_BATCH_BYTES};
use stripefs_target::SimTarget;

const BS: u64 = 4096;
const FOLIO: u64 = 64 << 10;
/// The file: one whole writeback batch and one more MiB, so the pass has a second batch.
const FILE: u64 = WRITEBACK_BATCH_BYTES + (1 << 20);
const BUDGET: u64 = FILE + (8 << 20);

/// Where the writeback pass stands: `parked` once it maps its second batch (the first
/// completed), until the test sets `go`.
#[derive(Default)]
struct Gate {
    parked: bool,
    go: bool,
}

#[test]
fn folios_of_a_completed_batch_are_evictable_during_the_pass() {
    let cache = PageCache::new(
        CacheConfig {
            folio_bytes: FOLIO as u32,
            budget_bytes: BUDGET,
            dirty_limit_bytes: BUDGET / 2,
            writeback_depth: WbDepth(1),
            ..CacheConfig::default()
        },
        BS as u32,
    );
    let gate = Arc::new((Mutex::new(Gate::default()), Condvar::new()));
    let mut fs = Linear::new(SimTarget::new("dev", FILE, 512), BS, 1 << 20);
    let hook = Arc::clone(&gate);
    fs.before_map = Some(Box::new(move |pos, op| {
        if op != IomapOp::Writeback || pos < WRITEBACK_BATCH_BYTES {
            return;
        }
        let (m, cv) = &*hook;
        let mut g = m.lock().unwrap();
        g.parked = true;
        cv.notify_all();
        let (g, t) = cv
            .wait_timeout_while(g, Duration::from_secs(20), |g| !g.go)
            .unwrap();
        assert!(!t.timed_out() && g.go, "the test never let writeback go on");
    }));
    let fc = cache.file(1);
    let data = vec![b'w'; FILE as usize];
    assert_eq!(
        iomap::write(&cache, &fs, &fc, 0, &data, ZeroMode::Cache).unwrap(),
        data.len()
    );
    assert_eq!(cache.stats().dirty_bytes, FILE);
    let other = cache.file(2);
    std::thread::scope(|s| {
        let wb = s.spawn(|| iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy));
        {
            let (m, cv) = &*gate;
            let g = m.lock().unwrap();
            let (g, t) = cv
                .wait_timeout_while(g, Duration::from_secs(20), |g| !g.parked)
                .unwrap();
            assert!(
                !t.timed_out() && g.parked,
                "writeback never reached its second batch"
            );
        }
        // The first batch is on the device and clean; a writer needing 16 MiB of new
        // folios now must evict it rather than grow the cache.
        let before = cache.stats();
        for i in 0..(16 << 20) / FOLIO {
            drop(cache.folio(&other, i * FOLIO, FOLIO));
        }
        let st = cache.stats();
        let first_cached = fc.get(0).is_some();
        // Let the pass finish before judging, so a failure does not strand it.
        let (m, cv) = &*gate;
        m.lock().unwrap().go = true;
        cv.notify_all();
        wb.join().expect("writeback thread").expect("writeback");
        let evicted = st.evicted_folios - before.evicted_folios;
        let scanned = st.reclaim_scanned - before.reclaim_scanned;
        assert!(evicted > 0, "nothing was evicted");
        assert!(
            !first_cached,
            "the oldest folio, written by the completed batch, is still cached"
        );
        assert!(
            st.peak_resident_bytes <= BUDGET,
            "the cache grew to {} bytes over a budget of {BUDGET}",
            st.peak_resident_bytes
        );
        assert!(
            scanned <= evicted + 32,
            "{scanned} folios scanned for {evicted} evicted: held clean folios were skipped"
        );
    });
    assert_eq!(cache.stats().dirty_bytes, 0);
    assert!(
        fs.dev.live_image() == data[..],
        "the device holds what was written"
    );
}

/// A writer appending as fast as the pass writes must not keep it going: the pass ends
/// where the cache ended when it began (the reviewer's reproducer: an appender kept a
/// `Busy` writeback of 256 KiB running until it had written 1 GiB).
#[test]
fn a_pass_ends_where_the_cache_ended_when_it_began() {
    const APPENDS: u64 = 1000;
    let cache = Arc::new(PageCache::new(
        CacheConfig {
            folio_bytes: FOLIO as u32,
            writeback_depth: WbDepth(1),
            ..CacheConfig::default()
        },
        BS as u32,
    ));
    let fc = cache.file(1);
    let dev = 4 << 20;
    let mut fs = Linear::new(SimTarget::new("dev", dev, 512), BS, FOLIO);
    let maps = Arc::new(Mutex::new(0u64));
    let (c, f, n) = (Arc::clone(&cache), Arc::clone(&fc), Arc::clone(&maps));
    // Every mapping the pass makes, an appender dirties one more folio past the end.
    fs.before_map = Some(Box::new(move |_, op| {
        if op != IomapOp::Writeback {
            return;
        }
        let mut n = n.lock().unwrap();
        *n += 1;
        if *n <= APPENDS {
            let at = (*n * FOLIO) % dev;
            let cell = c.folio(&f, at, FOLIO);
            let mut g = cell.lock();
            g.set_uptodate(0, (FOLIO / BS) as u32);
            c.set_dirty(&mut g, 0, (FOLIO / BS) as u32);
        }
    }));
    fs.size.store(dev, std::sync::atomic::Ordering::SeqCst);
    let data = vec![b'a'; FOLIO as usize];
    assert_eq!(
        iomap::write(&cache, &fs, &fc, 0, &data, ZeroMode::Cache).unwrap(),
        data.len()
    );
    iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
    let n = *maps.lock().unwrap();
    assert_eq!(
        n, 1,
        "the pass mapped {n} times: it chased folios appended after it began"
    );
    assert!(!fc.block_dirty(&cache, 0), "what was dirty is written");
    assert!(
        fc.block_dirty(&cache, FOLIO),
        "the appended folio waits for the next pass"
    );
}

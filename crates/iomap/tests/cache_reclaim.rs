//! Reclaim cost: evicting a clean folio must not cost more with more files (or more dirty
//! folios) in the cache. Counted with the cache's own `reclaim_scanned` statistic (folios
//! reclaim looked at), so the test is exact and independent of machine speed.

use stripefs_iomap::cache::{CacheConfig, PageCache};

const BS: u32 = 4096;
const B: u64 = BS as u64;

fn cache() -> PageCache {
    PageCache::new(
        CacheConfig {
            folio_bytes: BS,
            budget_bytes: 1 << 20, // 256 folios
            dirty_limit_bytes: 256 << 10,
            ..CacheConfig::default()
        },
        BS,
    )
}

/// `files` files with one dirty folio each, then a reader streaming `reads` clean folios
/// of another file through the cache. Returns folios scanned per folio evicted.
fn scanned_per_eviction(files: u64, reads: u64) -> f64 {
    let cache = cache();
    for k in 1..=files {
        let fc = cache.file(k);
        let cell = cache.folio(&fc, 0, B);
        let mut g = cell.lock();
        g.set_uptodate(0, 1);
        assert_eq!(cache.set_dirty(&mut g, 0, 1), 1);
    }
    let reader = cache.file(0);
    for i in 0..reads {
        let cell = cache.folio(&reader, i * B, B);
        let mut g = cell.lock();
        g.set_uptodate(0, 1);
        cache.touch(&g);
    }
    let st = cache.stats();
    assert_eq!(
        st.dirty_bytes,
        files * u64::from(BS),
        "dirty folios are never evicted"
    );
    assert_eq!(st.dirty_folios, files);
    assert!(st.evicted_folios > 0, "the reader went past the budget");
    eprintln!(
        "{files} dirty files: {} evicted, {} scanned",
        st.evicted_folios, st.reclaim_scanned
    );
    st.reclaim_scanned as f64 / st.evicted_folios as f64
}

#[test]
fn eviction_cost_does_not_grow_with_cached_files() {
    let few = scanned_per_eviction(100, 2000);
    let many = scanned_per_eviction(10_000, 2000);
    assert!(few <= 1.5, "100 files: {few} folios scanned per eviction");
    assert!(
        many <= 1.5,
        "10,000 files: {many} folios scanned per eviction (reclaim visits dirty folios)"
    );
}

#[test]
fn folios_in_use_are_skipped_a_bounded_number_of_times() {
    let cache = cache();
    let fc = cache.file(1);
    // 512 clean folios held by their users: twice the budget, none evictable.
    let held: Vec<_> = (0..512).map(|i| cache.folio(&fc, i * B, B)).collect();
    let before = cache.stats().reclaim_scanned;
    for i in 512..612 {
        drop(cache.folio(&fc, i * B, B));
    }
    let scanned = cache.stats().reclaim_scanned - before;
    assert!(
        scanned <= 100 * 33,
        "{scanned} folios scanned for 100 new folios"
    );
    drop(held);
}

#[test]
fn the_least_recently_used_clean_folio_goes_first() {
    let cache = cache();
    let fc = cache.file(1);
    for i in 0..200 {
        drop(cache.folio(&fc, i * B, B));
    }
    // Folio 0 is used again; folio 1 is now the oldest.
    let cell = fc.get(0).expect("cached");
    cache.touch(&cell.lock());
    drop(cell);
    for i in 200..280 {
        drop(cache.folio(&fc, i * B, B));
    }
    assert!(cache.stats().evicted_folios > 0);
    assert!(fc.get(0).is_some(), "the folio used again stays");
    assert!(fc.get(B).is_none(), "the oldest unused folio went");
}

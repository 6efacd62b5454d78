//! A checkpoint holds its pages decoded once (the frozen nodes, which the cache keeps
//! afterwards) and encoded at most a window's worth (the write buffers in flight): what
//! the process holds while it runs grows by less than the page bytes it writes, however
//! many they are. Measured with a counting global allocator (alone in this test binary,
//! so no other test's allocations are counted), on a sparse file target (a simulated
//! target would keep every written page in memory).
//!
//! Before this bound a checkpoint copied every frozen leaf into a second decoded node,
//! encoded every page into its own buffer and copied each into a write buffer: three
//! copies of everything it wrote at once (BENCHMARKS.md, "where the memory goes").

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Key, KeyKind};
use stripefs_meta::region::RegionAlloc;
use stripefs_meta::Store;
use stripefs_target::{FileTarget, FileTargetOptions, Target};

/// Counts the bytes the process holds and the most it held since the last reset.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = HELD.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments; only counters
// are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System::alloc`'s.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(p, l) };
        HELD.fetch_sub(l.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: as `alloc`.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            HELD.fetch_sub(l.size(), Ordering::Relaxed);
            grew(new);
        }
        q
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const MIB: usize = 1 << 20;

#[test]
fn a_checkpoint_holds_less_than_one_copy_of_what_it_writes() {
    let dir = std::env::temp_dir().join(format!("stripefs-ckpt-mem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let opts = FileTargetOptions {
        create_size: Some(1 << 30),
        ..FileTargetOptions::default()
    };
    let target: Arc<dyn Target> =
        Arc::new(FileTarget::open(&dir.join("t0"), opts).expect("target"));
    // Room for every page: the test measures the checkpoint, not eviction.
    let pages = Arc::new(RegionAlloc::new(1, 16, 1, 200_000));
    let store = Store::create(config(64 * 1024), vec![target], pages);
    // Small values, as the file system's inodes and entries are: a decoded leaf takes
    // more memory than its page.
    for i in 0..200_000u64 {
        store
            .insert(Key::new(i, KeyKind::Inode, 0, 0), &[7; 40])
            .unwrap();
    }
    let written = store.dirty_bytes();
    assert!(written > 16 * MIB, "{written} bytes of pages to write");

    let base = HELD.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    store.checkpoint().expect("checkpoint");
    let growth = PEAK.load(Ordering::Relaxed) - base;
    let after = store.stats();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "checkpoint of {} KiB of pages held {} KiB more at most; {} clean pages cached",
        written >> 10,
        growth >> 10,
        after.cache.pages
    );
    assert!(
        after.cache.pages * PAGE >= written,
        "the written pages stay cached"
    );
    // The write window (4 MiB of encoded pages) and the plan's branch copies and maps:
    // a fraction of the pages written, where three copies of them were held before.
    assert!(
        growth < written / 2,
        "the checkpoint held {growth} bytes more while writing {written} bytes of pages"
    );
}

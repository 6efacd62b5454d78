//! A directory entry added to a directory of n entries reads O(log n) pages: with the
//! directory's items on disk and a cache far smaller than them, each `DirAdd` costs a
//! few descents (the directory's inode, the entries of one name hash, the highest
//! cookie, the two inserts), whether the directory holds 1,000 or 10,000 entries.

mod common;

use std::sync::Arc;

use common::{config, SECTOR};
use stripefs_core::btree::TreeId;
use stripefs_core::inode::{FileKind, InodeAttrs, Timespec};
use stripefs_core::layout::StripeLayout;
use stripefs_core::record::Record;
use stripefs_core::Ino;
use stripefs_meta::items::{apply_record, load_state};
use stripefs_meta::region::RegionAlloc;
use stripefs_meta::Store;
use stripefs_target::{SimTarget, Target};

const PAGES: u64 = 3000;
const ADDS: u64 = 50;
/// Pages of cache while measuring: a small fraction of the directory's leaves.
const CACHE: usize = 16;

fn dir() -> Record {
    Record::InodeSet(InodeAttrs {
        ino: Ino::ROOT,
        kind: FileKind::Directory,
        perm: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        size: 0,
        atime: Timespec::default(),
        mtime: Timespec::default(),
        ctime: Timespec::default(),
        crtime: Timespec::default(),
        rdev: 0,
        parent: Ino::ROOT,
        layout: StripeLayout {
            count: 0,
            unit_bytes: 0,
            first_target: 0,
        },
        flags: 0,
    })
}

fn add(i: u64) -> Record {
    Record::DirAdd {
        dir: Ino::ROOT,
        name: format!("file-{i:06}").into_bytes(),
        ino: Ino(i + 2),
        kind: FileKind::Regular,
    }
}

/// Page reads per `DirAdd` into a directory of `n` entries, and the fs tree's root level.
fn reads_per_add(n: u64) -> (f64, u8) {
    let sim = Arc::new(SimTarget::new("t", (PAGES + 32) * 4096, SECTOR));
    let target: Arc<dyn Target> = Arc::clone(&sim) as Arc<dyn Target>;
    let store = Store::create(
        config(PAGES as usize),
        vec![Arc::clone(&target)],
        Arc::new(RegionAlloc::new(1, 16, 1, PAGES)),
    );
    apply_record(&store, &dir()).unwrap();
    for i in 0..n {
        apply_record(&store, &add(i)).unwrap();
    }
    store.checkpoint().unwrap();
    let alloc = Arc::new(RegionAlloc::new(1, 16, 1, PAGES));
    let store = Store::open(config(CACHE), vec![target], alloc.clone()).unwrap();
    for t in TreeId::ALL {
        store.walk(t, &mut |a, _| alloc.mark_used(a)).unwrap();
    }
    let level = store.stats().trees[0].1;
    let before = sim.stats().reads;
    for i in n..n + ADDS {
        apply_record(&store, &add(i)).unwrap();
    }
    let reads = sim.stats().reads - before;
    let entries = load_state(&store).unwrap().inodes[&Ino::ROOT].entries.len();
    assert_eq!(entries as u64, n + ADDS);
    (reads as f64 / ADDS as f64, level)
}

#[test]
fn dir_add_reads_a_few_paths_not_the_directory() {
    let (small, small_level) = reads_per_add(1_000);
    let (big, big_level) = reads_per_add(10_000);
    eprintln!(
        "page reads per DirAdd: {small:.2} at 1,000 entries (root level {small_level}), \
         {big:.2} at 10,000 (root level {big_level})"
    );
    // Four descents at most (inode, hash entries, cookie, inserts), each root level + 1.
    let bound = |level: u8| 4.0 * f64::from(level + 1);
    assert!(
        small <= bound(small_level),
        "{small} reads at 1,000 entries"
    );
    assert!(big <= bound(big_level), "{big} reads at 10,000 entries");
    // Ten times the entries: one more level at most, not ten times the reads.
    assert!(
        big <= small + 4.0 * f64::from(big_level - small_level) + 1.0,
        "{small} reads at 1,000 entries, {big} at 10,000"
    );
}

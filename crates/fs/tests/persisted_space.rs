//! Persisted free space (`docs/design/metadata.md`, "Persisted free space"): mount reads
//! the space tree's free runs and one page log, not every page of the trees; a damaged
//! page log or space-tree page is refused naming it. (Every crash test compares the
//! persisted free space with the complement of extents and pages through fsck.)

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use stripefs::{CreateParams, Fs, Ino, MetaCacheBytes, MountOptions};
use stripefs_core::btree::{PageAddr, TreeId};
use stripefs_core::geometry::Geometry;
use stripefs_meta::{RootSlots, SpaceBooks, Store, StoreConfig};
use stripefs_target::{Completion, IoOp, SimTarget, Target, TargetInfo};

/// Records reads of one page's length in the data area (where pages and page log blocks
/// live; the superblock, root slots and journal are before it): (target, byte offset).
#[derive(Debug)]
struct PageReads {
    inner: Arc<SimTarget>,
    index: u32,
    page: usize,
    data_start: u64,
    reads: Arc<Mutex<Vec<(u32, u64)>>>,
}

impl Target for PageReads {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: IoOp, done: Completion) {
        if let IoOp::Read { offset, .. } = &op {
            if op.len() == self.page as u64 && *offset >= self.data_start {
                self.reads.lock().unwrap().push((self.index, *offset));
            }
        }
        self.inner.submit(op, done);
    }
}

/// Opens the durable trees of `s` read-only.
fn open_store(s: &[Arc<SimTarget>], geo: &Geometry) -> Store {
    let cfg = StoreConfig {
        uuid: geo.uuid,
        page_size: geo.page_size(),
        block_size: geo.block_size,
        cache_bytes: 1 << 20,
        slots: RootSlots {
            target: stripefs_core::TargetId(0),
            offsets: geo.root_slot_offsets(),
        },
        space: SpaceBooks::Kept,
    };
    // Only read: the allocator is never asked for a page.
    let alloc = Arc::new(stripefs_meta::region::RegionAlloc::new(1, 0, 1, 0));
    Store::open(cfg, dyns(s), alloc).expect("open the trees")
}

/// Every page of every tree of the durable root record.
fn tree_pages(store: &Store) -> Vec<(TreeId, PageAddr)> {
    let mut out = Vec::new();
    for tree in TreeId::ALL {
        store
            .walk(tree, &mut |at, _| out.push((tree, at)))
            .expect("walk");
    }
    out
}

/// A file system of `files` empty files in a few directories, cleanly unmounted.
fn many_files(files: usize) -> (Vec<Arc<SimTarget>>, Geometry) {
    let s = sims(2, 64 << 20);
    let fs = fresh(&s, 4096, 16384);
    let dirs: Vec<Ino> = (0..4)
        .map(|d| {
            fs.mkdir(
                Ino::ROOT,
                format!("d{d}").as_ref(),
                CreateParams::with_perm(0o755),
            )
            .unwrap()
            .ino
        })
        .collect();
    for i in 0..files {
        let name = format!("file-with-a-longer-name-{i:06}");
        fs.create(dirs[i % 4], name.as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
    }
    let geo = fs.geometry().clone();
    fs.unmount().unwrap();
    (s, geo)
}

/// Mount reads a small part of the trees, and no page just to find the free space: the
/// root of the (empty) checksum tree, which nothing at mount needs, is never read (the
/// stage-1 walk of every tree read it and every other page). The refcount tree is
/// scanned once, each page read once: the runtime holds the index of shared ranges
/// whole (`docs/design/reflink.md`, a documented limit).
#[test]
fn mount_does_not_walk_every_tree_page() {
    let (s, geo) = many_files(4000);
    let store = open_store(&s, &geo);
    let pages = tree_pages(&store);
    let log = store.log_blocks().len();
    drop(store);
    let fs_pages = pages.iter().filter(|(t, _)| *t == TreeId::Fs).count();
    assert!(fs_pages > 150, "the fs tree has {fs_pages} pages");
    let reads = Arc::new(Mutex::new(Vec::new()));
    let page = geo.page_size().bytes();
    let counted: Vec<Arc<dyn Target>> = s
        .iter()
        .zip(&geo.targets)
        .enumerate()
        .map(|(i, (t, g))| {
            Arc::new(PageReads {
                inner: Arc::clone(t),
                index: i as u32,
                page,
                data_start: geo.block_size.to_bytes(g.data_start),
                reads: Arc::clone(&reads),
            }) as Arc<dyn Target>
        })
        .collect();
    let opts = MountOptions {
        meta_cache: MetaCacheBytes(MetaCacheBytes::MIN_PAGES * page as u64),
        ..quiet()
    };
    let (fs, _) = Fs::mount(counted, opts).expect("mount");
    let reads = std::mem::take(&mut *reads.lock().unwrap());
    let read = |at: &PageAddr| {
        let off = geo.block_size.to_bytes(at.block.0);
        reads.iter().filter(|r| **r == (at.target.0, off)).count()
    };
    for (tree, at) in pages.iter() {
        match tree {
            TreeId::Csum => assert_eq!(read(at), 0, "mount read the root of tree {tree} at {at}"),
            TreeId::Refcount => assert!(read(at) <= 1, "mount read page {at} of tree {tree} twice"),
            _ => {}
        }
    }
    // Mount loads no inode and walks no tree: what it reads is the page log, the space
    // tree's free runs, the counter and the orphans (6 of 438 pages when this was written).
    assert!(
        reads.len() * 4 < pages.len(),
        "mount read {} pages; the trees have {} and the page log {log}",
        reads.len(),
        pages.len()
    );
    drop(fs);
}

/// A mount and unmount that change nothing write no new generation: reading the free
/// space applies the pending page log in memory and dirties no page.
#[test]
fn a_mount_that_changes_nothing_writes_no_generation() {
    let (s, geo) = many_files(10);
    let before = open_store(&s, &geo).durable_generation();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    fs.unmount().unwrap();
    assert_eq!(open_store(&s, &geo).durable_generation(), before);
}

fn mount_err(s: &[Arc<SimTarget>]) -> String {
    match Fs::mount(dyns(s), quiet()) {
        Ok(_) => panic!("mount of a damaged file system succeeded"),
        Err(e) => e.to_string(),
    }
}

fn fsck_says(s: &[Arc<SimTarget>]) -> String {
    match stripefs::fsck::fsck(dyns(s), &mut |_| {}) {
        Ok(r) if !r.is_clean() => r.problems.join("; "),
        Ok(_) => panic!("fsck found a damaged file system clean"),
        Err(e) => e.to_string(),
    }
}

fn copy(s: &[Arc<SimTarget>]) -> Vec<Arc<SimTarget>> {
    s.iter()
        .enumerate()
        .map(|(i, t)| {
            Arc::new(SimTarget::from_image(
                &format!("c{i}"),
                t.durable_image(),
                512,
            ))
        })
        .collect()
}

/// Every block of the page log, damaged anywhere: mount and fsck refuse, naming the log,
/// its generation and the block; nothing panics.
#[test]
fn a_damaged_page_log_is_refused_naming_it() {
    let (s, geo) = many_files(300);
    let store = open_store(&s, &geo);
    let g = store.durable_generation();
    let log = store.log_blocks();
    drop(store);
    assert!(!log.is_empty());
    for (i, at) in log.iter().enumerate() {
        for at_byte in [9u64, 44, 100, 4000] {
            let c = copy(&s);
            let off = geo.block_size.to_bytes(at.block.0) + at_byte;
            c[at.target.index()].corrupt(off, 0x04);
            let want = format!("page log of generation {g}, block {i} at {at}");
            for msg in [mount_err(&c), fsck_says(&c)] {
                assert!(msg.contains(&want), "byte {at_byte}: {msg}");
            }
        }
    }
}

/// A damaged page of the space tree: mount refuses naming the tree and the page.
#[test]
fn a_damaged_space_tree_page_is_refused_naming_it() {
    let (s, geo) = many_files(300);
    let pages = tree_pages(&open_store(&s, &geo));
    let space: Vec<PageAddr> = pages
        .iter()
        .filter(|(t, _)| *t == TreeId::Space)
        .map(|(_, a)| *a)
        .collect();
    assert!(!space.is_empty());
    for at in space {
        let c = copy(&s);
        c[at.target.index()].corrupt(geo.block_size.to_bytes(at.block.0) + 200, 0x20);
        let msg = mount_err(&c);
        assert!(
            msg.contains("space") && msg.contains(&at.to_string()),
            "{msg}"
        );
    }
}

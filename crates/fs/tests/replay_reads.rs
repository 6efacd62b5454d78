//! Replay's page reads after a crash (decisions.md, 79): the records of a full journal
//! name inodes spread over the whole fs tree; replay reads their pages ahead, many in
//! flight and each once, instead of one synchronous read per record.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{
    CreateParams, FileKind, Fs, Ino, MetaCacheBytes, MkfsOptions, MountOptions, SetAttr,
};
use stripefs_target::{Rng, SimTarget};

const FILES: u64 = 6000;
const TARGET_BYTES: u64 = 64 << 20;

/// Pages replay may still read one at a time: what the read-ahead keys do not predict
/// (none of a `chmod`'s), and the mount's own reads around the replay (its counter and
/// orphan index, the page log's fold into the space tree before its checkpoint). Each is
/// a handful; the records number `FILES`.
const ONE_AT_A_TIME: u64 = 24;

/// A file system whose journal holds a `chmod` of each of `FILES` files, in a random
/// order, with no checkpoint since they were created: the durable images of a crash
/// right after the last `sync`.
fn crashed_with_chmods() -> Vec<Vec<u8>> {
    let s = sims(2, TARGET_BYTES);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 4096,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).unwrap();
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let mut inos: Vec<Ino> = (0..FILES)
        .map(|n| {
            fs.mknod(
                d,
                format!("f{n}").as_ref(),
                FileKind::Fifo,
                CreateParams::with_perm(0o644),
            )
            .unwrap()
            .ino
        })
        .collect();
    fs.unmount().unwrap();

    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let mut rng = Rng::new(79);
    for i in (1..inos.len()).rev() {
        inos.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for (n, ino) in inos.iter().enumerate() {
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        fs.setattr(*ino, &set).unwrap();
        if n % 500 == 499 {
            fs.sync().unwrap();
        }
    }
    fs.sync().unwrap();
    let st = fs.status();
    assert_eq!(
        st.checkpoints, 0,
        "no checkpoint since the mount: the journal holds every chmod"
    );
    std::mem::forget(fs); // a crash: no unmount
    s.iter().map(|t| t.durable_image()).collect()
}

fn targets(images: &[Vec<u8>]) -> Vec<Arc<SimTarget>> {
    images
        .iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("sim{i}"), img.clone(), 512)))
        .collect()
}

/// Mounts the crashed images with `meta_cache`; returns what the store read during the
/// mount (one at a time, read ahead), the tree pages, and the target reads.
fn replay(images: &[Vec<u8>], meta_cache: u64) -> (u64, u64, u64, u64) {
    let s = targets(images);
    let opts = MountOptions {
        meta_cache: MetaCacheBytes(meta_cache),
        ..quiet()
    };
    let (fs, report) = Fs::mount(dyns(&s), opts.clone()).unwrap();
    assert!(
        report.replayed_records >= FILES,
        "replayed {} records",
        report.replayed_records
    );
    // The checks keep at most the in-core inode bound from one window to the next
    // (decisions.md, 121 and 135), plus one window's inodes (a quarter of the cache's
    // pages in keys, at least 256, past which the transaction that crossed it still
    // joins: at most the 500 chmods between two syncs), not every inode the journal
    // names: with the smallest cache, 1,024 (the derived bound's floor) + 256 + 500 of
    // the 6,000.
    let window = (meta_cache / 4096 / 4).max(256);
    let keep = opts.inode_bound().0 as u64;
    assert!(
        report.replay_peak_inodes <= keep + window + 500,
        "cache {meta_cache}: replay held {} inodes at once for a window of {window} keys \
         and a bound of {keep} inodes",
        report.replay_peak_inodes
    );
    let st = fs.status();
    let target_reads = s.iter().map(|t| t.stats().reads).sum();
    let pages = st.meta_page_blocks;
    fs.unmount().unwrap();
    (
        st.meta_cache.reads,
        st.meta_cache.read_ahead,
        pages,
        target_reads,
    )
}

#[test]
fn replay_reads_each_page_once_with_many_in_flight() {
    let images = crashed_with_chmods();
    // A cache that holds every page, and the smallest one (64 pages), which the pages
    // the replay dirties overflow: the read-ahead must hold its window's pages itself.
    for cache in [64 << 20, 64 * 4096] {
        let (one, ahead, pages, target_reads) = replay(&images, cache);
        assert!(
            one <= ONE_AT_A_TIME,
            "cache {cache}: replay of {FILES} chmods read {one} pages one at a time \
             ({ahead} read ahead)"
        );
        // Every inode leaf was named: the read-ahead reads them, each once (the small
        // cache re-reads the branch levels once per window).
        let fs_leaves_at_least = FILES / 40;
        assert!(
            ahead >= fs_leaves_at_least,
            "cache {cache}: {ahead} pages read ahead, fewer than the leaves named"
        );
        let slack = if cache == 64 << 20 { 0 } else { pages / 4 };
        assert!(
            one + ahead <= pages + slack,
            "cache {cache}: {} page reads for {pages} tree pages: some read more than once",
            one + ahead
        );
        // The targets saw no more than the pages plus the journal and the mount's own
        // reads (superblocks, root slots, page log): 8 here, the journal in one read of
        // its window (decisions.md, 136; 33 when each transaction's header and body were
        // read apart and the search for later ones read 1 MiB at a time).
        assert!(
            target_reads <= one + ahead + 16,
            "cache {cache}: {target_reads} target reads for {} page reads",
            one + ahead
        );
    }
}

#[test]
fn replay_after_the_read_ahead_recovers_every_change() {
    let images = crashed_with_chmods();
    let s = targets(&images);
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let d = fs.lookup(Ino::ROOT, "d".as_ref()).unwrap().ino;
    for n in 0..FILES {
        let a = fs.lookup(d, format!("f{n}").as_ref()).unwrap();
        assert_eq!(a.mode & 0o777, 0o600, "f{n} lost its replayed chmod");
    }
    fs.unmount().unwrap();
}

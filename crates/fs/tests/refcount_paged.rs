//! Issue 12: the runtime must not hold the reference-count index whole in memory
//! (`docs/design/reflink.md`, "The runtime reads the index from the trees"). Before, mount
//! loaded every entry of the `refcount` tree into `MetaCore::refs` and kept them all for
//! the whole mount. Now only the count changes the trees do not hold yet stay in core
//! (`FsStatus::refcount_overlay_runs`): once a checkpoint applied thousands of shared
//! entries, none is in core, mount reads only the path to the first, and clones, copy-on-write writes and
//! unlinks over them, with a metadata cache far smaller than the index, still keep
//! every count exact and every file's data.
mod common;

use common::*;
use stripefs::{Fs, Ino, MetaCacheBytes, MountOptions, SyncScope};
use stripefs_core::btree::{PageAddr, TreeId};
use stripefs_meta::{RootSlots, Store, StoreConfig};

const BS: u64 = 4096;
/// Shared entries: every other block of a file cloned one block at a time, so no two
/// entries merge.
const SHARED: u64 = 3000;
/// The smallest metadata cache (64 pages): the refcount tree alone is larger.
const TINY: u64 = 64 * 4096;

fn check(fs: &Fs, files: &[(Ino, &Vec<u8>)], what: &str) {
    for (ino, want) in files {
        assert!(
            read_all(fs, *ino) == **want,
            "{what}: data of inode {}",
            ino.0
        );
    }
    fs.check_refcounts()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    fs.check_space_accounting()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

fn tiny() -> MountOptions {
    MountOptions {
        meta_cache: MetaCacheBytes(TINY),
        ..quiet()
    }
}

#[test]
fn applied_shared_entries_are_not_held_in_core_and_counts_stay_exact() {
    let s = sims(2, 64 << 20);
    let fs = fresh(&s, BS as u32, 64 << 10);
    let a = file(&fs, "a");
    let blocks = 2 * SHARED;
    let mut want_a = pattern(1, 0, (blocks * BS) as usize);
    fs.write_at(a, 0, &want_a).unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    let b = file(&fs, "b");
    let mut want_b = vec![0u8; ((blocks - 1) * BS) as usize];
    for k in 0..SHARED {
        let off = 2 * k * BS;
        fs.clone_range(a, off, b, off, BS).unwrap();
        let o = off as usize;
        want_b[o..o + BS as usize].copy_from_slice(&want_a[o..o + BS as usize]);
    }
    let before = fs.status().refcount_overlay_runs;
    fs.checkpoint().unwrap();
    let st = fs.status();
    eprintln!(
        "{SHARED} shared entries: overlay runs {before} before the checkpoint, {} after",
        st.refcount_overlay_runs
    );
    assert_eq!(st.refcount_overlay_runs, 0, "the trees hold every count");
    assert_eq!(fs.shared_blocks(), SHARED);
    check(&fs, &[(a, &want_a), (b, &want_b)], "after the clones");
    let leaves = refcount_leaves(&s, &fs).len();
    fs.unmount().unwrap();

    // A cache of 64 pages: the lookups below miss and read the refcount tree.
    let (fs, _) = Fs::mount(dyns(&s), tiny()).unwrap();
    let mount_reads = fs.status().meta_cache.reads;
    // The refcount tree alone has dozens of leaves here; mount used to read them all
    // (52 pages in all before, 5 now: the path to the first entry, "is anything shared?").
    assert!(
        mount_reads < 20,
        "mount read {mount_reads} pages: it must load no refcount entry"
    );
    assert_eq!(fs.status().refcount_overlay_runs, 0, "mount holds no count");
    let a = fs.lookup(Ino::ROOT, "a".as_ref()).unwrap().ino;
    let b = fs.lookup(Ino::ROOT, "b".as_ref()).unwrap().ino;
    // One direct copy on write of one shared block, first thing after mount: its count
    // lookup reads one path of the refcount tree. An index loaded whole on first use
    // would read every one of its leaves here.
    let r0 = fs.status().meta_cache.reads;
    let one = pattern(5, 4000 * BS, BS as usize);
    fs.write_direct(a, 4000 * BS, &one).unwrap();
    want_a[(4000 * BS) as usize..(4001 * BS) as usize].copy_from_slice(&one);
    let one_reads = fs.status().meta_cache.reads - r0;
    eprintln!(
        "one shared block written by copy on write: {one_reads} pages read; \
         the refcount tree has {leaves} leaves"
    );
    assert!(leaves >= 20, "the index spans {leaves} leaves");
    assert!(
        one_reads < 8,
        "one copy on write read {one_reads} pages of a {leaves}-leaf index: a path, not the index"
    );
    let reads_before = fs.status().meta_cache.reads;

    // Buffered copy on write into b over shared and unshared blocks.
    let w = pattern(2, 200 * BS + 100, (20 * BS) as usize);
    fs.write_at(b, 200 * BS + 100, &w).unwrap();
    want_b[(200 * BS + 100) as usize..(220 * BS + 100) as usize].copy_from_slice(&w);
    // Direct copy on write into a, whole blocks and a partial one.
    let d = pattern(3, 1000 * BS, (8 * BS) as usize);
    fs.write_direct(a, 1000 * BS, &d).unwrap();
    want_a[(1000 * BS) as usize..(1008 * BS) as usize].copy_from_slice(&d);
    let d = pattern(4, 3000 * BS + 512, 1024);
    fs.write_direct(a, 3000 * BS + 512, &d).unwrap();
    want_a[(3000 * BS + 512) as usize..(3000 * BS + 1536) as usize].copy_from_slice(&d);
    fs.sync().unwrap();
    check(&fs, &[(a, &want_a), (b, &want_b)], "after copy on write");
    // A third owner for part of them, then the first owner goes.
    let c = file(&fs, "c");
    fs.clone_range(a, 0, c, 0, 800 * BS).unwrap();
    let want_c = want_a[..(800 * BS) as usize].to_vec();
    fs.sync().unwrap();
    check(
        &fs,
        &[(a, &want_a), (b, &want_b), (c, &want_c)],
        "after a third owner",
    );
    let held = fs.status().refcount_overlay_runs;
    assert!(held > 0, "the clone's counts are not applied yet");
    fs.unlink(Ino::ROOT, "a".as_ref()).unwrap();
    fs.sync().unwrap();
    check(&fs, &[(b, &want_b), (c, &want_c)], "after unlinking a");
    let held_max = held.max(fs.status().refcount_overlay_runs);
    let reads = fs.status().meta_cache.reads - reads_before;
    fs.checkpoint().unwrap();
    assert_eq!(fs.status().refcount_overlay_runs, 0);
    check(&fs, &[(b, &want_b), (c, &want_c)], "after the checkpoint");
    eprintln!(
        "tiny cache: {mount_reads} pages read at mount, {reads} by the operations and their checks; \
         overlay at most {held_max} runs, 0 after the checkpoint; {} blocks shared",
        fs.shared_blocks()
    );
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

/// The leaves of the `refcount` tree of the durable root record, in key order.
fn refcount_leaves(s: &[std::sync::Arc<stripefs_target::SimTarget>], fs: &Fs) -> Vec<PageAddr> {
    let geo = fs.geometry().clone();
    let cfg = StoreConfig {
        uuid: geo.uuid,
        page_size: geo.page_size(),
        block_size: geo.block_size,
        cache_bytes: 1 << 20,
        slots: RootSlots {
            target: stripefs_core::TargetId(0),
            offsets: geo.root_slot_offsets(),
        },
        space: stripefs_meta::SpaceBooks::Kept,
    };
    // Only read: the allocator is never asked for a page.
    let alloc = std::sync::Arc::new(stripefs_meta::region::RegionAlloc::new(1, 0, 1, 0));
    let store = Store::open(cfg, dyns(s), alloc).unwrap();
    let mut out = Vec::new();
    store
        .walk(TreeId::Refcount, &mut |at, node| {
            if node.level == 0 {
                out.push(at);
            }
        })
        .unwrap();
    out
}

/// Mount used to load the whole index and refused any damaged `refcount` page; now it
/// reads only the path to the first entry (is anything shared at all?), and the first
/// lookup that needs a damaged leaf further on fails and shuts the file system down
/// (`FsInner::refs_ok`): a write must not trust counts it could not read.
#[test]
fn a_damaged_refcount_page_fails_the_lookup_that_reads_it_and_poisons() {
    let s = sims(2, 32 << 20);
    let fs = fresh(&s, BS as u32, 64 << 10);
    let a = file(&fs, "a");
    const ENTRIES: u64 = 600;
    fs.write_at(a, 0, &pattern(5, 0, (2 * ENTRIES * BS) as usize))
        .unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    let b = file(&fs, "b");
    for k in 0..ENTRIES {
        fs.clone_range(a, 2 * k * BS, b, 2 * k * BS, BS).unwrap();
    }
    fs.checkpoint().unwrap();
    let geo = fs.geometry().clone();
    fs.unmount().unwrap();
    let (probe, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let leaves = refcount_leaves(&s, &probe);
    probe.unmount().unwrap();
    assert!(leaves.len() >= 2, "{} leaves", leaves.len());
    let at = *leaves.last().expect("a leaf");
    s[at.target.index()].corrupt(at.block.0 * geo.block_size.bytes_u64() + 1000, 0x08);

    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount reads only the first path");
    let b = fs.lookup(Ino::ROOT, "b".as_ref()).unwrap().ino;
    // The write's mappings ask whether each block is shared (copy on write); some of
    // b's blocks have their counts in the damaged leaf. The write stops short at the
    // first block it cannot map; the next one reports why the file system shut down.
    let size = fs.getattr(b).unwrap().size;
    let data = pattern(6, 0, size as usize);
    let err = fs
        .write_at(b, 0, &data)
        .and_then(|n| fs.write_at(b, n as u64, &data[n..]))
        .expect_err("a write over blocks whose count cannot be read");
    let want = format!("metadata page of tree {} at {at}", TreeId::Refcount);
    assert!(err.to_string().contains(&want), "{err}");
    assert!(
        fs.is_poisoned(),
        "a count that could not be read shuts down"
    );
}

/// Two threads clone ranges of one source into files of their own, copy-on-write over
/// them, truncate and unlink them (every count change lands on the source's blocks, from
/// both threads), while the background checkpointer and a thread checkpointing back to
/// back apply the counts to the trees and a 64-page cache makes lookups read them: each thread's files read what it wrote, and
/// at the end the counts, the space books and fsck agree with the extent maps.
#[test]
fn clones_and_writes_racing_the_checkpointer_keep_counts_exact() {
    use std::sync::Arc;
    let s = sims(2, 64 << 20);
    let fs = fresh(&s, BS as u32, 64 << 10);
    let src = file(&fs, "src");
    const SRC_BLOCKS: u64 = 512;
    let want_src = pattern(7, 0, (SRC_BLOCKS * BS) as usize);
    fs.write_at(src, 0, &want_src).unwrap();
    fs.fsync(src, SyncScope::All).unwrap();
    fs.unmount().unwrap();
    let opts = MountOptions {
        checkpoints: stripefs::Checkpoints::Background,
        ..tiny()
    };
    let (fs, _) = Fs::mount(dyns(&s), opts).unwrap();
    let fs = Arc::new(fs);
    let src = fs.lookup(Ino::ROOT, "src".as_ref()).unwrap().ino;
    let want_src = Arc::new(want_src);
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let (fs, want_src) = (Arc::clone(&fs), Arc::clone(&want_src));
            std::thread::spawn(move || {
                let mut rng = stripefs_target::Rng::new(11 + w);
                for i in 0..150 {
                    let name = format!("w{w}-{i}");
                    let f = file(&fs, &name);
                    let first = rng.below(SRC_BLOCKS - 64);
                    let len = 1 + rng.below(64);
                    let at = rng.below(8);
                    fs.clone_range(src, first * BS, f, at * BS, len * BS)
                        .unwrap();
                    let mut want = vec![0u8; ((at + len) * BS) as usize];
                    want[(at * BS) as usize..].copy_from_slice(
                        &want_src[(first * BS) as usize..((first + len) * BS) as usize],
                    );
                    for _ in 0..3 {
                        let off = rng.below(want.len() as u64 - 100);
                        let n = 1 + rng.below(2 * BS).min(want.len() as u64 - off - 1);
                        let d = pattern(100 * w + i, off, n as usize);
                        if rng.one_in(2) {
                            fs.write_at(f, off, &d).unwrap();
                        } else {
                            let (o, l) = (off / BS * BS, (n / BS).max(1) * BS);
                            let l = l.min(want.len() as u64 - o);
                            let d = pattern(100 * w + i, o, l as usize);
                            fs.write_direct(f, o, &d).unwrap();
                            want[o as usize..(o + l) as usize].copy_from_slice(&d);
                            continue;
                        }
                        want[off as usize..(off + n) as usize].copy_from_slice(&d);
                    }
                    if rng.one_in(3) {
                        fs.fsync(f, SyncScope::All).unwrap();
                    }
                    assert!(read_all(&fs, f) == want, "{name}: data");
                    if rng.one_in(2) {
                        fs.unlink(Ino::ROOT, name.as_ref()).unwrap();
                    } else if rng.one_in(2) {
                        let keep = rng.below(want.len() as u64);
                        fs.set_len(f, keep).unwrap();
                    }
                }
            })
        })
        .collect();
    // Checkpoints back to back besides the background ones: the trees apply counts while
    // the workers' lookups read them.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ckpt = {
        let (fs, stop) = (Arc::clone(&fs), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0;
            while n < 5 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fs.checkpoint().unwrap();
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    for w in workers {
        w.join().expect("a worker failed");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    ckpt.join().expect("checkpoints");
    fs.sync().unwrap();
    assert!(read_all(&fs, src) == *want_src, "the source is untouched");
    fs.check_refcounts().unwrap();
    fs.check_space_accounting().unwrap();
    let st = fs.status();
    eprintln!(
        "racing the checkpointer: {} checkpoints, overlay {} runs at the end, {} blocks shared",
        st.checkpoints,
        st.refcount_overlay_runs,
        fs.shared_blocks()
    );
    assert!(st.checkpoints >= 5, "checkpoints ran during the workload");
    let fs = Arc::try_unwrap(fs).expect("workers joined");
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

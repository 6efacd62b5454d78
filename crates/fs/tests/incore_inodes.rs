//! The in-core inode table (`docs/design/cache.md`, "In-core inodes"): its size stays
//! bounded by what the page cache can pin however many different files a mount touches,
//! and evicting an inode never loses what `fsync` must make durable.
//!
//! The churn test touches 200,000 files here and 1,000,000 in the ignored
//! `a_million_files_keep_the_table_bounded` (run it with `--ignored --release`). Files are
//! unlinked once 20,000 newer ones exist: the on-disk model (`MetaState`) still holds
//! every inode in memory until metadata is paged, which is not what is measured here.
//! Without eviction the table would hold every live file (20,000); the bound asserted is
//! tied to the cache budget (at most one cached file per block of budget) and far below.
mod common;

use std::collections::VecDeque;

use common::*;
use stripefs::{
    AtimePolicy, AtimeWrite, CreateParams, Fs, Ino, MkfsOptions, MountOptions, SetAttr, TimeSet,
    Timespec,
};
use stripefs_target::CrashMode;

const BS: u32 = 1024;
const BUDGET: u64 = 1 << 20;
/// Live files at once (older ones are unlinked).
const WINDOW: usize = 20_000;
/// The table is swept whenever it doubles and never below this (`icache::SWEEP_MIN`).
const SWEEP_MIN: u64 = 1024;

fn mount_small_cache(s: &[std::sync::Arc<stripefs_target::SimTarget>]) -> Fs {
    mount_small_cache_with(s, quiet())
}

fn mount_small_cache_with(
    s: &[std::sync::Arc<stripefs_target::SimTarget>],
    mut o: MountOptions,
) -> Fs {
    Fs::mkfs(
        &dyns(s),
        &MkfsOptions {
            block_size: BS,
            stripe_unit: 4 * BS,
            journal_bytes: Some(4 << 20),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    o.cache.folio_bytes = 4096;
    o.cache.budget_bytes = BUDGET;
    o.cache.dirty_limit_bytes = BUDGET / 4;
    Fs::mount(dyns(s), o).unwrap().0
}

/// Tiny deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Creates, writes and closes `files` different files; after each, stats, opens, reads
/// (and checks) and closes an older one, and unlinks the oldest beyond [`WINDOW`]. Returns
/// the peak in-core inode count.
fn churn(files: usize) -> usize {
    let s = sims(4, 32 << 20);
    let fs = mount_small_cache(&s);
    let mut live: VecDeque<(String, Ino, u64)> = VecDeque::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut peak = 0;
    let started = std::time::Instant::now();
    for n in 0..files as u64 {
        let name = format!("f{n}");
        let a = fs
            .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
        let fh = fs.open(a.ino).unwrap();
        fs.write_at(a.ino, 0, &pattern(n, 0, BS as usize)).unwrap();
        fs.release(fh).unwrap();
        live.push_back((name, a.ino, n));
        let (_, ino, seed) = live[rng.below(live.len())].clone();
        assert_eq!(fs.getattr(ino).unwrap().size, u64::from(BS));
        let fh = fs.open(ino).unwrap();
        let mut buf = vec![0u8; BS as usize];
        assert_eq!(fs.read_at(ino, 0, &mut buf).unwrap(), BS as usize);
        assert!(
            buf == pattern(seed, 0, BS as usize),
            "file {seed} reads back"
        );
        fs.release(fh).unwrap();
        if live.len() > WINDOW {
            let (old, _, _) = live.pop_front().unwrap();
            fs.unlink(Ino::ROOT, old.as_ref()).unwrap();
        }
        if n % 4096 == 0 {
            // (Sampled: `status` walks the whole model.) The table keeps its own peak.
            peak = peak.max(fs.status().incore_inodes);
        }
    }
    let st = fs.status();
    eprintln!(
        "{files} files touched in {:.1?}: in-core inodes peak {} (table's own peak {}), now {}, evicted {}; files in the page cache's index {}; cache budget {} KiB, peak resident {} KiB",
        started.elapsed(),
        peak,
        st.incore_inodes_peak,
        st.incore_inodes,
        st.incore_inodes_evicted,
        st.cache.files,
        BUDGET >> 10,
        st.cache.peak_resident_bytes >> 10
    );
    assert_eq!(st.incore_inodes_peak, peak.max(st.incore_inodes_peak));
    // Each cached file holds at least one block of the budget; everything else that pins
    // an inode is transient in this loop (one handle, one dirty size at a time).
    let pinned_max = BUDGET / u64::from(BS) + 16;
    let bound = 2 * pinned_max.max(SWEEP_MIN) + 1;
    assert!(
        (st.incore_inodes_peak as u64) <= bound,
        "in-core inodes peaked at {} over the bound {bound} ({} live files)",
        st.incore_inodes_peak,
        WINDOW
    );
    assert!(st.incore_inodes_evicted > 0);
    assert!(
        st.cache.files <= st.incore_inodes as u64,
        "the page cache's index ({} files) lives only as long as the in-core inodes ({})",
        st.cache.files,
        st.incore_inodes
    );
    fs.unmount().unwrap();
    st.incore_inodes_peak
}

#[test]
fn two_hundred_thousand_files_keep_the_table_bounded() {
    churn(200_000);
}

#[test]
#[ignore = "a million files: run with --ignored --release"]
fn a_million_files_keep_the_table_bounded() {
    churn(1_000_000);
}

/// An inode evicted while its last change is only in the running transaction: `fsync`
/// must still commit that change (the table's sequence floor), so it survives a crash.
#[test]
fn fsync_after_eviction_commits_the_evicted_change() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 16384);
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap()
        .ino;
    fs.sync().unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(f, &chmod).unwrap();
    let st = fs.status();
    assert!(
        st.running_seq > st.committed_seq,
        "the chmod is not durable yet"
    );
    assert!(fs.debug_evict_inodes() > 0);
    assert_eq!(fs.status().incore_inodes, 0, "every inode was evicted");
    fs.fsync(f, stripefs::SyncScope::All).unwrap();
    assert!(
        fs.status().committed_seq >= st.running_seq,
        "fsync after eviction committed the chmod's transaction"
    );
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().mode & 0o777, 0o600);
    fs.unmount().unwrap();
}

/// The same for `fdatasync` after a size change.
#[test]
fn fdatasync_after_eviction_commits_the_evicted_size() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 16384);
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap()
        .ino;
    fs.sync().unwrap();
    fs.set_len(f, 12345).unwrap();
    assert!(fs.debug_evict_inodes() > 0);
    fs.fsync(f, stripefs::SyncScope::Data).unwrap();
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 12345);
    fs.unmount().unwrap();
}

/// What pins an inode keeps it: an open handle, dirty data, and an unreported writeback
/// error are not evicted; a closed, written-back, uncached inode is.
#[test]
fn pinned_inodes_are_not_evicted() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 16384);
    let a = fs
        .create(Ino::ROOT, "a".as_ref(), CreateParams::with_perm(0o644))
        .unwrap()
        .ino;
    let fh = fs.open(a).unwrap();
    fs.debug_evict_inodes();
    assert_eq!(fs.status().incore_inodes, 1, "the open inode stays");
    fs.write_at(a, 0, b"dirty").unwrap();
    fs.release(fh).unwrap();
    fs.debug_evict_inodes();
    assert_eq!(fs.status().incore_inodes, 1, "the dirty inode stays");
    fs.fsync(a, stripefs::SyncScope::All).unwrap();
    fs.debug_evict_inodes();
    assert_eq!(
        fs.status().incore_inodes,
        1,
        "its clean cached data pins it until the cache lets the folio go"
    );
    let mut buf = [0u8; 5];
    fs.read_at(a, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"dirty");
    fs.unmount().unwrap();
}

/// Under `lazytime`, reads keep access times in memory; an inode pinned only by one is not
/// kept forever: the sweep logs the time and evicts it, so reading many files keeps the
/// table bounded, no access time is lost, and `fsync` after eviction makes it durable.
#[test]
fn lazy_access_times_are_logged_at_eviction() {
    let s = sims(4, 32 << 20);
    let lazy = AtimePolicy {
        write: AtimeWrite::Lazy,
        ..AtimePolicy::default()
    };
    let fs = mount_small_cache_with(
        &s,
        MountOptions {
            atime: lazy,
            // Written without a close, which trims: keep the space per file at a block.
            speculative_prealloc: false,
            ..quiet()
        },
    );
    let now = stripefs::time_now().sec;
    let at = |sec: i64| Timespec { sec, nsec: 0 };
    let old = SetAttr {
        // Older than the modification: relatime updates it on the next read.
        atime: Some(TimeSet::At(at(now - 7200))),
        mtime: Some(TimeSet::At(at(now - 3600))),
        ctime: Some(at(now - 3600)),
        ..SetAttr::default()
    };
    let files: Vec<Ino> = (0..6000)
        .map(|n| {
            let f = fs
                .create(
                    Ino::ROOT,
                    format!("f{n}").as_ref(),
                    CreateParams::with_perm(0o644),
                )
                .unwrap()
                .ino;
            fs.write_at(f, 0, &pattern(n, 0, BS as usize)).unwrap();
            fs.setattr(f, &old).unwrap();
            f
        })
        .collect();
    fs.sync().unwrap();
    let mut buf = vec![0u8; BS as usize];
    for &f in &files {
        fs.read_at(f, 0, &mut buf).unwrap();
    }
    let st = fs.status();
    let bound = 2 * (BUDGET / u64::from(BS) + 16).max(SWEEP_MIN) + 1;
    assert!(
        (st.incore_inodes_peak as u64) <= bound,
        "in-core inodes peaked at {} over {bound}: lazily kept access times pinned them",
        st.incore_inodes_peak
    );
    assert!(st.incore_inodes_evicted > 0);
    assert!(
        fs.getattr(files[0]).unwrap().atime.sec >= now,
        "the first file's access time survived its eviction"
    );
    fs.fsync(files[0], stripefs::SyncScope::All).unwrap();
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert!(fs.getattr(files[0]).unwrap().atime.sec >= now);
    fs.unmount().unwrap();
}

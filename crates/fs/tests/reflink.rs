//! Shared extents (issue 12, first half; `docs/design/reflink.md`): clones share blocks
//! and take no space, copy on write keeps each copy's contents, the reference-count index
//! stays exact, and a crash at every flush and FUA point of a workload of clones and
//! copy-on-write writes leaves each block of each file with an old or a new content,
//! counts exact after recovery, and fsck clean.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{
    DataCow, FallocMode, FileFlags, Fs, FsError, Ino, MkfsOptions, MountOptions, SyncScope,
    TargetId,
};
use stripefs_target::{Recorder, SimTarget, UnflushedPolicy};

fn free_blocks(fs: &Fs) -> u64 {
    fs.statfs().expect("statfs").blocks_free
}

fn fsck_clean(sims: &[Arc<SimTarget>], what: &str) {
    let r = stripefs::fsck::fsck(dyns(sims), &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
}

#[test]
fn clone_shares_blocks_and_copy_on_write_keeps_each_copy() {
    let s = sims(3, 32 << 20);
    let fs = fresh(&s, 4096, 64 << 10);
    let a = file(&fs, "a");
    let data = pattern(1, 0, 1 << 20);
    fs.write_at(a, 0, &data).unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    let before = free_blocks(&fs);
    let b = file(&fs, "b");
    assert_eq!(fs.clone_file(a, b).unwrap(), 1 << 20);
    fs.sync().unwrap();
    assert_eq!(free_blocks(&fs), before, "a clone takes no data blocks");
    assert_eq!(fs.shared_blocks(), 256, "every block of the file is shared");
    assert_eq!(read_all(&fs, b), data);
    fs.check_refcounts().unwrap();

    // Buffered into a, direct into b, both partial blocks and whole ones.
    let wa = pattern(2, 5000, 10_000);
    fs.write_at(a, 5000, &wa).unwrap();
    let wb = pattern(3, 512 * 9, 4096 * 3);
    fs.write_direct(b, 512 * 9, &wb).unwrap();
    fs.sync().unwrap();
    let mut want_a = data.clone();
    want_a[5000..15_000].copy_from_slice(&wa);
    let mut want_b = data.clone();
    want_b[512 * 9..512 * 9 + 4096 * 3].copy_from_slice(&wb);
    assert_eq!(read_all(&fs, a), want_a, "a keeps its write only");
    assert_eq!(read_all(&fs, b), want_b, "b keeps its write only");
    fs.check_refcounts().unwrap();
    fs.check_space_accounting().unwrap();
    // a's write copied blocks 1..=3 (5000..15000); b's (4608..16896) then wrote those
    // in place (no longer shared) and copied block 4; the rest is still shared.
    assert_eq!(fs.shared_blocks(), 256 - 4);

    // Clone within one file at another offset, truncate inside a shared block, and
    // unlink the original: counts follow, every block freed exactly once.
    assert!(matches!(
        fs.clone_range(b, 0, b, 4096, 8192),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.clone_range(a, 100, b, 0, 4096),
        Err(FsError::Invalid(_))
    ));
    fs.clone_range(b, 0, b, 1 << 20, 64 << 10).unwrap();
    want_b.extend_from_within(..64 << 10);
    fs.set_len(b, (1 << 20) + 1000).unwrap();
    want_b.truncate((1 << 20) + 1000);
    assert_eq!(read_all(&fs, b), want_b);
    fs.unlink(Ino::ROOT, "a".as_ref()).unwrap();
    fs.sync().unwrap();
    fs.check_refcounts().unwrap();
    fs.check_space_accounting().unwrap();
    assert_eq!(read_all(&fs, b), want_b);
    fs.unmount().unwrap();
    fsck_clean(&s, "after clones");
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let b = fs.lookup(Ino::ROOT, "b".as_ref()).unwrap().ino;
    assert_eq!(read_all(&fs, b), want_b, "after remount");
    fs.check_refcounts().unwrap();
    fs.unlink(Ino::ROOT, "b".as_ref()).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.shared_blocks(), 0);
    fs.check_space_accounting().unwrap();
    fs.unmount().unwrap();
    fsck_clean(&s, "after the last owner went");
}

#[test]
fn copy_file_range_shares_the_aligned_middle_across_layouts() {
    let s = sims(3, 32 << 20);
    let fs = fresh(&s, 4096, 64 << 10);
    let a = file(&fs, "a");
    let data = pattern(7, 0, 700_001);
    fs.write_at(a, 0, &data).unwrap();
    fs.sync().unwrap();
    // b has data already: it keeps its own layout (another first target), so only the
    // pieces both files put on one target are shared; the rest is copied.
    let b = file(&fs, "b");
    fs.write_at(b, 0, &pattern(8, 0, 5000)).unwrap();
    let n = fs.copy_file_range(a, 1000, b, 1000, 699_001).unwrap();
    assert_eq!(n, 699_001);
    let mut want = pattern(8, 0, 5000);
    want.resize(1000, 0);
    want.extend_from_slice(&data[1000..]);
    fs.sync().unwrap();
    assert_eq!(read_all(&fs, b), want);
    fs.check_refcounts().unwrap();
    fs.check_space_accounting().unwrap();
    // Offsets that differ inside a block are copied.
    let c = file(&fs, "c");
    assert_eq!(fs.copy_file_range(a, 1, c, 0, 10_000).unwrap(), 10_000);
    assert_eq!(read_all(&fs, c), data[1..10_001].to_vec());
    // Past the source's end: nothing.
    assert_eq!(fs.copy_file_range(a, 800_000, c, 0, 10).unwrap(), 0);
    fs.unmount().unwrap();
    fsck_clean(&s, "after copy_file_range");
}

/// One file's contents over time: (event index its change started at, content).
struct History {
    name: &'static str,
    states: Vec<(usize, Vec<u8>)>,
    /// Event count when each fsync of the file returned, with the state index then.
    synced: Vec<(usize, usize)>,
}

impl History {
    /// The states a crash at `(returned, started)` may show: from the last one an fsync
    /// made durable to the last one begun.
    fn allowed(&self, returned: usize, started: usize) -> &[(usize, Vec<u8>)] {
        let lo = self
            .synced
            .iter()
            .rev()
            .find(|(at, _)| *at <= returned)
            .map_or(0, |(_, k)| *k);
        let hi = self
            .states
            .iter()
            .rposition(|(at, _)| *at <= started)
            .unwrap_or(0);
        &self.states[lo..=hi.max(lo)]
    }
}

/// Per block, the recovered content is that block in one of the allowed states (never a
/// mix inside a block of data written by copy on write, never a byte never written).
/// Mounts the images of every crash point the recorder saw (after each durability
/// point, its unflushed writes dropped or torn; and inside each FUA write), and calls
/// `verify(fs, returned, started, what)` then fsck on each: the crash sweeps' one loop.
fn every_crash_point(
    rec: &Recorder,
    initial: &[Vec<u8>],
    opts: &dyn Fn() -> MountOptions,
    verify: &dyn Fn(&Fs, usize, usize, &str),
) {
    let check =
        |images: Vec<Vec<u8>>, prefix: &str, returned: usize, started: usize, what: &str| {
            let sims: Vec<Arc<SimTarget>> = images
                .into_iter()
                .enumerate()
                .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("{prefix}{i}"), img, 512)))
                .collect();
            let (fs, _) = Fs::mount(dyns(&sims), opts()).expect("recovery mount");
            verify(&fs, returned, started, what);
            fs.unmount().unwrap();
            fsck_clean(&sims, what);
        };
    let mut covered = 0;
    for p in rec.durability_points() {
        for policy in [
            UnflushedPolicy::Drop,
            UnflushedPolicy::Tear { seed: p as u64 },
        ] {
            let what = format!("crash after event {p} ({policy:?})");
            check(
                rec.images_at(initial, p + 1, policy, 512),
                "c",
                p + 1,
                p,
                &what,
            );
            covered += 1;
        }
    }
    for p in rec.fua_points() {
        let what = format!("crash during FUA write {p}");
        check(
            rec.images_in_flight(initial, p, (p as u64) << 1, 512),
            "f",
            p,
            p,
            &what,
        );
        covered += 1;
    }
    assert!(covered > 20, "too few crash points: {covered}");
}

fn check_blocks(got: &[u8], allowed: &[(usize, Vec<u8>)], bs: usize, what: &str) {
    assert!(
        allowed.iter().any(|(_, c)| c.len() == got.len()),
        "{what}: size {} is none of the allowed {:?}",
        got.len(),
        allowed.iter().map(|(_, c)| c.len()).collect::<Vec<_>>()
    );
    for (i, blk) in got.chunks(bs).enumerate() {
        let ok = allowed.iter().any(|(_, c)| {
            let lo = i * bs;
            let mut want = c
                .get(lo..(lo + blk.len()).min(c.len()))
                .unwrap_or(&[])
                .to_vec();
            want.resize(blk.len(), 0);
            want == blk
        });
        assert!(ok, "{what}: block {i} matches no allowed content");
    }
}

#[test]
fn crash_at_every_flush_point_with_clones_and_copy_on_write() {
    crash_sweep(DataCow::Off);
}

/// The same with copy-on-write files (data checksums, `reflink.md` "Data checksums"):
/// every write copies, every block read is verified against its checksum, and after
/// recovery the checksum index is exactly what the extent maps derive.
#[test]
fn crash_at_every_flush_point_with_datacow_clones_and_writes() {
    crash_sweep(DataCow::On);
}

fn crash_sweep(datacow: DataCow) {
    let opts_of = || MountOptions { datacow, ..quiet() };
    let bs = 4096usize;
    let s = sims(3, 8 << 20);
    let opts = MkfsOptions {
        block_size: bs as u32,
        stripe_unit: 16 << 10,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).unwrap();
    let initial: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();
    let rec = Recorder::new();
    let wrapped = recorded(&s, &rec);
    let (fs, _) = Fs::mount(wrapped, opts_of()).unwrap();
    let now = || rec.events().len();
    let a = file(&fs, "a");
    let b = file(&fs, "b");
    fs.sync().unwrap();
    let mut ha = History {
        name: "a",
        states: vec![(0, Vec::new())],
        synced: vec![(now(), 0)],
    };
    let mut hb = History {
        name: "b",
        states: vec![(0, Vec::new())],
        synced: vec![(now(), 0)],
    };
    let mut ca = pattern(1, 0, 200_000);
    ha.states.push((now(), ca.clone()));
    fs.write_at(a, 0, &ca).unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));

    let mut cb = ca.clone();
    hb.states.push((now(), cb.clone()));
    fs.clone_file(a, b).unwrap();
    fs.fsync(b, SyncScope::All).unwrap();
    hb.synced.push((now(), hb.states.len() - 1));

    // Copy on write by writeback (buffered, partial blocks) and by direct writes.
    for (k, (off, len)) in [(3000u64, 9000usize), (65_536, 4096), (150_001, 30_000)]
        .into_iter()
        .enumerate()
    {
        let w = pattern(10 + k as u64, off, len);
        ca[off as usize..off as usize + len].copy_from_slice(&w);
        ha.states.push((now(), ca.clone()));
        fs.write_at(a, off, &w).unwrap();
    }
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    for (k, (off, len)) in [(512u64, 4096usize), (8192, 8192), (100_352, 1024)]
        .into_iter()
        .enumerate()
    {
        let w = pattern(20 + k as u64, off, len);
        cb[off as usize..off as usize + len].copy_from_slice(&w);
        hb.states.push((now(), cb.clone()));
        fs.write_direct(b, off, &w).unwrap();
    }
    fs.fsync(b, SyncScope::All).unwrap();
    hb.synced.push((now(), hb.states.len() - 1));

    // A range of a onto b over existing data, then truncate b inside a shared block.
    let r = ca[0..65_536].to_vec();
    cb[131_072..131_072 + 65_536].copy_from_slice(&r);
    hb.states.push((now(), cb.clone()));
    fs.clone_range(a, 0, b, 131_072, 65_536).unwrap();
    fs.fsync(b, SyncScope::All).unwrap();
    hb.synced.push((now(), hb.states.len() - 1));
    cb.truncate(140_000);
    hb.states.push((now(), cb.clone()));
    fs.set_len(b, 140_000).unwrap();
    let w = pattern(30, 133_000, 2000);
    cb[133_000..135_000].copy_from_slice(&w);
    hb.states.push((now(), cb.clone()));
    fs.write_at(b, 133_000, &w).unwrap();
    fs.fsync(b, SyncScope::All).unwrap();
    hb.synced.push((now(), hb.states.len() - 1));
    std::mem::forget(fs);

    let verify = |fs: &Fs, returned: usize, started: usize, what: &str| {
        fs.check_refcounts()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.check_space_accounting()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.check_csums().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(fs.status().csum_errors, 0, "{what}: checksum mismatches");
        for h in [&ha, &hb] {
            let ino = fs.lookup(Ino::ROOT, h.name.as_ref()).expect("name").ino;
            let got = read_all(fs, ino);
            check_blocks(
                &got,
                h.allowed(returned, started),
                bs,
                &format!("{what}: {}", h.name),
            );
        }
    };
    every_crash_point(&rec, &initial, &opts_of, &verify);
}

/// How the write over the block another owner let go is made, and how its data reaches
/// the targets before the crash.
#[derive(Debug, Clone, Copy)]
enum LateWrite {
    /// `O_DIRECT`; the crash keeps every unflushed write.
    Direct,
    /// Buffered, then `fdatasync` of the writer alone: the other file's release is not
    /// metadata the writer's data needs, so it need not be committed.
    BufferedDatasync,
}

/// A NOCOW file `a` shares its blocks with a clone `b` (durable). `b` is unlinked — or
/// `b`'s own copy on write releases them — and, before that transaction is durable, `a`
/// overwrites the blocks. Their count is 1 at that moment, but a crash brings `b`'s
/// mapping back: `a`'s write must have gone to new blocks (copy on write), or `b` would
/// read `a`'s data after recovery. Guards the pending-release rule
/// (`MetaCore::ref_pieces_for_write`, I-001-1's "no pending reference change").
#[test]
fn a_write_over_blocks_whose_other_owner_let_go_uncommitted_keeps_that_owner_intact() {
    const BS: usize = 4096;
    for (late, b_goes_by_unlink) in [
        (LateWrite::Direct, true),
        (LateWrite::BufferedDatasync, true),
        (LateWrite::Direct, false),
    ] {
        let what = format!(
            "{late:?}, b let go by {}",
            if b_goes_by_unlink {
                "unlink"
            } else {
                "its own copy on write"
            }
        );
        let s = sims(2, 16 << 20);
        let fs = fresh(&s, BS as u32, 64 << 10);
        let a = file(&fs, "a");
        let old = pattern(1, 0, 4 * BS);
        fs.write_at(a, 0, &old).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let b = file(&fs, "b");
        fs.clone_file(a, b).unwrap();
        fs.fsync(b, SyncScope::All).unwrap();
        // b lets go of its blocks; nothing commits that (no background commit).
        if b_goes_by_unlink {
            fs.unlink(Ino::ROOT, "b".as_ref()).unwrap();
        } else {
            fs.write_direct(b, 0, &pattern(7, 0, 4 * BS)).unwrap();
        }
        assert_eq!(fs.shared_blocks(), 0, "{what}: the count dropped to 1");
        let new = pattern(2, 0, 4 * BS);
        let crash = match late {
            LateWrite::Direct => {
                fs.write_direct(a, 0, &new).unwrap();
                stripefs_target::CrashMode::KeepUnflushed
            }
            LateWrite::BufferedDatasync => {
                fs.write_at(a, 0, &new).unwrap();
                fs.fsync(a, SyncScope::Data).unwrap();
                stripefs_target::CrashMode::DropUnflushed
            }
        };
        for t in &s {
            t.crash(crash);
        }
        // Power is gone: the file system writes nothing more (no clean unmount).
        std::mem::forget(fs);
        let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
        // Nothing committed the release before a direct write; a copy on write's
        // `fdatasync` commits it with the remap a's data needs, so b may be gone then.
        match (late, fs.lookup(Ino::ROOT, "b".as_ref())) {
            (_, Ok(b)) if b_goes_by_unlink => assert!(
                read_all(&fs, b.ino) == old,
                "{what}: b reads its durable contents, not a's later write"
            ),
            (_, Ok(b)) => {
                let got = read_all(&fs, b.ino);
                assert!(
                    got == old || got == pattern(7, 0, 4 * BS),
                    "{what}: b reads its own contents, not a's later write"
                );
            }
            (LateWrite::BufferedDatasync, Err(FsError::NotFound)) => {}
            (_, r) => panic!("{what}: b after the crash: {r:?}"),
        }
        let a = fs.lookup(Ino::ROOT, "a".as_ref()).unwrap().ino;
        let got = read_all(&fs, a);
        assert!(got == old || got == new, "{what}: a reads old or new");
        fs.check_refcounts()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.unmount().unwrap();
        fsck_clean(&s, &what);
    }
}

/// Seed 001: a crash at every flush and FUA point of NOCOW writeback and direct writes
/// falling back to copy on write over cloned blocks, then writing in place: over the
/// copies, over blocks the clone let go of (unlinked: copied while the unlink is not
/// durable, decision 94, in place once it is), and into an unwritten extent.
/// Each file reads, per block, a content it had (blocks written only by copy on write
/// whole, never mixed; blocks also written in place per sector, which is all a NOCOW
/// overwrite promises), counts exact, checksums none, fsck clean.
#[test]
fn crash_at_every_flush_point_with_nocow_fallback_to_copy_on_write() {
    let bs = 4096usize;
    let s = sims(3, 8 << 20);
    let opts = MkfsOptions {
        block_size: bs as u32,
        stripe_unit: 16 << 10,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).unwrap();
    let initial: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();
    let rec = Recorder::new();
    let (fs, _) = Fs::mount(recorded(&s, &rec), quiet()).unwrap();
    let now = || rec.events().len();
    let a = file(&fs, "a");
    let b = file(&fs, "b");
    fs.sync().unwrap();
    let mut ha = History {
        name: "a",
        states: vec![(0, Vec::new())],
        synced: vec![(now(), 0)],
    };
    let mut hb = History {
        name: "b",
        states: vec![(0, Vec::new())],
        synced: vec![(now(), 0)],
    };
    let mut ca = pattern(1, 0, 128 << 10);
    ha.states.push((now(), ca.clone()));
    fs.write_at(a, 0, &ca).unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    hb.states.push((now(), ca.clone()));
    fs.clone_file(a, b).unwrap();
    fs.fsync(b, SyncScope::All).unwrap();
    hb.synced.push((now(), hb.states.len() - 1));
    let before = fs.status();

    let step = |ha: &mut History, ca: &mut Vec<u8>, off: usize, len: usize, direct: bool| {
        let w = pattern(off as u64 ^ 0x5eed, off as u64, len);
        if ca.len() < off + len {
            ca.resize(off + len, 0);
        }
        ca[off..off + len].copy_from_slice(&w);
        ha.states.push((now(), ca.clone()));
        if direct {
            fs.write_direct(a, off as u64, &w).unwrap();
        } else {
            fs.write_at(a, off as u64, &w).unwrap();
        }
    };
    // Copy on write over the cloned blocks: writeback (partial blocks 1-3, whole 10),
    // and a direct write (block 20).
    step(&mut ha, &mut ca, 5000, 9000, false);
    step(&mut ha, &mut ca, 10 * bs, bs, false);
    step(&mut ha, &mut ca, 20 * bs, bs, true);
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    // In place over a copy (block 10).
    step(&mut ha, &mut ca, 10 * bs + 512, 2048, false);
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    // The clone lets go: a's blocks have one owner, but until the unlink is durable a
    // crash brings b back, so they are copied (30 buffered, 31 direct; decision 94).
    let unlinked_at = now();
    fs.unlink(Ino::ROOT, "b".as_ref()).unwrap();
    step(&mut ha, &mut ca, 30 * bs, bs, false);
    step(&mut ha, &mut ca, 31 * bs, bs, true);
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    // The unlink is durable now (a's fsync committed it): the other blocks b let go of
    // are written in place (24 buffered, 25 direct).
    step(&mut ha, &mut ca, 24 * bs, bs, false);
    step(&mut ha, &mut ca, 25 * bs, bs, true);
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    // Into an unwritten extent past the old end: converted at completion.
    ca.resize(192 << 10, 0);
    ha.states.push((now(), ca.clone()));
    fs.fallocate(a, FallocMode::Allocate, 128 << 10, 64 << 10)
        .unwrap();
    step(&mut ha, &mut ca, (128 << 10) + bs, bs, false);
    fs.fsync(a, SyncScope::All).unwrap();
    ha.synced.push((now(), ha.states.len() - 1));
    let st = fs.status();
    let decided = (
        st.nocow_cow - before.nocow_cow,
        st.nocow_in_place - before.nocow_in_place,
    );
    std::mem::forget(fs);

    // Blocks written only by copy on write: 1-3, 20, 30 and 31 (checked whole).
    let cow_only = [(bs, 4 * bs), (20 * bs, 21 * bs), (30 * bs, 32 * bs)];
    let verify = |fs: &Fs, returned: usize, started: usize, what: &str| {
        fs.check_refcounts()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.check_space_accounting()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.check_csums().unwrap_or_else(|e| panic!("{what}: {e}"));
        let ia = fs.lookup(Ino::ROOT, "a".as_ref()).expect("a").ino;
        let got = read_all(fs, ia);
        let allowed = ha.allowed(returned, started);
        check_blocks(&got, allowed, 512, &format!("{what}: a"));
        for &(lo, hi) in &cow_only {
            let cut: Vec<(usize, Vec<u8>)> = allowed
                .iter()
                .filter(|(_, c)| c.len() >= hi)
                .map(|(at, c)| (*at, c[lo..hi].to_vec()))
                .collect();
            if got.len() >= hi && !cut.is_empty() {
                check_blocks(&got[lo..hi], &cut, bs, &format!("{what}: a copied {lo}"));
            }
        }
        match fs.lookup(Ino::ROOT, "b".as_ref()) {
            Ok(ib) => {
                let got = read_all(fs, ib.ino);
                check_blocks(
                    &got,
                    hb.allowed(returned, started),
                    bs,
                    &format!("{what}: b"),
                );
            }
            Err(_) => assert!(started >= unlinked_at, "{what}: b gone before its unlink"),
        }
    };
    every_crash_point(&rec, &initial, &quiet, &verify);
    assert_eq!(
        decided,
        (5, 4),
        "five copies (blocks 1-3 one mapping, 10, 20, 30, 31), four in place (10, 24, 25, 33)"
    );
}

/// Issue 13: a crash at every flush and FUA point of an online evacuation of target 2
/// (`evacuate_begin`, steps each followed by a commit, `evacuate_finish`), over four
/// sets of NOCOW and copy-on-write files, clones of each (blocks shared by two owners),
/// an unwritten preallocation partly written, and a NOCOW write left
/// dirty when the evacuation begins (its writeback, the evacuation's first step, must
/// copy: the target is read-only). After each crash: mount succeeds, every file reads
/// what was synced before the evacuation (the dirty block: old or new, whole), counts,
/// checksums and space books exact, fsck clean; after the evacuation returned, and on
/// the images it left, the target holds no extent and no metadata page.
#[test]
fn crash_at_every_flush_point_of_an_evacuation() {
    let t2 = TargetId(2);
    let s = sims(3, 8 << 20);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16 << 10,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).unwrap();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let want = evacuation_population(&fs, 4);
    fs.unmount().unwrap();
    let initial: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();

    let rec = Recorder::new();
    let (fs, _) = Fs::mount(recorded(&s, &rec), quiet()).unwrap();
    let now = || rec.events().len();
    let solo = fs.lookup(Ino::ROOT, "solo0".as_ref()).unwrap().ino;
    let old = want["solo0"].clone();
    let at = fs
        .extents(solo)
        .unwrap()
        .into_iter()
        .find(|r| r.target == t2.0 && r.written)
        .expect("a block of solo on target 2")
        .file_off as usize;
    let mut new = old.clone();
    new[at..at + 4096].copy_from_slice(&pattern(99, at as u64, 4096));
    let mut hs = History {
        name: "solo0",
        states: vec![(0, old)],
        synced: vec![(0, 0)],
    };
    hs.states.push((now(), new.clone()));
    fs.write_at(solo, at as u64, &new[at..at + 4096]).unwrap();
    let cow_before = fs.status().nocow_read_only;
    let moved = evacuate_committing_each_step(&fs, t2);
    hs.synced.push((now(), 1));
    let evacuated = now();
    assert!(moved > 0, "nothing was moved");
    assert_eq!(
        fs.status().nocow_read_only,
        cow_before + 1,
        "the dirty NOCOW block on the read-only target was copied"
    );
    let empty = |fs: &Fs, what: &str| {
        let b = &fs.space_accounting()[t2.index()];
        assert_eq!(
            (b.extent_blocks, b.meta_page_blocks),
            (0, 0),
            "{what}: target 2 is empty"
        );
    };
    empty(&fs, "after the evacuation");
    // Then the disk leaves the file system (targets.md, "Retiring a target").
    fs.retire_target(t2).expect("retire");
    let retired = now();
    std::mem::forget(fs);

    let verify = |fs: &Fs, returned: usize, started: usize, what: &str| {
        // The read-only state is persisted from the evacuation's start, the retirement
        // from its return; a retired target counts nothing and holds nothing.
        if returned >= evacuated {
            assert!(fs.target_read_only(t2), "{what}: target 2 is read-only");
            empty(fs, what);
        }
        if returned >= retired {
            assert!(fs.target_retired(t2), "{what}: target 2 is retired");
        }
        if fs.target_retired(t2) {
            empty(fs, what);
            let b = &fs.space_accounting()[t2.index()];
            assert_eq!(
                b.data_blocks, 0,
                "{what}: a retired target has no data area"
            );
        }
        fs.check_refcounts()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.check_csums().unwrap_or_else(|e| panic!("{what}: {e}"));
        fs.check_space_accounting()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for (name, data) in &want {
            let ino = fs.lookup(Ino::ROOT, name.as_ref()).expect(name).ino;
            let got = read_all(fs, ino);
            if name == hs.name {
                let allowed = hs.allowed(returned, started);
                check_blocks(&got, allowed, 4096, &format!("{what}: {}", hs.name));
            } else {
                assert!(got == *data, "{what}: {name} differs");
            }
        }
    };
    every_crash_point(&rec, &initial, &quiet, &verify);
    let last = rec.events().len();
    let images = rec.images_at(&initial, last, UnflushedPolicy::Drop, 512);
    let sims: Vec<Arc<SimTarget>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("e{i}"), img, 512)))
        .collect();
    let (fs, _) = Fs::mount(dyns(&sims), quiet()).expect("mount after the evacuation");
    verify(&fs, last, last, "after the evacuation, remounted");
    empty(&fs, "after the evacuation, remounted");
    fs.unmount().unwrap();
    // The retired target's device is not needed any more.
    let rest = [Arc::clone(&sims[0]), Arc::clone(&sims[1])];
    let (fs, _) = Fs::mount(dyns(&rest), quiet()).expect("mount without target 2");
    verify(&fs, last, last, "after the retirement, without target 2");
    fs.unmount().unwrap();
    fsck_clean(&rest, "after the retirement, without target 2");
}

/// `Fs::evacuate` in its parts, as the CLI drives it, with a commit after every step of
/// at most 8 blocks (as the commit thread would make one at any moment): so the sweep
/// crashes between remaps, not only around one commit of all of them. Returns the
/// blocks moved.
fn evacuate_committing_each_step(fs: &Fs, t: TargetId) -> u64 {
    fs.evacuate_begin(t).expect("evacuate_begin");
    let mut moved = 0;
    for _pass in 0..4 {
        let mut at = Some(Ino::ROOT.0);
        while let Some(from) = at {
            let step = fs.evacuate_step(t, from, 8).expect("evacuate_step");
            moved += step.blocks;
            at = step.next;
            fs.sync().expect("commit");
        }
        if fs.space_accounting()[t.index()].extent_blocks == 0 {
            break;
        }
    }
    fs.evacuate_finish(t).expect("evacuate_finish");
    moved
}

/// Synced files with blocks on every target, `sets` times over (names suffixed with the
/// set): NOCOW `nocow` and its clone `nocow-clone`, copy-on-write `cow` (checksummed)
/// and its clone `cow-clone`, NOCOW `solo` (one owner), and `prealloc`, preallocated
/// (unwritten) with one block written in it. Returns name -> contents.
fn evacuation_population(fs: &Fs, sets: u64) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut want = std::collections::BTreeMap::new();
    for k in 0..sets {
        let name = |n: &str| format!("{n}{k}");
        let nocow = file(fs, &name("nocow"));
        let cow = file(fs, &name("cow"));
        fs.set_file_flags(cow, FileFlags::NONE).unwrap();
        let solo = file(fs, &name("solo"));
        for (i, ino) in [nocow, cow, solo].into_iter().enumerate() {
            let data = pattern(k * 8 + i as u64 + 1, 0, 96 << 10);
            fs.write_at(ino, 0, &data).unwrap();
            want.insert(name(["nocow", "cow", "solo"][i]), data);
        }
        for (src, what) in [(nocow, "nocow"), (cow, "cow")] {
            let copy = file(fs, &name(&format!("{what}-clone")));
            if what == "cow" {
                fs.set_file_flags(copy, FileFlags::NONE).unwrap();
            }
            fs.clone_file(src, copy).unwrap();
            let data = want[&name(what)].clone();
            want.insert(name(&format!("{what}-clone")), data);
        }
        let pre = file(fs, &name("prealloc"));
        fs.fallocate(pre, FallocMode::Allocate, 0, 96 << 10)
            .unwrap();
        let mut data = vec![0u8; 96 << 10];
        let part = pattern(k * 8 + 7, 40 << 10, 4096);
        fs.write_at(pre, 40 << 10, &part).unwrap();
        data[40 << 10..44 << 10].copy_from_slice(&part);
        want.insert(name("prealloc"), data);
    }
    fs.sync().unwrap();
    want
}

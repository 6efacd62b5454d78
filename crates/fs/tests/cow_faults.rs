//! Faults during copy on write (issue 12: "ENOSPC and EIO during copy-on-write writeback
//! leave both files intact and the accounting exact"). A file and its clone are both
//! written; a data write fails (EIO) or an allocation does (ENOSPC) while one of them is
//! written back or written directly. The failure is reported (fsync or the direct write
//! fails), the failed file reads its last durable contents, the other its new ones, the
//! reference counts and the space books are exact, the blocks taken for the failed copy
//! are free again, and after a remount both read the same and fsck is clean. Every case
//! runs with NOCOW files (`datacow=off`) and with checksummed copy-on-write files
//! (`datacow=on`, where the checksum index must also match the extent maps).
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{
    faults, CreateParams, DataCow, DioSubmit, File, Fs, Ino, MkfsOptions, MountOptions,
    StripeLayout,
};
use stripefs_target::fault::{Persistence, PointMatch};
use stripefs_target::{FaultInjector, FaultKind, FaultPoint, SimTarget};

const FILE: usize = 1 << 20;
const BS: u64 = 4096;

/// Files live on targets 1 and 2 only: target 0 holds the journal, and a fault there
/// would shut the file system down, which is not what is tested here.
fn params() -> CreateParams {
    CreateParams {
        layout: Some(StripeLayout {
            count: 2,
            unit_bytes: 64 << 10,
            first_target: 1,
        }),
        ..CreateParams::with_perm(0o644)
    }
}

struct Setup {
    sims: Vec<Arc<SimTarget>>,
    faults: Arc<FaultInjector>,
    fs: Fs,
    a: Ino,
    b: Ino,
    orig: Vec<u8>,
    datacow: DataCow,
}

/// `a` written and synced, `b` its clone (every block shared), synced; both NOCOW
/// (`datacow=off`) or both copy on write with data checksums (`on`).
fn setup(datacow: DataCow) -> Setup {
    setup_with(datacow, DioSubmit::Parallel)
}

/// [`setup`], with direct I/O submitted as `dio_submit` says.
fn setup_with(datacow: DataCow, dio_submit: DioSubmit) -> Setup {
    let faults = Arc::new(FaultInjector::new());
    let sims: Vec<Arc<SimTarget>> = (0..3)
        .map(|i| {
            Arc::new(
                SimTarget::from_image(&format!("sim{i}"), vec![GARBAGE; 16 << 20], 512)
                    .with_faults(i, Arc::clone(&faults)),
            )
        })
        .collect();
    Fs::mkfs(&dyns(&sims), &MkfsOptions::default()).unwrap();
    let opts = MountOptions {
        faults: Some(Arc::clone(&faults)),
        datacow,
        dio_submit,
        ..quiet()
    };
    let (fs, _) = Fs::mount(dyns(&sims), opts).unwrap();
    let a = fs.create(Ino::ROOT, "a".as_ref(), params()).unwrap().ino;
    let orig = pattern(1, 0, FILE);
    fs.write_at(a, 0, &orig).unwrap();
    fs.fsync(a, stripefs::SyncScope::All).unwrap();
    let b = fs.create(Ino::ROOT, "b".as_ref(), params()).unwrap().ino;
    assert_eq!(fs.clone_file(a, b).unwrap(), FILE as u64);
    fs.sync().unwrap();
    assert_eq!(fs.shared_blocks(), FILE as u64 / BS, "all shared");
    Setup {
        sims,
        faults,
        fs,
        a,
        b,
        orig,
        datacow,
    }
}

fn read_all(fs: &Fs, ino: Ino) -> Vec<u8> {
    let mut buf = vec![0u8; FILE];
    assert_eq!(fs.read_at(ino, 0, &mut buf).unwrap(), FILE);
    buf
}

fn free(fs: &Fs) -> u64 {
    fs.statfs().unwrap().blocks_free
}

fn books(fs: &Fs, what: &str) {
    fs.check_refcounts()
        .unwrap_or_else(|e| panic!("{what}: refcounts: {e}"));
    fs.check_space_accounting()
        .unwrap_or_else(|e| panic!("{what}: space: {e}"));
    fs.check_csums()
        .unwrap_or_else(|e| panic!("{what}: checksums: {e}"));
}

/// Unmount, fsck, remount: both files read `want_a`/`want_b`, books exact.
fn remount_and_check(s: Setup, want_a: &[u8], want_b: &[u8], what: &str) {
    s.faults.disarm();
    s.fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s.sims), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
    let (fs, _) = Fs::mount(
        dyns(&s.sims),
        MountOptions {
            datacow: s.datacow,
            ..quiet()
        },
    )
    .unwrap();
    assert!(read_all(&fs, s.a) == want_a, "{what}: a after remount");
    assert!(read_all(&fs, s.b) == want_b, "{what}: b after remount");
    books(&fs, &format!("{what}, after remount"));
    fs.unmount().unwrap();
}

fn with(mut base: Vec<u8>, off: usize, data: &[u8]) -> Vec<u8> {
    base[off..off + data.len()].copy_from_slice(data);
    base
}

/// Buffered writes to both files over shared blocks; `a`'s writeback fails with `kind`
/// injected at `point` (every hit until disarmed), `b`'s succeeds afterwards.
fn writeback_fault(point: PointMatch, kind: FaultKind, errno: i32, datacow: DataCow) {
    let s = setup(datacow);
    let (fs, a, b) = (&s.fs, s.a, s.b);
    let free0 = free(fs);
    let ha: File = fs.open_file(a).unwrap();
    let hb: File = fs.open_file(b).unwrap();
    // Partial blocks at both ends, crossing a stripe unit; b's range overlaps a's.
    let (oa, wa) = (5000usize, pattern(2, 5000, 70_000));
    let (ob, wb) = (40_000usize, pattern(3, 40_000, 100_000));
    fs.write_at(a, oa as u64, &wa).unwrap();
    fs.write_at(b, ob as u64, &wb).unwrap();
    s.faults.arm(point, 1, kind, Persistence::Sticky);
    let e = ha
        .sync_all()
        .expect_err("a's writeback failed: fsync must say so");
    assert_eq!(e.errno(), errno, "{e}");
    assert!(!s.faults.fired().is_empty());
    assert!(
        !fs.is_poisoned(),
        "a data error does not shut the file system down"
    );
    // a's writes are lost: it reads what was durable, the shared blocks.
    let got = read_all(fs, a);
    let new_a = with(s.orig.clone(), oa, &wa);
    let diff: Vec<(usize, &str)> = (0..FILE / BS as usize)
        .filter_map(|k| {
            let r = k * BS as usize..(k + 1) * BS as usize;
            if got[r.clone()] == s.orig[r.clone()] {
                None
            } else if got[r.clone()] == new_a[r.clone()] {
                Some((k, "new"))
            } else {
                Some((k, "other"))
            }
        })
        .collect();
    assert!(
        diff.is_empty(),
        "a reads its last durable contents: blocks {diff:?}"
    );
    s.faults.disarm();
    let e = ha.sync_data().err();
    assert!(e.is_none(), "reported once per handle: {e:?}");
    hb.sync_all().expect("b's writeback, after the fault");
    let want_b = with(s.orig.clone(), ob, &wb);
    assert!(read_all(fs, b) == want_b, "b reads its own write");
    books(fs, "after the failed writeback");
    // Only b's copied blocks are in use: a's failed copy gave its blocks back.
    let b_blocks = (ob as u64 + wb.len() as u64).div_ceil(BS) - ob as u64 / BS;
    fs.sync().unwrap();
    assert_eq!(free(fs), free0 - b_blocks, "space taken only by b's copy");
    // a is writable again, and this time it sticks.
    fs.write_at(a, oa as u64, &wa).unwrap();
    ha.sync_all().unwrap();
    let want_a = with(s.orig.clone(), oa, &wa);
    assert!(read_all(fs, a) == want_a);
    books(fs, "after a's second write");
    drop((ha, hb));
    remount_and_check(s, &want_a, &want_b, "writeback fault");
}

#[test]
fn eio_on_data_write_during_cow_writeback() {
    for datacow in [DataCow::Off, DataCow::On] {
        for t in [1, 2] {
            writeback_fault(
                PointMatch::Exact(FaultPoint::TargetWrite(t)),
                FaultKind::Eio,
                libc::EIO,
                datacow,
            );
        }
    }
}

#[test]
fn enospc_at_allocation_during_cow_writeback() {
    for datacow in [DataCow::Off, DataCow::On] {
        writeback_fault(
            PointMatch::Exact(faults::ALLOC),
            FaultKind::Enospc,
            libc::ENOSPC,
            datacow,
        );
    }
}

/// A direct write over shared blocks allocates new ones; when their write fails or
/// their allocation does, the write fails, the file keeps the shared blocks, and the
/// new blocks are free again.
#[test]
fn direct_cow_write_faults() {
    for (point_kind_errno, datacow) in [
        (
            PointMatch::Exact(FaultPoint::TargetWrite(1)),
            FaultKind::Eio,
            libc::EIO,
        ),
        (
            PointMatch::Exact(faults::ALLOC),
            FaultKind::Enospc,
            libc::ENOSPC,
        ),
    ]
    .into_iter()
    .flat_map(|p| [(p, DataCow::Off), (p, DataCow::On)])
    {
        let (point, kind, errno) = point_kind_errno;
        let s = setup(datacow);
        let (fs, a, b) = (&s.fs, s.a, s.b);
        let free0 = free(fs);
        // First stripe unit of a's layout: object 0, target 1. Aligned and partial.
        for (off, len) in [(8192usize, 16_384usize), (512 * 3, 4096)] {
            let w = pattern(4, off as u64, len);
            s.faults.arm(point, 1, kind, Persistence::Sticky);
            let e = fs
                .write_direct(b, off as u64, &w)
                .expect_err("the direct write must fail");
            assert_eq!(e.errno(), errno, "{e}");
            s.faults.disarm();
            assert!(read_all(fs, b) == s.orig, "b keeps its old contents");
            assert!(read_all(fs, a) == s.orig, "a untouched");
            books(fs, "after a failed direct write");
        }
        fs.sync().unwrap();
        assert_eq!(free(fs), free0, "the failed copies took no space");
        assert_eq!(fs.shared_blocks(), FILE as u64 / BS, "still all shared");
        let orig = s.orig.clone();
        remount_and_check(s, &orig, &orig, "direct write fault");
    }
}

/// Zero range over shared blocks gives the range unwritten blocks of its own, as Linux
/// keeps a zeroed range allocated: they are taken at the `fallocate` (so a later write
/// there never meets `ENOSPC`), the other owner keeps its data, and when the space is not
/// there the call fails before changing anything.
#[test]
fn zero_range_over_shared_blocks_keeps_the_range_allocated() {
    for datacow in [DataCow::Off, DataCow::On] {
        zero_range_over_shared_blocks(datacow);
    }
}

fn zero_range_over_shared_blocks(datacow: DataCow) {
    let s = setup(datacow);
    let (fs, a, b) = (&s.fs, s.a, s.b);
    let free0 = free(fs);
    // Partial blocks at both ends; whole blocks 2..=19 (18 blocks) in between.
    let (off, len) = (4096u64 + 100, 18 * BS + 4096 - 100 + 50);
    fs.fallocate(
        b,
        stripefs::FallocMode::ZeroRange { keep_size: true },
        off,
        len,
    )
    .unwrap();
    let mut want_b = s.orig.clone();
    want_b[off as usize..(off + len) as usize].fill(0);
    assert!(read_all(fs, b) == want_b, "b reads zeros in the range");
    assert!(read_all(fs, a) == s.orig, "a keeps its data");
    books(fs, "after zero range");
    fs.sync().unwrap();
    // 18 whole blocks unwritten of b's own, and the two partial edge blocks copied.
    let whole = 18;
    assert_eq!(
        free(fs),
        free0 - whole - 2,
        "the range took blocks of its own"
    );
    let unwritten: u64 = fs
        .extents(b)
        .unwrap()
        .iter()
        .filter(|r| !r.written)
        .map(|r| r.len)
        .sum();
    assert_eq!(
        unwritten,
        whole * BS,
        "the whole blocks are unwritten extents"
    );
    // Fill the file system; a write into the zeroed range still succeeds.
    let filler = fs
        .create(Ino::ROOT, "filler".as_ref(), params())
        .unwrap()
        .ino;
    let chunk = vec![7u8; 256 << 10];
    let mut at = 0u64;
    while fs.write_at(filler, at, &chunk).is_ok() {
        at += chunk.len() as u64;
        assert!(at < 64 << 20, "never filled");
    }
    let w = pattern(9, 3 * BS, 4 * BS as usize);
    fs.write_at(b, 3 * BS, &w)
        .expect("no ENOSPC writing into a zeroed range");
    fs.fsync(b, stripefs::SyncScope::All)
        .expect("its writeback needs no new space");
    want_b[3 * BS as usize..7 * BS as usize].copy_from_slice(&w);
    assert!(read_all(fs, b) == want_b);
    // With no space left, zeroing shared blocks fails before changing anything.
    let e = fs
        .fallocate(
            b,
            stripefs::FallocMode::ZeroRange { keep_size: true },
            100 * BS,
            64 * BS,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(read_all(fs, b) == want_b, "unchanged after ENOSPC");
    books(fs, "after zero range ENOSPC");
    fs.unlink(Ino::ROOT, "filler".as_ref()).unwrap();
    let orig = s.orig.clone();
    remount_and_check(s, &orig, &want_b, "zero range");
}

/// Issue 12: direct copy-on-write writes reserved no space for their copies (only holes
/// were counted), so their allocations met `ENOSPC` instead of committing the blocks
/// freed by the previous transaction (busy until it is durable) and retrying, as every
/// other allocation does. A datacow file of 256 blocks is overwritten directly, whole, on
/// a target with 384 free blocks: each round needs the 256 the previous round freed.
#[test]
fn direct_datacow_overwrites_reuse_the_space_their_copies_freed() {
    const S: usize = 1 << 20;
    let sims = common::sims(3, 16 << 20);
    Fs::mkfs(&dyns(&sims), &MkfsOptions::default()).unwrap();
    let opts = MountOptions {
        datacow: DataCow::On,
        ..quiet()
    };
    let (fs, _) = Fs::mount(dyns(&sims), opts).unwrap();
    let on_target_1 = || CreateParams {
        layout: Some(StripeLayout {
            count: 1,
            unit_bytes: 64 << 10,
            first_target: 1,
        }),
        ..CreateParams::with_perm(0o644)
    };
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), on_target_1())
        .unwrap()
        .ino;
    fs.write_direct(f, 0, &pattern(1, 0, S)).unwrap();
    // Fill target 1, then give back 384 blocks, durably.
    let filler = fs
        .create(Ino::ROOT, "filler".as_ref(), on_target_1())
        .unwrap()
        .ino;
    let mut at = 0u64;
    for chunk in [64usize << 10, BS as usize] {
        while let Ok(n) = fs.write_direct(filler, at, &vec![7u8; chunk]) {
            at += n as u64;
        }
    }
    assert!(at >= 384 * BS, "the filler took {at} bytes");
    fs.set_len(filler, at - 384 * BS).unwrap();
    fs.sync().unwrap();
    for round in 0..6u64 {
        let w = pattern(round + 2, 0, S);
        let n = fs
            .write_direct(f, 0, &w)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(n, S, "round {round}");
        let mut back = vec![0u8; S];
        assert_eq!(fs.read_direct(f, 0, &mut back).unwrap(), S);
        assert!(back == w, "round {round}: f reads its last write");
        books(&fs, &format!("round {round}"));
    }
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&sims), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// Issue 12: the checksums computed for a failed direct write were never discarded
/// (`WriteCsums` kept them until a completion that never came: a leak). A datacow file's
/// direct writes fail with `EIO` on one target, every piece at once (parallel) or after
/// a piece on the other target completed (serial, where the failed piece is not among
/// those written), across four stripe units, over shared blocks and over blocks of its
/// own: afterwards no checksum is pending, the file reads its last durable contents and
/// the books are exact.
#[test]
fn failed_datacow_direct_writes_forget_their_checksums() {
    for (submit, failing) in [(DioSubmit::Parallel, 1), (DioSubmit::Serial, 2)] {
        let s = setup_with(DataCow::On, submit);
        let (fs, a, b) = (&s.fs, s.a, s.b);
        let what = format!("{submit:?}, EIO on target {failing}");
        // Blocks of b's own: its first 64 KiB copied by a successful write.
        let own = pattern(6, 0, 64 << 10);
        fs.write_direct(b, 0, &own).unwrap();
        fs.sync().unwrap();
        let want_b = with(s.orig.clone(), 0, &own);
        assert_eq!(fs.status().csum_pending_blocks, 0, "{what}: idle before");
        // Own blocks, then shared ones; four stripe units (targets 1, 2, 1, 2).
        for off in [0u64, 128 << 10] {
            s.faults.arm(
                PointMatch::Exact(FaultPoint::TargetWrite(failing)),
                1,
                FaultKind::Eio,
                Persistence::Sticky,
            );
            let e = fs
                .write_direct(b, off, &pattern(7, off, 256 << 10))
                .expect_err("the direct write must fail");
            assert_eq!(e.errno(), libc::EIO, "{what}: {e}");
            s.faults.disarm();
            assert_eq!(
                fs.status().csum_pending_blocks,
                0,
                "{what}, at {off}: checksums of the failed write are forgotten"
            );
            assert!(
                read_all(fs, b) == want_b,
                "{what}: b reads its last durable contents"
            );
            assert!(read_all(fs, a) == s.orig, "{what}: a untouched");
            books(fs, &what);
        }
        let orig = s.orig.clone();
        remount_and_check(s, &orig, &want_b, &what);
    }
}

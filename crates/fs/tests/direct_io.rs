//! Direct I/O: the lock policy under concurrency, stripe-parallel submission, and the
//! error semantics of Lustre's sanity 398 cases in our terms.
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use stripefs::{
    CreateParams, DataCow, DioSubmit, FallocMode, Fs, Ino, MkfsOptions, MountOptions, OpenMode,
    StripeLayout, WriteOrigin,
};
use stripefs_target::fault::{Persistence, PointMatch};
use stripefs_target::{
    Completion, FaultInjector, FaultKind, FaultPoint, IoDone, IoOp, OpKind, SimTarget, Target,
    TargetError, TargetErrorKind, TargetInfo,
};

fn p() -> CreateParams {
    CreateParams::with_perm(0o644)
}

/// N threads write disjoint 512-byte sectors of one 4 KiB block.
fn sector_writers(fs: &Fs, ino: Ino, block_off: u64) {
    std::thread::scope(|s| {
        for i in 0..8u64 {
            let fs = fs.clone();
            s.spawn(move || {
                fs.write_direct(ino, block_off + i * 512, &[i as u8 + 1; 512])
                    .unwrap();
            });
        }
    });
}

fn check_sectors(fs: &Fs, ino: Ino, block_off: u64) {
    let mut buf = vec![0u8; 4096];
    fs.read_direct(ino, block_off, &mut buf).unwrap();
    for i in 0..8usize {
        assert!(
            buf[i * 512..(i + 1) * 512]
                .iter()
                .all(|&b| b == i as u8 + 1),
            "sector {i} was lost or zeroed by another writer"
        );
    }
}

#[test]
fn sub_block_writers_share_written_blocks_and_serialize_elsewhere() {
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap();
    fs.write_direct(f.ino, 0, &[9u8; 16384]).unwrap();
    let before = fs.status();
    // (a) written blocks inside EOF: every sub-block write runs under the shared lock.
    sector_writers(&fs, f.ino, 4096);
    let mid = fs.status();
    assert_eq!(
        mid.dio_shared - before.dio_shared,
        8,
        "all eight sector writes ran shared"
    );
    assert_eq!(
        mid.dio_exclusive, before.dio_exclusive,
        "none took the exclusive lock"
    );
    check_sectors(&fs, f.ino, 4096);
    // (b) unwritten blocks: a sub-block write must zero the rest of its block, so it runs
    // exclusively and none zeroes another's sectors. The first one converts the whole
    // block to written, so writers that come after it are pure overwrites and may share.
    fs.fallocate(f.ino, FallocMode::KeepSize, 8192, 4096)
        .unwrap();
    fs.fallocate(f.ino, FallocMode::ZeroRange { keep_size: true }, 8192, 4096)
        .unwrap();
    sector_writers(&fs, f.ino, 8192);
    let after = fs.status();
    assert!(
        after.dio_exclusive - mid.dio_exclusive >= 1,
        "the first write over the unwritten block is exclusive"
    );
    assert_eq!(
        after.dio_exclusive + after.dio_shared - mid.dio_exclusive - mid.dio_shared,
        8
    );
    check_sectors(&fs, f.ino, 8192);
    // (c) across EOF: the block past EOF, written sector by sector from 8 threads.
    sector_writers(&fs, f.ino, 16384);
    // (c) across EOF: whichever writer extends EOF runs exclusively; a lower sector
    // written after that lies inside EOF over a written block and may share.
    assert!(
        fs.status().dio_exclusive - after.dio_exclusive >= 1,
        "writes that move EOF are exclusive"
    );
    check_sectors(&fs, f.ino, 16384);
    assert_eq!(fs.getattr(f.ino).unwrap().size, 20480);
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn unaligned_direct_io_is_einval() {
    let s = sims(1, 8 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap();
    assert_eq!(
        fs.write_direct(f.ino, 100, &[1u8; 512])
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    assert_eq!(
        fs.write_direct(f.ino, 0, &[1u8; 100]).unwrap_err().errno(),
        libc::EINVAL
    );
    let mut b = vec![0u8; 700];
    assert_eq!(
        fs.read_direct(f.ino, 0, &mut b).unwrap_err().errno(),
        libc::EINVAL
    );
    fs.unmount().unwrap();
}

#[test]
fn every_stripe_piece_is_in_flight_before_the_wait() {
    let sims = sims(8, 8 << 20);
    let fs = fresh(&sims, 4096, 1 << 20);
    let layout = StripeLayout {
        count: 8,
        unit_bytes: 1 << 20,
        first_target: 0,
    };
    let f = fs
        .create(
            Ino::ROOT,
            "wide".as_ref(),
            CreateParams {
                layout: Some(layout),
                ..p()
            },
        )
        .unwrap();
    fs.write_direct(f.ino, 0, &vec![1u8; 8 << 20]).unwrap();
    fs.unmount().unwrap();
    let (fs, _, peak) = mount_counting(&sims, 8);
    let before = fs.status().dio_pieces;
    fs.write_direct(f.ino, 0, &vec![2u8; 8 << 20]).unwrap();
    assert_eq!(
        peak.load(Ordering::SeqCst),
        8,
        "all eight stripe pieces were in flight at once, before the wait"
    );
    assert_eq!(fs.status().dio_pieces - before, 8);
    let mut back = vec![0u8; 8 << 20];
    fs.read_direct(f.ino, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 2));
    fs.unmount().unwrap();
}

/// `dio_submit = serial` covers reads as it covers writes (Lustre before 2.15, the other
/// side of seed 003's comparison): one piece in flight at a time, and the same bytes back;
/// `parallel` has all eight pieces of an 8 MiB read in flight before the wait.
#[test]
fn serial_submission_reads_one_piece_at_a_time() {
    let sims = sims(8, 8 << 20);
    let fs = fresh(&sims, 4096, 1 << 20);
    let layout = StripeLayout {
        count: 8,
        unit_bytes: 1 << 20,
        first_target: 0,
    };
    let f = fs
        .create(
            Ino::ROOT,
            "wide".as_ref(),
            CreateParams {
                layout: Some(layout),
                ..p()
            },
        )
        .unwrap();
    let data: Vec<u8> = (0..8u8).flat_map(|u| vec![u + 1; 1 << 20]).collect();
    fs.write_direct(f.ino, 0, &data).unwrap();
    fs.unmount().unwrap();
    for (mode, hold_until, want_peak) in [(DioSubmit::Serial, 1, 1), (DioSubmit::Parallel, 8, 8)] {
        let opts = MountOptions {
            dio_submit: mode,
            ..quiet()
        };
        let (fs, _, peak) = mount_counting_with(&sims, hold_until, is_unit_read, opts);
        let mut back = vec![0u8; 8 << 20];
        assert_eq!(fs.read_direct(f.ino, 0, &mut back).unwrap(), 8 << 20);
        assert_eq!(
            peak.load(Ordering::SeqCst),
            want_peak,
            "{mode:?}: direct-read pieces in flight at once"
        );
        assert!(back == data, "{mode:?}: read back what was written");
        fs.unmount().unwrap();
    }
}

/// Holds the completions of whole-unit reads until the test delivers them, one at a time,
/// on the test's thread (the device has read already; only the completion waits).
struct Holding {
    inner: Arc<SimTarget>,
    held: Arc<parking_lot::Mutex<Vec<(IoDone, Completion)>>>,
}

impl std::fmt::Debug for Holding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holding")
            .field("held", &self.held.lock().len())
            .finish_non_exhaustive()
    }
}

impl Target for Holding {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: IoOp, done: Completion) {
        if !is_unit_read(&op) {
            return self.inner.submit(op, done);
        }
        let read = Arc::new(parking_lot::Mutex::new(None));
        let r2 = Arc::clone(&read);
        self.inner
            .submit(op, Box::new(move |d| *r2.lock() = Some(d)));
        let d = read
            .lock()
            .take()
            .expect("the simulated target completes inline");
        self.held.lock().push((d, done));
    }
}

/// Polls `f` for up to 10 s.
fn eventually(f: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(10) {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

/// A direct read, waiting or callback form, copies each piece into the caller's buffer as
/// its completion arrives, while the later pieces are still in flight (the copy overlaps
/// the transfers), and stays
/// all-or-error: a failed piece fails the whole read, and nothing after it is copied.
#[test]
fn direct_read_copies_each_piece_as_it_completes() {
    const UNIT: u64 = 1 << 20;
    let sims = sims(4, 8 << 20);
    let fs = fresh(&sims, 4096, UNIT as u32);
    let layout = StripeLayout {
        count: 4,
        unit_bytes: UNIT as u32,
        first_target: 0,
    };
    let f = fs
        .create(
            Ino::ROOT,
            "wide".as_ref(),
            CreateParams {
                layout: Some(layout),
                ..p()
            },
        )
        .unwrap();
    let data = pattern(7, 0, 4 * UNIT as usize);
    fs.write_direct(f.ino, 0, &data).unwrap();
    fs.unmount().unwrap();
    let held = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let views: Vec<Arc<dyn Target>> = sims
        .iter()
        .map(|s| {
            Arc::new(Holding {
                inner: Arc::clone(s),
                held: Arc::clone(&held),
            }) as Arc<dyn Target>
        })
        .collect();
    let (fs, _) = Fs::mount(views, quiet()).unwrap();
    let fh = fs.open_with(f.ino, OpenMode::Direct).unwrap();
    let cases = [Form::Waiting, Form::Callback]
        .into_iter()
        .flat_map(|form| [(form, None), (form, Some(1usize))]);
    for (form, failing) in cases {
        let base = fs.status().dio_read_copied;
        let reader = {
            let fs = fs.clone();
            std::thread::spawn(move || match form {
                Form::Waiting => {
                    let mut buf = vec![0u8; 4 * UNIT as usize];
                    fs.read_direct(f.ino, 0, &mut buf).map(|n| (n, buf))
                }
                Form::Callback => {
                    let (tx, rx) = std::sync::mpsc::channel();
                    fs.read(fh, 0, 4 * UNIT as usize, move |r| tx.send(r).unwrap());
                    rx.recv().unwrap().map(|buf| (buf.len(), buf))
                }
            })
        };
        assert!(
            eventually(|| held.lock().len() == 4),
            "every piece in flight"
        );
        // Delivered in submission order: piece k completes only once k - 1 is copied.
        let pieces: Vec<_> = std::mem::take(&mut *held.lock());
        for (k, (mut d, done)) in pieces.into_iter().enumerate() {
            if Some(k) == failing {
                d.result = Err(TargetError::new(
                    Arc::clone(&sims[k].info().name),
                    OpKind::Read,
                    0,
                    TargetErrorKind::Os(libc::EIO),
                ));
            }
            done(d);
            let pieces_copied = match failing {
                Some(i) if k >= i => i,
                _ => k + 1,
            };
            let want = pieces_copied as u64 * UNIT;
            let copied = || fs.status().dio_read_copied - base == want;
            assert!(
                eventually(copied),
                "{form:?} {failing:?}: after piece {k} completed, {} bytes copied, want {want} before \
                 piece {} completes",
                fs.status().dio_read_copied - base,
                k + 1
            );
        }
        let r = reader.join().unwrap();
        let want = failing.map_or(4, |i| i as u64) * UNIT;
        assert_eq!(
            fs.status().dio_read_copied - base,
            want,
            "nothing is copied after a failed piece"
        );
        match failing {
            None => {
                let (n, buf) = r.unwrap();
                assert_eq!(n, data.len());
                assert!(buf == data, "read back what was written");
            }
            Some(_) => {
                let e = r.map(|(n, _)| n).unwrap_err();
                assert_eq!(e.errno(), libc::EIO, "a failed piece fails the read: {e}");
            }
        }
    }
    fs.release(fh).unwrap();
    fs.unmount().unwrap();
}

/// Which form of direct read a test drives.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// `Fs::read_direct`: the caller's thread waits and copies.
    Waiting,
    /// `Fs::read` on a direct handle: answered from the targets' completions.
    Callback,
}

/// Counts writes (or the ops `counted` picks) submitted and holds their completions: each
/// is deferred by 20 ms and
/// then until `hold_until` writes have been in flight at once (or 10 s have passed), a
/// point a caller waiting per piece would never reach. The gate, not the pause, is what
/// the assertions on the peak rely on: a loaded machine may take longer than the pause
/// to submit all pieces.
#[derive(Debug)]
struct CountingView {
    inner: Arc<SimTarget>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    hold_until: usize,
    counted: fn(&IoOp) -> bool,
}

fn is_write(op: &IoOp) -> bool {
    matches!(op, IoOp::Write { .. })
}

/// A read of a whole 1 MiB stripe unit: a data piece, not the mount's metadata reads.
fn is_unit_read(op: &IoOp) -> bool {
    matches!(op, IoOp::Read { .. }) && op.len() == 1 << 20
}

impl Target for CountingView {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: IoOp, done: Completion) {
        if !(self.counted)(&op) {
            return self.inner.submit(op, done);
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        // Complete on another thread after a pause: a submitter that waits per piece
        // would see the count go back to zero before submitting the next one.
        let inner = Arc::clone(&self.inner);
        let counter = Arc::clone(&self.in_flight);
        let (peak, hold_until) = (Arc::clone(&self.peak), self.hold_until);
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            std::thread::sleep(std::time::Duration::from_millis(20));
            while peak.load(Ordering::SeqCst) < hold_until
                && start.elapsed() < std::time::Duration::from_secs(10)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            counter.fetch_sub(1, Ordering::SeqCst);
            inner.submit(op, done);
        });
    }
}

/// Mounts `sims` behind [`CountingView`]s sharing one in-flight counter and one peak;
/// completions of writes are held until `hold_until` were in flight at once (or 10 s).
fn mount_counting(
    sims: &[Arc<SimTarget>],
    hold_until: usize,
) -> (Fs, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    mount_counting_with(sims, hold_until, is_write, quiet())
}

/// [`mount_counting`] for the ops `counted` picks, with mount options `opts`.
fn mount_counting_with(
    sims: &[Arc<SimTarget>],
    hold_until: usize,
    counted: fn(&IoOp) -> bool,
    opts: MountOptions,
) -> (Fs, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let views: Vec<Arc<dyn Target>> = sims
        .iter()
        .map(|s| {
            Arc::new(CountingView {
                inner: Arc::clone(s),
                in_flight: Arc::clone(&in_flight),
                peak: Arc::clone(&peak),
                hold_until,
                counted,
            }) as Arc<dyn Target>
        })
        .collect();
    let (fs, _) = Fs::mount(views, opts).unwrap();
    (fs, in_flight, peak)
}

fn faulty(faults: &Arc<FaultInjector>, n: usize, bytes: u64) -> Vec<Arc<SimTarget>> {
    (0..n)
        .map(|i| {
            Arc::new(
                SimTarget::from_image(&format!("sim{i}"), vec![GARBAGE; bytes as usize], 512)
                    .with_faults(i as u32, Arc::clone(faults)),
            )
        })
        .collect()
}

fn mount_faulty(s: &[Arc<SimTarget>], faults: &Arc<FaultInjector>) -> Fs {
    Fs::mkfs(
        &dyns(s),
        &MkfsOptions {
            stripe_unit: 1 << 20,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    Fs::mount(
        dyns(s),
        MountOptions {
            faults: Some(Arc::clone(faults)),
            ..quiet()
        },
    )
    .unwrap()
    .0
}

/// sanity 398 (first and middle piece): any failed piece fails the call with nothing
/// recorded: the size does not move and no new block becomes visible; the file system
/// stays consistent.
#[test]
fn failed_piece_fails_the_call_and_exposes_nothing() {
    for failing in [0u32, 2] {
        let faults = Arc::new(FaultInjector::new());
        let s = faulty(&faults, 4, 16 << 20);
        let fs = mount_faulty(&s, &faults);
        let f = fs
            .create(
                Ino::ROOT,
                "f".as_ref(),
                CreateParams {
                    layout: Some(StripeLayout {
                        count: 4,
                        unit_bytes: 1 << 20,
                        first_target: 0,
                    }),
                    ..p()
                },
            )
            .unwrap();
        fs.write_direct(f.ino, 0, &vec![1u8; 1 << 20]).unwrap();
        faults.arm(
            PointMatch::Exact(FaultPoint::TargetWrite(failing)),
            1,
            FaultKind::Eio,
            Persistence::Once,
        );
        let e = fs
            .write_direct(f.ino, 1 << 20, &vec![2u8; 4 << 20])
            .unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "{e}");
        assert_eq!(
            fs.getattr(f.ino).unwrap().size,
            1 << 20,
            "size not extended by a failed write"
        );
        let mut buf = vec![0u8; 5 << 20];
        let n = fs.read_direct(f.ino, 0, &mut buf).unwrap();
        assert_eq!(n, 1 << 20);
        assert!(buf[..n].iter().all(|&b| b == 1), "earlier data intact");
        assert!(!fs.is_poisoned());
        fs.unmount().unwrap();
        let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
        assert!(r.is_clean(), "piece {failing}: {:?}", r.problems);
    }
}

/// sanity 398 (ENOSPC on an intermediate target): a contiguous short write, the size equal
/// to the bytes reported, the data correct, never a gap.
#[test]
fn enospc_on_an_intermediate_target_is_a_contiguous_short_write() {
    let (s, fs, f) = target_2_full(DataCow::Off);
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
    let n = fs
        .write_direct(f, 0, &data)
        .expect("a short write, not an error");
    assert!(n < data.len(), "target 2 is full");
    assert_eq!(n as u64 % (1 << 20), 0, "stopped at a stripe-unit boundary");
    assert_eq!(
        fs.getattr(f).unwrap().size,
        n as u64,
        "size equals the bytes reported"
    );
    let mut back = vec![0u8; n];
    fs.read_direct(f, 0, &mut back).unwrap();
    assert!(back == data[..n], "the prefix is exactly the data");
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// Issue 12: a short direct write to a datacow file reported the whole request (the
/// datacow path returned `data.len()` whatever the engine wrote). Written into holes, and
/// ending in a partial block over written data (merged into a copy, which must not be
/// written before the middle is: otherwise bytes past the short end change): the call
/// returns what was written, the file reads exactly that prefix and its old contents
/// after it, and the books and fsck are clean.
#[test]
fn short_direct_write_to_a_datacow_file_reports_what_it_wrote() {
    const MIB: usize = 1 << 20;
    let data: Vec<u8> = (0..4 * MIB as u32).map(|i| (i % 251) as u8 + 1).collect();
    // (bytes of the write, an older written block at the write's last block)
    for (len, old_tail) in [(4 * MIB, false), (3 * MIB + MIB / 2 + 512, true)] {
        let (s, fs, f) = target_2_full(DataCow::On);
        let mut want = Vec::new();
        let tail_at = (len as u64 - 1) / 4096 * 4096;
        if old_tail {
            // Written before target 2 filled (object 3, target 3).
            let old = pattern(5, tail_at, 4096);
            fs.write_direct(f, tail_at, &old).unwrap();
            want.resize(tail_at as usize, 0);
            want.extend_from_slice(&old);
        }
        let n = fs
            .write_direct(f, 0, &data[..len])
            .expect("a short write, not an error");
        assert!(n < len, "target 2 is full: short: {n} of {len}");
        assert_eq!(n % MIB, 0, "stopped at a stripe-unit boundary: short: {n}");
        if want.len() < n {
            want.resize(n, 0);
        }
        want[..n].copy_from_slice(&data[..n]);
        let size = fs.getattr(f).unwrap().size;
        assert_eq!(
            size,
            want.len() as u64,
            "size: the bytes reported or the old size"
        );
        let mut back = vec![0u8; want.len()];
        assert_eq!(fs.read_direct(f, 0, &mut back).unwrap(), want.len());
        assert!(
            back == want,
            "the prefix is the data, the rest the old contents (first difference at {:?})",
            back.iter().zip(&want).position(|(a, b)| a != b)
        );
        fs.check_space_accounting().unwrap();
        fs.check_csums().unwrap();
        fs.unmount().unwrap();
        let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
    }
}

/// A datacow direct write whose first partial block is copied and recorded, and whose
/// next block then finds no space, answers with the bytes of that first block: the copy
/// is recorded and cannot be undone, so an error would hide a change the file shows.
/// Guards a review finding: the engine's `ENOSPC` was passed up after the edge landed.
#[test]
fn a_datacow_write_short_after_its_first_partial_block_reports_that_block() {
    const MIB: u64 = 1 << 20;
    let (s, fs, f) = target_2_full(DataCow::On);
    // The block before the full target's stripe unit, on target 1, written earlier.
    let old = pattern(3, MIB * 2 - 4096, 4096);
    fs.write_direct(f, MIB * 2 - 4096, &old).unwrap();
    // 2 KiB into that block, then a whole block on target 2 (full).
    let new = pattern(9, MIB * 2 - 2048, 6144);
    let n = fs
        .write_direct(f, MIB * 2 - 2048, &new)
        .expect("a short write: the first block was recorded");
    assert_eq!(n, 2048, "the answer is the recorded first block's bytes");
    let mut want = old.clone();
    want[2048..].copy_from_slice(&new[..2048]);
    let mut back = vec![0u8; 4096];
    fs.read_direct(f, MIB * 2 - 4096, &mut back).unwrap();
    assert!(back == want, "the file reads what the answer says");
    assert_eq!(
        fs.getattr(f).unwrap().size,
        MIB * 2,
        "size: the bytes reported"
    );
    fs.check_space_accounting().unwrap();
    fs.check_csums().unwrap();
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// Four 16 MiB targets (1 MiB stripe unit) mounted with `datacow`, target 2 filled by a
/// file of its own; returns the file `f` striped over all four targets from target 0.
fn target_2_full(datacow: DataCow) -> (Vec<Arc<SimTarget>>, Fs, Ino) {
    let s = sims(4, 16 << 20);
    Fs::mkfs(
        &dyns(&s),
        &MkfsOptions {
            stripe_unit: 1 << 20,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let (fs, _) = Fs::mount(dyns(&s), MountOptions { datacow, ..quiet() }).unwrap();
    let f = fs
        .create(
            Ino::ROOT,
            "f".as_ref(),
            CreateParams {
                layout: Some(StripeLayout {
                    count: 4,
                    unit_bytes: 1 << 20,
                    first_target: 0,
                }),
                ..p()
            },
        )
        .unwrap();
    let filler = fs
        .create(
            Ino::ROOT,
            "filler".as_ref(),
            CreateParams {
                layout: Some(StripeLayout {
                    count: 1,
                    unit_bytes: 1 << 20,
                    first_target: 2,
                }),
                ..p()
            },
        )
        .unwrap();
    let mut off = 0;
    while fs
        .write_direct(filler.ino, off, &vec![7u8; 1 << 20])
        .is_ok()
    {
        off += 1 << 20;
    }
    (s, fs, f.ino)
}

/// EAGAIN from a target is passed up, never taken as proof of anything (I-000-4), and
/// failures at every point of a striped direct write leave a consistent file system.
#[test]
fn eagain_and_eio_at_every_point_of_a_striped_direct_write() {
    for kind in [FaultKind::Eagain, FaultKind::Eio] {
        let mut nth = 1;
        loop {
            let faults = Arc::new(FaultInjector::new());
            let s = faulty(&faults, 3, 16 << 20);
            let fs = mount_faulty(&s, &faults);
            let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap();
            fs.write_direct(f.ino, 0, &vec![1u8; 3 << 20]).unwrap();
            faults.arm(PointMatch::Any, nth, kind, Persistence::Once);
            let r = fs.write_direct(f.ino, 2 << 20, &vec![2u8; 3 << 20]);
            let fired = !faults.fired().is_empty();
            faults.disarm();
            match r {
                Ok(_) if !fired => break,
                Ok(n) => panic!("{kind:?} at hit {nth} went unreported (wrote {n})"),
                Err(e) => {
                    let want = if kind == FaultKind::Eagain {
                        libc::EAGAIN
                    } else {
                        libc::EIO
                    };
                    assert!(
                        e.errno() == want || e.errno() == libc::ENOSPC,
                        "{kind:?} at hit {nth}: {e}"
                    );
                }
            }
            let size = fs.getattr(f.ino).unwrap().size;
            assert!(
                size == 3 << 20 || size == 5 << 20,
                "size {size} after failure at hit {nth}"
            );
            if !fs.is_poisoned() {
                fs.unmount().unwrap();
            } else {
                std::mem::forget(fs);
            }
            let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
            assert!(r.is_clean(), "{kind:?} at hit {nth}: {:?}", r.problems);
            nth += 1;
            assert!(nth < 200);
        }
        assert!(nth > 3, "{kind:?}: the write hit several fault points");
    }
}

/// One thread keeps 64 direct I/Os in flight through the queue, and every completion is
/// reaped with the right result and data.
#[test]
fn queue_keeps_many_direct_ios_in_flight() {
    let sims = sims(4, 16 << 20);
    let fs = fresh(&sims, 4096, 65536);
    let f = fs.create(Ino::ROOT, "q".as_ref(), p()).unwrap();
    fs.write_direct(f.ino, 0, &vec![0u8; 4 << 20]).unwrap();
    fs.unmount().unwrap();
    let (fs, _, peak) = mount_counting(&sims, 32);
    let h = fs.open_file_with(f.ino, OpenMode::Direct).unwrap();
    let q = fs.dio_queue();
    for i in 0..64u64 {
        // 2 KiB writes into 4 KiB blocks: sub-block overwrites, all on the shared path.
        q.submit_write(i, h.fh(), i * 65536 + 2048, &[i as u8 + 1; 2048])
            .unwrap();
    }
    assert!(q.in_flight() > 1, "submission did not wait for completion");
    let mut done = Vec::new();
    while done.len() < 64 {
        done.extend(q.reap(1));
    }
    assert!(
        done.iter().all(|c| matches!(c.result, Ok(2048))),
        "{:?}",
        done.iter().find(|c| c.result.is_err())
    );
    assert!(
        peak.load(Ordering::SeqCst) >= 32,
        "peak in flight {}",
        peak.load(Ordering::SeqCst)
    );
    for i in 0..64u64 {
        q.submit_read(i, h.fh(), i * 65536, 4096).unwrap();
    }
    let mut reads = Vec::new();
    while reads.len() < 64 {
        reads.extend(q.reap(64));
    }
    for c in reads {
        let i = c.tag;
        assert!(
            c.data[..2048].iter().all(|&b| b == 0)
                && c.data[2048..].iter().all(|&b| b == i as u8 + 1),
            "read {i}"
        );
    }
    assert_eq!(fs.status().dio_exclusive, 0);
    drop(h);
    fs.unmount().unwrap();
}

/// Closing the last handle of an unlinked file waits for its queued direct I/O before the
/// blocks are freed (they must not be reused under in-flight writes).
#[test]
fn last_close_waits_for_queued_direct_io() {
    let sims = sims(2, 16 << 20);
    let fs = fresh(&sims, 4096, 65536);
    let f = fs.create(Ino::ROOT, "gone".as_ref(), p()).unwrap();
    fs.write_direct(f.ino, 0, &vec![1u8; 1 << 20]).unwrap();
    fs.unmount().unwrap();
    let (fs, in_flight, _) = mount_counting(&sims, 1);
    let h = fs.open_file_with(f.ino, OpenMode::Direct).unwrap();
    let q = fs.dio_queue();
    for i in 0..16u64 {
        q.submit_write(i, h.fh(), i * 65536, &[2u8; 4096]).unwrap();
    }
    fs.unlink(Ino::ROOT, "gone".as_ref()).unwrap();
    let free_before = fs.statfs().unwrap().blocks_free;
    drop(h); // Last close of an unlinked file: must drain the 16 writes first.
    assert_eq!(
        in_flight.load(Ordering::SeqCst),
        0,
        "release returned with direct I/O in flight"
    );
    assert!(
        fs.statfs().unwrap().blocks_free >= free_before,
        "the file's blocks were freed after the I/O"
    );
    let done = q.reap(16);
    assert_eq!(done.len(), 16);
    assert!(done.iter().all(|c| c.result.is_ok()));
    fs.unmount().unwrap();
}

/// The callback form of direct I/O answers exactly once on every path: queued (shared
/// lock), synchronous (exclusive lock: past EOF), refused (misaligned), and reads at and
/// beyond EOF. A buffered reader that cached the old bytes while the write was in flight
/// sees the new ones after the callback (clean folios over the range dropped on completion).
#[test]
fn callback_direct_io_answers_once_on_every_path() {
    use std::sync::mpsc;
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap();
    fs.write_direct(f.ino, 0, &[1u8; 65536]).unwrap();
    fs.unmount().unwrap();
    let (fs, in_flight, _) = mount_counting(&s, 1);
    let h = fs.open_file_with(f.ino, OpenMode::Direct).unwrap();
    let (tx, rx) = mpsc::channel::<(u32, stripefs::Result<usize>)>();
    let calls = Arc::new(AtomicUsize::new(0));
    let cases: [(u32, u64, usize); 3] = [(0, 8192 + 2048, 2048), (1, 65536, 4096), (2, 100, 512)];
    for (tag, off, len) in cases {
        let (tx, calls) = (tx.clone(), Arc::clone(&calls));
        let data = vec![tag as u8 + 5; len];
        fs.write(h.fh(), off, &data, WriteOrigin::Caller, move |r| {
            calls.fetch_add(1, Ordering::SeqCst);
            tx.send((tag, r)).unwrap();
        });
        if tag == 0 {
            // The write is still on its way to the target: this caches the old bytes.
            let mut old = vec![0u8; 4096];
            fs.read_at(f.ino, 8192, &mut old).unwrap();
            assert!(
                in_flight.load(Ordering::SeqCst) > 0,
                "write already completed"
            );
            assert!(old.iter().all(|&b| b == 1));
        }
    }
    let mut got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
    got.sort_by_key(|g| g.0);
    assert!(
        matches!(got[0].1, Ok(2048)),
        "queued overwrite: {:?}",
        got[0].1
    );
    assert!(
        matches!(got[1].1, Ok(4096)),
        "extending write: {:?}",
        got[1].1
    );
    assert!(
        matches!(got[2].1, Err(stripefs::FsError::Invalid(_))),
        "misaligned: {:?}",
        got[2].1
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3, "one answer per submission");
    let mut now = vec![0u8; 4096];
    fs.read_at(f.ino, 8192, &mut now).unwrap();
    assert!(
        now[..2048].iter().all(|&b| b == 1) && now[2048..].iter().all(|&b| b == 5),
        "buffered read after completion returned stale bytes"
    );
    let (rtx, rrx) = mpsc::channel();
    for (off, len) in [(65536u64, 8192usize), (1 << 20, 4096)] {
        let rtx = rtx.clone();
        fs.read(h.fh(), off, len, move |r| rtx.send((off, r)).unwrap());
    }
    let mut reads: Vec<_> = (0..2).map(|_| rrx.recv().unwrap()).collect();
    reads.sort_by_key(|r| r.0);
    let tail = reads[0].1.as_ref().unwrap();
    assert_eq!(tail.len(), 4096, "short read at EOF");
    assert!(tail.iter().all(|&b| b == 6));
    assert!(reads[1].1.as_ref().unwrap().is_empty(), "read past EOF");
    assert!(rx.try_recv().is_err() && rrx.try_recv().is_err());
    drop(h);
    fs.unmount().unwrap();
}

/// A direct write that the lock decision sends to the exclusive path goes down once: one
/// decision walk (under the shared lock), one reservation walk and one submission walk,
/// and the shared lock is taken once. The callback form used to fall back to the waiting
/// form, which took the shared lock again and decided a second time (issue 10, item 1).
#[test]
fn exclusive_direct_write_walks_its_mapping_three_times() {
    use std::sync::mpsc;
    let s = sims(1, 8 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap();
    fs.write_direct(f.ino, 0, &[1u8; 16384]).unwrap();
    fs.fallocate(f.ino, FallocMode::ZeroRange { keep_size: true }, 8192, 4096)
        .unwrap();
    let h = fs.open_file_with(f.ino, OpenMode::Direct).unwrap();
    let (lookups, excl) = (fs.status().map_lookups, fs.status().dio_exclusive);
    // A sub-block write over an unwritten block inside EOF: exclusive, decided by a walk.
    let (tx, rx) = mpsc::channel();
    let origin = WriteOrigin::Caller;
    fs.write(h.fh(), 8192 + 512, &[7u8; 512], origin, move |r| {
        tx.send(r).unwrap();
    });
    assert!(matches!(rx.recv().unwrap(), Ok(512)));
    assert_eq!(fs.status().dio_exclusive - excl, 1);
    assert_eq!(
        fs.status().map_lookups - lookups,
        3,
        "decision, reservation and submission: one walk each"
    );
    let mut back = vec![0u8; 4096];
    fs.read_direct(f.ino, 8192, &mut back).unwrap();
    assert!(back[..512].iter().all(|&b| b == 0) && back[512..1024].iter().all(|&b| b == 7));
    assert!(back[1024..].iter().all(|&b| b == 0));
    drop(h);
    fs.unmount().unwrap();
}

/// `O_DIRECT` is a property of the handle: the one write and read entry follows it. A
/// misaligned write is refused through a direct handle and taken through a cached one;
/// page-cache writeback through a direct handle (`FUSE_WRITE_CACHE`) is buffered, not held
/// to alignment; a direct handle's read bypasses the cache (dirty data written back
/// first, nothing cached); an unknown handle is `Invalid`, answered once.
#[test]
fn handle_mode_decides_the_io_path() {
    use std::sync::mpsc;
    let s = sims(2, 16 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs.create(Ino::ROOT, "m".as_ref(), p()).unwrap();
    let direct = fs.open_file_with(f.ino, OpenMode::Direct).unwrap();
    let cached = fs.open_file(f.ino).unwrap();
    assert_eq!(
        (direct.mode(), cached.mode()),
        (OpenMode::Direct, OpenMode::Cached)
    );
    assert!(matches!(
        direct.write_at(100, &[1u8; 512]),
        Err(stripefs::FsError::Invalid(_))
    ));
    assert_eq!(cached.write_at(100, &[2u8; 512]).unwrap(), 512);
    let (tx, rx) = mpsc::channel();
    fs.write(
        direct.fh(),
        700,
        &[3u8; 10],
        WriteOrigin::PageCache,
        move |r| {
            tx.send(r).unwrap();
        },
    );
    assert!(matches!(rx.recv().unwrap(), Ok(10)));
    // The data is in the cache, dirty: a cached read needs no target, a direct one does.
    let mut b2 = vec![0u8; 710];
    let read0 = fs.status().data_bytes_read;
    assert_eq!(cached.read_at(0, &mut b2).unwrap(), 710);
    assert_eq!(
        fs.status().data_bytes_read,
        read0,
        "cached read went to a target"
    );
    let mut back = vec![0u8; 4096];
    assert_eq!(direct.read_at(0, &mut back).unwrap(), 710);
    assert!(
        fs.status().data_bytes_read > read0,
        "direct read came from the cache"
    );
    assert!(back[..100].iter().all(|&b| b == 0));
    assert!(back[100..612].iter().all(|&b| b == 2));
    assert!(back[700..710].iter().all(|&b| b == 3));
    assert_eq!(&b2[..], &back[..710]);
    let (tx, rx) = mpsc::channel();
    fs.write(
        stripefs::Fh(u64::MAX),
        0,
        &[0u8; 512],
        WriteOrigin::Caller,
        move |r| {
            tx.send(r).unwrap();
        },
    );
    assert!(matches!(
        rx.recv().unwrap(),
        Err(stripefs::FsError::Invalid(_))
    ));
    assert!(rx.try_recv().is_err());
    drop((direct, cached));
    fs.unmount().unwrap();
}

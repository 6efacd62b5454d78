//! Asynchronous readahead (`docs/design/cache.md`, "Readahead"): the next window stays in
//! flight while the current read returns, and every other user of its folios (a second
//! reader, a buffered write, a direct write, truncate, punch, eviction) waits for it or
//! leaves it alone; a failed readahead read leaves its blocks not uptodate, so the next
//! reader reads again and gets the error if the device fails again. Counted, not timed:
//! a target that holds the reads one thread submits until the test releases them.
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use common::*;
use parking_lot::Mutex;
use stripefs::{CreateParams, FallocMode, Fs, Ino, MkfsOptions, MountOptions};
use stripefs_iomap::cache::{CacheConfig, ReadaheadMode};
use stripefs_target::{
    Completion, IoDone, IoOp, OpKind, SimTarget, Target, TargetError, TargetErrorKind, TargetInfo,
};

const K: u64 = 1024;
/// Readahead window of these tests.
const RA: u64 = 256 * K;
const FILE: u64 = 2 << 20;

/// Holds the completions of the reads submitted by the armed thread until released (or
/// until `patience`, so that a path that waits for them cannot hang the test); fails
/// reads on demand.
#[derive(Debug)]
struct Gate {
    inner: Arc<SimTarget>,
    armed: Mutex<Option<ThreadId>>,
    open: Arc<AtomicBool>,
    /// Reads held, not yet released (counted down before their completion runs, so a
    /// reader woken by it sees the count without them).
    held: Arc<AtomicU64>,
    /// Held reads whose completion has not finished running.
    undelivered: Arc<AtomicU64>,
    /// Held reads complete with EIO when released.
    fail_held: Arc<AtomicBool>,
    /// Every read fails with EIO.
    fail_all: AtomicBool,
    read_bytes: AtomicU64,
    patience: Duration,
}

fn eio(t: &SimTarget, offset: u64) -> TargetError {
    TargetError::new(
        Arc::clone(&t.info().name),
        OpKind::Read,
        offset,
        TargetErrorKind::Os(libc::EIO),
    )
}

impl Target for Gate {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: IoOp, done: Completion) {
        let IoOp::Read { offset, bufs } = op else {
            return self.inner.submit(op, done);
        };
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.read_bytes.fetch_add(bytes, Ordering::SeqCst);
        if self.fail_all.load(Ordering::SeqCst) {
            return done(IoDone {
                bufs,
                result: Err(eio(&self.inner, offset)),
            });
        }
        let op = IoOp::Read { offset, bufs };
        if *self.armed.lock() != Some(std::thread::current().id()) {
            return self.inner.submit(op, done);
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        self.undelivered.fetch_add(1, Ordering::SeqCst);
        // The device reads now; only the completion is held (a read that saw the old
        // bytes and is reported late, the case that matters for stale data).
        let read: Arc<Mutex<Option<IoDone>>> = Arc::new(Mutex::new(None));
        let r2 = Arc::clone(&read);
        self.inner
            .submit(op, Box::new(move |d| *r2.lock() = Some(d)));
        let (open, held, fail) = (
            Arc::clone(&self.open),
            Arc::clone(&self.held),
            Arc::clone(&self.fail_held),
        );
        let undelivered = Arc::clone(&self.undelivered);
        let (patience, target) = (self.patience, Arc::clone(&self.inner));
        std::thread::spawn(move || {
            let start = Instant::now();
            while !open.load(Ordering::SeqCst) && start.elapsed() < patience {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut d = read
                .lock()
                .take()
                .expect("the simulated target completes inline");
            if fail.load(Ordering::SeqCst) {
                d.result = Err(eio(&target, offset));
            }
            held.fetch_sub(1, Ordering::SeqCst);
            done(d);
            undelivered.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

impl Gate {
    fn arm(&self) {
        self.open.store(false, Ordering::SeqCst);
        *self.armed.lock() = Some(std::thread::current().id());
    }
    fn disarm(&self) {
        *self.armed.lock() = None;
    }
    fn release(&self) {
        self.open.store(true, Ordering::SeqCst);
        while self.undelivered.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }
}

struct Setup {
    fs: Fs,
    gate: Arc<Gate>,
    ino: Ino,
    data: Vec<u8>,
}

/// One target behind a gate; a 2 MiB file written directly (nothing cached).
fn setup(mode: ReadaheadMode, budget: u64, patience: Duration) -> Setup {
    let s = sims(1, 64 << 20);
    Fs::mkfs(
        &dyns(&s),
        &MkfsOptions {
            stripe_unit: 1 << 20,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let gate = Arc::new(Gate {
        inner: Arc::clone(&s[0]),
        armed: Mutex::new(None),
        open: Arc::new(AtomicBool::new(false)),
        held: Arc::new(AtomicU64::new(0)),
        undelivered: Arc::new(AtomicU64::new(0)),
        fail_held: Arc::new(AtomicBool::new(false)),
        fail_all: AtomicBool::new(false),
        read_bytes: AtomicU64::new(0),
        patience,
    });
    let cache = CacheConfig {
        budget_bytes: budget,
        dirty_limit_bytes: budget / 4,
        readahead_bytes: RA,
        readahead: mode,
        ..CacheConfig::default()
    };
    let (fs, _) = Fs::mount(
        vec![Arc::clone(&gate) as Arc<dyn Target>],
        MountOptions { cache, ..quiet() },
    )
    .unwrap();
    let ino = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap()
        .ino;
    let data = pattern(3, 0, FILE as usize);
    assert_eq!(fs.write_direct(ino, 0, &data).unwrap(), data.len());
    Setup {
        fs,
        gate,
        ino,
        data,
    }
}

fn read(fs: &Fs, ino: Ino, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    let n = fs.read_at(ino, off, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// A sequential reader whose current data is cached reads `[RA, 2 RA)` with the gate
/// armed: the only device reads it issues are the readahead of the next window,
/// `[2 RA, 3 RA)`, which the gate holds. Returns how many reads are held when the read
/// has returned.
fn start_window(t: &Setup) -> u64 {
    let (fs, ino) = (&t.fs, t.ino);
    assert_eq!(read(fs, ino, RA, RA), t.data[RA as usize..2 * RA as usize]);
    assert_eq!(read(fs, ino, 0, RA), t.data[..RA as usize]);
    t.gate.arm();
    let got = read(fs, ino, RA, RA);
    t.gate.disarm();
    assert_eq!(got, t.data[RA as usize..2 * RA as usize]);
    t.gate.held()
}

fn async_setup() -> Setup {
    let t = setup(ReadaheadMode::Async, 64 << 20, Duration::from_secs(20));
    let held = start_window(&t);
    assert!(held > 0, "the next window is in flight");
    assert!(t.fs.status().cache.reading_folios > 0);
    t
}

/// Runs `f` on another thread and checks it is still waiting while the reads are held.
fn blocked<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
    what: &str,
) -> std::thread::JoinHandle<T> {
    let h = std::thread::spawn(f);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !h.is_finished(),
        "{what} went ahead while a readahead read was in flight over its range"
    );
    h
}

#[test]
fn async_readahead_leaves_next_window_in_flight() {
    let t = async_setup();
    // A second reader of the window waits for the read in flight rather than reading
    // the device again (a read not continuing the stream: no readahead of its own).
    let before = t.gate.read_bytes.load(Ordering::SeqCst);
    let fs = Arc::new(t.fs);
    let f2 = Arc::clone(&fs);
    let ino = t.ino;
    let h = blocked(
        move || read(&f2, ino, 2 * RA + 4 * K, 64 * K),
        "a second reader",
    );
    t.gate.release();
    let got = h.join().unwrap();
    assert_eq!(
        got,
        t.data[(2 * RA + 4 * K) as usize..(2 * RA + 68 * K) as usize]
    );
    assert_eq!(
        t.gate.read_bytes.load(Ordering::SeqCst),
        before,
        "the second reader used the readahead's data"
    );
    assert_eq!(fs.status().cache.reading_folios, 0);
}

#[test]
fn sync_readahead_waits_inside_the_read() {
    let t = setup(ReadaheadMode::Sync, 64 << 20, Duration::from_millis(300));
    let held = start_window(&t);
    assert_eq!(held, 0, "sync readahead returned with reads in flight");
    assert_eq!(t.fs.status().cache.reading_folios, 0);
}

#[test]
fn buffered_write_into_window_waits_for_the_read() {
    let t = async_setup();
    let fs = Arc::new(t.fs);
    let new = pattern(9, 0, 300);
    let at = 2 * RA + 100;
    let (f2, n2) = (Arc::clone(&fs), new.clone());
    let ino = t.ino;
    let h = blocked(
        move || f2.write_at(ino, at, &n2).unwrap(),
        "a buffered write",
    );
    t.gate.release();
    assert_eq!(h.join().unwrap(), new.len());
    let mut want = t.data.clone();
    want[at as usize..at as usize + new.len()].copy_from_slice(&new);
    assert!(
        read(&fs, ino, 2 * RA, RA) == want[2 * RA as usize..3 * RA as usize],
        "the readahead's completion overwrote the write"
    );
}

#[test]
fn direct_write_over_window_is_not_undone_by_the_read() {
    let t = async_setup();
    let fs = Arc::new(t.fs);
    let new = pattern(11, 0, 64 * K as usize);
    let at = 2 * RA + 64 * K;
    let (f2, n2) = (Arc::clone(&fs), new.clone());
    let ino = t.ino;
    let h = blocked(
        move || f2.write_direct(ino, at, &n2).unwrap(),
        "a direct write",
    );
    t.gate.release();
    assert_eq!(h.join().unwrap(), new.len());
    let mut want = t.data.clone();
    want[at as usize..at as usize + new.len()].copy_from_slice(&new);
    assert!(
        read(&fs, ino, 2 * RA, RA) == want[2 * RA as usize..3 * RA as usize],
        "stale readahead data over a direct write"
    );
}

#[test]
fn punch_over_window_reads_zeros() {
    let t = async_setup();
    let fs = Arc::new(t.fs);
    let at = 2 * RA + 64 * K;
    let f2 = Arc::clone(&fs);
    let ino = t.ino;
    let h = blocked(
        move || {
            f2.fallocate(ino, FallocMode::PunchHole, at, 64 * K)
                .unwrap()
        },
        "a punch",
    );
    t.gate.release();
    h.join().unwrap();
    let mut want = t.data.clone();
    want[at as usize..(at + 64 * K) as usize].fill(0);
    assert!(
        read(&fs, ino, 2 * RA, RA) == want[2 * RA as usize..3 * RA as usize],
        "stale readahead data over a punched range"
    );
}

#[test]
fn truncate_into_window_waits_and_extension_reads_zeros() {
    let t = async_setup();
    let fs = Arc::new(t.fs);
    let cut = 2 * RA + 100 * K + 7;
    let f2 = Arc::clone(&fs);
    let ino = t.ino;
    let h = blocked(move || f2.set_len(ino, cut).unwrap(), "a truncate");
    t.gate.release();
    h.join().unwrap();
    fs.set_len(ino, FILE).unwrap();
    let mut want = t.data.clone();
    want[cut as usize..].fill(0);
    assert!(
        read(&fs, ino, 0, FILE) == want,
        "stale bytes past a truncate"
    );
}

#[test]
fn eviction_leaves_a_window_in_flight_alone() {
    // A 4 MiB cache; another file of 16 MiB streams through it while the window is held.
    let t = setup(ReadaheadMode::Async, 4 << 20, Duration::from_secs(20));
    let other =
        t.fs.create(Ino::ROOT, "g".as_ref(), CreateParams::with_perm(0o644))
            .unwrap()
            .ino;
    let big = pattern(5, 0, 16 << 20);
    assert_eq!(t.fs.write_direct(other, 0, &big).unwrap(), big.len());
    assert!(start_window(&t) > 0);
    for off in (0..big.len() as u64).step_by(RA as usize) {
        assert!(read(&t.fs, other, off, RA) == big[off as usize..(off + RA) as usize]);
    }
    let st = t.fs.status().cache;
    assert!(st.evicted_folios > 0, "the stream evicted folios");
    assert!(st.reading_folios > 0, "still in flight");
    t.gate.release();
    let before = t.gate.read_bytes.load(Ordering::SeqCst);
    assert!(
        read(&t.fs, t.ino, 2 * RA + 4 * K, 64 * K)
            == t.data[(2 * RA + 4 * K) as usize..(2 * RA + 68 * K) as usize]
    );
    assert_eq!(
        t.gate.read_bytes.load(Ordering::SeqCst),
        before,
        "the window was evicted while in flight"
    );
}

#[test]
fn failed_readahead_is_retried_and_reports_eio() {
    let t = async_setup();
    t.gate.fail_held.store(true, Ordering::SeqCst);
    t.gate.release();
    assert!(t.fs.status().cache.readahead_failed_reads > 0);
    t.gate.fail_all.store(true, Ordering::SeqCst);
    let mut buf = vec![0u8; 64 * K as usize];
    let r = t.fs.read_at(t.ino, 2 * RA + 4 * K, &mut buf);
    assert!(
        r.is_err(),
        "read over a failed readahead returned {r:?}, not EIO"
    );
    t.gate.fail_all.store(false, Ordering::SeqCst);
    assert!(
        read(&t.fs, t.ino, 2 * RA + 4 * K, 64 * K)
            == t.data[(2 * RA + 4 * K) as usize..(2 * RA + 68 * K) as usize],
        "the retry reads the data"
    );
}

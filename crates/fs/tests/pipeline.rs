//! Buffered throughput: writeback keeps more than one batch on the device, and the switch
//! (`writeback_depth = 1`) brings back submit-and-wait per batch.
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use stripefs::{CreateParams, Fs, Ino, MkfsOptions, MountOptions};
use stripefs_iomap::cache::{CacheConfig, WbDepth};
use stripefs_iomap::WRITEBACK_BATCH_BYTES;
use stripefs_target::{Completion, IoOp, SimTarget, Target, TargetInfo};

/// Holds write completions until more than `hold_until` bytes of writes are in flight at
/// once (or `patience` passed), counting the peak. A writer that waits for each batch
/// before submitting the next never gets past one batch's bytes.
#[derive(Debug)]
struct HoldingView {
    inner: Arc<SimTarget>,
    in_flight: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
    hold_until: u64,
    patience: Duration,
}

impl Target for HoldingView {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: IoOp, done: Completion) {
        let IoOp::Write { bufs, .. } = &op else {
            return self.inner.submit(op, done);
        };
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let now = self.in_flight.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let inner = Arc::clone(&self.inner);
        let (in_flight, peak) = (Arc::clone(&self.in_flight), Arc::clone(&self.peak));
        let (hold_until, patience) = (self.hold_until, self.patience);
        std::thread::spawn(move || {
            let start = Instant::now();
            while peak.load(Ordering::SeqCst) <= hold_until && start.elapsed() < patience {
                std::thread::sleep(Duration::from_millis(1));
            }
            in_flight.fetch_sub(bytes, Ordering::SeqCst);
            inner.submit(op, done);
        });
    }
}

/// Writes three batches' worth of buffered data into one file, fsyncs it, and returns the
/// peak bytes of writes in flight (checking the data came back).
fn peak_in_flight(depth: WbDepth, patience: Duration) -> u64 {
    let file_bytes = 3 * WRITEBACK_BATCH_BYTES;
    let s = sims(2, file_bytes / 2 + (24 << 20));
    Fs::mkfs(
        &dyns(&s),
        &MkfsOptions {
            stripe_unit: 1 << 20,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let in_flight = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let views: Vec<Arc<dyn Target>> = s
        .iter()
        .map(|t| {
            Arc::new(HoldingView {
                inner: Arc::clone(t),
                in_flight: Arc::clone(&in_flight),
                peak: Arc::clone(&peak),
                hold_until: WRITEBACK_BATCH_BYTES,
                patience,
            }) as Arc<dyn Target>
        })
        .collect();
    let cache = CacheConfig {
        // Nothing is written back before the fsync: no throttling, no flusher.
        budget_bytes: 2 * file_bytes + (64 << 20),
        dirty_limit_bytes: file_bytes + (32 << 20),
        writeback_depth: depth,
        ..CacheConfig::default()
    };
    let (fs, _) = Fs::mount(views, MountOptions { cache, ..quiet() }).unwrap();
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let data = pattern(7, 0, file_bytes as usize);
    assert_eq!(fs.write_at(f.ino, 0, &data).unwrap(), data.len());
    peak.store(0, Ordering::SeqCst);
    fs.fsync(f.ino, stripefs::SyncScope::All).unwrap();
    let seen = peak.load(Ordering::SeqCst);
    let mut back = vec![0u8; data.len()];
    fs.read_direct(f.ino, 0, &mut back).unwrap();
    assert!(
        back == data,
        "the pipelined writeback wrote the file's data"
    );
    seen
}

#[test]
fn writeback_keeps_more_than_one_batch_in_flight() {
    let peak = peak_in_flight(WbDepth(2), Duration::from_secs(10));
    assert!(
        peak > WRITEBACK_BATCH_BYTES,
        "peak {peak} bytes in flight: writeback waited for each batch before the next"
    );
}

#[test]
fn writeback_depth_one_waits_for_each_batch() {
    let peak = peak_in_flight(WbDepth(1), Duration::from_millis(300));
    assert!(
        peak <= WRITEBACK_BATCH_BYTES,
        "peak {peak} bytes in flight with one batch at a time"
    );
}

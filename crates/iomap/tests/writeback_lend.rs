//! Writeback lending the folios' memory to the device (`WbCopy::Lend`) against staging
//! copies (`WbCopy::Stage`): a folio rewritten while its writeback is on the device. The
//! device here takes the bytes only when a held write is released (as an NBD client sends
//! them later), so it sees any change made to lent memory in between.
//!
//! Both modes: the write in flight carries exactly the bytes writeback took (stable
//! pages), the rewrite does not wait for the device and is what the cache reads, and it is
//! dirty again and reaches the device with the next writeback. Lending: the device is given
//! the folio's own memory (no copy), and the bytes past EOF in the EOF block go out as
//! zeros without the folio changing.

mod common;

use common::Linear;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use stripefs_iomap::cache::{CacheConfig, PageCache, WbCopy};
use stripefs_iomap::{self as iomap, WbWait, ZeroMode};
use stripefs_target::{Completion, IoOp, SimTarget, Target, TargetInfo};

const BS: u64 = 4096;
const FOLIO: u64 = 64 << 10;
const DEV: u64 = 1 << 20;

/// A device whose writes, while holding is on, wait until released; the simulated device
/// copies a write's bytes only then.
#[derive(Debug)]
struct HeldWrites {
    inner: SimTarget,
    state: Mutex<Held>,
    changed: Condvar,
}

#[derive(Default)]
struct Held {
    holding: bool,
    ops: Vec<(IoOp, Completion)>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("holding", &self.holding)
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl HeldWrites {
    fn new() -> Self {
        Self {
            inner: SimTarget::new("held", DEV, 512),
            state: Mutex::new(Held::default()),
            changed: Condvar::new(),
        }
    }

    fn hold(&self) {
        self.state.lock().unwrap().holding = true;
    }

    /// Waits until a write is held; returns the start addresses of its buffers.
    fn wait_held(&self) -> Vec<usize> {
        let g = self.state.lock().unwrap();
        let (g, t) = self
            .changed
            .wait_timeout_while(g, Duration::from_secs(20), |s| s.ops.is_empty())
            .unwrap();
        assert!(!t.timed_out(), "writeback submitted no write");
        match &g.ops[0].0 {
            IoOp::Write { bufs, .. } => bufs.iter().map(|b| b.as_ptr() as usize).collect(),
            op => panic!("held {op:?}"),
        }
    }

    /// Stops holding and lets the device carry out the held writes now.
    fn release(&self) {
        let ops = {
            let mut g = self.state.lock().unwrap();
            g.holding = false;
            std::mem::take(&mut g.ops)
        };
        for (op, done) in ops {
            self.inner.submit(op, done);
        }
    }
}

impl Target for HeldWrites {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let mut g = self.state.lock().unwrap();
        if g.holding && matches!(op, IoOp::Write { .. }) {
            g.ops.push((op, done));
            self.changed.notify_all();
            return;
        }
        drop(g);
        self.inner.submit(op, done);
    }
}

fn rewrite_during_writeback(mode: WbCopy) {
    let cache = PageCache::new(
        CacheConfig {
            folio_bytes: FOLIO as u32,
            writeback_copy: mode,
            ..CacheConfig::default()
        },
        BS as u32,
    );
    let fc = cache.file(1);
    let fs = Linear::new(HeldWrites::new(), BS, DEV);
    let old = vec![b'A'; FOLIO as usize];
    assert_eq!(
        iomap::write(&cache, &fs, &fc, 0, &old, ZeroMode::Cache).unwrap(),
        old.len()
    );
    // EOF inside the last block: its cached bytes past EOF are not zero.
    let size = FOLIO - 100;
    fs.size.store(size, Ordering::SeqCst);
    let folio_mem = fc.get(0).unwrap().lock().data.as_ptr() as usize;
    let new = vec![b'B'; 2 * BS as usize];
    fs.dev.hold();
    std::thread::scope(|s| {
        let wb = s.spawn(|| iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy));
        let bufs = fs.dev.wait_held();
        assert_eq!(
            bufs[0] == folio_mem,
            mode == WbCopy::Lend,
            "{mode:?}: the device writes from the folio's memory only when lending"
        );
        // The rewrite while the write is held: it neither waits nor changes what the
        // device will write.
        let n = iomap::write(&cache, &fs, &fc, BS, &new, ZeroMode::Cache).unwrap();
        assert_eq!(n, new.len());
        assert_eq!(
            cache.stats().lent_rewrites,
            u64::from(mode == WbCopy::Lend),
            "{mode:?}: a rewrite of lent memory is counted"
        );
        let mut got = vec![0u8; size as usize];
        assert_eq!(
            iomap::read(&cache, &fs, &fc, 0, &mut got).unwrap(),
            got.len()
        );
        let mut want = old[..size as usize].to_vec();
        want[BS as usize..3 * BS as usize].copy_from_slice(&new);
        assert!(got == want, "{mode:?}: the cache reads the rewrite");
        fs.dev.release();
        wb.join().expect("writeback thread").expect("writeback");
    });
    let mut disk = vec![b'A'; size as usize];
    disk.resize(FOLIO as usize, 0);
    let image = fs.dev.inner.live_image();
    assert!(
        image[..FOLIO as usize] == disk[..],
        "{mode:?}: the device got the bytes writeback took (first difference at {:?})",
        image.iter().zip(&disk).position(|(a, b)| a != b)
    );
    let g = fc.get(0).unwrap();
    assert_eq!(
        g.lock().data[size as usize],
        b'A',
        "{mode:?}: the folio's bytes past EOF are left alone"
    );
    assert!(
        fc.block_dirty(&cache, BS) && fc.block_dirty(&cache, 2 * BS),
        "{mode:?}: the rewrite is dirty again"
    );
    assert!(!fc.block_dirty(&cache, 0), "{mode:?}: the rest is clean");
    iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
    disk[BS as usize..3 * BS as usize].copy_from_slice(&new);
    assert!(
        fs.dev.inner.live_image()[..FOLIO as usize] == disk[..],
        "{mode:?}: the next writeback wrote the rewrite"
    );
    assert_eq!(cache.stats().dirty_bytes, 0);
}

#[test]
fn rewrite_during_lent_writeback() {
    rewrite_during_writeback(WbCopy::Lend);
}

#[test]
fn rewrite_during_staged_writeback() {
    rewrite_during_writeback(WbCopy::Stage);
}

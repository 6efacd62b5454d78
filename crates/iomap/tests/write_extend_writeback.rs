//! Writeback between two folios of one extending buffered write. The write copies its
//! bytes folio by folio; writeback (which holds no inode lock in the file system: the
//! background flusher) may take the first folio before the write reaches the second. It
//! reads the size under the folio lock and writes the EOF block's bytes past that size as
//! zeros, clearing the block's dirty bit, so the size must already cover what the write
//! put in the folio (`FileIo::extend_size`, called before the folio is unlocked).
//! Otherwise the bytes the write put past the old size in the old EOF block never reach
//! the device. Found by the file system's `model_ops` late-write configurations (bytes
//! read back as zeros).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use stripefs_iomap::cache::{CacheConfig, PageCache};
use stripefs_iomap::{
    self as iomap, CacheIo, FileIo, IoDir, Iomap, IomapFlags, IomapKind, IomapOp, IomapOps, WbEnd,
    WbOutcome, WbWait, ZeroMode,
};
use stripefs_target::{Batch, BufPool, IoBuf, IoOp, SimTarget, Target, TargetError};

const BS: u64 = 4096;
const FOLIO: u64 = 64 << 10;
const DEV: u64 = 1 << 20;

/// Where the writer stands at the held mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Open,
    /// A buffered write's mapping at the held position waits here.
    Armed,
    Waiting,
}

/// One file mapped onto the device at the same offsets, every block written, mappings one
/// folio long; a buffered write's mapping of `hold_at` waits until the test opens the
/// gate.
struct Linear {
    dev: SimTarget,
    size: AtomicU64,
    pool: BufPool,
    hold_at: u64,
    gate: Mutex<Gate>,
    cv: Condvar,
}

impl Linear {
    fn wait_writer(&self) {
        let mut g = self.gate.lock().unwrap();
        while *g != Gate::Waiting {
            let (next, t) = self.cv.wait_timeout(g, Duration::from_secs(20)).unwrap();
            assert!(!t.timed_out(), "the write never reached the held mapping");
            g = next;
        }
    }

    fn open(&self) {
        *self.gate.lock().unwrap() = Gate::Open;
        self.cv.notify_all();
    }
}

impl IomapOps for Linear {
    type Addr = u64;
    type Error = String;

    fn begin(&self, pos: u64, _len: u64, op: IomapOp) -> Result<Iomap<u64>, String> {
        if op == IomapOp::BufferedWrite && pos == self.hold_at {
            let mut g = self.gate.lock().unwrap();
            if *g == Gate::Armed {
                *g = Gate::Waiting;
                self.cv.notify_all();
                while *g == Gate::Waiting {
                    g = self.cv.wait(g).unwrap();
                }
            }
        }
        let offset = pos / BS * BS;
        Ok(Iomap {
            offset,
            length: (offset / FOLIO + 1) * FOLIO - offset,
            kind: IomapKind::Mapped,
            flags: IomapFlags::NONE,
            addr: offset,
            seq: 0,
        })
    }

    fn end(&self, _: &Iomap<u64>, _: u64, _: u64, _: IomapOp) -> Result<(), String> {
        Ok(())
    }

    fn still_valid(&self, _: &Iomap<u64>) -> bool {
        true
    }
}

impl FileIo for Linear {
    fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }

    fn extend_size(&self, end: u64) {
        self.size.fetch_max(end, Ordering::SeqCst);
    }

    fn submit(
        &self,
        batch: &Batch,
        map: &Iomap<u64>,
        pos: u64,
        dir: IoDir,
        bufs: Vec<IoBuf>,
    ) -> usize {
        let offset = map.addr + (pos - map.offset);
        let op = match dir {
            IoDir::Write => IoOp::Write { offset, bufs },
            IoDir::Read => IoOp::Read { offset, bufs },
        };
        batch.submit(&self.dev, op)
    }

    fn buffers(&self) -> &BufPool {
        &self.pool
    }

    fn io_error(&self, e: TargetError) -> String {
        e.to_string()
    }

    fn contract_error(&self, what: String) -> String {
        what
    }
}

impl CacheIo for Linear {
    fn errno(&self, _: &String) -> i32 {
        5
    }

    fn writeback_done(&self, _: &[WbEnd<u64>], outcome: WbOutcome) -> Result<(), String> {
        assert_eq!(outcome, WbOutcome::Written);
        Ok(())
    }

    fn next_stored(&self, pos: u64, _end: u64) -> Result<u64, String> {
        Ok(pos)
    }
}

#[test]
fn writeback_between_the_folios_of_an_extending_write_keeps_its_bytes() {
    let cache = PageCache::new(
        CacheConfig {
            folio_bytes: FOLIO as u32,
            ..CacheConfig::default()
        },
        BS as u32,
    );
    let fc = cache.file(1);
    let fs = Linear {
        dev: SimTarget::new("dev", DEV, 512),
        size: AtomicU64::new(0),
        pool: BufPool::new(4 << 20),
        hold_at: FOLIO,
        gate: Mutex::new(Gate::Open),
        cv: Condvar::new(),
    };
    // A file ending inside its second block, on the device.
    let old_size = BS + 100;
    let old = vec![b'A'; old_size as usize];
    iomap::write(&cache, &fs, &fc, 0, &old, ZeroMode::Cache).unwrap();
    fs.size.store(old_size, Ordering::SeqCst);
    iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
    // An extending write from the old EOF into the second folio, stopped at the second
    // folio's mapping while writeback runs.
    let new = vec![b'B'; (FOLIO + BS - old_size) as usize];
    *fs.gate.lock().unwrap() = Gate::Armed;
    std::thread::scope(|s| {
        let writer = s.spawn(|| iomap::write(&cache, &fs, &fc, old_size, &new, ZeroMode::Cache));
        fs.wait_writer();
        iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
        fs.open();
        assert_eq!(writer.join().expect("writer").unwrap(), new.len());
    });
    // The file system grows its size after the write at the latest.
    fs.extend_size(old_size + new.len() as u64);
    iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
    let mut want = old;
    want.extend_from_slice(&new);
    let disk = fs.dev.read_sync(0, want.len()).unwrap();
    if let Some(i) = (0..want.len()).find(|&i| disk[i] != want[i]) {
        panic!(
            "byte {i} on the device is {:#x}, written {:#x} (old EOF {old_size})",
            disk[i], want[i]
        );
    }
    assert_eq!(cache.stats().dirty_bytes, 0, "nothing is left dirty");
}

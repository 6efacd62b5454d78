//! Writeback between two folios of one extending buffered write. The write copies its
//! bytes folio by folio; writeback (which holds no inode lock in the file system: the
//! background flusher) may take the first folio before the write reaches the second. It
//! reads the size under the folio lock and writes the EOF block's bytes past that size as
//! zeros, clearing the block's dirty bit, so the size must already cover what the write
//! put in the folio (`FileIo::extend_size`, called before the folio is unlocked).
//! Otherwise the bytes the write put past the old size in the old EOF block never reach
//! the device. Found by the file system's `model_ops` late-write configurations (bytes
//! read back as zeros).

mod common;

use common::Linear;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use stripefs_iomap::cache::{CacheConfig, PageCache};
use stripefs_iomap::{self as iomap, FileIo, IomapOp, WbWait, ZeroMode};
use stripefs_target::{SimTarget, Target};

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

/// The gate a buffered write's mapping of one position waits at.
struct Hold {
    at: u64,
    gate: Mutex<Gate>,
    cv: Condvar,
}

impl Hold {
    fn at_mapping(&self, pos: u64, op: IomapOp) {
        if op != IomapOp::BufferedWrite || pos != self.at {
            return;
        }
        let mut g = self.gate.lock().unwrap();
        if *g == Gate::Armed {
            *g = Gate::Waiting;
            self.cv.notify_all();
            while *g == Gate::Waiting {
                g = self.cv.wait(g).unwrap();
            }
        }
    }

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
    let hold = Arc::new(Hold {
        at: FOLIO,
        gate: Mutex::new(Gate::Open),
        cv: Condvar::new(),
    });
    let mut fs = Linear::new(SimTarget::new("dev", DEV, 512), BS, FOLIO);
    let h = Arc::clone(&hold);
    fs.before_map = Some(Box::new(move |pos, op| h.at_mapping(pos, op)));
    // A file ending inside its second block, on the device.
    let old_size = BS + 100;
    let old = vec![b'A'; old_size as usize];
    iomap::write(&cache, &fs, &fc, 0, &old, ZeroMode::Cache).unwrap();
    fs.size.store(old_size, Ordering::SeqCst);
    iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
    // An extending write from the old EOF into the second folio, stopped at the second
    // folio's mapping while writeback runs.
    let new = vec![b'B'; (FOLIO + BS - old_size) as usize];
    *hold.gate.lock().unwrap() = Gate::Armed;
    std::thread::scope(|s| {
        let writer = s.spawn(|| iomap::write(&cache, &fs, &fc, old_size, &new, ZeroMode::Cache));
        hold.wait_writer();
        iomap::writeback(&cache, &fs, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
        hold.open();
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

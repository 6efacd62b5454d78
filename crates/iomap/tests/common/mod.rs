//! `Linear`: one file mapped onto a device at the same offsets, every block written; the
//! fake file system of the iomap tests that need a real device under the page cache.

use std::sync::atomic::{AtomicU64, Ordering};

use stripefs_iomap::{
    CacheIo, FileIo, IoDir, Iomap, IomapFlags, IomapKind, IomapOp, IomapOps, WbEnd, WbOutcome,
};
use stripefs_target::{Batch, BufPool, IoBuf, IoOp, Target, TargetError};

/// Called at the start of every mapping (position, operation): where a test stops a path.
pub type BeforeMap = Box<dyn Fn(u64, IomapOp) + Send + Sync>;

/// One file mapped onto `dev` at the same offsets, every block written. Mappings end at
/// the next multiple of `map_bytes` (or the device's end).
pub struct Linear<D: Target> {
    pub dev: D,
    pub size: AtomicU64,
    pub pool: BufPool,
    pub block: u64,
    pub map_bytes: u64,
    pub before_map: Option<BeforeMap>,
}

impl<D: Target> Linear<D> {
    /// An empty file over `dev`, mappings up to `map_bytes` long.
    pub fn new(dev: D, block: u64, map_bytes: u64) -> Linear<D> {
        Linear {
            dev,
            size: AtomicU64::new(0),
            pool: BufPool::new(4 << 20),
            block,
            map_bytes,
            before_map: None,
        }
    }
}

impl<D: Target> IomapOps for Linear<D> {
    type Addr = u64;
    type Error = String;

    fn begin(&self, pos: u64, _len: u64, op: IomapOp) -> Result<Iomap<u64>, String> {
        if let Some(hook) = &self.before_map {
            hook(pos, op);
        }
        let offset = pos / self.block * self.block;
        let end = ((offset / self.map_bytes + 1) * self.map_bytes).min(self.dev.info().size_bytes);
        Ok(Iomap {
            offset,
            length: end - offset,
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

impl<D: Target> FileIo for Linear<D> {
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

impl<D: Target> CacheIo for Linear<D> {
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

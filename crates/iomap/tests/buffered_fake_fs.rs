//! The generic buffered paths (read, write, zero range, writeback, invalidation) against a
//! fake file system that answers with adversarial mappings: arbitrarily short ones, ones
//! whose validity cookie is already stale when returned, unwritten extents under dirty
//! cache, delalloc. Every read is checked against a byte model; after a final writeback
//! and a cache drop, the fake device must hold exactly the model too.

use std::cell::RefCell;
use std::collections::BTreeMap;

use stripefs_iomap::cache::{
    CacheConfig, Flusher, FolioSizing, PageCache, ReadCopy, ReadaheadMode, WbCopy, WbDepth,
};
use stripefs_iomap::folio::DirtyTracking;
use stripefs_iomap::{
    self as iomap, CacheIo, FileIo, IoDir, Iomap, IomapFlags, IomapKind, IomapOp, IomapOps, WbEnd,
    WbOutcome, WbWait, ZeroMode,
};
use stripefs_target::{Batch, BufPool, IoBuf, IoOp, Rng, SimTarget, Target, TargetError};

const BS: u64 = 1024;
const DEV_BLOCKS: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blk {
    Hole,
    Delalloc,
    Unwritten(u64),
    Written(u64),
}

/// A one-file file system on a simulated device, mapping one block run at a time.
struct Fake {
    dev: SimTarget,
    blocks: RefCell<BTreeMap<u64, Blk>>,
    next_phys: RefCell<u64>,
    size: RefCell<u64>,
    seq: RefCell<u64>,
    rng: RefCell<Rng>,
    pool: BufPool,
}

impl Fake {
    fn blk(&self, b: u64) -> Blk {
        *self.blocks.borrow().get(&b).unwrap_or(&Blk::Hole)
    }

    fn set(&self, b: u64, v: Blk) {
        self.blocks.borrow_mut().insert(b, v);
        *self.seq.borrow_mut() += 1;
    }

    fn alloc(&self) -> u64 {
        let mut p = self.next_phys.borrow_mut();
        *p += 1;
        assert!(*p < DEV_BLOCKS, "fake device full");
        *p
    }
}

impl IomapOps for Fake {
    type Addr = u64;
    type Error = String;

    fn begin(&self, pos: u64, len: u64, op: IomapOp) -> Result<Iomap<u64>, String> {
        let b0 = pos / BS;
        let want = ((pos + len).div_ceil(BS) - b0).max(1);
        // Adversarial length: often just one block.
        let limit = if self.rng.borrow_mut().one_in(2) {
            1
        } else {
            want
        };
        let kind_of = |b: &Blk| match b {
            Blk::Hole => 0,
            Blk::Delalloc => 1,
            Blk::Unwritten(_) => 2,
            Blk::Written(_) => 3,
        };
        let first = self.blk(b0);
        let mut n = 1;
        // Extend over blocks of the same kind with consecutive physical addresses.
        while n < limit {
            let next = self.blk(b0 + n);
            let contiguous = match (first, next) {
                (Blk::Unwritten(p), Blk::Unwritten(q)) | (Blk::Written(p), Blk::Written(q)) => {
                    q == p + n
                }
                (a, b) => kind_of(&a) == kind_of(&b) && matches!(a, Blk::Hole | Blk::Delalloc),
            };
            if !contiguous {
                break;
            }
            n += 1;
        }
        let (kind, flags, phys) = match (first, op) {
            (Blk::Hole, IomapOp::BufferedWrite) => {
                for b in b0..b0 + n {
                    self.set(b, Blk::Delalloc);
                }
                (IomapKind::Delalloc, IomapFlags::RESERVED, 0)
            }
            (Blk::Hole | Blk::Delalloc, IomapOp::Writeback | IomapOp::Write) => {
                // Allocate one block (short mappings again).
                n = 1;
                (IomapKind::Mapped, IomapFlags::NEW, self.alloc())
            }
            (Blk::Hole, _) => (IomapKind::Hole, IomapFlags::NONE, 0),
            (Blk::Delalloc, _) => (IomapKind::Delalloc, IomapFlags::NONE, 0),
            (Blk::Unwritten(p), _) => (IomapKind::Unwritten, IomapFlags::NONE, p),
            (Blk::Written(p), _) => (IomapKind::Mapped, IomapFlags::NONE, p),
        };
        let mut seq = *self.seq.borrow();
        if op == IomapOp::Report && self.rng.borrow_mut().one_in(4) {
            seq = seq.wrapping_sub(1); // Already stale: the zero path must look again.
        }
        Ok(Iomap {
            offset: b0 * BS,
            length: n * BS,
            kind,
            flags,
            addr: phys,
            seq,
        })
    }

    fn end(&self, map: &Iomap<u64>, pos: u64, used: u64, op: IomapOp) -> Result<(), String> {
        if op == IomapOp::BufferedWrite && map.flags.contains(IomapFlags::RESERVED) {
            let keep_end = if used == 0 {
                map.offset
            } else {
                (pos + used).div_ceil(BS) * BS
            };
            for b in keep_end / BS..map.end() / BS {
                self.set(b, Blk::Hole);
            }
        }
        Ok(())
    }

    fn still_valid(&self, map: &Iomap<u64>) -> bool {
        *self.seq.borrow() == map.seq
    }
}

impl FileIo for Fake {
    fn size(&self) -> u64 {
        *self.size.borrow()
    }

    fn extend_size(&self, end: u64) {
        let mut size = self.size.borrow_mut();
        *size = (*size).max(end);
    }

    fn submit(
        &self,
        batch: &Batch,
        map: &Iomap<u64>,
        pos: u64,
        dir: IoDir,
        bufs: Vec<IoBuf>,
    ) -> usize {
        let write = dir == IoDir::Write;
        assert!(
            map.kind == IomapKind::Mapped || map.kind == IomapKind::Unwritten || write,
            "reading a {:?} mapping",
            map.kind
        );
        let offset = map.addr * BS + (pos - map.offset);
        let op = if write {
            IoOp::Write { offset, bufs }
        } else {
            IoOp::Read { offset, bufs }
        };
        batch.submit(&self.dev, op)
    }

    fn io_error(&self, e: TargetError) -> String {
        e.to_string()
    }

    fn contract_error(&self, what: String) -> String {
        what
    }

    fn buffers(&self) -> &BufPool {
        &self.pool
    }
}

impl CacheIo for Fake {
    fn errno(&self, _: &String) -> i32 {
        5
    }

    fn writeback_done(&self, ends: &[WbEnd<u64>], outcome: WbOutcome) -> Result<(), String> {
        assert_eq!(
            outcome,
            WbOutcome::Written,
            "the simulated device does not fail here"
        );
        for e in ends {
            assert!(
                e.pos % BS == 0 && e.len % BS == 0,
                "writeback submits whole blocks"
            );
            for i in 0..e.len / BS {
                let b = e.pos / BS + i;
                self.set(
                    b,
                    Blk::Written(e.map.addr + (e.pos - e.map.offset) / BS + i),
                );
            }
        }
        Ok(())
    }

    fn next_stored(&self, pos: u64, end: u64) -> Result<u64, String> {
        // Adversarial too: half the time the conservative answer.
        if self.rng.borrow_mut().one_in(2) {
            return Ok(pos);
        }
        let stored = self
            .blocks
            .borrow()
            .range(pos / BS..end.div_ceil(BS))
            .find(|(_, b)| matches!(b, Blk::Written(_) | Blk::Delalloc))
            .map(|(&b, _)| (b * BS).max(pos));
        Ok(stored.unwrap_or(end))
    }
}

fn run(seed: u64, tracking: DirtyTracking, folio_bytes: u32, folio_sizing: FolioSizing) {
    let cfg = CacheConfig {
        folio_bytes,
        folio_sizing,
        budget_bytes: 1 << 20,
        dirty_limit_bytes: 256 << 10,
        dirty_tracking: tracking,
        readahead_bytes: 16 << 10,
        readahead: if seed.is_multiple_of(2) {
            ReadaheadMode::Async
        } else {
            ReadaheadMode::Sync
        },
        writeback_depth: WbDepth(1 + (seed % 3) as u32),
        writeback_copy: if seed % 4 < 2 {
            WbCopy::Lend
        } else {
            WbCopy::Stage
        },
        read_copy: if seed % 8 < 4 {
            ReadCopy::Swap
        } else {
            ReadCopy::Bounce
        },
        ..CacheConfig::default()
    };
    let cache = PageCache::new(cfg, BS as u32);
    let fc = cache.file(1);
    let fake = Fake {
        dev: SimTarget::from_image("fake", vec![0xEE; (DEV_BLOCKS * BS) as usize], 512),
        blocks: RefCell::new(BTreeMap::new()),
        next_phys: RefCell::new(0),
        size: RefCell::new(0),
        seq: RefCell::new(0),
        rng: RefCell::new(Rng::new(seed ^ 0xABCD)),
        pool: BufPool::new(1 << 20),
    };
    let mut rng = Rng::new(seed);
    let mut model: Vec<u8> = Vec::new();
    let max = 200 * BS;
    // End of the last read: half the reads go on from there (sequential: readahead).
    let mut next_read = 0;
    for step in 0..1500 {
        let size = model.len() as u64;
        match rng.below(10) {
            0..=3 => {
                let off = rng.below(size + 8 * BS).min(max - 1);
                let len = rng.range(1, 6 * BS).min(max - off);
                let data: Vec<u8> = (0..len)
                    .map(|i| (seed as u8).wrapping_add((step + i) as u8) | 1)
                    .collect();
                let n = iomap::write(&cache, &fake, &fc, off, &data, ZeroMode::Cache).unwrap();
                assert_eq!(n as u64, len);
                *fake.size.borrow_mut() = size.max(off + len);
                if model.len() < (off + len) as usize {
                    model.resize((off + len) as usize, 0);
                }
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
                // Over the dirty limit the writer writes back itself (no flusher here).
                iomap::balance_dirty(&cache, &fake, &fc, Flusher::Absent).unwrap();
            }
            4..=5 => {
                let off = if rng.one_in(2) {
                    next_read
                } else {
                    rng.below(size + BS)
                };
                let len = rng.range(1, 8 * BS);
                next_read = off + len;
                let mut buf = vec![0u8; len as usize];
                let n = iomap::read(&cache, &fake, &fc, off, &mut buf).unwrap();
                let want = (size.saturating_sub(off)).min(len) as usize;
                assert_eq!(n, want, "seed {seed} step {step}: read length");
                assert!(
                    n == 0 || buf[..n] == model[off as usize..off as usize + n],
                    "seed {seed} step {step}: read content at {off}"
                );
            }
            6 => {
                // Zero inside EOF through the cache (with stale cookies now and then).
                if size > 0 {
                    let off = rng.below(size);
                    let len = rng.range(1, 4 * BS).min(size - off);
                    iomap::zero_range(&cache, &fake, &fc, off, len, ZeroMode::Cache).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
            }
            7 => {
                iomap::writeback(&cache, &fake, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
            }
            8 => {
                // Preallocate unwritten blocks under whatever is cached (possibly dirty).
                let b = rng.below(size / BS + 4);
                if fake.blk(b) == Blk::Hole {
                    let p = fake.alloc();
                    fake.set(b, Blk::Unwritten(p));
                }
            }
            _ => {
                // Drop clean cache (what eviction does) after writing everything back.
                iomap::writeback(&cache, &fake, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
                iomap::invalidate_range(&cache, &fc, 0, u64::MAX);
            }
        }
    }
    iomap::writeback(&cache, &fake, &fc, 0, u64::MAX, WbWait::Busy).unwrap();
    iomap::invalidate_range(&cache, &fc, 0, u64::MAX);
    assert_eq!(
        cache.stats().dirty_bytes,
        0,
        "dirty accounting returns to zero"
    );
    let st = cache.stats();
    assert_eq!(st.resident_bytes, 0, "seed {seed}: resident accounting");
    assert_eq!(st.clean_folios + st.dirty_folios + st.writeback_folios, 0);
    // The device now holds the model: written blocks have the bytes, the rest read zero.
    for (b, chunk) in model.chunks(BS as usize).enumerate() {
        let got = match fake.blk(b as u64) {
            Blk::Written(p) => {
                fake.dev.read_sync(p * BS, BS as usize).unwrap()[..chunk.len()].to_vec()
            }
            Blk::Hole | Blk::Unwritten(_) => vec![0; chunk.len()],
            Blk::Delalloc => panic!("seed {seed}: block {b} still delalloc after writeback"),
        };
        assert!(
            got == chunk,
            "seed {seed}: block {b} on the device differs from the model"
        );
    }
}

#[test]
fn adversarial_mappings_block_tracking() {
    for seed in 1..=12 {
        for sizing in [FolioSizing::File, FolioSizing::Fixed] {
            run(seed, DirtyTracking::Block, 4096, sizing);
            run(seed, DirtyTracking::Block, 16384, sizing);
        }
    }
}

#[test]
fn adversarial_mappings_folio_tracking() {
    for seed in 1..=12 {
        run(seed, DirtyTracking::Folio, 8192, FolioSizing::File);
        run(seed, DirtyTracking::Folio, 8192, FolioSizing::Fixed);
    }
}

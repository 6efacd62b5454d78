//! Folio state: per-block uptodate and dirty bits.
//!
//! A folio caches `folio_size` bytes of a file (a power of two, 4 KiB to 2 MiB) and holds
//! `blocks` file-system blocks. Each block has an *uptodate* bit (the cached bytes are the
//! file's bytes) and a *dirty* bit (the cached bytes must be written back). With
//! [`DirtyTracking::Folio`] (the pre-6.6 behaviour kept as a benchmark switch) dirtying any
//! block dirties them all, so writeback writes the whole folio.
//!
//! Invariants:
//! - I-002-7: the folio is uptodate exactly when every block is, and I-002-1: it counts as
//!   dirty exactly when some block is. Both hold by construction: the folio-wide answers
//!   are computed from the block bits ([`FolioState::folio_uptodate`],
//!   [`FolioState::folio_dirty`]), never stored;
//! - a dirty block is uptodate (we never write back bytes we do not have):
//!   [`FolioState::check`], asserted after every change of the dirty bits in debug builds
//!   and run by the random-sequence unit test below against a model.

/// Granularity of dirty tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyTracking {
    /// Per block: writeback writes only dirty blocks (iomap since Linux 6.6).
    #[default]
    Block,
    /// Per folio: a dirty folio is written back whole (before 6.6).
    Folio,
}

/// A fixed-size bitmap of at most 512 bits (2 MiB folio of 4 KiB blocks; 2048 for 1 KiB).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bits {
    words: Vec<u64>,
    len: u32,
}

impl Bits {
    fn new(len: u32) -> Self {
        Self {
            words: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }
    fn get(&self, i: u32) -> bool {
        self.words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }
    /// Sets bits `[from, to)`.
    fn set_range(&mut self, from: u32, to: u32) {
        for i in from..to {
            self.words[(i / 64) as usize] |= 1 << (i % 64);
        }
    }
    /// Clears bits `[from, to)`.
    fn clear_range(&mut self, from: u32, to: u32) {
        for i in from..to {
            self.words[(i / 64) as usize] &= !(1 << (i % 64));
        }
    }
    fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }
    fn all(&self) -> bool {
        self.count() == self.len
    }
    fn any(&self) -> bool {
        self.words.iter().any(|&w| w != 0)
    }
}

/// Uptodate and dirty state of one folio's blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolioState {
    uptodate: Bits,
    dirty: Bits,
    tracking: DirtyTracking,
}

/// A run of consecutive blocks `[first, first + count)` within a folio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRun {
    pub first: u32,
    pub count: u32,
}

impl FolioState {
    /// All blocks neither uptodate nor dirty.
    #[must_use]
    pub fn new(blocks: u32, tracking: DirtyTracking) -> Self {
        assert!(blocks >= 1, "a folio holds at least one block");
        Self {
            uptodate: Bits::new(blocks),
            dirty: Bits::new(blocks),
            tracking,
        }
    }

    /// Blocks in the folio.
    #[must_use]
    pub fn blocks(&self) -> u32 {
        self.uptodate.len
    }

    /// True if block `b` is uptodate.
    #[must_use]
    pub fn is_uptodate(&self, b: u32) -> bool {
        self.uptodate.get(b)
    }

    /// True if block `b` is dirty.
    #[must_use]
    pub fn is_dirty(&self, b: u32) -> bool {
        self.dirty.get(b)
    }

    /// True if every block is uptodate (I-002-7).
    #[must_use]
    pub fn folio_uptodate(&self) -> bool {
        self.uptodate.all()
    }

    /// True if any block is dirty (I-002-1).
    #[must_use]
    pub fn folio_dirty(&self) -> bool {
        self.dirty.any()
    }

    /// Number of dirty blocks.
    #[must_use]
    pub fn dirty_blocks(&self) -> u32 {
        self.dirty.count()
    }

    /// Marks blocks `[from, to)` uptodate.
    pub fn set_uptodate(&mut self, from: u32, to: u32) {
        self.uptodate.set_range(from, to);
    }

    /// Marks blocks `[from, to)` dirty (they must be uptodate). Returns how many blocks
    /// became dirty. With folio tracking every block of the folio becomes dirty, which
    /// requires the whole folio to be uptodate.
    pub fn set_dirty(&mut self, from: u32, to: u32) -> u32 {
        let before = self.dirty.count();
        let (from, to) = match self.tracking {
            DirtyTracking::Block => (from, to),
            DirtyTracking::Folio => (0, self.blocks()),
        };
        debug_assert!(
            (from..to).all(|b| self.uptodate.get(b)),
            "dirtying a block that is not uptodate"
        );
        self.dirty.set_range(from, to);
        debug_assert_eq!(self.check(), None);
        self.dirty.count() - before
    }

    /// Clears the dirty bits of `[from, to)` (writeback took them, or the range was
    /// discarded). Returns how many blocks were dirty.
    pub fn clear_dirty(&mut self, from: u32, to: u32) -> u32 {
        let before = self.dirty.count();
        self.dirty.clear_range(from, to);
        before - self.dirty.count()
    }

    /// Forgets blocks `[from, to)`: neither uptodate nor dirty (truncate, punch,
    /// invalidation). Returns how many were dirty.
    pub fn invalidate(&mut self, from: u32, to: u32) -> u32 {
        self.uptodate.clear_range(from, to);
        let dirty = self.clear_dirty(from, to);
        debug_assert_eq!(self.check(), None);
        dirty
    }

    /// Runs of dirty blocks in order (what writeback submits, I-002-5).
    #[must_use]
    pub fn dirty_runs(&self) -> Vec<BlockRun> {
        let mut out = Vec::new();
        let mut b = 0;
        while b < self.blocks() {
            if !self.dirty.get(b) {
                b += 1;
                continue;
            }
            let first = b;
            while b < self.blocks() && self.dirty.get(b) {
                b += 1;
            }
            out.push(BlockRun {
                first,
                count: b - first,
            });
        }
        out
    }

    /// Checks the invariants; returns the first violation.
    #[must_use]
    pub fn check(&self) -> Option<String> {
        (0..self.blocks())
            .find(|&b| self.dirty.get(b) && !self.uptodate.get(b))
            .map(|b| format!("block {b} is dirty but not uptodate"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random write / writeback / invalidate / truncate sequences against a model of
    /// per-block booleans.
    #[test]
    fn matches_a_model_under_random_sequences() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut rnd = |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(n)) as u32
        };
        for blocks in [1u32, 2, 16, 64, 512] {
            for tracking in [DirtyTracking::Block, DirtyTracking::Folio] {
                let mut s = FolioState::new(blocks, tracking);
                let (mut up, mut dirty) =
                    (vec![false; blocks as usize], vec![false; blocks as usize]);
                for _ in 0..2000 {
                    let a = rnd(blocks);
                    let b = a + 1 + rnd(blocks - a);
                    match rnd(4) {
                        0 => {
                            // write: the range becomes uptodate and dirty
                            if tracking == DirtyTracking::Folio {
                                s.set_uptodate(0, blocks);
                                up.iter_mut().for_each(|x| *x = true);
                            }
                            s.set_uptodate(a, b);
                            s.set_dirty(a, b);
                            let (lo, hi) = if tracking == DirtyTracking::Folio {
                                (0, blocks)
                            } else {
                                (a, b)
                            };
                            for i in a..b {
                                up[i as usize] = true;
                            }
                            for i in lo..hi {
                                dirty[i as usize] = true;
                            }
                        }
                        1 => {
                            // writeback of the dirty runs
                            let runs = s.dirty_runs();
                            let n: u32 = runs.iter().map(|r| r.count).sum();
                            assert_eq!(n as usize, dirty.iter().filter(|&&d| d).count());
                            for r in runs {
                                s.clear_dirty(r.first, r.first + r.count);
                            }
                            dirty.iter_mut().for_each(|x| *x = false);
                        }
                        2 => {
                            s.invalidate(a, b);
                            for i in a..b {
                                up[i as usize] = false;
                                dirty[i as usize] = false;
                            }
                        }
                        _ => {
                            // truncate: everything from `a` on goes
                            s.invalidate(a, blocks);
                            for i in a..blocks {
                                up[i as usize] = false;
                                dirty[i as usize] = false;
                            }
                        }
                    }
                    for i in 0..blocks {
                        assert_eq!(s.is_uptodate(i), up[i as usize]);
                        assert_eq!(s.is_dirty(i), dirty[i as usize]);
                    }
                    assert_eq!(s.folio_uptodate(), up.iter().all(|&x| x), "I-002-7");
                    assert_eq!(s.folio_dirty(), dirty.iter().any(|&x| x), "I-002-1");
                    assert!(s.check().is_none());
                }
            }
        }
    }

    #[test]
    fn dirty_runs_are_exact() {
        let mut s = FolioState::new(16, DirtyTracking::Block);
        s.set_uptodate(0, 16);
        s.set_dirty(2, 4);
        s.set_dirty(9, 10);
        s.set_dirty(15, 16);
        assert_eq!(
            s.dirty_runs(),
            vec![
                BlockRun { first: 2, count: 2 },
                BlockRun { first: 9, count: 1 },
                BlockRun {
                    first: 15,
                    count: 1
                }
            ]
        );
        let mut f = FolioState::new(16, DirtyTracking::Folio);
        f.set_uptodate(0, 16);
        assert_eq!(
            f.set_dirty(3, 4),
            16,
            "folio tracking dirties the whole folio"
        );
    }
}

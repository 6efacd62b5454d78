//! `RegionAlloc`: pages from a fixed range of blocks on one or more targets, tracked in
//! memory. The allocator of tests and tools; the file system's allocator implements
//! [`crate::PageAlloc`] after integration. After a crash it is rebuilt from what the
//! durable trees reach ([`RegionAlloc::mark_used`] over [`crate::Store::walk`]).

use parking_lot::Mutex;
use stripefs_core::btree::PageAddr;
use stripefs_core::{PhysBlock, TargetId};

use crate::{MetaError, PageAlloc};

/// Page-sized slots `first, first + step, ...` (`count` of them) on each target.
#[derive(Debug)]
pub struct RegionAlloc {
    targets: u32,
    first: u64,
    step: u64,
    count: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    used: Vec<bool>,
    cursor: usize,
}

impl RegionAlloc {
    /// `count` pages of `step` blocks from block `first` on each of `targets` targets,
    /// handed out round robin across the targets.
    #[must_use]
    pub fn new(targets: u32, first: u64, step: u64, count: u64) -> RegionAlloc {
        let slots = usize::try_from(count * u64::from(targets)).expect("slots fit");
        RegionAlloc {
            targets,
            first,
            step,
            count,
            state: Mutex::new(State {
                used: vec![false; slots],
                cursor: 0,
            }),
        }
    }

    fn addr(&self, i: usize) -> PageAddr {
        let i = i as u64;
        PageAddr {
            target: TargetId((i % u64::from(self.targets)) as u32),
            block: PhysBlock(self.first + (i / u64::from(self.targets)) * self.step),
        }
    }

    fn index(&self, a: PageAddr) -> Option<usize> {
        let off = a.block.0.checked_sub(self.first)?;
        let n = off / self.step;
        let ok = off % self.step == 0 && n < self.count && a.target.0 < self.targets;
        ok.then(|| (n * u64::from(self.targets) + u64::from(a.target.0)) as usize)
    }

    /// Marks a page reachable from a durable tree as in use (rebuild after open).
    pub fn mark_used(&self, a: PageAddr) {
        if let Some(i) = self.index(a) {
            self.state.lock().used[i] = true;
        }
    }

    /// Pages in use.
    #[must_use]
    pub fn used(&self) -> usize {
        self.state.lock().used.iter().filter(|u| **u).count()
    }
}

impl PageAlloc for RegionAlloc {
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError> {
        let mut s = self.state.lock();
        let total = s.used.len();
        let mut out = Vec::with_capacity(n);
        let mut probe = 0;
        while out.len() < n && probe < total {
            let i = (s.cursor + probe) % total;
            probe += 1;
            if !s.used[i] {
                s.used[i] = true;
                out.push(i);
            }
        }
        s.cursor = (s.cursor + probe) % total.max(1);
        if out.len() < n {
            for i in out {
                s.used[i] = false;
            }
            return Err(MetaError::NoSpace(format!("{n} pages wanted, region full")));
        }
        Ok(out.into_iter().map(|i| self.addr(i)).collect())
    }

    fn free(&self, pages: &[PageAddr]) {
        let mut s = self.state.lock();
        for a in pages {
            let i = self.index(*a).expect("a page of this region");
            debug_assert!(s.used[i], "{a} freed twice");
            s.used[i] = false;
        }
    }
}

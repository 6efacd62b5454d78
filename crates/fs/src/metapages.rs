//! `MetaPages`: the metadata trees' [`PageAlloc`] over the file system's allocator.
//!
//! Pages come from the data area of every target, spread round robin, so there is no
//! fixed metadata area (`docs/design/metadata.md`, "Space"). A page is
//! [`Geometry::page_blocks`] contiguous blocks (more than one only when blocks are smaller
//! than 4 KiB). The store frees a page only once no durable root reaches it, so freed
//! pages return to the free map at once (no busy period: no journal transaction refers to
//! them).
//!
//! Pages draw on the allocator's metadata reserve ([`Draw::Meta`]), which data cannot
//! take, so a checkpoint finds room for its copy-on-write pages when users filled the disk.
//!
//! The allocator lives under the file system's metadata lock (`MetaCore::alloc`); the
//! store that uses this allocator belongs to the file system, so a mounted `MetaPages`
//! reaches it through a weak reference set once the file system exists (no `Arc` cycle).
//! mkfs uses the same type over a fresh allocator of its own. Allocation takes the
//! metadata lock for the moment of the allocation only; the store calls it from a
//! checkpoint, which holds the commit lock (lock order: commit lock, then metadata lock).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{OnceLock, Weak};

use parking_lot::Mutex;
use stripefs_core::alloc::Allocator;
use stripefs_core::btree::PageAddr;
use stripefs_core::geometry::Geometry;
use stripefs_core::{PhysBlock, TargetId};
use stripefs_meta::{MetaError, PageAlloc};

use crate::inner::FsInner;

/// Where the free space comes from.
#[derive(Debug)]
enum Space {
    /// mkfs: an allocator of its own (nothing else is allocated yet).
    Own(Mutex<Allocator>),
    /// A mounted file system's allocator (set by [`MetaPages::attach`]).
    Mounted(OnceLock<Weak<FsInner>>),
}

/// Metadata page allocation and the count of live page blocks per target.
#[derive(Debug)]
pub(crate) struct MetaPages {
    space: Space,
    page_blocks: u64,
    rotor: AtomicU32,
    /// Blocks held by pages (allocated and not yet freed by the store), per target, with
    /// room for every target a file system may have.
    live: Vec<AtomicU64>,
    /// Targets pages may go to: the trees' members (`Store::members`), grown when a
    /// `TargetAdd` is applied to the trees (`PageAlloc::add_member`).
    members: AtomicU32,
}

impl MetaPages {
    fn with_space(geo: &Geometry, space: Space) -> MetaPages {
        MetaPages {
            space,
            page_blocks: geo.page_blocks(),
            rotor: AtomicU32::new(0),
            live: (0..stripefs_core::btree::pagelog::MAX_TARGETS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            members: AtomicU32::new(geo.target_count()),
        }
    }

    /// For mkfs: pages from a fresh allocator of `geo`.
    pub fn standalone(geo: &Geometry) -> MetaPages {
        MetaPages::with_space(geo, Space::Own(Mutex::new(Allocator::new(geo))))
    }

    /// For a mount: pages from the file system's allocator once [`Self::attach`] is
    /// called; until then the trees are only read.
    pub fn for_mount(geo: &Geometry) -> MetaPages {
        MetaPages::with_space(geo, Space::Mounted(OnceLock::new()))
    }

    /// The trees' members as the store opened them (the page log's count).
    pub fn set_members(&self, members: u32) {
        self.members.store(members, Ordering::Release);
    }

    /// Connects a mount's pages to its file system's allocator.
    pub fn attach(&self, fs: Weak<FsInner>) {
        if let Space::Mounted(cell) = &self.space {
            let set = cell.set(fs);
            debug_assert!(set.is_ok(), "metadata pages attached twice");
        }
    }

    /// Blocks one page occupies.
    pub fn page_blocks(&self) -> u64 {
        self.page_blocks
    }

    /// Sets the pages the durable trees hold on `target` (mount: the page log's count).
    pub fn set_live(&self, target: TargetId, pages: u64) {
        self.live[target.index()].store(pages * self.page_blocks, Ordering::Relaxed);
    }

    /// Blocks of `target` held by metadata pages.
    pub fn live_blocks(&self, target: TargetId) -> u64 {
        self.live[target.index()].load(Ordering::Relaxed)
    }

    /// Blocks held by metadata pages on every target.
    pub fn live_blocks_total(&self) -> u64 {
        self.live.iter().map(|l| l.load(Ordering::Relaxed)).sum()
    }

    /// Runs `f` on the allocator, with whether a target is read-only (no page goes to
    /// one: `placement.rs`; read under the same metadata lock hold as the allocation).
    fn with_alloc<R>(
        &self,
        f: impl FnOnce(&mut Allocator, &dyn Fn(TargetId) -> bool) -> R,
    ) -> Result<R, MetaError> {
        match &self.space {
            Space::Own(a) => Ok(f(&mut a.lock(), &|_| false)),
            Space::Mounted(cell) => {
                let fs = cell.get().and_then(Weak::upgrade).ok_or_else(|| {
                    MetaError::NoSpace("the file system's allocator is not attached".into())
                })?;
                let mut m = fs.meta.lock();
                Ok(f(&mut m.alloc, &|t| fs.states.is_read_only(t)))
            }
        }
    }

    /// Up to `want` pages from one target; the blocks of a partial page go back.
    fn take_on(&self, a: &mut Allocator, t: TargetId, want: u64, out: &mut Vec<PageAddr>) {
        let pb = self.page_blocks;
        for (start, len) in a.alloc_meta_lowest(t, want * pb, pb) {
            let pages = len / pb;
            out.extend((0..pages).map(|i| PageAddr {
                target: t,
                block: PhysBlock(start + i * pb),
            }));
            self.live[t.index()].fetch_add(pages * pb, Ordering::Relaxed);
        }
    }

    fn free_all(&self, a: &mut Allocator, pages: &[PageAddr]) {
        for p in pages {
            a.free_now(p.target, p.block.0, self.page_blocks);
            let was = self.live[p.target.index()].fetch_sub(self.page_blocks, Ordering::Relaxed);
            debug_assert!(was >= self.page_blocks, "freed a page never counted");
        }
    }
}

impl PageAlloc for MetaPages {
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError> {
        let targets = self.members.load(Ordering::Acquire);
        let share = (n as u64).div_ceil(u64::from(targets)).max(1);
        self.with_alloc(|a, read_only| {
            let mut out = Vec::with_capacity(n);
            let mut idle = 0;
            while out.len() < n {
                let t = TargetId(self.rotor.fetch_add(1, Ordering::Relaxed) % targets);
                let before = out.len();
                let want = share.min((n - out.len()) as u64);
                if !read_only(t) {
                    self.take_on(a, t, want, &mut out);
                }
                idle = if out.len() == before { idle + 1 } else { 0 };
                if idle == targets {
                    self.free_all(a, &out);
                    return Err(MetaError::NoSpace(format!(
                        "{n} metadata pages of {} blocks do not fit the free space",
                        self.page_blocks
                    )));
                }
            }
            Ok(out)
        })?
    }

    fn add_member(&self, target: TargetId) {
        self.members.store(target.0 + 1, Ordering::Release);
    }

    fn free(&self, pages: &[PageAddr]) {
        // Unattached (the file system is gone): the allocator is rebuilt at the next mount.
        let _ = self.with_alloc(|a, _| self.free_all(a, pages));
    }
}

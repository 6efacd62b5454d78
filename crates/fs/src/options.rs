//! Options for creating and mounting a file system.

use std::sync::Arc;
use std::time::Duration;

use stripefs_iomap::cache::CacheConfig;
use stripefs_iomap::ZeroMode;
use stripefs_target::FaultInjector;

/// What `mkfs` builds.
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// Block size in bytes (power of two, 1 KiB to 64 KiB).
    pub block_size: u32,
    /// Default stripe unit in bytes (a multiple of the block size).
    pub stripe_unit: u32,
    /// Default stripe count (`None`: all targets).
    pub stripe_count: Option<u32>,
    /// Journal size in bytes (`None`: 1/64 of target 0, 256 KiB to 128 MiB).
    pub journal_bytes: Option<u64>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        Self {
            block_size: 4096,
            stripe_unit: 1 << 20,
            stripe_count: None,
            journal_bytes: None,
        }
    }
}

pub use stripefs_iomap::direct::DioSubmit;

/// The `dio_unaligned` switch: which lock a sub-block direct overwrite of written blocks
/// takes (the lock decision is the file system's; see `direct.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnalignedPolicy {
    /// Sub-block overwrites of written blocks run shared (Linux 6.5+ ext4, XFS).
    #[default]
    Shared,
    /// Every sub-block direct write takes the exclusive lock, drains and waits (ext4
    /// before 6.5).
    Exclusive,
}

/// The metadata page cache's byte budget (`-o meta_cache=SIZE`, `StoreConfig::cache_bytes`
/// of `stripefs-meta`): clean pages are evicted under it, and pinned (dirty and frozen)
/// pages count against it, so a checkpoint starts when they pass half of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaCacheBytes(pub u64);

impl MetaCacheBytes {
    /// 64 MiB: the branch levels of 10 million files (about 28 MiB at 4 KiB pages,
    /// metadata.md "Page size") and a working set of leaves.
    pub const DEFAULT: MetaCacheBytes = MetaCacheBytes(64 << 20);
    /// The smallest budget, in pages: an operation's path (at most 8 levels) and its
    /// siblings several times over, with room for a checkpoint's worth of dirty pages.
    pub const MIN_PAGES: u64 = 64;

    /// Checks the budget against the page size.
    ///
    /// # Errors
    /// A sentence naming the value and the minimum.
    pub fn validate(self, page_bytes: u64) -> Result<(), String> {
        let min = Self::MIN_PAGES * page_bytes;
        if self.0 < min {
            return Err(format!(
                "meta_cache {} bytes is below the minimum of {} pages ({} KiB)",
                self.0,
                Self::MIN_PAGES,
                min >> 10
            ));
        }
        if usize::try_from(self.0).is_err() {
            return Err(format!("meta_cache {} bytes does not fit memory", self.0));
        }
        Ok(())
    }

    /// The budget as `StoreConfig::cache_bytes` takes it (validated: it fits).
    #[must_use]
    pub fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl MountOptions {
    /// The in-core inode bound these options give.
    #[must_use]
    pub fn inode_bound(&self) -> InodeBound {
        self.inode_cache
            .unwrap_or_else(|| InodeBound::for_cache(self.meta_cache))
    }
}

impl Default for MetaCacheBytes {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How many decoded inodes the mount keeps in core (`-o inode_cache=N`,
/// `docs/design/metadata.md` "Stage 2"): past it, inodes whose every change the trees hold
/// and that nothing pins are evicted and read again on their next use. An inode costs
/// about 600 bytes plus its directory entries, extents and xattrs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeBound(pub usize);

impl InodeBound {
    /// The smallest bound derived from the page cache budget.
    pub const MIN_DERIVED: usize = 1024;

    /// The default: one inode per 512 bytes of `meta_cache` (131,072 at the default
    /// 64 MiB, about 80 MiB of in-core inodes), at least [`Self::MIN_DERIVED`].
    #[must_use]
    pub fn for_cache(cache: MetaCacheBytes) -> InodeBound {
        let n = usize::try_from(cache.0 / 512).unwrap_or(usize::MAX);
        InodeBound(n.max(Self::MIN_DERIVED))
    }

    /// Checks an explicit bound.
    ///
    /// # Errors
    /// A sentence when it is zero.
    pub fn validate(self) -> Result<(), String> {
        if self.0 == 0 {
            return Err("inode_cache 0: at least one inode must fit in core".into());
        }
        Ok(())
    }
}

/// Where checkpoints of the metadata trees run (`-o checkpoint=background|inline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checkpoints {
    /// On the checkpointer thread, when the journal is half full, the trees' dirty pages
    /// pass half the cache budget or half the metadata reserve; commits never wait for
    /// them unless the journal is full (`docs/design/journal.md`).
    #[default]
    Background,
    /// Only on the committing thread, when the journal is full, and on explicit requests
    /// (sync of the trees, unmount): the synchronous design, for deterministic tests
    /// (fault and crash points in a fixed order) and for comparison.
    Inline,
}

/// The `datacow=on|off` mount option: whether new regular files are copy on write
/// (`docs/design/reflink.md` "No copy on write"). A file's own flag
/// ([`crate::FileFlags::NOCOW`], `chattr +C`) is set when it is created and kept; the
/// option only picks it for files created under this mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataCow {
    /// New regular files are copy on write, unless their directory is NOCOW.
    On,
    /// Every new regular file is NOCOW (btrfs's `nodatacow`). The default until data
    /// checksums exist: every file is written in place, as before the option.
    #[default]
    Off,
}

/// The `nocow_check=unlocked|locked` mount option: whether the expensive checks of the
/// in-place or copy-on-write decision (reference count and checksum lookups, which may
/// read the trees from a target) run without the metadata lock (`Unlocked`, seed 001's
/// rule, I-001-2) or holding it (`Locked`, what btrfs did before Linux 5.11), for
/// comparison (`docs/design/reflink.md`, "NOCOW decision (seed 001)").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NocowCheck {
    /// Cheap fields under the lock, checks without it, re-validated under it.
    #[default]
    Unlocked,
    /// Every check under the metadata lock.
    Locked,
}

/// How a mounted file system behaves.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Page cache: largest folio size and how folios are sized (`folio_sizing = fixed`
    /// brings back one size for all), memory budget, dirty limit, dirty tracking
    /// (`dirty_tracking = folio` brings back whole-folio writeback), readahead (size, and
    /// `readahead_mode = sync` brings back readahead waited for inside the read), how
    /// writeback and reads move bytes (`writeback_copy = stage` and `read_copy = bounce`
    /// bring back the copies).
    pub cache: CacheConfig,
    /// Metadata page cache budget (`meta_cache`).
    pub meta_cache: MetaCacheBytes,
    /// In-core inode bound (`inode_cache`; `None`: [`InodeBound::for_cache`] of
    /// `meta_cache`).
    pub inode_cache: Option<InodeBound>,
    /// Where checkpoints run (`checkpoint`).
    pub checkpoints: Checkpoints,
    /// How zero range and EOF zeroing treat dirty cache over holes and unwritten extents
    /// (`Flush` brings back the Linux 6.12 flush per extending write).
    pub eof_zeroing: ZeroMode,
    /// Speculative preallocation beyond EOF for files growing through writeback.
    pub speculative_prealloc: bool,
    /// Test knob: route every `ZERO_RANGE` through the cache zeroing path instead of
    /// converting extents (XFS's `force_zero_range` error tag).
    pub force_zero_via_cache: bool,
    /// `dio_unaligned = exclusive` brings back exclusive locking for every sub-block
    /// direct write (ext4 before 6.5).
    pub dio_unaligned: UnalignedPolicy,
    /// `dio_submit = serial` submits one stripe piece and waits before the next (Lustre
    /// before 2.15).
    pub dio_submit: DioSubmit,
    /// How the flusher, `sync` and unmount write dirty files back: many small files per
    /// device round trip (`Files`, default) or one after the other (`Single`, the
    /// behaviour before).
    pub wb_batch: crate::WbBatch,
    /// Background writeback interval (`None`: writeback only on fsync, pressure, unmount).
    pub writeback_interval: Option<Duration>,
    /// Commit the running transaction this often even without `fsync` (`None`: only on
    /// `fsync`, journal pressure and unmount; deterministic tests use `None`).
    pub commit_interval: Option<Duration>,
    /// Which reads update access times and when that is written (`relatime` by default;
    /// see `atime.rs`).
    pub atime: crate::AtimePolicy,
    /// Whether new regular files are copy on write (`datacow`).
    pub datacow: DataCow,
    /// Where the in-place decision's checks run (`nocow_check`).
    pub nocow_check: NocowCheck,
    /// Test knob: log every writeback and direct-write in-place decision's blocks for
    /// [`crate::Fs::take_in_place_log`] (the model test's audit; unbounded, so tests only).
    pub nocow_audit: bool,
    /// Fault injector for the runtime's named fault points (tests only).
    pub faults: Option<Arc<FaultInjector>>,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            cache: CacheConfig::default(),
            meta_cache: MetaCacheBytes::DEFAULT,
            inode_cache: None,
            checkpoints: Checkpoints::Background,
            eof_zeroing: ZeroMode::Cache,
            speculative_prealloc: true,
            force_zero_via_cache: false,
            dio_unaligned: UnalignedPolicy::Shared,
            dio_submit: DioSubmit::Parallel,
            wb_batch: crate::WbBatch::Files,
            writeback_interval: Some(Duration::from_secs(5)),
            commit_interval: Some(Duration::from_secs(5)),
            atime: crate::AtimePolicy::default(),
            datacow: DataCow::Off,
            nocow_check: NocowCheck::Unlocked,
            nocow_audit: false,
            faults: None,
        }
    }
}

//! Public value types of the library API.

use stripefs_core::inode::{FileKind, Inode, Timespec};
use stripefs_core::layout::StripeLayout;
use stripefs_core::Ino;

/// Whether the file system accepts changes ([`crate::Fs::set_access`]; `mount -o ro`,
/// `mount -o remount,ro`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Changes are accepted.
    #[default]
    ReadWrite,
    /// Every change fails with [`crate::FsError::ReadOnly`] (`EROFS`), and nothing is
    /// written to the targets.
    ReadOnly,
}

/// Tells the file system whether it should be read-only now: the front end's own mount
/// state (a FUSE mount's kernel read-only flag, which `mount -o remount,ro` changes
/// without the daemon's knowledge). `None`: no opinion (not mounted).
pub type AccessSource = std::sync::Arc<dyn Fn() -> Option<Access> + Send + Sync>;

/// `stat` of an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Allocated space in 512-byte units (`st_blocks`).
    pub blocks: u64,
    /// Preferred I/O size (`st_blksize`): the stripe unit for files, the block size
    /// otherwise.
    pub blksize: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub rdev: u64,
    /// Striping of a regular file.
    pub layout: Option<StripeLayout>,
}

impl Attr {
    pub(crate) fn of(inode: &Inode, block_size: u32) -> Self {
        let a = &inode.attrs;
        let is_file = a.kind == FileKind::Regular;
        Self {
            ino: a.ino,
            kind: a.kind,
            mode: a.mode(),
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            blocks: inode.allocated_blocks() * u64::from(block_size) / 512,
            blksize: if is_file {
                a.layout.unit_bytes
            } else {
                block_size
            },
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.crtime,
            rdev: a.rdev,
            layout: is_file.then_some(a.layout),
        }
    }
}

/// An open-file handle (see [`crate::Fs::open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fh(pub u64);

/// How an open handle does I/O: a property of the handle (`O_DIRECT`), so one read and
/// one write entry ([`crate::Fs::read`], [`crate::Fs::write`]) dispatch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenMode {
    /// Through the page cache.
    #[default]
    Cached,
    /// `O_DIRECT`: bypassing the cache (sector-aligned offsets and lengths).
    Direct,
}

/// When dropping set-ID bits takes set-group-ID too (set-user-ID always goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SgidDrop {
    /// Only from a group-executable file (the VFS's rule for a write or truncate).
    IfGroupExecutable,
    /// Always (a chown, or a caller neither in the file's group nor privileged).
    Always,
}

/// What `fsync` makes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncScope {
    /// `fsync`: the data and all the metadata (lazy access times included).
    All,
    /// `fdatasync`: the data and the metadata needed to read it (size, extents).
    Data,
}

/// Where a write through a handle comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOrigin {
    /// The caller's `write(2)`: the handle's mode decides the path.
    Caller,
    /// Page-cache writeback of a shared mapping (`FUSE_WRITE_CACHE`): buffered data,
    /// written through the cache even on a direct handle and not held to direct-I/O
    /// alignment.
    PageCache,
}

/// A time to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time.
    Now,
    /// This time.
    At(Timespec),
}

/// Attribute changes for [`crate::Fs::setattr`]; `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// New size (regular files): truncates or extends.
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timespec>,
    /// Drop the set-ID bits a change of content or owner takes away, computed from the
    /// mode under the metadata lock (see [`crate::setid_dropped`]); the value says
    /// when set-group-ID goes. Ignored when `mode` is given.
    pub kill_setid: Option<SgidDrop>,
}

/// Who creates an inode and with what permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateParams {
    /// Permission bits.
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// Striping for a new regular file (`None`: the file system default).
    pub layout: Option<StripeLayout>,
    /// Device number for character and block devices.
    pub rdev: u64,
    /// Permission bits to clear unless the parent directory has a default ACL, which
    /// then decides instead (the creator's umask; symbolic links ignore it).
    pub umask: u16,
}

impl CreateParams {
    /// Permissions `perm`, owned by root.
    #[must_use]
    pub fn with_perm(perm: u16) -> Self {
        Self {
            perm,
            uid: 0,
            gid: 0,
            layout: None,
            rdev: 0,
            umask: 0,
        }
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryInfo {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
    /// Its readdir position: [`crate::Fs::readdir_from`] resumes after it.
    pub cookie: DirCookie,
}

/// A readdir position in a directory: an entry keeps its cookie for its whole life, new
/// entries take cookies above every entry present, and a listing resumed after a cookie
/// returns the entries with higher ones. `DirCookie::START` is the start of a listing; 1
/// and 2 are left for "." and ".." (a front end's offsets), entries start at 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DirCookie(pub u64);

impl DirCookie {
    /// Before every entry.
    pub const START: DirCookie = DirCookie(0);
}

/// `statfs` of the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    /// Data blocks across all targets.
    pub blocks: u64,
    /// Free data blocks on all targets together (blocks freed by uncommitted transactions
    /// included: a write that needs them commits first). `f_bfree`.
    pub blocks_free: u64,
    /// Blocks a new file with the default layout can get, whatever its first target: the
    /// targets fill unevenly (target 0 also holds the journal and checkpoints) and a file
    /// runs out when its fullest target does, so this is at most `blocks_free`. `f_bavail`,
    /// what `df` shows as available (decision 28).
    pub blocks_avail: u64,
    /// Inodes in use.
    pub files: u64,
    /// Inodes that still fit in the metadata area (an estimate).
    pub files_free: u64,
    pub name_max: u32,
}

/// Flags for [`crate::Fs::rename`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenameMode {
    /// Replace the destination if it exists (POSIX rename).
    #[default]
    Replace,
    /// Fail with `Exists` if the destination exists (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap source and destination, both must exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// `fallocate` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocMode {
    /// Allocate unwritten extents and extend the size (mode 0).
    Allocate,
    /// Allocate without changing the size (`FALLOC_FL_KEEP_SIZE`).
    KeepSize,
    /// Deallocate a range (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    PunchHole,
    /// Zero a range (`FALLOC_FL_ZERO_RANGE`, optionally keeping the size).
    ZeroRange { keep_size: bool },
    /// `FALLOC_FL_COLLAPSE_RANGE`.
    CollapseRange,
    /// `FALLOC_FL_INSERT_RANGE`.
    InsertRange,
    /// `FALLOC_FL_UNSHARE_RANGE`.
    UnshareRange,
}

/// Counters describing a mounted file system (for `inspect` and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsStatus {
    pub uuid: String,
    pub targets: Vec<TargetStatus>,
    pub journal: crate::journal::JournalPosition,
    pub journal_units: u64,
    pub committed_seq: u64,
    pub running_seq: u64,
    pub running_records: usize,
    pub inodes: u64,
    pub extents: u64,
    /// Blocks held by metadata tree pages, on all targets.
    pub meta_page_blocks: u64,
    /// The metadata trees' page cache.
    pub meta_cache: stripefs_meta::CacheStats,
    /// Bytes of metadata tree pages pinned in memory (dirty and frozen, counted at page
    /// size): what the next checkpoint writes, outside the cache's clean pages.
    pub meta_pinned_bytes: usize,
    /// Each metadata tree and the level of its root (0: the root is a leaf).
    pub meta_tree_levels: Vec<(stripefs_core::btree::TreeId, u8)>,
    /// Records durable in the journal and not yet applied to the trees (the apply
    /// queue, held in memory; bounded by the journal's size).
    pub journal_queued_records: usize,
    pub busy_blocks: u64,
    pub poisoned: bool,
    /// Bytes of file data written to / read from the targets since mount.
    pub data_bytes_written: u64,
    pub data_bytes_read: u64,
    /// Multi-file writeback (`wb_batch = files`) since mount: groups, files written back
    /// in them, and the device writes they took (neighbouring files' writes merged).
    pub wb_groups: u64,
    pub wb_group_files: u64,
    pub wb_group_writes: u64,
    /// Bytes written to the journal and checkpoints since mount.
    pub meta_bytes_written: u64,
    /// Of those, bytes written by checkpoints (the tree pages dirtied since the previous
    /// one, and the root record), and checkpoints written, since mount.
    pub ckpt_bytes_written: u64,
    pub checkpoints: u64,
    /// Commits that found the journal full and waited for a checkpoint (back-pressure).
    pub journal_full_waits: u64,
    /// Of those, the waits that wrote a checkpoint themselves (the running one did not
    /// free enough of the journal).
    pub journal_full_checkpoints: u64,
    /// Changes that applied a slice of the journal's apply queue before starting,
    /// because it held more records than a quarter of the in-core inode bound
    /// (back-pressure; `journal::queue_bound`).
    pub apply_throttled: u64,
    /// The most bytes of metadata tree pages pinned in memory (dirty or frozen) after
    /// applying journal records to the trees, since mount: what `meta_cache` bounds.
    pub meta_pinned_peak_bytes: u64,
    /// Page cache counters.
    pub cache: stripefs_iomap::cache::CacheStats,
    /// Direct writes run under the shared / exclusive inode lock since mount.
    pub dio_shared: u64,
    pub dio_exclusive: u64,
    /// Stripe pieces submitted by direct writes since mount.
    pub dio_pieces: u64,
    /// Bytes direct reads copied out of device-read buffers into callers' buffers since
    /// mount, counted piece by piece as each is copied (holes, zero-filled, not counted).
    pub dio_read_copied: u64,
    /// Mapping lookups since mount (every I/O path and zeroing pass makes them).
    pub map_lookups: u64,
    /// Reads failed with `EIO` since mount because a block's data checksum did not match
    /// (`docs/design/reflink.md`, "Data checksums").
    pub csum_errors: u64,
    /// Checksum changes held in core because the trees do not hold them yet (runs).
    pub csum_overlay_runs: usize,
    /// Blocks whose checksums a write computed and no transaction logged yet
    /// (`WriteCsums`): writes in flight; 0 when the file system is idle, since a failed
    /// write forgets them.
    pub csum_pending_blocks: usize,
    /// Reference-count changes held in core because the trees do not hold them yet
    /// (runs; `docs/design/reflink.md`, "The runtime reads the index from the trees").
    pub refcount_overlay_runs: usize,
    /// The in-place or copy-on-write decision (`docs/design/reflink.md`, "NOCOW decision
    /// (seed 001)"): writeback and direct-write mappings written in place / copied since
    /// mount; unlocked checks thrown away because the extent or its target's counts
    /// changed meanwhile (re-searches); decisions taken under the metadata lock after
    /// too many re-searches (locked fallbacks).
    pub nocow_in_place: u64,
    pub nocow_cow: u64,
    pub nocow_researches: u64,
    pub nocow_locked_fallbacks: u64,
    /// Of the copies, those made because the extent's target is read-only (an
    /// evacuation, I-001-3).
    pub nocow_read_only: u64,
    /// File blocks moved off evacuated targets since mount (`Fs::evacuate`).
    pub evacuated_blocks: u64,
    /// In-core inodes now, the most at once since mount, and those evicted since mount
    /// (see `docs/design/cache.md`, "In-core inodes").
    pub incore_inodes: usize,
    pub incore_inodes_peak: usize,
    pub incore_inodes_evicted: u64,
    /// Decoded inodes (attributes, extent maps, entries, xattrs) in core now, the most at
    /// once since mount, read from the metadata trees since mount and evicted since mount
    /// (`docs/design/metadata.md`, "Stage 2").
    pub meta_inodes: usize,
    pub meta_inodes_peak: usize,
    pub meta_inode_loads: u64,
    pub meta_inodes_evicted: u64,
    /// Inode reads made without the metadata lock and discarded because an inode left
    /// core while they ran (`docs/design/metadata.md`, "Inode misses"), and readdir
    /// pages read without it and discarded because a change of the directory left the
    /// overlay meanwhile ("Directory entries").
    pub meta_inode_stale_reads: u64,
    /// Directory entries held in core: those changed by records not yet applied to the
    /// trees (metadata.md, "Directory entries"); bounded by the journal, not by any
    /// directory's size.
    pub dir_overlay_names: usize,
}

/// One target's space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatus {
    pub name: String,
    pub data_blocks: u64,
    pub free_blocks: u64,
    pub free_ranges: usize,
}

/// The space books of one target (a diagnostic snapshot for tests and `inspect`).
///
/// At rest (no I/O in flight) every data block is exactly one of: available, reserved
/// (promised to a delayed allocation), held for metadata pages (the free part of the
/// metadata reserve), in an extent of some file, or busy (freed by a transaction not yet
/// durable); and every reserved block is backed by a delayed allocation. [`Self::check`]
/// verifies both: reserved + allocated + free = total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceAccount {
    pub target: u32,
    pub data_blocks: u64,
    /// Free blocks not promised to anyone.
    pub available_blocks: u64,
    /// Free blocks promised to delayed allocations.
    pub reserved_blocks: u64,
    /// Free blocks held back for metadata pages (`Allocator::meta_held_blocks`).
    pub meta_held_blocks: u64,
    /// Blocks freed by a transaction that is not yet durable.
    pub busy_blocks: u64,
    /// Blocks held by metadata tree pages on this target.
    pub meta_page_blocks: u64,
    /// Blocks of freed inodes whose page cache (and writeback) is still being dropped.
    pub dead_blocks: u64,
    /// Blocks in file extents (written or unwritten) on this target.
    pub extent_blocks: u64,
    /// Blocks of delayed allocations on this target.
    pub delalloc_blocks: u64,
}

impl SpaceAccount {
    /// Checks that the books balance (only meaningful with no I/O in flight).
    ///
    /// # Errors
    /// A sentence naming the target and the numbers that disagree.
    pub fn check(&self) -> Result<(), String> {
        let sum = self.available_blocks
            + self.reserved_blocks
            + self.meta_held_blocks
            + self.extent_blocks
            + self.busy_blocks
            + self.meta_page_blocks
            + self.dead_blocks;
        if sum != self.data_blocks {
            return Err(format!(
                "target {}: available {} + reserved {} + held for metadata {} + in extents {} \
                 + busy {} + metadata pages {} + dead inodes' {} = {sum}, not the {} data blocks",
                self.target,
                self.available_blocks,
                self.reserved_blocks,
                self.meta_held_blocks,
                self.extent_blocks,
                self.busy_blocks,
                self.meta_page_blocks,
                self.dead_blocks,
                self.data_blocks
            ));
        }
        if self.reserved_blocks != self.delalloc_blocks {
            return Err(format!(
                "target {}: {} blocks reserved but delayed allocations hold {}",
                self.target, self.reserved_blocks, self.delalloc_blocks
            ));
        }
        Ok(())
    }
}

//! Where everything lives on the targets, computed once by mkfs and stored in superblocks.
//!
//! ```text
//! target 0: | sb | root slot A | root slot B | journal .......... | pad | data ........ |
//! target n: | sb | pad                                                 | data ........ |
//! ```
//! The root record slots (one block each) are the commit points of the metadata trees'
//! checkpoints; the trees' pages live in the data area of every target, allocated as
//! needed (`docs/design/metadata.md`), so no fixed area caps the number of files.
//! Data starts on a 1 MiB boundary on every target so that stripe units stay aligned to the
//! host's allocation and the device's erase/RAID geometry.

use crate::btree::page::PageSize;
use crate::superblock::Superblock;
use crate::{BlockSize, CoreError, TargetId, Uuid};

/// Blocks of target 0 holding the two root record slots (right after the superblock).
pub const ROOT_SLOTS: [u64; 2] = [1, 2];

/// Bytes of alignment for the start of the data area.
pub const DATA_ALIGN_BYTES: u64 = 1 << 20;

/// Space layout of one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetGeometry {
    /// Total blocks on the target.
    pub blocks: u64,
    /// First data block.
    pub data_start: u64,
}

impl TargetGeometry {
    /// Blocks available for file data.
    #[must_use]
    pub fn data_blocks(&self) -> u64 {
        self.blocks - self.data_start
    }
}

/// The whole file system's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub uuid: Uuid,
    pub block_size: BlockSize,
    pub sector_size: u32,
    pub targets: Vec<TargetGeometry>,
    pub stripe_unit: u32,
    pub stripe_count: u32,
    /// Blocks on target 0 of root record slots A and B.
    pub root_slots: [u64; 2],
    /// First block of the journal on target 0.
    pub journal_start: u64,
    /// Blocks in the journal.
    pub journal_blocks: u64,
    /// Journal write unit in bytes.
    pub journal_unit: u32,
    pub mkfs_time_sec: i64,
}

/// What mkfs was asked for.
#[derive(Debug, Clone)]
pub struct MkfsParams {
    pub uuid: Uuid,
    pub block_size: BlockSize,
    pub sector_size: u32,
    pub target_bytes: Vec<u64>,
    pub stripe_unit: u32,
    pub stripe_count: u32,
    /// Journal size in bytes; `None` picks 1/64 of target 0 within 256 KiB..128 MiB.
    pub journal_bytes: Option<u64>,
    pub mkfs_time_sec: i64,
}

impl Geometry {
    /// Lays out a new file system.
    ///
    /// # Errors
    /// A sentence naming the parameter that cannot work (too small a target, a stripe unit
    /// that is not a multiple of the block size, more stripes than targets...).
    pub fn plan(p: &MkfsParams) -> Result<Self, CoreError> {
        let bs = p.block_size;
        let lim = |m: String| Err(CoreError::Limit(m));
        if p.target_bytes.is_empty() {
            return lim("no targets given".into());
        }
        if p.sector_size > bs.bytes() {
            return lim(format!(
                "block size {} is smaller than the targets' logical sector size {}",
                bs.bytes(),
                p.sector_size
            ));
        }
        if p.stripe_unit == 0 || !p.stripe_unit.is_multiple_of(bs.bytes()) {
            return lim(format!(
                "stripe unit {} is not a multiple of the block size {}",
                p.stripe_unit,
                bs.bytes()
            ));
        }
        let n = u32::try_from(p.target_bytes.len()).unwrap_or(u32::MAX);
        if p.stripe_count == 0 || p.stripe_count > n {
            return lim(format!("stripe count {} with {n} targets", p.stripe_count));
        }
        let t0 = p.target_bytes[0];
        let clamp = |v: u64, lo: u64, hi: u64| v.clamp(lo, hi);
        let journal_bytes = p
            .journal_bytes
            .unwrap_or_else(|| clamp(t0 / 64, 256 << 10, 128 << 20));
        let journal_blocks = bs.blocks_for(journal_bytes).max(4);
        let align = bs.blocks_for(DATA_ALIGN_BYTES).max(1);
        let meta_end = ROOT_SLOTS[1] + 1 + journal_blocks;
        let round = |b: u64| b.div_ceil(align) * align;
        let mut targets = Vec::with_capacity(p.target_bytes.len());
        for (i, &bytes) in p.target_bytes.iter().enumerate() {
            let blocks = bytes / bs.bytes_u64();
            let data_start = round(if i == 0 { meta_end } else { 1 });
            if blocks <= data_start {
                return lim(format!(
                    "target {i} is too small: {bytes} bytes leave no data blocks after {} metadata blocks",
                    data_start
                ));
            }
            targets.push(TargetGeometry { blocks, data_start });
        }
        let unit = bs.bytes().min(4096).max(p.sector_size);
        Ok(Self {
            uuid: p.uuid,
            block_size: bs,
            sector_size: p.sector_size,
            targets,
            stripe_unit: p.stripe_unit,
            stripe_count: p.stripe_count,
            root_slots: ROOT_SLOTS,
            journal_start: ROOT_SLOTS[1] + 1,
            journal_blocks,
            journal_unit: unit,
            mkfs_time_sec: p.mkfs_time_sec,
        })
    }

    /// The superblock for target `index`.
    #[must_use]
    pub fn superblock(&self, index: TargetId) -> Superblock {
        let t = self.targets[index.index()];
        Superblock {
            uuid: self.uuid,
            target_index: index,
            target_count: self.targets.len() as u32,
            block_size: self.block_size.bytes(),
            sector_size: self.sector_size,
            target_blocks: t.blocks,
            data_start: t.data_start,
            stripe_unit: self.stripe_unit,
            stripe_count: self.stripe_count,
            features_compat: 0,
            features_incompat: 0,
            features_ro_compat: 0,
            root_slots: self.root_slots,
            journal_start: self.journal_start,
            journal_blocks: self.journal_blocks,
            journal_unit: self.journal_unit,
            mkfs_time_sec: self.mkfs_time_sec,
            member_id: 0,
        }
    }

    /// Rebuilds the geometry from the superblocks of all targets, sorted by index.
    ///
    /// # Errors
    /// `Corrupted` when the superblocks disagree about the file system.
    pub fn from_superblocks(sbs: &[Superblock]) -> Result<Self, CoreError> {
        let first = sbs
            .first()
            .ok_or_else(|| CoreError::Limit("no targets".into()))?;
        for (i, sb) in sbs.iter().enumerate() {
            // The count is not compared: a target added later says how many targets
            // there were with it (`targets.md`); membership is the caller's.
            let same = sb.uuid == first.uuid
                && sb.block_size == first.block_size
                && sb.root_slots == first.root_slots
                && sb.journal_start == first.journal_start
                && sb.journal_blocks == first.journal_blocks;
            if !same || sb.target_index.index() != i {
                return Err(CoreError::corrupted(
                    format!("superblock of target {i}"),
                    "disagrees with target 0 about the file system's geometry",
                ));
            }
        }
        let bs =
            BlockSize::new(first.block_size).map_err(|e| CoreError::corrupted("superblock", e))?;
        Ok(Self {
            uuid: first.uuid,
            block_size: bs,
            sector_size: first.sector_size,
            targets: sbs
                .iter()
                .map(|s| TargetGeometry {
                    blocks: s.target_blocks,
                    data_start: s.data_start,
                })
                .collect(),
            stripe_unit: first.stripe_unit,
            stripe_count: first.stripe_count,
            root_slots: first.root_slots,
            journal_start: first.journal_start,
            journal_blocks: first.journal_blocks,
            journal_unit: first.journal_unit,
            mkfs_time_sec: first.mkfs_time_sec,
        })
    }

    /// The layout of a target of `bytes` bytes added to this file system: its data area
    /// starts at the same alignment as mkfs gives targets past the first.
    ///
    /// # Errors
    /// `Limit` when the target leaves no data blocks.
    pub fn plan_added(&self, bytes: u64) -> Result<TargetGeometry, CoreError> {
        let bs = self.block_size;
        let blocks = bytes / bs.bytes_u64();
        let align = bs.blocks_for(DATA_ALIGN_BYTES).max(1);
        if blocks <= align {
            return Err(CoreError::Limit(format!(
                "the new target is too small: {bytes} bytes leave no data blocks after {align} metadata blocks"
            )));
        }
        Ok(TargetGeometry {
            blocks,
            data_start: align,
        })
    }

    /// Number of targets.
    #[must_use]
    pub fn target_count(&self) -> u32 {
        self.targets.len() as u32
    }

    /// Bytes of the journal region that hold whole units.
    #[must_use]
    pub fn journal_bytes(&self) -> u64 {
        self.journal_units() * u64::from(self.journal_unit)
    }

    /// Journal units in the journal region.
    #[must_use]
    pub fn journal_units(&self) -> u64 {
        self.block_size.to_bytes(self.journal_blocks) / u64::from(self.journal_unit)
    }

    /// Byte offset on target 0 of journal unit `lsn` (logical, wraps around).
    #[must_use]
    pub fn journal_unit_offset(&self, lsn: u64) -> u64 {
        let phys = lsn % self.journal_units();
        self.block_size.to_bytes(self.journal_start) + phys * u64::from(self.journal_unit)
    }

    /// Byte offsets on target 0 of the two root record slots.
    #[must_use]
    pub fn root_slot_offsets(&self) -> [u64; 2] {
        self.root_slots.map(|b| self.block_size.to_bytes(b))
    }

    /// The metadata page size: the block size, but at least 4 KiB (decisions.md). A page
    /// of a file system with smaller blocks takes [`Self::page_blocks`] contiguous blocks.
    #[must_use]
    pub fn page_size(&self) -> PageSize {
        let bytes = self
            .block_size
            .bytes()
            .max(PageSize::DEFAULT.bytes() as u32);
        PageSize::new(bytes).expect("block sizes are powers of two up to 64 KiB")
    }

    /// Blocks one metadata page occupies (1 unless blocks are smaller than 4 KiB).
    #[must_use]
    pub fn page_blocks(&self) -> u64 {
        self.page_size().bytes() as u64 / self.block_size.bytes_u64()
    }
}

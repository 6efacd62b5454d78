//! Newtypes for units and identifiers. Conversions between units are explicit methods.

use std::fmt;

/// Inode number. Never reused within a file system's life (see `meta::MetaState::next_ino`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ino(pub u64);

impl Ino {
    /// The root directory.
    pub const ROOT: Ino = Ino(1);
}

impl fmt::Display for Ino {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Index of a target within the file system (0-based, as in its superblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TargetId(pub u32);

impl TargetId {
    /// As a vector index.
    #[must_use]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A bound on every target's block numbers: a target's size in bytes is a `u64` and a
/// block is at least [`BlockSize::MIN`] bytes, so no target has 2^54 blocks and every
/// physical run ends at or below 2^54 (the superblock refuses a larger target). A run read
/// from disk that ends past it is corruption (decision 93); a run within it can be added
/// to and iterated over without overflow.
pub const PHYS_BLOCKS_MAX: u64 = 1 << 54;

/// Whether `[start, start + len)` is a non-empty run of physical blocks that some target
/// could hold: `len > 0` and `start + len <= PHYS_BLOCKS_MAX` (no overflow on the way).
#[must_use]
pub fn phys_run_fits(start: u64, len: u64) -> bool {
    len > 0
        && start
            .checked_add(len)
            .is_some_and(|end| end <= PHYS_BLOCKS_MAX)
}

/// A block number on one target (block 0 holds the superblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PhysBlock(pub u64);

/// The file-system block size: a power of two from 1 KiB to 64 KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSize(u32);

impl BlockSize {
    /// Smallest accepted block size.
    pub const MIN: u32 = 1024;
    /// Largest accepted block size.
    pub const MAX: u32 = 65536;

    /// Validates `bytes`.
    ///
    /// # Errors
    /// A description of the rule when `bytes` is not a power of two in 1 KiB..=64 KiB.
    pub fn new(bytes: u32) -> Result<Self, String> {
        if !bytes.is_power_of_two() || !(Self::MIN..=Self::MAX).contains(&bytes) {
            return Err(format!(
                "block size {bytes} is not a power of two from 1 KiB to 64 KiB"
            ));
        }
        Ok(Self(bytes))
    }

    /// Bytes per block.
    #[must_use]
    pub fn bytes(self) -> u32 {
        self.0
    }

    /// Bytes per block as u64.
    #[must_use]
    pub fn bytes_u64(self) -> u64 {
        u64::from(self.0)
    }

    /// Byte offset of block `b`.
    #[must_use]
    pub fn to_bytes(self, blocks: u64) -> u64 {
        blocks << self.0.trailing_zeros()
    }

    /// Block containing byte `off`.
    #[must_use]
    pub fn block_of(self, off: u64) -> u64 {
        off >> self.0.trailing_zeros()
    }

    /// Blocks needed to hold `bytes` bytes.
    #[must_use]
    pub fn blocks_for(self, bytes: u64) -> u64 {
        bytes.div_ceil(self.bytes_u64())
    }

    /// Offset of `off` within its block.
    #[must_use]
    pub fn offset_in_block(self, off: u64) -> u64 {
        off & (self.bytes_u64() - 1)
    }

    /// `off` rounded down to a block boundary.
    #[must_use]
    pub fn round_down(self, off: u64) -> u64 {
        off & !(self.bytes_u64() - 1)
    }

    /// `off` rounded up to a block boundary.
    #[must_use]
    pub fn round_up(self, off: u64) -> u64 {
        self.round_down(off + self.bytes_u64() - 1)
    }
}

/// A file-system identity, stamped into every metadata block.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Uuid(pub [u8; 16]);

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        for (i, x) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{x:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_math() {
        let bs = BlockSize::new(4096).unwrap();
        assert_eq!(bs.block_of(8191), 1);
        assert_eq!(bs.round_up(4097), 8192);
        assert_eq!(bs.round_up(4096), 4096);
        assert_eq!(bs.blocks_for(1), 1);
        assert_eq!(bs.to_bytes(3), 12288);
        assert!(BlockSize::new(3000).is_err());
        assert!(BlockSize::new(512).is_err());
        assert!(BlockSize::new(131072).is_err());
    }
}

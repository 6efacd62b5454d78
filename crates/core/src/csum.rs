//! Per-block data checksums (issue 12, second half; `docs/design/reflink.md`,
//! "Data checksums"): the crc32c of every written block of a copy-on-write ("datacow")
//! file, keyed by physical block, so a block shared by clones has one checksum whoever
//! maps it.
//!
//! Checksums change only through `Record::CsumSet` (the checksums of a physical run, logged
//! in the transaction whose `ExtentSet` makes the run's data visible) and
//! `Record::CsumClear` (no checksum for a physical range, logged in the transaction that
//! frees the blocks): absolute values, so records stay idempotent "set" operations.
//!
//! [`CsumMap`] is the in-memory model's copy (the whole index, one entry per block: the
//! model tests' oracle and `check::check`'s); the runtime never holds the index whole: it
//! lives in the `csum` tree, paged like every tree, with only the changes the trees have
//! not applied yet held in memory.

use std::collections::BTreeMap;

use crate::inode::{FileKind, InodeAttrs};
use crate::TargetId;

/// Whether the file's data is written by copy on write and carries checksums: a regular
/// file without the NOCOW attribute ([`InodeAttrs::datacow`]).
#[must_use]
pub fn datacow(a: &InodeAttrs) -> bool {
    a.kind == FileKind::Regular && a.datacow()
}

/// Most blocks one `CsumSet` record or one `csum` tree item carries (4 bytes each: an
/// item's value stays within `btree::VALUE_MAX`).
pub const CSUM_RUN_MAX: usize = 128;

/// The checksum of one data block (crc32c of its bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockCsum(pub u32);

impl BlockCsum {
    /// The checksum of `block` (one whole data block).
    #[must_use]
    pub fn of(block: &[u8]) -> Self {
        Self(crc32c::crc32c(block))
    }
}

impl std::fmt::Display for BlockCsum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// The checksum of each block of `data` (whole blocks of `block_bytes`; a trailing partial
/// block is a bug of the caller and is checksummed as it is).
#[must_use]
pub fn block_csums(data: &[u8], block_bytes: usize) -> Vec<BlockCsum> {
    data.chunks(block_bytes).map(BlockCsum::of).collect()
}

/// Every checksum, one entry per block: the model's copy of the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsumMap {
    map: BTreeMap<(TargetId, u64), BlockCsum>,
}

impl CsumMap {
    /// An empty index.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks with a checksum.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no block has a checksum.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Sets the checksums of `[phys, phys + csums.len())` on `t`. Never panics: a record
    /// whose run passes the end of the block numbers is refused before it gets here
    /// (`Record::range_misfit`), and blocks past `u64::MAX` are not counted.
    pub fn set(&mut self, t: TargetId, phys: u64, csums: &[BlockCsum]) {
        for (b, c) in (0u64..)
            .zip(csums)
            .map_while(|(i, c)| Some((phys.checked_add(i)?, c)))
        {
            self.map.insert((t, b), *c);
        }
    }

    /// Drops the checksums of `[phys, phys + len)` on `t`.
    pub fn clear(&mut self, t: TargetId, phys: u64, len: u64) {
        let end = phys.saturating_add(len);
        let gone: Vec<_> = self
            .map
            .range((t, phys)..(t, end))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.map.remove(&k);
        }
    }

    /// The checksum of block `b` of `t`.
    #[must_use]
    pub fn get(&self, t: TargetId, b: u64) -> Option<BlockCsum> {
        self.map.get(&(t, b)).copied()
    }

    /// Whether any block of `[phys, phys + len)` on `t` has a checksum.
    #[must_use]
    pub fn any(&self, t: TargetId, phys: u64, len: u64) -> bool {
        let end = phys.saturating_add(len);
        self.map.range((t, phys)..(t, end)).next().is_some()
    }

    /// Every checksum in order: `(target, block, checksum)`.
    pub fn iter(&self) -> impl Iterator<Item = (TargetId, u64, BlockCsum)> + '_ {
        self.map.iter().map(|(&(t, b), &c)| (t, b, c))
    }

    /// The first block where `self` and `other` differ, described (`None`: equal).
    #[must_use]
    pub fn first_difference(&self, other: &CsumMap) -> Option<String> {
        let mut a = self.iter();
        let mut b = other.iter();
        loop {
            match (a.next(), b.next()) {
                (None, None) => return None,
                (x, y) if x == y => {}
                (x, y) => {
                    return Some(format!(
                        "checksum index holds {} where the extents derive {}",
                        show(x),
                        show(y)
                    ))
                }
            }
        }
    }
}

fn show(e: Option<(TargetId, u64, BlockCsum)>) -> String {
    match e {
        Some((t, b, c)) => format!("target {t} block {b}: {c}"),
        None => "nothing more".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_any() {
        let t = TargetId(1);
        let mut m = CsumMap::new();
        m.set(t, 10, &[BlockCsum(1), BlockCsum(2), BlockCsum(3)]);
        assert!(m.any(t, 12, 5));
        assert!(!m.any(t, 13, 5));
        assert!(!m.any(TargetId(0), 10, 3));
        m.clear(t, 11, 1);
        assert_eq!(m.get(t, 11), None);
        assert_eq!(m.get(t, 12), Some(BlockCsum(3)));
        assert_eq!(m.len(), 2);
        assert_eq!(BlockCsum::of(b"123456789"), BlockCsum(0xe306_9283));
    }
}

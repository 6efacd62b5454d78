//! The state fsck keeps while it streams the trees, and its bounds (`metadata.md`,
//! "fsck"):
//!
//! - per inode number seen in an inode item or named by an entry, a [`Tally`] (link
//!   count, entries naming it, its type and the types entries give it: 12 bytes, stored
//!   with its 8-byte key in a hash table, [`TALLY_BYTES`] at most per inode with the
//!   table's spare capacity), as `xfs_repair` keeps per-inode state;
//! - per directory, a [`DirTally`] (its parent pointer, the directory whose entry names
//!   it, its subdirectories: 24 bytes and its key);
//! - per target, three bitmaps over the data area (blocks in use, blocks that are
//!   metadata pages, written blocks of copy-on-write files whose checksum item is still
//!   to be seen): 3 bits per block, bounded by the device size, not the file count
//!   (96 MiB per TiB of 4 KiB blocks).
//!
//! Nothing else grows with the number of files: one inode's items are checked as they
//! pass and dropped.

use std::collections::HashMap;

use stripefs_core::geometry::Geometry;
use stripefs_core::inode::FileKind;
use stripefs_core::{CoreError, Ino, TargetId};

/// Bytes of tracked state per inode at most: a tally and its key (20 bytes, 24 aligned),
/// one control byte, and the table's spare capacity (it doubles when 7/8 full, so it is
/// at least 7/16 full): 25 * 16 / 7 rounded up. While the table doubles, the old one
/// lives beside the new one for the move: a transient half as much again.
pub const TALLY_BYTES: usize = 58;

/// Bytes of tracked state per directory at most, as [`TALLY_BYTES`]: 32 + 1 bytes.
pub const DIR_TALLY_BYTES: usize = 76;

/// What fsck knows about one inode number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// The link count of its inode item.
    pub nlink: u32,
    /// Entries naming it.
    pub refs: u32,
    /// Its type's on-disk code (1..=7); 0: no inode item seen (yet).
    kind: u8,
    /// One bit per type the entries naming it give it.
    ref_kinds: u8,
}

impl Tally {
    /// Its type, if its inode item was seen.
    #[must_use]
    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_code(self.kind)
    }

    pub fn set_inode(&mut self, kind: FileKind, nlink: u32) {
        self.kind = kind.code();
        self.nlink = nlink;
    }

    /// The inode item is gone (freed).
    pub fn clear_inode(&mut self) {
        self.kind = 0;
        self.nlink = 0;
    }

    pub fn add_ref(&mut self, kind: FileKind) {
        self.refs = self.refs.saturating_add(1);
        self.ref_kinds |= 1 << kind.code();
    }

    pub fn remove_ref(&mut self) {
        self.refs = self.refs.saturating_sub(1);
    }

    /// Whether an entry naming it gives it another type than its own (or it has none).
    #[must_use]
    pub fn kind_disagrees(&self) -> bool {
        self.refs > 0 && self.ref_kinds & !(1u8 << (self.kind & 7)) != 0
    }
}

/// What fsck knows about one directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirTally {
    /// Its parent pointer (from its inode item).
    pub parent: Ino,
    /// The directory holding the entry that names it (0: none seen).
    pub lives_in: Ino,
    /// Entries of type directory in it.
    pub subdirs: u32,
}

/// The per-inode state of one fsck run.
#[derive(Debug, Default)]
pub struct Tallies {
    pub inodes: HashMap<u64, Tally>,
    pub dirs: HashMap<u64, DirTally>,
}

impl Tallies {
    pub fn inode(&mut self, ino: Ino) -> &mut Tally {
        self.inodes.entry(ino.0).or_default()
    }

    pub fn dir(&mut self, ino: Ino) -> &mut DirTally {
        self.dirs.entry(ino.0).or_default()
    }

    /// Counts an entry of `dir` naming `ino` as `kind`.
    pub fn add_entry(&mut self, dir: Ino, ino: Ino, kind: FileKind) {
        self.inode(ino).add_ref(kind);
        if kind == FileKind::Directory {
            let d = self.dir(dir);
            d.subdirs = d.subdirs.saturating_add(1);
            // The latest entry wins: a rename may add the new entry before it removes
            // the old one (a directory named twice is caught by its reference count).
            self.dir(ino).lives_in = dir;
        }
    }

    /// Uncounts an entry of `dir` naming `ino` as `kind`.
    pub fn remove_entry(&mut self, dir: Ino, ino: Ino, kind: FileKind) {
        self.inode(ino).remove_ref();
        if kind == FileKind::Directory {
            let d = self.dir(dir);
            d.subdirs = d.subdirs.saturating_sub(1);
            let child = self.dir(ino);
            if child.lives_in == dir {
                child.lives_in = Ino(0);
            }
        }
    }

    /// Bytes the tables hold now (capacity, not length: what the process pays).
    #[must_use]
    pub fn bytes(&self) -> usize {
        // A slot is the (key, value) pair as stored, with its alignment, and one
        // control byte.
        self.inodes.capacity() * (std::mem::size_of::<(u64, Tally)>() + 1)
            + self.dirs.capacity() * (std::mem::size_of::<(u64, DirTally)>() + 1)
    }
}

/// What a claimed block range collided with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimant {
    Extent,
    Page,
    FreeSpace,
}

/// Blocks in use per target, and which of them are metadata pages: 2 bits per data block.
#[derive(Debug, Clone)]
pub struct BlockMap {
    targets: Vec<TargetBits>,
}

#[derive(Debug, Clone)]
struct TargetBits {
    data_start: u64,
    blocks: u64,
    used: Vec<u64>,
    pages: Vec<u64>,
    /// Written blocks of datacow files whose checksum the walk of the `csum` tree has
    /// not met yet.
    want_csum: Vec<u64>,
    used_count: u64,
}

impl TargetBits {
    fn get(bits: &[u64], i: u64) -> bool {
        bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(bits: &mut [u64], i: u64, on: bool) {
        let w = &mut bits[(i / 64) as usize];
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }
}

impl BlockMap {
    #[must_use]
    pub fn new(geo: &Geometry) -> BlockMap {
        let targets = geo
            .targets
            .iter()
            .map(|t| {
                let words = t.data_blocks().div_ceil(64) as usize;
                TargetBits {
                    data_start: t.data_start,
                    blocks: t.blocks,
                    used: vec![0; words],
                    pages: vec![0; words],
                    want_csum: vec![0; words],
                    used_count: 0,
                }
            })
            .collect();
        BlockMap { targets }
    }

    /// Bytes of the bitmaps.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.targets
            .iter()
            .map(|t| (t.used.len() + t.pages.len() + t.want_csum.len()) * 8)
            .sum()
    }

    /// The data-area indices of `start..start + len` on `target`, or why there are none.
    fn range(&self, target: TargetId, start: u64, len: u64) -> Result<(usize, u64, u64), String> {
        let t = self
            .targets
            .get(target.index())
            .ok_or_else(|| "no such target".to_string())?;
        let end = start
            .checked_add(len)
            .ok_or_else(|| "length overflows".to_string())?;
        if start < t.data_start || end > t.blocks {
            return Err(format!(
                "outside the data area {}..{}",
                t.data_start, t.blocks
            ));
        }
        Ok((target.index(), start - t.data_start, end - t.data_start))
    }

    /// Marks `start..start + len` of `target` used by `who`: every block must be in the
    /// data area and not in use. Nothing is marked on error.
    ///
    /// # Errors
    /// `Corrupted` naming the range, as `Allocator::mark_used` words it, and what the
    /// blocks already belong to.
    pub fn claim(
        &mut self,
        target: TargetId,
        start: u64,
        len: u64,
        who: Claimant,
    ) -> Result<(), CoreError> {
        let what = || format!("extent at target {target} block {start} (+{len})");
        let (t, a, b) = self
            .range(target, start, len)
            .map_err(|d| CoreError::corrupted(what(), d))?;
        let bits = &mut self.targets[t];
        if let Some(i) = (a..b).find(|&i| TargetBits::get(&bits.used, i)) {
            let page = TargetBits::get(&bits.pages, i);
            let block = i + bits.data_start;
            let by = if page {
                "a metadata page"
            } else {
                "an extent or free space"
            };
            return Err(CoreError::corrupted(
                what(),
                format!("overlaps blocks already in use (block {block}: {by})"),
            ));
        }
        for i in a..b {
            TargetBits::set(&mut bits.used, i, true);
            if who == Claimant::Page {
                TargetBits::set(&mut bits.pages, i, true);
            }
        }
        bits.used_count += b - a;
        Ok(())
    }

    /// Marks `start..start + len` of `target` as written blocks of a datacow file: each
    /// needs a checksum item. Blocks outside the data area are ignored (claiming them
    /// reported them).
    pub fn want_csum(&mut self, target: TargetId, start: u64, len: u64) {
        let Ok((t, a, b)) = self.range(target, start, len) else {
            return;
        };
        let bits = &mut self.targets[t];
        for i in a..b {
            TargetBits::set(&mut bits.want_csum, i, true);
        }
    }

    /// A checksum item covers block `b` of `target`: true (and the block's mark cleared)
    /// if it was a written block of a datacow file still wanting it.
    pub fn csum_seen(&mut self, target: TargetId, b: u64) -> bool {
        let Ok((t, i, _)) = self.range(target, b, 1) else {
            return false;
        };
        let bits = &mut self.targets[t];
        let was = TargetBits::get(&bits.want_csum, i);
        TargetBits::set(&mut bits.want_csum, i, false);
        was
    }

    /// The blocks still wanting a checksum (after the walk of the `csum` tree): the
    /// first few as (target, block), and how many in all.
    #[must_use]
    pub fn csums_missing(&self, first: usize) -> (Vec<(TargetId, u64)>, u64) {
        let mut out = Vec::new();
        let mut n = 0u64;
        for (ti, t) in self.targets.iter().enumerate() {
            for (w, word) in t.want_csum.iter().enumerate() {
                if *word == 0 {
                    continue;
                }
                n += u64::from(word.count_ones());
                for bit in 0..64 {
                    if word & (1 << bit) != 0 && out.len() < first {
                        out.push((TargetId(ti as u32), t.data_start + w as u64 * 64 + bit));
                    }
                }
            }
        }
        (out, n)
    }

    /// Unmarks blocks of an extent (a journal record moved or freed them). Blocks out of
    /// range or not in use are ignored: claiming them reported them.
    pub fn release(&mut self, target: TargetId, start: u64, len: u64) {
        let Ok((t, a, b)) = self.range(target, start, len) else {
            return;
        };
        let bits = &mut self.targets[t];
        for i in a..b {
            if TargetBits::get(&bits.used, i) && !TargetBits::get(&bits.pages, i) {
                TargetBits::set(&mut bits.used, i, false);
                bits.used_count -= 1;
            }
        }
    }

    /// Blocks in use on `target`.
    #[must_use]
    pub fn used(&self, target: TargetId) -> u64 {
        self.targets.get(target.index()).map_or(0, |t| t.used_count)
    }

    /// Runs of blocks not in use on `target`: (first block, length).
    #[must_use]
    pub fn unused_runs(&self, target: TargetId) -> Vec<(u64, u64)> {
        let Some(t) = self.targets.get(target.index()) else {
            return Vec::new();
        };
        let n = t.blocks - t.data_start;
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut i = 0;
        while i < n {
            if t.used[(i / 64) as usize] == u64::MAX && i % 64 == 0 && i + 64 <= n {
                i += 64;
                continue;
            }
            if !TargetBits::get(&t.used, i) {
                match out.last_mut() {
                    Some((s, l)) if *s + *l == i + t.data_start => *l += 1,
                    _ => out.push((i + t.data_start, 1)),
                }
            }
            i += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripefs_core::geometry::MkfsParams;
    use stripefs_core::{BlockSize, Uuid};

    fn geo() -> Geometry {
        Geometry::plan(&MkfsParams {
            uuid: Uuid([7; 16]),
            block_size: BlockSize::new(4096).unwrap(),
            sector_size: 512,
            target_bytes: vec![8 << 20, 8 << 20],
            stripe_unit: 16384,
            stripe_count: 2,
            journal_bytes: None,
            mkfs_time_sec: 0,
        })
        .unwrap()
    }

    #[test]
    fn claims_refuse_overlap_and_name_pages() {
        let g = geo();
        let d0 = g.targets[0].data_start;
        let mut m = BlockMap::new(&g);
        m.claim(TargetId(0), d0, 4, Claimant::Page).unwrap();
        m.claim(TargetId(0), d0 + 4, 4, Claimant::Extent).unwrap();
        let e = m
            .claim(TargetId(0), d0 + 3, 1, Claimant::Extent)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlaps blocks already in use") && e.contains("metadata page"));
        let e = m
            .claim(TargetId(0), d0 + 7, 2, Claimant::Extent)
            .unwrap_err()
            .to_string();
        assert!(e.contains("an extent"), "{e}");
        let e = m.claim(TargetId(0), 1, 1, Claimant::Extent).unwrap_err();
        assert!(e.to_string().contains("outside the data area"), "{e}");
        assert_eq!(m.used(TargetId(0)), 8);
        m.release(TargetId(0), d0, 8);
        assert_eq!(m.used(TargetId(0)), 4, "pages stay claimed");
        assert_eq!(
            m.unused_runs(TargetId(0))[0],
            (d0 + 4, g.targets[0].blocks - d0 - 4)
        );
    }

    #[test]
    fn tally_kinds() {
        let mut t = Tally::default();
        t.add_ref(FileKind::Regular);
        assert!(t.kind_disagrees(), "no inode item");
        t.set_inode(FileKind::Regular, 1);
        assert!(!t.kind_disagrees());
        t.add_ref(FileKind::Symlink);
        assert!(t.kind_disagrees());
    }
}

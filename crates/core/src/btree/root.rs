//! The root record: the commit point of a checkpoint of the metadata trees.
//!
//! Two slots, written alternately (generation `G` goes to slot `G mod 2`) with one FUA
//! write each; the newest slot that verifies is the durable state. The record fits one
//! 512-byte sector, so it is written whole or not at all; a torn or never-written slot
//! fails its magic or checksum and reads as "nothing here".
//!
//! ```text
//!   0 magic "SFROOT01"   8 crc32c(12..512)   12 slot u32   16 uuid [16]
//!  32 generation u64    40 log2(page size) u8  41 tree count u8  42..48 zero
//!  48 journal tail u64  56 journal next sequence u64
//!  64 per tree (24 bytes): tree u8 | root level u8 | zero u16 | target u32 |
//!                          block u64 | root generation u64
//! 448 page log: first block's target u32 | blocks u32 (0: no log) | first block u64
//! ```
//!
//! The page log (`super::pagelog`) lists the metadata pages this generation allocated and
//! made free; with the space tree it gives the free space without walking the trees
//! (`docs/design/metadata.md`, "Persisted free space").

use super::key::TreeId;
use super::page::{Generation, PageAddr, PageRef, PageSize, MAX_LEVEL};
use super::tree::RootRef;
use crate::{crc32c, CoreError, PhysBlock, TargetId, Uuid};

/// Bytes of an encoded root record.
pub const ROOT_RECORD_BYTES: usize = 512;
const MAGIC: u64 = u64::from_le_bytes(*b"SFROOT01");
const TREE_ENTRY: usize = 24;
const LOG_AT: usize = 448;
const MAX_TREES: usize = (LOG_AT - 64) / TREE_ENTRY;

/// Where a generation's page log is: its first block and how many blocks it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRef {
    pub first: PageAddr,
    pub blocks: u32,
}

/// A verified root record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootRecord {
    pub slot: u32,
    pub generation: Generation,
    pub page_size: PageSize,
    /// Journal unit replay starts from once this generation is durable.
    pub journal_tail: u64,
    /// Sequence number of the first journal transaction after it.
    pub journal_seq: u64,
    pub roots: Vec<(TreeId, RootRef)>,
    /// The generation's page log (`None`: trees whose free space is not kept).
    pub log: Option<LogRef>,
}

fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl RootRecord {
    /// The slot generation `g` is written to.
    #[must_use]
    pub fn slot_of(g: Generation) -> u32 {
        (g.0 % 2) as u32
    }

    /// The root of `tree`.
    #[must_use]
    pub fn root(&self, tree: TreeId) -> Option<RootRef> {
        self.roots.iter().find(|(t, _)| *t == tree).map(|(_, r)| *r)
    }

    /// The 512 bytes of the record.
    ///
    /// # Panics
    /// Panics with more trees than fit (the format has four).
    #[must_use]
    pub fn encode(&self, uuid: Uuid) -> Vec<u8> {
        assert!(self.roots.len() <= MAX_TREES, "trees fit the record");
        let mut b = vec![0u8; ROOT_RECORD_BYTES];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[12..16].copy_from_slice(&self.slot.to_le_bytes());
        b[16..32].copy_from_slice(&uuid.0);
        b[32..40].copy_from_slice(&self.generation.0.to_le_bytes());
        b[40] = self.page_size.bytes().trailing_zeros() as u8;
        b[41] = self.roots.len() as u8;
        b[48..56].copy_from_slice(&self.journal_tail.to_le_bytes());
        b[56..64].copy_from_slice(&self.journal_seq.to_le_bytes());
        for (i, (tree, r)) in self.roots.iter().enumerate() {
            let e = &mut b[64 + i * TREE_ENTRY..64 + (i + 1) * TREE_ENTRY];
            e[0] = *tree as u8;
            e[1] = r.level;
            e[4..8].copy_from_slice(&r.at.addr.target.0.to_le_bytes());
            e[8..16].copy_from_slice(&r.at.addr.block.0.to_le_bytes());
            e[16..24].copy_from_slice(&r.at.generation.0.to_le_bytes());
        }
        if let Some(l) = self.log {
            assert!(l.blocks > 0, "a page log has blocks");
            b[LOG_AT..LOG_AT + 4].copy_from_slice(&l.first.target.0.to_le_bytes());
            b[LOG_AT + 4..LOG_AT + 8].copy_from_slice(&l.blocks.to_le_bytes());
            b[LOG_AT + 8..LOG_AT + 16].copy_from_slice(&l.first.block.0.to_le_bytes());
        }
        let crc = crc32c(&b[12..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes the record read from slot `slot`. `Ok(None)`: no valid record (never
    /// written, or torn); a record that verifies but is inconsistent is corruption.
    ///
    /// # Errors
    /// `Corrupted` naming the slot: another file system, another slot, a root newer
    /// than the record, an unknown tree or page size.
    pub fn decode(buf: &[u8], uuid: Uuid, slot: u32) -> Result<Option<RootRecord>, CoreError> {
        if buf.len() < ROOT_RECORD_BYTES
            || get64(buf, 0) != MAGIC
            || crc32c(&buf[12..ROOT_RECORD_BYTES]) != get32(buf, 8)
        {
            return Ok(None);
        }
        let what = format!("metadata root record slot {slot}");
        let bad = |d: String| Err(CoreError::corrupted(what.clone(), d));
        if buf[16..32] != uuid.0 {
            return bad("belongs to another file system".into());
        }
        if get32(buf, 12) != slot {
            return bad(format!("misdirected: record says slot {}", get32(buf, 12)));
        }
        let generation = Generation(get64(buf, 32));
        let Some(page_size) = 1u32
            .checked_shl(u32::from(buf[40]))
            .and_then(|b| PageSize::new(b).ok())
        else {
            return bad(format!("page size 2^{}", buf[40]));
        };
        let count = usize::from(buf[41]);
        if count > MAX_TREES || buf[42..48].iter().any(|&x| x != 0) {
            return bad(format!("{count} trees or reserved bytes set"));
        }
        let mut roots = Vec::with_capacity(count);
        for i in 0..count {
            let e = &buf[64 + i * TREE_ENTRY..64 + (i + 1) * TREE_ENTRY];
            let Some(tree) = TreeId::from_code(e[0]) else {
                return bad(format!("unknown tree {}", e[0]));
            };
            let at = PageRef {
                addr: PageAddr {
                    target: TargetId(get32(e, 4)),
                    block: PhysBlock(get64(e, 8)),
                },
                generation: Generation(get64(e, 16)),
            };
            if e[1] > MAX_LEVEL
                || at.generation > generation
                || roots.iter().any(|(t, _)| *t == tree)
            {
                return bad(format!(
                    "root of tree {tree}: level {}, generation {}",
                    e[1], at.generation
                ));
            }
            roots.push((tree, RootRef { at, level: e[1] }));
        }
        let log = match get32(buf, LOG_AT + 4) {
            0 => None,
            blocks => Some(LogRef {
                first: PageAddr {
                    target: TargetId(get32(buf, LOG_AT)),
                    block: PhysBlock(get64(buf, LOG_AT + 8)),
                },
                blocks,
            }),
        };
        Ok(Some(RootRecord {
            slot,
            generation,
            page_size,
            journal_tail: get64(buf, 48),
            journal_seq: get64(buf, 56),
            roots,
            log,
        }))
    }

    /// The newer of the records found in the two slots.
    ///
    /// # Errors
    /// `Corrupted` when neither slot holds a valid record.
    pub fn newest(a: Option<RootRecord>, b: Option<RootRecord>) -> Result<RootRecord, CoreError> {
        match (a, b) {
            (Some(a), Some(b)) => Ok(if b.generation > a.generation { b } else { a }),
            (Some(r), None) | (None, Some(r)) => Ok(r),
            (None, None) => Err(CoreError::corrupted(
                "metadata root records",
                "neither slot holds a valid record (both torn, damaged or never written)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> RootRecord {
        let at = |b, g| PageRef {
            addr: PageAddr {
                target: TargetId(2),
                block: PhysBlock(b),
            },
            generation: Generation(g),
        };
        RootRecord {
            slot: 1,
            generation: Generation(7),
            page_size: PageSize::DEFAULT,
            journal_tail: 99,
            journal_seq: 5,
            roots: vec![
                (
                    TreeId::Fs,
                    RootRef {
                        at: at(10, 7),
                        level: 2,
                    },
                ),
                (
                    TreeId::Space,
                    RootRef {
                        at: at(11, 3),
                        level: 0,
                    },
                ),
            ],
            log: Some(LogRef {
                first: at(12, 7).addr,
                blocks: 3,
            }),
        }
    }

    #[test]
    fn roundtrip_torn_and_misdirected() {
        let u = Uuid([1; 16]);
        let b = rec().encode(u);
        assert_eq!(RootRecord::decode(&b, u, 1).unwrap(), Some(rec()));
        let mut torn = b.clone();
        torn[300] ^= 1;
        assert_eq!(RootRecord::decode(&torn, u, 1).unwrap(), None);
        assert_eq!(RootRecord::decode(&[0; 512], u, 1).unwrap(), None);
        let e = RootRecord::decode(&b, u, 0).unwrap_err().to_string();
        assert!(e.contains("slot 0") && e.contains("misdirected"), "{e}");
        assert!(RootRecord::decode(&b, Uuid([2; 16]), 1).is_err());
        let mut newer = rec();
        newer.roots[1].1.at.generation = Generation(8);
        assert!(
            RootRecord::decode(&newer.encode(u), u, 1).is_err(),
            "root newer than record"
        );
        let old = RootRecord {
            generation: Generation(6),
            slot: 0,
            ..rec()
        };
        assert_eq!(
            RootRecord::newest(Some(old.clone()), Some(rec()))
                .unwrap()
                .generation,
            Generation(7)
        );
        assert_eq!(
            RootRecord::newest(Some(old), None).unwrap().generation,
            Generation(6)
        );
        assert!(RootRecord::newest(None, None).is_err());
    }
}

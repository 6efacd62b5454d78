//! The superblock: the first 512 bytes of every target.
//!
//! ```text
//!   0 magic "STRIPEFS"        8 version u32        12 sb_bytes u32 (=512)
//!  16 uuid [16]              32 target_index u32   36 target_count u32
//!  40 block_size u32         44 sector_size u32    48 target_blocks u64
//!  56 data_start u64         64 stripe_unit u32    68 stripe_count u32
//!  72 features compat u64    80 incompat u64       88 ro_compat u64
//!  96 root_slot[0] u64      104 root_slot[1] u64   112 zero u64
//! 120 journal_start u64     128 journal_blocks u64 136 journal_unit u32
//! 140 mkfs_time_sec i64     148 member_id u64      156 .. 508 zero
//! 508 crc32c u32 of bytes 0..508
//! ```
//! `member_id` is 0 on targets mkfs made; `add-target` writes a random one, which its
//! `TargetAdd` record and the trees keep, so that a disk an add formatted but never made
//! a member cannot pass for the member of the same index (`targets.md`, decision 118).
//! Builds before the field read the bytes as zero padding and ignore them.
//! The root record slot and journal fields are meaningful on target 0 and repeated on every
//! target so that any one of them describes the whole geometry. The superblock is written
//! once by mkfs and never rewritten: the moving state lives in the metadata trees' root
//! records (`btree::root`), one block each at `root_slot`.
//!
//! Version 1 (whole-model checkpoint areas at bytes 96..120) is refused: there is no
//! migration, and no deployed file system to migrate.

use crate::codec::{Dec, Enc};
use crate::{crc32c, BlockSize, CoreError, TargetId, Uuid};

/// Bytes covered by the superblock, including its checksum.
pub const SB_BYTES: usize = 512;
/// Magic at byte 0.
pub const SB_MAGIC: [u8; 8] = *b"STRIPEFS";
/// The format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 3;
/// Incompatible features this code understands (none defined yet).
pub const INCOMPAT_SUPPORTED: u64 = 0;

/// A decoded, verified superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: Uuid,
    pub target_index: TargetId,
    pub target_count: u32,
    pub block_size: u32,
    pub sector_size: u32,
    pub target_blocks: u64,
    pub data_start: u64,
    pub stripe_unit: u32,
    pub stripe_count: u32,
    pub features_compat: u64,
    pub features_incompat: u64,
    pub features_ro_compat: u64,
    /// Blocks on target 0 of the two root record slots (metadata trees).
    pub root_slots: [u64; 2],
    pub journal_start: u64,
    pub journal_blocks: u64,
    pub journal_unit: u32,
    pub mkfs_time_sec: i64,
    /// The random id `add-target` gave this target's membership (0: made by mkfs).
    pub member_id: u64,
}

impl Superblock {
    /// Encodes into exactly [`SB_BYTES`] bytes with the checksum in place.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new();
        e.bytes(&SB_MAGIC);
        e.u32(FORMAT_VERSION);
        e.u32(SB_BYTES as u32);
        e.bytes(&self.uuid.0);
        e.u32(self.target_index.0);
        e.u32(self.target_count);
        e.u32(self.block_size);
        e.u32(self.sector_size);
        e.u64(self.target_blocks);
        e.u64(self.data_start);
        e.u32(self.stripe_unit);
        e.u32(self.stripe_count);
        e.u64(self.features_compat);
        e.u64(self.features_incompat);
        e.u64(self.features_ro_compat);
        e.u64(self.root_slots[0]);
        e.u64(self.root_slots[1]);
        e.u64(0);
        e.u64(self.journal_start);
        e.u64(self.journal_blocks);
        e.u32(self.journal_unit);
        e.i64(self.mkfs_time_sec);
        e.u64(self.member_id);
        let mut buf = e.buf;
        buf.resize(SB_BYTES - 4, 0);
        let crc = crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Decodes and verifies a superblock read from the target named `name`.
    ///
    /// # Errors
    /// `Corrupted` naming the target and the failed check (magic, checksum, version,
    /// unsupported features, impossible geometry).
    pub fn decode(buf: &[u8], name: &str) -> Result<Self, CoreError> {
        let what = format!("superblock of target {name}");
        if buf.len() < SB_BYTES {
            return Err(CoreError::corrupted(
                what,
                "target is smaller than a superblock",
            ));
        }
        let buf = &buf[..SB_BYTES];
        if buf[..8] != SB_MAGIC {
            return Err(CoreError::corrupted(
                what,
                "bad magic: not a stripefs target",
            ));
        }
        let stored = u32::from_le_bytes(buf[SB_BYTES - 4..].try_into().expect("4 bytes"));
        if crc32c(&buf[..SB_BYTES - 4]) != stored {
            return Err(CoreError::corrupted(what, "checksum mismatch"));
        }
        let mut d = Dec::new(&buf[8..], &what);
        let version = d.u32()?;
        if version != FORMAT_VERSION {
            let hint = if version < FORMAT_VERSION {
                "; there is no migration: mkfs again"
            } else {
                ""
            };
            return Err(d.err(format!(
                "format version {version}, this build reads {FORMAT_VERSION}{hint}"
            )));
        }
        let _sb_bytes = d.u32()?;
        let uuid = Uuid(d.array()?);
        let target_index = TargetId(d.u32()?);
        let target_count = d.u32()?;
        let block_size = d.u32()?;
        let sector_size = d.u32()?;
        let target_blocks = d.u64()?;
        let data_start = d.u64()?;
        let stripe_unit = d.u32()?;
        let stripe_count = d.u32()?;
        let features = [d.u64()?, d.u64()?, d.u64()?];
        let root_slots = [d.u64()?, d.u64()?];
        if d.u64()? != 0 {
            return Err(d.err("reserved field at byte 112 is not zero"));
        }
        let sb = Superblock {
            uuid,
            target_index,
            target_count,
            block_size,
            sector_size,
            target_blocks,
            data_start,
            stripe_unit,
            stripe_count,
            features_compat: features[0],
            features_incompat: features[1],
            features_ro_compat: features[2],
            root_slots,
            journal_start: d.u64()?,
            journal_blocks: d.u64()?,
            journal_unit: d.u32()?,
            mkfs_time_sec: d.i64()?,
            member_id: d.u64()?,
        };
        sb.validate(&what)?;
        Ok(sb)
    }

    fn validate(&self, what: &str) -> Result<(), CoreError> {
        let bad = |d: String| Err(CoreError::corrupted(what, d));
        if self.features_incompat & !INCOMPAT_SUPPORTED != 0 {
            return bad(format!(
                "unsupported incompatible features {:#x}",
                self.features_incompat
            ));
        }
        let bs = match BlockSize::new(self.block_size) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        if self.target_count == 0 || self.target_index.0 >= self.target_count {
            return bad(format!(
                "target index {} of {} targets",
                self.target_index, self.target_count
            ));
        }
        if self
            .target_blocks
            .checked_mul(u64::from(self.block_size))
            .is_none()
        {
            // Also what bounds every block number by `PHYS_BLOCKS_MAX` (decision 93).
            return bad(format!(
                "{} blocks of {} bytes pass 2^64 bytes",
                self.target_blocks, self.block_size
            ));
        }
        if self.data_start == 0 || self.data_start > self.target_blocks {
            return bad(format!(
                "data start {} outside {} blocks",
                self.data_start, self.target_blocks
            ));
        }
        if self.stripe_count == 0
            || self.stripe_unit == 0
            || !self.stripe_unit.is_multiple_of(self.block_size)
        {
            return bad(format!(
                "default stripe {}x{} bytes",
                self.stripe_count, self.stripe_unit
            ));
        }
        let unit_ok = self.journal_unit.is_power_of_two()
            && self.journal_unit >= 512
            && self.journal_unit <= self.block_size;
        let [a, b] = self.root_slots;
        let slots_ok = a >= 1 && b >= 1 && a != b && a.max(b) < self.journal_start;
        if !unit_ok || self.journal_blocks == 0 || !slots_ok {
            return bad("journal or root record slot geometry is impossible".into());
        }
        if self.sector_size > self.block_size || !self.sector_size.is_power_of_two() {
            return bad(format!(
                "sector size {} with block size {}",
                self.sector_size,
                bs.bytes()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            uuid: Uuid([7; 16]),
            target_index: TargetId(1),
            target_count: 3,
            block_size: 4096,
            sector_size: 512,
            target_blocks: 1000,
            data_start: 256,
            stripe_unit: 65536,
            stripe_count: 3,
            features_compat: 0,
            features_incompat: 0,
            features_ro_compat: 0,
            root_slots: [1, 2],
            journal_start: 3,
            journal_blocks: 100,
            journal_unit: 4096,
            mkfs_time_sec: 1,
            member_id: 0,
        }
    }

    #[test]
    fn roundtrip() {
        let sb = sample();
        let buf = sb.encode();
        assert_eq!(buf.len(), SB_BYTES);
        assert_eq!(Superblock::decode(&buf, "t").unwrap(), sb);
    }

    #[test]
    fn older_versions_are_refused_naming_both_versions() {
        for old in [1u32, 2] {
            let mut buf = sample().encode();
            buf[8..12].copy_from_slice(&old.to_le_bytes());
            let crc = crc32c(&buf[..SB_BYTES - 4]);
            buf[SB_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
            let e = Superblock::decode(&buf, "t").unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "format version {old}, this build reads 3; there is no migration: mkfs again"
                )),
                "{e}"
            );
        }
    }

    /// Guards decision 93's bound: no target holds 2^54 blocks, so a superblock whose
    /// blocks pass 2^64 bytes is refused (re-checksummed, so only the rule can refuse it).
    #[test]
    fn a_target_past_2_64_bytes_is_refused() {
        let mut sb = sample();
        sb.target_blocks = crate::units::PHYS_BLOCKS_MAX;
        let e = Superblock::decode(&sb.encode(), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pass 2^64 bytes"), "{e}");
        sb.target_blocks = u64::MAX / u64::from(sb.block_size);
        Superblock::decode(&sb.encode(), "t").unwrap();
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let buf = sample().encode();
        for byte in 0..SB_BYTES {
            let mut b = buf.clone();
            b[byte] ^= 0x10;
            assert!(
                Superblock::decode(&b, "t").is_err(),
                "flip at byte {byte} went unnoticed"
            );
        }
    }
}

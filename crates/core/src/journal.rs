//! Journal record framing (the log itself is written by the runtime).
//!
//! The journal is a circular region on target 0 addressed by a logical sequence number of
//! journal units (`lsn`, monotonically increasing; physical unit = `lsn % units`). A
//! transaction is a header and its payload (encoded [`crate::record::Record`]s) in
//! consecutive units:
//!
//! ```text
//!  0 magic "SFJRNL01"   8 header crc32c (bytes 12..64)   12 payload crc32c
//! 16 uuid [16]         32 lsn u64      40 seq u64        48 units u32
//! 52 payload_len u32   56 reserved     64 payload ... (continues into following units)
//! ```
//! The header names its own `lsn` and `seq`, so a stale record from an earlier lap of the
//! log, a misdirected write or a record of another file system is never mistaken for the
//! next one.

use crate::{crc32c, Uuid};

/// Bytes of the transaction header.
pub const TXN_HEADER_BYTES: usize = 64;
const TXN_MAGIC: u64 = u64::from_le_bytes(*b"SFJRNL01");

/// A verified transaction header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnHeader {
    pub lsn: u64,
    pub seq: u64,
    /// Units occupied by the whole transaction (header included).
    pub units: u32,
    pub payload_len: u32,
    pub payload_crc: u32,
}

/// Why the record at an expected position is not the next transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderMismatch {
    /// Bad magic, checksum, uuid, position or sequence: not the record we expect (the end of
    /// the log, or a torn header).
    NotNext(String),
}

/// Units needed for a transaction with `payload_len` bytes of payload.
#[must_use]
pub fn txn_units(payload_len: usize, unit: u32) -> u64 {
    ((TXN_HEADER_BYTES + payload_len) as u64).div_ceil(u64::from(unit))
}

/// Encodes a transaction into whole units.
///
/// # Panics
/// Panics if the payload is 4 GiB or more (transactions are bounded far below).
#[must_use]
pub fn encode_txn(uuid: Uuid, lsn: u64, seq: u64, payload: &[u8], unit: u32) -> Vec<u8> {
    let units = txn_units(payload.len(), unit);
    let mut buf = vec![0u8; (units * u64::from(unit)) as usize];
    buf[0..8].copy_from_slice(&TXN_MAGIC.to_le_bytes());
    buf[12..16].copy_from_slice(&crc32c(payload).to_le_bytes());
    buf[16..32].copy_from_slice(&uuid.0);
    buf[32..40].copy_from_slice(&lsn.to_le_bytes());
    buf[40..48].copy_from_slice(&seq.to_le_bytes());
    buf[48..52].copy_from_slice(&u32::try_from(units).expect("units fit u32").to_le_bytes());
    buf[52..56].copy_from_slice(
        &u32::try_from(payload.len())
            .expect("payload below 4 GiB")
            .to_le_bytes(),
    );
    let hcrc = crc32c(&buf[12..TXN_HEADER_BYTES]);
    buf[8..12].copy_from_slice(&hcrc.to_le_bytes());
    buf[TXN_HEADER_BYTES..TXN_HEADER_BYTES + payload.len()].copy_from_slice(payload);
    buf
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// How far past its tail the log may extend, in units: a commit that would end beyond
/// this writes a checkpoint instead of appending. Recovery relies on it to bound the search
/// for transactions after a damaged one.
#[must_use]
pub fn log_limit(journal_units: u64) -> u64 {
    journal_units * 3 / 4
}

/// The fields of a header that verifies on its own (magic, checksum, file system), before
/// it is compared with the position and sequence the reader expects.
fn intact(first_unit: &[u8], uuid: Uuid) -> Result<TxnHeader, String> {
    if first_unit.len() < TXN_HEADER_BYTES {
        return Err("unit smaller than a header".into());
    }
    let h = &first_unit[..TXN_HEADER_BYTES];
    if le64(h, 0) != TXN_MAGIC {
        return Err("no record magic".into());
    }
    if crc32c(&h[12..]) != le32(h, 8) {
        return Err("header checksum mismatch".into());
    }
    if h[16..32] != uuid.0 {
        return Err("record of another file system".into());
    }
    Ok(TxnHeader {
        lsn: le64(h, 32),
        seq: le64(h, 40),
        units: le32(h, 48),
        payload_len: le32(h, 52),
        payload_crc: le32(h, 12),
    })
}

/// Checks that `first_unit` starts transaction `seq` at `lsn` of file system `uuid`, no
/// longer than `max_units`.
///
/// # Errors
/// [`HeaderMismatch::NotNext`] describing the first failed check.
pub fn decode_header(
    first_unit: &[u8],
    uuid: Uuid,
    lsn: u64,
    seq: u64,
    max_units: u64,
) -> Result<TxnHeader, HeaderMismatch> {
    let h = intact(first_unit, uuid).map_err(HeaderMismatch::NotNext)?;
    if h.lsn != lsn || h.seq != seq {
        return Err(HeaderMismatch::NotNext(format!(
            "record lsn {} seq {}, expected lsn {lsn} seq {seq}",
            h.lsn, h.seq
        )));
    }
    if h.units == 0 || u64::from(h.units) > max_units {
        return Err(HeaderMismatch::NotNext(format!(
            "record claims {} units",
            h.units
        )));
    }
    Ok(h)
}

/// Looks in `units` (consecutive journal units, the first at logical position `first_lsn`)
/// for an intact header of `uuid` that names its own position and a sequence after
/// `after_seq`: a transaction committed after the one recovery stopped at. Returns its
/// (lsn, seq).
///
/// A header names its position, so a record left from an earlier lap of the log never
/// qualifies; only a transaction written after `after_seq` was durable does.
#[must_use]
pub fn find_later(
    units: &[u8],
    unit: u32,
    first_lsn: u64,
    uuid: Uuid,
    after_seq: u64,
) -> Option<(u64, u64)> {
    units
        .chunks_exact(unit as usize)
        .zip(first_lsn..)
        .find_map(|(u, lsn)| {
            let h = intact(u, uuid).ok()?;
            (h.lsn == lsn && h.seq > after_seq).then_some((h.lsn, h.seq))
        })
}

/// Returns the payload of a whole transaction (`units` units read from `lsn`) if its
/// checksum matches.
#[must_use]
pub fn verify_payload<'a>(hdr: &TxnHeader, whole: &'a [u8]) -> Option<&'a [u8]> {
    let end = TXN_HEADER_BYTES.checked_add(hdr.payload_len as usize)?;
    let payload = whole.get(TXN_HEADER_BYTES..end)?;
    (crc32c(payload) == hdr.payload_crc).then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txn_roundtrip_and_rejections() {
        let u = Uuid([3; 16]);
        let payload = vec![9u8; 5000];
        let buf = encode_txn(u, 40, 7, &payload, 4096);
        assert_eq!(buf.len(), 8192);
        let h = decode_header(&buf[..4096], u, 40, 7, 100).unwrap();
        assert_eq!(verify_payload(&h, &buf).unwrap(), &payload[..]);
        assert!(
            decode_header(&buf, u, 41, 7, 100).is_err(),
            "wrong position"
        );
        assert!(
            decode_header(&buf, u, 40, 8, 100).is_err(),
            "wrong sequence"
        );
        assert!(
            decode_header(&buf, Uuid([4; 16]), 40, 7, 100).is_err(),
            "other fs"
        );
        let mut torn = buf.clone();
        torn[3000] ^= 1;
        assert!(verify_payload(&h, &torn).is_none(), "torn payload detected");
    }

    #[test]
    fn find_later_wants_a_later_transaction_at_its_own_position() {
        let u = Uuid([3; 16]);
        let mut log = vec![0u8; 512 * 4];
        // Unit 75 holds a record from an earlier lap of a 64-unit log (it names 75 - 64).
        log[512..1024].copy_from_slice(&encode_txn(u, 11, 9, b"x", 512));
        assert_eq!(find_later(&log, 512, 74, u, 5), None, "stale lap record");
        log[1024..1536].copy_from_slice(&encode_txn(u, 76, 5, b"x", 512));
        assert_eq!(
            find_later(&log, 512, 74, u, 5),
            None,
            "not a later sequence"
        );
        log[1536..].copy_from_slice(&encode_txn(Uuid([4; 16]), 77, 7, b"x", 512));
        assert_eq!(find_later(&log, 512, 74, u, 5), None, "another file system");
        log[1536..].copy_from_slice(&encode_txn(u, 77, 7, b"x", 512));
        assert_eq!(find_later(&log, 512, 74, u, 5), Some((77, 7)));
    }
}

//! Checkpoint framing: a full snapshot of the metadata model in one of two areas on
//! target 0, written alternately.
//!
//! Area block 0 is the header; blocks 1.. hold the payload, each with its own
//! self-describing block header. The runtime writes and flushes the payload blocks before
//! it writes the header, so a valid header always describes durable payload, and a torn
//! header simply leaves the other (older) checkpoint in charge.
//!
//! ```text
//! header block:  0 magic "SFCKPT01"  8 crc32c(12..128)  12 area u32  16 uuid
//!               32 own block u64     40 generation u64  48 payload blocks u64
//!               56 payload bytes u64 64 payload crc32c  72 journal tail lsn u64
//!               80 journal next seq u64  88 next ino u64  96 time sec i64
//! payload block: 0 magic "SFCKBLK1"  8 crc32c(12..block end)  12 used bytes u32
//!               16 uuid  32 own block u64  40 generation u64  48 index u64  64 data...
//! ```

use crate::{crc32c, CoreError, Uuid};

/// Bytes of each payload block's header.
pub const BLOCK_HEADER_BYTES: usize = 64;
const HEADER_BYTES: usize = 128;
const HDR_MAGIC: u64 = u64::from_le_bytes(*b"SFCKPT01");
const BLK_MAGIC: u64 = u64::from_le_bytes(*b"SFCKBLK1");

/// A verified checkpoint header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub area: u32,
    pub own_block: u64,
    pub generation: u64,
    pub payload_blocks: u64,
    pub payload_bytes: u64,
    pub payload_crc: u32,
    /// Journal position to replay from.
    pub journal_tail: u64,
    /// Sequence number of the first transaction after this checkpoint.
    pub journal_seq: u64,
    pub next_ino: u64,
    pub time_sec: i64,
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Payload bytes one block carries.
#[must_use]
pub fn block_capacity(block_size: u32) -> usize {
    block_size as usize - BLOCK_HEADER_BYTES
}

/// Encodes the payload blocks of a checkpoint whose area starts at `area_start`.
/// Returns the blocks (concatenated) and the header to write after them.
#[must_use]
pub fn encode(
    uuid: Uuid,
    block_size: u32,
    area_start: u64,
    mut hdr: CheckpointHeader,
    payload: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let bs = block_size as usize;
    let cap = block_capacity(block_size);
    let nblocks = payload.len().div_ceil(cap).max(1);
    let mut blocks = vec![0u8; nblocks * bs];
    for (i, block) in blocks.chunks_mut(bs).enumerate() {
        let chunk = payload
            .get(i * cap..((i + 1) * cap).min(payload.len()))
            .unwrap_or(&[]);
        put64(block, 0, BLK_MAGIC);
        put32(block, 12, chunk.len() as u32);
        block[16..32].copy_from_slice(&uuid.0);
        put64(block, 32, area_start + 1 + i as u64);
        put64(block, 40, hdr.generation);
        put64(block, 48, i as u64);
        block[BLOCK_HEADER_BYTES..BLOCK_HEADER_BYTES + chunk.len()].copy_from_slice(chunk);
        let crc = crc32c(&block[12..]);
        put32(block, 8, crc);
    }
    hdr.own_block = area_start;
    hdr.payload_blocks = nblocks as u64;
    hdr.payload_bytes = payload.len() as u64;
    hdr.payload_crc = crc32c(payload);
    let mut h = vec![0u8; bs];
    put64(&mut h, 0, HDR_MAGIC);
    put32(&mut h, 12, hdr.area);
    h[16..32].copy_from_slice(&uuid.0);
    put64(&mut h, 32, hdr.own_block);
    put64(&mut h, 40, hdr.generation);
    put64(&mut h, 48, hdr.payload_blocks);
    put64(&mut h, 56, hdr.payload_bytes);
    put32(&mut h, 64, hdr.payload_crc);
    put64(&mut h, 72, hdr.journal_tail);
    put64(&mut h, 80, hdr.journal_seq);
    put64(&mut h, 88, hdr.next_ino);
    put64(&mut h, 96, hdr.time_sec as u64);
    let crc = crc32c(&h[12..HEADER_BYTES]);
    put32(&mut h, 8, crc);
    (blocks, h)
}

/// Decodes a checkpoint header. `Ok(None)` means "no valid checkpoint here" (never
/// written, or torn); a header that verifies but names the wrong place is corruption.
///
/// # Errors
/// `Corrupted` when a checksummed header describes another block or file system.
pub fn decode_header(
    buf: &[u8],
    uuid: Uuid,
    own_block: u64,
    max_blocks: u64,
) -> Result<Option<CheckpointHeader>, CoreError> {
    if buf.len() < HEADER_BYTES
        || get64(buf, 0) != HDR_MAGIC
        || crc32c(&buf[12..HEADER_BYTES]) != get32(buf, 8)
    {
        return Ok(None);
    }
    let what = format!("checkpoint header at target 0 block {own_block}");
    if buf[16..32] != uuid.0 {
        return Err(CoreError::corrupted(what, "belongs to another file system"));
    }
    let h = CheckpointHeader {
        area: get32(buf, 12),
        own_block: get64(buf, 32),
        generation: get64(buf, 40),
        payload_blocks: get64(buf, 48),
        payload_bytes: get64(buf, 56),
        payload_crc: get32(buf, 64),
        journal_tail: get64(buf, 72),
        journal_seq: get64(buf, 80),
        next_ino: get64(buf, 88),
        time_sec: get64(buf, 96) as i64,
    };
    if h.own_block != own_block {
        return Err(CoreError::corrupted(
            what,
            format!("misdirected: header says block {}", h.own_block),
        ));
    }
    if h.payload_blocks == 0 || h.payload_blocks > max_blocks {
        return Err(CoreError::corrupted(
            what,
            format!(
                "{} payload blocks in an area of {max_blocks}",
                h.payload_blocks
            ),
        ));
    }
    Ok(Some(h))
}

/// Verifies the payload blocks (as read from `area_start + 1 ..`) and reassembles the
/// payload.
///
/// # Errors
/// `Corrupted` naming the first bad block and what failed.
pub fn decode_payload(
    hdr: &CheckpointHeader,
    uuid: Uuid,
    block_size: u32,
    blocks: &[u8],
) -> Result<Vec<u8>, CoreError> {
    let bs = block_size as usize;
    let mut payload = Vec::with_capacity(hdr.payload_bytes as usize);
    for (i, block) in blocks
        .chunks(bs)
        .take(hdr.payload_blocks as usize)
        .enumerate()
    {
        let addr = hdr.own_block + 1 + i as u64;
        let what = format!(
            "checkpoint block {i} (target 0 block {addr}, generation {})",
            hdr.generation
        );
        let bad = |d: &str| Err(CoreError::corrupted(what.clone(), d.to_string()));
        if block.len() != bs || get64(block, 0) != BLK_MAGIC {
            return bad("bad magic");
        }
        if crc32c(&block[12..]) != get32(block, 8) {
            return bad("checksum mismatch (inode, extent or directory records damaged)");
        }
        if block[16..32] != uuid.0
            || get64(block, 32) != addr
            || get64(block, 40) != hdr.generation
            || get64(block, 48) != i as u64
        {
            return bad("block belongs elsewhere (uuid, address, generation or index mismatch)");
        }
        let used = get32(block, 12) as usize;
        if used > block_capacity(block_size) {
            return bad("used length exceeds the block");
        }
        payload.extend_from_slice(&block[BLOCK_HEADER_BYTES..BLOCK_HEADER_BYTES + used]);
    }
    if payload.len() as u64 != hdr.payload_bytes || crc32c(&payload) != hdr.payload_crc {
        let what = format!(
            "checkpoint generation {} at target 0 block {}",
            hdr.generation, hdr.own_block
        );
        return Err(CoreError::corrupted(
            what,
            "payload does not match its header",
        ));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr() -> CheckpointHeader {
        CheckpointHeader {
            area: 1,
            own_block: 0,
            generation: 9,
            payload_blocks: 0,
            payload_bytes: 0,
            payload_crc: 0,
            journal_tail: 100,
            journal_seq: 12,
            next_ino: 77,
            time_sec: 5,
        }
    }

    #[test]
    fn roundtrip_and_corruption_is_named() {
        let u = Uuid([5; 16]);
        let payload: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let (blocks, h) = encode(u, 1024, 40, hdr(), &payload);
        let d = decode_header(&h, u, 40, 100).unwrap().unwrap();
        assert_eq!(d.journal_seq, 12);
        assert_eq!(decode_payload(&d, u, 1024, &blocks).unwrap(), payload);
        let mut bad = blocks.clone();
        bad[3 * 1024 + 500] ^= 4;
        let e = decode_payload(&d, u, 1024, &bad).unwrap_err().to_string();
        assert!(
            e.contains("checkpoint block 3") && e.contains("checksum"),
            "{e}"
        );
        let mut torn = h.clone();
        torn[50] ^= 1;
        assert_eq!(decode_header(&torn, u, 40, 100).unwrap(), None);
        assert!(decode_header(&h, u, 41, 100).is_err(), "misdirected header");
    }
}

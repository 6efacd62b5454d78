//! The page log of a generation: the metadata pages it allocated and made free.
//!
//! A checkpoint of generation `G` writes its log next to its pages (before the flush that
//! precedes the root record) and the root record names the log's first block and length
//! ([`super::root::LogRef`]). The space tree of `G` holds the free space as of `G`'s cut
//! for data and as of `G - 1` for pages; `G`'s log brings the pages up to `G`. So a mount
//! reads the space tree and one log, never every page (`docs/design/metadata.md`,
//! "Persisted free space").
//!
//! Each block is one page, self-describing and checksummed, and names the next one:
//!
//! ```text
//!   0 magic "SFPLOG01"   8 crc32c(12..page)   12 index u32   16 uuid [16]
//!  32 generation u64    40 own target u32    44 entries u32   48 own block u64
//!  56 next target u32   60 targets u32 (block 0: count of page counts; else 0)
//!  64 next block u64    72 block 0: pages per target u64 each; then the entries
//!  entry (16 bytes): target u32 | op u8 (1 allocated, 2 freed) | zero [3] | block u64
//! ```

use super::page::{Generation, PageAddr, PageSize};
use crate::{crc32c, CoreError, PhysBlock, TargetId, Uuid};

const MAGIC: u64 = u64::from_le_bytes(*b"SFPLOG01");
/// Most targets a file system may have: block 0 of a 4 KiB log holds a page count per
/// target and still has room for entries (mkfs refuses more).
pub const MAX_TARGETS: usize = 256;
const HEADER: usize = 72;
const ENTRY: usize = 16;

/// What an entry says happened to a page in the log's generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogOp {
    /// Written by this generation (its trees' pages and the log's own blocks).
    Allocated = 1,
    /// Reached by the previous generation and not by this one (a superseded page, or a
    /// block of the previous generation's log): free once this generation is durable.
    Freed = 2,
}

/// One page's change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEntry {
    pub op: LogOp,
    pub at: PageAddr,
}

/// A generation's page log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PageLog {
    /// Pages held on each target once this generation is durable (the trees' pages and
    /// this log's blocks).
    pub pages: Vec<u64>,
    pub entries: Vec<LogEntry>,
}

/// What one block of a log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogBlock {
    /// The next block (meaningless in the last one).
    pub next: PageAddr,
    /// Block 0: the page counts per target; empty in the others.
    pub pages: Vec<u64>,
    pub entries: Vec<LogEntry>,
}

fn cap(size: PageSize, first: bool, targets: usize) -> usize {
    let counts = if first { targets.saturating_mul(8) } else { 0 };
    size.bytes().saturating_sub(HEADER + counts) / ENTRY
}

/// Blocks a log of `entries` entries plus one `Allocated` entry per block of its own
/// needs.
///
/// # Panics
/// Panics if the page counts of `targets` targets do not fit one block (the geometry
/// allows far fewer targets).
#[must_use]
pub fn blocks_for(size: PageSize, targets: usize, entries: usize) -> usize {
    let first = cap(size, true, targets);
    assert!(first > 1, "{targets} page counts fill a log block");
    let rest = cap(size, false, targets);
    let mut k = 1;
    while first + (k - 1) * rest < entries + k {
        k += 1;
    }
    k
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Encodes `log` of generation `g` into one page per address of `addrs` (block `i` at
/// `addrs[i]`, naming `addrs[i + 1]`).
///
/// # Panics
/// Panics unless `addrs` is exactly [`blocks_for`] the log's entries (which must
/// already list `addrs` as allocated).
#[must_use]
pub fn encode(
    log: &PageLog,
    g: Generation,
    size: PageSize,
    uuid: Uuid,
    addrs: &[PageAddr],
) -> Vec<Vec<u8>> {
    let targets = log.pages.len();
    assert_eq!(
        addrs.len(),
        blocks_for(size, targets, log.entries.len() - addrs.len()),
        "log blocks for its entries"
    );
    let mut rest = log.entries.as_slice();
    let mut out = Vec::with_capacity(addrs.len());
    for (i, at) in addrs.iter().enumerate() {
        let mut b = vec![0u8; size.bytes()];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        put32(&mut b, 12, i as u32);
        b[16..32].copy_from_slice(&uuid.0);
        put64(&mut b, 32, g.0);
        put32(&mut b, 40, at.target.0);
        put64(&mut b, 48, at.block.0);
        let next = addrs.get(i + 1).copied().unwrap_or_default();
        put32(&mut b, 56, next.target.0);
        put64(&mut b, 64, next.block.0);
        let mut pos = HEADER;
        if i == 0 {
            put32(&mut b, 60, targets as u32);
            for p in &log.pages {
                put64(&mut b, pos, *p);
                pos += 8;
            }
        }
        let n = cap(size, i == 0, targets).min(rest.len());
        let (now, later) = rest.split_at(n);
        rest = later;
        put32(&mut b, 44, n as u32);
        for e in now {
            put32(&mut b, pos, e.at.target.0);
            b[pos + 4] = e.op as u8;
            put64(&mut b, pos + 8, e.at.block.0);
            pos += ENTRY;
        }
        let crc = crc32c(&b[12..]);
        put32(&mut b, 8, crc);
        out.push(b);
    }
    assert!(rest.is_empty(), "every entry fits the log's blocks");
    out
}

/// Decodes and verifies block `index` of generation `g`'s log, read at `at`, on a file
/// system of `targets` targets. Block 0 may hold fewer page counts than `targets`: the
/// members when it was written (targets given at mount that a later `TargetAdd` makes
/// members, `docs/design/targets.md`); its count is the log's member count, and later
/// blocks are decoded with that count as `targets`.
///
/// # Errors
/// `Corrupted` naming the block and the check that failed: magic or checksum (torn,
/// lost or never written), uuid, generation, index, own address (a misdirected write),
/// counts, or an entry naming no target or no operation.
pub fn decode(
    buf: &[u8],
    (size, uuid, targets): (PageSize, Uuid, u32),
    g: Generation,
    index: u32,
    at: PageAddr,
) -> Result<LogBlock, CoreError> {
    let what = format!("metadata page log of generation {g}, block {index} at {at}");
    let bad = |d: String| CoreError::corrupted(what.clone(), d);
    if buf.len() != size.bytes() || get64(buf, 0) != MAGIC {
        return Err(bad("bad magic (not a page log block)".into()));
    }
    if crc32c(&buf[12..]) != get32(buf, 8) {
        return Err(bad("checksum mismatch".into()));
    }
    if buf[16..32] != uuid.0 {
        return Err(bad("belongs to another file system".into()));
    }
    if get64(buf, 32) != g.0 || get32(buf, 12) != index {
        let (bg, bi) = (get64(buf, 32), get32(buf, 12));
        return Err(bad(format!(
            "is block {bi} of generation {bg}'s log (stale or lost write)"
        )));
    }
    let own = PageAddr {
        target: TargetId(get32(buf, 40)),
        block: PhysBlock(get64(buf, 48)),
    };
    if own != at {
        return Err(bad(format!("says it is at {own} (misdirected write)")));
    }
    let first = index == 0;
    let counts = get32(buf, 60);
    let counts_ok = if first {
        counts >= 1 && counts <= targets
    } else {
        counts == 0
    };
    if !counts_ok {
        return Err(bad(format!("{counts} page counts for {targets} targets")));
    }
    let targets = if first { counts } else { targets };
    if first && (targets as usize).saturating_mul(8) + HEADER > size.bytes() {
        return Err(bad(format!("{targets} page counts do not fit the block")));
    }
    let n = get32(buf, 44) as usize;
    if n > cap(size, first, targets as usize) {
        return Err(bad(format!("{n} entries do not fit the block")));
    }
    let mut pos = HEADER;
    let mut pages = Vec::new();
    if first {
        for _ in 0..targets {
            pages.push(get64(buf, pos));
            pos += 8;
        }
    }
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let t = get32(buf, pos);
        let op = match buf[pos + 4] {
            1 => LogOp::Allocated,
            2 => LogOp::Freed,
            x => return Err(bad(format!("entry with operation {x}"))),
        };
        if t >= targets || buf[pos + 5..pos + 8] != [0; 3] {
            return Err(bad(format!(
                "entry names target {t} or sets reserved bytes"
            )));
        }
        let at = PageAddr {
            target: TargetId(t),
            block: PhysBlock(get64(buf, pos + 8)),
        };
        entries.push(LogEntry { op, at });
        pos += ENTRY;
    }
    let next = PageAddr {
        target: TargetId(get32(buf, 56)),
        block: PhysBlock(get64(buf, 64)),
    };
    Ok(LogBlock {
        next,
        pages,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(t: u32, b: u64) -> PageAddr {
        PageAddr {
            target: TargetId(t),
            block: PhysBlock(b),
        }
    }

    #[test]
    fn roundtrip_over_several_blocks_and_damage_is_named() {
        let size = PageSize::DEFAULT;
        let u = Uuid([4; 16]);
        let mut entries: Vec<LogEntry> = (0..600)
            .map(|i| LogEntry {
                op: if i % 3 == 0 {
                    LogOp::Freed
                } else {
                    LogOp::Allocated
                },
                at: addr(i % 2, 1000 + u64::from(i)),
            })
            .collect();
        let k = blocks_for(size, 2, entries.len());
        assert_eq!(k, 3, "600 entries and 3 own blocks of 4 KiB");
        let addrs: Vec<PageAddr> = (0..k as u64).map(|i| addr(1, 50 + 7 * i)).collect();
        entries.extend(addrs.iter().map(|&at| LogEntry {
            op: LogOp::Allocated,
            at,
        }));
        let log = PageLog {
            pages: vec![10, 12],
            entries,
        };
        let g = Generation(9);
        let bufs = encode(&log, g, size, u, &addrs);
        let mut back = PageLog::default();
        for (i, (b, at)) in bufs.iter().zip(&addrs).enumerate() {
            let blk = decode(b, (size, u, 2), g, i as u32, *at).unwrap();
            if i == 0 {
                back.pages = blk.pages;
            }
            if let Some(n) = addrs.get(i + 1) {
                assert_eq!(blk.next, *n);
            }
            back.entries.extend(blk.entries);
        }
        assert_eq!(back, log);
        let ctx = (size, u, 2);
        let mut torn = bufs[1].clone();
        torn[999] ^= 1;
        let e = decode(&torn, ctx, g, 1, addrs[1]).unwrap_err().to_string();
        assert!(
            e.contains("generation 9, block 1") && e.contains("checksum"),
            "{e}"
        );
        let e = decode(&bufs[1], ctx, g, 1, addrs[2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("misdirected"), "{e}");
        let e = decode(&bufs[1], ctx, Generation(10), 1, addrs[1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("stale or lost"), "{e}");
        // More targets given than the log counts: a target added but not yet a member
        // of these trees (`targets.md`); fewer is a member missing.
        let more = decode(&bufs[0], (size, u, 3), g, 0, addrs[0]).unwrap();
        assert_eq!(more.pages, vec![10, 12], "the log's own count of members");
        assert!(
            decode(&bufs[0], (size, u, 1), g, 0, addrs[0]).is_err(),
            "target count"
        );
        assert!(decode(&bufs[0], (size, Uuid([5; 16]), 2), g, 0, addrs[0]).is_err());
        let mut many = bufs[0].clone();
        many[60..64].copy_from_slice(&1000u32.to_le_bytes());
        let crc = crc32c(&many[12..]);
        many[8..12].copy_from_slice(&crc.to_le_bytes());
        let e = decode(&many, (size, u, 1000), g, 0, addrs[0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("do not fit"), "{e}");
    }
}

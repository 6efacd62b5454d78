//! The online scrub's channel (decision 75, `docs/design/scrub.md`): one private ioctl on
//! the mount's root directory, answered by the daemon with one [`Fs::scrub_step`].
//!
//! FUSE passes an ioctl it does not know to the daemon in its restricted form: the
//! argument's size and direction come from the command number, and the kernel copies
//! that many bytes in and out. So the command is `_IOWR(0xB5, 1, [u8; BYTES])`: the
//! caller's buffer holds the cursor and the step's budget on the way in, and the step's
//! result on the way out (the cursor to resume from, the counts, and every mismatch and
//! unreadable run of the step, at most [`MAX_ENTRIES`], which is also the most blocks a
//! step may verify). Little-endian fields, fixed offsets:
//!
//! - request: cursor inode u64, object u32, 0 u32, block u64, budget u64;
//! - reply header (64 bytes): next inode u64, next object u32, done u32 (1: the scrub is
//!   complete, the cursor fields are 0), next block u64, blocks u64, bytes u64, inode
//!   limit u64, files u64, entries u32, 0 u32;
//! - then `entries` entries of 40 bytes: kind u32 (1 mismatch, 2 unreadable run),
//!   target u32, inode u64, file offset u64, physical block u64, blocks u64.
//!
//! [`Fs::scrub_step`]: stripefs::Fs::scrub_step

use crate::wire::{put, u32_at, u64_at};
use stripefs::{Ino, ScrubCursor, ScrubMismatch, ScrubReadError, ScrubStep, TargetId};

/// Most entries a reply holds, and so the most blocks one step verifies.
pub const MAX_ENTRIES: usize = 250;
const HEADER: usize = 64;
const ENTRY: usize = 40;
/// The argument's size: 10,064 bytes (an ioctl's size field holds up to 16,383).
pub const BYTES: usize = HEADER + MAX_ENTRIES * ENTRY;
const _: () = assert!(BYTES < 1 << 14);
/// `_IOWR(0xB5, 1, [u8; BYTES])`.
#[allow(clippy::cast_possible_truncation)]
pub const SCRUB_STEP: u32 = (3 << 30) | ((BYTES as u32) << 16) | (0xB5 << 8) | 1;

const KIND_MISMATCH: u32 = 1;
const KIND_UNREADABLE: u32 = 2;

/// The request for one step from `from`, verifying at most `budget` blocks.
#[must_use]
pub fn encode_request(from: ScrubCursor, budget: u64) -> Vec<u8> {
    let mut b = vec![0u8; BYTES];
    put(&mut b, 0, &from.ino.to_le_bytes());
    put(&mut b, 8, &from.object.to_le_bytes());
    put(&mut b, 16, &from.block.to_le_bytes());
    put(&mut b, 24, &budget.to_le_bytes());
    b
}

/// The cursor and budget of a request; `None` if it is shorter than [`BYTES`].
#[must_use]
pub fn decode_request(b: &[u8]) -> Option<(ScrubCursor, u64)> {
    (b.len() >= BYTES).then(|| {
        let c = ScrubCursor {
            ino: u64_at(b, 0),
            object: u32_at(b, 8),
            block: u64_at(b, 16),
        };
        (c, u64_at(b, 24))
    })
}

/// The reply to a step; `None` if it has more than [`MAX_ENTRIES`] entries (a step
/// given a budget of at most [`MAX_ENTRIES`] blocks never does).
#[must_use]
pub fn encode_step(s: &ScrubStep) -> Option<Vec<u8>> {
    let n = s.mismatches.len() + s.read_errors.len();
    if n > MAX_ENTRIES {
        return None;
    }
    let mut b = vec![0u8; BYTES];
    match s.next {
        Some(c) => {
            put(&mut b, 0, &c.ino.to_le_bytes());
            put(&mut b, 8, &c.object.to_le_bytes());
            put(&mut b, 16, &c.block.to_le_bytes());
        }
        None => put(&mut b, 12, &1u32.to_le_bytes()),
    }
    put(&mut b, 24, &s.blocks.to_le_bytes());
    put(&mut b, 32, &s.bytes.to_le_bytes());
    put(&mut b, 40, &s.ino_limit.to_le_bytes());
    put(&mut b, 48, &s.files.to_le_bytes());
    put(
        &mut b,
        56,
        &u32::try_from(n).expect("at most MAX_ENTRIES").to_le_bytes(),
    );
    let entries = s
        .mismatches
        .iter()
        .map(|m| (KIND_MISMATCH, m.target, m.ino, m.file_off, m.phys, 1))
        .chain(s.read_errors.iter().map(|r| {
            (
                KIND_UNREADABLE,
                r.target,
                r.ino,
                r.file_off,
                r.phys,
                r.blocks,
            )
        }));
    for (i, (kind, t, ino, off, phys, blocks)) in entries.enumerate() {
        let at = HEADER + i * ENTRY;
        put(&mut b, at, &kind.to_le_bytes());
        put(&mut b, at + 4, &t.0.to_le_bytes());
        put(&mut b, at + 8, &ino.0.to_le_bytes());
        put(&mut b, at + 16, &off.to_le_bytes());
        put(&mut b, at + 24, &phys.to_le_bytes());
        put(&mut b, at + 32, &blocks.to_le_bytes());
    }
    Some(b)
}

/// A step's result from its reply. An unreadable run's error is the daemon's to log:
/// the reply says only that the target failed the read.
///
/// # Errors
/// A reply of the wrong size, too many entries, or an unknown entry kind (not a
/// stripefs daemon's answer).
pub fn decode_step(b: &[u8]) -> Result<ScrubStep, String> {
    if b.len() != BYTES {
        return Err(format!("scrub reply of {} bytes, not {BYTES}", b.len()));
    }
    let n = u32_at(b, 56) as usize;
    if n > MAX_ENTRIES {
        return Err(format!(
            "scrub reply with {n} entries (at most {MAX_ENTRIES})"
        ));
    }
    let next = match u32_at(b, 12) {
        0 => Some(ScrubCursor {
            ino: u64_at(b, 0),
            object: u32_at(b, 8),
            block: u64_at(b, 16),
        }),
        1 => None,
        d => return Err(format!("scrub reply with done flag {d}")),
    };
    let mut s = ScrubStep {
        next,
        blocks: u64_at(b, 24),
        bytes: u64_at(b, 32),
        ino_limit: u64_at(b, 40),
        files: u64_at(b, 48),
        ..ScrubStep::default()
    };
    for i in 0..n {
        let at = HEADER + i * ENTRY;
        let (target, ino) = (TargetId(u32_at(b, at + 4)), Ino(u64_at(b, at + 8)));
        let (file_off, phys) = (u64_at(b, at + 16), u64_at(b, at + 24));
        match u32_at(b, at) {
            KIND_MISMATCH => s.mismatches.push(ScrubMismatch {
                ino,
                file_off,
                target,
                phys,
            }),
            KIND_UNREADABLE => s.read_errors.push(ScrubReadError {
                ino,
                file_off,
                target,
                phys,
                blocks: u64_at(b, at + 32),
                error: "the target failed the read (the daemon's log has the error)".into(),
            }),
            k => return Err(format!("scrub reply entry {i} of unknown kind {k}")),
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_round_trips_through_the_reply() {
        let s = ScrubStep {
            next: Some(ScrubCursor {
                ino: 77,
                object: 3,
                block: 4096,
            }),
            blocks: 250,
            bytes: 250 * 4096,
            files: 1,
            ino_limit: 1000,
            mismatches: vec![ScrubMismatch {
                ino: Ino(77),
                file_off: 8192,
                target: TargetId(2),
                phys: 555,
            }],
            read_errors: vec![ScrubReadError {
                ino: Ino(77),
                file_off: 65536,
                target: TargetId(1),
                phys: 900,
                blocks: 16,
                error: String::new(),
            }],
        };
        let d = decode_step(&encode_step(&s).unwrap()).unwrap();
        assert_eq!(d.next, s.next);
        assert_eq!(
            (d.blocks, d.bytes, d.files, d.ino_limit),
            (250, 250 * 4096, 1, 1000)
        );
        assert_eq!(d.mismatches, s.mismatches);
        assert_eq!(d.read_errors.len(), 1);
        assert_eq!((d.read_errors[0].phys, d.read_errors[0].blocks), (900, 16));
        let done = ScrubStep::default();
        assert_eq!(
            decode_step(&encode_step(&done).unwrap()).unwrap().next,
            None
        );
        let (c, budget) = decode_request(&encode_request(s.next.unwrap(), 9)).unwrap();
        assert_eq!((c, budget), (s.next.unwrap(), 9));
    }

    #[test]
    fn a_reply_too_full_or_malformed_is_refused() {
        let m = ScrubMismatch {
            ino: Ino(5),
            file_off: 0,
            target: TargetId(0),
            phys: 1,
        };
        let s = ScrubStep {
            mismatches: vec![m; MAX_ENTRIES + 1],
            ..ScrubStep::default()
        };
        assert!(encode_step(&s).is_none());
        let mut b = encode_step(&ScrubStep::default()).unwrap();
        b[56] = 251;
        assert!(decode_step(&b).unwrap_err().contains("251 entries"));
        assert!(decode_step(&b[..100]).unwrap_err().contains("100 bytes"));
        assert!(decode_request(&[0u8; 31]).is_none());
    }

    #[test]
    fn the_command_encodes_read_write_and_the_size() {
        assert_eq!(SCRUB_STEP >> 30, 3);
        assert_eq!((SCRUB_STEP >> 16) & 0x3fff, BYTES as u32);
        assert_eq!(SCRUB_STEP & 0xffff, 0xB501);
    }
}

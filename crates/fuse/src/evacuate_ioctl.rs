//! The online evacuation's channel (`docs/design/reflink.md`, "Evacuation"): one private
//! ioctl on the mount's root directory, answered by the daemon with one part of an
//! evacuation ([`Fs::evacuate_begin`], one bounded [`Fs::evacuate_step`],
//! [`Fs::evacuate_finish`] or [`Fs::evacuate_cancel`]), or the retirement of the target
//! it emptied ([`Fs::retire_target`]), so the command drives it in steps and shows
//! progress, as the scrub channel does (`scrub_ioctl`).
//!
//! `_IOWR(0xB5, 3, [u8; BYTES])`, little-endian fields at fixed offsets:
//!
//! - request: part u32 (1 begin, 2 step, 3 finish, 4 cancel, 5 retire), target u32, cursor inode
//!   u64, budget (blocks) u64;
//! - reply: next inode u64, done u32 (1: no file has blocks on the target any more),
//!   0 u32, blocks moved u64, files u64, inode limit u64, metadata paths rewritten u64.
//!
//! [`Fs::evacuate_begin`]: stripefs::Fs::evacuate_begin
//! [`Fs::evacuate_step`]: stripefs::Fs::evacuate_step
//! [`Fs::evacuate_finish`]: stripefs::Fs::evacuate_finish
//! [`Fs::evacuate_cancel`]: stripefs::Fs::evacuate_cancel
//! [`Fs::retire_target`]: stripefs::Fs::retire_target

use crate::wire::{put, u32_at, u64_at};
use stripefs::{EvacuateStep, TargetId};

/// The argument's size.
pub const BYTES: usize = 48;
/// `_IOWR(0xB5, 3, [u8; BYTES])`.
#[allow(clippy::cast_possible_truncation)]
pub const EVACUATE: u32 = (3 << 30) | ((BYTES as u32) << 16) | (0xB5 << 8) | 3;
/// Most blocks one step moves (4 MiB at 4 KiB blocks): a step holds one FUSE thread.
pub const MAX_BUDGET: u64 = 1024;

/// Which part of an evacuation a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Begin,
    Step { from: u64, budget: u64 },
    Finish,
    Cancel,
    Retire,
}

/// A request: `part` of the evacuation of `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub target: TargetId,
    pub part: Part,
}

/// What the daemon answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    pub step: EvacuateStep,
    /// Metadata-tree paths rewritten (a finish's answer).
    pub meta_paths: u64,
}

/// The ioctl argument of `r`.
#[must_use]
pub fn encode_request(r: Request) -> Vec<u8> {
    let mut b = vec![0u8; BYTES];
    let (code, from, budget) = match r.part {
        Part::Begin => (1u32, 0, 0),
        Part::Step { from, budget } => (2, from, budget),
        Part::Finish => (3, 0, 0),
        Part::Cancel => (4, 0, 0),
        Part::Retire => (5, 0, 0),
    };
    put(&mut b, 0, &code.to_le_bytes());
    put(&mut b, 4, &r.target.0.to_le_bytes());
    put(&mut b, 8, &from.to_le_bytes());
    put(&mut b, 16, &budget.to_le_bytes());
    b
}

/// The request in an ioctl argument; `None` if it is short or names no part.
#[must_use]
pub fn decode_request(b: &[u8]) -> Option<Request> {
    if b.len() < BYTES {
        return None;
    }
    let part = match u32_at(b, 0) {
        1 => Part::Begin,
        2 => Part::Step {
            from: u64_at(b, 8),
            budget: u64_at(b, 16),
        },
        3 => Part::Finish,
        4 => Part::Cancel,
        5 => Part::Retire,
        _ => return None,
    };
    Some(Request {
        target: TargetId(u32_at(b, 4)),
        part,
    })
}

/// The reply bytes of `r`.
#[must_use]
pub fn encode_reply(r: &Reply) -> Vec<u8> {
    let mut b = vec![0u8; BYTES];
    put(&mut b, 0, &r.step.next.unwrap_or(0).to_le_bytes());
    put(&mut b, 8, &u32::from(r.step.next.is_none()).to_le_bytes());
    put(&mut b, 16, &r.step.blocks.to_le_bytes());
    put(&mut b, 24, &r.step.files.to_le_bytes());
    put(&mut b, 32, &r.step.ino_limit.to_le_bytes());
    put(&mut b, 40, &r.meta_paths.to_le_bytes());
    b
}

/// A reply from its bytes.
///
/// # Errors
/// A reply of the wrong size or with an unknown done flag (not a stripefs daemon's).
pub fn decode_reply(b: &[u8]) -> Result<Reply, String> {
    if b.len() != BYTES {
        return Err(format!("evacuate reply of {} bytes, not {BYTES}", b.len()));
    }
    let next = match u32_at(b, 8) {
        0 => Some(u64_at(b, 0)),
        1 => None,
        d => return Err(format!("evacuate reply with done flag {d}")),
    };
    Ok(Reply {
        step: EvacuateStep {
            next,
            blocks: u64_at(b, 16),
            files: u64_at(b, 24),
            ino_limit: u64_at(b, 32),
        },
        meta_paths: u64_at(b, 40),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        for part in [
            Part::Begin,
            Part::Step {
                from: 77,
                budget: 1024,
            },
            Part::Finish,
            Part::Cancel,
        ] {
            let r = Request {
                target: TargetId(3),
                part,
            };
            assert_eq!(decode_request(&encode_request(r)), Some(r));
        }
        let mut bad = encode_request(Request {
            target: TargetId(1),
            part: Part::Begin,
        });
        bad[0] = 9;
        assert_eq!(decode_request(&bad), None);
        for next in [Some(12), None] {
            let r = Reply {
                step: EvacuateStep {
                    next,
                    blocks: 5,
                    files: 2,
                    ino_limit: 100,
                },
                meta_paths: 7,
            };
            assert_eq!(decode_reply(&encode_reply(&r)), Ok(r));
        }
        assert!(decode_reply(&[0u8; 3]).is_err());
    }
}

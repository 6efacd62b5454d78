//! `add-target`'s channel (`docs/design/targets.md`, decision 117): one private ioctl on
//! the mount's root directory, answered by the daemon with one [`Fs::add_target`] of the
//! target it opens at the path given, as it opened its targets at mount
//! ([`TargetOpener`], supplied by whoever serves the mount).
//!
//! As the scrub's ioctl (decision 75), the command carries its argument's size, so the
//! kernel copies a fixed buffer in and out: `_IOWR(0xB5, 2, [u8; BYTES])`.
//! Little-endian fields, fixed offsets:
//!
//! - request: path length u32, 0 u32, then the path's bytes (absolute, at most
//!   [`PATH_MAX`]);
//! - reply: status u32 (0 added, 1 refused), index u32, blocks u64 (the target's data
//!   blocks), block size u32, message length u32, then the message (why it was refused,
//!   at most [`PATH_MAX`] bytes, cut at a character boundary).
//!
//! [`Fs::add_target`]: stripefs::Fs::add_target

use crate::wire::{u32_at, u64_at};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use stripefs_target::Target;

/// Most bytes of a path, and of a refusal's message.
pub const PATH_MAX: usize = 4096;
const HEADER: usize = 24;
/// The argument's size.
pub const BYTES: usize = HEADER + PATH_MAX;
const _: () = assert!(BYTES < 1 << 14);
/// `_IOWR(0xB5, 2, [u8; BYTES])`.
#[allow(clippy::cast_possible_truncation)]
pub const ADD_TARGET: u32 = (3 << 30) | ((BYTES as u32) << 16) | (0xB5 << 8) | 2;

/// Opens the target at a path as the mount opened its own (files, block devices,
/// `nbd://` URIs): the CLI's `targets::open_one`.
#[derive(Clone)]
pub struct TargetOpener(pub Arc<OpenFn>);

/// What a [`TargetOpener`] calls: the target at a path, or why it cannot be opened.
pub type OpenFn = dyn Fn(&Path) -> Result<Arc<dyn Target>, String> + Send + Sync;

impl std::fmt::Debug for TargetOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TargetOpener")
    }
}

/// What the daemon answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// Target `index` joined with `blocks` data blocks of `block_size` bytes.
    Joined {
        index: u32,
        blocks: u64,
        block_size: u32,
    },
    /// Refused, and why.
    Refused(String),
}

/// The request to add the target at `path`; `None` if the path is longer than
/// [`PATH_MAX`] bytes or not valid UTF-8 (`nbd://` URIs and file names alike travel as
/// UTF-8).
#[must_use]
pub fn encode_request(path: &Path) -> Option<Vec<u8>> {
    let p = path.to_str()?.as_bytes();
    if p.len() > PATH_MAX {
        return None;
    }
    let mut b = vec![0u8; BYTES];
    b[0..4].copy_from_slice(&(p.len() as u32).to_le_bytes());
    b[8..8 + p.len()].copy_from_slice(p);
    Some(b)
}

/// The path of a request; `None` if it is short, too long or not UTF-8.
#[must_use]
pub fn decode_request(b: &[u8]) -> Option<PathBuf> {
    if b.len() < BYTES {
        return None;
    }
    let n = u32_at(b, 0) as usize;
    let p = b.get(8..8 + n).filter(|_| n <= PATH_MAX)?;
    std::str::from_utf8(p).ok().map(PathBuf::from)
}

/// The reply carrying `a`.
#[must_use]
pub fn encode_reply(a: &Added) -> Vec<u8> {
    let mut b = vec![0u8; BYTES];
    match a {
        Added::Joined {
            index,
            blocks,
            block_size,
        } => {
            b[4..8].copy_from_slice(&index.to_le_bytes());
            b[8..16].copy_from_slice(&blocks.to_le_bytes());
            b[16..20].copy_from_slice(&block_size.to_le_bytes());
        }
        Added::Refused(why) => {
            let mut n = why.len().min(PATH_MAX);
            while !why.is_char_boundary(n) {
                n -= 1;
            }
            b[0..4].copy_from_slice(&1u32.to_le_bytes());
            b[20..24].copy_from_slice(&(n as u32).to_le_bytes());
            b[HEADER..HEADER + n].copy_from_slice(&why.as_bytes()[..n]);
        }
    }
    b
}

/// The daemon's answer.
///
/// # Errors
/// A sentence when the reply is short or its fields do not fit.
pub fn decode_reply(b: &[u8]) -> Result<Added, String> {
    if b.len() < BYTES {
        return Err(format!("add-target reply of {} bytes", b.len()));
    }
    match u32_at(b, 0) {
        0 => Ok(Added::Joined {
            index: u32_at(b, 4),
            blocks: u64_at(b, 8),
            block_size: u32_at(b, 16),
        }),
        1 => {
            let n = u32_at(b, 20) as usize;
            let m = b
                .get(HEADER..HEADER + n)
                .filter(|_| n <= PATH_MAX)
                .ok_or_else(|| format!("add-target reply with a message of {n} bytes"))?;
            Ok(Added::Refused(String::from_utf8_lossy(m).into_owned()))
        }
        s => Err(format!("add-target reply with status {s}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_replies_round_trip() {
        let p = Path::new("/dev/disk/by-id/nvme-x");
        assert_eq!(decode_request(&encode_request(p).unwrap()).unwrap(), p);
        assert!(encode_request(&PathBuf::from("a".repeat(PATH_MAX + 1))).is_none());
        let j = Added::Joined {
            index: 4,
            blocks: 1 << 40,
            block_size: 4096,
        };
        assert_eq!(decode_reply(&encode_reply(&j)).unwrap(), j);
        let long = "é".repeat(PATH_MAX);
        let Added::Refused(m) = decode_reply(&encode_reply(&Added::Refused(long))).unwrap() else {
            panic!("refused")
        };
        assert!(m.len() <= PATH_MAX && m.chars().all(|c| c == 'é'));
        assert!(decode_reply(&[0u8; 10]).is_err());
    }
}

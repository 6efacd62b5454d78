//! The transport seam: how FUSE requests reach the dispatcher and replies leave it.
//!
//! Two transports sit below fuser's dispatcher (`docs/design/fuse.md`):
//!
//! - **`/dev/fuse`**: fuser's own workers `read` a request and `writev` its reply. It is
//!   always there: `FUSE_INIT`, `FORGET`, `INTERRUPT` and everything before the ring is
//!   ready take it.
//! - **io_uring** (`uring.rs`, Linux 6.14+ with `enable_uring=Y`): the kernel places each
//!   request in a ring entry of the queue of the CPU that made it; one command commits
//!   the reply and fetches the next request.
//!
//! [`TransportChoice`] is what the mount asked for (`-o transport=`); [`Transport`] is
//! what the session ended up with.

use std::fmt;
use std::str::FromStr;

/// Which transport the mount asks for (`-o transport=dev|uring|auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// `/dev/fuse` only.
    Dev,
    /// FUSE over io_uring, or the mount fails with the reason.
    Uring,
    /// io_uring where the kernel allows it (`enable_uring=Y`, the ring sets up and
    /// `FUSE_OVER_IO_URING` is negotiated); `/dev/fuse` otherwise, with the reason logged
    /// and given by [`crate::Mounted::transport_note`]. The default (decision 142).
    #[default]
    Auto,
}

impl FromStr for TransportChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dev" => Ok(Self::Dev),
            "uring" => Ok(Self::Uring),
            "auto" => Ok(Self::Auto),
            _ => Err(format!("transport must be dev, uring or auto, not {s:?}")),
        }
    }
}

impl fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Dev => "dev",
            Self::Uring => "uring",
            Self::Auto => "auto",
        })
    }
}

/// The transport a mounted session serves requests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `/dev/fuse` reads and writes.
    Dev,
    /// FUSE over io_uring: one queue per possible CPU, `entries` ring entries each
    /// (`/dev/fuse` still carries `FORGET` and `INTERRUPT`).
    Uring {
        /// Queues, one per possible CPU.
        queues: usize,
        /// Ring entries (requests in flight) per queue.
        entries: usize,
    },
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dev => f.write_str("/dev/fuse"),
            Self::Uring { queues, entries } => {
                write!(f, "io_uring ({queues} queues x {entries} entries)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_print() {
        for c in [
            TransportChoice::Dev,
            TransportChoice::Uring,
            TransportChoice::Auto,
        ] {
            assert_eq!(c.to_string().parse::<TransportChoice>(), Ok(c));
        }
        assert!("io_uring".parse::<TransportChoice>().is_err());
        assert_eq!(
            Transport::Uring {
                queues: 2,
                entries: 64
            }
            .to_string(),
            "io_uring (2 queues x 64 entries)"
        );
    }
}

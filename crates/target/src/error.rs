//! Typed target errors: which target, which operation, where, and what went wrong.

use std::fmt;
use std::sync::Arc;

/// The kind of operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
    Open,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Discard => "discard",
            OpKind::Open => "open",
        })
    }
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetErrorKind {
    /// The OS (or an injected fault) returned this errno.
    Os(i32),
    /// Out of space on the device (ENOSPC).
    NoSpace,
    /// Offset or length is not a multiple of the logical sector size.
    Misaligned { sector: u32 },
    /// The operation runs past the end of the target.
    OutOfRange { size: u64 },
    /// The device transferred fewer bytes than asked.
    Short { done: u64, want: u64 },
    /// The target cannot be used (wrong type, bad geometry).
    Unusable(String),
    /// A network target's server could not be reached, or the connection was lost with
    /// the operation unanswered (maps to `EIO`).
    Disconnected(String),
    /// A network target's server did not answer within the timeout (maps to `EIO`).
    TimedOut { after_ms: u64 },
    /// Another open of the target holds its exclusive lock (maps to `EBUSY`); `holder`
    /// says who (see `lock.rs`).
    InUse { holder: String },
}

impl fmt::Display for TargetErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetErrorKind::Os(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
            TargetErrorKind::NoSpace => f.write_str("no space left on device"),
            TargetErrorKind::Misaligned { sector } => {
                write!(f, "not aligned to the {sector}-byte logical sector")
            }
            TargetErrorKind::OutOfRange { size } => {
                write!(f, "beyond the end of the target ({size} bytes)")
            }
            TargetErrorKind::Short { done, want } => {
                write!(f, "short transfer: {done} of {want} bytes")
            }
            TargetErrorKind::Unusable(why) => f.write_str(why),
            TargetErrorKind::Disconnected(why) => write!(f, "server connection: {why}"),
            TargetErrorKind::TimedOut { after_ms } => {
                write!(f, "no reply from the server within {after_ms} ms")
            }
            TargetErrorKind::InUse { holder } => write!(f, "in use by {holder}"),
        }
    }
}

/// A failed target operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("target {target}: {op} at byte {offset}: {kind}")]
pub struct TargetError {
    pub target: Arc<str>,
    pub op: OpKind,
    pub offset: u64,
    pub kind: TargetErrorKind,
}

impl TargetError {
    /// Builds an error.
    #[must_use]
    pub fn new(target: Arc<str>, op: OpKind, offset: u64, kind: TargetErrorKind) -> Self {
        Self {
            target,
            op,
            offset,
            kind,
        }
    }

    /// The errno this error maps to.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self.kind {
            TargetErrorKind::Os(e) => e,
            TargetErrorKind::NoSpace => libc::ENOSPC,
            TargetErrorKind::Misaligned { .. } => libc::EINVAL,
            TargetErrorKind::OutOfRange { .. } => libc::EINVAL,
            TargetErrorKind::Short { .. } => libc::EIO,
            TargetErrorKind::Unusable(_) => libc::EINVAL,
            TargetErrorKind::Disconnected(_) | TargetErrorKind::TimedOut { .. } => libc::EIO,
            TargetErrorKind::InUse { .. } => libc::EBUSY,
        }
    }

    /// Classifies an errno from the OS.
    #[must_use]
    pub fn from_errno(target: Arc<str>, op: OpKind, offset: u64, errno: i32) -> Self {
        let kind = if errno == libc::ENOSPC {
            TargetErrorKind::NoSpace
        } else {
            TargetErrorKind::Os(errno)
        };
        Self::new(target, op, offset, kind)
    }
}

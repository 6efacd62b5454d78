//! File-system errors. Each variant maps to exactly one errno ([`FsError::errno`]), except
//! [`FsError::Io`], which carries the errno the device reported.

use stripefs_core::CoreError;
use stripefs_target::TargetError;

/// An error from a file-system operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("file name too long (the limit is 255 bytes)")]
    NameTooLong,
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("file too large")]
    FileTooBig,
    #[error("too many links")]
    TooManyLinks,
    #[error("no such extended attribute")]
    NoData,
    #[error("result does not fit the buffer")]
    Range,
    #[error("extended attribute too large")]
    TooBig,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("operation not supported: {0}")]
    NotSupported(String),
    #[error("stale file handle: inode {0} no longer exists")]
    Stale(u64),
    #[error("I/O error: {0}")]
    Io(#[from] TargetError),
    #[error("{0}")]
    Corrupted(#[from] CoreError),
    #[error("file system is shut down after an earlier failure ({0}); unmount and mount again")]
    Poisoned(String),
    #[error("file system is read-only")]
    ReadOnly,
    #[error("permission denied: {0}")]
    AccessDenied(String),
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("no data or hole at or after that offset")]
    NoSuchOffset,
    #[error("writeback of this file failed ({}); data written before it may be lost", std::io::Error::from_raw_os_error(*.0))]
    WritebackFailed(i32),
}

impl FsError {
    /// The errno this error reports.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::FileTooBig => libc::EFBIG,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::NoData => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::TooBig => libc::E2BIG,
            FsError::Loop => libc::ELOOP,
            FsError::NotSupported(_) => libc::EOPNOTSUPP,
            FsError::Stale(_) => libc::ESTALE,
            FsError::Io(e) => e.errno(),
            FsError::Corrupted(_) => libc::EUCLEAN,
            FsError::Poisoned(_) => libc::EIO,
            FsError::ReadOnly => libc::EROFS,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::AccessDenied(_) => libc::EACCES,
            FsError::NoSuchOffset => libc::ENXIO,
            FsError::WritebackFailed(e) => *e,
        }
    }

    /// Builds an `Invalid` error.
    pub fn invalid(why: impl Into<String>) -> Self {
        FsError::Invalid(why.into())
    }
}

/// A walk of a file's mappings that stopped: the file system's own error, or a broken
/// mapping contract reported as corruption (never trusted). The bytes processed before the
/// error are dropped: a caller that needs them matches the [`stripefs_iomap::IterError`].
impl From<stripefs_meta::MetaError> for FsError {
    fn from(e: stripefs_meta::MetaError) -> Self {
        use stripefs_meta::MetaError;
        match e {
            MetaError::Corrupted(c) => FsError::Corrupted(c),
            MetaError::Target(t) => FsError::Io(t),
            MetaError::NoSpace(why) => FsError::NoSpace(format!("metadata pages: {why}")),
            MetaError::Poisoned => {
                FsError::Poisoned("metadata store poisoned by an earlier failed checkpoint".into())
            }
            e @ MetaError::TargetNotGiven { .. } => FsError::invalid(e.to_string()),
        }
    }
}

impl From<stripefs_iomap::IterError<FsError>> for FsError {
    fn from(e: stripefs_iomap::IterError<FsError>) -> Self {
        e.into_parts(|m| CoreError::corrupted("mapping contract", m).into())
            .1
    }
}

impl From<FsError> for std::io::Error {
    fn from(e: FsError) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno()).kind(), e)
    }
}

/// Result alias for this crate.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

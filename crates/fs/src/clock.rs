//! The wall clock: the one place the runtime reads it for inode times and superblock and
//! journal stamps (`stripefs-core` reads no clock; times are passed in).

use stripefs_core::inode::Timespec;

/// The current wall-clock time.
#[must_use]
pub fn time_now() -> Timespec {
    Timespec::from(std::time::SystemTime::now())
}

//! stripefs core: the format and the algorithms, shared by the runtime, `mkfs` and `fsck`.
//!
//! Architecture Invariant: this crate performs no OS I/O and spawns no threads. It turns
//! bytes into verified structures and back, and mutates the in-memory metadata model only
//! through [`meta::MetaState::apply`], the single path used both by the running file system
//! and by journal replay, so that replay cannot drift from what the runtime did.

pub mod alloc;
pub mod btree;
pub mod check;
pub mod codec;
pub mod csum;
pub mod error;
pub mod extent;
pub mod geometry;
pub mod idhash;
pub mod inode;
pub mod journal;
pub mod layout;
pub mod meta;
pub mod record;
pub mod refcount;
pub mod superblock;
pub mod units;

pub use error::CoreError;
pub use units::{BlockSize, Ino, PhysBlock, TargetId, Uuid};

/// crc32c (Castagnoli) of `data`: the checksum of every metadata structure.
#[must_use]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

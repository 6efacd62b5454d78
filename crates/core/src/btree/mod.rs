//! Paged, copy-on-write B+trees for the metadata (format version 2): the pure part.
//!
//! - [`key`]: the ordered keyspace (25-byte big-endian keys, kinds, trees, name hash);
//! - [`leaf`]: a leaf's items in memory, keys and values each in one buffer;
//! - [`page`]: self-describing pages, encoded and verified on every read;
//! - [`pagelog`]: a generation's log of the pages it allocated and freed;
//! - [`root`]: the root record, the commit point of a checkpoint (two slots);
//! - [`schema`]: keys and values of the keyspace's kinds (directory entries, extents,
//!   free space, symlink and xattr chunks);
//! - [`tree`]: the copy-on-write B+tree over an abstract page source, and the
//!   generation bookkeeping of incremental checkpoints (freeze, plan, publish).
//!
//! Design, crash argument and failure cases: `docs/design/metadata.md`. Nothing here
//! reads a device: the runtime (`stripefs-meta`) reads and writes pages through the
//! `Target` trait and hands the bytes to [`page::decode`].

pub mod key;
pub mod leaf;
pub mod page;
pub mod pagelog;
pub mod root;
pub mod schema;
pub mod tree;

pub use key::{name_hash, Key, KeyKind, TreeId, KEY_BYTES, VALUE_MAX};
pub use leaf::LeafItems;
pub use page::{
    Expect, Generation, Page, PageAddr, PageBody, PageCheck, PageError, PageRef, PageSize,
};

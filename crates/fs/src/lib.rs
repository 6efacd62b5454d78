//! stripefs: a file system striped over several targets, as a library.
//!
//! ```no_run
//! use std::sync::Arc;
//! use stripefs::{CreateParams, Fs, MkfsOptions, MountOptions, Ino};
//! use stripefs_target::{SimTarget, Target};
//!
//! let targets: Vec<Arc<dyn Target>> =
//!     (0..3).map(|i| Arc::new(SimTarget::new(&format!("t{i}"), 64 << 20, 512)) as Arc<dyn Target>).collect();
//! Fs::mkfs(&targets, &MkfsOptions::default())?;
//! let (fs, _) = Fs::mount(targets, MountOptions::default())?;
//! let f = fs.create(Ino::ROOT, "hello".as_ref(), CreateParams::with_perm(0o644))?;
//! fs.write_at(f.ino, 0, b"striped")?;
//! fs.fsync(f.ino, stripefs::SyncScope::All)?;
//! fs.unmount()?;
//! # Ok::<(), stripefs::FsError>(())
//! ```
//!
//! Layers (see ARCHITECTURE.md): `stripefs-target` does all I/O, `stripefs-core` owns the
//! format and algorithms, `stripefs-iomap` the mapping contract; this crate ties them into a
//! mounted file system: recovery, journal commit, namespace, and the file I/O paths.

mod acl;
mod atime;
mod buffered;
mod clock;
mod csum;
mod delalloc;
mod direct;
mod dirty;
mod error;
mod evacuate;
pub mod faults;
mod file;
mod fileflags;
mod fs;
pub mod fsck;
mod icache;
mod inner;
mod io;
mod journal;
mod mapping;
mod metapages;
mod metaview;
mod namespace;
mod nocow;
mod options;
mod path;
mod placement;
mod queue;
mod recovery;
mod refcount;
mod reflink;
mod replay;
mod runmap;
mod scrub;
mod targets;
mod types;
mod wbgroup;

pub use atime::{AtimePolicy, AtimeUpdate, AtimeWrite, DirAtime};
pub use buffered::Whence;
pub use clock::time_now;
pub use error::{FsError, Result};
pub use evacuate::{EvacuateProgress, EvacuateReport, EvacuateStep};
pub use file::File;
pub use fileflags::FileFlags;
pub use fs::{Fs, MountReport};
pub use io::{MappedRange, MAX_FILE_BYTES};
pub use journal::JournalPosition;
pub use namespace::{setid_dropped, XattrMode, LINK_MAX};
pub use nocow::InPlace;
#[cfg(debug_assertions)]
pub use nocow::NocowHook;
pub use options::{
    Checkpoints, DataCow, DioSubmit, InodeBound, MetaCacheBytes, MkfsOptions, MountOptions,
    NocowCheck, UnalignedPolicy,
};
pub use path::Follow;
pub use queue::{DioCompletion, DioQueue};
pub use scrub::{ScrubCursor, ScrubMismatch, ScrubReadError, ScrubStep};
pub use stripefs_core::inode::{FileKind, Timespec};
pub use stripefs_core::layout::StripeLayout;
pub use stripefs_core::Ino;
pub use stripefs_core::TargetId;
/// The page-cache options `MountOptions` takes (the generic I/O layer's types), so a
/// library user needs no other crate to set them.
pub use stripefs_iomap::cache::{
    CacheConfig, DirtyThrottle, FolioSizing, ReadCopy, ReadaheadMode, WbCopy, WbDepth,
};
pub use stripefs_iomap::folio::DirtyTracking;
pub use stripefs_iomap::ZeroMode;
pub use types::{
    Access, AccessSource, Attr, CreateParams, DirCookie, DirEntryInfo, FallocMode, Fh, FsStatus,
    OpenMode, RenameMode, SetAttr, SgidDrop, SpaceAccount, StatFs, SyncScope, TargetStatus,
    TimeSet, WriteOrigin,
};
pub use wbgroup::WbBatch;

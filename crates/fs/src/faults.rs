//! The file system's fault points. The target crate's injector counts and fires them
//! ([`FaultPoint::Runtime`]) without knowing what they are; their meaning lives here.

use stripefs_target::FaultPoint;

/// Writing a journal record.
pub const JOURNAL_WRITE: FaultPoint = FaultPoint::Runtime("journal-write");
/// A journal record becoming durable: the completion of its FUA write.
pub const JOURNAL_FLUSH: FaultPoint = FaultPoint::Runtime("journal-flush");
/// Writing a checkpoint.
pub const CHECKPOINT_WRITE: FaultPoint = FaultPoint::Runtime("checkpoint-write");
/// Allocating data blocks: whatever the armed kind, it means "this target is full"
/// (`NoSpace`).
pub const ALLOC: FaultPoint = FaultPoint::Runtime("alloc");

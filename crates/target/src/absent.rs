//! `AbsentTarget`: the place of an index in a list of targets that was given no device
//! (what the index means, and why none is needed, is the user's: stripefs uses it for
//! retired members).
//!
//! It holds nothing, so a flush has nothing to make durable and succeeds; every read,
//! write or discard fails with `Unusable`, naming the index, so that a structure that
//! wrongly still points there is reported, never answered with made-up bytes.

use std::sync::Arc;

use crate::{fail_now, Completion, FuaSupport, IoDone, IoOp, TargetError, TargetErrorKind};
use crate::{Target, TargetInfo};

/// A target index with no device behind it.
#[derive(Debug)]
pub struct AbsentTarget {
    info: TargetInfo,
}

impl AbsentTarget {
    /// The place of target `index`, of `sector_size` like its file system's others.
    #[must_use]
    pub fn new(index: u32, sector_size: u32) -> Self {
        Self {
            info: TargetInfo {
                name: Arc::from(format!("index {index}{NOT_GIVEN}")),
                size_bytes: 0,
                sector_size,
                fua: FuaSupport::Native,
            },
        }
    }
}

/// Ends the name of every `AbsentTarget`.
const NOT_GIVEN: &str = " (not given)";

impl AbsentTarget {
    /// Whether `e` is an `AbsentTarget`'s refusal (an operation reached an index that was
    /// given no device).
    #[must_use]
    pub fn failed(e: &TargetError) -> bool {
        matches!(e.kind, TargetErrorKind::Unusable(_)) && e.target.ends_with(NOT_GIVEN)
    }
}

impl Target for AbsentTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn submit(&self, op: IoOp, done: Completion) {
        if let IoOp::Flush = op {
            return done(IoDone {
                bufs: Vec::new(),
                result: Ok(()),
            });
        }
        let why = "no device was given for this index: nothing is stored there";
        let err = TargetError::new(
            Arc::clone(&self.info.name),
            op.kind(),
            op.offset(),
            TargetErrorKind::Unusable(why.into()),
        );
        fail_now(op, done, err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;

    #[test]
    fn flushes_succeed_and_everything_else_fails_by_name() {
        let t = AbsentTarget::new(3, 512);
        t.flush_sync().unwrap();
        let err = t.read_sync(0, 512).unwrap_err();
        assert!(AbsentTarget::failed(&err));
        let e = err.to_string();
        assert!(e.contains("index 3 (not given)"), "{e}");
        assert!(t.write_sync(4096, IoBuf::zeroed(512)).is_err());
    }
}

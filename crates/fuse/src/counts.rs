//! How many requests of each kind the kernel sent: what a workload costs in round trips
//! (`Mounted::request_counts`). Creating and writing a small file measured 7 requests
//! before `FOPEN_NOFLUSH` (`docs/design/fuse.md`); the mount tests hold the count down.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The requests counted: those of the file paths (create, open, write, close) and the
/// name and attribute look-ups around them. Others are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Setattr,
    Create,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Getxattr,
}

impl Op {
    /// Every counted kind, in the order of [`RequestCounts::get`]'s index.
    pub const ALL: [Op; 11] = [
        Op::Lookup,
        Op::Getattr,
        Op::Setattr,
        Op::Create,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Getxattr,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The FUSE opcode's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "LOOKUP",
            Op::Getattr => "GETATTR",
            Op::Setattr => "SETATTR",
            Op::Create => "CREATE",
            Op::Open => "OPEN",
            Op::Read => "READ",
            Op::Write => "WRITE",
            Op::Flush => "FLUSH",
            Op::Release => "RELEASE",
            Op::Fsync => "FSYNC",
            Op::Getxattr => "GETXATTR",
        }
    }
}

/// Counters the workers bump as requests arrive (relaxed: a count, not a barrier).
#[derive(Debug, Default)]
pub struct RequestCounts {
    n: [AtomicU64; Op::ALL.len()],
}

impl RequestCounts {
    pub(crate) fn add(&self, op: Op) {
        self.n[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The requests of kind `op` so far.
    #[must_use]
    pub fn get(&self, op: Op) -> u64 {
        self.n[op.index()].load(Ordering::Relaxed)
    }

    /// Every counted request so far.
    #[must_use]
    pub fn total(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.get(op)).sum()
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for op in Op::ALL {
            let n = self.get(op);
            if n != 0 {
                write!(f, "{}{}={n}", if first { "" } else { " " }, op.name())?;
                first = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_kind_apart() {
        let c = RequestCounts::default();
        c.add(Op::Create);
        c.add(Op::Write);
        c.add(Op::Write);
        assert_eq!(c.get(Op::Write), 2);
        assert_eq!(c.get(Op::Flush), 0);
        assert_eq!(c.total(), 3);
        assert_eq!(c.to_string(), "CREATE=1 WRITE=2");
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
    }
}

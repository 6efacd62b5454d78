//! Device-operation counters: how many reads, writes, FUA writes, flushes and discards a
//! target issued. Tests and benchmarks read them to show what an `fsync` costs.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::IoOp;

/// A snapshot of a target's operation counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub reads: u64,
    /// Plain writes (including the write half of an emulated FUA write).
    pub writes: u64,
    /// Writes issued with forced unit access (durable at completion).
    pub fua_writes: u64,
    /// Cache flushes (including the flush half of an emulated FUA write).
    pub flushes: u64,
    pub discards: u64,
}

impl OpCounts {
    /// Operations that change the device: writes of both kinds, flushes and discards.
    #[must_use]
    pub fn mutating(&self) -> u64 {
        self.writes + self.fua_writes + self.flushes + self.discards
    }
}

impl std::ops::Sub for OpCounts {
    type Output = OpCounts;

    /// The operations issued between two snapshots (`later - earlier`).
    fn sub(self, earlier: OpCounts) -> OpCounts {
        OpCounts {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            fua_writes: self.fua_writes - earlier.fua_writes,
            flushes: self.flushes - earlier.flushes,
            discards: self.discards - earlier.discards,
        }
    }
}

impl std::ops::Add for OpCounts {
    type Output = OpCounts;

    fn add(self, o: OpCounts) -> OpCounts {
        OpCounts {
            reads: self.reads + o.reads,
            writes: self.writes + o.writes,
            fua_writes: self.fua_writes + o.fua_writes,
            flushes: self.flushes + o.flushes,
            discards: self.discards + o.discards,
        }
    }
}

/// Live counters a backend bumps once per operation it issues.
#[derive(Debug, Default)]
pub struct OpCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
}

impl OpCounters {
    /// Counts `op` as one device operation of its kind.
    pub fn note(&self, op: &IoOp) {
        let c = match op {
            IoOp::Read { .. } => &self.reads,
            IoOp::Write { .. } => &self.writes,
            IoOp::WriteFua { .. } => &self.fua_writes,
            IoOp::Flush => &self.flushes,
            IoOp::Discard { .. } => &self.discards,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    #[must_use]
    pub fn snapshot(&self) -> OpCounts {
        OpCounts {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            fua_writes: self.fua_writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            discards: self.discards.load(Ordering::Relaxed),
        }
    }
}

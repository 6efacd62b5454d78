//! Runs of physical blocks that records changed and the trees do not hold yet: the one
//! structure under the reference-count overlay (`refcount.rs`) and the checksum overlay
//! (`csum.rs`).
//!
//! A [`RunMap`] keeps non-overlapping runs `[start, end)` per target, each with the value
//! the last record covering it gave it and that record's transaction. A new run cuts the
//! runs it overlaps (their pieces outside it keep their value, sliced by
//! [`RunValue::slice`]). [`RunMap::drop_applied`] forgets the runs of transactions the
//! trees hold, walking the changes in log order, so its cost follows what it drops and is
//! constant when there is nothing to drop. Its size follows the records not yet applied
//! (each adds one run and cuts at most one other in two), never the index.
//!
//! Locking is the caller's: each overlay keeps its map under its own lock.

use std::collections::{BTreeMap, VecDeque};

use stripefs_core::TargetId;

/// What a run carries, and how a piece of it is carried on when the run is cut.
pub(crate) trait RunValue: Clone {
    /// The value of blocks `[from, to)` of the run, counted from the run's first block.
    fn slice(&self, from: u64, to: u64) -> Self;
}

/// One run: its end (exclusive), the transaction that set it, and its value.
#[derive(Debug, Clone)]
pub(crate) struct Run<V> {
    pub end: u64,
    pub seq: u64,
    pub value: V,
}

/// Non-overlapping runs by (target, first block), and every change in log order.
#[derive(Debug)]
pub(crate) struct RunMap<V> {
    runs: BTreeMap<(TargetId, u64), Run<V>>,
    /// `(seq, target, start, end)` of every run set, in log order.
    order: VecDeque<(u64, TargetId, u64, u64)>,
}

impl<V> Default for RunMap<V> {
    fn default() -> Self {
        Self {
            runs: BTreeMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<V: RunValue> RunMap<V> {
    /// The key of the first run of `t` that may overlap a range starting at `start`.
    fn first_from(&self, t: TargetId, start: u64) -> u64 {
        match self.runs.range(..=(t, start)).next_back() {
            Some((&(rt, s), r)) if rt == t && r.end > start => s,
            _ => start,
        }
    }

    /// Cuts the runs overlapping `[start, end)` of `t` away from that range.
    fn cut(&mut self, t: TargetId, start: u64, end: u64) {
        let first = self.first_from(t, start);
        let keys: Vec<u64> = self
            .runs
            .range((t, first)..(t, end))
            .map(|(&(_, s), _)| s)
            .collect();
        for s in keys {
            let r = self.runs.remove(&(t, s)).expect("listed");
            if s < start {
                let value = r.value.slice(0, start - s);
                self.runs.insert(
                    (t, s),
                    Run {
                        end: start,
                        value,
                        ..r
                    },
                );
            }
            if r.end > end {
                let value = r.value.slice(end - s, r.end - s);
                self.runs.insert((t, end), Run { value, ..r });
            }
        }
    }

    /// Gives `[start, end)` of `t` the value `value`, set by transaction `seq`. An empty
    /// range changes nothing (as a run it would replace the run keyed at `start`).
    pub fn set(&mut self, t: TargetId, start: u64, end: u64, value: V, seq: u64) {
        if start >= end {
            return;
        }
        self.cut(t, start, end);
        self.runs.insert((t, start), Run { end, seq, value });
        self.order.push_back((seq, t, start, end));
    }

    /// Drops the runs of transactions at or below `applied` (the trees hold them).
    pub fn drop_applied(&mut self, applied: u64) {
        while let Some(&(seq, t, start, end)) = self.order.front() {
            if seq > applied {
                return;
            }
            self.order.pop_front();
            let first = self.first_from(t, start);
            let gone: Vec<u64> = self
                .runs
                .range((t, first)..(t, end))
                .filter(|(_, r)| r.seq <= applied)
                .map(|(&(_, s), _)| s)
                .collect();
            for s in gone {
                self.runs.remove(&(t, s));
            }
        }
    }

    /// The runs of `t` overlapping `[start, end)`, each with its first block, in order
    /// (not cut to the range).
    pub fn overlapping(
        &self,
        t: TargetId,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, &Run<V>)> {
        let first = self.first_from(t, start);
        self.runs
            .range((t, first)..(t, end))
            .map(|(&(_, s), r)| (s, r))
            .filter(move |(_, r)| r.end > start)
    }

    /// Every run: `(target, first block, run)`.
    pub fn iter(&self) -> impl Iterator<Item = (TargetId, u64, &Run<V>)> {
        self.runs.iter().map(|(&(t, s), r)| (t, s, r))
    }

    /// Runs held.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// True when no run is held (and so no change is waiting to be dropped).
    pub fn is_empty(&self) -> bool {
        // A change not yet dropped has its run, or a later change's run over it.
        debug_assert!(!self.runs.is_empty() || self.order.is_empty());
        self.runs.is_empty()
    }

    /// Changes not yet dropped (tests).
    #[cfg(test)]
    pub fn pending_changes(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: TargetId = TargetId(0);
    const U: TargetId = TargetId(1);

    /// A value that is one number per block: slicing must carry each block's own.
    #[derive(Debug, Clone, PartialEq)]
    struct PerBlock(Vec<u32>);

    impl RunValue for PerBlock {
        fn slice(&self, from: u64, to: u64) -> Self {
            PerBlock(self.0[from as usize..to as usize].to_vec())
        }
    }

    fn blocks(m: &RunMap<PerBlock>, t: TargetId, start: u64, end: u64) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        for (s, r) in m.overlapping(t, start, end) {
            for b in s.max(start)..r.end.min(end) {
                out.push((b, r.value.0[(b - s) as usize]));
            }
        }
        out
    }

    #[test]
    fn a_run_cuts_the_runs_it_overlaps_and_their_pieces_keep_their_blocks() {
        let mut m = RunMap::default();
        m.set(T, 0, 6, PerBlock((0..6).collect()), 1);
        m.set(T, 2, 4, PerBlock(vec![20, 30]), 2);
        m.set(U, 0, 6, PerBlock(vec![9; 6]), 2);
        assert_eq!(
            blocks(&m, T, 0, 6),
            vec![(0, 0), (1, 1), (2, 20), (3, 30), (4, 4), (5, 5)]
        );
        assert_eq!(
            m.len(),
            4,
            "two pieces of the first run, the second, target 1's"
        );
        assert_eq!(blocks(&m, T, 3, 5), vec![(3, 30), (4, 4)], "a window");
        assert_eq!(blocks(&m, U, 5, 9), vec![(5, 9)], "targets apart");
    }

    #[test]
    fn an_empty_range_changes_nothing() {
        let mut m = RunMap::default();
        m.set(T, 0, 6, PerBlock((0..6).collect()), 1);
        m.set(T, 2, 2, PerBlock(vec![]), 2);
        m.set(T, 0, 0, PerBlock(vec![]), 2);
        assert_eq!(
            blocks(&m, T, 0, 6),
            (0..6).map(|b| (b, b as u32)).collect::<Vec<_>>()
        );
        assert_eq!((m.len(), m.pending_changes()), (1, 1));
    }

    #[test]
    fn dropping_a_transaction_keeps_the_runs_later_ones_set() {
        let mut m = RunMap::default();
        m.set(T, 0, 10, PerBlock(vec![1; 10]), 5);
        m.set(T, 4, 6, PerBlock(vec![2; 2]), 6);
        m.drop_applied(4);
        assert_eq!(m.len(), 3, "nothing applied yet");
        m.drop_applied(5);
        assert_eq!(blocks(&m, T, 0, 10), vec![(4, 2), (5, 2)]);
        assert_eq!(m.pending_changes(), 1);
        m.drop_applied(6);
        assert!(m.is_empty());
        assert_eq!(m.pending_changes(), 0);
    }
}

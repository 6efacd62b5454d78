//! Which data targets hold completed writes that no completed flush covers yet.
//!
//! Each target has two generations: `marked` counts completed data writes (bumped when a
//! write completes, before any record that makes it visible is logged), `flushed` is the
//! highest `marked` value a *completed* flush covered. A target needs a flush exactly
//! when `marked > flushed`. Because `flushed` advances only when a flush has completed, a
//! commit never skips a target whose flush another thread has merely issued: the journal
//! record that references the data cannot become durable before the data (ordered data).

use std::sync::atomic::{AtomicU64, Ordering};

use stripefs_target::{Batch, IoOp, TargetError, TargetSet};

/// Per-target write and flush generations (see the module documentation).
#[derive(Debug)]
pub(crate) struct DirtyTargets {
    marked: Vec<AtomicU64>,
    flushed: Vec<AtomicU64>,
}

impl DirtyTargets {
    pub fn new(targets: usize) -> Self {
        Self {
            marked: (0..targets).map(|_| AtomicU64::new(0)).collect(),
            flushed: (0..targets).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Records a completed write on `target`.
    pub fn mark(&self, target: usize) {
        self.marked[target].fetch_add(1, Ordering::AcqRel);
    }

    /// Flushes, all at once, every target with writes completed before this call and not
    /// covered by a completed flush; nothing when there are none.
    ///
    /// # Errors
    /// The first flush error (the caller decides whether it poisons).
    pub fn flush(&self, targets: &TargetSet) -> Result<(), TargetError> {
        // Read before the flush is submitted: the flush covers every write counted.
        let due: Vec<(usize, u64)> = (0..targets.len())
            .map(|i| (i, self.marked[i].load(Ordering::Acquire)))
            .filter(|&(i, upto)| upto > self.flushed[i].load(Ordering::Acquire))
            .collect();
        if let [(i, upto)] = due[..] {
            // One flush, waited for here: the target may run it on this thread.
            targets[i].flush_sync()?;
            self.flushed[i].fetch_max(upto, Ordering::AcqRel);
            return Ok(());
        }
        let batch = Batch::new();
        let mut issued = Vec::new();
        for (i, upto) in due {
            batch.submit(targets[i].as_ref(), IoOp::Flush);
            issued.push((i, upto));
        }
        let mut first = None;
        for ((i, upto), d) in issued.into_iter().zip(batch.wait()) {
            match d.result {
                Ok(()) => {
                    self.flushed[i].fetch_max(upto, Ordering::AcqRel);
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use stripefs_target::{SimTarget, Target};

    #[test]
    fn only_marked_targets_are_flushed_once() {
        let sims: Vec<Arc<SimTarget>> = (0..3)
            .map(|i| Arc::new(SimTarget::new(&format!("s{i}"), 4096, 512)))
            .collect();
        let targets = TargetSet::new(
            3,
            sims.iter()
                .map(|s| Arc::clone(s) as Arc<dyn Target>)
                .collect(),
        )
        .unwrap();
        let d = DirtyTargets::new(3);
        d.mark(1);
        d.mark(1);
        d.flush(&targets).unwrap();
        d.flush(&targets).unwrap();
        let flushes: Vec<u64> = sims.iter().map(|s| s.stats().flushes).collect();
        assert_eq!(flushes, vec![0, 1, 0]);
    }

    /// A target whose flushes complete only when the test releases them.
    struct HeldFlushes {
        info: stripefs_target::TargetInfo,
        held: parking_lot::Mutex<Vec<stripefs_target::Completion>>,
    }

    impl std::fmt::Debug for HeldFlushes {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("HeldFlushes")
        }
    }

    impl Target for HeldFlushes {
        fn info(&self) -> &stripefs_target::TargetInfo {
            &self.info
        }

        fn submit(&self, op: IoOp, done: stripefs_target::Completion) {
            assert!(matches!(op, IoOp::Flush), "only flushes expected");
            self.held.lock().push(done);
        }
    }

    fn wait_for(t: &HeldFlushes, n: usize) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while t.held.lock().len() < n {
            if std::time::Instant::now() > until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// A commit that finds another thread's flush of a target merely *issued* must not
    /// count the target clean: its journal record could become durable before the data.
    #[test]
    fn a_flush_in_flight_elsewhere_does_not_make_a_target_clean() {
        let t = Arc::new(HeldFlushes {
            info: SimTarget::new("h", 4096, 512).info().clone(),
            held: parking_lot::Mutex::new(Vec::new()),
        });
        let targets = Arc::new(TargetSet::new(1, vec![Arc::clone(&t) as Arc<dyn Target>]).unwrap());
        let d = Arc::new(DirtyTargets::new(1));
        d.mark(0);
        let first = {
            let (d, targets) = (Arc::clone(&d), targets.clone());
            std::thread::spawn(move || d.flush(&targets))
        };
        assert!(wait_for(&t, 1), "the first flush is issued");
        let second = {
            let (d, targets) = (Arc::clone(&d), targets.clone());
            std::thread::spawn(move || d.flush(&targets))
        };
        let issued_again = wait_for(&t, 2);
        for done in std::mem::take(&mut *t.held.lock()) {
            done(stripefs_target::IoDone {
                bufs: Vec::new(),
                result: Ok(()),
            });
        }
        assert!(
            issued_again,
            "the second caller returned without a flush while the first was in flight"
        );
        first.join().unwrap().unwrap();
        second.join().unwrap().unwrap();
    }
}

//! `Batch`: one completion anchor for many operations ("submit everything, wait once").
//!
//! The anchor starts with a submission bias of one so that completions racing with the
//! submission loop can never see the count reach zero early; [`Batch::wait`] drops the bias
//! and sleeps until every operation has completed (I-003-1: a synchronous caller returns
//! only after every sub-I/O it issued has completed).

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::{IoDone, IoOp, Target};

/// A set of in-flight operations with a single wait.
#[derive(Debug, Default)]
pub struct Batch {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    all_done: Condvar,
}

#[derive(Debug)]
struct State {
    /// Operations not yet completed, plus one for the submission bias until `wait`.
    pending: usize,
    /// Completion per submission slot, in submission order.
    results: Vec<Option<IoDone>>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            pending: 1,
            results: Vec::new(),
        }
    }
}

impl Batch {
    /// An empty batch holding its submission bias.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Submits `op` to `target`; returns the slot its completion will occupy in `wait`'s
    /// result.
    pub fn submit<T: Target + ?Sized>(&self, target: &T, op: IoOp) -> usize {
        let slot = {
            let mut st = self.inner.state.lock();
            st.pending += 1;
            st.results.push(None);
            st.results.len() - 1
        };
        let inner = Arc::clone(&self.inner);
        target.submit(
            op,
            Box::new(move |done| {
                let mut st = inner.state.lock();
                st.results[slot] = Some(done);
                st.pending -= 1;
                if st.pending == 0 {
                    inner.all_done.notify_all();
                }
            }),
        );
        slot
    }

    /// Operations submitted and not yet completed.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.inner.state.lock().pending - 1
    }

    /// Number of operations submitted so far.
    #[must_use]
    pub fn submitted(&self) -> usize {
        self.inner.state.lock().results.len()
    }

    /// Drops the submission bias and waits once for every operation; returns the
    /// completions in submission order.
    #[must_use]
    pub fn wait(self) -> Vec<IoDone> {
        let mut st = self.inner.state.lock();
        st.pending -= 1;
        while st.pending != 0 {
            self.inner.all_done.wait(&mut st);
        }
        std::mem::take(&mut st.results)
            .into_iter()
            .map(|r| r.expect("every submitted operation completed exactly once"))
            .collect()
    }
}

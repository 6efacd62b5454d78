//! `Batch`: one completion anchor for many operations ("submit everything, wait once").
//!
//! The anchor starts with a submission bias of one so that completions racing with the
//! submission loop can never see the count reach zero early; [`Batch::wait`] drops the bias
//! and sleeps until every operation has completed (I-003-1: a synchronous caller returns
//! only after every sub-I/O it issued has completed).

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::{IoDone, IoOp, Target};

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("state", &*self.state.lock())
            .finish()
    }
}

/// A set of in-flight operations with a single wait.
#[derive(Debug, Default)]
pub struct Batch {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    all_done: Condvar,
}

struct State {
    /// Operations not yet completed, plus one for the submission bias until `wait`.
    pending: usize,
    /// Completion per submission slot, in submission order.
    results: Vec<Option<IoDone>>,
    /// Runs (on the last completion's thread) once everything completed, instead of a
    /// waiter: set by [`Batch::finish_with`].
    on_done: Option<Box<dyn FnOnce(Vec<IoDone>) + Send>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl Default for State {
    fn default() -> Self {
        Self {
            pending: 1,
            results: Vec::new(),
            on_done: None,
        }
    }
}

fn take_results(st: &mut State) -> Vec<IoDone> {
    std::mem::take(&mut st.results)
        .into_iter()
        .map(|r| r.expect("every submitted operation completed exactly once"))
        .collect()
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
                    if let Some(f) = st.on_done.take() {
                        let results = take_results(&mut st);
                        drop(st);
                        f(results);
                        return;
                    }
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
        take_results(&mut st)
    }

    /// Drops the submission bias without waiting: `f` gets the completions in submission
    /// order once every operation has completed, on the thread of the last completion
    /// (or right here if they all already have). Asynchronous I/O's completion anchor.
    pub fn finish_with(self, f: impl FnOnce(Vec<IoDone>) + Send + 'static) {
        let mut st = self.inner.state.lock();
        st.pending -= 1;
        if st.pending == 0 {
            let results = take_results(&mut st);
            drop(st);
            f(results);
            return;
        }
        st.on_done = Some(Box::new(f));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, SimTarget};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn finish_with_runs_once_after_all_completions() {
        let t = SimTarget::new("t", 8192, 512);
        let b = Batch::new();
        for i in 0..4u64 {
            b.submit(
                &t,
                IoOp::Write {
                    offset: i * 512,
                    bufs: vec![IoBuf::zeroed(512)],
                },
            );
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        b.finish_with(move |done| {
            assert_eq!(done.len(), 4);
            c.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "synchronous target: completed already"
        );
    }
}

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
    /// While [`Batch::wait_each`] or [`Batch::finish_each`] consumes: slots completed and
    /// not yet handed over, in completion order.
    arrived: Option<Vec<usize>>,
    /// [`Batch::finish_each`]'s consumer while no completion thread is running it (taken
    /// out, not locked, while one does).
    drain: Option<Box<dyn Drain>>,
}

/// [`Batch::finish_each`]'s consumer: each completion, then the end.
trait Drain: Send {
    fn each(&mut self, slot: usize, done: IoDone);
    fn last(self: Box<Self>);
}

struct Drainer<S, F, G> {
    state: S,
    each: F,
    last: G,
}

impl<S, F, G> Drain for Drainer<S, F, G>
where
    S: Send,
    F: FnMut(&mut S, usize, IoDone) + Send,
    G: FnOnce(S) + Send,
{
    fn each(&mut self, slot: usize, done: IoDone) {
        (self.each)(&mut self.state, slot, done);
    }
    fn last(self: Box<Self>) {
        (self.last)(self.state);
    }
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
            arrived: None,
            drain: None,
        }
    }
}

/// Slots arrived and not yet handed over, with their completions.
fn take_arrived(st: &mut State) -> Vec<(usize, IoDone)> {
    let arrived = std::mem::take(st.arrived.as_mut().expect("consuming"));
    arrived
        .into_iter()
        .map(|s| {
            let d = st.results[s].take();
            (s, d.expect("an arrived slot holds its completion"))
        })
        .collect()
}

/// Runs [`Batch::finish_each`]'s consumer on this thread over every completion arrived,
/// until none is left; then puts it back for the next completion, or, when every
/// operation has completed, ends it.
fn drain<'a>(inner: &'a Inner, mut st: parking_lot::MutexGuard<'a, State>) {
    let mut d = st.drain.take().expect("the consumer is free");
    loop {
        let got = take_arrived(&mut st);
        if got.is_empty() {
            if st.pending == 0 {
                drop(st);
                d.last();
            } else {
                st.drain = Some(d);
            }
            return;
        }
        drop(st);
        for (s, x) in got {
            d.each(s, x);
        }
        st = inner.state.lock();
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
        self.submit_by(op, |op, done| target.submit(op, done))
    }

    /// As [`Batch::submit`] through [`Target::submit_here`]: for the batch's last
    /// operation, submitted just before the caller waits, which the target may run
    /// before this returns.
    pub fn submit_here<T: Target + ?Sized>(&self, target: &T, op: IoOp) -> usize {
        self.submit_by(op, |op, done| target.submit_here(op, done))
    }

    fn submit_by(&self, op: IoOp, submit: impl FnOnce(IoOp, crate::Completion)) -> usize {
        let slot = {
            let mut st = self.inner.state.lock();
            st.pending += 1;
            st.results.push(None);
            st.results.len() - 1
        };
        let inner = Arc::clone(&self.inner);
        submit(
            op,
            Box::new(move |done| {
                let mut st = inner.state.lock();
                st.results[slot] = Some(done);
                st.pending -= 1;
                if let Some(arrived) = st.arrived.as_mut() {
                    arrived.push(slot);
                    if st.drain.is_some() {
                        drain(&inner, st);
                        return;
                    }
                    inner.all_done.notify_all();
                } else if st.pending == 0 {
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

    /// Drops the submission bias and hands every completion to `each` on this thread as
    /// it arrives (completion order, with its slot), outside the batch's lock: the
    /// consumer works on one completion while the others are still in flight. Returns
    /// once every operation has completed and been handed over.
    pub fn wait_each(self, mut each: impl FnMut(usize, IoDone)) {
        let mut st = self.inner.state.lock();
        st.pending -= 1;
        let early: Vec<usize> = (0..st.results.len())
            .filter(|&s| st.results[s].is_some())
            .collect();
        st.arrived = Some(early);
        let mut handed = 0;
        loop {
            let got = take_arrived(&mut st);
            if got.is_empty() {
                if st.pending == 0 {
                    debug_assert_eq!(handed, st.results.len(), "every completion handed over");
                    return;
                }
                self.inner.all_done.wait(&mut st);
                continue;
            }
            drop(st);
            handed += got.len();
            for (s, d) in got {
                each(s, d);
            }
            st = self.inner.state.lock();
        }
    }

    /// Drops the submission bias without waiting: every completion goes to `each` (with
    /// `state` and its slot) as it arrives, in completion order, on the thread that
    /// delivered it or on one already running `each`, never two at once and never under
    /// the batch's lock (a completion arriving while `each` runs elsewhere is queued and
    /// its thread returns at once); once every operation has completed and been handed
    /// over, `last` gets `state`. Completions that arrived already are handed over here.
    pub fn finish_each<S, F, G>(self, state: S, each: F, last: G)
    where
        S: Send + 'static,
        F: FnMut(&mut S, usize, IoDone) + Send + 'static,
        G: FnOnce(S) + Send + 'static,
    {
        let mut st = self.inner.state.lock();
        st.pending -= 1;
        let early: Vec<usize> = (0..st.results.len())
            .filter(|&s| st.results[s].is_some())
            .collect();
        st.arrived = Some(early);
        st.drain = Some(Box::new(Drainer { state, each, last }));
        drain(&self.inner, st);
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

    /// A target that completes each write on a thread of its own when told to.
    #[derive(Debug)]
    struct Later {
        sim: SimTarget,
        go: Arc<Mutex<Vec<std::sync::mpsc::Sender<()>>>>,
    }

    impl Target for Later {
        fn info(&self) -> &crate::TargetInfo {
            self.sim.info()
        }
        fn submit(&self, op: IoOp, done: crate::Completion) {
            let (tx, rx) = std::sync::mpsc::channel();
            self.go.lock().push(tx);
            let slot = Arc::new(Mutex::new(None));
            let s2 = Arc::clone(&slot);
            self.sim.submit(op, Box::new(move |x| *s2.lock() = Some(x)));
            let d = slot
                .lock()
                .take()
                .expect("the simulated target completes inline");
            std::thread::spawn(move || {
                rx.recv().unwrap();
                done(d);
            });
        }
    }

    #[test]
    fn wait_each_hands_over_each_completion_as_it_arrives() {
        let t = Later {
            sim: SimTarget::new("t", 8192, 512),
            go: Arc::new(Mutex::new(Vec::new())),
        };
        let b = Batch::new();
        for i in 0..3u64 {
            b.submit(
                &t,
                IoOp::Write {
                    offset: i * 512,
                    bufs: vec![IoBuf::zeroed(512)],
                },
            );
        }
        // Completed in the order 2, 0, 1, each only once the previous was handed over.
        let go = std::mem::take(&mut *t.go.lock());
        let order = [2usize, 0, 1];
        go[order[0]].send(()).unwrap();
        let mut seen = Vec::new();
        b.wait_each(|slot, d| {
            assert!(d.result.is_ok());
            seen.push(slot);
            if let Some(&next) = order.get(seen.len()) {
                go[next].send(()).unwrap();
            }
        });
        assert_eq!(seen, order);
    }

    #[test]
    fn finish_each_hands_over_every_completion_then_ends_once() {
        // Completed before finish_each: handed over on this thread.
        let sim = SimTarget::new("s", 8192, 512);
        let b = Batch::new();
        for i in 0..2u64 {
            b.submit(
                &sim,
                IoOp::Read {
                    offset: i * 512,
                    bufs: vec![IoBuf::zeroed(512)],
                },
            );
        }
        let (tx, rx) = std::sync::mpsc::channel();
        b.finish_each(
            Vec::new(),
            |seen: &mut Vec<usize>, s, _| seen.push(s),
            move |seen| {
                tx.send(seen).unwrap();
            },
        );
        assert_eq!(
            rx.try_recv().unwrap(),
            [0, 1],
            "ended before finish_each returned"
        );
        // Completed later, on other threads, in the order 1, 2, 0.
        let t = Later {
            sim: SimTarget::new("t", 8192, 512),
            go: Arc::new(Mutex::new(Vec::new())),
        };
        let b = Batch::new();
        for i in 0..3u64 {
            b.submit(
                &t,
                IoOp::Read {
                    offset: i * 512,
                    bufs: vec![IoBuf::zeroed(512)],
                },
            );
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let ends = Arc::new(AtomicUsize::new(0));
        let e2 = Arc::clone(&ends);
        b.finish_each(
            Vec::new(),
            |seen: &mut Vec<usize>, s, _| seen.push(s),
            move |seen| {
                e2.fetch_add(1, Ordering::SeqCst);
                tx.send(seen).unwrap();
            },
        );
        let go = std::mem::take(&mut *t.go.lock());
        for k in [1usize, 2] {
            go[k].send(()).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            rx.try_recv().is_err(),
            "not ended while an operation is in flight"
        );
        go[0].send(()).unwrap();
        let seen = rx.recv().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2], 0, "slot 0 completed last");
        assert_eq!(ends.load(Ordering::SeqCst), 1);
    }
}

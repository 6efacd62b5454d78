//! `GateTarget`: a target that holds one chosen operation at submission until a test
//! releases it, so the test can show what proceeds while that I/O is in flight (a page
//! read of a metadata lookup, the first page write of a checkpoint).
//!
//! The held operation blocks the thread that submits it, exactly as a slow device blocks
//! a synchronous submitter; every other operation passes straight to the inner target.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{Completion, IoOp, Target, TargetInfo};

type Matcher = Box<dyn Fn(&IoOp) -> bool + Send + Sync>;

/// Where the one armed hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum HoldState {
    /// Nothing held (not armed, or armed and no matching operation yet).
    #[default]
    Idle,
    /// The matching operation is waiting at submission.
    Holding,
    /// Released: the held operation (and every later one) passes.
    Released,
}

/// A target wrapper that holds the next operation a matcher accepts (see the module
/// documentation).
pub struct GateTarget {
    inner: Arc<dyn Target>,
    armed: Mutex<Option<Matcher>>,
    state: Mutex<HoldState>,
    cv: Condvar,
}

impl fmt::Debug for GateTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateTarget")
            .field("inner", &self.inner.info().name)
            .field("state", &*self.state.lock())
            .finish_non_exhaustive()
    }
}

impl GateTarget {
    /// A gate over `inner` that holds nothing until [`GateTarget::hold_next`].
    #[must_use]
    pub fn new(inner: Arc<dyn Target>) -> GateTarget {
        GateTarget {
            inner,
            armed: Mutex::new(None),
            state: Mutex::new(HoldState::Idle),
            cv: Condvar::new(),
        }
    }

    /// Holds the next operation `matches` accepts (one operation; later ones pass).
    pub fn hold_next(&self, matches: impl Fn(&IoOp) -> bool + Send + Sync + 'static) {
        *self.state.lock() = HoldState::Idle;
        *self.armed.lock() = Some(Box::new(matches));
    }

    /// Waits until the armed operation is held; `false` if `timeout` passed first.
    #[must_use]
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock();
        while *s == HoldState::Idle {
            if self.cv.wait_until(&mut s, deadline).timed_out() {
                return *s != HoldState::Idle;
            }
        }
        true
    }

    /// Whether an operation is being held now.
    #[must_use]
    pub fn is_holding(&self) -> bool {
        *self.state.lock() == HoldState::Holding
    }

    /// Lets the held operation through and arms a new hold in the same step, so no
    /// matching operation the released one leads to can pass between the two.
    pub fn release_and_hold_next(&self, matches: impl Fn(&IoOp) -> bool + Send + Sync + 'static) {
        *self.armed.lock() = Some(Box::new(matches));
        *self.state.lock() = HoldState::Idle;
        self.cv.notify_all();
    }

    /// Lets the held operation through (and disarms a hold that matched nothing yet).
    pub fn release(&self) {
        self.armed.lock().take();
        *self.state.lock() = HoldState::Released;
        self.cv.notify_all();
    }

    /// Whether `op` is the one to hold; disarms when it is.
    fn take_hold(&self, op: &IoOp) -> bool {
        let mut armed = self.armed.lock();
        let hit = armed.as_ref().is_some_and(|m| m(op));
        if hit {
            *armed = None;
        }
        hit
    }
}

impl Target for GateTarget {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }

    fn submit(&self, op: IoOp, done: Completion) {
        if self.take_hold(&op) {
            let mut s = self.state.lock();
            *s = HoldState::Holding;
            self.cv.notify_all();
            while *s == HoldState::Holding {
                self.cv.wait(&mut s);
            }
        }
        self.inner.submit(op, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimTarget;
    use std::thread;

    #[test]
    fn holds_only_the_matching_operation_until_released() {
        let sim: Arc<dyn Target> = Arc::new(SimTarget::new("g", 1 << 20, 512));
        let gate = Arc::new(GateTarget::new(sim));
        gate.hold_next(|op| matches!(op, IoOp::Read { offset: 4096, .. }));
        let g = Arc::clone(&gate);
        let held = thread::spawn(move || g.read_sync(4096, 512).map(|b| b.len()));
        assert!(gate.wait_held(Duration::from_secs(10)), "the read was held");
        // Other operations pass while it is held, the same offset included.
        assert_eq!(gate.read_sync(0, 512).unwrap().len(), 512);
        assert_eq!(gate.read_sync(4096, 512).unwrap().len(), 512);
        assert!(gate.is_holding());
        gate.release();
        assert_eq!(held.join().unwrap().unwrap(), 512);
        assert!(!gate.is_holding());
    }

    #[test]
    fn release_and_hold_next_holds_the_following_operation() {
        let sim: Arc<dyn Target> = Arc::new(SimTarget::new("g", 1 << 20, 512));
        let gate = Arc::new(GateTarget::new(sim));
        let reads = |op: &IoOp| matches!(op, IoOp::Read { .. });
        gate.hold_next(reads);
        let g = Arc::clone(&gate);
        let two = thread::spawn(move || {
            let a = g.read_sync(0, 512).map(|b| b.len());
            let b = g.read_sync(512, 512).map(|b| b.len());
            (a, b)
        });
        assert!(
            gate.wait_held(Duration::from_secs(10)),
            "the first read was held"
        );
        gate.release_and_hold_next(reads);
        assert!(
            gate.wait_held(Duration::from_secs(10)),
            "the second read was held"
        );
        assert!(!two.is_finished());
        gate.release();
        let (a, b) = two.join().unwrap();
        assert_eq!((a.unwrap(), b.unwrap()), (512, 512));
    }

    #[test]
    fn wait_held_times_out_when_nothing_matches() {
        let sim: Arc<dyn Target> = Arc::new(SimTarget::new("g", 1 << 20, 512));
        let gate = GateTarget::new(sim);
        gate.hold_next(|op| matches!(op, IoOp::Flush));
        assert_eq!(gate.read_sync(0, 512).unwrap().len(), 512);
        assert!(!gate.wait_held(Duration::from_millis(50)));
        gate.release();
    }
}

//! Which targets take new blocks and in-place writes (seed 001, I-001-3).
//!
//! Each target has one atomic word: a read-only bit and the number of in-place writers
//! admitted on it. An in-place write (writeback or a direct write landing on blocks
//! already mapped) checks the bit and counts itself in one compare-and-swap
//! ([`TargetStates::enter_in_place`]), so that no writer can pass the check after the
//! target went read-only and still be missed by [`TargetStates::wait_drained`]. It
//! leaves ([`InPlaceWriters`], dropped with the operation's mapper) only once its I/O is
//! submitted and counted where a waiter for the file's I/O sees it: the inode's
//! in-flight direct-I/O count, or the folios' writeback state. An evacuation sets the
//! bit, waits for the count to drain, then waits for each file's I/O before it moves the
//! file's blocks (`evacuate.rs`), as btrfs's relocation waits for NOCOW writers and then
//! for ordered extents.
//!
//! New blocks (allocation, delayed-allocation reservations, metadata pages) go to an
//! object's home target unless it is read-only; then to the next writable target
//! ([`TargetStates::place`]). The bit changes only under the metadata lock, and every
//! placement decision and the allocation it leads to happen under one hold of it, so no
//! block is allocated on a target after the bit is set.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};
use stripefs_core::TargetId;

const READ_ONLY: u64 = 1 << 63;
/// Set with [`READ_ONLY`] once the target is retired: it never becomes writable again.
const RETIRED: u64 = 1 << 62;
const FLAGS: u64 = READ_ONLY | RETIRED;

/// Per-target read-only bit and in-place writer count.
#[derive(Debug)]
pub(crate) struct TargetStates {
    words: Vec<AtomicU64>,
    /// Woken when a read-only target's last in-place writer leaves.
    drained: Condvar,
    lock: Mutex<()>,
}

impl TargetStates {
    pub fn new(targets: usize) -> Self {
        Self {
            words: (0..targets).map(|_| AtomicU64::new(0)).collect(),
            drained: Condvar::new(),
            lock: Mutex::new(()),
        }
    }

    fn word(&self, t: TargetId) -> &AtomicU64 {
        &self.words[t.index()]
    }

    /// Whether `t` takes no new blocks and no in-place writes.
    pub fn is_read_only(&self, t: TargetId) -> bool {
        self.word(t).load(Ordering::Acquire) & READ_ONLY != 0
    }

    /// In-place writers admitted on `t` and not yet left.
    pub fn writers(&self, t: TargetId) -> u64 {
        self.word(t).load(Ordering::Acquire) & !FLAGS
    }

    /// Whether `t` left the file system (`TargetState::Retired`).
    pub fn is_retired(&self, t: TargetId) -> bool {
        self.word(t).load(Ordering::Acquire) & RETIRED != 0
    }

    /// Retires `t` (read-only already, call under the metadata lock): for good.
    pub fn set_retired(&self, t: TargetId) {
        let was = self.word(t).fetch_or(READ_ONLY | RETIRED, Ordering::AcqRel);
        debug_assert!(was & READ_ONLY != 0, "target {t} retired while writable");
    }

    /// I-001-3: admits an in-place writer on `t` unless `t` is read-only, in one step.
    #[must_use]
    pub fn enter_in_place(&self, t: TargetId) -> bool {
        self.word(t)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w & READ_ONLY == 0).then_some(w + 1)
            })
            .is_ok()
    }

    /// An admitted in-place writer leaves (its I/O is submitted and counted).
    pub fn leave_in_place(&self, t: TargetId) {
        let was = self.word(t).fetch_sub(1, Ordering::AcqRel);
        assert!(
            was & !FLAGS > 0,
            "in-place writer count of target {t} underflows"
        );
        if was & READ_ONLY != 0 && was & !FLAGS == 1 {
            let _g = self.lock.lock();
            self.drained.notify_all();
        }
    }

    /// Makes `t` read-only (call under the metadata lock). Returns false if it was.
    pub fn set_read_only(&self, t: TargetId) -> bool {
        self.word(t).fetch_or(READ_ONLY, Ordering::AcqRel) & READ_ONLY == 0
    }

    /// Makes `t` writable again (call under the metadata lock); a retired target stays
    /// read-only.
    pub fn clear_read_only(&self, t: TargetId) {
        assert!(
            !self.is_retired(t),
            "target {t} is retired: never writable again"
        );
        self.word(t).fetch_and(!READ_ONLY, Ordering::AcqRel);
    }

    /// Waits until no in-place writer admitted before `t` went read-only is left (or
    /// until `t` is writable again: an evacuation cancelled meanwhile).
    pub fn wait_drained(&self, t: TargetId) {
        let mut g = self.lock.lock();
        while self.writers(t) > 0 && self.is_read_only(t) {
            // Bounded wait: a leave between the load and the wait is caught next round.
            self.drained
                .wait_for(&mut g, std::time::Duration::from_millis(10));
        }
    }

    /// Where new blocks whose home is `home` go, among the file system's `targets`:
    /// `home` unless it is read-only, else the next writable target after it (`None` if
    /// every target is read-only).
    pub fn place(&self, home: TargetId, targets: u32) -> Option<TargetId> {
        debug_assert!(targets as usize <= self.words.len() && home.0 < targets);
        let n = targets;
        (0..n)
            .map(|k| TargetId((home.0 + k) % n))
            .find(|&t| !self.is_read_only(t))
    }
}

/// The in-place writers one operation (one mapper) was admitted as, left when it is
/// dropped: after the operation submitted its I/O, where a waiter for the file's I/O
/// sees it.
#[derive(Debug)]
pub(crate) struct InPlaceWriters<'a> {
    states: &'a TargetStates,
    held: std::cell::RefCell<Vec<TargetId>>,
}

impl<'a> InPlaceWriters<'a> {
    pub fn new(states: &'a TargetStates) -> Self {
        Self {
            states,
            held: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// Admits an in-place writer on `t` for this operation (I-001-3); false if `t` is
    /// read-only (the write must copy). An operation admitted on `t` once stays admitted
    /// until it is dropped, whatever happened to `t` since: a waiter for the drain waits
    /// for it.
    #[must_use]
    pub fn enter(&self, t: TargetId) -> bool {
        if self.held.borrow().contains(&t) {
            return true;
        }
        let ok = self.states.enter_in_place(t);
        if ok {
            self.held.borrow_mut().push(t);
        }
        ok
    }
}

impl Drop for InPlaceWriters<'_> {
    fn drop(&mut self) {
        for t in self.held.get_mut().drain(..) {
            self.states.leave_in_place(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_refuses_new_writers_and_drains_admitted_ones() {
        let s = std::sync::Arc::new(TargetStates::new(3));
        let t = TargetId(1);
        assert!(s.enter_in_place(t));
        assert!(s.set_read_only(t));
        assert!(!s.set_read_only(t), "already read-only");
        assert!(!s.enter_in_place(t), "no writer admitted once read-only");
        assert_eq!(s.writers(t), 1);
        assert_eq!(s.place(t, 3), Some(TargetId(2)));
        let s2 = std::sync::Arc::clone(&s);
        let leaver = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            s2.leave_in_place(t);
        });
        s.wait_drained(t);
        assert_eq!(s.writers(t), 0);
        leaver.join().unwrap();
        s.clear_read_only(t);
        assert_eq!(s.place(t, 3), Some(t));
        assert!(s.enter_in_place(t));
        assert!(s.set_read_only(t));
        s.set_retired(t);
        assert!(s.is_retired(t) && s.is_read_only(t));
        assert_eq!(s.writers(t), 1, "the retired bit is not a writer");
        s.leave_in_place(t);
        assert_eq!(s.writers(t), 0);
        assert_eq!(s.place(t, 3), Some(TargetId(2)));
    }

    #[test]
    fn placement_wraps_and_fails_only_when_everything_is_read_only() {
        let s = TargetStates::new(2);
        assert!(s.set_read_only(TargetId(1)));
        assert_eq!(s.place(TargetId(1), 2), Some(TargetId(0)));
        assert!(s.set_read_only(TargetId(0)));
        assert_eq!(s.place(TargetId(0), 2), None);
    }
}

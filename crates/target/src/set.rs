//! `TargetSet`: a list of targets that grows while others read it.
//!
//! Index `i` names the `i`-th target pushed; nothing is ever removed or replaced, so a
//! reader holding `&TargetSet` indexes it with no lock (one atomic load per lookup), and
//! a push publishes its target before the length that makes it visible. Its capacity is
//! fixed when it is made. What an index means (a file system's member number) is the
//! user's: this crate knows only devices.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::Target;

/// An append-only, fixed-capacity list of targets.
pub struct TargetSet {
    slots: Box<[OnceLock<Arc<dyn Target>>]>,
    len: AtomicUsize,
    push: Mutex<()>,
}

/// The set is full: it holds its capacity already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetFull(pub usize);

impl std::fmt::Display for SetFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at most {} targets", self.0)
    }
}

impl std::error::Error for SetFull {}

impl TargetSet {
    /// A set of `targets` (index order) with room for `capacity` in all.
    ///
    /// # Errors
    /// `SetFull` when `targets` is longer than `capacity`.
    pub fn new(capacity: usize, targets: Vec<Arc<dyn Target>>) -> Result<Self, SetFull> {
        let set = TargetSet {
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
            len: AtomicUsize::new(0),
            push: Mutex::new(()),
        };
        for t in targets {
            set.push(t)?;
        }
        Ok(set)
    }

    /// Appends `t`; returns its index.
    ///
    /// # Errors
    /// `SetFull` at capacity.
    pub fn push(&self, t: Arc<dyn Target>) -> Result<usize, SetFull> {
        let _one = self.push.lock();
        let i = self.len.load(Ordering::Acquire);
        let slot = self.slots.get(i).ok_or(SetFull(self.slots.len()))?;
        if slot.set(t).is_err() {
            unreachable!("slot {i} past the length is empty: pushes are serialised");
        }
        self.len.store(i + 1, Ordering::Release);
        Ok(i)
    }

    /// Targets pushed so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether none was pushed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Target `i`, if pushed.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<&Arc<dyn Target>> {
        self.slots.get(i)?.get()
    }

    /// The targets pushed so far, in index order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Target>> {
        self.slots[..self.len()].iter().filter_map(OnceLock::get)
    }

    /// A copy of the list as it is now.
    #[must_use]
    pub fn to_vec(&self) -> Vec<Arc<dyn Target>> {
        self.iter().cloned().collect()
    }
}

impl<'a> IntoIterator for &'a TargetSet {
    type Item = &'a Arc<dyn Target>;
    type IntoIter = std::iter::FilterMap<
        std::slice::Iter<'a, OnceLock<Arc<dyn Target>>>,
        fn(&'a OnceLock<Arc<dyn Target>>) -> Option<&'a Arc<dyn Target>>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.slots[..self.len()].iter().filter_map(OnceLock::get)
    }
}

impl std::ops::Index<usize> for TargetSet {
    type Output = Arc<dyn Target>;

    /// # Panics
    /// When target `i` was not pushed: callers index with target numbers their own
    /// structures were checked against.
    fn index(&self, i: usize) -> &Arc<dyn Target> {
        self.get(i)
            .unwrap_or_else(|| panic!("target {i} of a set of {}", self.len()))
    }
}

impl std::fmt::Debug for TargetSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|t| t.info().name.clone()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimTarget;

    fn sim() -> Arc<dyn Target> {
        Arc::new(SimTarget::new("s", 1 << 20, 512))
    }

    #[test]
    fn grows_to_capacity_and_no_further() {
        let set = TargetSet::new(2, vec![sim()]).unwrap();
        assert_eq!(set.len(), 1);
        assert!(set.get(1).is_none());
        assert_eq!(set.push(sim()), Ok(1));
        assert_eq!(set.iter().count(), 2);
        assert_eq!(set.push(sim()), Err(SetFull(2)));
        assert_eq!(set.len(), 2);
    }
}

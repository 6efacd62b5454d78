//! Named fault points and a seeded, rule-driven injector.
//!
//! Every place that can fail on purpose in a test is a [`FaultPoint`]. Tests arm rules such
//! as "fail the 7th hit of any point with EIO" and sweep N = 1, 2, 3 ... until the workload
//! completes, so every failure site is exercised in turn. Injection is opt-in per target or
//! per mount: production code holds no injector and pays one `Option` check per site.

use std::collections::HashMap;
use std::fmt;

use parking_lot::Mutex;

/// A named place where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// A read on target `n` (simulated targets).
    TargetRead(u32),
    /// A write on target `n` (simulated targets).
    TargetWrite(u32),
    /// A flush on target `n` (simulated targets).
    TargetFlush(u32),
    /// A point of a layer above the targets, named by that layer (this crate counts and
    /// fires it like any other, and knows nothing of what it means). One injector can then
    /// sweep the target and the upper layer's points in one sequence.
    Runtime(&'static str),
}

impl FaultPoint {
    /// The target of a target-level point (0 for the upper layers' points).
    #[must_use]
    pub fn target_index(self) -> u32 {
        match self {
            FaultPoint::TargetRead(t) | FaultPoint::TargetWrite(t) | FaultPoint::TargetFlush(t) => {
                t
            }
            _ => 0,
        }
    }

    /// True for points raised by the target layer itself.
    #[must_use]
    pub fn is_target_io(self) -> bool {
        matches!(
            self,
            FaultPoint::TargetRead(_) | FaultPoint::TargetWrite(_) | FaultPoint::TargetFlush(_)
        )
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultPoint::TargetRead(t) => write!(f, "target-read[{t}]"),
            FaultPoint::TargetWrite(t) => write!(f, "target-write[{t}]"),
            FaultPoint::TargetFlush(t) => write!(f, "target-flush[{t}]"),
            FaultPoint::Runtime(name) => f.write_str(name),
        }
    }
}

/// The failure to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// EIO.
    Eio,
    /// ENOSPC.
    Enospc,
    /// EAGAIN (a lower layer's "try again", which proves nothing: I-000-4).
    Eagain,
}

impl FaultKind {
    /// The errno to report.
    #[must_use]
    pub fn errno(self) -> i32 {
        match self {
            FaultKind::Eio => libc::EIO,
            FaultKind::Enospc => libc::ENOSPC,
            FaultKind::Eagain => libc::EAGAIN,
        }
    }
}

/// Which hits a rule counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointMatch {
    /// Exactly this point.
    Exact(FaultPoint),
    /// Any point at all.
    Any,
    /// Any target write.
    AnyTargetWrite,
}

impl PointMatch {
    fn matches(self, p: FaultPoint) -> bool {
        match self {
            PointMatch::Exact(q) => p == q,
            PointMatch::Any => true,
            PointMatch::AnyTargetWrite => matches!(p, FaultPoint::TargetWrite(_)),
        }
    }
}

/// How long a rule fires once triggered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Only the `nth` matching hit fails.
    Once,
    /// The `nth` matching hit and every later one fail.
    Sticky,
}

#[derive(Debug, Clone)]
struct Rule {
    point: PointMatch,
    nth: u64,
    kind: FaultKind,
    persistence: Persistence,
    seen: u64,
}

/// Holds the armed rules and counts hits per point.
#[derive(Debug, Default)]
pub struct FaultInjector {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    rules: Vec<Rule>,
    hits: HashMap<FaultPoint, u64>,
    fired: Vec<FaultPoint>,
}

impl FaultInjector {
    /// An injector with no rules.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Fails the `nth` (1-based) hit matching `point` with `kind`.
    pub fn arm(&self, point: PointMatch, nth: u64, kind: FaultKind, persistence: Persistence) {
        assert!(nth >= 1, "hits are counted from 1");
        self.inner.lock().rules.push(Rule {
            point,
            nth,
            kind,
            persistence,
            seen: 0,
        });
    }

    /// Removes every rule (hit counts are kept).
    pub fn disarm(&self) {
        self.inner.lock().rules.clear();
    }

    /// Records a hit of `point`; returns the fault to inject, if any rule fires.
    pub fn check(&self, point: FaultPoint) -> Option<FaultKind> {
        let mut inner = self.inner.lock();
        *inner.hits.entry(point).or_default() += 1;
        let mut fire = None;
        for rule in inner.rules.iter_mut().filter(|r| r.point.matches(point)) {
            rule.seen += 1;
            let hit = match rule.persistence {
                Persistence::Once => rule.seen == rule.nth,
                Persistence::Sticky => rule.seen >= rule.nth,
            };
            if hit && fire.is_none() {
                fire = Some(rule.kind);
            }
        }
        if fire.is_some() {
            inner.fired.push(point);
        }
        fire
    }

    /// Total hits of all points so far.
    #[must_use]
    pub fn total_hits(&self) -> u64 {
        self.inner.lock().hits.values().sum()
    }

    /// Hits of one point so far.
    #[must_use]
    pub fn hits(&self, point: FaultPoint) -> u64 {
        self.inner.lock().hits.get(&point).copied().unwrap_or(0)
    }

    /// The points at which a fault was injected, in order.
    #[must_use]
    pub fn fired(&self) -> Vec<FaultPoint> {
        self.inner.lock().fired.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_hit_fires_once_or_sticky() {
        let f = FaultInjector::new();
        f.arm(PointMatch::Any, 3, FaultKind::Eio, Persistence::Once);
        let got: Vec<_> = (0..5).map(|_| f.check(FaultPoint::Runtime("b"))).collect();
        assert_eq!(got, vec![None, None, Some(FaultKind::Eio), None, None]);
        f.disarm();
        f.arm(
            PointMatch::Exact(FaultPoint::Runtime("a")),
            2,
            FaultKind::Enospc,
            Persistence::Sticky,
        );
        assert_eq!(f.check(FaultPoint::Runtime("a")), None);
        assert_eq!(f.check(FaultPoint::Runtime("b")), None);
        assert_eq!(f.check(FaultPoint::Runtime("a")), Some(FaultKind::Enospc));
        assert_eq!(f.check(FaultPoint::Runtime("a")), Some(FaultKind::Enospc));
        assert_eq!(f.fired().len(), 3);
    }
}

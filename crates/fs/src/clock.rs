//! The wall clock: the one place the runtime reads it for inode times and superblock and
//! journal stamps (`stripefs-core` reads no clock; times are passed in), and the rule
//! for stamping a data change (`docs/design/journal.md`, "Timestamps of data changes").

use std::sync::atomic::{AtomicU64, Ordering};

use stripefs_core::inode::Timespec;

/// How far a stored time may be ahead of the coarse clock and still count as "this tick"
/// (the coarse clock lags the fine one by at most a tick, 1-10 ms); a larger gap means the
/// clock was stepped back or the time was set in the future, and the change is stamped.
const TICK_SLACK_NS: i128 = 50_000_000;

/// The latest fine-grained time handed out, in nanoseconds since the epoch: a coarse
/// stamp is never earlier than it (Linux's multigrain "floor"), so a file written after
/// another was stamped never shows an earlier time than it, nor an `mtime` earlier than
/// the `atime` a read gave it just before.
static FLOOR_NS: AtomicU64 = AtomicU64::new(0);

/// The current wall-clock time, at nanosecond resolution; raises the floor.
#[must_use]
pub fn time_now() -> Timespec {
    let t = Timespec::from(std::time::SystemTime::now());
    FLOOR_NS.fetch_max(u64::try_from(ns(t)).unwrap_or(0), Ordering::AcqRel);
    t
}

/// The wall clock at the kernel's tick (`CLOCK_REALTIME_COARSE`), but not earlier than
/// any fine-grained time handed out: what a data change nobody has looked at is stamped
/// with.
#[must_use]
pub fn coarse_now() -> Timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return time_now();
    }
    let coarse = Timespec {
        sec: ts.tv_sec,
        nsec: u32::try_from(ts.tv_nsec).unwrap_or(0),
    };
    coarse.max(from_ns(i128::from(FLOOR_NS.load(Ordering::Acquire))))
}

/// Whether anyone may have seen an inode's times since its last data-change stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StampSeen {
    /// Its attributes were returned since (or the in-core inode is new): the next change
    /// must show, so it gets a fine-grained time.
    Maybe,
    /// Stamped by a data change and not read since.
    No,
}

/// What an unseen data change does to the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// They stay: the stored stamp is of this tick.
    Keep,
    /// The coarse clock (with its floor), this value.
    Coarse(Timespec),
    /// The fine clock: the stored `ctime` is at or past the coarse clock but is not a
    /// data-change stamp (a `chmod` or `setxattr` in this tick), or is far ahead of it.
    Fine,
}

/// The time to stamp a data change (a write) of an inode whose times are `mtime` and
/// `ctime`, or `None` when its times stay as they are, by Linux's multigrain rule (6.13+):
/// a change nobody can have observed the previous stamp of takes the coarse clock (never
/// earlier than a fine time already handed out), and needs no new stamp while that is
/// not past the inode's `ctime`; a change after someone read the times takes the fine
/// clock, so it shows. Times a data change left equal (`mtime == ctime`) are kept; after
/// `utimensat`, `chmod` or `setxattr` the next write is stamped, never earlier than the
/// `ctime` it replaces.
#[must_use]
pub fn data_stamp(mtime: Timespec, ctime: Timespec, seen: StampSeen) -> Option<Timespec> {
    if seen == StampSeen::Maybe {
        return Some(time_now());
    }
    match unseen_stamp(mtime, ctime, coarse_now()) {
        Stamp::Keep => None,
        Stamp::Coarse(t) => Some(t),
        Stamp::Fine => Some(time_now()),
    }
}

/// [`data_stamp`] for an unseen inode, with the coarse clock read as `now`.
fn unseen_stamp(mtime: Timespec, ctime: Timespec, now: Timespec) -> Stamp {
    let ahead = ns(ctime) - ns(now);
    if ahead < 0 {
        Stamp::Coarse(now)
    } else if mtime == ctime && ahead <= TICK_SLACK_NS {
        Stamp::Keep
    } else {
        Stamp::Fine
    }
}

fn ns(t: Timespec) -> i128 {
    i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec)
}

fn from_ns(n: i128) -> Timespec {
    Timespec {
        sec: i64::try_from(n.div_euclid(1_000_000_000)).unwrap_or(i64::MAX),
        nsec: u32::try_from(n.rem_euclid(1_000_000_000)).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: i128) -> Timespec {
        from_ns(1_700_000_000_000_000_000 + n)
    }

    #[test]
    fn an_unseen_stamp_of_this_tick_is_kept() {
        assert_eq!(unseen_stamp(t(5), t(5), t(0)), Stamp::Keep);
        assert_eq!(unseen_stamp(t(5), t(5), t(5)), Stamp::Keep);
    }

    #[test]
    fn a_past_tick_is_stamped_with_the_coarse_clock() {
        assert_eq!(unseen_stamp(t(5), t(5), t(9)), Stamp::Coarse(t(9)));
    }

    #[test]
    fn a_ctime_of_this_tick_from_another_change_takes_the_fine_clock() {
        // setxattr after the write stamped a later ctime: never go below it.
        assert_eq!(unseen_stamp(t(5), t(7), t(6)), Stamp::Fine);
        assert_eq!(unseen_stamp(t(5), t(7), t(8)), Stamp::Coarse(t(8)));
    }

    #[test]
    fn times_far_ahead_of_the_clock_take_the_fine_clock() {
        let hour = 3_600_000_000_000;
        assert_eq!(unseen_stamp(t(hour), t(hour), t(0)), Stamp::Fine);
    }

    #[test]
    fn a_seen_stamp_is_followed_by_a_later_fine_one() {
        let before = time_now();
        let s = data_stamp(before, before, StampSeen::Maybe).expect("stamped");
        assert!(s >= before);
    }

    #[test]
    fn coarse_stamps_are_not_earlier_than_fine_ones_handed_out() {
        for _ in 0..1000 {
            let fine = time_now();
            assert!(coarse_now() >= fine, "the floor holds the coarse clock up");
        }
    }
}

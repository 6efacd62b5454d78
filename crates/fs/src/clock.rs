//! The wall clock: the one place the runtime reads it for inode times and superblock and
//! journal stamps (`stripefs-core` reads no clock; times are passed in), and the rule
//! for stamping a data change (`docs/design/journal.md`, "Timestamps of data changes").

use stripefs_core::inode::Timespec;

/// How far a stored time may be ahead of the coarse clock and still count as "this tick"
/// (the coarse clock lags the fine one by at most a tick, 1-10 ms); a larger gap means the
/// clock was stepped back or the time was set in the future, and the change is stamped.
const TICK_SLACK_NS: i128 = 50_000_000;

/// The current wall-clock time, at nanosecond resolution.
#[must_use]
pub fn time_now() -> Timespec {
    Timespec::from(std::time::SystemTime::now())
}

/// The wall clock at the kernel's tick (`CLOCK_REALTIME_COARSE`): what a local file
/// system stamps a data change with when nobody has looked at the file's times.
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
    Timespec {
        sec: ts.tv_sec,
        nsec: u32::try_from(ts.tv_nsec).unwrap_or(0),
    }
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

/// The time to stamp a data change (a write) of an inode whose times are `mtime` and
/// `ctime`, or `None`
/// when its times stay as they are, by Linux's multigrain rule (6.13+): a change nobody
/// can have observed the previous stamp of takes the coarse clock, and needs no new
/// stamp while that is not past the inode's `ctime`; a change after someone read the
/// times takes the fine clock, so it shows. Only a stamp this rule made is kept
/// (`mtime == ctime`): after `utimensat` or `chmod` the next write is stamped.
#[must_use]
pub fn data_stamp(mtime: Timespec, ctime: Timespec, seen: StampSeen) -> Option<Timespec> {
    if seen == StampSeen::Maybe {
        return Some(time_now());
    }
    let now = coarse_now();
    let ahead = ns(ctime) - ns(now);
    if mtime == ctime && (0..=TICK_SLACK_NS).contains(&ahead) {
        return None;
    }
    Some(if ahead > TICK_SLACK_NS {
        time_now()
    } else {
        now
    })
}

fn ns(t: Timespec) -> i128 {
    i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plus_ns(t: Timespec, d: i128) -> Timespec {
        let n = ns(t) + d;
        Timespec {
            sec: i64::try_from(n.div_euclid(1_000_000_000)).unwrap(),
            nsec: u32::try_from(n.rem_euclid(1_000_000_000)).unwrap(),
        }
    }

    #[test]
    fn an_unseen_stamp_of_this_tick_is_kept() {
        // Ahead of the coarse clock by less than the slack even if a tick passes.
        let t = plus_ns(coarse_now(), 20_000_000);
        assert_eq!(data_stamp(t, t, StampSeen::No), None);
    }

    #[test]
    fn a_seen_stamp_is_followed_by_a_later_fine_one() {
        let t = plus_ns(coarse_now(), 1_000);
        let s = data_stamp(t, t, StampSeen::Maybe).expect("stamped");
        assert!(s >= coarse_now());
    }

    #[test]
    fn a_past_tick_is_stamped_with_the_coarse_clock() {
        let t = plus_ns(coarse_now(), -200_000_000);
        let s = data_stamp(t, t, StampSeen::No).expect("stamped");
        assert!(s > t);
    }

    #[test]
    fn times_set_by_hand_or_far_ahead_are_not_kept() {
        let now = plus_ns(coarse_now(), 1_000);
        let old = plus_ns(now, -3_600_000_000_000);
        assert!(data_stamp(old, now, StampSeen::No).is_some(), "utimensat");
        let future = plus_ns(now, 3_600_000_000_000);
        let s = data_stamp(future, future, StampSeen::No).expect("stamped");
        assert!(s < future, "a clock stepped back stamps the present");
    }
}

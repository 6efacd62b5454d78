//! Device operations per `fsync`, counted in the target layer (`Target::op_counts`), on
//! four targets: after a 4 KiB buffered overwrite, after an append, and after a
//! metadata-only change (chmod). The commit protocol promises (docs/design/journal.md):
//! one flush of exactly the targets that received data since their last flush, then the
//! journal record as one FUA write on target 0; no flush at all when no data target has
//! anything new.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{CreateParams, Fs, Ino, SetAttr};
use stripefs_target::{OpCounts, SimTarget, Target};

const NTARGETS: usize = 4;

fn counts(s: &[Arc<SimTarget>]) -> Vec<OpCounts> {
    s.iter()
        .map(|t| t.op_counts().expect("sim targets count"))
        .collect()
}

fn delta(before: &[OpCounts], after: &[OpCounts]) -> Vec<OpCounts> {
    after.iter().zip(before).map(|(a, b)| *a - *b).collect()
}

fn total(d: &[OpCounts]) -> OpCounts {
    d.iter().fold(OpCounts::default(), |acc, c| acc + *c)
}

fn report(what: &str, d: &[OpCounts]) {
    let t = total(d);
    eprintln!(
        "fsync after {what}: {} device ops = {} writes + {} FUA writes + {} flushes; per target (w/fua/fl): {}",
        t.mutating(),
        t.writes,
        t.fua_writes,
        t.flushes,
        d.iter()
            .map(|c| format!("{}/{}/{}", c.writes, c.fua_writes, c.flushes))
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// A mounted file system on four targets with one file of 256 KiB (every target holds
/// some of it), written back and committed.
fn setup() -> (Vec<Arc<SimTarget>>, Fs, Ino) {
    let s = sims(NTARGETS, 32 << 20);
    let fs = fresh(&s, 4096, 16384);
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    fs.write_at(a.ino, 0, &pattern(1, 0, 256 << 10)).unwrap();
    fs.fsync(a.ino, stripefs::SyncScope::All).unwrap();
    (s, fs, a.ino)
}

/// Runs `change` then `fsync` and returns the device operations of the `fsync` alone.
fn fsync_cost(s: &[Arc<SimTarget>], fs: &Fs, ino: Ino, change: impl Fn()) -> Vec<OpCounts> {
    change();
    let before = counts(s);
    fs.fsync(ino, stripefs::SyncScope::All).unwrap();
    delta(&before, &counts(s))
}

/// Every flush goes to a target that received data in this `fsync`, and at most one each.
fn only_written_targets_flushed(d: &[OpCounts]) {
    for (i, c) in d.iter().enumerate() {
        assert!(
            c.flushes <= u64::from(c.writes > 0),
            "target {i}: {} flushes with {} data writes",
            c.flushes,
            c.writes
        );
    }
}

#[test]
fn fsync_after_chmod_is_one_fua_journal_write() {
    let (s, fs, ino) = setup();
    let d = fsync_cost(&s, &fs, ino, || {
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        fs.setattr(ino, &set).unwrap();
    });
    report("chmod", &d);
    let t = total(&d);
    assert_eq!(t.flushes, 0, "no data is new: no target is flushed");
    assert_eq!(t.writes, 0, "the journal record goes as a FUA write");
    assert_eq!(
        d[0].fua_writes, 1,
        "exactly one journal FUA write on target 0"
    );
    assert_eq!(t.fua_writes, 1);
    fs.unmount().unwrap();
}

#[test]
fn fsync_after_buffered_overwrite_flushes_only_the_written_target() {
    let (s, fs, ino) = setup();
    let d = fsync_cost(&s, &fs, ino, || {
        fs.write_at(ino, 20480, &pattern(2, 20480, 4096)).unwrap();
    });
    report("4 KiB buffered overwrite", &d);
    let t = total(&d);
    assert_eq!(t.writes, 1, "one data block written back");
    assert_eq!(t.flushes, 1, "one flush, of the target holding it");
    only_written_targets_flushed(&d);
    assert!(t.fua_writes <= 1, "at most one journal record");
    assert_eq!(t.mutating(), 2 + t.fua_writes);
    fs.unmount().unwrap();
}

#[test]
fn fsync_after_append_flushes_the_data_target_then_one_fua_write() {
    let (s, fs, ino) = setup();
    let d = fsync_cost(&s, &fs, ino, || {
        fs.write_at(ino, 256 << 10, &pattern(3, 256 << 10, 4096))
            .unwrap();
    });
    report("4 KiB append", &d);
    let t = total(&d);
    assert_eq!(t.writes, 1, "one data block written back");
    assert_eq!(t.flushes, 1, "one flush, of the target holding it");
    only_written_targets_flushed(&d);
    assert_eq!(d[0].fua_writes, 1, "the size change: one journal FUA write");
    assert_eq!(t.fua_writes, 1);
    fs.unmount().unwrap();
}

/// Overwrites whose times nobody read since the last stamp keep the times of that stamp
/// within the clock's tick (`clock::data_stamp`, as Linux's multigrain timestamps), so
/// their `fsync` is the data write and its flush alone, with no journal record; one
/// after a `stat` is stamped anew, later than what the `stat` showed, and commits.
#[test]
fn overwrites_nobody_looked_at_commit_no_new_times() {
    let (s, fs, ino) = setup();
    let n = 200;
    let before = counts(&s);
    for i in 0..n {
        fs.write_at(ino, 20480, &pattern(4 + i, 20480, 4096))
            .unwrap();
        fs.fsync(ino, stripefs::SyncScope::All).unwrap();
    }
    let t = total(&delta(&before, &counts(&s)));
    eprintln!(
        "{n} overwrites + fsync, nobody looking: {} journal records",
        t.fua_writes
    );
    assert_eq!(
        (t.writes, t.flushes),
        (n, n),
        "each fsync writes its block back"
    );
    assert!(
        t.fua_writes < n,
        "some overwrites in one tick share a stamp"
    );
    for i in 0..20 {
        let seen = fs.getattr(ino).unwrap().mtime;
        let d = fsync_cost(&s, &fs, ino, || {
            fs.write_at(ino, 20480, &pattern(300 + i, 20480, 4096))
                .unwrap();
        });
        assert_eq!(
            total(&d).fua_writes,
            1,
            "a write after a stat commits new times"
        );
        assert!(fs.getattr(ino).unwrap().mtime > seen, "and they show");
    }
    fs.unmount().unwrap();
}

//! The in-place or copy-on-write decision (seed 001, issue 13; `docs/design/reflink.md`,
//! "NOCOW decision (seed 001)"): a NOCOW file's shared blocks are copied by writeback and
//! direct writes, its own blocks are written in place, an unwritten extent written in
//! place converts at completion, and a count change while the unlocked checks ran forces
//! a re-search. Every test runs under `nocow_check=unlocked` and `nocow_check=locked`.
mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use common::*;
use stripefs::{FallocMode, Fs, FsStatus, Ino, MkfsOptions, NocowCheck, SyncScope};
#[cfg(debug_assertions)]
use stripefs_iomap::IomapOp;
use stripefs_target::SimTarget;

const BS: u64 = 4096;
const MODES: [NocowCheck; 2] = [NocowCheck::Unlocked, NocowCheck::Locked];

/// One target (every block on target 0, so one file's count changes are the other's
/// target's too), 4 KiB blocks, files NOCOW (`datacow=off`, the default).
fn mount(mode: NocowCheck) -> (Vec<Arc<SimTarget>>, Fs) {
    let s = sims(1, 32 << 20);
    let opts = MkfsOptions {
        block_size: BS as u32,
        stripe_unit: 64 << 10,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).expect("mkfs");
    let fs = remount(&s, mode);
    (s, fs)
}

fn remount(s: &[Arc<SimTarget>], mode: NocowCheck) -> Fs {
    let o = stripefs::MountOptions {
        nocow_check: mode,
        ..quiet()
    };
    Fs::mount(dyns(s), o).expect("mount").0
}

/// (target, byte on the target, written) of file byte `off`.
fn where_is(fs: &Fs, ino: Ino, off: u64) -> (u32, u64, bool) {
    let r = fs
        .extents(ino)
        .expect("extents")
        .into_iter()
        .find(|r| r.file_off <= off && off < r.file_off + r.len)
        .unwrap_or_else(|| panic!("{off} is not mapped"));
    (r.target, r.target_off + (off - r.file_off), r.written)
}

/// Decisions counted since `before`: (in place, copied, re-searches, locked fallbacks).
fn decisions(fs: &Fs, before: &FsStatus) -> (u64, u64, u64, u64) {
    let s = fs.status();
    (
        s.nocow_in_place - before.nocow_in_place,
        s.nocow_cow - before.nocow_cow,
        s.nocow_researches - before.nocow_researches,
        s.nocow_locked_fallbacks - before.nocow_locked_fallbacks,
    )
}

fn all_checks(fs: &Fs, what: &str) {
    fs.check_refcounts()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    fs.check_space_accounting()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    fs.check_csums().unwrap_or_else(|e| panic!("{what}: {e}"));
}

fn fsck_clean(s: &[Arc<SimTarget>], what: &str) {
    let r = stripefs::fsck::fsck(dyns(s), &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
}

/// (a) A NOCOW file's cloned blocks: writeback and a direct write copy them, the clone
/// keeps its data, counts and space exact; the copies, now the file's own, are then
/// written in place.
#[test]
fn cloned_blocks_of_a_nocow_file_are_copied() {
    for mode in MODES {
        let (s, fs) = mount(mode);
        let a = file(&fs, "a");
        let data = pattern(1, 0, 64 * BS as usize);
        fs.write_at(a, 0, &data).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let b = file(&fs, "b");
        fs.clone_file(a, b).unwrap();
        fs.sync().unwrap();
        let shared_at = where_is(&fs, a, 2 * BS);
        assert_eq!(where_is(&fs, b, 2 * BS), shared_at, "{mode:?}: shared");

        let before = fs.status();
        let w1 = pattern(2, 2 * BS, BS as usize);
        fs.write_at(a, 2 * BS, &w1).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let w2 = pattern(3, 9 * BS, BS as usize);
        fs.write_direct(a, 9 * BS, &w2).unwrap();
        assert_eq!(
            decisions(&fs, &before),
            (0, 2, 0, 0),
            "{mode:?}: both copied"
        );
        let (moved1, moved2) = (where_is(&fs, a, 2 * BS), where_is(&fs, a, 9 * BS));
        assert_ne!(moved1, shared_at, "{mode:?}: writeback copied");
        assert_ne!(
            moved2,
            where_is(&fs, b, 9 * BS),
            "{mode:?}: direct write copied"
        );
        assert_eq!(read_all(&fs, b), data, "{mode:?}: the clone keeps its data");
        let mut want = data.clone();
        want[2 * BS as usize..3 * BS as usize].copy_from_slice(&w1);
        want[9 * BS as usize..10 * BS as usize].copy_from_slice(&w2);
        assert_eq!(read_all(&fs, a), want, "{mode:?}");
        fs.sync().unwrap();
        assert_eq!(fs.shared_blocks(), 62, "{mode:?}: two blocks unshared");
        all_checks(&fs, &format!("{mode:?} after copies"));

        // The copies are a's alone: written in place from now on.
        let before = fs.status();
        fs.write_at(a, 2 * BS, &pattern(4, 2 * BS, BS as usize))
            .unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        fs.write_direct(a, 9 * BS, &pattern(5, 9 * BS, BS as usize))
            .unwrap();
        assert_eq!(decisions(&fs, &before), (2, 0, 0, 0), "{mode:?}: in place");
        assert_eq!(where_is(&fs, a, 2 * BS), moved1, "{mode:?}");
        assert_eq!(where_is(&fs, a, 9 * BS), moved2, "{mode:?}");
        assert_eq!(
            read_all(&fs, b),
            data,
            "{mode:?}: the clone still keeps its data"
        );
        fs.sync().unwrap();
        all_checks(&fs, &format!("{mode:?} after in-place writes"));
        fs.unmount().unwrap();
        fsck_clean(&s, &format!("{mode:?}"));
    }
}

/// (c) A plain NOCOW overwrite, buffered and direct, lands on the same block.
#[test]
fn plain_nocow_overwrite_is_in_place() {
    for mode in MODES {
        let (s, fs) = mount(mode);
        let a = file(&fs, "a");
        fs.write_at(a, 0, &pattern(1, 0, 16 * BS as usize)).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let at = [where_is(&fs, a, 0), where_is(&fs, a, 5 * BS)];
        let free = fs.statfs().unwrap().blocks_free;
        let before = fs.status();
        let w = pattern(2, 0, BS as usize);
        fs.write_at(a, 0, &w).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let d = pattern(3, 5 * BS, BS as usize);
        fs.write_direct(a, 5 * BS, &d).unwrap();
        assert_eq!(decisions(&fs, &before), (2, 0, 0, 0), "{mode:?}");
        assert_eq!(
            [where_is(&fs, a, 0), where_is(&fs, a, 5 * BS)],
            at,
            "{mode:?}: same blocks"
        );
        assert_eq!(
            fs.statfs().unwrap().blocks_free,
            free,
            "{mode:?}: no block taken"
        );
        let got = read_all(&fs, a);
        assert_eq!(&got[..BS as usize], &w[..], "{mode:?}");
        assert_eq!(&got[5 * BS as usize..6 * BS as usize], &d[..], "{mode:?}");
        fs.sync().unwrap();
        all_checks(&fs, &format!("{mode:?}"));
        fs.unmount().unwrap();
        fsck_clean(&s, &format!("{mode:?}"));
    }
}

/// (d) I-001-4: an unwritten extent written in place (buffered and direct) is the same
/// block, recorded written at completion, and stays so after a remount.
#[test]
fn unwritten_extent_written_in_place_converts_at_completion() {
    for mode in MODES {
        let (s, fs) = mount(mode);
        let a = file(&fs, "a");
        fs.fallocate(a, FallocMode::Allocate, 0, 16 * BS).unwrap();
        let (t0, p0, w0) = where_is(&fs, a, 0);
        let (t4, p4, w4) = where_is(&fs, a, 4 * BS);
        assert!(!w0 && !w4, "{mode:?}: preallocated unwritten");
        let before = fs.status();
        let w = pattern(1, 0, BS as usize);
        fs.write_at(a, 0, &w).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let d = pattern(2, 4 * BS, BS as usize);
        fs.write_direct(a, 4 * BS, &d).unwrap();
        assert_eq!(decisions(&fs, &before), (2, 0, 0, 0), "{mode:?}");
        assert_eq!(where_is(&fs, a, 0), (t0, p0, true), "{mode:?}: converted");
        assert_eq!(
            where_is(&fs, a, 4 * BS),
            (t4, p4, true),
            "{mode:?}: converted"
        );
        assert!(
            !where_is(&fs, a, BS).2,
            "{mode:?}: the rest stays unwritten"
        );
        fs.fsync(a, SyncScope::All).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let fs = remount(&s, mode);
        let got = read_all(&fs, a);
        assert_eq!(&got[..BS as usize], &w[..], "{mode:?}");
        assert!(got[BS as usize..4 * BS as usize].iter().all(|&x| x == 0));
        assert_eq!(&got[4 * BS as usize..5 * BS as usize], &d[..], "{mode:?}");
        assert_eq!(where_is(&fs, a, 0), (t0, p0, true), "{mode:?}: durable");
        all_checks(&fs, &format!("{mode:?}"));
        fs.unmount().unwrap();
        fsck_clean(&s, &format!("{mode:?}"));
    }
}

/// (e) A count change while the unlocked checks ran forces a re-search: `b`, the other
/// owner of `a`'s block, is unlinked after a direct write's (then writeback's) checks
/// found the block shared and before the lock is taken again. With the unlink committed
/// in between, the re-search finds the block `a`'s alone and writes in place (writeback
/// also gives back the copy's reservation); without the re-validation the stale answer
/// copies the block. With the unlink not yet durable, the re-search finds its release
/// pending and copies (decision 94): a crash would bring `b` back, and an in-place write
/// would land in its data.
#[cfg(debug_assertions)]
#[test]
fn count_change_during_unlocked_checks_forces_a_research() {
    for (op, how, commit) in [
        (IomapOp::Write, "direct", true),
        (IomapOp::Writeback, "writeback", true),
        (IomapOp::Write, "direct, release not durable", false),
        (IomapOp::Writeback, "writeback, release not durable", false),
    ] {
        let (s, fs) = mount(NocowCheck::Unlocked);
        let a = file(&fs, "a");
        fs.write_at(a, 0, &pattern(1, 0, 4 * BS as usize)).unwrap();
        fs.fsync(a, SyncScope::All).unwrap();
        let b = file(&fs, "b");
        fs.clone_file(a, b).unwrap();
        fs.sync().unwrap();
        let at = where_is(&fs, a, 0);
        let calls = Arc::new(AtomicU32::new(0));
        let (hook_fs, hook_calls) = (fs.clone(), Arc::clone(&calls));
        fs.set_nocow_hook(Some(Arc::new(move |o, _, _| {
            if o == op && hook_calls.fetch_add(1, Ordering::SeqCst) == 0 {
                hook_fs.unlink(Ino::ROOT, "b".as_ref()).expect("unlink b");
                if commit {
                    hook_fs
                        .fsync(Ino::ROOT, SyncScope::All)
                        .expect("commit the unlink");
                }
            }
        })));
        let before = fs.status();
        let d = pattern(2, 0, BS as usize);
        if op == IomapOp::Write {
            fs.write_direct(a, 0, &d).unwrap();
        } else {
            fs.write_at(a, 0, &d).unwrap();
            fs.fsync(a, SyncScope::All).unwrap();
        }
        fs.set_nocow_hook(None);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "{how}: checked, changed, checked again"
        );
        if commit {
            assert_eq!(where_is(&fs, a, 0), at, "{how}: in place, b let go first");
            assert_eq!(
                decisions(&fs, &before),
                (1, 0, 1, 0),
                "{how}: one re-search, then in place"
            );
        } else {
            assert_ne!(
                where_is(&fs, a, 0),
                at,
                "{how}: copied, b's release is not durable"
            );
            assert_eq!(
                decisions(&fs, &before),
                (0, 1, 1, 0),
                "{how}: one re-search, then copy on write"
            );
        }
        assert_eq!(&read_all(&fs, a)[..BS as usize], &d[..], "{how}");
        fs.sync().unwrap();
        all_checks(&fs, how);
        fs.unmount().unwrap();
        fsck_clean(&s, how);
    }
}

/// (e') Counts that change during every unlocked check: after `NOCOW_RETRIES` (8)
/// re-searches the decision is taken under the lock, and counted.
#[cfg(debug_assertions)]
#[test]
fn endless_count_changes_end_in_a_locked_fallback() {
    let (s, fs) = mount(NocowCheck::Unlocked);
    let a = file(&fs, "a");
    fs.write_at(a, 0, &pattern(1, 0, 4 * BS as usize)).unwrap();
    let x = file(&fs, "x");
    fs.write_at(x, 0, &pattern(2, 0, BS as usize)).unwrap();
    fs.sync().unwrap();
    let at = where_is(&fs, a, 0);
    let calls = Arc::new(AtomicU32::new(0));
    let (hook_fs, hook_calls) = (fs.clone(), Arc::clone(&calls));
    // Each check of the write clones x (on a's target) to a new file: a RefcountSet.
    fs.set_nocow_hook(Some(Arc::new(move |op, _, _| {
        if op != IomapOp::Write {
            return;
        }
        let n = hook_calls.fetch_add(1, Ordering::SeqCst);
        let y = file(&hook_fs, &format!("y{n}"));
        hook_fs.clone_file(x, y).expect("clone x");
    })));
    let before = fs.status();
    fs.write_direct(a, 0, &pattern(3, 0, BS as usize)).unwrap();
    fs.set_nocow_hook(None);
    assert_eq!(calls.load(Ordering::SeqCst), 8, "eight unlocked checks");
    assert_eq!(
        decisions(&fs, &before),
        (1, 0, 8, 1),
        "then one under the lock"
    );
    assert_eq!(where_is(&fs, a, 0), at);
    fs.sync().unwrap();
    all_checks(&fs, "after the locked fallback");
    fs.unmount().unwrap();
    fsck_clean(&s, "locked fallback");
}

//! A truncate down while the write of the file's (new) EOF block, taken by writeback at
//! the old size, is still on the device. Writeback runs without the inode lock, so the
//! truncate must wait for that write before zeroing the block's tail on disk: otherwise
//! the write lands afterwards with the old bytes past the new EOF (and a write into a new
//! block is recorded afterwards, over a tail zeroing that found nothing written), or the
//! truncate's read-modify-write of the block puts back what the disk held before the
//! write. Found by `model_ops`' late-write configurations ("non-zero bytes past EOF after
//! a clean unmount", "got 0x0").
mod common;

use std::time::{Duration, Instant};

use common::*;
use stripefs::{CreateParams, Fs, Ino, SyncScope};
use stripefs_target::IoOp;

const LEN: usize = 64 << 10;
/// Inside the last 4 KiB block of the 64 KiB folio: the block past it starts the next
/// folio, so dropping the cache past the new EOF never meets the folio under writeback.
const CUT: u64 = LEN as u64 - 100;

/// How the EOF block's data stands before the held writeback.
#[derive(Debug, Clone, Copy)]
enum Before {
    /// Never written back: the held write goes to a block allocated by writeback itself.
    Delayed,
    /// Written back once with other bytes: the held write overwrites it in place.
    Written,
}

fn truncate_under_held_write(before: Before) {
    let (gate, targets, fs) = gated_fs();
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .expect("create");
    if let Before::Written = before {
        fs.write_at(f.ino, 0, &pattern(1, 0, LEN)).expect("write");
        fs.fsync(f.ino, SyncScope::Data).expect("fsync");
    }
    let data = pattern(2, 0, LEN);
    fs.write_at(f.ino, 0, &data).expect("write");
    gate.hold_next(|op| matches!(op, IoOp::Write { .. }));
    std::thread::scope(|sc| {
        let sync = sc.spawn(|| fs.fsync(f.ino, SyncScope::Data));
        assert!(
            gate.wait_held(Duration::from_secs(20)),
            "fsync wrote nothing back"
        );
        let cut = sc.spawn(|| fs.set_len(f.ino, CUT));
        // The truncate either waits for the held write (right) or finishes meanwhile.
        let deadline = Instant::now() + Duration::from_millis(300);
        while !cut.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        gate.release();
        sync.join().expect("fsync thread").expect("fsync");
        cut.join().expect("truncate thread").expect("truncate");
    });
    fs.unmount().expect("unmount");
    let report = stripefs::fsck::fsck(targets.clone(), &mut |_| {}).expect("fsck");
    assert!(
        report.is_clean(),
        "fsck ({before:?}): {:?}",
        report.problems
    );
    assert!(
        report.eof_tails_not_zero.is_empty(),
        "non-zero bytes past EOF on disk after the truncate ({before:?}): {:?}",
        report.eof_tails_not_zero
    );
    let (fs, _) = Fs::mount(targets, quiet()).expect("remount");
    let mut got = vec![0u8; LEN];
    let n = fs.read_at(f.ino, 0, &mut got).expect("read");
    assert_eq!(n as u64, CUT, "size after the truncate ({before:?})");
    if let Some(i) = (0..n).find(|&i| got[i] != data[i]) {
        panic!(
            "byte {i} reads {:#x} from disk, written {:#x} ({before:?})",
            got[i], data[i]
        );
    }
    // Growing the file again exposes the old tail if the disk kept it.
    fs.set_len(f.ino, LEN as u64).expect("extend");
    let n = fs.read_at(f.ino, 0, &mut got).expect("read");
    assert_eq!(n, LEN);
    assert!(
        got[CUT as usize..].iter().all(|&b| b == 0),
        "the cut tail reads non-zero after growing again ({before:?})"
    );
    fs.unmount().expect("unmount");
}

#[test]
fn truncate_waits_for_writeback_of_a_delayed_eof_block() {
    truncate_under_held_write(Before::Delayed);
}

#[test]
fn truncate_waits_for_writeback_of_a_written_eof_block() {
    truncate_under_held_write(Before::Written);
}

//! `SEEK_DATA`/`SEEK_HOLE` while the data's writeback is on the device: the blocks are
//! neither dirty (writeback took them) nor recorded (that happens at completion), and
//! writeback runs without the inode lock, so `seek` must count them as data from the
//! cache (`FileCache::block_pending`). Found by `model_ops`' late-write configurations.
mod common;

use std::time::Duration;

use common::*;
use stripefs::{CreateParams, Ino, SyncScope, Whence};
use stripefs_target::IoOp;

#[test]
fn seek_finds_data_whose_writeback_is_in_flight() {
    let (gate, _, fs) = gated_fs();
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .expect("create");
    let len = 64 << 10;
    fs.write_at(f.ino, 0, &pattern(1, 0, len)).expect("write");
    gate.hold_next(|op| matches!(op, IoOp::Write { .. }));
    std::thread::scope(|sc| {
        let sync = sc.spawn(|| fs.fsync(f.ino, SyncScope::Data));
        assert!(
            gate.wait_held(Duration::from_secs(20)),
            "fsync wrote nothing back"
        );
        let data = fs.seek(f.ino, 0, Whence::Data);
        let hole = fs.seek(f.ino, 0, Whence::Hole);
        gate.release();
        sync.join().expect("fsync thread").expect("fsync");
        assert_eq!(data.expect("seek data"), 0, "data under writeback is data");
        assert_eq!(hole.expect("seek hole"), len as u64, "the hole is at EOF");
    });
    assert_eq!(fs.seek(f.ino, 0, Whence::Data).expect("seek"), 0);
}

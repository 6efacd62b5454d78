//! `SEEK_DATA`/`SEEK_HOLE` while the data's writeback is on the device: the blocks are
//! neither dirty (writeback took them) nor recorded (that happens at completion), and
//! writeback runs without the inode lock, so `seek` must count them as data from the
//! cache (`FileCache::block_pending`). Found by `model_ops`' late-write configurations.
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use stripefs::{CreateParams, Fs, Ino, MkfsOptions, SyncScope, Whence};
use stripefs_target::{GateTarget, IoOp, Target};

#[test]
fn seek_finds_data_whose_writeback_is_in_flight() {
    let s = sims(1, 64 << 20);
    let gate = Arc::new(GateTarget::new(Arc::clone(&s[0]) as Arc<dyn Target>));
    let targets: Vec<Arc<dyn Target>> = vec![Arc::clone(&gate) as Arc<dyn Target>];
    Fs::mkfs(&targets, &MkfsOptions::default()).expect("mkfs");
    let (fs, _) = Fs::mount(targets, quiet()).expect("mount");
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

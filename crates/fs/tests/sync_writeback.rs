//! `sync` and writeback that someone else started: between taking a file's folios
//! (no longer dirty) and recording them (not yet in the journal), a writeback's data is
//! on neither list a sync used to look at. A sync must wait for it, or it commits and
//! returns while data written before it is still on its way to the device; an add of a
//! target found the same writeback's delayed allocations still promised
//! (`add_target::writers_during_the_add_lose_nothing` failed once under load with "17
//! blocks are still promised to delayed allocations after writeback").
mod common;

use std::time::Duration;

use common::*;
use stripefs::{CreateParams, Ino, SyncScope};
use stripefs_target::IoOp;

#[test]
fn sync_waits_for_a_writeback_another_thread_started() {
    let (gate, _, fs) = gated_fs();
    let f = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .expect("create");
    let len = 64 << 10;
    fs.write_at(f.ino, 0, &pattern(1, 0, len)).expect("write");
    fs.fsync(f.ino, SyncScope::All).expect("fsync");
    // An overwrite within the size: only the folios are dirty (a file whose size in core
    // is ahead of the trees' is settled by a sync whatever its folios say).
    fs.write_at(f.ino, 0, &pattern(2, 0, len))
        .expect("overwrite");
    gate.hold_next(|op| matches!(op, IoOp::Write { .. }));
    std::thread::scope(|sc| {
        // The fsync takes the file's folios and its data write waits at the gate.
        let fsync = sc.spawn(|| fs.fsync(f.ino, SyncScope::Data));
        assert!(
            gate.wait_held(Duration::from_secs(20)),
            "fsync wrote nothing back"
        );
        let sync = sc.spawn(|| fs.sync());
        std::thread::sleep(Duration::from_millis(300));
        let returned_early = sync.is_finished();
        gate.release();
        fsync.join().expect("fsync thread").expect("fsync");
        sync.join().expect("sync thread").expect("sync");
        assert!(
            !returned_early,
            "sync returned while data written before it was still being written back"
        );
    });
    let mut back = vec![0u8; len];
    fs.read_at(f.ino, 0, &mut back).expect("read");
    assert!(back == pattern(2, 0, len));
    fs.unmount().expect("unmount");
}

//! The last link of a file goes while a writeback write of that file is still on its way
//! to the device. Writeback runs without the inode lock, so the unlink frees the inode at
//! once; its blocks must not become reusable before that write has completed. Otherwise
//! another file is given the blocks, written and made durable, and the late write of the
//! dead file lands on top of it (Linux waits for writeback in inode eviction, before the
//! blocks are freed, for the same reason). Found by reading the free path (stop 19's race
//! hunt; `docs/design/cache.md`, "Freeing a dead inode's blocks").
mod common;

use std::time::{Duration, Instant};

use common::*;
use stripefs::{CreateParams, Fs, FsError, Ino, SyncScope};
use stripefs_target::IoOp;

const LEN: usize = 64 << 10;

#[test]
fn a_dead_files_late_write_never_lands_on_reused_blocks() {
    let (gate, targets, fs) = gated_fs();
    let new = |name: &str| {
        fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
            .expect("create")
            .ino
    };
    let dead = new("dead");
    // Blocks allocated and durable, so the held write is an overwrite in place.
    fs.write_at(dead, 0, &pattern(1, 0, LEN)).expect("write");
    fs.fsync(dead, SyncScope::Data).expect("fsync");
    fs.write_at(dead, 0, &pattern(2, 0, LEN))
        .expect("overwrite");
    let live_data = pattern(3, 0, LEN);
    let mut live = None;
    gate.hold_next(|op| matches!(op, IoOp::Write { .. }));
    std::thread::scope(|sc| {
        let late = sc.spawn(|| fs.fsync(dead, SyncScope::Data));
        assert!(
            gate.wait_held(Duration::from_secs(20)),
            "fsync wrote nothing back"
        );
        let unlink = sc.spawn(|| fs.unlink(Ino::ROOT, "dead".as_ref()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while fs.lookup(Ino::ROOT, "dead".as_ref()).is_ok() {
            assert!(Instant::now() < deadline, "the unlink did not happen");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Make the unlink durable, then give a new file the room the dead one had.
        let other = new("other");
        fs.fsync(other, SyncScope::All).expect("fsync other");
        let l = new("live");
        fs.write_at(l, 0, &live_data).expect("write live");
        fs.fsync(l, SyncScope::Data).expect("fsync live");
        live = Some(l);
        gate.release();
        match late.join().expect("fsync thread") {
            Ok(()) | Err(FsError::Stale(_)) => {}
            Err(e) => panic!("fsync of the unlinked file: {e}"),
        }
        unlink.join().expect("unlink thread").expect("unlink");
    });
    let live = live.expect("live file");
    fs.unmount().expect("unmount");
    let report = stripefs::fsck::fsck(targets.clone(), &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    let (fs, _) = Fs::mount(targets, quiet()).expect("remount");
    let mut got = vec![0u8; LEN];
    assert_eq!(fs.read_at(live, 0, &mut got).expect("read"), LEN);
    if let Some(i) = (0..LEN).find(|&i| got[i] != live_data[i]) {
        panic!(
            "byte {i} of the live file reads {:#x} from disk, written {:#x}: the dead file's \
             late write landed on it",
            got[i], live_data[i]
        );
    }
    fs.unmount().expect("unmount");
}

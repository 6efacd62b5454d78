//! Online evacuation of a target (issue 13, seed 001's I-001-3; `evacuate.rs`): every
//! file block and metadata page leaves the target while the file system stays mounted,
//! data reads back byte for byte, counts, checksums, space books and fsck stay exact, and
//! an in-place write admitted before the target went read-only is never lost to the move.
mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use stripefs::{DataCow, FallocMode, Fs, Ino, MkfsOptions, MountOptions, SyncScope, TargetId};
use stripefs_target::{IoOp, SimTarget, Target};

const BS: u64 = 4096;
const EVACUATED: TargetId = TargetId(2);

fn mkfs(targets: &[Arc<dyn Target>]) {
    let opts = MkfsOptions {
        block_size: BS as u32,
        stripe_unit: 64 << 10,
        ..MkfsOptions::default()
    };
    Fs::mkfs(targets, &opts).expect("mkfs");
}

fn opts(datacow: DataCow) -> MountOptions {
    MountOptions { datacow, ..quiet() }
}

/// Blocks of `ino` on `t`, from its extent list.
fn bytes_on(fs: &Fs, ino: Ino, t: TargetId) -> u64 {
    fs.extents(ino)
        .expect("extents")
        .iter()
        .filter(|r| r.target == t.0)
        .map(|r| r.len)
        .sum()
}

fn all_checks(fs: &Fs, what: &str) {
    fs.check_refcounts()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    fs.check_csums().unwrap_or_else(|e| panic!("{what}: {e}"));
    fs.check_space_accounting()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Files of every kind with blocks on every target: copy-on-write (checksummed) and
/// NOCOW files, a clone sharing blocks with its source, preallocated (unwritten) space,
/// a sparse file, small files. Returns the oracle (name -> contents).
fn populate(fs: &Fs) -> HashMap<String, (Ino, Vec<u8>)> {
    let mut want = HashMap::new();
    for (i, name) in ["big", "medium", "small1", "small2"].iter().enumerate() {
        let len = [3 << 20, 700 << 10, 5000, 100][i];
        let ino = file(fs, name);
        let data = pattern(i as u64 + 1, 0, len);
        fs.write_at(ino, 0, &data).expect("write");
        want.insert((*name).to_string(), (ino, data));
    }
    let big = want["big"].0;
    let copy = file(fs, "clone");
    fs.clone_file(big, copy).expect("clone");
    want.insert("clone".into(), (copy, want["big"].1.clone()));
    let pre = file(fs, "prealloc");
    fs.fallocate(pre, FallocMode::Allocate, 0, 1 << 20)
        .expect("fallocate");
    let mut data = vec![0u8; 1 << 20];
    let part = pattern(9, 4096, 8192);
    fs.write_at(pre, 4096, &part).expect("write");
    data[4096..4096 + 8192].copy_from_slice(&part);
    want.insert("prealloc".into(), (pre, data));
    let sparse = file(fs, "sparse");
    let tail = pattern(10, 5 << 20, 3000);
    fs.write_at(sparse, 5 << 20, &tail).expect("write");
    let mut data = vec![0u8; (5 << 20) + 3000];
    data[5 << 20..].copy_from_slice(&tail);
    want.insert("sparse".into(), (sparse, data));
    fs.sync().expect("sync");
    want
}

fn verify(fs: &Fs, want: &HashMap<String, (Ino, Vec<u8>)>, what: &str) {
    for (name, (ino, data)) in want {
        let got = read_all(fs, *ino);
        assert_eq!(got.len(), data.len(), "{what}: {name}: size");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != data[i]) {
            panic!("{what}: {name}: byte {i} differs");
        }
    }
}

fn evacuation_empties_the_target(datacow: DataCow) {
    let s = sims(4, 64 << 20);
    mkfs(&dyns(&s));
    let (fs, _) = Fs::mount(dyns(&s), opts(datacow)).expect("mount");
    let want = populate(&fs);
    let before = fs.space_accounting()[EVACUATED.index()].extent_blocks;
    assert!(
        before > 0,
        "the population put blocks on target {EVACUATED}"
    );
    let mut steps = 0;
    let report = fs
        .evacuate(EVACUATED, &mut |_| steps += 1)
        .expect("evacuate");
    assert!(
        report.blocks >= before,
        "{report:?} moved less than the {before} blocks there"
    );
    assert!(steps > 0, "progress was reported");
    let t = &fs.space_accounting()[EVACUATED.index()];
    assert_eq!(
        (t.extent_blocks, t.meta_page_blocks, t.delalloc_blocks),
        (0, 0, 0),
        "{datacow:?}: the target is empty"
    );
    for (name, (ino, _)) in &want {
        assert_eq!(
            bytes_on(&fs, *ino, EVACUATED),
            0,
            "{name} left blocks there"
        );
    }
    verify(&fs, &want, "after the evacuation");
    all_checks(&fs, "after the evacuation");
    // The target takes nothing new while it stays read-only.
    let late = file(&fs, "late");
    let data = pattern(77, 0, 2 << 20);
    fs.write_at(late, 0, &data).expect("write");
    fs.sync().expect("sync");
    assert_eq!(
        bytes_on(&fs, late, EVACUATED),
        0,
        "a new file's blocks went there"
    );
    fs.unmount().expect("unmount");
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    let (fs, _) = Fs::mount(dyns(&s), opts(datacow)).expect("remount");
    verify(&fs, &want, "after a remount");
    assert_eq!(read_all(&fs, late), data);
    all_checks(&fs, "after a remount");
    let t = &fs.space_accounting()[EVACUATED.index()];
    assert_eq!(
        (t.extent_blocks, t.meta_page_blocks),
        (0, 0),
        "empty after a remount"
    );
}

#[test]
fn evacuation_empties_a_target_of_nocow_files() {
    evacuation_empties_the_target(DataCow::Off);
}

#[test]
fn evacuation_empties_a_target_of_checksummed_files() {
    evacuation_empties_the_target(DataCow::On);
}

#[test]
fn target_zero_and_missing_targets_are_refused_and_steps_need_a_begin() {
    let s = sims(2, 32 << 20);
    mkfs(&dyns(&s));
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount");
    let e = fs.evacuate_begin(TargetId(0)).unwrap_err().to_string();
    assert!(e.contains("target 0 holds the journal"), "{e}");
    let e = fs.evacuate_begin(TargetId(5)).unwrap_err().to_string();
    assert!(e.contains("does not exist"), "{e}");
    let e = fs
        .evacuate_step(TargetId(1), 1, 10)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not being evacuated"), "{e}");
    assert!(!fs.target_read_only(TargetId(1)));
}

#[test]
fn a_target_whose_data_does_not_fit_elsewhere_is_refused_and_stays_writable() {
    let s = sims(2, 16 << 20);
    mkfs(&dyns(&s));
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount");
    // Striped over both targets until the disk is nearly full.
    let f = file(&fs, "f");
    let mut off = 0u64;
    let chunk = pattern(3, 0, 1 << 20);
    while fs.write_at(f, off, &chunk).is_ok() && fs.sync().is_ok() {
        off += chunk.len() as u64;
    }
    let e = fs.evacuate_begin(TargetId(1)).unwrap_err().to_string();
    assert!(e.contains("other writable targets have"), "{e}");
    assert!(!fs.target_read_only(TargetId(1)), "refused: still writable");
}

/// Writers keep writing (buffered and direct, NOCOW files written in place) while the
/// target is evacuated: nothing written is lost and the target ends empty. The target
/// goes read-only first and the writers run a dozen rounds each before the blocks move,
/// so some of their in-place writes meet it read-only and are copied.
#[test]
fn writers_running_through_an_evacuation_lose_nothing() {
    let s = sims(4, 64 << 20);
    mkfs(&dyns(&s));
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount");
    let mut want = populate(&fs);
    let names = ["w0", "w1", "w2"];
    for (k, name) in names.iter().enumerate() {
        let ino = file(&fs, name);
        let data = pattern(100 + k as u64, 0, 2 << 20);
        fs.write_at(ino, 0, &data).expect("write");
        want.insert((*name).to_string(), (ino, data));
    }
    fs.sync().expect("sync");
    let finals = std::sync::Mutex::new(HashMap::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let rounds = std::sync::atomic::AtomicU64::new(0);
    fs.evacuate_begin(EVACUATED).expect("begin");
    std::thread::scope(|sc| {
        let writers: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let (ino, mut data) = want[*name].clone();
                let (fs, stop, finals, rounds) = (&fs, &stop, &finals, &rounds);
                sc.spawn(move || {
                    let mut round = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) || round < 4 {
                        let off = ((round * 37 + k as u64 * 11) % 500) * BS;
                        let bytes = pattern(1000 + round, off, 2 * BS as usize);
                        if round.is_multiple_of(2) {
                            fs.write_direct(ino, off, &bytes).expect("direct write");
                        } else {
                            fs.write_at(ino, off, &bytes).expect("write");
                        }
                        data[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
                        if round.is_multiple_of(3) {
                            fs.fsync(ino, SyncScope::Data).expect("fsync");
                        }
                        round += 1;
                        rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    finals
                        .lock()
                        .unwrap()
                        .insert((*name).to_string(), (ino, data));
                })
            })
            .collect();
        while rounds.load(std::sync::atomic::Ordering::Relaxed) < 36 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let report = fs.evacuate(EVACUATED, &mut |_| {}).expect("evacuate");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            w.join().expect("writer");
        }
        assert!(report.blocks > 0, "{report:?}");
    });
    want.extend(finals.into_inner().unwrap());
    fs.sync().expect("sync");
    // Writes after the evacuation's last pass went elsewhere: the target stays empty.
    let t = &fs.space_accounting()[EVACUATED.index()];
    assert_eq!(
        (t.extent_blocks, t.meta_page_blocks),
        (0, 0),
        "the target is empty"
    );
    verify(&fs, &want, "after the evacuation");
    all_checks(&fs, "after the evacuation");
    assert!(
        fs.status().nocow_read_only > 0,
        "some in-place write was turned into a copy"
    );
    fs.unmount().expect("unmount");
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck");
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

/// Holds the first write it is armed for after its submitter went on (as a device
/// completes later than submission); every other operation passes.
struct LateWrite {
    inner: Arc<dyn Target>,
    armed: std::sync::atomic::AtomicBool,
    held: std::sync::Mutex<Option<(IoOp, stripefs_target::Completion)>>,
}

impl std::fmt::Debug for LateWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateWrite")
    }
}

impl LateWrite {
    fn holding(&self) -> bool {
        self.held.lock().unwrap().is_some()
    }

    fn release(&self) {
        if let Some((op, done)) = self.held.lock().unwrap().take() {
            self.inner.submit(op, done);
        }
    }
}

impl Target for LateWrite {
    fn info(&self) -> &stripefs_target::TargetInfo {
        self.inner.info()
    }

    fn submit(&self, op: IoOp, done: stripefs_target::Completion) {
        let is_write = matches!(op, IoOp::Write { .. });
        if is_write && self.armed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            *self.held.lock().unwrap() = Some((op, done));
            return;
        }
        self.inner.submit(op, done);
    }
}

/// I-001-3: an in-place direct write admitted before the target went read-only, submitted
/// (its submitter has gone on, its mapper and inode lock are dropped) and still in flight
/// at the device, is waited for: the evacuation moves the extent only after it landed,
/// so the moved copy holds the write. Moving it while the write is in flight copies the
/// old bytes, and the write lands on the abandoned blocks: lost (what happens when the
/// per-file wait for registered I/O is left out).
#[test]
fn an_in_place_write_in_flight_is_never_moved_under() {
    let s: Vec<Arc<SimTarget>> = sims(3, 32 << 20);
    let late = Arc::new(LateWrite {
        inner: Arc::clone(&s[2]) as Arc<dyn Target>,
        armed: std::sync::atomic::AtomicBool::new(false),
        held: std::sync::Mutex::new(None),
    });
    let targets: Vec<Arc<dyn Target>> = vec![
        Arc::clone(&s[0]) as Arc<dyn Target>,
        Arc::clone(&s[1]) as Arc<dyn Target>,
        Arc::clone(&late) as Arc<dyn Target>,
    ];
    mkfs(&targets);
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("mount");
    let f = file(&fs, "f");
    let old = pattern(1, 0, 1 << 20);
    fs.write_at(f, 0, &old).expect("write");
    fs.sync().expect("sync");
    // A block of `f` on target 2, overwritten in place by a direct write.
    let r = fs
        .extents(f)
        .expect("extents")
        .into_iter()
        .find(|r| r.target == EVACUATED.0 && r.written)
        .expect("a block on target 2");
    let at = r.file_off;
    let new = pattern(2, at, BS as usize);
    let in_place = fs.status().nocow_in_place;
    late.armed.store(true, std::sync::atomic::Ordering::Release);
    std::thread::scope(|sc| {
        let w = sc.spawn(|| fs.write_direct(f, at, &new));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !late.holding() {
            assert!(Instant::now() < deadline, "the write reached the device");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(fs.status().nocow_in_place, in_place + 1, "written in place");
        let ev = sc.spawn(|| fs.evacuate(EVACUATED, &mut |_| {}));
        // The evacuation waits for the write (right) or moves the extent under it.
        let deadline = Instant::now() + Duration::from_millis(400);
        while !ev.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let still_there = bytes_on(&fs, f, EVACUATED);
        late.release();
        w.join().expect("writer").expect("direct write");
        ev.join().expect("evacuation").expect("evacuate");
        assert!(
            still_there > 0,
            "an extent was moved off the target while an in-place write to it was in flight"
        );
    });
    let mut want = old;
    want[at as usize..at as usize + new.len()].copy_from_slice(&new);
    assert_eq!(
        read_all(&fs, f),
        want,
        "the in-place write survived the move"
    );
    assert_eq!(bytes_on(&fs, f, EVACUATED), 0);
    all_checks(&fs, "after the evacuation");
}

/// A direct write of part of a block (512 bytes of a 1 KiB block) of a NOCOW file, on a
/// target that went read-only: the write must copy the block, and the copy keeps the
/// block's other bytes. Found by `model_ops`' evacuations (`nocow_audit_bs1k_locked`).
#[test]
fn a_sub_block_direct_write_on_a_read_only_target_keeps_the_rest_of_the_block() {
    let s = sims(3, 32 << 20);
    let opts = MkfsOptions {
        block_size: 1024,
        stripe_unit: 16 << 10,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).expect("mkfs");
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount");
    let f = file(&fs, "f");
    let mut want = pattern(1, 0, 256 << 10);
    fs.write_at(f, 0, &want).expect("write");
    fs.sync().expect("sync");
    let at = fs
        .extents(f)
        .expect("extents")
        .into_iter()
        .find(|r| r.target == EVACUATED.0 && r.written)
        .expect("a block on target 2")
        .file_off;
    fs.evacuate_begin(EVACUATED).expect("begin");
    let new = pattern(2, at, 512);
    fs.write_direct(f, at, &new).expect("direct write");
    want[at as usize..at as usize + 512].copy_from_slice(&new);
    assert_eq!(fs.status().nocow_read_only, 1, "the write copied");
    let got = read_all(&fs, f);
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("byte {i} differs (the direct write was at {at})");
    }
    all_checks(&fs, "after the write");
}

/// Truncate's zeroing of the EOF block's tail is an in-place write: on a read-only
/// target it is refused admission and zeroes a copy on a writable target instead; the
/// bytes past the new size read as zeros after the file grows again.
#[test]
fn truncate_zeroes_an_eof_block_on_a_read_only_target_in_a_copy() {
    let s = sims(4, 64 << 20);
    mkfs(&dyns(&s));
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount");
    let f = file(&fs, "f");
    let data = pattern(5, 0, 1 << 20);
    fs.write_at(f, 0, &data).expect("write");
    fs.sync().expect("sync");
    let r = fs
        .extents(f)
        .expect("extents")
        .into_iter()
        .find(|r| r.target == EVACUATED.0 && r.written)
        .expect("a block on target 2");
    fs.evacuate_begin(EVACUATED).expect("begin");
    let before = bytes_on(&fs, f, EVACUATED);
    let cut = r.file_off + 100;
    fs.set_len(f, cut).expect("truncate");
    let after = bytes_on(&fs, f, EVACUATED);
    assert!(
        after < before,
        "the EOF block stayed on the read-only target"
    );
    let eof = fs
        .extents(f)
        .expect("extents")
        .into_iter()
        .find(|r| r.file_off < cut && cut - 1 < r.file_off + r.len)
        .expect("the EOF block is mapped");
    assert_ne!(eof.target, EVACUATED.0, "the zeroed copy is elsewhere");
    fs.set_len(f, cut + BS).expect("extend");
    let got = read_all(&fs, f);
    assert_eq!(&got[..cut as usize], &data[..cut as usize]);
    assert!(
        got[cut as usize..].iter().all(|&b| b == 0),
        "zeros past the old size"
    );
    all_checks(&fs, "after the truncate");
}

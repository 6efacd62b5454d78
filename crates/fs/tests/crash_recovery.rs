//! Crash test: seeded workloads run on recording targets; the image is rebuilt at every
//! durability point — each flush and each FUA write (journal records, checkpoint headers)
//! — once with unflushed writes dropped, once with them torn and reordered, and at each
//! FUA write also with that write caught in flight (lost or torn); each image is mounted
//! (recovery), checked with fsck, and verified: every fsynced and since untouched file
//! reads back exactly, no byte that was never written is visible, and renames are atomic.
//! A sample of points also crashes *during* recovery and recovers again.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{Checkpoints, CreateParams, Fs, Ino, MkfsOptions, MountOptions, RenameMode};
use stripefs_target::{Recorder, Rng, SimTarget, UnflushedPolicy};

const NTARGETS: usize = 3;
const TARGET_BYTES: u64 = 8 << 20;
const NAMES: u64 = 6;

#[derive(Clone)]
struct Write {
    off: u64,
    len: u64,
    seed: u64,
}

#[derive(Clone)]
struct FileState {
    name: Option<String>,
    content: Vec<u8>,
    /// Each change (write, truncate, rename, unlink): (operation number, event index at
    /// which it started). Its events, if any reached the image, have indices at or after
    /// it. Operation numbers order operations that emitted no events.
    changes: Vec<(u64, usize)>,
    /// Each fsync (or sync): operation number, event count when it returned, content and
    /// name then.
    snaps: Vec<(u64, usize, Vec<u8>, String)>,
}

impl FileState {
    fn new(name: String) -> Self {
        Self {
            name: Some(name),
            content: Vec::new(),
            changes: Vec::new(),
            snaps: Vec::new(),
        }
    }

    /// The content this file must have after a crash at `cut`, if it is determined: the
    /// last fsync that returned before the crash, with no change started since.
    fn durable_at(&self, cut: Cut) -> Option<(&[u8], &str)> {
        let (op, _, content, name) = self
            .snaps
            .iter()
            .rev()
            .find(|(_, at, _, _)| *at <= cut.returned)?;
        (!self.changed_after(*op, cut)).then_some((content, name))
    }

    /// True if a change after operation `op` may have reached the image at `cut`.
    fn changed_after(&self, op: u64, cut: Cut) -> bool {
        self.changes
            .iter()
            .any(|&(o, c)| o > op && c <= cut.started)
    }
}

/// Where a crash cut the event log.
#[derive(Clone, Copy, Debug)]
struct Cut {
    /// An fsync that returned when at most this many events were logged is durable.
    returned: usize,
    /// A change that started at or before this event index may be in the image.
    started: usize,
}

impl Cut {
    /// Power lost right after event `p` completed.
    fn after(p: usize) -> Self {
        Self {
            returned: p + 1,
            started: p,
        }
    }

    /// Power lost while event `p` (a write) was in flight: it may be in the image, in
    /// part or whole, but nothing waiting for it returned.
    fn during(p: usize) -> Self {
        Self {
            returned: p,
            started: p,
        }
    }
}

struct RenameCheck {
    op: u64,
    start: usize,
    end: usize,
    src: String,
    dst: String,
    src_content: Vec<u8>,
    dst_content: Vec<u8>,
    src_id: usize,
    dst_id: usize,
}

struct Workload {
    files: Vec<FileState>,
    writes: Vec<Write>,
    renames: Vec<RenameCheck>,
}

fn run_workload(fs: &Fs, rec: &Recorder, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let mut w = Workload {
        files: Vec::new(),
        writes: Vec::new(),
        renames: Vec::new(),
    };
    let now = || rec.events().len();
    let mut inos: Vec<Ino> = Vec::new();
    for i in 0..NAMES {
        let name = format!("f{i}");
        let a = fs
            .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
        inos.push(a.ino);
        w.files.push(FileState::new(name));
    }
    for opno in 0..120u64 {
        let live: Vec<usize> = (0..w.files.len())
            .filter(|&i| w.files[i].name.is_some())
            .collect();
        let id = live[rng.below(live.len() as u64) as usize];
        let start = now();
        let op = rng.below(20);
        if std::env::var_os("CRASH_DEBUG").is_some() {
            eprintln!("[{start}] op {op} on {:?} (id {id})", w.files[id].name);
        }
        match op {
            0 | 1 => {
                // Direct write (sector-aligned), into holes, unwritten or written blocks.
                let size = w.files[id].content.len() as u64;
                let off = rng.below(size + 20_000) / 512 * 512;
                let len = rng.range(1, 80) * 512;
                let s = rng.next_u64();
                fs.write_direct(inos[id], off, &pattern(s, off, len as usize))
                    .unwrap();
                w.writes.push(Write { off, len, seed: s });
                let c = &mut w.files[id].content;
                if (c.len() as u64) < off + len {
                    c.resize((off + len) as usize, 0);
                }
                c[off as usize..(off + len) as usize].copy_from_slice(&pattern(
                    s,
                    off,
                    len as usize,
                ));
                w.files[id].changes.push((opno, start));
            }
            2..=8 => {
                let size = w.files[id].content.len() as u64;
                let off = rng.below(size + 20_000);
                let len = rng.range(1, 40_000);
                let s = rng.next_u64();
                fs.write_at(inos[id], off, &pattern(s, off, len as usize))
                    .unwrap();
                w.writes.push(Write { off, len, seed: s });
                let c = &mut w.files[id].content;
                if (c.len() as u64) < off + len {
                    c.resize((off + len) as usize, 0);
                }
                c[off as usize..(off + len) as usize].copy_from_slice(&pattern(
                    s,
                    off,
                    len as usize,
                ));
                w.files[id].changes.push((opno, start));
            }
            9..=12 => {
                fs.fsync(
                    inos[id],
                    if rng.one_in(3) {
                        stripefs::SyncScope::Data
                    } else {
                        stripefs::SyncScope::All
                    },
                )
                .unwrap();
                let f = &mut w.files[id];
                f.snaps
                    .push((opno, now(), f.content.clone(), f.name.clone().unwrap()));
            }
            13..=14 => {
                let size = w.files[id].content.len() as u64;
                let n = rng.below(size + 5000);
                fs.set_len(inos[id], n).unwrap();
                w.files[id].content.resize(n as usize, 0);
                w.files[id].changes.push((opno, start));
            }
            15..=16 => {
                let other = live[rng.below(live.len() as u64) as usize];
                if other == id {
                    continue;
                }
                let (src, dst) = (
                    w.files[id].name.clone().unwrap(),
                    w.files[other].name.clone().unwrap(),
                );
                fs.rename(
                    Ino::ROOT,
                    src.as_ref(),
                    Ino::ROOT,
                    dst.as_ref(),
                    RenameMode::Replace,
                )
                .unwrap();
                w.renames.push(RenameCheck {
                    op: opno,
                    start,
                    end: now(),
                    src: src.clone(),
                    dst: dst.clone(),
                    src_content: w.files[id].content.clone(),
                    dst_content: w.files[other].content.clone(),
                    src_id: id,
                    dst_id: other,
                });
                w.files[other].name = None;
                w.files[other].changes.push((opno, start));
                w.files[id].name = Some(dst);
                w.files[id].changes.push((opno, start));
                let name = format!("n{}", w.files.len());
                let a = fs
                    .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
                    .unwrap();
                inos.push(a.ino);
                w.files.push(FileState::new(name));
            }
            18 => {
                // Preallocation: later writes into it convert unwritten extents at
                // writeback completion, another ordered-data step a crash can cut.
                let size = w.files[id].content.len() as u64;
                let off = rng.below(size + 30_000);
                let len = rng.range(1, 60_000);
                let keep = rng.one_in(2);
                let mode = if keep {
                    stripefs::FallocMode::KeepSize
                } else {
                    stripefs::FallocMode::Allocate
                };
                fs.fallocate(inos[id], mode, off, len).unwrap();
                if !keep && off + len > size {
                    w.files[id].content.resize((off + len) as usize, 0);
                    w.files[id].changes.push((opno, start));
                }
            }
            17 => {
                fs.sync().unwrap();
                let t = now();
                for f in w.files.iter_mut().filter(|f| f.name.is_some()) {
                    f.snaps
                        .push((opno, t, f.content.clone(), f.name.clone().unwrap()));
                }
            }
            _ => {
                let name = w.files[id].name.clone().unwrap();
                fs.unlink(Ino::ROOT, name.as_ref()).unwrap();
                w.files[id].name = None;
                w.files[id].changes.push((opno, start));
                let new = format!("n{}", w.files.len());
                let a = fs
                    .create(Ino::ROOT, new.as_ref(), CreateParams::with_perm(0o644))
                    .unwrap();
                inos.push(a.ino);
                w.files.push(FileState::new(new));
            }
        }
    }
    w
}

fn read_all(fs: &Fs, name: &str) -> Option<Vec<u8>> {
    let a = fs.lookup(Ino::ROOT, name.as_ref()).ok()?;
    let mut buf = vec![0u8; a.size as usize];
    let n = fs.read_at(a.ino, 0, &mut buf).expect("read after recovery");
    assert_eq!(n as u64, a.size);
    Some(buf)
}

/// Every byte is zero or a value some write put at that offset.
fn only_written_bytes(w: &Workload, name: &str, data: &[u8]) {
    for (i, &b) in data.iter().enumerate() {
        if b == 0 {
            continue;
        }
        let o = i as u64;
        let ok = w
            .writes
            .iter()
            .any(|x| o >= x.off && o < x.off + x.len && pattern(x.seed, o, 1)[0] == b);
        assert!(
            ok,
            "{name}: byte {i} = {b:#x} was never written there (stale data exposed)"
        );
    }
}

fn verify(fs: &Fs, w: &Workload, cut: Cut, what: &str) {
    for entry in fs.readdir(Ino::ROOT).unwrap() {
        let name = String::from_utf8(entry.name).unwrap();
        let data = read_all(fs, &name).unwrap();
        only_written_bytes(w, &name, &data);
    }
    for f in &w.files {
        let Some((content, name)) = f.durable_at(cut) else {
            continue;
        };
        let got = read_all(fs, name).unwrap_or_else(|| {
            let names: Vec<String> = fs
                .readdir(Ino::ROOT)
                .unwrap()
                .into_iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect();
            panic!(
                "{what}: fsynced {name} missing; directory holds {names:?}; changes {:?}",
                f.changes
            )
        });
        assert!(
            got == *content,
            "{what}: fsynced {name} differs ({} vs {} bytes)",
            got.len(),
            content.len()
        );
    }
    for r in &w.renames {
        if r.start > cut.started {
            continue;
        }
        // Both sides durable and unchanged right up to the rename, and nothing touched them
        // or their names between the rename and the crash.
        let durable_before = |id: usize, content: &[u8]| {
            let f = &w.files[id];
            let snap = f
                .snaps
                .iter()
                .rev()
                .find(|(o, at, _, _)| *o < r.op && *at <= cut.returned);
            snap.is_some_and(|(o, _, c, _)| {
                c == content && !f.changes.iter().any(|&(co, _)| co > *o && co < r.op)
            })
        };
        let later = |id: usize| w.files[id].changed_after(r.op, cut);
        let names_reused = w.renames.iter().any(|o| {
            o.op > r.op
                && o.start <= cut.started
                && [&o.src, &o.dst]
                    .iter()
                    .any(|n| **n == r.src || **n == r.dst)
        });
        if !durable_before(r.src_id, &r.src_content)
            || !durable_before(r.dst_id, &r.dst_content)
            || later(r.src_id)
            || names_reused
        {
            continue;
        }
        let dst = read_all(fs, &r.dst)
            .unwrap_or_else(|| panic!("{what}: rename target {} vanished", r.dst));
        let src = read_all(fs, &r.src);
        let new_state = dst == r.src_content && src.is_none();
        let old_state = dst == r.dst_content && src.as_deref() == Some(&r.src_content[..]);
        assert!(
            new_state || old_state,
            "{what}: rename {} -> {} (events {}..{}) is not atomic: dst has {} bytes (src content {}, old dst {}), src {:?}; src changes {:?} snaps {:?}; dst changes {:?} snaps {:?}",
            r.src, r.dst, r.start, r.end, dst.len(), r.src_content.len(), r.dst_content.len(), src.as_ref().map(Vec::len),
            w.files[r.src_id].changes, w.files[r.src_id].snaps.iter().map(|s| (s.0, s.1, s.2.len())).collect::<Vec<_>>(),
            w.files[r.dst_id].changes, w.files[r.dst_id].snaps.iter().map(|s| (s.0, s.1, s.2.len())).collect::<Vec<_>>()
        );
    }
}

fn mount_images(images: &[Vec<u8>]) -> (Vec<Arc<SimTarget>>, Fs) {
    let sims: Vec<Arc<SimTarget>> = images
        .iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("sim{i}"), img.clone(), 512)))
        .collect();
    let (fs, _) = Fs::mount(dyns(&sims), quiet()).expect("recovery mount");
    (sims, fs)
}

fn fsck_clean(sims: &[Arc<SimTarget>], what: &str) {
    let r = stripefs::fsck::fsck(dyns(sims), &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
}

/// Crashes during recovery at each of its durability points and recovers again.
fn crash_during_recovery(images: &[Vec<u8>], w: &Workload, cut: Cut) -> usize {
    let rec = Recorder::new();
    let sims: Vec<Arc<SimTarget>> = images
        .iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("r{i}"), img.clone(), 512)))
        .collect();
    let wrapped = recorded(&sims, &rec);
    let (fs, _) = Fs::mount(wrapped, quiet()).expect("first recovery");
    std::mem::forget(fs);
    let pts = rec.durability_points();
    for &p in &pts {
        let again = rec.images_at(images, p + 1, UnflushedPolicy::Drop, 512);
        let (s2, fs2) = mount_images(&again);
        verify(&fs2, w, cut, "crash during recovery");
        drop(fs2);
        fsck_clean(&s2, "crash during recovery");
    }
    pts.len()
}

fn crash_points(seed: u64, bs: u32) -> usize {
    crash_points_with(seed, bs, Checkpoints::Inline).0
}

/// Runs the seeded workload with checkpoints where `checkpoints` says, then crashes at
/// every durability point; returns the points covered and the checkpoints the
/// checkpointer thread wrote (those not written by a committer finding the journal full).
fn crash_points_with(seed: u64, bs: u32, checkpoints: Checkpoints) -> (usize, u64) {
    let sims = sims(NTARGETS, TARGET_BYTES);
    let opts = MkfsOptions {
        block_size: bs,
        stripe_unit: bs * 4,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&sims), &opts).unwrap();
    let initial: Vec<Vec<u8>> = sims.iter().map(|s| s.durable_image()).collect();
    let rec = Recorder::new();
    let wrapped = recorded(&sims, &rec);
    let opts = MountOptions {
        checkpoints,
        ..quiet()
    };
    let (fs, _) = Fs::mount(wrapped, opts).unwrap();
    let w = run_workload(&fs, &rec, seed);
    let st = fs.status();
    let by_thread = st.checkpoints - st.journal_full_checkpoints;
    match checkpoints {
        Checkpoints::Inline => std::mem::forget(fs),
        // Stops the checkpointer (its last checkpoint's points are crash points too), so
        // that nothing writes to the recorder while the images are built.
        Checkpoints::Background => fs.unmount().unwrap(),
    }
    let mut covered = 0;
    for (k, p) in rec.durability_points().into_iter().enumerate() {
        for policy in [
            UnflushedPolicy::Drop,
            UnflushedPolicy::Tear {
                seed: seed ^ p as u64,
            },
        ] {
            let images = rec.images_at(&initial, p + 1, policy, 512);
            let what = format!("seed {seed} bs {bs} crash after event {p} ({policy:?})");
            let (s2, fs2) = mount_images(&images);
            verify(&fs2, &w, Cut::after(p), &what);
            drop(fs2);
            fsck_clean(&s2, &what);
            covered += 1;
            if k % 25 == 0 && policy == UnflushedPolicy::Drop {
                covered += crash_during_recovery(&images, &w, Cut::after(p));
            }
        }
    }
    for p in rec.fua_points() {
        // The FUA write was not durable yet: the crash came while it was in flight.
        let images = rec.images_in_flight(&initial, p, seed ^ (p as u64) << 1, 512);
        let what = format!("seed {seed} bs {bs} crash during FUA write {p}");
        let (s2, fs2) = mount_images(&images);
        verify(&fs2, &w, Cut::during(p), &what);
        drop(fs2);
        fsck_clean(&s2, &what);
        covered += 1;
    }
    (covered, by_thread)
}

#[test]
fn every_flush_point_recovers_4k() {
    let total: usize = (0..6).map(|s| crash_points(100 + s, 4096)).sum();
    eprintln!("crash points covered (4k blocks): {total}");
    assert!(
        total > 500,
        "workloads produced too few crash points: {total}"
    );
}

#[test]
fn every_flush_point_recovers_1k() {
    let total: usize = (0..4).map(|s| crash_points(200 + s, 1024)).sum();
    eprintln!("crash points covered (1k blocks): {total}");
    assert!(
        total > 300,
        "workloads produced too few crash points: {total}"
    );
}

/// The same sweep with the checkpointer thread running, as mounts run by default: its
/// checkpoints interleave with the workload's commits wherever the scheduler puts them,
/// so each seed's schedule differs from run to run; every point of the schedule that
/// happened is crashed at, and a failure names its seed and event. With a 64 KiB journal
/// the thread writes checkpoints within each workload.
#[test]
fn every_flush_point_recovers_with_the_background_checkpointer() {
    let mut total = 0;
    let mut by_thread = 0;
    for seed in 0..6 {
        let (covered, thread) = crash_points_with(300 + seed, 4096, Checkpoints::Background);
        total += covered;
        by_thread += thread;
    }
    eprintln!("crash points covered (background checkpoints): {total}, {by_thread} by the thread");
    assert!(by_thread > 0, "the checkpointer thread wrote no checkpoint");
    assert!(
        total > 500,
        "workloads produced too few crash points: {total}"
    );
}

/// Names of the tree-split workload: (name, event index its create started at, event
/// count when the sync after it returned, and the same for its unlink if any).
struct Named {
    name: String,
    created: (usize, usize),
    unlinked: Option<(usize, usize)>,
}

/// Crash at every flush and FUA point of a workload whose checkpoints split the fs tree's
/// leaves (300 creates in one directory, a checkpoint, and journal-full checkpoints on the
/// way) and then merge them (250 unlinks, a checkpoint): every acknowledged create and
/// unlink survives, nothing unacknowledged is half there, and fsck (which walks and
/// verifies every page) is clean.
#[test]
fn every_flush_point_across_checkpoints_that_split_and_merge_tree_pages() {
    let sims = sims(NTARGETS, TARGET_BYTES);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&sims), &opts).unwrap();
    let initial: Vec<Vec<u8>> = sims.iter().map(|s| s.durable_image()).collect();
    let rec = Recorder::new();
    let wrapped = recorded(&sims, &rec);
    let (fs, _) = Fs::mount(wrapped, quiet()).unwrap();
    let now = || rec.events().len();
    let mut names: Vec<Named> = Vec::new();
    let mut pending = Vec::new();
    for i in 0..300 {
        let name = format!("entry-with-a-longish-name-{i:05}");
        let start = now();
        fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
        pending.push((name, start));
        if i % 25 == 24 {
            fs.sync().unwrap();
            let acked = now();
            names.extend(pending.drain(..).map(|(name, s)| Named {
                name,
                created: (s, acked),
                unlinked: None,
            }));
        }
    }
    fs.checkpoint().unwrap();
    let split_at = now();
    for i in 0..250 {
        let start = now();
        fs.unlink(Ino::ROOT, names[i].name.as_ref()).unwrap();
        names[i].unlinked = Some((start, usize::MAX));
        if i % 25 == 24 {
            fs.sync().unwrap();
            let acked = now();
            for n in names_unacked(&mut names[..=i]) {
                n.1 = acked;
            }
        }
    }
    fs.checkpoint().unwrap();
    std::mem::forget(fs);

    // The first explicit checkpoint left a fs tree of more than one leaf.
    let images = rec.images_at(&initial, split_at, UnflushedPolicy::Drop, 512);
    let (s2, fs2) = mount_images(&images);
    drop(fs2);
    let shape = stripefs::fsck::inspect(dyns(&s2)).unwrap();
    let fs_tree = shape
        .trees
        .iter()
        .find(|t| t.tree == stripefs_core::btree::TreeId::Fs)
        .unwrap();
    assert!(fs_tree.root_level >= 1, "no split: {fs_tree:?}");

    let mut covered = 0;
    for p in rec.durability_points() {
        for policy in [
            UnflushedPolicy::Drop,
            UnflushedPolicy::Tear { seed: p as u64 },
        ] {
            let images = rec.images_at(&initial, p + 1, policy, 512);
            let what = format!("crash after event {p} ({policy:?})");
            let (s2, fs2) = mount_images(&images);
            check_names(&fs2, &names, Cut::after(p), &what);
            drop(fs2);
            fsck_clean(&s2, &what);
            covered += 1;
        }
    }
    for p in rec.fua_points() {
        let images = rec.images_in_flight(&initial, p, (p as u64) << 1, 512);
        let what = format!("crash during FUA write {p}");
        let (s2, fs2) = mount_images(&images);
        check_names(&fs2, &names, Cut::during(p), &what);
        drop(fs2);
        fsck_clean(&s2, &what);
        covered += 1;
    }
    eprintln!("crash points covered (tree splits and merges): {covered}");
    assert!(covered > 40, "too few crash points: {covered}");
}

/// The unlinks of `names` whose sync has not returned yet.
fn names_unacked(names: &mut [Named]) -> impl Iterator<Item = &mut (usize, usize)> {
    names
        .iter_mut()
        .filter_map(|n| n.unlinked.as_mut())
        .filter(|u| u.1 == usize::MAX)
}

fn check_names(fs: &Fs, names: &[Named], cut: Cut, what: &str) {
    for n in names {
        let present = fs.lookup(Ino::ROOT, n.name.as_ref()).is_ok();
        let created = n.created.1 <= cut.returned;
        let unlink_started = n.unlinked.is_some_and(|u| u.0 <= cut.started);
        let unlinked = n.unlinked.is_some_and(|u| u.1 <= cut.returned);
        if unlinked || n.created.0 > cut.started {
            assert!(!present, "{what}: {} is back", n.name);
        } else if created && !unlink_started {
            assert!(present, "{what}: acknowledged {} is lost", n.name);
        }
    }
}

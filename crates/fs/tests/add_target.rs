//! `add-target` (issue 13, `docs/design/targets.md`): a mounted file system grows by one
//! target; new files stripe over it, old files read back, the add survives remounts and
//! a crash at every flush and FUA point, mount names a member whose path is missing, and
//! targets that cannot join are refused.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{CreateParams, Fs, FsError, Ino, MkfsOptions, StripeLayout, SyncScope, TargetId};
use stripefs_target::{IoBuf, Recorder, RecordingTarget, SimTarget, Target, UnflushedPolicy};

const MB: u64 = 1 << 20;

fn file(fs: &Fs, name: &str, layout: Option<StripeLayout>) -> Ino {
    let mut p = CreateParams::with_perm(0o644);
    p.layout = layout;
    fs.create(Ino::ROOT, name.as_ref(), p).expect("create").ino
}

/// Striped over every one of `n` targets, 64 KiB units.
fn over_all(n: u32) -> Option<StripeLayout> {
    Some(StripeLayout {
        count: n,
        unit_bytes: 64 << 10,
        first_target: 0,
    })
}

fn read_all(fs: &Fs, ino: Ino) -> Vec<u8> {
    let size = fs.getattr(ino).expect("getattr").size;
    let mut buf = vec![0u8; size as usize];
    let n = fs.read_at(ino, 0, &mut buf).expect("read");
    assert_eq!(n as u64, size, "short read");
    buf
}

fn lookup(fs: &Fs, name: &str) -> Option<Ino> {
    match fs.lookup(Ino::ROOT, name.as_ref()) {
        Ok(a) => Some(a.ino),
        Err(FsError::NotFound) => None,
        Err(e) => panic!("lookup {name}: {e}"),
    }
}

fn fsck_clean(targets: Vec<Arc<dyn Target>>, what: &str) {
    let r = stripefs::fsck::fsck(targets, &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
}

fn books(fs: &Fs, what: &str) {
    fs.check_space_accounting()
        .unwrap_or_else(|e| panic!("{what}: space books: {e}"));
    fs.check_refcounts()
        .unwrap_or_else(|e| panic!("{what}: refcounts: {e}"));
}

fn on_target(fs: &Fs, ino: Ino, t: u32) -> bool {
    fs.extents(ino).unwrap().iter().any(|r| r.target == t)
}

fn new_sim(name: &str, bytes: u64) -> Arc<SimTarget> {
    Arc::new(SimTarget::from_image(
        name,
        vec![GARBAGE; bytes as usize],
        512,
    ))
}

#[test]
fn added_target_takes_new_files_and_survives_remounts() {
    let s = sims(3, 32 * MB);
    let fs = fresh(&s, 4096, 64 << 10);
    let a = file(&fs, "a", None);
    let da = pattern(1, 0, 3 << 20);
    fs.write_at(a, 0, &da).unwrap();
    // Dirty, not yet written back: the add writes it back first (no reservation spans
    // the change of member count).
    let before = fs.statfs().unwrap();
    let extra = new_sim("new", 48 * MB);
    let id = fs
        .add_target(Arc::clone(&extra) as Arc<dyn Target>)
        .unwrap();
    assert_eq!(id, TargetId(3));
    assert_eq!(fs.targets().len(), 4);
    let after = fs.statfs().unwrap();
    assert!(
        after.blocks > before.blocks + (40 * MB) / 4096,
        "statfs grows: {} -> {}",
        before.blocks,
        after.blocks
    );
    assert!(read_all(&fs, a) == da, "old file reads back");
    books(&fs, "after the add");

    let b = file(&fs, "b", over_all(4));
    let db = pattern(2, 0, 2 << 20);
    fs.write_at(b, 0, &db).unwrap();
    fs.fsync(b, SyncScope::All).unwrap();
    assert!(
        on_target(&fs, b, 3),
        "a file over all targets has blocks on the new one"
    );
    // Default files spread their first target over the new member too.
    let mut firsts = Vec::new();
    for i in 0..8 {
        let f = file(&fs, &format!("d{i}"), None);
        fs.write_at(f, 0, &pattern(10 + i, 0, 8192)).unwrap();
        firsts.push(fs.getattr(f).unwrap().layout.unwrap().first_target);
    }
    assert!(
        firsts.contains(&3),
        "new files start on the new target too: {firsts:?}"
    );
    books(&fs, "after writes");
    fs.unmount().unwrap();

    let mut all = dyns(&s);
    all.push(Arc::clone(&extra) as Arc<dyn Target>);
    fsck_clean(all.clone(), "after unmount");
    // Any order.
    let mut shuffled = all.clone();
    shuffled.swap(0, 3);
    let (fs, rep) = Fs::mount(shuffled, quiet()).unwrap();
    assert!(rep.ignored_targets.is_empty());
    assert_eq!(fs.targets().len(), 4);
    assert!(
        read_all(&fs, lookup(&fs, "a").unwrap()) == da,
        "a after remount"
    );
    assert!(
        read_all(&fs, lookup(&fs, "b").unwrap()) == db,
        "b after remount"
    );
    books(&fs, "after remount");
    fs.unmount().unwrap();

    let err = Fs::mount(dyns(&s), quiet()).expect_err("mount without the new target");
    let msg = err.to_string();
    assert!(
        msg.contains("target index 3") && msg.contains("give its path"),
        "names the missing member: {msg}"
    );
}

#[test]
fn a_member_added_only_in_the_journal_is_named_when_missing() {
    let s = sims(2, 32 * MB);
    let fs = fresh(&s, 4096, 64 << 10);
    let extra = new_sim("new", 32 * MB);
    fs.add_target(Arc::clone(&extra) as Arc<dyn Target>)
        .unwrap();
    // Crash now: the add is in the journal only (no checkpoint since).
    let mut images: Vec<Arc<SimTarget>> = s
        .iter()
        .chain([&extra])
        .enumerate()
        .map(|(i, t)| {
            Arc::new(SimTarget::from_image(
                &format!("c{i}"),
                t.durable_image(),
                512,
            ))
        })
        .collect();
    drop(fs);
    let added = images.pop().unwrap();
    let err = Fs::mount(dyns(&images), quiet()).expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("adds target 2") && msg.contains("give its path"),
        "names the journal's add: {msg}"
    );
    images.push(added);
    let (fs, rep) = Fs::mount(dyns(&images), quiet()).unwrap();
    assert_eq!(rep.replayed_txns, 1, "the add replays");
    assert_eq!(fs.targets().len(), 3);
    books(&fs, "after replay");
    fs.unmount().unwrap();
    fsck_clean(dyns(&images), "after replay");
}

#[test]
fn writers_during_the_add_lose_nothing() {
    let s = sims(2, 64 * MB);
    let fs = fresh(&s, 4096, 64 << 10);
    let extra = new_sim("new", 64 * MB);
    let files: Vec<Ino> = (0..4).map(|i| file(&fs, &format!("w{i}"), None)).collect();
    let rounds = 24u64;
    // Direct writes go past the buffered ones, a block per fourth round.
    let base = (rounds * 40_000).next_multiple_of(4096);
    std::thread::scope(|sc| {
        for (k, &ino) in files.iter().enumerate() {
            let fs = &fs;
            sc.spawn(move || {
                for r in 0..rounds {
                    let off = r * 40_000;
                    let d = pattern(k as u64 * 1000 + r, off, 40_000);
                    fs.write_at(ino, off, &d).unwrap();
                    if r % 4 == 0 {
                        let at = base + (r / 4) * 4096;
                        fs.write_direct(ino, at, &pattern(k as u64 + r, at, 4096))
                            .unwrap();
                        fs.fsync(ino, SyncScope::All).unwrap();
                    }
                    let mut back = vec![0u8; 40_000];
                    fs.read_at(ino, off, &mut back).unwrap();
                    assert!(back == d, "file {k} round {r} reads back");
                }
            });
        }
        let fs = &fs;
        let extra = Arc::clone(&extra);
        sc.spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            fs.add_target(extra as Arc<dyn Target>).unwrap();
        });
    });
    assert_eq!(fs.targets().len(), 3);
    let expect = |k: usize| {
        let mut c = vec![0u8; (base + rounds.div_ceil(4) * 4096) as usize];
        for r in 0..rounds {
            let off = r * 40_000;
            let d = pattern(k as u64 * 1000 + r, off, 40_000);
            c[off as usize..off as usize + 40_000].copy_from_slice(&d);
            if r % 4 == 0 {
                let at = base + (r / 4) * 4096;
                let w = pattern(k as u64 + r, at, 4096);
                c[at as usize..at as usize + 4096].copy_from_slice(&w);
            }
        }
        c
    };
    for (k, &ino) in files.iter().enumerate() {
        assert!(read_all(&fs, ino) == expect(k), "file {k}");
    }
    books(&fs, "after the concurrent add");
    fs.unmount().unwrap();
    let mut all = dyns(&s);
    all.push(extra as Arc<dyn Target>);
    fsck_clean(all.clone(), "after the concurrent add");
    let (fs, _) = Fs::mount(all, quiet()).unwrap();
    for (k, &ino) in files.iter().enumerate() {
        assert!(read_all(&fs, ino) == expect(k), "file {k} after remount");
    }
    fs.unmount().unwrap();
}

#[test]
fn targets_that_cannot_join_are_refused() {
    let s = sims(2, 32 * MB);
    let fs = fresh(&s, 4096, 64 << 10);
    // Another file system's target.
    let other = sims(1, 16 * MB);
    Fs::mkfs(&dyns(&other), &MkfsOptions::default()).unwrap();
    let err = fs
        .add_target(Arc::clone(&other[0]) as Arc<dyn Target>)
        .unwrap_err();
    assert!(err.to_string().contains("belongs to file system"), "{err}");
    // A member.
    let err = fs
        .add_target(Arc::clone(&s[1]) as Arc<dyn Target>)
        .unwrap_err();
    assert!(err.to_string().contains("already"), "{err}");
    // A damaged stripefs superblock.
    let damaged = new_sim("damaged", 16 * MB);
    let mut sb = fs_superblock(&s[1]);
    sb[100] ^= 0x40;
    damaged.write_sync(0, IoBuf::from_slice(&sb)).unwrap();
    let err = fs
        .add_target(Arc::clone(&damaged) as Arc<dyn Target>)
        .unwrap_err();
    assert!(err.to_string().contains("damaged"), "{err}");
    // Too small for a data block past the aligned start.
    let tiny = new_sim("tiny", MB);
    let err = fs.add_target(tiny as Arc<dyn Target>).unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
    // Sectors larger than the file system's (its direct I/O is admitted at 512 bytes).
    let big_sectors = Arc::new(SimTarget::new("4kn", 16 * MB, 4096));
    let err = fs.add_target(big_sectors as Arc<dyn Target>).unwrap_err();
    assert!(
        err.to_string().contains("larger than the file system's"),
        "{err}"
    );
    assert_eq!(fs.targets().len(), 2, "nothing joined");
    books(&fs, "after refusals");
    fs.unmount().unwrap();
    fsck_clean(dyns(&s), "after refusals");
}

fn fs_superblock(t: &SimTarget) -> Vec<u8> {
    t.read_sync(0, 512).unwrap().to_vec()
}

#[test]
fn a_damaged_superblock_on_an_added_target_is_named_at_mount() {
    let s = sims(2, 32 * MB);
    let fs = fresh(&s, 4096, 64 << 10);
    let extra = new_sim("new", 32 * MB);
    fs.add_target(Arc::clone(&extra) as Arc<dyn Target>)
        .unwrap();
    fs.unmount().unwrap();
    extra.corrupt(60, 0x10);
    let mut all = dyns(&s);
    all.push(extra as Arc<dyn Target>);
    let err = Fs::mount(all, quiet()).expect_err("refused");
    let msg = err.to_string();
    assert!(
        matches!(err, FsError::Corrupted(_)) && msg.contains("superblock of target new"),
        "{msg}"
    );
}

/// A crash at every flush and FUA point of: a synced file, an add, a file over every
/// target written and synced. After each: with the new target given if its superblock
/// reached it (else it is refused as not a stripefs target, and the mount without it
/// works), the target is a member or not (a member for every crash after the add
/// returned), every acknowledged byte reads back, books and fsck are clean.
#[test]
fn crash_at_every_point_of_an_add() {
    let s = sims(3, 16 * MB);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16 << 10,
        journal_bytes: Some(256 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&s), &opts).unwrap();
    let extra = new_sim("new", 16 * MB);
    let mut initial: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();
    initial.push(extra.durable_image());
    let rec = Recorder::new();
    let (fs, _) = Fs::mount(recorded(&s, &rec), quiet()).unwrap();
    let now = || rec.events().len();
    let a = file(&fs, "a", None);
    let da = pattern(1, 0, 100_000);
    fs.write_at(a, 0, &da).unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    let a_synced = now();
    let wrapped = RecordingTarget::new(Arc::clone(&extra) as Arc<dyn Target>, 3, Arc::clone(&rec));
    fs.add_target(Arc::new(wrapped)).unwrap();
    let added = now();
    let b = file(&fs, "b", over_all(4));
    let db = pattern(2, 0, 200_000);
    fs.write_at(b, 0, &db).unwrap();
    fs.fsync(b, SyncScope::All).unwrap();
    let b_synced = now();
    assert!(on_target(&fs, b, 3));
    fs.checkpoint().unwrap();
    drop(fs);

    // Crash points seen with 3 members, with 4, and with the new target refused.
    let seen = std::cell::RefCell::new([0usize; 3]);
    let verify = |fs: &Fs, upto: usize, what: &str| {
        let members = fs.targets().len();
        seen.borrow_mut()[members - 3] += 1;
        assert!(members == 3 || members == 4, "{what}: {members} members");
        if upto >= added {
            assert_eq!(members, 4, "{what}: the add returned, so it is durable");
        }
        if upto >= a_synced {
            assert!(read_all(fs, lookup(fs, "a").unwrap()) == da, "{what}: a");
        }
        if upto >= b_synced {
            let b = lookup(fs, "b").expect("b was synced");
            assert!(read_all(fs, b) == db, "{what}: b");
        }
        books(fs, what);
    };
    let check = |images: Vec<Vec<u8>>, upto: usize, what: &str| {
        let sims: Vec<Arc<SimTarget>> = images
            .into_iter()
            .enumerate()
            .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("c{i}"), img, 512)))
            .collect();
        let targets = match Fs::mount(dyns(&sims), quiet()) {
            Ok((fs, _)) => {
                verify(&fs, upto, what);
                fs.unmount().unwrap();
                dyns(&sims)
            }
            Err(e) => {
                // Its superblock never reached it (or tore): refused as not ours.
                assert!(
                    e.to_string().contains("superblock of target c3") && upto < added,
                    "{what}: mount with the new target: {e}"
                );
                seen.borrow_mut()[2] += 1;
                let old = dyns(&sims[..3]);
                let (fs, _) = Fs::mount(old.clone(), quiet()).expect("mount without it");
                assert_eq!(fs.targets().len(), 3, "{what}");
                verify(&fs, upto, what);
                fs.unmount().unwrap();
                old
            }
        };
        fsck_clean(targets, what);
    };
    let mut covered = 0;
    for p in rec.durability_points() {
        for policy in [
            UnflushedPolicy::Drop,
            UnflushedPolicy::Tear { seed: p as u64 },
        ] {
            let what = format!("crash after event {p} ({policy:?})");
            check(rec.images_at(&initial, p + 1, policy, 512), p + 1, &what);
            covered += 1;
        }
    }
    for p in rec.fua_points() {
        let what = format!("crash during FUA write {p}");
        check(
            rec.images_in_flight(&initial, p, (p as u64) << 1, 512),
            p,
            &what,
        );
        covered += 1;
    }
    assert!(covered > 20, "too few crash points: {covered}");
    let seen = seen.into_inner();
    assert!(
        seen.iter().all(|&n| n > 0),
        "crashes before the add, after it, and before its superblock: {seen:?}"
    );
}

/// Where the add of member 2 is when the impostor is given in its place.
#[derive(Debug, Clone, Copy, PartialEq)]
enum AddState {
    /// Only the journal holds the add: the `TargetAdd` record's member id is compared.
    InJournal,
    /// Checkpointed, with tree pages on member 2: their verification may refuse the disk
    /// first, as corruption at that page.
    Checkpointed,
    /// Checkpointed after an evacuation moved every page and extent off member 2 (it
    /// stays read-only and needed): only the trees' `TargetMember` item can refuse it.
    CheckpointedNothingOnIt,
}

/// A disk whose superblock claims member 2 of this file system but whose member id is not
/// the one member 2 joined with (an add formatted it and never committed, and another
/// disk was added as 2 after): given in place of member 2 it is refused by name, both
/// when the add is checkpointed (the trees' member id) and when only the journal holds
/// it (the record's) (decision 118).
#[test]
fn a_disk_an_add_formatted_but_never_joined_cannot_pass_for_the_member() {
    use stripefs_core::superblock::Superblock;
    for state in [
        AddState::Checkpointed,
        AddState::InJournal,
        AddState::CheckpointedNothingOnIt,
    ] {
        let s = sims(2, 32 * MB);
        let fs = fresh(&s, 4096, 64 << 10);
        let member = new_sim("member", 32 * MB);
        fs.add_target(Arc::clone(&member) as Arc<dyn Target>)
            .unwrap();
        let f = file(&fs, "f", over_all(3));
        fs.write_at(f, 0, &pattern(4, 0, 1 << 20)).unwrap();
        fs.fsync(f, SyncScope::All).unwrap();
        if state == AddState::CheckpointedNothingOnIt {
            fs.evacuate(TargetId(2), &mut |_| {})
                .expect("evacuate member 2");
        }
        let images: Vec<Vec<u8>> = if state == AddState::InJournal {
            let i = s.iter().map(|t| t.durable_image()).collect();
            std::mem::forget(fs);
            i
        } else {
            fs.unmount().unwrap();
            s.iter().map(|t| t.durable_image()).collect()
        };
        // The impostor: member 2's superblock with another member id, as an add that
        // formatted this disk and never committed would have left it.
        let mut sb = Superblock::decode(&fs_superblock(&member), "member").unwrap();
        assert_ne!(sb.member_id, 0, "an added target has a member id");
        sb.member_id ^= 0x5a5a;
        let impostor = new_sim("impostor", 32 * MB);
        impostor
            .write_sync(0, IoBuf::from_slice(&sb.encode()))
            .unwrap();
        impostor.flush_sync().unwrap();
        let base: Vec<Arc<SimTarget>> = images
            .into_iter()
            .enumerate()
            .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("b{i}"), img, 512)))
            .collect();
        let mut wrong = dyns(&base);
        wrong.push(Arc::clone(&impostor) as Arc<dyn Target>);
        let err = Fs::mount(wrong, quiet()).expect_err("the impostor is refused");
        let msg = err.to_string();
        let named =
            msg.contains("target impostor has index 2") && msg.contains("never made a member");
        let page = matches!(err, FsError::Corrupted(_)) && msg.contains("at target 2 block");
        assert!(
            named || (state == AddState::Checkpointed && page),
            "{state:?}: {msg}"
        );
        let mut right = dyns(&base);
        right.push(Arc::clone(&member) as Arc<dyn Target>);
        let (fs, _) = Fs::mount(right, quiet()).expect("the member mounts");
        let f = lookup(&fs, "f").unwrap();
        assert!(read_all(&fs, f) == pattern(4, 0, 1 << 20));
        fs.unmount().unwrap();
    }
}

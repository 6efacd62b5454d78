//! Retiring a target (issue 13: "so that a disk can be retired"; `targets.md`,
//! "Retiring a target"): an evacuated target leaves the file system for good, later
//! mounts do not need its device, its space leaves `df`, and the read-only state of an
//! evacuation survives a remount (decisions 106-109).
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use stripefs::{Fs, FsError, Ino, MkfsOptions, SyncScope, TargetId};
use stripefs_target::{SimTarget, Target};

const RETIRED: TargetId = TargetId(2);

fn mkfs(s: &[Arc<SimTarget>]) {
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 64 << 10,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(s), &opts).expect("mkfs");
}

/// Files striped over every target, synced. Returns name -> contents.
fn populate(fs: &Fs, files: usize) -> HashMap<String, Vec<u8>> {
    let mut want = HashMap::new();
    for i in 0..files {
        let name = format!("f{i}");
        let data = pattern(i as u64 + 1, 0, 300_000 + i * 4096);
        let ino = file(fs, &name);
        fs.write_at(ino, 0, &data).expect("write");
        want.insert(name, data);
    }
    let big = file(fs, "big");
    let data = pattern(77, 0, 2 << 20);
    fs.write_at(big, 0, &data).expect("write");
    want.insert("big".into(), data);
    fs.sync().expect("sync");
    want
}

fn check_files(fs: &Fs, want: &HashMap<String, Vec<u8>>, what: &str) {
    for (name, data) in want {
        let ino = fs.lookup(Ino::ROOT, name.as_ref()).expect(name).ino;
        assert!(read_all(fs, ino) == *data, "{what}: {name} differs");
    }
}

fn blocks_on(fs: &Fs, t: TargetId) -> u64 {
    let b = &fs.space_accounting()[t.index()];
    b.extent_blocks + b.meta_page_blocks
}

fn fsck_clean(targets: Vec<Arc<dyn Target>>, what: &str) {
    let r = stripefs::fsck::fsck(targets, &mut |_| {}).expect("fsck loads");
    assert!(r.is_clean(), "{what}: fsck: {:?}", r.problems);
}

fn without(s: &[Arc<SimTarget>], t: TargetId) -> Vec<Arc<dyn Target>> {
    let mut d = dyns(s);
    d.remove(t.index());
    d
}

#[test]
fn a_retired_target_is_not_needed_to_mount_and_leaves_df() {
    let s = sims(3, 24 << 20);
    mkfs(&s);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let want = populate(&fs, 6);
    assert!(
        blocks_on(&fs, RETIRED) > 0,
        "the population reaches target 2"
    );
    let before = fs.statfs().unwrap();
    let area = fs.space_accounting()[RETIRED.index()].data_blocks;
    fs.evacuate(RETIRED, &mut |_| {}).expect("evacuate");
    fs.retire_target(RETIRED).expect("retire");
    assert!(fs.target_retired(RETIRED) && fs.target_read_only(RETIRED));
    let after = fs.statfs().unwrap();
    assert_eq!(
        after.blocks,
        before.blocks - area,
        "its data area left the total"
    );
    fs.check_space_accounting().unwrap();
    // New files go elsewhere.
    let n = file(&fs, "new");
    fs.write_at(n, 0, &pattern(9, 0, 1 << 20)).unwrap();
    fs.fsync(n, SyncScope::All).unwrap();
    assert!(fs.extents(n).unwrap().iter().all(|r| r.target != RETIRED.0));
    fs.unmount().unwrap();

    // Without its device: everything reads back, and it stays retired.
    let (fs, _) = Fs::mount(without(&s, RETIRED), quiet()).expect("mount without target 2");
    check_files(&fs, &want, "mounted without target 2");
    assert!(fs.target_retired(RETIRED));
    assert_eq!(fs.statfs().unwrap().blocks, after.blocks);
    let m = file(&fs, "after");
    fs.write_at(m, 0, &pattern(10, 0, 1 << 20)).unwrap();
    fs.sync().unwrap();
    fs.check_space_accounting().unwrap();
    fs.check_refcounts().unwrap();
    fs.unmount().unwrap();
    fsck_clean(without(&s, RETIRED), "without target 2");
    // With it given anyway: it is still retired and ignored.
    let (fs, _) = Fs::mount(dyns(&s), quiet()).expect("mount with the retired device");
    assert!(fs.target_retired(RETIRED));
    check_files(&fs, &want, "mounted with target 2 given");
    fs.unmount().unwrap();
    fsck_clean(dyns(&s), "with target 2 given");
}

#[test]
fn retirement_is_refused_unless_the_target_was_emptied() {
    let s = sims(3, 24 << 20);
    mkfs(&s);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let _want = populate(&fs, 3);
    let refused = |t: TargetId, what: &str| {
        let e = fs.retire_target(t).expect_err(what);
        assert!(matches!(e, FsError::Invalid(_)), "{what}: {e}");
        e.to_string()
    };
    assert!(refused(RETIRED, "writable").contains("evacuate it first"));
    assert!(refused(TargetId(0), "target 0").contains("journal"));
    assert!(refused(TargetId(3), "no such target").contains("3 targets"));
    // Read-only but not emptied yet.
    fs.evacuate_begin(RETIRED).unwrap();
    assert!(refused(RETIRED, "not emptied").contains("still holds"));
    fs.evacuate(RETIRED, &mut |_| {}).unwrap();
    fs.retire_target(RETIRED).unwrap();
    assert!(refused(RETIRED, "twice").contains("retired already"));
    assert!(
        fs.evacuate_begin(RETIRED).is_err(),
        "a retired target is not evacuated"
    );
    assert!(fs.evacuate_cancel(RETIRED).is_err(), "nor made writable");
    fs.unmount().unwrap();
}

#[test]
fn the_read_only_state_of_an_evacuation_survives_a_remount_until_cancelled() {
    let s = sims(3, 24 << 20);
    mkfs(&s);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let want = populate(&fs, 3);
    fs.evacuate_begin(RETIRED).unwrap();
    // A crash, not an unmount: the state is in the journal only.
    let images: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();
    std::mem::forget(fs);
    let s: Vec<Arc<SimTarget>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("r{i}"), img, 512)))
        .collect();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert!(fs.target_read_only(RETIRED), "read-only after the crash");
    let on_before = blocks_on(&fs, RETIRED);
    let n = file(&fs, "while-read-only");
    fs.write_at(n, 0, &pattern(5, 0, 2 << 20)).unwrap();
    fs.sync().unwrap();
    assert!(fs.extents(n).unwrap().iter().all(|r| r.target != RETIRED.0));
    assert_eq!(
        blocks_on(&fs, RETIRED),
        on_before,
        "nothing new on target 2"
    );
    let st = fs.statfs().unwrap();
    assert!(
        st.blocks_free + fs.space_accounting()[RETIRED.index()].available_blocks <= st.blocks,
        "df does not count the read-only target's free blocks as free"
    );
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert!(fs.target_read_only(RETIRED), "read-only after an unmount");
    fs.evacuate_cancel(RETIRED).unwrap();
    assert!(!fs.target_read_only(RETIRED));
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    assert!(!fs.target_read_only(RETIRED), "writable after the cancel");
    check_files(&fs, &want, "after the cancel");
    fs.unmount().unwrap();
    fsck_clean(dyns(&s), "after the cancel");
}

#[test]
fn a_member_that_is_not_retired_is_still_needed() {
    let s = sims(3, 24 << 20);
    mkfs(&s);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    populate(&fs, 2);
    fs.evacuate(RETIRED, &mut |_| {}).unwrap();
    fs.unmount().unwrap();
    // Evacuated and read-only, but not retired: its device is still a member's.
    let e = Fs::mount(without(&s, RETIRED), quiet()).expect_err("target 2 is missing");
    let msg = e.to_string();
    assert!(
        msg.contains("missing target index 2, which is read-only, not retired"),
        "{msg}"
    );
    let e = Fs::mount(without(&s, TargetId(1)), quiet()).expect_err("target 1 is missing");
    assert!(e.to_string().contains("missing target index 1"), "{e}");
}

#[test]
fn a_retired_device_can_be_added_again_as_a_new_target() {
    let s = sims(3, 24 << 20);
    mkfs(&s);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let want = populate(&fs, 3);
    fs.evacuate(RETIRED, &mut |_| {}).unwrap();
    fs.retire_target(RETIRED).unwrap();
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(without(&s, RETIRED), quiet()).unwrap();
    let again = fs
        .add_target(Arc::clone(&s[2]) as Arc<dyn Target>)
        .expect("the retired device joins again");
    assert_eq!(again, TargetId(3));
    let n = file(&fs, "spread");
    fs.write_at(n, 0, &pattern(3, 0, 4 << 20)).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    let mut all = without(&s, RETIRED);
    all.push(Arc::clone(&s[2]) as Arc<dyn Target>);
    let (fs, _) = Fs::mount(all.clone(), quiet()).unwrap();
    check_files(&fs, &want, "with the device as target 3");
    assert!(fs.target_retired(RETIRED) && !fs.target_read_only(TargetId(3)));
    fs.unmount().unwrap();
    fsck_clean(all, "with the device as target 3");
}

#[test]
fn an_added_target_that_is_retired_is_not_needed_either() {
    // The last member added, then retired: the page log counts it past every index
    // given, and the mount fills its place all the same.
    let s = sims(3, 24 << 20);
    mkfs(&s[..2]);
    let (fs, _) = Fs::mount(dyns(&s[..2]), quiet()).unwrap();
    let added = fs
        .add_target(Arc::clone(&s[2]) as Arc<dyn Target>)
        .expect("add");
    assert_eq!(added, RETIRED);
    let want = populate(&fs, 4);
    assert!(blocks_on(&fs, RETIRED) > 0, "files reach the added target");
    fs.evacuate(RETIRED, &mut |_| {}).expect("evacuate");
    fs.retire_target(RETIRED).expect("retire");
    fs.unmount().unwrap();
    let (fs, _) = Fs::mount(dyns(&s[..2]), quiet()).expect("mount without the added target");
    assert!(fs.target_retired(RETIRED));
    check_files(&fs, &want, "without the added target");
    fs.unmount().unwrap();
    fsck_clean(dyns(&s[..2]), "without the added target");
}

#[test]
fn a_crash_during_the_retirement_leaves_it_done_or_not_and_done_needs_no_device() {
    let s = sims(3, 24 << 20);
    mkfs(&s);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let want = populate(&fs, 3);
    fs.evacuate(RETIRED, &mut |_| {}).unwrap();
    fs.unmount().unwrap();
    let initial: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();
    let rec = stripefs_target::Recorder::new();
    let (fs, _) = Fs::mount(recorded(&s, &rec), quiet()).unwrap();
    let began = rec.events().len();
    fs.retire_target(RETIRED).unwrap();
    let done = rec.events().len();
    std::mem::forget(fs);
    let sims_at = |images: &[Vec<u8>], prefix: &str| -> Vec<Arc<SimTarget>> {
        images
            .iter()
            .enumerate()
            .map(|(i, img)| {
                Arc::new(SimTarget::from_image(
                    &format!("{prefix}{i}"),
                    img.clone(),
                    512,
                ))
            })
            .collect()
    };
    let (mut retired, mut not) = (0, 0);
    // The state as the call began (not retired), then every durability point during it.
    let points = rec.durability_points().into_iter().filter(|&p| p >= began);
    for n in std::iter::once(began).chain(points.map(|p| p + 1)) {
        let images = rec.images_at(&initial, n, stripefs_target::UnflushedPolicy::Drop, 512);
        let what = format!("crash with {n} events durable");
        let all = sims_at(&images, "a");
        let (fs, _) = Fs::mount(dyns(&all), quiet()).expect(&what);
        check_files(&fs, &want, &what);
        let is = fs.target_retired(RETIRED);
        assert!(is || n < done, "{what}: retired once the call returned");
        fs.unmount().unwrap();
        if !is {
            not += 1;
            continue;
        }
        retired += 1;
        // Retired, perhaps only in the journal: the device is not needed.
        let two = sims_at(&images[..2], "b");
        let (fs, _) = Fs::mount(dyns(&two), quiet())
            .unwrap_or_else(|e| panic!("{what}: mount without target 2: {e}"));
        check_files(&fs, &want, &what);
        fs.unmount().unwrap();
        let two = sims_at(&images[..2], "c");
        fsck_clean(dyns(&two), &what);
    }
    assert!(
        retired > 0 && not > 0,
        "{retired} crash points retired, {not} not"
    );
}

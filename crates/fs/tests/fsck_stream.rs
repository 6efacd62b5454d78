//! fsck streams the trees (issue 11): its per-inode state stays within the documented
//! bytes per inode whatever the file count, and damage crafted into the trees (items
//! written into a `Store` directly, then checkpointed) is reported naming what is wrong.

mod common;

use std::sync::{Arc, Mutex};

use common::{dyns, fresh, pattern, quiet, sims};
use stripefs::fsck::tally::{DIR_TALLY_BYTES, TALLY_BYTES};
use stripefs::fsck::FsckStage;
use stripefs::{CreateParams, Fs};
use stripefs_core::btree::schema::{
    decode_inode, dir_entry_items, encode_extent, encode_inode, extent_key, free_space_item,
    inode_key, xattr_items, DirEntryItem,
};
use stripefs_core::btree::{name_hash, PageAddr, TreeId};
use stripefs_core::geometry::Geometry;
use stripefs_core::inode::FileKind;
use stripefs_core::{Ino, PhysBlock, TargetId};
use stripefs_meta::{MetaError, PageAlloc, RootSlots, Store, StoreConfig};
use stripefs_target::SimTarget;

/// Blocks at the end of target 0 where the crafted checkpoints put their pages.
const CRAFT_BLOCKS: u64 = 64;

fn populated(files: usize, dirs: usize) -> (Vec<Arc<SimTarget>>, Geometry) {
    let s = sims(3, 16 << 20);
    let fs = fresh(&s, 4096, 16384);
    let mut parents = vec![Ino::ROOT];
    for d in 0..dirs {
        let a = fs
            .mkdir(
                Ino::ROOT,
                format!("d{d}").as_ref(),
                CreateParams::with_perm(0o755),
            )
            .unwrap();
        parents.push(a.ino);
    }
    for i in 0..files {
        let dir = parents[i % parents.len()];
        let a = fs
            .create(
                dir,
                format!("f{i}").as_ref(),
                CreateParams::with_perm(0o644),
            )
            .unwrap();
        if i < 8 {
            fs.write_at(a.ino, 0, &pattern(i as u64, 0, 40_000))
                .unwrap();
        }
    }
    let geo = fs.geometry().clone();
    fs.unmount().unwrap();
    (s, geo)
}

/// The trees of a cleanly unmounted file system, opened for crafting: new pages go to the
/// last [`CRAFT_BLOCKS`] blocks of target 0 (which the small file systems here never use).
fn open_store(s: &[Arc<SimTarget>], geo: &Geometry) -> Store {
    let cfg = StoreConfig {
        uuid: geo.uuid,
        page_size: geo.page_size(),
        block_size: geo.block_size,
        cache_bytes: 1 << 20,
        slots: RootSlots {
            target: TargetId(0),
            offsets: geo.root_slot_offsets(),
        },
        space: stripefs_meta::SpaceBooks::Kept,
    };
    let first = geo.targets[0].blocks - CRAFT_BLOCKS;
    let alloc = Arc::new(CraftAlloc(Mutex::new(first..first + CRAFT_BLOCKS)));
    Store::open(cfg, dyns(s), alloc).unwrap()
}

/// Hands out the crafting region's blocks once each; pages freed are forgotten (the old
/// generation's pages just become free blocks).
#[derive(Debug)]
struct CraftAlloc(Mutex<std::ops::Range<u64>>);

impl PageAlloc for CraftAlloc {
    fn alloc(&self, n: usize) -> Result<Vec<PageAddr>, MetaError> {
        let mut r = self.0.lock().unwrap();
        if (r.end - r.start) < n as u64 {
            return Err(MetaError::NoSpace("crafting region used up".into()));
        }
        let out = (r.start..r.start + n as u64)
            .map(|b| PageAddr {
                target: TargetId(0),
                block: PhysBlock(b),
            })
            .collect();
        r.start += n as u64;
        Ok(out)
    }

    fn free(&self, _: &[PageAddr]) {}
}

fn fsck_problems(s: &[Arc<SimTarget>]) -> Vec<String> {
    stripefs::fsck::fsck(dyns(s), &mut |_| {})
        .expect("fsck runs")
        .problems
}

fn attrs_of(store: &Store, ino: Ino) -> stripefs_core::inode::InodeAttrs {
    let k = inode_key(ino);
    decode_inode(&k, &store.get(&k).unwrap().unwrap()).unwrap()
}

fn lookup(s: &[Arc<SimTarget>], name: &str) -> Ino {
    let (fs, _) = Fs::mount(dyns(s), quiet()).unwrap();
    let ino = fs.lookup(Ino::ROOT, name.as_ref()).unwrap().ino;
    fs.unmount().unwrap();
    ino
}

/// The per-inode state grows with the file count by at most the documented bytes per
/// inode and per directory; the block bitmaps do not grow at all.
#[test]
fn tracked_state_is_bounded_per_inode() {
    let mut seen = Vec::new();
    for files in [500, 4000] {
        let (s, _) = populated(files, 20);
        let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        let inodes = r.inodes as usize;
        assert_eq!(inodes, files + 21);
        let bound = inodes * TALLY_BYTES + 21 * DIR_TALLY_BYTES;
        assert!(
            r.tracked_bytes <= bound,
            "{files} files: {} bytes tracked, bound {bound}",
            r.tracked_bytes
        );
        assert!(r.tracked_bytes > 0);
        seen.push((inodes, r.tracked_bytes, r.bitmap_bytes));
    }
    assert_eq!(seen[0].2, seen[1].2, "bitmaps depend on the devices only");
    let per_inode = (seen[1].1 - seen[0].1) / (seen[1].0 - seen[0].0);
    eprintln!("tracked: {seen:?}, {per_inode} bytes per added inode");
    assert!(
        per_inode <= TALLY_BYTES,
        "{per_inode} bytes per added inode"
    );
}

/// The progress callback follows the walk: inode numbers rising to the counter, pages
/// counting up, then `Checked` last.
#[test]
fn progress_follows_the_walk() {
    let (s, _) = populated(3000, 5);
    let mut seen = Vec::new();
    stripefs::fsck::fsck(dyns(&s), &mut |st| seen.push(st)).unwrap();
    assert!(
        matches!(seen[0], FsckStage::Loaded { journal_txns: 0 }),
        "{seen:?}"
    );
    assert_eq!(seen.last(), Some(&FsckStage::Checked));
    let walk: Vec<(u64, u64, u64)> = seen
        .iter()
        .filter_map(|st| match *st {
            FsckStage::Walking { pages, done, total } => Some((pages, done, total)),
            _ => None,
        })
        .collect();
    assert!(walk.len() > 5, "one report per leaf: {walk:?}");
    assert!(walk.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    assert!(walk.iter().all(|&(_, done, total)| done <= total));
    let &(_, done, total) = walk.last().unwrap();
    assert!(total >= 3006 && done + 1 >= total, "{done} of {total}");
}

/// fsck's streaming verdict equals the model check's (`stripefs_core::check::check` on the
/// whole model read back by `items::load_state`, orphans left out as fsck leaves them to
/// mount) on records applied to the trees directly: the runtime's valid changes and
/// crafted ones breaking each kind of rule.
#[test]
fn streaming_verdict_equals_the_model_check() {
    use stripefs_core::record::Record;
    use stripefs_meta::items::{apply_record, load_state};
    let (s, geo) = populated(10, 1);
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    let ino = |n: &str| fs.lookup(Ino::ROOT, n.as_ref()).unwrap().ino;
    let (d0, f0, f4, f2) = (ino("d0"), ino("f0"), ino("f4"), ino("f2"));
    fs.unmount().unwrap();
    let image: Vec<Vec<u8>> = s.iter().map(|t| t.durable_image()).collect();
    let store = open_store(&s, &geo);
    let file = attrs_of(&store, f0);
    let root = attrs_of(&store, Ino::ROOT);
    let dir = attrs_of(&store, d0);
    drop(store);
    let with = |base: &stripefs_core::inode::InodeAttrs,
                f: &dyn Fn(&mut stripefs_core::inode::InodeAttrs)| {
        let mut a = base.clone();
        f(&mut a);
        Record::InodeSet(a)
    };
    let add = |d: Ino, name: &str, i: Ino, kind: FileKind| Record::DirAdd {
        dir: d,
        name: name.as_bytes().to_vec(),
        ino: i,
        kind,
    };
    let remove = |d: Ino, name: &str| Record::DirRemove {
        dir: d,
        name: name.as_bytes().to_vec(),
    };
    let new = Ino(5000);
    let cases: Vec<(&str, bool, Vec<Record>)> = vec![
        ("nothing", true, vec![]),
        (
            "create",
            true,
            vec![
                with(&file, &|a| a.ino = new),
                add(Ino::ROOT, "new", new, FileKind::Regular),
            ],
        ),
        (
            "hard link",
            true,
            vec![
                add(d0, "h", f0, FileKind::Regular),
                with(&file, &|a| a.nlink = 2),
            ],
        ),
        (
            "unlink and free",
            true,
            vec![remove(Ino::ROOT, "f4"), Record::InodeFree(f4)],
        ),
        (
            "unlink open file",
            true,
            vec![
                remove(Ino::ROOT, "f2"),
                with(&attrs_of_model(&image, &geo, f2), &|a| a.nlink = 0),
            ],
        ),
        (
            "entry to a missing inode",
            false,
            vec![add(Ino::ROOT, "x", Ino(4242), FileKind::Regular)],
        ),
        (
            "link count too high",
            false,
            vec![with(&file, &|a| a.nlink = 2)],
        ),
        (
            "invalid entry name",
            false,
            vec![
                add(d0, "a/b", f0, FileKind::Regular),
                with(&file, &|a| a.nlink = 2),
            ],
        ),
        (
            "entry of the wrong type",
            false,
            vec![
                add(d0, "x", f0, FileKind::Symlink),
                with(&file, &|a| a.nlink = 2),
            ],
        ),
        (
            "mkdir without parent link",
            false,
            vec![
                with(&dir, &|a| a.ino = new),
                add(Ino::ROOT, "e", new, FileKind::Directory),
            ],
        ),
        (
            "directory with a wrong parent",
            false,
            vec![with(&dir, &|a| a.parent = f0)],
        ),
        (
            "directory moved into itself",
            false,
            vec![
                remove(Ino::ROOT, "d0"),
                add(d0, "d2", d0, FileKind::Directory),
                with(&dir, &|a| {
                    a.nlink = 3;
                    a.parent = d0;
                }),
                with(&root, &|a| a.nlink -= 1),
            ],
        ),
        (
            "new inode in no directory",
            false,
            vec![with(&file, &|a| a.ino = new)],
        ),
        (
            "symlink without target",
            false,
            vec![
                with(&file, &|a| {
                    a.ino = new;
                    a.kind = FileKind::Symlink;
                    a.layout = stripefs_core::layout::StripeLayout {
                        count: 0,
                        unit_bytes: 0,
                        first_target: 0,
                    };
                }),
                add(Ino::ROOT, "s", new, FileKind::Symlink),
            ],
        ),
        (
            "layout wider than the targets",
            false,
            vec![
                with(&file, &|a| {
                    a.ino = new;
                    a.layout.count = 9;
                }),
                add(Ino::ROOT, "w", new, FileKind::Regular),
            ],
        ),
    ];
    let mut ran = 0;
    for (name, valid, recs) in cases {
        let c: Vec<Arc<SimTarget>> = image
            .iter()
            .enumerate()
            .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("sim{i}"), img.clone(), 512)))
            .collect();
        let store = open_store(&c, &geo);
        if recs.iter().any(|r| apply_record(&store, r).is_err()) {
            continue; // the trees refuse it: neither check sees it
        }
        store.checkpoint().unwrap();
        let model = match load_state(&store) {
            Ok(mut m) => {
                m.inodes.retain(|_, i| i.attrs.nlink != 0);
                stripefs_core::check::check(&m, &geo).is_clean()
            }
            Err(_) => false,
        };
        drop(store);
        let r = stripefs::fsck::fsck(dyns(&c), &mut |_| {}).unwrap();
        assert_eq!(r.is_clean(), model, "{name}: fsck {:?}", r.problems);
        assert_eq!(
            valid, model,
            "{name}: expected valid={valid}: {:?}",
            r.problems
        );
        ran += 1;
    }
    assert!(ran >= 14, "only {ran} cases applied");
}

/// Attributes of `ino` in a saved image.
fn attrs_of_model(image: &[Vec<u8>], geo: &Geometry, ino: Ino) -> stripefs_core::inode::InodeAttrs {
    let c: Vec<Arc<SimTarget>> = image
        .iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("m{i}"), img.clone(), 512)))
        .collect();
    attrs_of(&open_store(&c, geo), ino)
}

/// The counts fsck reports after applying the journal in memory equal those of the
/// same file system once mount has applied it (extents that merge or split included).
#[test]
fn counts_after_replay_equal_counts_after_mount() {
    let s = sims(3, 16 << 20);
    let fs = fresh(&s, 4096, 16384);
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    for i in 0..6u64 {
        // Appends (merging with the extent before) and a rewrite in the middle.
        let off = if i == 5 { 4096 } else { i * 4096 };
        fs.write_at(a.ino, off, &pattern(i, off, 4096)).unwrap();
        fs.sync().unwrap();
    }
    std::mem::forget(fs);
    for t in &s {
        t.crash(stripefs_target::CrashMode::DropUnflushed);
    }
    let replayed = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(replayed.is_clean(), "{:?}", replayed.problems);
    assert!(
        replayed.notes.iter().any(|n| n.contains("journal holds")),
        "{:?}",
        replayed.notes
    );
    Fs::mount(dyns(&s), quiet()).unwrap().0.unmount().unwrap();
    let mounted = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert_eq!(
        (
            replayed.inodes,
            replayed.extents,
            replayed.data_blocks_used - replayed.meta_pages
        ),
        (
            mounted.inodes,
            mounted.extents,
            mounted.data_blocks_used - mounted.meta_pages
        )
    );
}

/// The same xattr name under two collision indices (the trees hold each name once).
#[test]
fn xattr_twice_is_named() {
    let (s, geo) = populated(10, 1);
    let f = lookup(&s, "f0");
    let store = open_store(&s, &geo);
    let name = b"user.twice";
    let h = name_hash(geo.uuid, name);
    for collision in [0, 1] {
        for (k, v) in xattr_items(f, h, collision, name, b"v") {
            store.insert(k, &v).unwrap();
        }
    }
    store.checkpoint().unwrap();
    let p = fsck_problems(&s);
    assert!(
        p.iter().any(|p| p.contains(&format!("({}, ", f.0))
            && p.ends_with("a second xattr of the same name")),
        "{p:?}"
    );
}

#[test]
fn entry_to_a_missing_inode_is_named() {
    let (s, geo) = populated(10, 1);
    let store = open_store(&s, &geo);
    let name = b"ghost".to_vec();
    let item = DirEntryItem {
        ino: Ino(4242),
        kind: FileKind::Regular,
        cookie: 1000,
        name: name.clone(),
    };
    for (k, v) in dir_entry_items(Ino::ROOT, name_hash(geo.uuid, &name), 0, &item) {
        store.insert(k, &v).unwrap();
    }
    store.checkpoint().unwrap();
    let p = fsck_problems(&s);
    assert!(
        p.iter()
            .any(|p| p == "directory 1 entry \"ghost\" points to missing inode 4242"),
        "{p:?}"
    );
}

#[test]
fn wrong_link_count_is_named() {
    let (s, geo) = populated(10, 1);
    let f = lookup(&s, "f0");
    let store = open_store(&s, &geo);
    let mut a = attrs_of(&store, f);
    a.nlink = 3;
    store.insert(inode_key(f), &encode_inode(&a)).unwrap();
    store.checkpoint().unwrap();
    let p = fsck_problems(&s);
    let want = format!("inode {f} has link count 3, but 1 entries reference it");
    assert!(p.contains(&want), "{p:?}");
}

/// An extent over a page of a tree the crafting does not rewrite (so the page stays
/// where it is): named by its inode, whichever of the two the walk meets first.
#[test]
fn extent_overlapping_a_tree_page_is_named() {
    let (s, geo) = populated(10, 1);
    let f = lookup(&s, "f0");
    let store = open_store(&s, &geo);
    let mut page = None;
    store
        .walk(TreeId::Csum, &mut |at, _| page = Some(at))
        .unwrap();
    let page = page.unwrap();
    let a = attrs_of(&store, f);
    let obj = 0;
    assert!(a.layout.count > 0);
    let e = stripefs_core::extent::Extent {
        len: 1,
        phys: page.block.0,
        state: stripefs_core::extent::ExtentState::Written,
        target: page.target,
    };
    store
        .insert(extent_key(f, obj, 1000), &encode_extent(&e))
        .unwrap();
    store.checkpoint().unwrap();
    let p = fsck_problems(&s);
    let named = format!("inode {f} object {obj} block 1000");
    assert!(
        p.iter()
            .any(|p| p.starts_with(&named) && p.contains("metadata page")),
        "{p:?}"
    );
}

/// A data block neither in use nor recorded free is leaked: reported naming its target
/// and block. (The space tree's last free run of target 1 loses its last block.)
#[test]
fn leaked_block_is_named() {
    let (s, geo) = populated(10, 1);
    let store = open_store(&s, &geo);
    // The durable page log first: the runs changed below are the open generation's.
    store.fold_pending().unwrap();
    let runs = stripefs_meta::space::free_runs(&store).unwrap();
    let &(t, start, len) = runs.iter().rfind(|r| r.0 == TargetId(1)).unwrap();
    store.remove(&free_space_item(t, start, len).0).unwrap();
    if len > 1 {
        let (k, v) = free_space_item(t, start, len - 1);
        store.insert(k, &v).unwrap();
    }
    let leaked = start + len - 1;
    store.checkpoint().unwrap();
    let p = fsck_problems(&s);
    let want = format!(
        "target 1: 1 blocks are neither in use nor recorded free (leaked), the first 1 at block {}",
        leaked
    );
    assert!(p.contains(&want), "{p:?}");
    assert!(
        !p.iter().any(|p| p.starts_with("target 2")),
        "target 2's free space is exact: {p:?}"
    );
}

/// An orphan item (the index at object 0) naming no inode: fsck names it, and mount
/// refuses it as corruption instead of tripping over a missing inode while freeing.
#[test]
fn orphan_item_of_a_missing_inode_is_named() {
    let (s, geo) = populated(10, 1);
    let store = open_store(&s, &geo);
    let ghost = Ino(9_999);
    store
        .insert(stripefs_core::btree::schema::orphan_key(ghost), &[])
        .unwrap();
    store.checkpoint().unwrap();
    drop(store);
    let p = fsck_problems(&s);
    let want = format!("an orphan item names inode {ghost}, which does not exist");
    assert!(p.contains(&want), "{p:?}");
    let msg = match Fs::mount(dyns(&s), quiet()) {
        Ok(_) => panic!("mounted with an orphan item naming no inode"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("orphan item names inode 9999"), "{msg}");
}

//! Names that share one hash (forced through the hash seam): collision indices, and
//! removal of one leaving the other.

use std::sync::Arc;

use stripefs_core::btree::schema::{decode_dir_entry, dir_entry_key};
use stripefs_core::btree::PageSize;
use stripefs_core::inode::{FileKind, InodeAttrs, Timespec};
use stripefs_core::layout::StripeLayout;
use stripefs_core::{BlockSize, TargetId};
use stripefs_target::{SimTarget, Target};

use super::*;
use crate::region::RegionAlloc;
use crate::{RootSlots, StoreConfig};

const SAME: u64 = 0x00c0_ffee;

fn same_hash(_: Uuid, _: &[u8]) -> u64 {
    SAME
}

fn store() -> Store {
    let cfg = StoreConfig {
        uuid: Uuid([3; 16]),
        page_size: PageSize::DEFAULT,
        block_size: BlockSize::new(4096).expect("block size"),
        cache_bytes: 64 * 4096,
        slots: RootSlots {
            target: TargetId(0),
            offsets: [4096, 8192],
        },
        space: crate::SpaceBooks::Off,
    };
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", 4 << 20, 512));
    Store::create(cfg, vec![sim], Arc::new(RegionAlloc::new(1, 16, 1, 500)))
}

fn dir(ino: u64) -> InodeAttrs {
    InodeAttrs {
        ino: Ino(ino),
        kind: FileKind::Directory,
        perm: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        size: 0,
        atime: Timespec::default(),
        mtime: Timespec::default(),
        ctime: Timespec::default(),
        crtime: Timespec::default(),
        rdev: 0,
        parent: Ino(1),
        layout: StripeLayout {
            count: 0,
            unit_bytes: 0,
            first_target: 0,
        },
        flags: 0,
    }
}

fn add(name: &[u8]) -> Record {
    Record::DirAdd {
        dir: Ino(1),
        name: name.to_vec(),
        ino: Ino(2),
        kind: FileKind::Directory,
    }
}

fn remove(name: &[u8]) -> Record {
    Record::DirRemove {
        dir: Ino(1),
        name: name.to_vec(),
    }
}

/// The name at collision index `c` of the forced hash, if any.
fn at(s: &Store, c: u64) -> Option<Vec<u8>> {
    let k = dir_entry_key(Ino(1), SAME, c);
    let v = s.get(&k).unwrap()?;
    Some(decode_dir_entry(&k, &v).unwrap().name)
}

#[test]
fn colliding_names_get_indices_0_and_1_and_survive_each_others_removal() {
    let s = store();
    let items = Items::new(&s, same_hash, ApplyMemo::default());
    let mut state = MetaState::new();
    let mut run = |r: Record| {
        items.apply(&r).unwrap();
        items.write_counter().unwrap();
        state.apply(&r).unwrap();
        assert_eq!(load_with(&s, same_hash).unwrap(), state, "after {r:?}");
    };
    run(Record::InodeSet(dir(1)));
    run(Record::InodeSet(dir(2)));
    run(add(b"a"));
    run(add(b"b"));
    assert_eq!(at(&s, 0).as_deref(), Some(&b"a"[..]));
    assert_eq!(at(&s, 1).as_deref(), Some(&b"b"[..]));
    run(remove(b"a"));
    assert_eq!((at(&s, 0), at(&s, 1).as_deref()), (None, Some(&b"b"[..])));
    run(add(b"c"));
    assert_eq!(at(&s, 0).as_deref(), Some(&b"c"[..]), "lowest free index");
    run(remove(b"b"));
    assert_eq!((at(&s, 0).as_deref(), at(&s, 1)), (Some(&b"c"[..]), None));
    // Xattrs share the rule.
    for (n, v) in [
        (&b"user.x"[..], &b"1"[..]),
        (b"user.y", b"2"),
        (b"user.x", b"3"),
    ] {
        run(Record::XattrSet {
            ino: Ino(2),
            name: n.to_vec(),
            value: v.to_vec(),
        });
    }
    run(Record::XattrRemove {
        ino: Ino(2),
        name: b"user.x".to_vec(),
    });
    let err = items.apply(&remove(b"b")).unwrap_err().to_string();
    assert!(err.contains("no entry \"b\""), "{err}");
    // The real hash would put the entry elsewhere: the loader notices.
    let err = load_state(&s).unwrap_err().to_string();
    assert!(err.contains("wrong hash"), "{err}");
}

fn regular(ino: u64) -> InodeAttrs {
    InodeAttrs {
        kind: FileKind::Regular,
        nlink: 1,
        layout: StripeLayout {
            count: 1,
            unit_bytes: 65536,
            first_target: 0,
        },
        ..dir(ino)
    }
}

/// An inode record is written before its checks (one descent reads the old value and
/// writes the new): a refused one must put the old item back.
#[test]
fn a_refused_inode_record_leaves_the_inode_as_it_was() {
    let s = store();
    apply_records(&s, &[Record::InodeSet(dir(1)), Record::InodeSet(dir(5))]).unwrap();
    let before = load_state(&s).unwrap();
    // A directory cannot become a regular file; a new regular file needs stripes.
    let no_stripes = InodeAttrs {
        layout: StripeLayout {
            count: 0,
            unit_bytes: 0,
            first_target: 0,
        },
        ..regular(9)
    };
    for bad_rec in [regular(5), no_stripes] {
        let err = apply_record(&s, &Record::InodeSet(bad_rec.clone())).unwrap_err();
        assert!(
            err.to_string().contains("inode 5 changes type")
                || err.to_string().contains("no stripes"),
            "{err}"
        );
        assert_eq!(
            load_state(&s).unwrap(),
            before,
            "after refusing {bad_rec:?}"
        );
    }
    let v = s.get(&inode_key(Ino(9))).unwrap();
    assert!(v.is_none(), "the refused new inode left an item");
}

/// A batch reads the counter item once and writes it at the end, also when a record of
/// the batch is refused: the records before it stay applied and counted.
#[test]
fn a_batch_counts_the_inodes_it_applied_before_a_refused_record() {
    let s = store();
    let recs = [
        Record::InodeSet(dir(1)),
        Record::InodeSet(dir(5)),
        Record::InodeSet(regular(7)),
        Record::InodeSet(regular(5)),
        Record::InodeSet(regular(8)),
    ];
    let err = apply_records(&s, &recs).unwrap_err();
    assert!(err.to_string().contains("inode 5 changes type"), "{err}");
    let c = counter(&s).unwrap();
    assert_eq!((c.next_ino, c.inodes), (8, 3), "inodes 1, 5 and 7 counted");
    let mut want = MetaState::new();
    for r in &recs[..3] {
        want.apply(r).unwrap();
    }
    assert_eq!(load_state(&s).unwrap(), want);
}

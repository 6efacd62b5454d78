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
    let items = Items::new(&s, same_hash);
    let mut state = MetaState::new();
    let mut run = |r: Record| {
        items.apply(&r).unwrap();
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

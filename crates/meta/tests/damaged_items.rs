//! Items whose physical runs pass the end of the block numbers (u64::MAX) or of any
//! target (`PHYS_BLOCKS_MAX`), inserted raw as damage would leave them: every lookup and
//! every record that reads one answers `Corrupted` naming the item, never panics (a
//! debug build's overflow check included) and never answers `Ok`.
//!
//! Guards: `csum::overlapping`/`lookup`/`each` iterated `(s..)` over a run ending at
//! u64::MAX (debug overflow panic), `csum::any` answered `Ok(true)` for an item it did
//! not decode, `decode_extent` accepted an extent whose `phys + len` overflows (the
//! next merge panicked), and runs past every target's end decoded as valid.

mod common;

use std::sync::Arc;

use common::{config, region, SECTOR, TARGET_BYTES};
use stripefs_core::btree::schema::{csum_item, encode_extent, extent_key, refcount_item};
use stripefs_core::btree::Key;
use stripefs_core::csum::BlockCsum;
use stripefs_core::extent::{Extent, ExtentState};
use stripefs_core::inode::{FileKind, InodeAttrs, Timespec};
use stripefs_core::layout::StripeLayout;
use stripefs_core::record::Record;
use stripefs_core::refcount::Shared;
use stripefs_core::units::PHYS_BLOCKS_MAX;
use stripefs_core::{Ino, TargetId};
use stripefs_meta::items::{apply_record, load_inode, load_state};
use stripefs_meta::{csum, refcount, MetaError, Store};
use stripefs_target::{SimTarget, Target};

const T: TargetId = TargetId(0);
const FILE: Ino = Ino(5);

fn attrs(ino: Ino, kind: FileKind) -> InodeAttrs {
    let t = Timespec { sec: 1, nsec: 0 };
    InodeAttrs {
        ino,
        kind,
        perm: 0o644,
        uid: 0,
        gid: 0,
        nlink: if kind == FileKind::Directory { 2 } else { 1 },
        size: 1 << 20,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        rdev: 0,
        parent: Ino::ROOT,
        layout: match kind {
            FileKind::Regular => StripeLayout {
                count: 1,
                unit_bytes: 65536,
                first_target: 0,
            },
            _ => StripeLayout {
                count: 0,
                unit_bytes: 0,
                first_target: 0,
            },
        },
        flags: 0,
    }
}

/// A store holding the root and one regular file (inode 5, one stripe object).
fn store() -> Store {
    let sim: Arc<dyn Target> = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
    let store = Store::create(config(64), vec![sim], region(1));
    apply_record(
        &store,
        &Record::InodeSet(attrs(Ino::ROOT, FileKind::Directory)),
    )
    .unwrap();
    apply_record(&store, &Record::InodeSet(attrs(FILE, FileKind::Regular))).unwrap();
    store
}

/// `res` is `Corrupted` naming `key`'s item.
#[track_caller]
fn named<T: std::fmt::Debug>(res: Result<T, MetaError>, key: &Key) {
    let e = match res {
        Ok(v) => panic!("Ok({v:?}) for the damaged item {key}"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(matches!(e, MetaError::Corrupted(_)), "{msg}");
    assert!(msg.contains(&format!("metadata item {key}")), "{msg}");
}

#[test]
fn a_checksum_run_ending_at_the_last_block_number_is_named() {
    let s = store();
    let (k, v) = csum_item(T, u64::MAX - 1, &[BlockCsum(7)]);
    s.insert(k, &v).unwrap();
    named(csum::lookup(&s, T, u64::MAX - 1, 1), &k);
    named(csum::lookup(&s, T, u64::MAX - 2, 2), &k);
    named(csum::any(&s, T, u64::MAX - 1, 1), &k);
    named(csum::any(&s, T, u64::MAX, 1), &k);
    named(csum::each(&s, &mut |_, _, _| Ok(())), &k);
    named(csum::load(&s), &k);
}

#[test]
fn a_checksum_run_past_every_target_is_named() {
    let s = store();
    let (k, v) = csum_item(T, PHYS_BLOCKS_MAX - 1, &[BlockCsum(7); 4]);
    s.insert(k, &v).unwrap();
    named(csum::lookup(&s, T, PHYS_BLOCKS_MAX - 1, 1), &k);
    named(csum::any(&s, T, PHYS_BLOCKS_MAX - 2, 2), &k);
    named(csum::load(&s), &k);
    // A record inside the block numbers that reads the damaged run.
    let clear = Record::CsumClear {
        target: T,
        phys: PHYS_BLOCKS_MAX - 4,
        len: 4,
    };
    named(apply_record(&s, &clear), &k);
}

#[test]
fn a_damaged_checksum_item_found_by_any_is_named() {
    let s = store();
    let (k, _) = csum_item(T, 1000, &[BlockCsum(7)]);
    s.insert(k, &[1, 2, 3]).unwrap();
    named(csum::any(&s, T, 990, 20), &k);
    named(csum::any(&s, T, 1000, 1), &k);
    named(csum::lookup(&s, T, 1000, 1), &k);
}

fn extent(len: u64, phys: u64) -> Extent {
    Extent {
        len,
        phys,
        state: ExtentState::Written,
        target: TargetId(0),
    }
}

#[test]
fn an_extent_whose_physical_run_overflows_is_named() {
    for phys in [u64::MAX - 1, PHYS_BLOCKS_MAX - 2] {
        let s = store();
        let k = extent_key(FILE, 0, 0);
        s.insert(k, &encode_extent(&extent(4, phys))).unwrap();
        named(load_inode(&s, FILE), &k);
        named(load_state(&s), &k);
        // The next extent, physically and logically adjacent: the window reads the
        // damaged one and would merge with it.
        let next = Record::ExtentSet {
            ino: FILE,
            object: 0,
            block: 4,
            len: 1,
            phys: 100,
            state: ExtentState::Written,
            target: TargetId(0),
        };
        named(apply_record(&s, &next), &k);
    }
}

/// Format version 3 stores an extent's target: one naming a target the store was not
/// given is corruption, named, where the runtime would otherwise index its target set
/// with it.
#[test]
fn an_extent_on_a_target_that_does_not_exist_is_named() {
    let s = store();
    let k = extent_key(FILE, 0, 0);
    let e = Extent {
        target: TargetId(s.targets_given()),
        ..extent(4, 100)
    };
    s.insert(k, &encode_extent(&e)).unwrap();
    named(load_inode(&s, FILE), &k);
    named(load_state(&s), &k);
    let next = Record::ExtentSet {
        ino: FILE,
        object: 0,
        block: 4,
        len: 1,
        phys: 104,
        state: ExtentState::Written,
        target: TargetId(0),
    };
    named(apply_record(&s, &next), &k);
}

#[test]
fn a_refcount_range_past_every_target_is_named() {
    for (start, len) in [(u64::MAX - 4, 4), (PHYS_BLOCKS_MAX - 1, 4)] {
        let s = store();
        let (k, v) = refcount_item(T, start, Shared { len, count: 2 });
        s.insert(k, &v).unwrap();
        named(refcount::load(&s), &k);
        if start < PHYS_BLOCKS_MAX {
            let rec = Record::RefcountSet {
                target: T,
                phys: start - 3,
                len: 4,
                count: 2,
            };
            named(apply_record(&s, &rec), &k);
        }
    }
}

#[test]
fn records_past_every_target_are_refused_before_any_item_is_read() {
    let s = store();
    let recs = [
        Record::CsumSet {
            target: T,
            phys: u64::MAX - 1,
            csums: vec![BlockCsum(1)],
        },
        Record::CsumClear {
            target: T,
            phys: PHYS_BLOCKS_MAX,
            len: 1,
        },
        Record::RefcountSet {
            target: T,
            phys: u64::MAX,
            len: 1,
            count: 2,
        },
        Record::ExtentSet {
            ino: FILE,
            object: 0,
            block: 0,
            len: 2,
            phys: PHYS_BLOCKS_MAX - 1,
            state: ExtentState::Written,
            target: TargetId(0),
        },
    ];
    for rec in recs {
        let e = apply_record(&s, &rec).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, MetaError::Corrupted(_)), "{rec:?}: {msg}");
        assert!(msg.contains("metadata record"), "{rec:?}: {msg}");
    }
}

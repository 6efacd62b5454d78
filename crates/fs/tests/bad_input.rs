//! Bad input: damaged, truncated, swapped, foreign or missing targets make mount and fsck
//! fail with a message naming what is wrong, never a panic; random damage to the metadata
//! regions never panics either.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{CreateParams, Fs, Ino, RenameMode};
use stripefs_core::btree::{PageAddr, TreeId};
use stripefs_core::codec::Enc;
use stripefs_core::inode::FileKind;
use stripefs_core::record::Record;
use stripefs_meta::{RootSlots, Store, StoreConfig};
use stripefs_target::{CrashMode, Rng, SimTarget, Target};

/// A small file system with some content; returns the targets after a clean unmount.
fn populated() -> Vec<Arc<SimTarget>> {
    let s = sims(3, 8 << 20);
    let fs = fresh(&s, 4096, 16384);
    for i in 0..5 {
        let a = fs
            .create(
                Ino::ROOT,
                format!("f{i}").as_ref(),
                CreateParams::with_perm(0o644),
            )
            .unwrap();
        fs.write_at(a.ino, 0, &pattern(i, 0, 70_000)).unwrap();
    }
    fs.unmount().unwrap();
    s
}

fn mount_err(t: Vec<Arc<dyn Target>>) -> String {
    match Fs::mount(t, quiet()) {
        Ok(_) => panic!("mount of a damaged file system succeeded"),
        Err(e) => e.to_string(),
    }
}

fn fsck_err(t: Vec<Arc<dyn Target>>) -> String {
    match stripefs::fsck::fsck(t, &mut |_| {}) {
        Ok(r) if !r.is_clean() => r.problems.join("; "),
        Ok(_) => panic!("fsck found a damaged file system clean"),
        Err(e) => e.to_string(),
    }
}

fn copy(s: &[Arc<SimTarget>]) -> Vec<Arc<SimTarget>> {
    s.iter()
        .enumerate()
        .map(|(i, t)| {
            Arc::new(SimTarget::from_image(
                &format!("sim{i}"),
                t.durable_image(),
                512,
            ))
        })
        .collect()
}

#[test]
fn corrupted_superblock_is_named() {
    let s = populated();
    s[1].corrupt(100, 0x04);
    for msg in [mount_err(dyns(&s)), fsck_err(dyns(&s))] {
        assert!(
            msg.contains("superblock of target sim1") && msg.contains("checksum"),
            "{msg}"
        );
    }
}

#[test]
fn not_a_stripefs_target() {
    let s = populated();
    let mut t = dyns(&s);
    t[2] = Arc::new(SimTarget::new("blank", 8 << 20, 512));
    let msg = mount_err(t);
    assert!(
        msg.contains("blank") && msg.contains("not a stripefs target"),
        "{msg}"
    );
}

/// Every page of every metadata tree of the durable root record: (tree, address, level).
fn tree_pages(s: &[Arc<SimTarget>]) -> Vec<(TreeId, PageAddr, u8)> {
    let (fs, _) = Fs::mount(dyns(&copy(s)), quiet()).unwrap();
    let geo = fs.geometry().clone();
    drop(fs);
    let cfg = StoreConfig {
        uuid: geo.uuid,
        page_size: geo.page_size(),
        block_size: geo.block_size,
        cache_bytes: 1 << 20,
        slots: RootSlots {
            target: stripefs_core::TargetId(0),
            offsets: geo.root_slot_offsets(),
        },
        space: stripefs_meta::SpaceBooks::Kept,
    };
    // Only read: the allocator is never asked for a page.
    let alloc = Arc::new(stripefs_meta::region::RegionAlloc::new(1, 0, 1, 0));
    let store = Store::open(cfg, dyns(s), alloc).unwrap();
    let mut out = Vec::new();
    for tree in TreeId::ALL {
        store
            .walk(tree, &mut |at, node| out.push((tree, at, node.level)))
            .unwrap();
    }
    out
}

/// The targets after a second mount and unmount that changed nothing: the newest root
/// record (written by that unmount) and the one before it reach the same pages.
fn populated_twice() -> Vec<Arc<SimTarget>> {
    let s = populated();
    let (fs, _) = Fs::mount(dyns(&s), quiet()).unwrap();
    fs.unmount().unwrap();
    s
}

#[test]
fn older_format_versions_are_refused_naming_the_version() {
    for old in [1u32, 2] {
        let s = populated();
        for t in &s {
            let mut sb = t.durable_image()[..512].to_vec();
            sb[8..12].copy_from_slice(&old.to_le_bytes());
            let crc = stripefs_core::crc32c(&sb[..508]);
            sb[508..].copy_from_slice(&crc.to_le_bytes());
            t.write_sync(0, stripefs_target::IoBuf::from_slice(&sb))
                .unwrap();
        }
        let want =
            format!("format version {old}, this build reads 3; there is no migration: mkfs again");
        for msg in [mount_err(dyns(&s)), fsck_err(dyns(&s))] {
            assert!(msg.contains(&want), "{msg}");
        }
    }
}

#[test]
fn damaged_root_record_slots_fall_back_or_are_refused_naming_both() {
    let s = populated_twice();
    let geo = Fs::mount(dyns(&copy(&s)), quiet())
        .unwrap()
        .0
        .geometry()
        .clone();
    let slots = geo.root_slot_offsets();
    // One slot damaged (either one): the other is used, every file is there, and fsck
    // warns about the damaged one without calling it a problem.
    for damaged in slots {
        let c = copy(&s);
        c[0].corrupt(damaged + 100, 0x10);
        let r = stripefs::fsck::fsck(dyns(&c), &mut |_| {}).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        let (fs, _) = Fs::mount(dyns(&c), quiet()).unwrap();
        assert_eq!(fs.readdir(Ino::ROOT).unwrap().len(), 5);
        let f = fs.lookup(Ino::ROOT, "f3".as_ref()).unwrap();
        let mut buf = vec![0u8; 70_000];
        fs.read_at(f.ino, 0, &mut buf).unwrap();
        assert_eq!(buf, pattern(3, 0, 70_000));
        fs.unmount().unwrap();
        // The next checkpoint (that unmount's) rewrote the damaged slot or left it older.
        let r = stripefs::fsck::fsck(dyns(&c), &mut |_| {}).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
    }
    let c = copy(&s);
    let r = {
        let c1 = copy(&s);
        c1[0].corrupt(slots[0] + 100, 0x10);
        stripefs::fsck::fsck(dyns(&c1), &mut |_| {}).unwrap()
    };
    assert!(
        r.warnings.iter().any(|w| w.contains("root record slot 0")),
        "{:?}",
        r.warnings
    );
    for off in slots {
        c[0].corrupt(off + 100, 0x10);
    }
    for msg in [mount_err(dyns(&c)), fsck_err(dyns(&c))] {
        assert!(
            msg.contains("metadata root records") && msg.contains("neither slot"),
            "{msg}"
        );
    }
}

#[test]
fn damaged_tree_leaf_page_is_refused_naming_the_tree_and_address() {
    let s = populated();
    let bs = 4096u64;
    let leaves: Vec<_> = tree_pages(&s)
        .into_iter()
        .filter(|(t, _, level)| *t == TreeId::Fs && *level == 0)
        .collect();
    assert!(!leaves.is_empty());
    for (tree, at, _) in leaves {
        let c = copy(&s);
        c[at.target.index()].corrupt(at.block.0 * bs + 1000, 0x08);
        let want = format!("metadata page of tree {tree} at {at}");
        for msg in [mount_err(dyns(&c)), fsck_err(dyns(&c))] {
            assert!(msg.contains(&want) && msg.contains("checksum"), "{msg}");
        }
    }
}

#[test]
fn corrupted_journal_record_before_later_ones_is_corruption() {
    let s = sims(2, 8 << 20);
    let fs = fresh(&s, 4096, 16384);
    for i in 0..4 {
        let a = fs
            .create(
                Ino::ROOT,
                format!("f{i}").as_ref(),
                CreateParams::with_perm(0o644),
            )
            .unwrap();
        fs.write_at(a.ino, 0, b"data").unwrap();
        fs.fsync(a.ino, stripefs::SyncScope::All).unwrap();
    }
    let pos = fs.status().journal;
    let geo = fs.geometry().clone();
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    assert!(
        pos.head - pos.tail >= 4,
        "expected several journal records, head {} tail {}",
        pos.head,
        pos.tail
    );
    // Flip a payload byte of the first record after the checkpoint.
    s[0].corrupt(geo.journal_unit_offset(pos.tail) + 80, 0x01);
    let msg = mount_err(dyns(&s));
    assert!(
        msg.contains("journal transaction") && msg.contains("later transactions exist"),
        "{msg}"
    );
    assert!(fsck_err(dyns(&s)).contains("journal transaction"));
}

/// Journal position and sequence of one committed transaction.
#[derive(Debug, Clone, Copy)]
struct Logged {
    lsn: u64,
    seq: u64,
}

/// Seven operations, each acknowledged by `sync` as its own journal transaction after the
/// mount's checkpoint (creates with data, a mkdir, an append, a rename, an unlink), then a
/// crash that keeps exactly what was flushed. Returns the targets and the transactions.
fn seven_acknowledged() -> (Vec<Arc<SimTarget>>, Vec<Logged>) {
    let s = sims(2, 8 << 20);
    let fs = fresh(&s, 4096, 16384);
    let mut logged = Vec::new();
    let mut step = |fs: &Fs, op: &dyn Fn(&Fs)| {
        let lsn = fs.status().journal.head;
        op(fs);
        fs.sync().unwrap();
        let st = fs.status();
        assert!(st.journal.head > lsn, "each step is its own transaction");
        logged.push(Logged {
            lsn,
            seq: st.committed_seq,
        });
    };
    let p = || CreateParams::with_perm(0o644);
    step(&fs, &|fs| {
        let a = fs.create(Ino::ROOT, "f1".as_ref(), p()).unwrap();
        fs.write_at(a.ino, 0, &pattern(1, 0, 5000)).unwrap();
    });
    step(&fs, &|fs| {
        let a = fs.create(Ino::ROOT, "f2".as_ref(), p()).unwrap();
        fs.write_at(a.ino, 0, &pattern(2, 0, 5000)).unwrap();
    });
    step(&fs, &|fs| {
        fs.mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
            .unwrap();
    });
    step(&fs, &|fs| {
        let a = fs.lookup(Ino::ROOT, "f1".as_ref()).unwrap();
        fs.write_at(a.ino, 5000, &pattern(1, 5000, 3000)).unwrap();
    });
    step(&fs, &|fs| {
        let d = fs.lookup(Ino::ROOT, "d".as_ref()).unwrap();
        fs.rename(
            Ino::ROOT,
            "f2".as_ref(),
            d.ino,
            "g".as_ref(),
            RenameMode::Replace,
        )
        .unwrap();
    });
    step(&fs, &|fs| {
        let a = fs.create(Ino::ROOT, "f3".as_ref(), p()).unwrap();
        fs.write_at(a.ino, 0, &pattern(3, 0, 100)).unwrap();
    });
    step(&fs, &|fs| fs.unlink(Ino::ROOT, "f1".as_ref()).unwrap());
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    (s, logged)
}

#[test]
fn damaged_first_header_before_acknowledged_ones_is_corruption() {
    let (s, logged) = seven_acknowledged();
    assert_eq!(logged.len(), 7);
    let geo = Fs::mount(dyns(&copy(&s)), quiet())
        .unwrap()
        .0
        .geometry()
        .clone();
    let first = logged[0];
    s[0].corrupt(geo.journal_unit_offset(first.lsn) + 40, 0x01);
    let name = format!(
        "journal transaction {} at journal unit {}",
        first.seq, first.lsn
    );
    for msg in [mount_err(dyns(&s)), fsck_err(dyns(&s))] {
        assert!(
            msg.contains(&name) && msg.contains("later transactions exist"),
            "{msg}"
        );
    }
}

/// Every damaged transaction followed by acknowledged ones is refused by mount and fsck,
/// naming it, wherever the damage is in its header (magic, checksums, uuid, position,
/// sequence, length, reserved bytes) or payload; the same damage to the last transaction
/// is a torn write: mount keeps exactly the transactions before it.
#[test]
fn every_damaged_transaction_before_acknowledged_ones_is_refused() {
    let (s, logged) = seven_acknowledged();
    let geo = Fs::mount(dyns(&copy(&s)), quiet())
        .unwrap()
        .0
        .geometry()
        .clone();
    let last = logged.len() - 1;
    for (i, t) in logged.iter().enumerate() {
        for byte in [0, 5, 9, 13, 20, 31, 33, 41, 49, 53, 60, 64, 90] {
            let c = copy(&s);
            c[0].corrupt(geo.journal_unit_offset(t.lsn) + byte, 0x10);
            if i < last {
                let name = format!("journal transaction {} at journal unit {}", t.seq, t.lsn);
                for msg in [mount_err(dyns(&c)), fsck_err(dyns(&c))] {
                    assert!(
                        msg.contains(&name) && msg.contains("later transactions exist"),
                        "transaction {i} byte {byte}: {msg}"
                    );
                }
                continue;
            }
            let report = stripefs::fsck::fsck(dyns(&c), &mut |_| {}).unwrap();
            assert!(
                report.is_clean(),
                "torn last transaction: {:?}",
                report.problems
            );
            let (fs, r) = Fs::mount(dyns(&c), quiet()).expect("a torn last write mounts");
            assert_eq!(r.replayed_txns, last as u64, "byte {byte}");
            assert!(
                fs.lookup(Ino::ROOT, "f1".as_ref()).is_ok(),
                "unlink was torn"
            );
            assert!(fs.lookup(Ino::ROOT, "f3".as_ref()).is_ok());
            fs.unmount().unwrap();
        }
    }
}

/// Rewrites transaction `t` with its records changed by `alter`, checksums recomputed (a
/// software bug or a crafted image, not a torn write). Returns the changed targets.
fn rewrite_txn(
    s: &[Arc<SimTarget>],
    geo: &stripefs_core::geometry::Geometry,
    t: Logged,
    alter: &dyn Fn(&mut Record),
) -> Vec<Arc<SimTarget>> {
    use stripefs_core::journal::{decode_header, encode_txn, verify_payload};
    let mut img = s[0].durable_image();
    let unit = geo.journal_unit as usize;
    let at = geo.journal_unit_offset(t.lsn) as usize;
    let hdr = decode_header(&img[at..at + unit], geo.uuid, t.lsn, t.seq, 64).unwrap();
    let whole = &img[at..at + hdr.units as usize * unit];
    let mut recs = Record::decode_all(verify_payload(&hdr, whole).unwrap(), "test").unwrap();
    recs.iter_mut().for_each(alter);
    let mut e = Enc::new();
    recs.iter().for_each(|r| r.encode(&mut e));
    let buf = encode_txn(geo.uuid, t.lsn, t.seq, &e.buf, geo.journal_unit);
    assert_eq!(
        buf.len(),
        whole.len(),
        "the altered transaction keeps its length"
    );
    img[at..at + buf.len()].copy_from_slice(&buf);
    let mut out = copy(s);
    out[0] = Arc::new(SimTarget::from_image("sim0", img, 512));
    out
}

/// Journal records whose checksums verify but which break a rule fsck checks: mount
/// refuses them, naming the transaction, instead of serving (and checkpointing) them; and
/// mount and fsck agree on every case.
#[test]
fn journal_records_that_fsck_rejects_are_refused_by_mount() {
    let (s, logged) = seven_acknowledged();
    let geo = Fs::mount(dyns(&copy(&s)), quiet())
        .unwrap()
        .0
        .geometry()
        .clone();
    // Transaction 0 creates f1 and writes its first 5000 bytes.
    let t = logged[0];
    type Alter = Box<dyn Fn(&mut Record)>;
    let cases: Vec<(&str, &str, Alter)> = vec![
        (
            "target",
            "extent on target 10241, of 2 targets",
            Box::new(|r| {
                if let Record::ExtentSet { target, .. } = r {
                    *target = stripefs_core::TargetId(10241);
                }
            }),
        ),
        (
            "range",
            "outside the data area",
            Box::new(|r| {
                if let Record::ExtentSet { phys, .. } = r {
                    *phys = 1;
                }
            }),
        ),
        (
            "object",
            "has no object 9",
            Box::new(|r| {
                if let Record::ExtentSet { object, .. } = r {
                    *object = 9;
                }
            }),
        ),
        (
            "inode existence",
            "points to missing inode 4242",
            Box::new(|r| {
                if let Record::DirAdd { ino, .. } = r {
                    *ino = Ino(4242);
                }
            }),
        ),
        (
            "link count",
            "has link count 3, but 1 entries reference it",
            Box::new(|r| {
                if let Record::InodeSet(a) = r {
                    if a.kind == FileKind::Regular {
                        a.nlink = 3;
                    }
                }
            }),
        ),
        (
            "entry name",
            "invalid entry name",
            Box::new(|r| {
                if let Record::DirAdd { name, .. } = r {
                    name[0] = b'/';
                }
            }),
        ),
    ];
    let name = format!("journal transaction {} at journal unit {}", t.seq, t.lsn);
    for (kind, why, alter) in &cases {
        let c = rewrite_txn(&s, &geo, t, alter.as_ref());
        let mount = mount_err(dyns(&c));
        assert!(
            mount.contains(&name) && mount.contains(why),
            "{kind}: {mount}"
        );
        let fsck = fsck_err(dyns(&c));
        assert!(fsck.contains(&name) && fsck.contains(why), "{kind}: {fsck}");
    }
    // The untouched image mounts, so each refusal above is the altered record's.
    let c = rewrite_txn(&s, &geo, t, &|_| {});
    Fs::mount(dyns(&c), quiet()).unwrap().0.unmount().unwrap();
}

#[test]
fn truncated_target_is_named() {
    let s = populated();
    let mut img = s[2].durable_image();
    img.truncate(img.len() / 2);
    let mut t = dyns(&s);
    t[2] = Arc::new(SimTarget::from_image("short", img, 512));
    let msg = mount_err(t);
    assert!(msg.contains("short") && msg.contains("truncated"), "{msg}");
}

#[test]
fn swapped_targets_mount_in_index_order() {
    let s = populated();
    let mut t = dyns(&s);
    t.swap(0, 2);
    t.swap(1, 2);
    let (fs, _) = Fs::mount(t, quiet()).expect("targets are ordered by their superblocks");
    let a = fs.lookup(Ino::ROOT, "f3".as_ref()).unwrap();
    let mut buf = vec![0u8; 70_000];
    fs.read_at(a.ino, 0, &mut buf).unwrap();
    assert_eq!(buf, pattern(3, 0, 70_000));
    fs.unmount().unwrap();
}

#[test]
fn wrong_target_sets_are_named() {
    let s = populated();
    let other = populated();
    let mut t = dyns(&s);
    t[1] = Arc::clone(&other[1]) as Arc<dyn Target>;
    let msg = mount_err(t);
    assert!(msg.contains("different file systems"), "{msg}");
    let msg = mount_err(dyns(&s[..2]));
    assert!(
        msg.contains("has 3 targets from mkfs but 2 were given")
            && msg.contains("missing target index 2"),
        "{msg}"
    );
    let mut t = dyns(&s);
    t[2] = Arc::clone(&s[1]) as Arc<dyn Target>;
    let msg = mount_err(t);
    assert!(msg.contains("given twice"), "{msg}");
    assert!(mount_err(Vec::new()).contains("no targets"));
}

#[test]
fn random_metadata_damage_never_panics() {
    let s = populated();
    let geo = Fs::mount(dyns(&copy(&s)), quiet())
        .unwrap()
        .0
        .geometry()
        .clone();
    let bs = u64::from(geo.block_size.bytes());
    let meta_end = geo.targets[0].data_start * bs;
    let pages = tree_pages(&s);
    let mut rng = Rng::new(99);
    let (mut failed, mut mounted) = (0, 0);
    for _ in 0..300 {
        let c = copy(&s);
        for _ in 0..rng.range(1, 8) {
            let t = rng.below(3) as usize;
            let (t, at) = match rng.below(3) {
                // Superblocks, root record slots and the journal.
                0 if t == 0 => (0, rng.below(meta_end)),
                0 => (t, rng.below(4096)),
                // A page of a metadata tree.
                _ => {
                    let (_, p, _) = pages[rng.below(pages.len() as u64) as usize];
                    (p.target.index(), p.block.0 * bs + rng.below(bs))
                }
            };
            c[t].corrupt(at, 1 << rng.below(8));
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let fsck = stripefs::fsck::fsck(dyns(&c), &mut |_| {}).map(|r| r.is_clean());
            let mount = Fs::mount(dyns(&c), quiet()).map(|(fs, _)| {
                for e in fs.readdir(Ino::ROOT).unwrap_or_default() {
                    let mut buf = vec![0u8; 4096];
                    let _ = fs.read_at(e.ino, 0, &mut buf);
                }
            });
            (fsck.is_ok(), mount.is_ok())
        }));
        let (_, m) = outcome.expect("damaged metadata caused a panic");
        if m {
            mounted += 1;
        } else {
            failed += 1;
        }
    }
    eprintln!("random damage: {failed} refused, {mounted} mounted (damage hit unused bytes)");
    assert!(failed > 0);
}

/// A link count broken more than a replay window after the file's create (decision 121):
/// replay drops its partial model after each window, and must still read the file whose
/// second name an unlink removes, to check its link count. The unlink's `InodeSet` of
/// the file is redirected to another file, so only the `DirRemove` names it.
#[test]
fn a_link_count_broken_a_window_after_the_create_is_refused() {
    let s = sims(2, 8 << 20);
    let fs = fresh(&s, 4096, 16384);
    let before = fs.status().checkpoints;
    let p = || CreateParams::with_perm(0o644);
    let f = fs.create(Ino::ROOT, "f".as_ref(), p()).unwrap().ino;
    fs.link(f, Ino::ROOT, "g".as_ref()).unwrap();
    // Far more distinct keys than the smallest cache's window (256) between the link
    // and the unlink.
    let others: Vec<Ino> = (0..400)
        .map(|i| {
            let name = format!("o{i}");
            fs.create(Ino::ROOT, name.as_ref(), p()).unwrap().ino
        })
        .collect();
    fs.sync().unwrap();
    let lsn = fs.status().journal.head;
    fs.unlink(Ino::ROOT, "g".as_ref()).unwrap();
    fs.sync().unwrap();
    let st = fs.status();
    assert_eq!(st.checkpoints, before, "the journal holds the create");
    let t = Logged {
        lsn,
        seq: st.committed_seq,
    };
    let geo = fs.geometry().clone();
    std::mem::forget(fs);
    for t in &s {
        t.crash(CrashMode::DropUnflushed);
    }
    let h = others[0];
    let c = rewrite_txn(&s, &geo, t, &|r| {
        if let Record::InodeSet(a) = r {
            if a.ino == f {
                a.ino = h;
            }
        }
    });
    let small = || stripefs::MountOptions {
        meta_cache: stripefs::MetaCacheBytes(64 * 4096),
        ..quiet()
    };
    let err = match Fs::mount(dyns(&c), small()) {
        Ok(_) => panic!("mount of a journal with a broken link count succeeded"),
        Err(e) => e.to_string(),
    };
    let why = format!("inode {f} has link count 2, but 1 entries reference it");
    assert!(err.contains(&why), "{err}");
    // The untouched journal mounts with the same cache.
    let c = rewrite_txn(&s, &geo, t, &|_| {});
    Fs::mount(dyns(&c), small()).unwrap().0.unmount().unwrap();
}

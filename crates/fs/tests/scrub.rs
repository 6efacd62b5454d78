//! Scrub (issue 12; `docs/design/scrub.md`, decision 75): every checksummed block is
//! read and verified once per file mapping it, a damaged block is reported by file,
//! offset, target and block, and a scrub driven one block per step resumes from its
//! cursor and covers the same blocks.
mod common;

/// Targets, the mounted fs, the checksummed blocks a scrub must verify, the files.
type Populated = (Vec<Arc<SimTarget>>, Fs, u64, Vec<(Ino, Vec<u8>)>);

use std::sync::Arc;

use common::*;
use stripefs::{CreateParams, Fs, Ino, ScrubCursor, ScrubStep, SyncScope};
use stripefs_target::SimTarget;

fn cow_opts() -> stripefs::MountOptions {
    stripefs::MountOptions {
        datacow: stripefs::DataCow::On,
        ..quiet()
    }
}

fn mount(s: &[Arc<SimTarget>], opts: stripefs::MountOptions) -> Fs {
    Fs::mount(dyns(s), opts).expect("mount").0
}

fn file(fs: &Fs, name: &str) -> Ino {
    fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .expect("create")
        .ino
}

/// Every step from the start with `budget`, summed; the number of steps.
fn scrub_all(fs: &Fs, budget: u64) -> (ScrubStep, u64) {
    let mut total = ScrubStep::default();
    let mut at = Some(ScrubCursor::START);
    let mut steps = 0;
    while let Some(c) = at {
        let s = fs.scrub_step(c, budget).expect("scrub step");
        if let Some(n) = s.next {
            assert!(n > c, "the cursor moves forward: {c:?} -> {n:?}");
        }
        steps += 1;
        assert!(steps < 100_000, "scrub does not end");
        total.blocks += s.blocks;
        total.bytes += s.bytes;
        total.mismatches.extend(s.mismatches);
        total.read_errors.extend(s.read_errors);
        at = s.next;
    }
    (total, steps)
}

/// Three datacow files (one a clone sharing the other's blocks, one sparse), one NOCOW
/// file; written, synced, remounted (cold caches, records in the trees), then two more
/// files only in core. Returns the targets, the fs, the checksummed blocks expected and
/// the files.
fn populated() -> Populated {
    let s = sims(2, 32 << 20);
    fresh(&s, 4096, 64 << 10).unmount().expect("unmount");
    let fs = mount(&s, cow_opts());
    let a = file(&fs, "a");
    let da = pattern(1, 0, 1 << 20);
    fs.write_at(a, 0, &da).unwrap();
    let b = file(&fs, "b");
    fs.clone_range(a, 0, b, 0, 1 << 20).unwrap();
    let c = file(&fs, "c");
    let mut dc = vec![0u8; 3 << 20];
    let piece = pattern(3, 0, 8192);
    dc[2 << 20..(2 << 20) + 8192].copy_from_slice(&piece);
    fs.write_at(c, 2 << 20, &piece).unwrap();
    let plain = file(&fs, "plain");
    fs.set_file_flags(plain, stripefs::FileFlags::NOCOW)
        .unwrap();
    fs.write_at(plain, 0, &pattern(4, 0, 256 << 10)).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&s, cow_opts());
    // In core only: created after the mount, their records not yet in the trees.
    let d = file(&fs, "d");
    let dd = pattern(5, 0, 40960);
    fs.write_at(d, 0, &dd).unwrap();
    fs.fsync(d, SyncScope::All).unwrap();
    // a: 256 blocks, b: the same 256 (checked again), c: 2, d: 10; plain: none.
    let want = 256 + 256 + 2 + 10;
    (
        s,
        fs,
        want,
        vec![(a, da.clone()), (b, da), (c, dc), (d, dd)],
    )
}

#[test]
fn a_clean_file_system_scrubs_clean_with_every_checksummed_block_counted() {
    let (_s, fs, want, _) = populated();
    fs.check_csums().unwrap();
    let (t, steps) = scrub_all(&fs, 1 << 20);
    assert!(t.mismatches.is_empty(), "{:?}", t.mismatches);
    assert!(t.read_errors.is_empty(), "{:?}", t.read_errors);
    assert_eq!(t.blocks, want, "every checksummed block, once per owner");
    assert_eq!(t.bytes, want * 4096);
    assert_eq!(
        steps, 5,
        "one step per datacow file with data, one to find the end"
    );
    assert_eq!(fs.status().csum_errors, 0);
}

#[test]
fn a_damaged_block_is_reported_by_file_offset_target_and_block() {
    let (s, fs, want, files) = populated();
    let (a, _) = files[0];
    let (c, _) = files[2];
    // Block 77 of a (shared with b) and the second block of c.
    let mut damaged = Vec::new();
    for (ino, off) in [(a, 77 * 4096), (c, (2 << 20) + 4096)] {
        let r = fs
            .extents(ino)
            .unwrap()
            .into_iter()
            .find(|r| r.written && r.file_off <= off && off < r.file_off + r.len)
            .expect("mapped");
        let at = r.target_off + (off - r.file_off);
        s[r.target as usize].corrupt(at + 5, 0x01);
        damaged.push((ino, off, r.target, at / 4096));
    }
    let (t, _) = scrub_all(&fs, 1 << 20);
    assert!(t.read_errors.is_empty(), "{:?}", t.read_errors);
    assert_eq!(t.blocks, want, "the damaged blocks are counted as checked");
    let got: Vec<(Ino, u64, u32, u64)> = t
        .mismatches
        .iter()
        .map(|m| (m.ino, m.file_off, m.target.0, m.phys))
        .collect();
    let (b, _) = files[1];
    let (_, aoff, at, ap) = damaged[0];
    let mut expect = vec![damaged[0], (b, aoff, at, ap), damaged[1]];
    expect.sort();
    let mut got_sorted = got.clone();
    got_sorted.sort();
    assert_eq!(got_sorted, expect, "exactly the damaged blocks, per owner");
    assert_eq!(
        fs.status().csum_errors,
        3,
        "counted with the reads' mismatches"
    );
}

#[test]
fn a_budget_of_one_block_resumes_from_the_cursor_and_covers_everything() {
    let (s, fs, want, files) = populated();
    let (d, _) = files[3];
    let r = fs.extents(d).unwrap()[0];
    let off = 3 * 4096;
    s[r.target as usize].corrupt(r.target_off + off + 9, 0x80);
    let (t, steps) = scrub_all(&fs, 1);
    assert_eq!(t.blocks, want);
    assert!(steps > want, "one block per step: {steps} steps");
    let got: Vec<(Ino, u64)> = t.mismatches.iter().map(|m| (m.ino, m.file_off)).collect();
    assert_eq!(got, vec![(d, off)]);
    // The files still read as written, but for the damaged block.
    for (ino, data) in &files[..3] {
        let mut buf = vec![0u8; data.len()];
        fs.read_at(*ino, 0, &mut buf).unwrap();
        assert!(buf == *data);
    }
}

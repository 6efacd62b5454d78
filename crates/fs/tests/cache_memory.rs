//! The page cache keeps to its budget: dirtying four times the dirty limit (and reading
//! more than the whole budget) never makes the resident cache exceed the memory budget;
//! writers are throttled and clean folios evicted. The numbers are printed for the record.
mod common;

use common::*;
use stripefs::{CreateParams, Fs, Ino, MkfsOptions};

#[test]
fn dirtying_four_times_the_dirty_limit_stays_within_budget() {
    let s = sims(4, 64 << 20);
    Fs::mkfs(
        &dyns(&s),
        &MkfsOptions {
            stripe_unit: 65536,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let mut o = quiet();
    o.cache.folio_bytes = 64 << 10;
    o.cache.budget_bytes = 8 << 20;
    o.cache.dirty_limit_bytes = 2 << 20;
    let (fs, _) = Fs::mount(dyns(&s), o.clone()).unwrap();
    let f = fs
        .create(Ino::ROOT, "big".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let total = 4 * o.cache.dirty_limit_bytes;
    let chunk = 256 << 10;
    let mut peak_dirty = 0;
    for off in (0..total).step_by(chunk) {
        fs.write_at(f.ino, off, &pattern(off, off, chunk)).unwrap();
        peak_dirty = peak_dirty.max(fs.status().cache.dirty_bytes);
    }
    // Reading back 8 MiB more than the budget holds forces eviction.
    let g = fs
        .create(Ino::ROOT, "other".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    fs.write_at(g.ino, 0, &vec![7u8; 16 << 20]).unwrap();
    fs.fsync(g.ino, stripefs::SyncScope::All).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for off in (0..16u64 << 20).step_by(1 << 20) {
        fs.read_at(g.ino, off, &mut buf).unwrap();
    }
    for off in (0..total).step_by(chunk) {
        let mut b = vec![0u8; chunk];
        fs.read_at(f.ino, off, &mut b).unwrap();
        assert!(
            b == pattern(off, off, chunk),
            "data at {off} survived throttling and eviction"
        );
    }
    let st = fs.status().cache;
    eprintln!(
        "cache: budget {} KiB, dirty limit {} KiB, dirtied {} KiB; peak resident {} KiB, peak dirty seen {} KiB, evicted {} folios",
        o.cache.budget_bytes >> 10,
        o.cache.dirty_limit_bytes >> 10,
        total >> 10,
        st.peak_resident_bytes >> 10,
        peak_dirty >> 10,
        st.evicted_folios
    );
    assert!(
        st.peak_resident_bytes <= o.cache.budget_bytes,
        "resident {} over budget {}",
        st.peak_resident_bytes,
        o.cache.budget_bytes
    );
    assert!(
        peak_dirty <= o.cache.dirty_limit_bytes + chunk as u64,
        "dirty {peak_dirty} far over the limit"
    );
    assert!(st.evicted_folios > 0, "reading past the budget evicts");
    fs.unmount().unwrap();
}

#[test]
fn writers_and_readers_on_different_folios_of_one_file() {
    let s = sims(3, 64 << 20);
    let fs = fresh(&s, 4096, 65536);
    let f = fs
        .create(Ino::ROOT, "shared".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let region = 1u64 << 20;
    let threads = 4u64;
    fs.write_at(f.ino, 0, &vec![0u8; (region * threads) as usize])
        .unwrap();
    std::thread::scope(|sc| {
        for t in 0..threads {
            let fs = fs.clone();
            sc.spawn(move || {
                for round in 0..20u64 {
                    let off = t * region + (round * 37 * 4096) % region;
                    let data = pattern(t * 1000 + round, off, 5000);
                    fs.write_at(f.ino, off, &data).unwrap();
                    let mut back = vec![0u8; 5000];
                    fs.read_at(f.ino, off, &mut back).unwrap();
                    assert!(
                        back == data,
                        "thread {t} round {round}: own write not read back"
                    );
                }
            });
        }
        let fs2 = fs.clone();
        sc.spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            for i in 0..200u64 {
                fs2.read_at(f.ino, (i * 65536) % (region * threads), &mut buf)
                    .unwrap();
            }
        });
    });
    fs.fsync(f.ino, stripefs::SyncScope::All).unwrap();
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// Small files get small folios: 4 KiB files in a cache whose largest folio is 64 KiB
/// occupy 4 KiB each, so sixteen times more of them fit the budget than with one folio
/// size for all (`folio_sizing = fixed`, the behaviour before).
#[test]
fn small_files_occupy_small_folios() {
    let s = sims(3, 64 << 20);
    let fs = fresh(&s, 4096, 65536);
    fs.unmount().unwrap();
    let mut o = quiet();
    o.cache.folio_bytes = 64 << 10;
    o.cache.budget_bytes = 32 << 20;
    o.cache.dirty_limit_bytes = 8 << 20;
    let (fs, _) = Fs::mount(dyns(&s), o).unwrap();
    let files = 256u64;
    for i in 0..files {
        let f = fs
            .create(
                Ino::ROOT,
                format!("small{i}").as_ref(),
                CreateParams::with_perm(0o644),
            )
            .unwrap();
        fs.write_at(f.ino, 0, &pattern(i, 0, 4096)).unwrap();
    }
    let st = fs.status().cache;
    assert_eq!(
        st.resident_bytes,
        files * 4096,
        "each 4 KiB file occupies one 4 KiB folio"
    );
    // A large file written sequentially in 4 KiB writes ramps up to 64 KiB folios.
    let big = fs
        .create(Ino::ROOT, "big".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    for off in (0..1u64 << 20).step_by(4096) {
        fs.write_at(big.ino, off, &pattern(7, off, 4096)).unwrap();
    }
    let st2 = fs.status().cache;
    let big_folios = st2.clean_folios + st2.dirty_folios + st2.writeback_folios
        - (st.clean_folios + st.dirty_folios + st.writeback_folios);
    // 4, 4, 8, 16, 32 KiB, then fifteen 64 KiB folios.
    assert_eq!(big_folios, 5 + 15, "folios of the 1 MiB file");
    assert_eq!(st2.resident_bytes - st.resident_bytes, 1 << 20);
    let mut back = vec![0u8; 4096];
    for i in 0..files {
        let ino = fs
            .lookup(Ino::ROOT, format!("small{i}").as_ref())
            .unwrap()
            .ino;
        fs.read_at(ino, 0, &mut back).unwrap();
        assert!(back == pattern(i, 0, 4096), "small file {i} reads back");
    }
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

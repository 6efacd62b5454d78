//! Per-block data checksums (issue 12, second half; `docs/design/reflink.md`, "Data
//! checksums"): a byte flipped in a checksummed data block on a target fails every read
//! path that meets it (buffered fill, readahead, direct read, sub-block direct read) with
//! `EIO`, counts it, never returns the bad bytes, and leaves the other blocks readable;
//! clones share the checksums of the blocks they share; the index stays exact (what the
//! extent maps derive) across writes, clones, copy on write, truncate, punch and unlink,
//! whether the checkpointer applied the records or they are still in core.
mod common;

use std::sync::Arc;

use common::*;
use stripefs::{CreateParams, Fs, Ino, SyncScope};
use stripefs_target::SimTarget;

const K: u64 = 1024;

/// A copy-on-write (checksummed) file.
fn datacow_file(fs: &Fs, name: &str) -> Ino {
    let ino = fs
        .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .expect("create")
        .ino;
    assert!(!fs
        .file_flags(ino)
        .unwrap()
        .contains(stripefs::FileFlags::NOCOW));
    ino
}

/// Mount options: deterministic, new files copy on write.
fn cow_opts() -> stripefs::MountOptions {
    stripefs::MountOptions {
        datacow: stripefs::DataCow::On,
        ..quiet()
    }
}

fn mount(s: &[Arc<SimTarget>]) -> Fs {
    Fs::mount(dyns(s), cow_opts()).expect("mount").0
}

fn fresh_cow(s: &[Arc<SimTarget>]) -> Fs {
    fresh(s, 4096, 64 << 10).unmount().expect("unmount");
    mount(s)
}

fn remount(s: &[Arc<SimTarget>], fs: Fs) -> Fs {
    fs.unmount().expect("unmount");
    drop(fs);
    mount(s)
}

/// The target and byte offset on it of the file's byte `off`.
fn where_is(fs: &Fs, ino: Ino, off: u64) -> (usize, u64) {
    let r = fs
        .extents(ino)
        .expect("extents")
        .into_iter()
        .find(|r| r.file_off <= off && off < r.file_off + r.len && r.written)
        .expect("written block");
    (r.target as usize, r.target_off + (off - r.file_off))
}

fn is_eio<T: std::fmt::Debug>(r: &Result<T, stripefs::FsError>) -> bool {
    matches!(r, Err(e) if e.errno() == 5)
}

#[test]
fn a_flipped_byte_fails_every_read_path_with_eio_and_nothing_else() {
    let s = sims(2, 32 << 20);
    let fs = fresh_cow(&s);
    let a = datacow_file(&fs, "a");
    let data = pattern(7, 0, 1 << 20);
    fs.write_at(a, 0, &data).unwrap();
    fs.fsync(a, SyncScope::All).unwrap();
    fs.check_csums().unwrap();
    // A cold cache, and the records applied to the trees (the lookups read them).
    let fs = remount(&s, fs);
    let bad = 200 * K; // inside block 50
    let (t, at) = where_is(&fs, a, bad);
    s[t].corrupt(at + 17, 0x40);
    let block = |fs: &Fs| -> Result<Vec<u8>, stripefs::FsError> {
        let mut b = vec![0u8; 4096];
        fs.read_at(a, bad / 4096 * 4096, &mut b).map(|_| b)
    };
    assert_eq!(fs.status().csum_errors, 0);

    // Buffered: the block read alone (fill).
    assert!(is_eio(&block(&fs)), "buffered read of the damaged block");
    let after_fill = fs.status().csum_errors;
    assert!(after_fill >= 1, "the mismatch is counted");
    // Buffered, other blocks: every byte outside the damaged block's folio (the cache
    // fills whole folios, at most 64 KiB here) reads as written (readahead may meet the
    // damaged block; the read itself does not).
    let mut head = vec![0u8; (192 * K) as usize];
    fs.read_at(a, 0, &mut head).unwrap();
    assert!(head == data[..head.len()], "the blocks before it read fine");
    let tail_at = 256 * K;
    let mut tail = vec![0u8; (1 << 20) - tail_at as usize];
    fs.read_at(a, tail_at, &mut tail).unwrap();
    assert!(
        tail == data[tail_at as usize..],
        "the blocks after it read fine"
    );
    // Again: a failed read leaves nothing cached that a later read would return.
    assert!(
        is_eio(&block(&fs)),
        "buffered read of the damaged block, again"
    );

    // Direct: whole blocks, and a sub-block read of the damaged block (widened to the
    // block and verified), and a sub-block read of a good block.
    let mut d = vec![0u8; 16 * 4096];
    let r = fs.read_direct(a, 192 * K, &mut d);
    assert!(is_eio(&r), "direct read over the damaged block: {r:?}");
    let mut sector = vec![0u8; 512];
    let r = fs.read_direct(a, bad / 4096 * 4096 + 1024, &mut sector);
    assert!(
        is_eio(&r),
        "sub-block direct read of the damaged block: {r:?}"
    );
    fs.read_direct(a, 64 * K + 1536, &mut sector).unwrap();
    assert!(sector == data[(64 * K + 1536) as usize..(64 * K + 2048) as usize]);
    fs.read_direct(a, 0, &mut d).unwrap();
    assert!(d == data[..d.len()], "direct read of good blocks");
    // Direct reads are verified block by block: its neighbours read fine.
    for nb in [bad / 4096 - 1, bad / 4096 + 1] {
        let mut one = vec![0u8; 4096];
        fs.read_direct(a, nb * 4096, &mut one).unwrap();
        assert!(one == data[(nb * 4096) as usize..][..4096], "block {nb}");
    }
    assert!(
        fs.status().csum_errors > after_fill,
        "direct reads count too"
    );

    // Readahead: a sequential reader from a fresh mount; the window holding the
    // damaged block fails its verification and the block is read again (and fails) by
    // the read that reaches it.
    let fs = remount(&s, fs);
    let mut got = Vec::new();
    let mut off = 0;
    let mut failed_at = None;
    while off < 1 << 20 {
        let mut b = vec![0u8; 16 * K as usize];
        match fs.read_at(a, off, &mut b) {
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) => {
                assert_eq!(e.errno(), 5, "{e}");
                failed_at.get_or_insert(off);
                got.extend_from_slice(&data[off as usize..(off + 16 * K) as usize]);
            }
        }
        off += 16 * K;
    }
    assert_eq!(
        failed_at,
        Some(192 * K),
        "only the read holding the block fails"
    );
    assert!(got == data, "no other read returned anything but the data");
    let st = fs.status();
    assert!(st.csum_errors >= 1);
    assert!(
        st.cache.readahead_failed_reads > 0,
        "the readahead read met the damage: {:?}",
        st.cache
    );

    // Repaired on the device: the same reads succeed.
    s[t].corrupt(at + 17, 0x40);
    let fs = remount(&s, fs);
    assert!(block(&fs).unwrap() == data[(bad / 4096 * 4096) as usize..][..4096]);
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck");
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn clones_share_checksums_and_the_index_stays_exact() {
    let s = sims(3, 32 << 20);
    let fs = fresh_cow(&s);
    let a = datacow_file(&fs, "a");
    let data = pattern(3, 0, 512 * K as usize);
    fs.write_at(a, 0, &data).unwrap();
    fs.sync().unwrap();
    fs.check_csums().unwrap();
    let b = datacow_file(&fs, "b");
    fs.clone_file(a, b).unwrap();
    fs.check_csums().unwrap();
    // Copy on write in each, partial and whole blocks, buffered and direct.
    fs.write_at(a, 5000, &pattern(4, 5000, 9000)).unwrap();
    fs.write_direct(b, 4096 * 3 + 512, &pattern(5, 0, 1024))
        .unwrap();
    fs.write_direct(b, 4096 * 8, &pattern(6, 0, 8192)).unwrap();
    fs.check_csums().unwrap();
    fs.sync().unwrap();
    fs.check_csums().unwrap();
    // Truncate inside a block, punch, unlink: freed blocks lose their checksums.
    fs.set_len(b, 100 * K + 300).unwrap();
    fs.fallocate(a, stripefs::FallocMode::PunchHole, 20 * K, 64 * K)
        .unwrap();
    fs.check_csums().unwrap();
    fs.unlink(Ino::ROOT, "a".as_ref()).unwrap();
    fs.sync().unwrap();
    fs.check_csums().unwrap();
    let mut want = data.clone();
    want[4096 * 3 + 512..4096 * 3 + 1536].copy_from_slice(&pattern(5, 0, 1024));
    want[4096 * 8..4096 * 10].copy_from_slice(&pattern(6, 0, 8192));
    want.truncate((100 * K + 300) as usize);
    let fs = remount(&s, fs);
    let mut got = vec![0u8; want.len()];
    fs.read_at(b, 0, &mut got).unwrap();
    assert!(got == want, "b keeps its own contents");
    fs.check_csums().unwrap();
    assert_eq!(fs.status().csum_errors, 0);
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).expect("fsck");
    assert!(r.is_clean(), "{:?}", r.problems);
}

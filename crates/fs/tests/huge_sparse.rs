//! Size changes and zeroing over huge sparse ranges cost what the range holds, never its
//! size (issue 9, item 2). Counted with the mapping-lookup counter, not timed: every
//! zeroing pass asks the mapping once per piece it visits, so a pass that walked a hole
//! folio by folio shows up as millions of lookups.
mod common;

use common::*;
use stripefs::{CreateParams, FallocMode, Fs, FsError, Ino, MAX_FILE_BYTES};

/// Most mapping lookups one size change or zeroing call may make here (the file holds a
/// few blocks; a walk of the range would make one per 64 KiB).
const LOOKUP_BUDGET: u64 = 64;

fn lookups(fs: &Fs) -> u64 {
    fs.status().map_lookups
}

/// Runs `f` and asserts it made at most [`LOOKUP_BUDGET`] mapping lookups.
fn cheap<T>(fs: &Fs, what: &str, f: impl FnOnce() -> T) -> T {
    let before = lookups(fs);
    let r = f();
    let used = lookups(fs) - before;
    assert!(
        used <= LOOKUP_BUDGET,
        "{what}: {used} mapping lookups (budget {LOOKUP_BUDGET}): cost grows with the size"
    );
    r
}

fn read(fs: &Fs, ino: Ino, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAAu8; len];
    let n = fs.read_at(ino, off, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn truncate_to_the_maximum_size_and_back_is_cheap() {
    let s = sims(3, 32 << 20);
    let fs = fresh(&s, 4096, 65536);
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let data = pattern(7, 0, 5000);
    fs.write_at(a.ino, 0, &data).unwrap();
    // A modest extension first: without the fix this alone walks 16384 folios.
    cheap(&fs, "truncate to 1 GiB", || fs.set_len(a.ino, 1 << 30)).unwrap();
    cheap(&fs, "truncate to the maximum", || {
        fs.set_len(a.ino, MAX_FILE_BYTES)
    })
    .unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().size, MAX_FILE_BYTES);
    assert!(matches!(
        fs.set_len(a.ino, MAX_FILE_BYTES + 1),
        Err(FsError::FileTooBig)
    ));
    assert_eq!(read(&fs, a.ino, 0, 5000), data);
    assert!(read(&fs, a.ino, 5000, 60_000).iter().all(|&b| b == 0));
    assert_eq!(read(&fs, a.ino, MAX_FILE_BYTES - 10, 100), vec![0u8; 10]);
    fs.fsync(a.ino, stripefs::SyncScope::All).unwrap();
    cheap(&fs, "truncate back", || fs.set_len(a.ino, 3000)).unwrap();
    assert_eq!(read(&fs, a.ino, 0, 10_000), data[..3000]);
    // Again with the old EOF block on disk only (not cached): its tail is zeroed.
    cheap(&fs, "truncate up again", || {
        fs.set_len(a.ino, MAX_FILE_BYTES)
    })
    .unwrap();
    assert_eq!(read(&fs, a.ino, 0, 3000), data[..3000]);
    assert!(read(&fs, a.ino, 3000, 10_000).iter().all(|&b| b == 0));
    fs.check_space_accounting().unwrap();
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn zeroing_and_punching_huge_sparse_ranges_is_cheap() {
    let s = sims(3, 32 << 20);
    let fs = fresh(&s, 4096, 65536);
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let far = MAX_FILE_BYTES / 2;
    let d1 = pattern(1, 0, 9000);
    let d2 = pattern(2, far, 9000);
    fs.write_at(a.ino, 0, &d1).unwrap();
    // A write far past EOF zeroes [EOF, far) first: cheap too.
    cheap(&fs, "write far past EOF", || fs.write_at(a.ino, far, &d2)).unwrap();
    fs.fsync(a.ino, stripefs::SyncScope::All).unwrap();
    // Zero range of holes allocates unwritten blocks: more than the disk holds fails at
    // once, before changing anything.
    let e = cheap(&fs, "huge zero range", || {
        fs.fallocate(a.ino, FallocMode::ZeroRange { keep_size: true }, 4096, far)
    })
    .unwrap_err();
    assert!(
        matches!(&e, FsError::NoSpace(m) if m.starts_with("fallocate needs")),
        "{e}"
    );
    assert_eq!(
        read(&fs, a.ino, 0, 9000),
        d1,
        "a refused zero range changes nothing"
    );
    let e = cheap(&fs, "huge fallocate", || {
        fs.fallocate(a.ino, FallocMode::KeepSize, 0, MAX_FILE_BYTES)
    })
    .unwrap_err();
    assert!(
        matches!(&e, FsError::NoSpace(m) if m.starts_with("fallocate needs")),
        "{e}"
    );
    // Zeroing through the cache over the whole file (the force_zero_via_cache path and
    // extending zero range use it) and punching it: the written blocks only.
    cheap(&fs, "punch everything", || {
        fs.fallocate(a.ino, FallocMode::PunchHole, 100, MAX_FILE_BYTES - 100)
    })
    .unwrap();
    assert_eq!(read(&fs, a.ino, 0, 100), d1[..100]);
    assert!(read(&fs, a.ino, 100, 9000).iter().all(|&b| b == 0));
    assert!(read(&fs, a.ino, far, 9000).iter().all(|&b| b == 0));
    assert_eq!(fs.getattr(a.ino).unwrap().size, far + 9000);
    fs.check_space_accounting().unwrap();
    fs.unmount().unwrap();
    // Zero range routed through the cache (force_zero_via_cache): the cached and written
    // blocks only, and an extension to the maximum size on top.
    let opts = stripefs::MountOptions {
        force_zero_via_cache: true,
        ..quiet()
    };
    let (fs, _) = Fs::mount(dyns(&s), opts).unwrap();
    fs.write_at(a.ino, far, &d2).unwrap();
    fs.fsync(a.ino, stripefs::SyncScope::All).unwrap();
    fs.write_at(a.ino, 0, &d1).unwrap();
    cheap(&fs, "zero range through the cache", || {
        let len = MAX_FILE_BYTES - 200;
        fs.fallocate(a.ino, FallocMode::ZeroRange { keep_size: false }, 100, len)
    })
    .unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().size, MAX_FILE_BYTES - 100);
    assert_eq!(read(&fs, a.ino, 0, 100), d1[..100]);
    assert!(read(&fs, a.ino, 100, 9000).iter().all(|&b| b == 0));
    assert!(read(&fs, a.ino, far, 9000).iter().all(|&b| b == 0));
    fs.check_space_accounting().unwrap();
    fs.unmount().unwrap();
    let r = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn seek_over_a_huge_hole_is_cheap() {
    let s = sims(3, 32 << 20);
    let fs = fresh(&s, 4096, 65536);
    let a = fs
        .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    let far = MAX_FILE_BYTES / 4;
    fs.write_at(a.ino, 0, &pattern(3, 0, 5000)).unwrap();
    fs.write_at(a.ino, far, &pattern(4, far, 5000)).unwrap();
    fs.set_len(a.ino, MAX_FILE_BYTES).unwrap();
    for synced in [false, true] {
        if synced {
            fs.fsync(a.ino, stripefs::SyncScope::All).unwrap();
        }
        let seek = |off, what| cheap(&fs, "seek", || fs.seek(a.ino, off, what)).unwrap();
        assert_eq!(seek(0, stripefs::Whence::Hole), 8192, "synced {synced}");
        assert_eq!(seek(8192, stripefs::Whence::Data), far, "synced {synced}");
        assert_eq!(seek(far, stripefs::Whence::Hole), far + 8192);
        let e = cheap(&fs, "seek data past the last data", || {
            fs.seek(a.ino, far + 8192, stripefs::Whence::Data)
        });
        assert!(matches!(e, Err(FsError::NoSuchOffset)), "{e:?}");
    }
    fs.unmount().unwrap();
}

//! Reads without the bounce copy (`ReadCopy::Swap`) against the copy (`ReadCopy::Bounce`):
//! a cold sequential read through the cache, readahead and the synchronous fill alike,
//! over a folio that already holds a dirty block and an EOF folio whose last blocks lie
//! wholly past EOF.
//!
//! Both modes: every byte read is the device's, the dirty block is the write's, and the
//! bytes are the same when read again from the cache. Swap: a folio read whole becomes the
//! read's buffer (counted in `read_swapped_bytes`) and only the partly uptodate folios are
//! copied; Bounce: every byte read is copied.

mod common;

use common::Linear;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stripefs_iomap::cache::{CacheConfig, PageCache, ReadCopy};
use stripefs_iomap::{self as iomap, ZeroMode};
use stripefs_target::SimTarget;

const BS: u64 = 4096;
const FOLIO: u64 = 64 << 10;
const DEV: u64 = 4 << 20;
/// Two blocks and a part of a third before the device's end: the EOF folio is read only
/// in part.
const SIZE: u64 = DEV - 2 * BS - 1000;
/// A block written into the cache (dirty, not on the device) before the read.
const DIRTY_AT: u64 = 3 * FOLIO + 2 * BS;

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(7) ^ (i >> 12)) as u8
}

fn cold_read(mode: ReadCopy) {
    let cache = PageCache::new(
        CacheConfig {
            folio_bytes: FOLIO as u32,
            read_copy: mode,
            readahead_bytes: 256 << 10,
            ..CacheConfig::default()
        },
        BS as u32,
    );
    let fc = cache.file(1);
    let image: Vec<u8> = (0..DEV).map(pattern).collect();
    // Mapping pieces of 192 KiB: reads cross pieces in the middle of readahead windows.
    let fs = Linear::new(
        SimTarget::from_image("dev", image.clone(), 512),
        BS,
        192 << 10,
    );
    fs.size.store(SIZE, Ordering::SeqCst);
    let written = vec![0xA5u8; BS as usize];
    assert_eq!(
        iomap::write(&cache, &fs, &fc, DIRTY_AT, &written, ZeroMode::Cache).unwrap(),
        written.len()
    );
    let mut want = image[..SIZE as usize].to_vec();
    want[DIRTY_AT as usize..(DIRTY_AT + BS) as usize].copy_from_slice(&written);

    let mut got = vec![0u8; SIZE as usize];
    let mut pos = 0usize;
    while pos < got.len() {
        let end = (pos + (100 << 10)).min(got.len());
        let n = iomap::read(&cache, &fs, &fc, pos as u64, &mut got[pos..end]).unwrap();
        assert!(n > 0, "{mode:?}: read at {pos} returned nothing");
        pos += n;
    }
    let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(
        first_diff, None,
        "{mode:?}: the cold read returns the file's bytes"
    );

    // Readahead may still be in flight past what was read; let it settle.
    let t0 = Instant::now();
    while cache.stats().reading_folios != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "readahead never settled"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut again = vec![0u8; SIZE as usize];
    assert_eq!(
        iomap::read(&cache, &fs, &fc, 0, &mut again).unwrap(),
        again.len()
    );
    assert!(
        again == want,
        "{mode:?}: the cached folios hold the same bytes"
    );

    let s = cache.stats();
    // Every block inside EOF but the dirty one came from the device once.
    let from_device = SIZE.next_multiple_of(BS) - BS;
    assert_eq!(
        s.read_swapped_bytes + s.read_copied_bytes,
        from_device,
        "{mode:?}: each block read once ({s:?})"
    );
    match mode {
        ReadCopy::Swap => {
            // Copied: the dirty block's folio and the EOF folio, read in part.
            let partial = (FOLIO - BS) + (SIZE.next_multiple_of(BS) - (DEV - FOLIO));
            assert_eq!(s.read_copied_bytes, partial, "{mode:?}: {s:?}");
        }
        ReadCopy::Bounce => assert_eq!(s.read_swapped_bytes, 0, "{mode:?}: {s:?}"),
    }
}

#[test]
fn cold_read_swaps_whole_folios() {
    cold_read(ReadCopy::Swap);
}

#[test]
fn cold_read_through_bounce_buffers() {
    cold_read(ReadCopy::Bounce);
}

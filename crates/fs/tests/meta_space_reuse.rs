//! Checkpoints write their pages into the holes the pages they replaced left, lowest
//! first, before they touch space never written (decisions.md, 124). With one contiguous
//! range per request they passed over those holes, so every checkpoint moved on into
//! fresh space, and a sparse target file grew by what every checkpoint wrote: a
//! 10-million-file run reached 29 GB of host disk at 4.5 million files and stopped on the
//! host's `ENOSPC`. Measured here: the distinct blocks ever written on the targets that
//! hold nothing but metadata pages, against the pages live at the end.
mod common;

use std::collections::HashSet;
use std::ffi::OsString;

use stripefs::{CreateParams, Fs, Ino, MkfsOptions, SetAttr};
use stripefs_target::{Event, Recorder};

const FILES: u64 = 4000;
const DIRS: u64 = 8;
const ROUNDS: u32 = 60;
const STRIDE: usize = 97;

#[test]
fn rewritten_pages_reuse_the_space_of_the_pages_they_replace() {
    let sims = common::sims(4, 64 << 20);
    let opts = MkfsOptions {
        block_size: 4096,
        stripe_unit: 65536,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&common::dyns(&sims), &opts).expect("mkfs");
    let rec = Recorder::new();
    let fs = Fs::mount(common::recorded(&sims, &rec), common::quiet())
        .expect("mount")
        .0;
    let dirs: Vec<Ino> = (0..DIRS)
        .map(|d| {
            let name = OsString::from(format!("d{d}"));
            fs.mkdir(Ino::ROOT, &name, CreateParams::with_perm(0o755))
                .expect("mkdir")
                .ino
        })
        .collect();
    let files: Vec<Ino> = (0..FILES)
        .map(|n| {
            let name = OsString::from(format!("f{n}"));
            fs.create(
                dirs[(n % DIRS) as usize],
                &name,
                CreateParams::with_perm(0o644),
            )
            .expect("create")
            .ino
        })
        .collect();
    fs.checkpoint().expect("checkpoint");
    // Each round changes one inode in every STRIDE, a few in each inode leaf: the
    // checkpoint rewrites pages scattered over the tree and frees the ones they replace
    // one by one, as the checkpoints of a large tree do.
    for round in 0..ROUNDS {
        let set = SetAttr {
            mode: Some(if round % 2 == 0 { 0o600 } else { 0o644 }),
            ..SetAttr::default()
        };
        for &f in files.iter().skip(round as usize % STRIDE).step_by(STRIDE) {
            fs.setattr(f, &set).expect("chmod");
        }
        fs.checkpoint().expect("checkpoint");
    }
    let live_blocks = fs.status().meta_page_blocks;
    fs.unmount().expect("unmount");
    // Targets 1-3 hold no journal and, with empty files, no data: only pages (and the
    // superblock at their start).
    let written: HashSet<(u32, u64)> = rec
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Write {
                target,
                offset,
                data,
            }
            | Event::FuaWrite {
                target,
                offset,
                data,
            } if *target > 0 => Some((*target, *offset, data.len() as u64)),
            _ => None,
        })
        .flat_map(|(t, off, len)| (off / 4096..(off + len).div_ceil(4096)).map(move |b| (t, b)))
        .collect();
    let written = written.len() as u64;
    // Without reuse every checkpoint's pages went to fresh space (single freed pages
    // never held a request's contiguous range): the live pages and then some for each
    // round. With it, the pages live, the ones they replaced (freed only once the next
    // checkpoint is durable) and a margin.
    assert!(
        10 * written <= 13 * live_blocks,
        "{written} distinct blocks written on targets 1-3 for {live_blocks} live page blocks \
         on all four after {ROUNDS} checkpoints"
    );
    eprintln!("{written} distinct blocks written on targets 1-3; {live_blocks} live page blocks");
}

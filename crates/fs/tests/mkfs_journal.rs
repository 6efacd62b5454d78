//! mkfs writes the whole journal region (decisions.md, 81): on a file target whose
//! journal is a hole, every commit of the first lap allocated blocks of the host file
//! system, and its FUA write waited for the host's own journal commit.
mod common;

use common::*;
use stripefs::{Fs, MkfsOptions};

#[test]
fn mkfs_writes_zeros_over_the_whole_journal() {
    let s = sims(2, 32 << 20);
    let geo = Fs::mkfs(&dyns(&s), &MkfsOptions::default()).unwrap();
    let start = geo.journal_unit_offset(0) as usize;
    let len = geo.journal_bytes() as usize;
    // Durable: mkfs flushed it.
    let image = s[0].durable_image();
    let journal = &image[start..start + len];
    let unwritten = journal.iter().filter(|b| **b == GARBAGE).count();
    assert_eq!(
        unwritten, 0,
        "{unwritten} of the journal's {len} bytes were never written by mkfs"
    );
    assert!(journal.iter().all(|b| *b == 0), "the journal is zeros");
    // And the file system mounts and commits over it.
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    fs.sync().unwrap();
    fs.unmount().unwrap();
}

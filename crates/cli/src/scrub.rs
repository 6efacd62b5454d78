//! `stripefs scrub TARGET...`: read every checksummed data block of an unmounted file
//! system and report the blocks whose bytes do not match their checksum
//! (`docs/design/scrub.md`).

use std::path::PathBuf;

use stripefs::{Access, Fs, MountOptions, ScrubCursor};

use crate::progress::count_bar;
use crate::targets::{open_all_with, split_target_options};

/// Exit status: every checksummed block read and matched.
pub const EXIT_CLEAN: i32 = 0;
/// Exit status: mismatches found, or blocks that could not be read.
pub const EXIT_DAMAGED: i32 = 1;
/// Exit status: could not scrub (targets missing or locked, mount failed, a metadata
/// read failed part way).
pub const EXIT_OPERATIONAL: i32 = 8;

/// Blocks verified per step (1 MiB at 4 KiB blocks): the bar moves, memory stays small.
const STEP_BLOCKS: u64 = 256;

/// Read every checksummed data block (copy-on-write files) and report mismatches.
#[derive(Debug, clap::Args)]
#[command(after_help = EXIT_HELP)]
pub struct ScrubArgs {
    /// All targets of the file system (any order): paths or NBD URIs. Scrubbing a
    /// mounted file system (a mount point) is not supported.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
    /// Target options (`nbd_*`), as `stripefs io -o`.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
}

const EXIT_HELP: &str = "The file system is mounted as usual (an unclean one is recovered, which \
writes the replayed journal's checkpoint), switched to read-only at once, and scrubbed: \
nothing is written after the switch.
Exit status:
  0  every checksummed block matched
  1  mismatches (each printed: inode, file offset, target, block) or unreadable blocks
  8  could not scrub (missing or locked targets, mount failed, a metadata read failed)
Invalid arguments exit 2.";

/// Runs the scrub; returns the exit status (see [`EXIT_HELP`]).
pub fn run(a: &ScrubArgs) -> Result<i32, String> {
    if let [one] = a.targets.as_slice() {
        if one.is_dir() {
            eprintln!(
                "stripefs scrub: {} is a directory: online scrub (through a mount) is not \
                 supported; unmount and scrub the targets",
                one.display()
            );
            return Ok(EXIT_OPERATIONAL);
        }
    }
    let (engine, target_opts) = split_target_options(&a.options)?;
    if let Some(k) = engine.first() {
        return Err(format!(
            "unknown option '{k}' (scrub takes target options only)"
        ));
    }
    let targets = match open_all_with(&a.targets, &target_opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("stripefs scrub: {e}");
            return Ok(EXIT_OPERATIONAL);
        }
    };
    let fs = match Fs::mount(targets, MountOptions::default()) {
        Ok((fs, report)) => {
            if report.replayed_txns > 0 || report.orphans_freed > 0 {
                eprintln!(
                    "recovered: {} journal transactions replayed, {} orphans freed",
                    report.replayed_txns, report.orphans_freed
                );
            }
            fs
        }
        Err(e) => {
            eprintln!("stripefs scrub: mount failed: {e}");
            return Ok(EXIT_OPERATIONAL);
        }
    };
    let status = match scrub(&fs) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stripefs scrub: {e}");
            EXIT_OPERATIONAL
        }
    };
    fs.unmount().map_err(|e| format!("unmount failed: {e}"))?;
    Ok(status)
}

fn scrub(fs: &Fs) -> Result<i32, String> {
    fs.set_access(Access::ReadOnly)
        .map_err(|e| format!("switching to read-only: {e}"))?;
    // A bar over the inode numbers passed (the scrub goes in inode order).
    let bar = count_bar("scrubbing");
    let (mut blocks, mut bytes, mut bad, mut unreadable) = (0u64, 0u64, 0u64, 0u64);
    let mut at = Some(ScrubCursor::START);
    while let Some(c) = at {
        let s = fs.scrub_step(c, STEP_BLOCKS).map_err(|e| {
            bar.finish_and_clear();
            format!("at inode {}: {e}", c.ino)
        })?;
        blocks += s.blocks;
        bytes += s.bytes;
        for m in &s.mismatches {
            bar.suspend(|| {
                println!(
                    "mismatch: inode {} offset {} (target {} block {})",
                    m.ino.0, m.file_off, m.target.0, m.phys
                );
            });
            bad += 1;
        }
        for r in &s.read_errors {
            bar.suspend(|| {
                println!(
                    "unreadable: inode {} offset {} (target {} blocks {}..+{}): {}",
                    r.ino.0, r.file_off, r.target.0, r.phys, r.blocks, r.error
                );
            });
            unreadable += r.blocks;
        }
        bar.set_length(s.ino_limit.max(1));
        bar.set_position(s.next.map_or(s.ino_limit, |n| n.ino).min(s.ino_limit));
        bar.set_message(format!("{} MiB", bytes >> 20));
        at = s.next;
    }
    bar.finish_and_clear();
    println!(
        "{blocks} checksummed blocks ({bytes} bytes) verified: {}",
        match (bad, unreadable) {
            (0, 0) => "clean".to_string(),
            (b, 0) => format!("{b} mismatches"),
            (0, u) => format!("{u} blocks unreadable"),
            (b, u) => format!("{b} mismatches, {u} blocks unreadable"),
        }
    );
    Ok(if bad == 0 && unreadable == 0 {
        EXIT_CLEAN
    } else {
        EXIT_DAMAGED
    })
}

//! `stripefs fsck`: verify every invariant; exit 0 when clean.

use std::path::PathBuf;

use stripefs::fsck::{fsck, FsckStage};
use stripefs::FsError;

use crate::progress::count_bar;
use crate::targets::open_all;

/// Exit status bit: warnings only (damage the file system repairs by itself, such as a
/// damaged older root record slot; as e2fsck's bit 1 for problems that need no repair by
/// hand).
pub const EXIT_WARNINGS: i32 = 1;
/// Exit status: problems found (as e2fsck's "errors left uncorrected").
pub const EXIT_PROBLEMS: i32 = 4;
/// Exit status: could not check (as e2fsck's "operational error").
pub const EXIT_OPERATIONAL: i32 = 8;

/// Check a stripefs file system without changing it.
#[derive(Debug, clap::Args)]
#[command(after_help = EXIT_HELP)]
pub struct FsckArgs {
    /// All targets of the file system (any order): paths or NBD URIs.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
}

/// The exit status, for `--help`.
const EXIT_HELP: &str = "Exit status (bits, as e2fsck):
  0  clean
  1  warnings only: damage that needs no repair by hand (a damaged older root record
     slot, which the next checkpoint rewrites); the file system is correct and usable
  4  problems: a violated invariant, or damage that prevents loading (corruption)
  8  could not check (I/O error, missing, unreadable or locked targets)
Bits combine: 5 is problems and warnings. Invalid arguments exit 2.";

/// Runs fsck; returns the exit status (see [`EXIT_HELP`]).
pub fn run(a: &FsckArgs) -> Result<i32, String> {
    // Could not check is 8, never the generic 1, which here means warnings.
    // Each target is locked while open (`stripefs_target::TargetLock`).
    let targets = match open_all(&a.targets) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("stripefs fsck: {e}");
            return Ok(EXIT_OPERATIONAL);
        }
    };
    // Long work: a bar over the inode numbers the walk has passed (it goes in inode
    // order, up to the counter), with the pages read so far.
    let spin = count_bar("checking");
    let mut stage = |s: FsckStage| match s {
        FsckStage::Loaded { journal_txns } => {
            spin.set_message(format!(
                "checking ({journal_txns} journal transactions to replay in memory)"
            ));
        }
        FsckStage::Walking { pages, done, total } => {
            spin.set_length(total.max(1));
            spin.set_position(done);
            spin.set_message(format!("{pages} pages read"));
        }
        FsckStage::Checked => spin.finish_and_clear(),
    };
    let report = match fsck(targets, &mut stage) {
        Ok(r) => r,
        Err(e @ FsError::Corrupted(_)) => {
            spin.finish_and_clear();
            eprintln!("stripefs fsck: {e}");
            return Ok(EXIT_PROBLEMS);
        }
        Err(e) => {
            spin.finish_and_clear();
            eprintln!("stripefs fsck: {e}");
            return Ok(EXIT_OPERATIONAL);
        }
    };
    for n in &report.notes {
        println!("note: {n}");
    }
    for w in &report.warnings {
        println!("warning: {w}");
    }
    for p in &report.problems {
        println!("problem: {p}");
    }
    println!(
        "{} inodes, {} extents, {}/{} data blocks used: {}",
        report.inodes,
        report.extents,
        report.data_blocks_used,
        report.data_blocks,
        match (report.problems.len(), report.warnings.len()) {
            (0, 0) => "clean".to_string(),
            (0, w) => format!("clean, {w} warnings"),
            (p, 0) => format!("{p} problems"),
            (p, w) => format!("{p} problems, {w} warnings"),
        }
    );
    let problems = if report.is_clean() { 0 } else { EXIT_PROBLEMS };
    let warnings = if report.warnings.is_empty() {
        0
    } else {
        EXIT_WARNINGS
    };
    Ok(problems | warnings)
}

//! `stripefs fsck`: verify every invariant; exit 0 when clean.

use std::path::PathBuf;

use stripefs::fsck::{fsck, FsckStage};
use stripefs::FsError;

use crate::progress::spinner;
use crate::targets::{lock_targets, open_all, LockWait};

/// Exit status: problems found (as e2fsck's "errors left uncorrected").
pub const EXIT_PROBLEMS: i32 = 4;
/// Exit status: could not check (as e2fsck's "operational error").
pub const EXIT_OPERATIONAL: i32 = 8;

/// Check a stripefs file system without changing it.
#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    /// All targets of the file system (any order): paths or NBD URIs.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
}

/// Runs fsck; returns the exit status (0 clean, 4 problems or corruption, 8 could not run).
pub fn run(a: &FsckArgs) -> Result<i32, String> {
    let _lock = lock_targets(&a.targets, LockWait::WhileReleasing)?;
    let targets = open_all(&a.targets)?;
    let spin = spinner("checking");
    let mut stage = |s: FsckStage| match s {
        FsckStage::Loaded {
            inodes,
            journal_txns,
        } => {
            spin.set_message(format!(
                "checking {inodes} inodes ({journal_txns} journal transactions replayed in memory)"
            ));
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
    for p in &report.problems {
        println!("problem: {p}");
    }
    println!(
        "{} inodes, {} extents, {}/{} data blocks used: {}",
        report.inodes,
        report.extents,
        report.data_blocks_used,
        report.data_blocks,
        if report.is_clean() {
            "clean".to_string()
        } else {
            format!("{} problems", report.problems.len())
        }
    );
    Ok(if report.is_clean() { 0 } else { EXIT_PROBLEMS })
}

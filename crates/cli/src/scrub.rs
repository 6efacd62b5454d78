//! `stripefs scrub TARGET...` (offline) and `stripefs scrub MOUNTPOINT` (online, through
//! the daemon's scrub ioctl): read every checksummed data block and report the blocks
//! whose bytes do not match their checksum (`docs/design/scrub.md`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stripefs::ScrubStep;
use stripefs_fuse::scrub_ioctl;

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
    /// All targets of an unmounted file system (any order): paths or NBD URIs; or the
    /// mount point of a mounted one (online scrub, as root).
    #[arg(required = true)]
    targets: Vec<PathBuf>,
    /// Target options (`nbd_*`), as `stripefs io -o`.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
    /// Online: read at most this many MiB/s (0: no limit), so a busy mount keeps its
    /// bandwidth.
    #[arg(long, value_name = "MIB_PER_S", default_value_t = 0)]
    rate: u64,
}

const EXIT_HELP: &str = "Online (a mount point): the daemon verifies one step of at most 250 \
blocks per ioctl on the mount's root; --rate sleeps between steps. Offline (targets): the \
file system is mounted as usual (an unclean one is recovered, which \
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
            if !a.options.is_empty() {
                return Err("-o takes target options: not for a mount point".into());
            }
            return Ok(online(one, a.rate));
        }
    }
    if a.rate != 0 {
        return Err("--rate is for online scrub (a mount point)".into());
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
    drive(
        |c| fs.scrub_step(c, STEP_BLOCKS).map_err(|e| e.to_string()),
        0,
    )
}

/// Online: the same steps, each one ioctl on the mount's root answered by the daemon.
fn online(mnt: &Path, rate: u64) -> i32 {
    let dir = match std::fs::File::open(mnt) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("stripefs scrub: {}: {e}", mnt.display());
            return EXIT_OPERATIONAL;
        }
    };
    let step = |c: ScrubCursor| -> Result<ScrubStep, String> {
        let mut b = scrub_ioctl::encode_request(c, scrub_ioctl::MAX_ENTRIES as u64);
        crate::root_ioctl::call(&dir, mnt, scrub_ioctl::SCRUB_STEP, &mut b, "online scrub")?;
        scrub_ioctl::decode_step(&b)
    };
    match drive(step, rate) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stripefs scrub: {e}");
            EXIT_OPERATIONAL
        }
    }
}

/// Steps from the start to the end: prints every mismatch and unreadable run, a bar
/// over the inode numbers passed, and the summary; at most `rate` MiB/s (0: no limit).
fn drive(
    mut step: impl FnMut(ScrubCursor) -> Result<ScrubStep, String>,
    rate: u64,
) -> Result<i32, String> {
    // A bar over the inode numbers passed (the scrub goes in inode order).
    let bar = count_bar("scrubbing");
    let started = Instant::now();
    let (mut blocks, mut bytes, mut bad, mut unreadable) = (0u64, 0u64, 0u64, 0u64);
    let mut at = Some(ScrubCursor::START);
    while let Some(c) = at {
        let s = step(c).map_err(|e| {
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
        if rate > 0 {
            // Where the bytes so far would be at `rate`: sleep until then.
            let due = Duration::from_secs_f64(bytes as f64 / (rate as f64 * 1_048_576.0));
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
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

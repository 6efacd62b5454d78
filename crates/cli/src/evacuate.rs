//! `stripefs evacuate MOUNTPOINT TARGET`: move every block off one target of a mounted
//! file system while it stays in use, so the disk can be retired (`docs/design/reflink.md`,
//! "Evacuation"). The daemon does the work, one part per ioctl on the mount's root
//! (`evacuate_ioctl`): begin (the target goes read-only, in-place writers drain, dirty
//! data is written back), steps over the inodes with a progress bar (passes until no file
//! has blocks there), finish (metadata pages moved, the target checked empty), and with
//! `--retire` (or as `stripefs remove-target`) the retirement of the emptied target: it
//! leaves the file system and later mounts do not need it (`docs/design/targets.md`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use stripefs::TargetId;
use stripefs_fuse::evacuate_ioctl::{self, Part, Reply, Request};

use crate::progress::count_bar;

/// Passes over the inodes before giving up on a target that keeps getting blocks back.
const MAX_PASSES: u32 = 8;

/// Move every block off one target of a mounted file system (online, as root).
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct EvacuateArgs {
    /// The mount point.
    mountpoint: PathBuf,
    /// The target's index (0-based, as `stripefs inspect` lists them).
    target: u32,
    /// Give up an evacuation begun before: the target takes new blocks again.
    #[arg(long, conflicts_with = "retire")]
    cancel: bool,
    /// Once it is empty, retire the target: it leaves the file system for good, and the
    /// next mount does not need its device.
    #[arg(long)]
    retire: bool,
}

/// Move every block off one target and retire it (`evacuate --retire`).
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct RemoveTargetArgs {
    /// The mount point.
    mountpoint: PathBuf,
    /// The target's index (0-based, as `stripefs inspect` lists them).
    target: u32,
}

impl RemoveTargetArgs {
    /// The evacuation that does it.
    #[must_use]
    pub fn evacuation(&self) -> EvacuateArgs {
        EvacuateArgs {
            mountpoint: self.mountpoint.clone(),
            target: self.target,
            cancel: false,
            retire: true,
        }
    }
}

const AFTER_HELP: &str = "The target stays read-only, across remounts, until the \
evacuation is cancelled: nothing new is written to it. A retired target is out of the \
file system for good: mount without its device (the daemon keeps it open until \
unmount). Target 0 (journal, root records) cannot be evacuated. Blocks that several \
files share are copied once per file. An interrupted evacuation is resumed by running \
the command again. The daemon's log has the reason of a refusal.";

/// Runs the evacuation; returns the exit status.
pub fn run(a: &EvacuateArgs) -> Result<i32, String> {
    let dir = std::fs::File::open(&a.mountpoint)
        .map_err(|e| format!("{}: {e}", a.mountpoint.display()))?;
    let target = TargetId(a.target);
    let part = |p: Part| ask(&dir, &a.mountpoint, Request { target, part: p });
    if a.cancel {
        part(Part::Cancel)?;
        println!("target {target}: evacuation cancelled, it takes new blocks again");
        return Ok(0);
    }
    let started = Instant::now();
    eprintln!("target {target}: going read-only, writing back dirty data");
    part(Part::Begin)?;
    let bar = count_bar("evacuating");
    let (mut blocks, mut files, mut passes) = (0u64, 0u64, 0u32);
    loop {
        passes += 1;
        let moved_before = blocks;
        let mut at = Some(stripefs::Ino::ROOT.0);
        while let Some(from) = at {
            let r = part(Part::Step {
                from,
                budget: evacuate_ioctl::MAX_BUDGET,
            })
            .inspect_err(|_| bar.finish_and_clear())?;
            blocks += r.step.blocks;
            files += r.step.files;
            at = r.step.next;
            bar.set_length(r.step.ino_limit.max(1));
            bar.set_position(at.unwrap_or(r.step.ino_limit).min(r.step.ino_limit));
            bar.set_message(format!("{} blocks", blocks));
        }
        if blocks == moved_before || passes >= MAX_PASSES {
            break;
        }
    }
    bar.finish_and_clear();
    eprintln!("target {target}: moving metadata pages, checking it is empty");
    let fin = part(Part::Finish)?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "target {target} evacuated: {blocks} blocks of {files} files moved, {} metadata paths \
         rewritten, {passes} passes, {secs:.1} s",
        fin.meta_paths
    );
    if a.retire {
        part(Part::Retire)?;
        println!(
            "target {target} retired: it is no longer part of the file system; after unmount, \
             mount without it"
        );
    }
    Ok(0)
}

/// One ioctl.
fn ask(dir: &std::fs::File, mnt: &Path, r: Request) -> Result<Reply, String> {
    let mut b = evacuate_ioctl::encode_request(r);
    let t = r.target;
    crate::root_ioctl::call(dir, mnt, evacuate_ioctl::EVACUATE, &mut b, "evacuation").map_err(
        |e| match e.errno {
            Some(libc::EINVAL) => format!(
                "target {t}: refused ({}): target 0 cannot be evacuated, the target must \
                 exist and not be retired, a step needs a begun evacuation, and only an \
                 emptied target can be retired (the daemon's log says which)",
                e.message
            ),
            Some(libc::ENOSPC) => format!(
                "target {t}: the other targets have no room for what it holds ({})",
                e.message
            ),
            _ if e
                .errno
                .is_some_and(|n| n != libc::ENOTTY && n != libc::EPERM) =>
            {
                format!("target {t}: {}", e.message)
            }
            _ => e.message,
        },
    )?;
    evacuate_ioctl::decode_reply(&b)
}

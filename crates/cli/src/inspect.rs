//! `stripefs inspect`: superblocks, checkpoints, journal state and free space.

use std::path::PathBuf;

use stripefs::fsck::inspect;

use crate::size::human;
use crate::targets::open_all;

/// Show the on-disk state of a stripefs file system (read-only).
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// All targets of the file system (any order): paths or NBD URIs.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
}

/// Runs inspect.
pub fn run(a: &InspectArgs) -> Result<i32, String> {
    let i = inspect(open_all(&a.targets)?).map_err(|e| e.to_string())?;
    let bs = u64::from(i.block_size);
    for (sb, name) in i.superblocks.iter().zip(&i.target_names) {
        println!("superblock of target {} ({name}):", sb.target_index);
        println!(
            "  uuid {}  format v{}  targets {}",
            sb.uuid,
            stripefs_core::superblock::FORMAT_VERSION,
            sb.target_count
        );
        println!(
            "  block size {}  sector size {}  blocks {}  data from block {}",
            sb.block_size, sb.sector_size, sb.target_blocks, sb.data_start
        );
        println!(
            "  default stripe {} x {}",
            sb.stripe_count,
            human(u64::from(sb.stripe_unit))
        );
        println!(
            "  features compat {:#x} incompat {:#x} ro_compat {:#x}",
            sb.features_compat, sb.features_incompat, sb.features_ro_compat
        );
    }
    for (n, c) in i.checkpoints.iter().enumerate() {
        match c {
            Some(h) => println!(
                "checkpoint area {n}: generation {} payload {} in {} blocks, journal tail {} next seq {}{}",
                h.generation,
                human(h.payload_bytes),
                h.payload_blocks,
                h.journal_tail,
                h.journal_seq,
                if h.generation == i.active.generation { " (active)" } else { "" }
            ),
            None => println!("checkpoint area {n}: empty"),
        }
    }
    println!(
        "journal: {} transactions ({} records) after the checkpoint; {}/{} units in use",
        i.journal_txns, i.journal_records, i.journal_used_units, i.journal_units
    );
    println!("metadata: {} inodes, {} extents", i.inodes, i.extents);
    for (t, (data, free, ranges)) in i.space.iter().enumerate() {
        println!(
            "target {t}: {} free of {} ({:.1}% used) in {ranges} free ranges",
            human(free * bs),
            human(data * bs),
            100.0 * (data - free) as f64 / (*data).max(1) as f64
        );
    }
    Ok(0)
}

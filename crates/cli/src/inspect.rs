//! `stripefs inspect`: superblocks, metadata trees, journal state and free space.

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
    let made = i.superblocks.first().map_or(0, |s| s.target_count);
    let members = i.superblocks.len() as u32;
    println!(
        "targets: {members} ({made} from mkfs, {} added by add-target)",
        members.saturating_sub(made)
    );
    let state = |t: usize| i.states.get(t).copied();
    for (t, (sb, name)) in i.superblocks.iter().zip(&i.target_names).enumerate() {
        match state(t) {
            Some((s, _)) if s != stripefs_core::record::TargetState::Writable => {
                println!("  target {}: {name} ({s})", sb.target_index);
            }
            _ => println!("  target {}: {name}", sb.target_index),
        }
    }
    for (t, (sb, name)) in i.superblocks.iter().zip(&i.target_names).enumerate() {
        if let Some((_, false)) = state(t) {
            println!(
                "superblock of target {}: not read (retired, not given)",
                sb.target_index
            );
            continue;
        }
        println!("superblock of target {} ({name}):", sb.target_index);
        println!(
            "  uuid {}  format v{}  targets when it joined {}",
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
        if sb.member_id != 0 {
            println!("  member id {:#018x} (joined by add-target)", sb.member_id);
        }
    }
    for (n, slot) in i.root_slots.iter().enumerate() {
        match slot {
            Ok(Some(r)) => println!(
                "root record slot {n}: generation {} journal mark unit {} next seq {}{}",
                r.generation,
                r.journal_tail,
                r.journal_seq,
                if r.generation.0 == i.generation {
                    " (active)"
                } else {
                    ""
                }
            ),
            Ok(None) => println!("root record slot {n}: never written"),
            Err(e) => println!("root record slot {n}: {e}"),
        }
    }
    println!(
        "metadata trees: generation {}, replay from journal unit {} (transaction {})",
        i.generation, i.journal_mark.0, i.journal_mark.1
    );
    for t in &i.trees {
        println!(
            "  tree {}: root level {}, {} pages",
            t.tree, t.root_level, t.pages
        );
    }
    let c = &i.meta_cache;
    println!(
        "  page cache: {} pages ({}), {} hits, {} misses, {} evictions",
        c.pages,
        human(c.bytes as u64),
        c.hits,
        c.misses,
        c.evictions
    );
    println!(
        "journal: {} transactions ({} records) after the mark; {}/{} units in use",
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

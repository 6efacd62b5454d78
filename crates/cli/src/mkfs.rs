//! `stripefs mkfs`: create missing file targets, pre-zero them, lay out the file system.

use std::path::PathBuf;
use std::sync::Arc;

use stripefs::{Fs, MkfsOptions};
use stripefs_target::{Batch, IoBuf, IoOp, Target};

use crate::progress::bytes_bar;
use crate::size::{human, parse_size};
use crate::targets::open_one;

/// Bytes per pre-zeroing write.
const ZERO_CHUNK: u64 = 4 << 20;
/// Pre-zeroing writes in flight per target.
const ZERO_DEPTH: usize = 4;

/// Create a stripefs file system on one or more targets.
#[derive(Debug, clap::Args)]
pub struct MkfsArgs {
    /// Block size: a power of two from 1k to 64k.
    #[arg(short = 'b', long, default_value = "4k", value_parser = parse_size)]
    block_size: u64,
    /// Default stripe unit (a multiple of the block size).
    #[arg(short = 'u', long, default_value = "1m", value_parser = parse_size)]
    stripe_unit: u64,
    /// Default stripe count (default: all targets).
    #[arg(short = 'c', long)]
    stripe_count: Option<u32>,
    /// Size of each target that does not exist yet (it is created as a regular file).
    #[arg(short = 's', long, value_parser = parse_size)]
    size: Option<u64>,
    /// Journal size (default: 1/64 of target 0, 256k to 128m).
    #[arg(long, value_parser = parse_size)]
    journal_size: Option<u64>,
    /// Do not write zeros over newly created target files. mkfs is faster, but later
    /// direct writes into never-written host blocks are slower (measured 4x on this kind of
    /// machine).
    #[arg(long)]
    no_prezero: bool,
    /// Also write zeros over existing regular-file targets (same reason as above).
    #[arg(long)]
    prezero_existing: bool,
    /// Target files, block devices or NBD URIs (nbd://HOST[:PORT]/EXPORT,
    /// nbd+unix:///EXPORT?socket=PATH), in target-index order.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
}

/// Runs mkfs; returns the process exit status.
pub fn run(a: &MkfsArgs) -> Result<i32, String> {
    let block_size = u32::try_from(a.block_size).map_err(|_| "block size too large".to_string())?;
    let stripe_unit =
        u32::try_from(a.stripe_unit).map_err(|_| "stripe unit must be below 4 GiB".to_string())?;
    let mut targets = Vec::new();
    let mut to_zero = Vec::new();
    for p in &a.targets {
        let existed = crate::targets::exists(p);
        if !existed && a.size.is_none() {
            return Err(format!(
                "target {} does not exist; give --size to create it as a file",
                p.display()
            ));
        }
        // Never format targets a mounted file system is using: an open target is locked.
        let t = open_one(p, if existed { None } else { a.size })?;
        let regular = std::fs::metadata(p).map(|m| m.is_file()).unwrap_or(false);
        if regular && ((!existed && !a.no_prezero) || (existed && a.prezero_existing)) {
            to_zero.push(Arc::clone(&t));
        }
        targets.push(t);
    }
    prezero(&to_zero).map_err(|e| format!("pre-zeroing failed: {e}"))?;
    let opts = MkfsOptions {
        block_size,
        stripe_unit,
        stripe_count: a.stripe_count,
        journal_bytes: a.journal_size,
    };
    let geo = Fs::mkfs(&targets, &opts).map_err(|e| format!("mkfs failed: {e}"))?;
    print_summary(&geo, &targets);
    Ok(0)
}

/// Writes zeros over every target, `ZERO_DEPTH` chunks in flight per target.
pub(crate) fn prezero(targets: &[Arc<dyn Target>]) -> Result<(), String> {
    let total: u64 = targets.iter().map(|t| t.info().size_bytes).sum();
    if total == 0 {
        return Ok(());
    }
    let bar = bytes_bar(total, "pre-zeroing");
    let mut next: Vec<u64> = vec![0; targets.len()];
    let mut spare: Vec<IoBuf> = Vec::new();
    loop {
        let batch = Batch::new();
        for (i, t) in targets.iter().enumerate() {
            let size = t.info().size_bytes;
            for _ in 0..ZERO_DEPTH {
                if next[i] >= size {
                    break;
                }
                let len = ZERO_CHUNK.min(size - next[i]);
                let buf = match spare.pop() {
                    Some(b) if b.len() as u64 == len => b,
                    _ => IoBuf::zeroed(len as usize),
                };
                batch.submit(
                    t.as_ref(),
                    IoOp::Write {
                        offset: next[i],
                        bufs: vec![buf],
                    },
                );
                next[i] += len;
            }
        }
        if batch.submitted() == 0 {
            break;
        }
        for d in batch.wait() {
            d.result.map_err(|e| e.to_string())?;
            for b in d.bufs {
                bar.inc(b.len() as u64);
                spare.push(b);
            }
        }
    }
    for t in targets {
        t.flush_sync().map_err(|e| e.to_string())?;
    }
    bar.finish_and_clear();
    Ok(())
}

fn print_summary(geo: &stripefs_core::geometry::Geometry, targets: &[Arc<dyn Target>]) {
    let bs = geo.block_size;
    println!(
        "meta-data: uuid={} targets={} bsize={} sectsz={}",
        geo.uuid,
        geo.target_count(),
        bs.bytes(),
        geo.sector_size
    );
    println!(
        "stripe:    unit={} count={}",
        geo.stripe_unit, geo.stripe_count
    );
    println!(
        "log:       journal={} ({} units of {}); metadata pages of {} in the data area",
        human(bs.to_bytes(geo.journal_blocks)),
        geo.journal_units(),
        geo.journal_unit,
        human(geo.page_size().bytes() as u64)
    );
    for (i, (t, g)) in targets.iter().zip(&geo.targets).enumerate() {
        println!(
            "target {i}:  {} blocks={} data={} ({})",
            t.info().name,
            g.blocks,
            g.data_blocks(),
            human(bs.to_bytes(g.data_blocks()))
        );
    }
}

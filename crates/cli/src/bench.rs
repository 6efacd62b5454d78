//! `stripefs bench`: the seed workloads, each variant side by side in the same run
//! (alternating, so machine noise hits both alike), medians of several runs.
//!
//! - `w2-subblock-dirty` (seed 002): a prewritten 128 MiB file, 4 KiB random buffered
//!   writes each followed by fsync, 64 KiB folios; `dirty_tracking = block` vs `folio`.
//! - `w4-metamix` (seed 004): the stress-ng metamix pattern over several threads on a file
//!   system whose extending writes leave unwritten preallocation beyond EOF;
//!   `eof_zeroing = cache` vs `flush`.
//! - `w1-unaligned-dio` (seed 000): 2 KiB and 4 KiB direct overwrites of a prewritten 1 GiB
//!   file at queue depth 64 per job; `dio_unaligned = shared` vs `exclusive`, and the raw
//!   backing files driven the same way.
//! - `w3-striped-dio` (seed 003): synchronous 1, 16 and 64 MiB direct writes and reads over
//!   1, 4 and 8 targets; `dio_submit = parallel` vs `serial`, and the raw backing files.
//!   With `--target` it runs on the given targets (files, devices or NBD URIs) instead of
//!   files it creates; `--counts` and `--sizes` choose the rows.
//! - `w5-nocow` (seed 001, issue 13): 4 KiB random buffered overwrites of NOCOW files with
//!   an fsync every 2 writes from several writers while other threads create, stat and
//!   rename files in the same directories, over a small metadata cache and non-empty
//!   checksum and reference-count trees; `nocow_check = unlocked` vs `locked`, see
//!   `bench_nocow.rs`; `--writers`, `--meta-threads`, `--file-size`, `--seconds`,
//!   `--meta-cache`, `--meta-rate`.
//! - `meta` (issue 11): metadata at scale, see `bench_meta.rs`; `--files`, `--dirs`,
//!   `--file-size`, `--target-size`, `--steps`, `--plot`. One run, not variants.
//! - `plot`: only draws `--plot` from `--plot-series` files (what `scripts/bench-meta`
//!   uses to put the mount's and XFS's series on one chart).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use stripefs::DirtyTracking;
use stripefs::ZeroMode;
use stripefs::{CreateParams, Fs, Ino, MkfsOptions, MountOptions};
use stripefs_target::{Rng, Target};

use crate::mkfs::prezero;
use crate::targets::open_one;

/// Run the seed benchmarks on file-backed targets (w3-striped-dio also on given targets,
/// NBD URIs included: see --target).
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Workloads: w2-subblock-dirty, w4-metamix (default: both), w1-unaligned-dio,
    /// w3-striped-dio, w5-nocow, meta, plot.
    #[arg(short = 'w', long = "workload")]
    workloads: Vec<String>,
    /// Runs per variant; the median is reported (default 5; w5-nocow: 3).
    #[arg(long)]
    runs: Option<usize>,
    /// Directory for the target files (created; the files are removed afterwards).
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
    /// Operations per run: fsync'd writes for w2, files per thread for w4.
    #[arg(long)]
    ops: Option<u64>,
    /// Threads (w1 jobs, w4 workers).
    #[arg(long, alias = "jobs", default_value_t = 2)]
    threads: usize,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// w3-striped-dio only: run on these targets, in order, instead of files created in
    /// --dir: paths or NBD URIs (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH).
    /// Repeat once per target; the largest count in --counts uses that many. Their
    /// contents are overwritten (a file system is made on them).
    #[arg(long = "target", value_name = "PATH|URI")]
    targets: Vec<PathBuf>,
    /// w3-striped-dio: target counts, comma-separated (default 1,4,8).
    #[arg(long, value_delimiter = ',')]
    counts: Vec<usize>,
    /// w3-striped-dio: I/O sizes, comma-separated (default 1m,16m,64m).
    #[arg(long, value_delimiter = ',', value_parser = crate::size::parse_size)]
    sizes: Vec<u64>,
    /// meta: files to create (all threads together).
    #[arg(long, default_value_t = 100_000)]
    files: u64,
    /// meta: directories the files are spread over.
    #[arg(long, default_value_t = 1000)]
    dirs: u64,
    /// meta: bytes written to each file (0: empty files). w5-nocow: bytes of each
    /// writer's NOCOW file (0: 64 MiB).
    #[arg(long, default_value = "0", value_parser = crate::size::parse_size)]
    file_size: u64,
    /// meta: number of targets.
    #[arg(long, default_value_t = 4)]
    target_count: usize,
    /// meta: size of each target (sparse files, not pre-zeroed).
    #[arg(long, default_value = "4g", value_parser = crate::size::parse_size)]
    target_size: u64,
    /// meta: measurement points as the file count grows (10: at 10%, 20%, ...).
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// meta, plot: write an SVG of fsync latency against files created.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// meta, plot: another series for the plot, from a file of
    /// `files_created latency_seconds` lines (repeatable).
    #[arg(long, value_name = "LABEL=FILE", value_parser = crate::bench_meta::parse_series)]
    plot_series: Vec<(String, PathBuf)>,
    /// meta: where checkpoints run, background (the checkpointer thread) or inline (on
    /// the committing thread when the journal is full: the synchronous design).
    #[arg(long, default_value = "background", value_parser = parse_checkpoints)]
    checkpoint: stripefs::Checkpoints,
    /// meta: in-core decoded inode bound (`-o inode_cache=N`; default: the mount's, one
    /// per 512 bytes of `meta_cache`).
    #[arg(long, value_name = "N")]
    inode_cache: Option<usize>,
    /// meta: run the final lookups and unlinks on M files picked at random instead of
    /// every file (at 10 million files those take hours on a small machine).
    #[arg(long, value_name = "M")]
    final_sample: Option<u64>,
    /// w1-unaligned-dio, w3-striped-dio: whether their files are copy on write (`on`:
    /// every overwrite copies and checksums its blocks) or NOCOW (`off`, the mount's
    /// default: the seeds' in-place overwrites).
    #[arg(long, default_value = "off", value_parser = parse_datacow)]
    datacow: stripefs::DataCow,
    /// w5-nocow: writer threads (fio jobs), one NOCOW file each.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// w5-nocow: threads creating, stating, renaming and unlinking files.
    #[arg(long, default_value_t = 2)]
    meta_threads: usize,
    /// w5-nocow: timed seconds per variant and run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// w5-nocow: the metadata page cache budget of the timed mounts (`-o meta_cache`).
    #[arg(long, default_value = "1m", value_parser = crate::size::parse_size)]
    meta_cache: u64,
    /// w5-nocow: metadata operations per second each metadata thread starts (0: as fast
    /// as it can, which on a small machine takes the cores from the writers).
    #[arg(long, default_value_t = 1000.0)]
    meta_rate: f64,
}

fn parse_datacow(s: &str) -> Result<stripefs::DataCow, String> {
    match s {
        "on" => Ok(stripefs::DataCow::On),
        "off" => Ok(stripefs::DataCow::Off),
        _ => Err(format!("--datacow must be on or off, not {s:?}")),
    }
}

fn parse_checkpoints(s: &str) -> Result<stripefs::Checkpoints, String> {
    match s {
        "background" => Ok(stripefs::Checkpoints::Background),
        "inline" => Ok(stripefs::Checkpoints::Inline),
        _ => Err(format!(
            "--checkpoint must be background or inline, not {s:?}"
        )),
    }
}

impl BenchArgs {
    /// The `meta` workload's parameters.
    fn meta_params(&self) -> crate::bench_meta::MetaParams {
        crate::bench_meta::MetaParams {
            files: self.files,
            dirs: self.dirs,
            threads: self.threads,
            file_size: self.file_size,
            targets: self.target_count,
            target_size: self.target_size,
            steps: self.steps,
            plot: self.plot.clone(),
            plot_series: self.plot_series.clone(),
            checkpoints: self.checkpoint,
            inode_cache: self.inode_cache,
            final_sample: self.final_sample,
        }
    }

    /// The `w5-nocow` workload's parameters.
    fn nocow_params(&self) -> crate::bench_nocow::NocowParams {
        crate::bench_nocow::NocowParams {
            writers: self.writers,
            meta_threads: self.meta_threads,
            file_size: if self.file_size == 0 {
                64 << 20
            } else {
                self.file_size
            },
            seconds: self.seconds,
            runs: self.runs.unwrap_or(3).max(1),
            meta_cache: self.meta_cache,
            meta_rate: self.meta_rate,
        }
    }
}

/// One variant's results over all runs.
struct Variant {
    name: &'static str,
    /// Per run: (primary metric, secondary metrics...).
    runs: Vec<Vec<f64>>,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Variant {
    fn median(&self, i: usize) -> f64 {
        median(self.runs.iter().map(|r| r[i]).collect())
    }
}

/// How results are printed: tables for people, or one JSON object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    Table,
    Json,
}

/// Runs the benchmarks.
pub fn run(a: &BenchArgs) -> Result<i32, String> {
    let wanted: Vec<&str> = if a.workloads.is_empty() {
        vec!["w2-subblock-dirty", "w4-metamix"]
    } else {
        a.workloads.iter().map(String::as_str).collect()
    };
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    let runs = a.runs.unwrap_or(5).max(1);
    let output = if a.json { Output::Json } else { Output::Table };
    let mut json = Vec::new();
    if output == Output::Table {
        println!("machine: {}", machine());
    }
    for w in wanted {
        let result = match w {
            "w2-subblock-dirty" => w2(&a.dir, runs, a.ops.unwrap_or(2000), output)?,
            "w4-metamix" => w4(&a.dir, runs, a.ops.unwrap_or(12), a.threads.max(1), output)?,
            "w1-unaligned-dio" => {
                crate::bench_dio::w1(&a.dir, runs, a.threads.max(1), a.datacow, output)?
            }
            "w3-striped-dio" => crate::bench_dio::w3(&a.dir, &w3_params(a)?, runs, output)?,
            "w5-nocow" => crate::bench_nocow::w5(&a.dir, &a.nocow_params(), output)?,
            "meta" => crate::bench_meta::run(&a.dir, &a.meta_params(), output)?,
            "plot" => crate::bench_meta::plot_only(&a.meta_params())?,
            other => {
                return Err(format!(
                    "unknown workload {other:?} (w2-subblock-dirty, w4-metamix, w1-unaligned-dio, w3-striped-dio, w5-nocow, meta, plot)"
                ))
            }
        };
        json.push(result);
    }
    if output == Output::Json {
        println!(
            "{{\"machine\":{:?},\"workloads\":[{}]}}",
            machine(),
            json.join(",")
        );
    }
    Ok(0)
}

/// What `w3-striped-dio` runs on, from the arguments.
fn w3_params(a: &BenchArgs) -> Result<crate::bench_dio::W3Params, String> {
    let counts = if a.counts.is_empty() {
        vec![1, 4, 8]
    } else {
        a.counts.clone()
    };
    if counts.iter().any(|&c| c == 0 || c > 256) {
        return Err("--counts: each count must be 1 to 256".into());
    }
    let max = counts.iter().copied().max().unwrap_or(1);
    if !a.targets.is_empty() && a.targets.len() < max {
        return Err(format!(
            "--counts asks for {max} targets but only {} --target were given",
            a.targets.len()
        ));
    }
    let sizes = if a.sizes.is_empty() {
        vec![1 << 20, 16 << 20, 64 << 20]
    } else {
        a.sizes.clone()
    };
    if sizes.iter().any(|&s| s == 0 || s % 4096 != 0) {
        return Err("--sizes: each size must be a non-zero multiple of 4 KiB".into());
    }
    Ok(crate::bench_dio::W3Params {
        targets: a.targets.clone(),
        counts,
        sizes,
        datacow: a.datacow,
    })
}

/// A short description of this machine.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or_else(|| "?".into(), |kib| format!("{} GiB", kib >> 20));
    format!("{cpu}, {cores} cores, {mem} RAM")
}

/// Creates `n` target files of `size` in `dir`, pre-zeroed, and a file system on them.
pub(crate) fn make_fs(dir: &Path, n: usize, size: u64) -> Result<Vec<PathBuf>, String> {
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("bench-t{i}"))).collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|p| open_one(p, Some(size)))
        .collect::<Result<_, _>>()?;
    prezero(&targets)?;
    Fs::mkfs(&targets, &MkfsOptions::default()).map_err(|e| e.to_string())?;
    Ok(paths)
}

pub(crate) fn mount(paths: &[PathBuf], opts: MountOptions) -> Result<Fs, String> {
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|p| open_one(p, None))
        .collect::<Result<_, _>>()?;
    Fs::mount(targets, opts)
        .map(|(fs, _)| fs)
        .map_err(|e| e.to_string())
}

pub(crate) fn quiet() -> MountOptions {
    MountOptions {
        commit_interval: None,
        writeback_interval: None,
        ..MountOptions::default()
    }
}

/// [`quiet`], with new files copy on write or not.
pub(crate) fn quiet_with(datacow: stripefs::DataCow) -> MountOptions {
    MountOptions { datacow, ..quiet() }
}

pub(crate) fn cleanup(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

const W2_FILE: u64 = 128 << 20;
const W2_IO: u64 = 4096;

fn w2(dir: &Path, runs: usize, ops: u64, output: Output) -> Result<String, String> {
    let paths = make_fs(dir, 4, 64 << 20)?;
    {
        let fs = mount(&paths, quiet())?;
        let f = fs
            .create(Ino::ROOT, "f".as_ref(), CreateParams::with_perm(0o644))
            .map_err(|e| e.to_string())?;
        let chunk = vec![0x5au8; 4 << 20];
        for off in (0..W2_FILE).step_by(chunk.len()) {
            fs.write_at(f.ino, off, &chunk).map_err(|e| e.to_string())?;
        }
        fs.unmount().map_err(|e| e.to_string())?;
    }
    let mut variants = [
        Variant {
            name: "block",
            runs: Vec::new(),
        },
        Variant {
            name: "folio",
            runs: Vec::new(),
        },
    ];
    for run in 0..runs {
        for (v, tracking) in variants
            .iter_mut()
            .zip([DirtyTracking::Block, DirtyTracking::Folio])
        {
            let mut opts = quiet();
            opts.cache.dirty_tracking = tracking;
            opts.cache.folio_bytes = 64 << 10;
            // Every folio 64 KiB, as when this comparison was first measured.
            opts.cache.folio_sizing = stripefs::FolioSizing::Fixed;
            let fs = mount(&paths, opts)?;
            let ino = fs
                .lookup(Ino::ROOT, "f".as_ref())
                .map_err(|e| e.to_string())?
                .ino;
            let h = fs.open_file(ino).map_err(|e| e.to_string())?;
            let before = fs.status();
            let mut rng = Rng::new(run as u64 + 1);
            let buf = vec![0xa5u8; W2_IO as usize];
            let t = Instant::now();
            for _ in 0..ops {
                let off = rng.below(W2_FILE / W2_IO) * W2_IO;
                h.write_at(off, &buf).map_err(|e| e.to_string())?;
                h.sync_all().map_err(|e| e.to_string())?;
            }
            let secs = t.elapsed().as_secs_f64();
            let after = fs.status();
            drop(h);
            fs.unmount().map_err(|e| e.to_string())?;
            let app = (ops * W2_IO) as f64;
            v.runs.push(vec![
                ops as f64 / secs,
                (after.data_bytes_written - before.data_bytes_written) as f64 / app,
                (after.meta_bytes_written - before.meta_bytes_written) as f64 / ops as f64,
                (after.data_bytes_read - before.data_bytes_read) as f64 / ops as f64,
            ]);
        }
    }
    cleanup(&paths);
    let (b, f) = (&variants[0], &variants[1]);
    if output == Output::Table {
        println!("\nw2-subblock-dirty: 128 MiB prewritten file over 4 targets, 4 KiB random buffered writes each followed by fsync, 64 KiB folios; {ops} writes per run, median of {runs} runs");
        println!("| dirty_tracking | IOPS | write amplification (data) | journal bytes/op | data read bytes/op |");
        println!("|---|---|---|---|---|");
        for v in &variants {
            println!(
                "| {} | {:.0} | {:.2} | {:.0} | {:.0} |",
                v.name,
                v.median(0),
                v.median(1),
                v.median(2),
                v.median(3)
            );
        }
        println!(
            "ratio block/folio: IOPS {:.2}x, amplification {:.2} vs {:.2}",
            b.median(0) / f.median(0),
            b.median(1),
            f.median(1)
        );
    }
    Ok(format!(
        "{{\"workload\":\"w2-subblock-dirty\",\"ops_per_run\":{ops},\"runs\":{runs},\"variants\":[{}]}}",
        variants.iter().map(|v| format!(
            "{{\"dirty_tracking\":\"{}\",\"iops\":{:.1},\"write_amplification\":{:.3},\"journal_bytes_per_op\":{:.0},\"read_bytes_per_op\":{:.0},\"iops_runs\":{:?}}}",
            v.name, v.median(0), v.median(1), v.median(2), v.median(3), v.runs.iter().map(|r| r[0].round()).collect::<Vec<_>>()
        )).collect::<Vec<_>>().join(",")
    ))
}

/// stress-ng metamix's default file span.
const W4_BYTES: u64 = 1 << 20;

/// One metamix file: create, 256 strided writes each starting beyond EOF (every 64th
/// rounded up to a page), sometimes fdatasync, size check, fdatasync, read back in a
/// shuffled order and verify, unlink. Returns the verification errors.
fn metamix_file(fs: &Fs, name: &str, rng: &mut Rng) -> Result<u64, String> {
    let e = |x: stripefs::FsError| x.to_string();
    let a = fs
        .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .map_err(e)?;
    let h = fs.open_file(a.ino).map_err(e)?;
    let mut off = rng.below(W4_BYTES / 4);
    let mut pieces = Vec::with_capacity(256);
    for n in 0..256u64 {
        let len = 4 + rng.below(60);
        let seed = rng.next_u64();
        let data: Vec<u8> = (0..len)
            .map(|i| (seed >> (i % 8 * 8)) as u8 ^ i as u8)
            .collect();
        h.write_at(off, &data).map_err(e)?;
        pieces.push((off, data));
        off += (W4_BYTES - off) / (256 - n);
        if n % 64 == 63 {
            off = off.next_multiple_of(4096);
        }
    }
    if rng.one_in(16) {
        h.sync_data().map_err(e)?;
    }
    let end = pieces
        .iter()
        .map(|(o, d)| o + d.len() as u64)
        .max()
        .unwrap_or(0);
    let mut errors = u64::from(h.stat().map_err(e)?.size != end);
    h.sync_data().map_err(e)?;
    for i in (1..pieces.len()).rev() {
        pieces.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for (o, d) in &pieces {
        let mut buf = vec![0u8; d.len()];
        let n = h.read_at(*o, &mut buf).map_err(e)?;
        errors += u64::from(n != d.len() || buf != *d);
    }
    drop(h);
    fs.unlink(Ino::ROOT, name.as_ref()).map_err(e)?;
    Ok(errors)
}

fn w4(
    dir: &Path,
    runs: usize,
    files: u64,
    threads: usize,
    output: Output,
) -> Result<String, String> {
    let paths = make_fs(dir, 4, 128 << 20)?;
    let mut variants = [
        Variant {
            name: "cache",
            runs: Vec::new(),
        },
        Variant {
            name: "flush",
            runs: Vec::new(),
        },
    ];
    for run in 0..runs {
        for (v, mode) in variants.iter_mut().zip([ZeroMode::Cache, ZeroMode::Flush]) {
            let mut opts = quiet();
            opts.eof_zeroing = mode;
            opts.speculative_prealloc = true;
            let fs = mount(&paths, opts)?;
            let t = Instant::now();
            let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|th| {
                        let fs = fs.clone();
                        s.spawn(move || {
                            let mut rng = Rng::new((run * 131 + th) as u64 + 7);
                            let mut errors = 0;
                            for i in 0..files {
                                errors += metamix_file(&fs, &format!("mm-{th}-{i}"), &mut rng)?;
                            }
                            Ok(errors)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
                    .collect()
            });
            let secs = t.elapsed().as_secs_f64();
            let errors: u64 = results
                .into_iter()
                .collect::<Result<Vec<u64>, String>>()?
                .iter()
                .sum();
            fs.unmount().map_err(|e| e.to_string())?;
            v.runs
                .push(vec![(files * threads as u64) as f64 / secs, errors as f64]);
        }
    }
    cleanup(&paths);
    let (c, f) = (&variants[0], &variants[1]);
    let errors: f64 = variants
        .iter()
        .flat_map(|v| v.runs.iter().map(|r| r[1]))
        .sum();
    if output == Output::Table {
        println!("\nw4-metamix: stress-ng metamix pattern (256 strided writes beyond EOF per file, verify, unlink), {threads} threads x {files} files per run, speculative preallocation on; median of {runs} runs");
        println!("| eof_zeroing | ops/s (files) | verification errors |");
        println!("|---|---|---|");
        for v in &variants {
            println!(
                "| {} | {:.1} | {} |",
                v.name,
                v.median(0),
                v.runs.iter().map(|r| r[1]).sum::<f64>()
            );
        }
        println!(
            "ratio cache/flush: {:.1}x; verification errors in all runs: {errors}",
            c.median(0) / f.median(0)
        );
    }
    Ok(format!(
        "{{\"workload\":\"w4-metamix\",\"threads\":{threads},\"files_per_thread\":{files},\"runs\":{runs},\"verification_errors\":{errors},\"variants\":[{}]}}",
        variants.iter().map(|v| format!(
            "{{\"eof_zeroing\":\"{}\",\"ops_per_sec\":{:.2},\"ops_runs\":{:?}}}",
            v.name, v.median(0), v.runs.iter().map(|r| (r[0] * 100.0).round() / 100.0).collect::<Vec<_>>()
        )).collect::<Vec<_>>().join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::BenchArgs;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn meta_arguments() {
        let a = parse(&[
            "-w",
            "meta",
            "--files",
            "300000",
            "--dirs",
            "500",
            "--threads",
            "3",
            "--file-size",
            "4k",
            "--target-size",
            "16g",
            "--plot",
            "out.svg",
            "--plot-series",
            "xfs=x.txt",
        ])
        .unwrap();
        let p = a.meta_params();
        assert_eq!(
            (p.files, p.dirs, p.threads, p.file_size, p.target_size),
            (300_000, 500, 3, 4096, 16 << 30)
        );
        assert_eq!((p.targets, p.steps), (4, 10));
        assert_eq!(p.plot.as_deref(), Some("out.svg".as_ref()));
        assert_eq!(p.plot_series, vec![("xfs".to_string(), "x.txt".into())]);
        assert!(p.check().is_ok());

        // Defaults: issue 11's shape, empty files.
        let p = parse(&["-w", "meta"]).unwrap().meta_params();
        assert_eq!(
            (p.files, p.dirs, p.threads, p.file_size),
            (100_000, 1000, 2, 0)
        );

        let e = parse(&["-w", "meta", "--plot-series", "nolabel"]).unwrap_err();
        assert!(e.to_string().contains("LABEL=FILE"), "{e}");
        for (args, msg) in [
            (&["--files", "0"][..], "--files"),
            (&["--files", "10", "--dirs", "11"][..], "--dirs"),
            (&["--threads", "0"][..], "--threads"),
            (&["--steps", "0"][..], "--steps"),
            (&["--target-size", "1m"][..], "--target-size"),
        ] {
            let e = parse(args).unwrap().meta_params().check().unwrap_err();
            assert!(e.contains(msg), "{args:?}: {e}");
        }
    }

    #[test]
    fn nocow_arguments() {
        let p = parse(&[
            "-w",
            "w5-nocow",
            "--writers",
            "8",
            "--meta-threads",
            "3",
            "--file-size",
            "32m",
            "--seconds",
            "2.5",
            "--meta-cache",
            "512k",
            "--runs",
            "5",
            "--meta-rate",
            "0",
        ])
        .unwrap()
        .nocow_params();
        assert_eq!(
            (p.writers, p.meta_threads, p.file_size, p.runs, p.meta_cache),
            (8, 3, 32 << 20, 5, 512 << 10)
        );
        assert!((p.seconds - 2.5).abs() < 1e-9);
        assert_eq!(p.meta_rate, 0.0);
        assert!(p.check().is_ok());

        // Defaults: the shape, 3 runs.
        let p = parse(&["-w", "w5-nocow"]).unwrap().nocow_params();
        assert_eq!(
            (p.writers, p.meta_threads, p.file_size, p.runs, p.meta_cache),
            (4, 2, 64 << 20, 3, 1 << 20)
        );
        assert!((p.seconds - 10.0).abs() < 1e-9);
        assert!((p.meta_rate - 1000.0).abs() < 1e-9);

        let e = parse(&["-w", "w5-nocow", "--meta-cache", "lots"]).unwrap_err();
        assert!(e.to_string().contains("--meta-cache"), "{e}");
        for (args, msg) in [
            (&["--writers", "0"][..], "--writers"),
            (&["--file-size", "5000"][..], "--file-size"),
            (&["--seconds", "0"][..], "--seconds"),
            (&["--meta-cache", "64k"][..], "--meta-cache"),
            (&["--meta-rate=-5"][..], "--meta-rate"),
        ] {
            let e = parse(args).unwrap().nocow_params().check().unwrap_err();
            assert!(e.contains(msg), "{args:?}: {e}");
        }
    }
}

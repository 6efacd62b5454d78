//! `w5-nocow` (seed 001, issue 13): NOCOW overwrites with frequent fsyncs while other
//! threads work on the metadata of the same directories, `nocow_check = unlocked` vs
//! `locked` (see `bench.rs`).
//!
//! The seed's shapes, scaled to this machine: fio-like 4 KiB random buffered writes
//! (fio's default `psync` engine, not direct) with an fsync every 2 writes, one job and
//! one NOCOW file per writer thread, while metadata threads create, stat, rename and
//! unlink files in the directories of those files (the seed's dbench: its latency). The
//! fsyncs start writeback, whose in-place decision looks the blocks up in the
//! reference-count and checksum trees; with `locked` that lookup holds the metadata lock
//! the metadata threads need. The trees are made non-empty beforehand (copy-on-write
//! files written between the NOCOW files' blocks, parts of them cloned) and the metadata
//! page cache is small (`--meta-cache`), so the lookups miss it part of the time and read
//! pages from the targets.
//!
//! Every mount starts from the same image: the prepared targets are copied aside once and
//! copied back before each mount.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stripefs::{
    CreateParams, DataCow, FileFlags, Fs, FsStatus, Ino, MetaCacheBytes, NocowCheck, OpenMode,
    RenameMode,
};
use stripefs_target::Rng;

use crate::bench::{cleanup, make_fs, median, mount, quiet, quiet_with, Output};
use crate::bench_meta::Quantiles;

/// The writes' size.
const IO: u64 = 4096;
/// fio's `fsync=2`: an fsync after every 2 writes.
const FSYNC_EVERY: u64 = 2;
/// Directories the files are spread over (writer `j`'s file is in `d{j % DIRS}`).
const DIRS: usize = 2;
/// Prepare: the NOCOW and copy-on-write files are written in pieces of this size,
/// alternately, so that their blocks interleave on the targets.
const PIECE: u64 = 64 << 10;
/// Prepare: one block of every `CLONE_STRIDE` of each copy-on-write file is cloned, so
/// that the reference-count tree holds many short runs spread over the targets.
const CLONE_STRIDE: u64 = 8;
/// A metadata thread unlinks the file it made this many cycles before (so that the
/// directories stay the same size).
const KEEP: u64 = 64;

/// What `w5-nocow` runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NocowParams {
    /// Writer threads (fio jobs), one NOCOW file each.
    pub writers: usize,
    /// Threads creating, stating, renaming and unlinking files.
    pub meta_threads: usize,
    /// Bytes of each NOCOW file (and of each copy-on-write file beside it).
    pub file_size: u64,
    /// Timed seconds per variant and run.
    pub seconds: f64,
    /// Runs per variant (alternated); medians are reported.
    pub runs: usize,
    /// The metadata page cache budget of the timed mounts (`-o meta_cache`).
    pub meta_cache: u64,
    /// Operations per second each metadata thread starts (0: as fast as it can).
    pub meta_rate: f64,
}

impl NocowParams {
    /// Checks the parameters.
    ///
    /// # Errors
    /// A sentence naming the argument that is out of range.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.writers == 0 || self.writers > 64 {
            return Err("--writers must be 1 to 64".into());
        }
        if self.meta_threads > 64 {
            return Err("--meta-threads must be 0 to 64".into());
        }
        if self.file_size < PIECE || !self.file_size.is_multiple_of(PIECE) {
            return Err(format!(
                "--file-size must be a non-zero multiple of {} KiB",
                PIECE >> 10
            ));
        }
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            return Err("--seconds must be positive".into());
        }
        if !(self.meta_rate >= 0.0 && self.meta_rate.is_finite()) {
            return Err("--meta-rate must be 0 or positive".into());
        }
        MetaCacheBytes(self.meta_cache)
            .validate(4096)
            .map_err(|e| format!("--meta-cache: {e}"))
    }
}

/// One timed run of one variant.
#[derive(Debug, Clone, Default)]
struct RunResult {
    writes: u64,
    secs: f64,
    meta: Quantiles,
    meta_ops_per_sec: f64,
    cache_hits: u64,
    cache_misses: u64,
    in_place: u64,
    cow: u64,
    researches: u64,
    locked_fallbacks: u64,
}

impl RunResult {
    fn iops(&self) -> f64 {
        self.writes as f64 / self.secs
    }
    fn miss_rate(&self) -> f64 {
        let all = self.cache_hits + self.cache_misses;
        if all == 0 {
            0.0
        } else {
            self.cache_misses as f64 / all as f64
        }
    }
}

/// The medians of one variant's runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct VariantSummary {
    pub name: &'static str,
    pub iops: f64,
    pub mib_per_sec: f64,
    pub meta_ops_per_sec: f64,
    /// Seconds.
    pub meta_p50: f64,
    pub meta_p99: f64,
    pub meta_max: f64,
    pub miss_rate: f64,
    pub in_place: f64,
    pub cow: f64,
    pub researches: f64,
    pub locked_fallbacks: f64,
    pub iops_runs: Vec<f64>,
    pub max_runs: Vec<f64>,
}

fn summarize(name: &'static str, runs: &[RunResult]) -> VariantSummary {
    let m = |f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(f).collect());
    VariantSummary {
        name,
        iops: m(&RunResult::iops),
        mib_per_sec: m(&|r| r.iops() * IO as f64 / f64::from(1 << 20)),
        meta_ops_per_sec: m(&|r| r.meta_ops_per_sec),
        meta_p50: m(&|r| r.meta.p50),
        meta_p99: m(&|r| r.meta.p99),
        meta_max: m(&|r| r.meta.max),
        miss_rate: m(&RunResult::miss_rate),
        in_place: m(&|r| r.in_place as f64),
        cow: m(&|r| r.cow as f64),
        researches: m(&|r| r.researches as f64),
        locked_fallbacks: m(&|r| r.locked_fallbacks as f64),
        iops_runs: runs.iter().map(RunResult::iops).collect(),
        max_runs: runs.iter().map(|r| r.meta.max).collect(),
    }
}

fn s(e: stripefs::FsError) -> String {
    e.to_string()
}

fn dir_name(i: usize) -> String {
    format!("d{i}")
}

/// Makes the image: per writer, a NOCOW file and a copy-on-write file in its directory,
/// written in alternating direct pieces (their blocks interleave), a clone of every
/// `CLONE_STRIDE`th block of the copy-on-write file, everything synced and checkpointed.
fn prepare(paths: &[PathBuf], p: &NocowParams) -> Result<(), String> {
    let fs = mount(paths, quiet_with(DataCow::On))?;
    let dirs: Vec<Ino> = (0..DIRS)
        .map(|i| {
            fs.mkdir(
                Ino::ROOT,
                dir_name(i).as_ref(),
                CreateParams::with_perm(0o755),
            )
            .map(|a| a.ino)
            .map_err(s)
        })
        .collect::<Result<_, _>>()?;
    let mut files = Vec::new();
    for j in 0..p.writers {
        let d = dirs[j % DIRS];
        let mk = |name: String| {
            fs.create(d, name.as_ref(), CreateParams::with_perm(0o644))
                .map(|a| a.ino)
                .map_err(s)
        };
        let nocow = mk(format!("nocow-{j}"))?;
        fs.set_file_flags(nocow, FileFlags::NOCOW).map_err(s)?;
        if !fs.file_flags(nocow).map_err(s)?.contains(FileFlags::NOCOW) {
            return Err("the NOCOW flag did not stick on an empty file".into());
        }
        let cow = mk(format!("cow-{j}"))?;
        let clone = mk(format!("clone-{j}"))?;
        files.push((nocow, cow, clone));
    }
    let mut rng = Rng::new(0x5eed_0001);
    let mut buf = vec![0u8; PIECE as usize];
    let handles: Vec<_> = files
        .iter()
        .map(|&(n, c, _)| {
            Ok((
                fs.open_file_with(n, OpenMode::Direct).map_err(s)?,
                fs.open_file_with(c, OpenMode::Direct).map_err(s)?,
            ))
        })
        .collect::<Result<_, String>>()?;
    for off in (0..p.file_size).step_by(PIECE as usize) {
        for (n, c) in &handles {
            for h in [n, c] {
                // Not all zeros, and different per piece (checksums differ).
                let v = rng.next_u64();
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = (v >> ((i % 8) * 8)) as u8 ^ (i / 4096) as u8;
                }
                h.write_at(off, &buf).map_err(s)?;
            }
        }
    }
    for (n, c) in &handles {
        n.sync_all().map_err(s)?;
        c.sync_all().map_err(s)?;
    }
    drop(handles);
    for &(_, cow, clone) in &files {
        for block in (0..p.file_size / IO).step_by(CLONE_STRIDE as usize) {
            fs.clone_range(cow, block * IO, clone, block * IO, IO)
                .map_err(s)?;
        }
    }
    fs.sync().map_err(s)?;
    fs.checkpoint().map_err(s)?;
    fs.unmount().map_err(s)
}

/// Copies each of `from` onto the same-index path of `to`.
fn copy_all(from: &[PathBuf], to: &[PathBuf]) -> Result<(), String> {
    for (f, t) in from.iter().zip(to) {
        std::fs::copy(f, t).map_err(|e| format!("{} -> {}: {e}", f.display(), t.display()))?;
    }
    Ok(())
}

/// The counters a run reports, after minus before.
fn deltas(r: &mut RunResult, before: &FsStatus, after: &FsStatus) {
    r.cache_hits = after.meta_cache.hits - before.meta_cache.hits;
    r.cache_misses = after.meta_cache.misses - before.meta_cache.misses;
    r.in_place = after.nocow_in_place - before.nocow_in_place;
    r.cow = after.nocow_cow - before.nocow_cow;
    r.researches = after.nocow_researches - before.nocow_researches;
    r.locked_fallbacks = after.nocow_locked_fallbacks - before.nocow_locked_fallbacks;
}

/// One metadata thread: in directory `d`, cycles of create, stat, rename, stat of the
/// renamed file and of a data file of the directory, unlink of the file made `KEEP`
/// cycles before; every operation's latency in seconds. With `rate` > 0 the `n`th
/// operation starts no earlier than `n / rate` seconds after the first (a paced client,
/// as dbench's are, rather than a loop that takes both cores from the writers); its
/// latency is measured from its start.
fn meta_thread(
    fs: &Fs,
    d: Ino,
    data_name: &str,
    (k, rate): (usize, f64),
    deadline: Instant,
) -> Result<Vec<f64>, String> {
    let mut lat = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let mut timed = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<(), String> {
        if rate > 0.0 {
            let at = start + Duration::from_secs_f64(lat.len() as f64 / rate);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
        }
        let t = Instant::now();
        f()?;
        lat.push(t.elapsed().as_secs_f64());
        Ok(())
    };
    let mut i = 0u64;
    while Instant::now() < deadline {
        let (a, b) = (format!("m{k}-{i}"), format!("r{k}-{i}"));
        timed(&mut || {
            fs.create(d, a.as_ref(), CreateParams::with_perm(0o644))
                .map(|_| ())
                .map_err(s)
        })?;
        timed(&mut || fs.lookup(d, a.as_ref()).map(|_| ()).map_err(s))?;
        timed(&mut || {
            fs.rename(d, a.as_ref(), d, b.as_ref(), RenameMode::Replace)
                .map_err(s)
        })?;
        timed(&mut || {
            let x = fs.lookup(d, b.as_ref()).map_err(s)?;
            fs.getattr(x.ino).map(|_| ()).map_err(s)
        })?;
        timed(&mut || {
            let x = fs.lookup(d, data_name.as_ref()).map_err(s)?;
            fs.getattr(x.ino).map(|_| ()).map_err(s)
        })?;
        if i >= KEEP {
            let old = format!("r{k}-{}", i - KEEP);
            timed(&mut || fs.unlink(d, old.as_ref()).map_err(s))?;
        }
        i += 1;
    }
    Ok(lat)
}

/// One timed run on a fresh mount of `paths`.
fn timed_run(
    paths: &[PathBuf],
    p: &NocowParams,
    check: NocowCheck,
    seed: u64,
) -> Result<RunResult, String> {
    let mut o = quiet();
    o.nocow_check = check;
    o.meta_cache = MetaCacheBytes(p.meta_cache);
    let fs = mount(paths, o)?;
    let dirs: Vec<Ino> = (0..DIRS)
        .map(|i| {
            fs.lookup(Ino::ROOT, dir_name(i).as_ref())
                .map(|a| a.ino)
                .map_err(s)
        })
        .collect::<Result<_, _>>()?;
    let inos: Vec<Ino> = (0..p.writers)
        .map(|j| {
            fs.lookup(dirs[j % DIRS], format!("nocow-{j}").as_ref())
                .map(|a| a.ino)
                .map_err(s)
        })
        .collect::<Result<_, _>>()?;
    let writes = AtomicU64::new(0);
    let before = fs.status();
    let t = Instant::now();
    let deadline = t + Duration::from_secs_f64(p.seconds);
    let lat = std::thread::scope(|sc| -> Result<Vec<Vec<f64>>, String> {
        let writers: Vec<_> = inos
            .iter()
            .enumerate()
            .map(|(j, &ino)| {
                let (fs, writes) = (&fs, &writes);
                sc.spawn(move || -> Result<(), String> {
                    let h = fs.open_file(ino).map_err(s)?;
                    let mut rng = Rng::new(seed * 1009 + j as u64);
                    let buf = vec![0xa5u8 ^ j as u8; IO as usize];
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let off = rng.below(p.file_size / IO) * IO;
                        h.write_at(off, &buf).map_err(s)?;
                        n += 1;
                        if n.is_multiple_of(FSYNC_EVERY) {
                            h.sync_all().map_err(s)?;
                        }
                    }
                    writes.fetch_add(n, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        let meta: Vec<_> = (0..p.meta_threads)
            .map(|k| {
                let fs = &fs;
                // The directory of writer `j`'s file, so that with fewer writers than
                // directories every metadata thread still works beside a data file.
                let j = k % p.writers;
                let d = dirs[j % DIRS];
                let data_name = format!("nocow-{j}");
                sc.spawn(move || meta_thread(fs, d, &data_name, (k, p.meta_rate), deadline))
            })
            .collect();
        for h in writers {
            h.join().map_err(|_| "writer panicked".to_string())??;
        }
        meta.into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "metadata thread panicked".to_string())?
            })
            .collect()
    })?;
    let secs = t.elapsed().as_secs_f64();
    let after = fs.status();
    fs.unmount().map_err(s)?;
    let all: Vec<f64> = lat.into_iter().flatten().collect();
    let mut r = RunResult {
        writes: writes.load(Ordering::Relaxed),
        secs,
        meta: Quantiles::of(&all),
        meta_ops_per_sec: all.len() as f64 / secs,
        ..RunResult::default()
    };
    deltas(&mut r, &before, &after);
    Ok(r)
}

/// Runs both variants, alternated, each mount from the same prepared image; returns the
/// summaries (unlocked, locked).
pub(crate) fn measure(
    dir: &Path,
    p: &NocowParams,
) -> Result<(VariantSummary, VariantSummary), String> {
    p.check()?;
    let per_target = (p.file_size * 3 * p.writers as u64).div_ceil(4) + (64 << 20);
    let paths = make_fs(dir, 4, per_target)?;
    let saved: Vec<PathBuf> = paths.iter().map(|q| q.with_extension("w5img")).collect();
    let result = (|| {
        prepare(&paths, p)?;
        copy_all(&paths, &saved)?;
        let (mut unlocked, mut locked) = (Vec::new(), Vec::new());
        for run in 0..p.runs.max(1) {
            for (check, out) in [
                (NocowCheck::Unlocked, &mut unlocked),
                (NocowCheck::Locked, &mut locked),
            ] {
                copy_all(&saved, &paths)?;
                out.push(timed_run(&paths, p, check, run as u64 + 1)?);
            }
        }
        Ok((
            summarize("unlocked", &unlocked),
            summarize("locked", &locked),
        ))
    })();
    cleanup(&paths);
    cleanup(&saved);
    result
}

fn ms(v: f64) -> String {
    format!("{:.3}", v * 1e3)
}

/// `w5-nocow`: measures and prints the table or returns the JSON object.
pub(crate) fn w5(dir: &Path, p: &NocowParams, output: Output) -> Result<String, String> {
    let (u, l) = measure(dir, p)?;
    let tput = u.iops / l.iops;
    let max = u.meta_max / l.meta_max;
    if output == Output::Table {
        println!(
            "\nw5-nocow: {} writers, each 4 KiB random buffered overwrites of its own {} MiB NOCOW file with an fsync every {FSYNC_EVERY} writes, while {} threads create/stat/rename/unlink files in the same {DIRS} directories ({}); copy-on-write files and clones interleaved with the NOCOW files fill the checksum and reference-count trees; meta_cache {} KiB; {} s per run, 4 targets, median of {} runs",
            p.writers,
            p.file_size >> 20,
            p.meta_threads,
            if p.meta_rate > 0.0 {
                format!("{} ops/s each", p.meta_rate)
            } else {
                "unpaced".to_string()
            },
            p.meta_cache >> 10,
            p.seconds,
            p.runs.max(1)
        );
        println!("| nocow_check | write IOPS | MiB/s | metadata ops/s | meta p50 ms | meta p99 ms | meta max ms | meta cache miss rate | in place | cow | re-searches | locked fallbacks |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        for v in [&u, &l] {
            println!(
                "| {} | {:.0} | {:.2} | {:.0} | {} | {} | {} | {:.1}% | {:.0} | {:.0} | {:.0} | {:.0} |",
                v.name,
                v.iops,
                v.mib_per_sec,
                v.meta_ops_per_sec,
                ms(v.meta_p50),
                ms(v.meta_p99),
                ms(v.meta_max),
                v.miss_rate * 100.0,
                v.in_place,
                v.cow,
                v.researches,
                v.locked_fallbacks
            );
        }
        println!(
            "unlocked/locked: write throughput {:+.1}% (seed: +9.7%), metadata max latency {:+.1}% (seed: -20.5%), p99 {:+.1}%",
            (tput - 1.0) * 100.0,
            (max - 1.0) * 100.0,
            (u.meta_p99 / l.meta_p99 - 1.0) * 100.0
        );
        println!(
            "per run: IOPS unlocked {:?} locked {:?}; max ms unlocked {:?} locked {:?}",
            round(&u.iops_runs, 1.0),
            round(&l.iops_runs, 1.0),
            round(&u.max_runs, 1e3),
            round(&l.max_runs, 1e3)
        );
    }
    let variant = |v: &VariantSummary| {
        format!(
            "{{\"nocow_check\":\"{}\",\"write_iops\":{:.1},\"write_mib_per_sec\":{:.3},\"meta_ops_per_sec\":{:.1},\"meta_p50_ms\":{:.3},\"meta_p99_ms\":{:.3},\"meta_max_ms\":{:.3},\"meta_cache_miss_rate\":{:.4},\"nocow_in_place\":{:.0},\"nocow_cow\":{:.0},\"nocow_researches\":{:.0},\"nocow_locked_fallbacks\":{:.0},\"iops_runs\":{:?},\"meta_max_ms_runs\":{:?}}}",
            v.name,
            v.iops,
            v.mib_per_sec,
            v.meta_ops_per_sec,
            v.meta_p50 * 1e3,
            v.meta_p99 * 1e3,
            v.meta_max * 1e3,
            v.miss_rate,
            v.in_place,
            v.cow,
            v.researches,
            v.locked_fallbacks,
            round(&v.iops_runs, 1.0),
            round(&v.max_runs, 1e3)
        )
    };
    Ok(format!(
        "{{\"workload\":\"w5-nocow\",\"writers\":{},\"meta_threads\":{},\"file_size\":{},\"seconds\":{},\"meta_cache\":{},\"meta_rate\":{},\"runs\":{},\"fsync_every\":{FSYNC_EVERY},\"io\":{IO},\"variants\":[{},{}],\"throughput_ratio\":{:.4},\"max_latency_ratio\":{:.4}}}",
        p.writers,
        p.meta_threads,
        p.file_size,
        p.seconds,
        p.meta_cache,
        p.meta_rate,
        p.runs.max(1),
        variant(&u),
        variant(&l),
        tput,
        max
    ))
}

/// `v` scaled by `k`, rounded to 2 decimals.
fn round(v: &[f64], k: f64) -> Vec<f64> {
    v.iter().map(|x| (x * k * 100.0).round() / 100.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run on tiny files: both variants write the NOCOW files in place (the
    /// counters say so), the metadata threads ran, and the checks found the trees.
    #[test]
    fn smoke_both_variants_write_in_place() {
        let dir = std::env::temp_dir().join(format!("stripefs-w5-smoke-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // One writer, two metadata threads: both threads work in the writer's directory.
        let p = NocowParams {
            writers: 1,
            meta_threads: 2,
            file_size: 1 << 20,
            seconds: 0.3,
            runs: 1,
            meta_cache: 256 << 10,
            meta_rate: 0.0,
        };
        let r = measure(&dir, &p);
        let _ = std::fs::remove_dir_all(&dir);
        let (u, l) = r.unwrap();
        for v in [&u, &l] {
            assert!(v.in_place > 0.0, "{}: no in-place writes: {v:?}", v.name);
            assert_eq!(v.cow, 0.0, "{}: NOCOW blocks copied: {v:?}", v.name);
            assert!(v.iops > 0.0 && v.meta_ops_per_sec > 0.0, "{v:?}");
            assert!(
                v.meta_max >= v.meta_p99 && v.meta_p99 >= v.meta_p50,
                "{v:?}"
            );
        }
    }

    #[test]
    fn parameters_are_checked() {
        let ok = NocowParams {
            writers: 4,
            meta_threads: 2,
            file_size: 64 << 20,
            seconds: 10.0,
            runs: 3,
            meta_cache: 1 << 20,
            meta_rate: 1000.0,
        };
        assert!(ok.check().is_ok());
        for (p, msg) in [
            (
                NocowParams {
                    writers: 0,
                    ..ok.clone()
                },
                "--writers",
            ),
            (
                NocowParams {
                    file_size: 4096,
                    ..ok.clone()
                },
                "--file-size",
            ),
            (
                NocowParams {
                    seconds: 0.0,
                    ..ok.clone()
                },
                "--seconds",
            ),
            (
                NocowParams {
                    meta_rate: -1.0,
                    ..ok.clone()
                },
                "--meta-rate",
            ),
            (
                NocowParams {
                    meta_cache: 4096,
                    ..ok.clone()
                },
                "--meta-cache",
            ),
        ] {
            let e = p.check().unwrap_err();
            assert!(e.contains(msg), "{p:?}: {e}");
        }
    }
}

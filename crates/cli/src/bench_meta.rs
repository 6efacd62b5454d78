//! `stripefs bench -w meta`: metadata at scale, in-process (issue 11's benchmark).
//!
//! T threads create N files (each `--file-size` bytes) over D directories in `--steps`
//! equal steps; every 1000th file created is opened and `fsync`ed, and that call is
//! timed. After each step, with no creates running: a sample of lookups (stat) and of
//! directory reads, resident memory, checkpoint bytes written. Then, at N files: mount
//! time after a clean unmount, lookups of every file, reads of every directory, mount
//! time after a crash with the journal filled to just below its checkpoint trigger,
//! and unlinks of every file. `--final-sample M` runs those lookups and unlinks on M
//! files picked at random instead (at 10 million files, looking up and unlinking every
//! one takes hours on a small machine). On `ENOSPC` (free space, metadata pages included) the creates
//! stop, the count reached is reported, and the later phases run on what exists.
//!
//! The crash: the file system is mounted again with `checkpoint=inline` (no checkpointer
//! thread: with one, a checkpoint started above half a journal would empty it before the
//! crash, and the mount would measure whatever it left; and an apply queue that holds the
//! whole journal), the journal is filled with `chmod`s of a working set of 4,096
//! distinct files picked at random, in turn, 1000 per `sync`, until one more such commit
//! would reach 75% (where a commit checkpoints first), then a journal-write fault is
//! injected so the next commit fails, which poisons the file system; a poisoned file
//! system is dropped without unmounting (no checkpoint, no further writes), leaving on the
//! file targets exactly what the last durable commit left, as a power cut after it would.
//! The mount after the crash uses `--checkpoint` again.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stripefs::{CreateParams, Fs, FsError, Ino, MkfsOptions, SetAttr};
use stripefs_target::{FaultInjector, FaultKind, Persistence, PointMatch, Rng, Target};

use crate::bench::{cleanup, quiet, Output};
use crate::targets::open_one;

/// One `fsync` of a new file every this many creates.
pub(crate) const FSYNC_EVERY: u64 = 1000;
/// A bound on the `chmod`s the crash phase commits to fill the journal.
const CRASH_MAX_CHMODS: u64 = 2_000_000;
/// The crash fill's phase in the memory table.
const CRASH_FILL_PHASE: &str = "chmod, crash";
/// Files the crash phase's `chmod`s cycle over: their leaves, scattered through the tree,
/// stay well under the pages a checkpoint is due at (half the default 64 MiB
/// `meta_cache`, 8,192 pages).
const CRASH_WORKING_SET: u64 = 4096;
/// Lookups and directory reads sampled after each step.
const STAT_SAMPLE: u64 = 5000;
const READDIR_SAMPLE: u64 = 50;

/// What `-w meta` runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MetaParams {
    pub files: u64,
    pub dirs: u64,
    pub threads: usize,
    pub file_size: u64,
    pub targets: usize,
    pub target_size: u64,
    pub steps: u64,
    pub plot: Option<PathBuf>,
    /// Extra series for the plot: (label, file of `files_created latency_seconds` lines).
    pub plot_series: Vec<(String, PathBuf)>,
    /// Where checkpoints run (`--checkpoint`).
    pub checkpoints: stripefs::Checkpoints,
    /// In-core decoded inode bound (`--inode-cache`; the mount's default when `None`).
    pub inode_cache: Option<usize>,
    /// The final lookups and unlinks run on this many files picked at random
    /// (`--final-sample`; every file when `None`).
    pub final_sample: Option<u64>,
}

impl MetaParams {
    /// Checks the arguments.
    ///
    /// # Errors
    /// A sentence naming the bad argument.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.files == 0 {
            return Err("--files must be at least 1".into());
        }
        if self.dirs == 0 || self.dirs > self.files {
            return Err(format!("--dirs must be 1 to --files ({})", self.files));
        }
        if self.threads == 0 || self.threads > 1024 {
            return Err("--threads must be 1 to 1024".into());
        }
        if self.steps == 0 || self.steps > self.files {
            return Err(format!("--steps must be 1 to --files ({})", self.files));
        }
        if self.targets == 0 || self.targets > 256 {
            return Err("--target-count must be 1 to 256".into());
        }
        if self.target_size < 8 << 20 {
            return Err("--target-size must be at least 8 MiB".into());
        }
        if self.file_size > 1 << 30 {
            return Err("--file-size must be at most 1 GiB".into());
        }
        if self.final_sample == Some(0) {
            return Err("--final-sample must be at least 1".into());
        }
        Ok(())
    }
}

/// Parses `LABEL=FILE` (`--plot-series`).
pub(crate) fn parse_series(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((l, f)) if !l.is_empty() && !f.is_empty() => Ok((l.to_string(), PathBuf::from(f))),
        _ => Err(format!("{s:?}: expected LABEL=FILE")),
    }
}

/// Latency quantiles of a set of `fsync`s, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Quantiles {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Quantiles {
    pub(crate) fn of(lat: &[f64]) -> Self {
        if lat.is_empty() {
            return Self::default();
        }
        let mut v = lat.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Self {
            count: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// The measurements at the end of one create step.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Step {
    /// Files existing at the end of the step.
    pub files: u64,
    pub create_per_sec: f64,
    pub fsync: Quantiles,
    pub stat_per_sec: f64,
    pub readdir_entries_per_sec: f64,
    /// Checkpoint bytes written during the step per file created in it.
    pub ckpt_bytes_per_file: f64,
    pub checkpoints: u64,
    /// Bytes of metadata tree pages on disk (live pages, all targets).
    pub model_bytes: u64,
    pub vm_rss: u64,
}

/// A mount's time and what it replayed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct MountTime {
    pub secs: f64,
    pub replayed_txns: u64,
    /// Fraction of the journal in use when the file system went down.
    pub journal_fill: f64,
}

/// Memory over one phase of the run: the peak (`VmHWM`, reset at the phase's start
/// through `/proc/self/clear_refs`) and, at its end, `VmRSS` and what the file system's
/// bounded structures held.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct PhaseMemory {
    pub phase: &'static str,
    pub vm_hwm: u64,
    pub vm_rss: u64,
    /// Clean pages in the metadata page cache (decoded bytes).
    pub meta_cache_bytes: usize,
    /// Dirty and frozen tree pages (page bytes).
    pub meta_pinned_bytes: usize,
    /// Decoded inodes and in-core inodes.
    pub meta_inodes: usize,
    pub incore_inodes: usize,
    /// Journal records not yet applied to the trees.
    pub queued_records: usize,
}

impl PhaseMemory {
    /// Starts a phase: resets the process's peak resident size (a no-op where the
    /// kernel does not support it: the peak is then the run's so far).
    fn start() {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }

    /// Ends a phase.
    fn end(phase: &'static str, fs: Option<&Fs>) -> PhaseMemory {
        let (vm_rss, vm_hwm) = memory();
        let mut m = PhaseMemory {
            phase,
            vm_hwm,
            vm_rss,
            ..PhaseMemory::default()
        };
        if let Some(fs) = fs {
            let st = fs.status();
            m.meta_cache_bytes = st.meta_cache.bytes;
            m.meta_pinned_bytes = st.meta_pinned_bytes;
            m.meta_inodes = st.meta_inodes;
            m.incore_inodes = st.incore_inodes;
            m.queued_records = st.journal_queued_records;
        }
        m
    }
}

/// The first lookup of a name in a directory no operation has used since mount.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct FirstLookup {
    pub entries: u64,
    pub secs: f64,
    pub pages: u64,
}

/// Everything `-w meta` measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct MetaReport {
    pub params_files: u64,
    pub dirs: u64,
    pub threads: usize,
    pub file_size: u64,
    pub targets: usize,
    pub target_size: u64,
    pub files_created: u64,
    /// Files the final lookups and unlinks ran on (all, or `--final-sample` of them).
    pub final_files: u64,
    /// The error that stopped the creates (`ENOSPC`), if any.
    pub enospc: Option<String>,
    pub steps: Vec<Step>,
    pub create_per_sec: f64,
    /// The process's CPU time (user and system, every thread: the creating threads and
    /// the checkpointer applying their records) per file created, in microseconds.
    pub create_cpu_us: f64,
    pub fsync: Quantiles,
    pub stat_per_sec: f64,
    pub readdir_entries_per_sec: f64,
    pub unlink_per_sec: f64,
    pub mount_clean: MountTime,
    /// The first lookup in a directory after the clean mount: its entries, the lookup's
    /// latency and the metadata pages it read (a directory loaded whole reads them all).
    pub first_lookup: FirstLookup,
    pub mount_crash: MountTime,
    pub ckpt_bytes_per_file: f64,
    pub vm_hwm: u64,
    /// Memory phase by phase.
    pub phases: Vec<PhaseMemory>,
    /// Each metadata tree's root level with every file created, and the tree pages.
    pub tree_levels: Vec<(String, u8)>,
    pub tree_pages: u64,
    /// (files created when it was called, latency in seconds) of every timed `fsync`.
    pub fsyncs: Vec<(u64, f64)>,
}

/// The process's CPU time so far (user and system, every thread), in seconds; NaN if it
/// cannot be read (reported as such, never as a zero cost).
pub(crate) fn cpu_secs() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a `rusage` owned by this frame.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// `VmRSS` and `VmHWM` of this process, in bytes (0 when unreadable).
pub(crate) fn memory() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|k| k.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn err(e: FsError) -> String {
    e.to_string()
}

fn name(n: u64) -> OsString {
    OsString::from(format!("f{n}"))
}

/// The files created, as one bit per file number: at 10 million files 1.2 MiB, where a
/// list of numbers took 80 MiB of the resident memory the benchmark reports.
struct FileSet {
    bits: Vec<AtomicU64>,
}

impl FileSet {
    fn new(files: u64) -> FileSet {
        FileSet {
            bits: (0..files.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn add(&self, n: u64) {
        self.bits[(n / 64) as usize].fetch_or(1 << (n % 64), Ordering::Relaxed);
    }

    fn contains(&self, n: u64) -> bool {
        self.bits
            .get((n / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (n % 64)) != 0)
    }

    fn len(&self) -> u64 {
        self.bits
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// The file numbers in the set, ascending.
    fn iter(&self) -> impl Iterator<Item = u64> + Clone + '_ {
        self.bits.iter().enumerate().flat_map(|(i, w)| {
            let mut w = w.load(Ordering::Relaxed);
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = u64::from(w.trailing_zeros());
                    w &= w - 1;
                    i as u64 * 64 + b
                })
            })
        })
    }

    /// `n` distinct members picked at random, as a set (the whole set when it has no
    /// more than `n`).
    fn subset(&self, n: u64, rng: &mut Rng) -> FileSet {
        let len = self.len();
        let out = FileSet::new(self.bits.len() as u64 * 64);
        if len <= n {
            self.iter().for_each(|f| out.add(f));
            return out;
        }
        let span = self.bits.len() as u64 * 64;
        let mut taken = 0;
        while taken < n {
            let f = rng.below(span);
            if self.contains(f) && !out.contains(f) {
                out.add(f);
                taken += 1;
            }
        }
        out
    }

    /// Up to `n` members picked at random (all of them when the set is smaller).
    fn sample(&self, n: u64, rng: &mut Rng) -> Vec<u64> {
        let len = self.len();
        if len <= n {
            return self.iter().collect();
        }
        let span = self.bits.len() as u64 * 64;
        let mut out = Vec::with_capacity(n as usize);
        while (out.len() as u64) < n {
            let f = rng.below(span);
            if self.contains(f) {
                out.push(f);
            }
        }
        out
    }
}

/// Creates the targets (sparse, not pre-zeroed: the metadata regions are written
/// before they are read) and a file system on them.
fn make_targets(dir: &Path, p: &MetaParams) -> Result<Vec<PathBuf>, String> {
    let paths: Vec<PathBuf> = (0..p.targets)
        .map(|i| dir.join(format!("meta-t{i}")))
        .collect();
    cleanup(&paths);
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|t| open_one(t, Some(p.target_size)))
        .collect::<Result<_, _>>()?;
    Fs::mkfs(&targets, &MkfsOptions::default()).map_err(err)?;
    Ok(paths)
}

/// Mounts, timing the target opens and the mount together.
fn timed_mount(
    paths: &[PathBuf],
    faults: Option<Arc<FaultInjector>>,
    checkpoints: stripefs::Checkpoints,
    inode_cache: Option<usize>,
) -> Result<(Fs, MountTime), String> {
    let t = Instant::now();
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|p| open_one(p, None))
        .collect::<Result<_, _>>()?;
    let mut opts = quiet();
    opts.faults = faults;
    opts.checkpoints = checkpoints;
    opts.inode_cache = inode_cache.map(stripefs::InodeBound);
    let (fs, report) = Fs::mount(targets, opts).map_err(err)?;
    Ok((
        fs,
        MountTime {
            secs: t.elapsed().as_secs_f64(),
            replayed_txns: report.replayed_txns,
            journal_fill: 0.0,
        },
    ))
}

/// What the create workers share.
struct Creating<'a> {
    fs: &'a Fs,
    dirs: &'a [Ino],
    threads: u64,
    data: Vec<u8>,
    stop: AtomicBool,
}

/// What one worker did in one step.
#[derive(Default)]
struct Created {
    files: u64,
    fsyncs: Vec<(u64, f64)>,
    enospc: Option<String>,
}

impl Creating<'_> {
    /// Creates this worker's files among `range`.
    fn worker(
        &self,
        th: u64,
        range: std::ops::Range<u64>,
        set: &FileSet,
    ) -> Result<Created, String> {
        let mut out = Created::default();
        let first = range.start + (th + self.threads - range.start % self.threads) % self.threads;
        for n in (first..range.end).step_by(self.threads as usize) {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            match self.one(n, &mut out) {
                Ok(()) => {
                    set.add(n);
                    out.files += 1;
                }
                Err(FsError::NoSpace(why)) => {
                    self.stop.store(true, Ordering::Relaxed);
                    out.enospc = Some(format!("file {n}: {why}"));
                    break;
                }
                Err(e) => return Err(format!("file {n}: {e}")),
            }
        }
        Ok(out)
    }

    fn one(&self, n: u64, out: &mut Created) -> Result<(), FsError> {
        let dir = self.dirs[(n % self.dirs.len() as u64) as usize];
        let a = self
            .fs
            .create(dir, &name(n), CreateParams::with_perm(0o644))?;
        let timed = n % FSYNC_EVERY == FSYNC_EVERY - 1;
        if self.data.is_empty() && !timed {
            return Ok(());
        }
        let f = self.fs.open_file(a.ino)?;
        if !self.data.is_empty() {
            f.write_at(0, &self.data)?;
        }
        if timed {
            let t = Instant::now();
            f.sync_all()?;
            out.fsyncs.push((n + 1, t.elapsed().as_secs_f64()));
        }
        Ok(())
    }
}

/// Runs `f(th)` on `threads` scoped threads and collects the results in thread order.
fn on_threads<T: Send>(
    threads: usize,
    f: impl Fn(u64) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|th| {
                let f = &f;
                s.spawn(move || f(th))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    })
}

/// Lookups of `names` (file index) on `threads` threads; returns lookups per second.
fn stat_all(
    fs: &Fs,
    dirs: &[Ino],
    files: impl Iterator<Item = u64> + Clone + Sync,
    threads: usize,
) -> Result<f64, String> {
    let t = Instant::now();
    let count = files.clone().count();
    on_threads(threads, |th| {
        for n in files.clone().skip(th as usize).step_by(threads) {
            let dir = dirs[(n % dirs.len() as u64) as usize];
            fs.lookup(dir, &name(n))
                .map_err(|e| format!("lookup f{n}: {e}"))?;
        }
        Ok(())
    })?;
    Ok(count as f64 / t.elapsed().as_secs_f64())
}

/// Times the first lookup in the first directory (right after a mount: nothing of it in
/// core), counting the metadata pages it reads.
fn first_lookup(
    fs: &Fs,
    dirs: &[Ino],
    files: impl Iterator<Item = u64> + Clone,
) -> Result<FirstLookup, String> {
    let d = dirs.len() as u64;
    let entries = files.clone().filter(|n| n % d == 0).count() as u64;
    let Some(n) = files.clone().find(|n| n % d == 0) else {
        return Ok(FirstLookup::default());
    };
    let before = fs.status().meta_cache.misses;
    let t = Instant::now();
    fs.lookup(dirs[0], &name(n))
        .map_err(|e| format!("lookup f{n}: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    Ok(FirstLookup {
        entries,
        secs,
        pages: fs.status().meta_cache.misses - before,
    })
}

/// Reads `dirs` on `threads` threads; returns entries per second.
fn readdir_all(fs: &Fs, dirs: &[Ino], threads: usize) -> Result<f64, String> {
    let t = Instant::now();
    let counts = on_threads(threads, |th| {
        let mut entries = 0;
        for &d in dirs.iter().skip(th as usize).step_by(threads) {
            entries += fs.readdir(d).map_err(err)?.len() as u64;
        }
        Ok(entries)
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / t.elapsed().as_secs_f64())
}

/// `n` items of `v` picked at random (all of them when `v` is smaller).
fn sample<T: Copy>(v: &[T], n: u64, rng: &mut Rng) -> Vec<T> {
    if v.len() as u64 <= n {
        return v.to_vec();
    }
    (0..n)
        .map(|_| v[rng.below(v.len() as u64) as usize])
        .collect()
}

/// The create steps: returns the files created.
fn create_phase(
    fs: &Fs,
    dirs: &[Ino],
    p: &MetaParams,
    r: &mut MetaReport,
) -> Result<FileSet, String> {
    let work = Creating {
        fs,
        dirs,
        threads: p.threads as u64,
        data: vec![0x5a; p.file_size as usize],
        stop: AtomicBool::new(false),
    };
    let files = FileSet::new(p.files);
    let mut created = 0u64;
    let mut rng = Rng::new(11);
    let mut create_secs = 0.0;
    let mut create_cpu = 0.0;
    let ckpt_start = fs.status().ckpt_bytes_written;
    for k in 1..=p.steps {
        let range = p.files * (k - 1) / p.steps..p.files * k / p.steps;
        let before = fs.status();
        let t = Instant::now();
        let cpu = cpu_secs();
        let done = on_threads(p.threads, |th| work.worker(th, range.clone(), &files))?;
        let secs = t.elapsed().as_secs_f64();
        let cpu = cpu_secs() - cpu;
        create_secs += secs;
        create_cpu += cpu;
        let made: u64 = done.iter().map(|c| c.files).sum();
        created += made;
        let mut lat = Vec::new();
        for c in done {
            lat.extend(c.fsyncs.iter().map(|f| f.1));
            r.fsyncs.extend(c.fsyncs);
            if r.enospc.is_none() {
                r.enospc = c.enospc;
            }
        }
        let after = fs.status();
        let sampled = files.sample(STAT_SAMPLE, &mut rng);
        let sample_dirs = sample(dirs, READDIR_SAMPLE, &mut rng);
        r.steps.push(Step {
            files: created,
            create_per_sec: made as f64 / secs,
            fsync: Quantiles::of(&lat),
            stat_per_sec: stat_all(fs, dirs, sampled.iter().copied(), 1)?,
            readdir_entries_per_sec: readdir_all(fs, &sample_dirs, 1)?,
            ckpt_bytes_per_file: (after.ckpt_bytes_written - before.ckpt_bytes_written) as f64
                / made.max(1) as f64,
            checkpoints: after.checkpoints - before.checkpoints,
            model_bytes: after.meta_page_blocks * u64::from(fs.geometry().block_size.bytes()),
            vm_rss: memory().0,
        });
        let st = &r.steps[r.steps.len() - 1];
        // Progress on stderr: long runs show where they are.
        eprintln!(
            "meta: {} files, {:.0} creates/s, {:.1} us CPU per create, fsync max {} ms, VmRSS {} MiB",
            st.files,
            st.create_per_sec,
            cpu * 1e6 / made.max(1) as f64,
            q_ms(&st.fsync, st.fsync.max),
            mib(st.vm_rss)
        );
        if r.enospc.is_some() {
            break;
        }
    }
    let all = fs.status();
    r.files_created = created;
    r.create_per_sec = created as f64 / create_secs;
    r.create_cpu_us = create_cpu * 1e6 / created.max(1) as f64;
    r.ckpt_bytes_per_file = (all.ckpt_bytes_written - ckpt_start) as f64 / created.max(1) as f64;
    let lat: Vec<f64> = r.fsyncs.iter().map(|f| f.1).collect();
    r.fsync = Quantiles::of(&lat);
    r.fsyncs.sort_by_key(|f| f.0);
    Ok(files)
}

/// Commits `chmod`s of a working set of [`CRASH_WORKING_SET`] files picked at random,
/// [`FSYNC_EVERY`] per commit, in turn, until one more commit would make the journal
/// write a checkpoint instead (it does at [`log_limit`]), then makes the next commit fail and
/// drops the poisoned file system without unmounting it. Returns the journal fill it went
/// down with.
///
/// Why a working set: the changes applied to the trees but not yet checkpointed pin
/// their pages, and past the memory bound a change writes a checkpoint first
/// (`Journal::throttle_apply`), which moves the journal's tail. `chmod`s spread over
/// every file dirty a leaf each and reach that bound with the journal under half full
/// (43% at 100,000 files), so the crash never found the full journal the goal names. A
/// working set keeps the dirty pages few while the records fill the journal: the mount
/// then replays the most records a journal holds, over pages scattered through the
/// tree. The inode numbers are looked up once, before the fill, not once per `chmod` (at
/// 10 million files 2 million lookups took most of the phase).
///
/// [`log_limit`]: stripefs_core::journal::log_limit
fn crash(fs: Fs, faults: &FaultInjector, dirs: &[Ino], files: &FileSet) -> Result<f64, String> {
    let used = |fs: &Fs| {
        let p = fs.journal_position();
        (p.head - p.tail, fs.journal_units())
    };
    let ino = |n: u64| {
        fs.lookup(dirs[(n % dirs.len() as u64) as usize], &name(n))
            .map(|a| a.ino)
            .map_err(|e| format!("lookup f{n}: {e}"))
    };
    let set: Vec<Ino> = files
        .subset(CRASH_WORKING_SET, &mut Rng::new(29))
        .iter()
        .map(ino)
        .collect::<Result<_, _>>()?;
    let (mut before, cap) = used(&fs);
    let limit = stripefs_core::journal::log_limit(cap);
    let mut i = 0u64;
    let mut cycle = set.iter().cycle();
    while !set.is_empty() && i < CRASH_MAX_CHMODS {
        for &f in cycle.by_ref().take(FSYNC_EVERY as usize) {
            let attr = SetAttr {
                // Each pass over the set changes every file's mode.
                mode: Some(if (i / set.len() as u64).is_multiple_of(2) {
                    0o600
                } else {
                    0o644
                }),
                ..SetAttr::default()
            };
            i += 1;
            match fs.setattr(f, &attr) {
                Ok(_) => {}
                Err(FsError::NoSpace(_)) => break,
                Err(e) => return Err(format!("chmod of inode {}: {e}", f.0)),
            }
        }
        fs.sync().map_err(err)?;
        let (now, _) = used(&fs);
        // The next commit of the same size would not fit below the limit.
        if now > before && now + (now - before) > limit {
            break;
        }
        before = now;
    }
    let went_down_at = used(&fs).0 as f64 / cap as f64;
    eprintln!(
        "meta: crashing with the journal {:.0}% full: the journal-write error below is injected",
        went_down_at * 100.0
    );
    faults.arm(
        PointMatch::Exact(stripefs::faults::JOURNAL_WRITE),
        1,
        FaultKind::Eio,
        Persistence::Sticky,
    );
    if let Some(&f) = set.first() {
        let set = SetAttr {
            mode: Some(0o640),
            ..SetAttr::default()
        };
        let _ = fs.setattr(f, &set);
    }
    if fs.sync().is_ok() || !fs.is_poisoned() {
        return Err("the injected journal-write fault did not take the file system down".into());
    }
    drop(fs);
    faults.disarm();
    Ok(went_down_at)
}

/// The in-core inode bound of the mount the crash phase fills: one whose apply queue
/// (a quarter of the bound) holds every record a journal of `journal_bytes` can hold of
/// the fill's (its `chmod` records encode in about 100 bytes; 32 leaves room), so no
/// change applies records and checkpoints at half the journal (`Journal::throttle_apply`)
/// before the fill reaches the limit. The bound
/// costs nothing until inodes are decoded: the fill touches a working set of
/// [`CRASH_WORKING_SET`].
fn crash_inode_bound(journal_bytes: u64) -> usize {
    usize::try_from(journal_bytes / 32 * 4).unwrap_or(usize::MAX)
}

/// Runs `-w meta`.
pub(crate) fn run(dir: &Path, p: &MetaParams, output: Output) -> Result<String, String> {
    p.check()?;
    let paths = make_targets(dir, p)?;
    let res = measure(&paths, p);
    cleanup(&paths);
    let r = res?;
    if let Some(svg) = &p.plot {
        let mut series = vec![("stripefs (in-process)".to_string(), r.fsyncs.clone())];
        for (label, f) in &p.plot_series {
            series.push((label.clone(), read_series(f)?));
        }
        std::fs::write(svg, plot(&series)).map_err(|e| format!("{}: {e}", svg.display()))?;
    }
    if output == Output::Table {
        print!("{}", table(&r));
    }
    Ok(to_json(&r))
}

/// Runs `-w plot`: draws `--plot` from the `--plot-series` files only.
pub(crate) fn plot_only(p: &MetaParams) -> Result<String, String> {
    let Some(svg) = &p.plot else {
        return Err("-w plot needs --plot FILE.svg".into());
    };
    if p.plot_series.is_empty() {
        return Err("-w plot needs at least one --plot-series LABEL=FILE".into());
    }
    let series = p
        .plot_series
        .iter()
        .map(|(label, f)| Ok((label.clone(), read_series(f)?)))
        .collect::<Result<Vec<_>, String>>()?;
    std::fs::write(svg, plot(&series)).map_err(|e| format!("{}: {e}", svg.display()))?;
    Ok(format!(
        "{{\"workload\":\"plot\",\"svg\":{}}}",
        json_str(&svg.display().to_string())
    ))
}

fn measure(paths: &[PathBuf], p: &MetaParams) -> Result<MetaReport, String> {
    let mut r = MetaReport {
        params_files: p.files,
        dirs: p.dirs,
        threads: p.threads,
        file_size: p.file_size,
        targets: p.targets,
        target_size: p.target_size,
        ..MetaReport::default()
    };
    let faults = Arc::new(FaultInjector::new());
    PhaseMemory::start();
    let (fs, _) = timed_mount(
        paths,
        Some(Arc::clone(&faults)),
        p.checkpoints,
        p.inode_cache,
    )?;
    let dirs: Vec<Ino> = (0..p.dirs)
        .map(|d| {
            fs.mkdir(
                Ino::ROOT,
                format!("d{d}").as_ref(),
                CreateParams::with_perm(0o755),
            )
            .map(|a| a.ino)
        })
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let files = create_phase(&fs, &dirs, p, &mut r)?;
    r.phases.push(PhaseMemory::end("create", Some(&fs)));
    let st = fs.status();
    r.tree_levels = st
        .meta_tree_levels
        .iter()
        .map(|(t, l)| (t.to_string(), *l))
        .collect();
    r.tree_pages = st.meta_page_blocks;
    // On stderr at once: a run stopped before its end still shows the shape at N.
    eprintln!(
        "meta: created {} files; tree root levels {:?}, {} tree pages; {:?}",
        r.files_created, r.tree_levels, r.tree_pages, r.phases[0]
    );
    PhaseMemory::start();
    fs.unmount().map_err(err)?;
    drop(fs);
    let (fs, clean) = timed_mount(
        paths,
        Some(Arc::clone(&faults)),
        p.checkpoints,
        p.inode_cache,
    )?;
    r.mount_clean = clean;
    r.phases.push(PhaseMemory::end("unmount, mount", Some(&fs)));
    r.first_lookup = first_lookup(&fs, &dirs, files.iter())?;
    // The final lookups and unlinks: every file, or a sample of them.
    let last = files.subset(p.final_sample.unwrap_or(u64::MAX), &mut Rng::new(13));
    r.final_files = last.len();
    PhaseMemory::start();
    r.stat_per_sec = stat_all(&fs, &dirs, last.iter(), p.threads)?;
    r.readdir_entries_per_sec = readdir_all(&fs, &dirs, p.threads)?;
    r.phases.push(PhaseMemory::end("stat, readdir", Some(&fs)));
    PhaseMemory::start();
    // The crash phase fills the journal with no checkpointer running and an apply queue
    // long enough for the whole journal, so what the crash leaves is a full journal
    // whatever `--checkpoint` says (see the module doc).
    let queue_room = crash_inode_bound(fs.journal_bytes());
    fs.unmount().map_err(err)?;
    drop(fs);
    let (fs, _) = timed_mount(
        paths,
        Some(Arc::clone(&faults)),
        stripefs::Checkpoints::Inline,
        Some(queue_room),
    )?;
    let fill = crash(fs, &faults, &dirs, &files)?;
    r.phases.push(PhaseMemory::end(CRASH_FILL_PHASE, None));
    PhaseMemory::start();
    let (fs, mut crashed) = timed_mount(paths, None, p.checkpoints, p.inode_cache)?;
    crashed.journal_fill = fill;
    r.mount_crash = crashed;
    r.phases.push(PhaseMemory::end("crash mount", Some(&fs)));
    PhaseMemory::start();
    let t = Instant::now();
    on_threads(p.threads, |th| {
        for n in last.iter().skip(th as usize).step_by(p.threads) {
            let dir = dirs[(n % dirs.len() as u64) as usize];
            fs.unlink(dir, &name(n))
                .map_err(|e| format!("unlink f{n}: {e}"))?;
        }
        Ok(())
    })?;
    r.unlink_per_sec = r.final_files as f64 / t.elapsed().as_secs_f64();
    r.phases.push(PhaseMemory::end("unlink", Some(&fs)));
    PhaseMemory::start();
    fs.unmount().map_err(err)?;
    r.phases.push(PhaseMemory::end("unmount", None));
    // Each phase's peak was reset at its start: the run's peak is the largest, but for
    // the crash fill's, whose apply queue holds a whole journal's records (about 100
    // bytes each decoded), a state the mounted file system's bound never lets it reach;
    // the phase table reports it.
    r.vm_hwm = r
        .phases
        .iter()
        .filter(|m| m.phase != CRASH_FILL_PHASE)
        .map(|m| m.vm_hwm)
        .max()
        .unwrap_or(0);
    Ok(r)
}

/// Reads a plot series: lines of `files_created latency_seconds` (space or comma).
fn read_series(f: &Path) -> Result<Vec<(u64, f64)>, String> {
    let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|(i, l)| {
            let mut it = l
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty());
            let n = it.next().and_then(|s| s.parse::<u64>().ok());
            let v = it.next().and_then(|s| s.parse::<f64>().ok());
            match (n, v) {
                (Some(n), Some(v)) if v.is_finite() && v >= 0.0 => Ok((n, v)),
                _ => Err(format!(
                    "{}:{}: expected `files_created latency_seconds`",
                    f.display(),
                    i + 1
                )),
            }
        })
        .collect()
}

const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// An SVG scatter plot of `fsync` latency (ms) against files created, one colour per
/// series. Written by hand: a chart crate would be the only dependency for 80 lines.
pub(crate) fn plot(series: &[(String, Vec<(u64, f64)>)]) -> String {
    let (w, h, l, r, t, b) = (900.0, 500.0, 80.0, 20.0, 40.0, 60.0);
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1 * 1e3))
        .fold(0.0, f64::max)
        .max(0.001)
        * 1.05;
    let x = |v: f64| l + v / xmax * (w - l - r);
    let y = |v: f64| h - b - v / ymax * (h - t - b);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">fsync latency of a new file every {FSYNC_EVERY} creates</text>",
        w / 2.0
    );
    for i in 0..=5 {
        let (xv, yv) = (xmax * f64::from(i) / 5.0, ymax * f64::from(i) / 5.0);
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{0}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{yv:.1}</text>",
            w - r,
            y(yv),
            l - 6.0,
            y(yv) + 4.0
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(xv),
            h - b + 18.0,
            xv.round()
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" x2=\"{l}\" y1=\"{t}\" y2=\"{0}\" stroke=\"black\"/><line x1=\"{l}\" x2=\"{1}\" y1=\"{0}\" y2=\"{0}\" stroke=\"black\"/>",
        h - b,
        w - r
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">files created</text><text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">fsync latency (ms)</text>",
        (l + w - r) / 2.0,
        h - 15.0,
        (t + h - b) / 2.0
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        for &(n, v) in pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{c}\"/>",
                x(n as f64),
                y(v * 1e3)
            );
        }
        let ly = t + 16.0 * i as f64 + 8.0;
        let _ = writeln!(
            s,
            "<circle cx=\"{}\" cy=\"{ly}\" r=\"4\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            l + 20.0,
            l + 30.0,
            ly + 4.0,
            xml_escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(v: f64) -> String {
    format!("{:.2}", v * 1e3)
}

/// A quantile in ms, or `-` when there were no `fsync`s.
fn q_ms(q: &Quantiles, v: f64) -> String {
    if q.count == 0 {
        "-".into()
    } else {
        ms(v)
    }
}

fn mib(v: u64) -> String {
    format!("{:.0}", v as f64 / f64::from(1 << 20))
}

/// The human-readable report.
pub(crate) fn table(r: &MetaReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nmeta: {} threads create {} files of {} bytes over {} directories ({} x {} MiB targets, unzeroed), an fsync of a new file every {FSYNC_EVERY} creates",
        r.threads, r.params_files, r.file_size, r.dirs, r.targets, r.target_size >> 20
    );
    // Blank lines around the table: it pastes into Markdown as it is.
    s.push('\n');
    let _ = writeln!(s, "| files | creates/s | fsync p50 ms | fsync p99 ms | fsync max ms | stat/s (sample) | readdir entries/s (sample) | checkpoint bytes/file | checkpoints | metadata page bytes | VmRSS MiB |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for st in &r.steps {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            st.files,
            st.create_per_sec,
            q_ms(&st.fsync, st.fsync.p50),
            q_ms(&st.fsync, st.fsync.p99),
            q_ms(&st.fsync, st.fsync.max),
            st.stat_per_sec,
            st.readdir_entries_per_sec,
            st.ckpt_bytes_per_file,
            st.checkpoints,
            st.model_bytes,
            mib(st.vm_rss)
        );
    }
    s.push('\n');
    if let Some(e) = &r.enospc {
        let _ = writeln!(s, "ENOSPC after {} files: {e}", r.files_created);
    }
    let sampled = if r.final_files < r.files_created {
        format!(" (of {} files picked at random)", r.final_files)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "at {} files: creates/s {:.0} ({:.1} us CPU per create), fsync p50/p99/max {}/{}/{} ms, stat/s {:.0}{}, readdir entries/s {:.0}, unlink/s {:.0}{}, checkpoint bytes per file created {:.0}",
        r.files_created,
        r.create_per_sec,
        r.create_cpu_us,
        ms(r.fsync.p50),
        ms(r.fsync.p99),
        ms(r.fsync.max),
        r.stat_per_sec,
        sampled,
        r.readdir_entries_per_sec,
        r.unlink_per_sec,
        sampled,
        r.ckpt_bytes_per_file
    );
    let _ = writeln!(
        s,
        "mount: {} ms after a clean unmount; {} ms after a crash with the journal {:.0}% full ({} transactions replayed); VmHWM {} MiB",
        ms(r.mount_clean.secs),
        ms(r.mount_crash.secs),
        r.mount_crash.journal_fill * 100.0,
        r.mount_crash.replayed_txns,
        mib(r.vm_hwm)
    );
    let levels: Vec<String> = r
        .tree_levels
        .iter()
        .map(|(t, l)| format!("{t} {l}"))
        .collect();
    let _ = writeln!(
        s,
        "first lookup in a directory of {} entries after the clean mount: {:.3} ms, {} metadata pages read",
        r.first_lookup.entries,
        r.first_lookup.secs * 1e3,
        r.first_lookup.pages
    );
    let _ = writeln!(
        s,
        "tree root levels at {} files: {}; {} tree pages",
        r.files_created,
        levels.join(", "),
        r.tree_pages
    );
    s.push('\n');
    let _ = writeln!(s, "| phase | VmHWM MiB | VmRSS at end MiB | page cache MiB | pinned pages MiB | decoded inodes | in-core inodes | queued records |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for m in &r.phases {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            m.phase,
            mib(m.vm_hwm),
            mib(m.vm_rss),
            mib(m.meta_cache_bytes as u64),
            mib(m.meta_pinned_bytes as u64),
            m.meta_inodes,
            m.incore_inodes,
            m.queued_records
        );
    }
    s
}

fn json_f(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "null".into()
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_q(q: &Quantiles) -> String {
    format!(
        "{{\"count\":{},\"p50_s\":{},\"p99_s\":{},\"max_s\":{}}}",
        q.count,
        json_f(q.p50),
        json_f(q.p99),
        json_f(q.max)
    )
}

fn json_mount(m: &MountTime) -> String {
    format!(
        "{{\"secs\":{},\"replayed_txns\":{},\"journal_fill\":{}}}",
        json_f(m.secs),
        m.replayed_txns,
        json_f(m.journal_fill)
    )
}

fn json_phase(m: &PhaseMemory) -> String {
    format!(
        "{{\"phase\":{},\"vm_hwm_bytes\":{},\"vm_rss_bytes\":{},\"meta_cache_bytes\":{},\"meta_pinned_bytes\":{},\"meta_inodes\":{},\"incore_inodes\":{},\"queued_records\":{}}}",
        json_str(m.phase),
        m.vm_hwm,
        m.vm_rss,
        m.meta_cache_bytes,
        m.meta_pinned_bytes,
        m.meta_inodes,
        m.incore_inodes,
        m.queued_records
    )
}

/// The JSON report (one object; `fsyncs` are `[files_created, seconds]` pairs).
pub(crate) fn to_json(r: &MetaReport) -> String {
    let steps: Vec<String> = r
        .steps
        .iter()
        .map(|s| {
            format!(
                "{{\"files\":{},\"create_per_sec\":{},\"fsync\":{},\"stat_per_sec\":{},\"readdir_entries_per_sec\":{},\"ckpt_bytes_per_file\":{},\"checkpoints\":{},\"model_bytes\":{},\"vm_rss_bytes\":{}}}",
                s.files,
                json_f(s.create_per_sec),
                json_q(&s.fsync),
                json_f(s.stat_per_sec),
                json_f(s.readdir_entries_per_sec),
                json_f(s.ckpt_bytes_per_file),
                s.checkpoints,
                s.model_bytes,
                s.vm_rss
            )
        })
        .collect();
    let phases: Vec<String> = r.phases.iter().map(json_phase).collect();
    let levels: Vec<String> = r
        .tree_levels
        .iter()
        .map(|(t, l)| format!("[{},{l}]", json_str(t)))
        .collect();
    let fsyncs: Vec<String> = r
        .fsyncs
        .iter()
        .map(|(n, v)| format!("[{n},{}]", json_f(*v)))
        .collect();
    format!(
        "{{\"workload\":\"meta\",\"files\":{},\"dirs\":{},\"threads\":{},\"file_size\":{},\"targets\":{},\"target_size\":{},\"files_created\":{},\"final_files\":{},\"enospc\":{},\"create_per_sec\":{},\"create_cpu_us\":{},\"fsync\":{},\"stat_per_sec\":{},\"readdir_entries_per_sec\":{},\"unlink_per_sec\":{},\"mount_clean\":{},\"mount_crash\":{},\"ckpt_bytes_per_file\":{},\"vm_hwm_bytes\":{},\"tree_levels\":[{}],\"tree_pages\":{},\"phases\":[{}],\"steps\":[{}],\"fsyncs\":[{}]}}",
        r.params_files,
        r.dirs,
        r.threads,
        r.file_size,
        r.targets,
        r.target_size,
        r.files_created,
        r.final_files,
        r.enospc.as_deref().map_or_else(|| "null".into(), json_str),
        json_f(r.create_per_sec),
        json_f(r.create_cpu_us),
        json_q(&r.fsync),
        json_f(r.stat_per_sec),
        json_f(r.readdir_entries_per_sec),
        json_f(r.unlink_per_sec),
        json_mount(&r.mount_clean),
        json_mount(&r.mount_crash),
        json_f(r.ckpt_bytes_per_file),
        r.vm_hwm,
        levels.join(","),
        r.tree_pages,
        phases.join(","),
        steps.join(","),
        fsyncs.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let lat: Vec<f64> = (1..=200).map(f64::from).collect();
        let q = Quantiles::of(&lat);
        assert_eq!((q.count, q.p50, q.p99, q.max), (200, 101.0, 198.0, 200.0));
        assert_eq!(Quantiles::of(&[]), Quantiles::default());
    }

    fn report() -> MetaReport {
        let q = Quantiles {
            count: 2,
            p50: 0.001,
            p99: 0.002,
            max: 0.003,
        };
        MetaReport {
            params_files: 2000,
            dirs: 10,
            threads: 2,
            file_size: 0,
            targets: 4,
            target_size: 1 << 30,
            files_created: 1500,
            final_files: 1500,
            enospc: Some("file 1500: \"full\"".into()),
            steps: vec![Step {
                files: 1500,
                create_per_sec: 1000.0,
                fsync: q,
                stat_per_sec: 2.5,
                readdir_entries_per_sec: 3.0,
                ckpt_bytes_per_file: 4.0,
                checkpoints: 1,
                model_bytes: 5,
                vm_rss: 6,
            }],
            create_per_sec: 1000.0,
            create_cpu_us: 19.5,
            fsync: q,
            stat_per_sec: 7.0,
            readdir_entries_per_sec: 8.0,
            unlink_per_sec: f64::INFINITY,
            mount_clean: MountTime {
                secs: 0.5,
                replayed_txns: 0,
                journal_fill: 0.0,
            },
            first_lookup: FirstLookup::default(),
            mount_crash: MountTime {
                secs: 1.5,
                replayed_txns: 6,
                journal_fill: 0.68,
            },
            ckpt_bytes_per_file: 9.0,
            vm_hwm: 10,
            phases: vec![PhaseMemory {
                phase: "create",
                vm_hwm: 11,
                vm_rss: 12,
                meta_cache_bytes: 13,
                meta_pinned_bytes: 14,
                meta_inodes: 15,
                incore_inodes: 16,
                queued_records: 17,
            }],
            tree_levels: vec![("fs".into(), 3), ("space".into(), 0)],
            tree_pages: 18,
            fsyncs: vec![(1000, 0.001), (2000, 0.003)],
        }
    }

    #[test]
    fn json_shape() {
        let j = to_json(&report());
        assert_eq!(
            j,
            "{\"workload\":\"meta\",\"files\":2000,\"dirs\":10,\"threads\":2,\"file_size\":0,\
             \"targets\":4,\"target_size\":1073741824,\"files_created\":1500,\"final_files\":1500,\
             \"enospc\":\"file 1500: \\\"full\\\"\",\"create_per_sec\":1000.000000,\"create_cpu_us\":19.500000,\
             \"fsync\":{\"count\":2,\"p50_s\":0.001000,\"p99_s\":0.002000,\"max_s\":0.003000},\
             \"stat_per_sec\":7.000000,\"readdir_entries_per_sec\":8.000000,\"unlink_per_sec\":null,\
             \"mount_clean\":{\"secs\":0.500000,\"replayed_txns\":0,\"journal_fill\":0.000000},\
             \"mount_crash\":{\"secs\":1.500000,\"replayed_txns\":6,\"journal_fill\":0.680000},\
             \"ckpt_bytes_per_file\":9.000000,\"vm_hwm_bytes\":10,\
             \"tree_levels\":[[\"fs\",3],[\"space\",0]],\"tree_pages\":18,\
             \"phases\":[{\"phase\":\"create\",\"vm_hwm_bytes\":11,\"vm_rss_bytes\":12,\
             \"meta_cache_bytes\":13,\"meta_pinned_bytes\":14,\"meta_inodes\":15,\
             \"incore_inodes\":16,\"queued_records\":17}],\
             \"steps\":[{\"files\":1500,\"create_per_sec\":1000.000000,\
             \"fsync\":{\"count\":2,\"p50_s\":0.001000,\"p99_s\":0.002000,\"max_s\":0.003000},\
             \"stat_per_sec\":2.500000,\"readdir_entries_per_sec\":3.000000,\
             \"ckpt_bytes_per_file\":4.000000,\"checkpoints\":1,\"model_bytes\":5,\"vm_rss_bytes\":6}],\
             \"fsyncs\":[[1000,0.001000],[2000,0.003000]]}"
        );
        let mut r = report();
        r.enospc = None;
        assert!(to_json(&r).contains("\"enospc\":null"));
        let t = table(&report());
        assert!(t.contains("ENOSPC after 1500 files"), "{t}");
        assert!(t.contains("(6 transactions replayed)"), "{t}");
        assert!(
            t.contains("tree root levels at 1500 files: fs 3, space 0; 18 tree pages"),
            "{t}"
        );
        assert!(
            t.contains("| create | 0 | 0 | 0 | 0 | 15 | 16 | 17 |"),
            "{t}"
        );
    }

    #[test]
    fn file_set() {
        let set = FileSet::new(200);
        for n in [0, 63, 64, 130, 199] {
            set.add(n);
        }
        assert_eq!(set.len(), 5);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 63, 64, 130, 199]);
        assert!(set.contains(130) && !set.contains(131) && !set.contains(1000));
        let mut rng = Rng::new(1);
        assert_eq!(set.sample(10, &mut rng).len(), 5, "all of a small set");
        let s = set.sample(3, &mut rng);
        assert!(s.len() == 3 && s.iter().all(|&n| set.contains(n)), "{s:?}");
        let sub = set.subset(4, &mut rng);
        assert_eq!(sub.len(), 4, "distinct members");
        assert!(sub.iter().all(|n| set.contains(n)));
        assert_eq!(
            set.subset(u64::MAX, &mut rng).iter().collect::<Vec<_>>(),
            vec![0, 63, 64, 130, 199]
        );
    }

    #[test]
    fn plot_and_series() {
        let d = std::env::temp_dir().join(format!("stripefs-meta-plot-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("xfs.txt");
        std::fs::write(&f, "# files seconds\n1000 0.002\n2000,0.004\n").unwrap();
        let xfs = read_series(&f).unwrap();
        assert_eq!(xfs, vec![(1000, 0.002), (2000, 0.004)]);
        std::fs::write(&f, "1000 fast\n").unwrap();
        let e = read_series(&f).unwrap_err();
        assert!(e.contains(":1: expected"), "{e}");
        let svg = plot(&[("a<b".into(), vec![(1000, 0.001)]), ("xfs".into(), xfs)]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches("<circle").count(),
            3 + 2,
            "points and legend marks"
        );
        assert!(svg.contains("a&lt;b"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

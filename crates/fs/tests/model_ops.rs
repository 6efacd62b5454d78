//! Model-based test: seeded random namespace and data operations over several files,
//! every read compared byte for byte with an in-memory model (fsx-style). Buffered and
//! direct reads and writes mix on the same files (fsx `-Z`), with truncate, fallocate
//! (allocate, keep-size, punch, zero), SEEK_DATA/SEEK_HOLE, links, renames, unlinks of
//! open files and remounts. Configurations: stripe counts {1, 3, 8} x block sizes
//! {1 KiB, 4 KiB, 64 KiB}, and stripe counts {1, 3, 8} x folio sizes {4 KiB, 2 MiB} (64
//! KiB is the default of the first group); plus an EOF-pollution mode (fsx `-e 1`:
//! garbage is written into the cache past EOF before every size-changing operation) and
//! a mode that routes every zero range through the cache; reads completing late
//! (asynchronous readahead in flight), and writes reaching the device late while the
//! background flusher runs (writes into folios whose memory a write in flight holds).
//! After every operation the space books of every target must balance
//! (`Fs::check_space_accounting`; with the flusher running, after every remount). Attribute
//! flags (`FS_NOCOW_FL`) are set and cleared on files and both directories, mounts
//! alternate `datacow=off` and `on`, and every file's flag is compared with the model's
//! (btrfs's rules: inherited from the directory, changed only on empty files). Some
//! configurations add targets while mounted, and evacuate targets (`Fs::evacuate`):
//! an evacuated target holds nothing while it stays read-only. On a mismatch the seed
//! and the tail of the operation log are printed.
mod common;
#[path = "nbdkit/mod.rs"]
mod nbdkit;

use std::collections::{BTreeMap, HashMap};

use common::*;
use stripefs::{
    CreateParams, DataCow, FallocMode, File, FileFlags, Fs, FsError, Ino, MkfsOptions,
    MountOptions, RenameMode, Whence,
};
use stripefs_target::{Rng, Target};

const TARGETS: usize = 8;
const TARGET_BYTES: u64 = 24 << 20;
const MAX_FILE: u64 = 1 << 20;

/// A test configuration.
#[derive(Debug, Clone, Copy)]
struct Cfg {
    stripe_count: u32,
    block_size: u32,
    folio_bytes: u32,
    /// fsx `-e 1`: pollute the cache past EOF before size-changing operations.
    pollute: bool,
    /// Route every zero range through the cache zeroing path.
    force_zero: bool,
    /// Whole-folio dirty tracking (the pre-6.6 switch).
    folio_tracking: bool,
    /// Every folio `folio_bytes` (`folio_sizing = fixed`) instead of sized by the file.
    fixed_folios: bool,
    /// Reads complete on a thread of their own, later ([`LateReads`]): readahead left in
    /// flight meets the operations that follow it.
    late_reads: bool,
    /// Multi-file writeback constantly: half the syncs are `Fs::sync` (every dirty file,
    /// in groups), under a tiny cache and dirty limit (so writers are throttled and clean
    /// folios evicted all the time).
    group_sync: bool,
    /// Writes reach the device later, from a thread of their own ([`LateWrites`]), while
    /// the background flusher runs with a small dirty limit: writes and zeroing meet
    /// folios whose memory a write in flight holds (copy on write, stable pages).
    late_writes: bool,
    /// In-core inode bound (`-o inode_cache`), with half the syncs checkpoints that apply
    /// the journal to the trees: inodes leave core and are read back all the time.
    inodes: Option<usize>,
    /// Both directories hold [`BIG_DIR`] more entries (FIFOs named `z...`, left out of
    /// the comparison), under the smallest metadata cache: every name is looked up in the
    /// trees through pages evicted and read back, beside the overlay of unapplied changes.
    /// The space books are checked at remounts, not after every operation.
    big_dirs: bool,
    /// Seed 001's audit (`-o nocow_audit`): before every operation the blocks shared or
    /// checksummed are read from the indexes, and after it every in-place decision the
    /// operation made must have avoided them; clones are four times as frequent.
    nocow_audit: bool,
    /// `-o nocow_check`.
    nocow_check: stripefs::NocowCheck,
    /// This many of the targets are left out of mkfs and added while mounted
    /// (`Fs::add_target`, issue 13), at random moments between operations; the oracle
    /// (file contents) does not change, the books and fsck must stay balanced.
    add_targets: u32,
    /// Targets other than 0 are evacuated while mounted (issue 13, `Fs::evacuate`), at
    /// random moments between operations: begun, some operations later (or at once)
    /// completed, kept read-only a while (nothing of any file may land there again),
    /// then given back (`Fs::evacuate_cancel`), or given back before completing.
    evacuate: bool,
}

/// With [`Cfg::evacuate`], one operation in this many begins an evacuation (rare: each
/// one writes everything back and checkpoints).
const EVACUATE_ONE_IN: u64 = 150;

/// Targets a run may retire: the others keep room for the files.
const MAX_RETIRED: u32 = 2;

/// Where the run's evacuation stands (persisted: it survives a remount).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evac {
    Idle,
    /// Begun (`Fs::evacuate_begin`): read-only, files still with blocks there.
    Begun(u32),
    /// `Fs::evacuate` returned: read-only and empty.
    Done(u32),
}

impl Evac {
    /// The target read-only now, if any.
    fn read_only(self) -> Option<u32> {
        match self {
            Evac::Idle => None,
            Evac::Begun(t) | Evac::Done(t) => Some(t),
        }
    }
}

/// Filler entries per directory with `big_dirs`.
const BIG_DIR: u64 = 1000;

/// Carries out writes (not FUA writes) on one thread per target, in submission order,
/// after a delay: the device reads a write's buffers only then, as an NBD client sends
/// them after submission, so bytes changed under a write in flight would reach the disk.
#[derive(Debug)]
struct LateWrites {
    inner: std::sync::Arc<stripefs_target::SimTarget>,
    tx: std::sync::Mutex<
        std::sync::mpsc::Sender<(stripefs_target::IoOp, stripefs_target::Completion)>,
    >,
}

impl LateWrites {
    fn new(inner: std::sync::Arc<stripefs_target::SimTarget>) -> Self {
        let (tx, rx) =
            std::sync::mpsc::channel::<(stripefs_target::IoOp, stripefs_target::Completion)>();
        let dev = std::sync::Arc::clone(&inner);
        std::thread::spawn(move || {
            for (op, done) in rx {
                std::thread::sleep(std::time::Duration::from_micros(300));
                dev.submit(op, done);
            }
        });
        Self {
            inner,
            tx: std::sync::Mutex::new(tx),
        }
    }
}

impl Target for LateWrites {
    fn info(&self) -> &stripefs_target::TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: stripefs_target::IoOp, done: stripefs_target::Completion) {
        if !matches!(op, stripefs_target::IoOp::Write { .. }) {
            return self.inner.submit(op, done);
        }
        let tx = self.tx.lock().expect("sender").clone();
        tx.send((op, done)).expect("writer runs");
    }
}

/// Completes reads on one thread per target, in submission order, after the submitter
/// has gone on (the simulated target completes inline, so without this an asynchronous
/// readahead would have completed before its read returned).
#[derive(Debug)]
struct LateReads {
    inner: std::sync::Arc<stripefs_target::SimTarget>,
    tx: std::sync::Mutex<
        std::sync::mpsc::Sender<(stripefs_target::Completion, stripefs_target::IoDone)>,
    >,
}

impl LateReads {
    fn new(inner: std::sync::Arc<stripefs_target::SimTarget>) -> Self {
        let (tx, rx) =
            std::sync::mpsc::channel::<(stripefs_target::Completion, stripefs_target::IoDone)>();
        std::thread::spawn(move || {
            for (done, d) in rx {
                std::thread::sleep(std::time::Duration::from_micros(200));
                done(d);
            }
        });
        Self {
            inner,
            tx: std::sync::Mutex::new(tx),
        }
    }
}

impl Target for LateReads {
    fn info(&self) -> &stripefs_target::TargetInfo {
        self.inner.info()
    }
    fn submit(&self, op: stripefs_target::IoOp, done: stripefs_target::Completion) {
        if !matches!(op, stripefs_target::IoOp::Read { .. }) {
            return self.inner.submit(op, done);
        }
        let tx = self.tx.lock().expect("sender").clone();
        self.inner.submit(
            op,
            Box::new(move |d| tx.send((done, d)).expect("completer runs")),
        );
    }
}

impl Cfg {
    fn mount_options(&self) -> MountOptions {
        let mut o = quiet();
        o.cache.folio_bytes = self.folio_bytes;
        o.force_zero_via_cache = self.force_zero;
        if self.folio_tracking {
            o.cache.dirty_tracking = stripefs_iomap::folio::DirtyTracking::Folio;
        }
        if self.fixed_folios {
            o.cache.folio_sizing = stripefs_iomap::cache::FolioSizing::Fixed;
        }
        if self.group_sync {
            o.cache.dirty_limit_bytes = u64::from(self.folio_bytes).max(256 << 10);
            o.cache.budget_bytes = 4 * o.cache.dirty_limit_bytes;
        }
        if let Some(n) = self.inodes {
            o.inode_cache = Some(stripefs::InodeBound(n));
        }
        if self.big_dirs {
            o.meta_cache = stripefs::MetaCacheBytes(stripefs::MetaCacheBytes::MIN_PAGES * 4096);
        }
        o.nocow_audit = self.nocow_audit;
        o.nocow_check = self.nocow_check;
        if self.late_writes {
            // The flusher writes back whenever a quarter of a MiB is dirty.
            o.writeback_interval = Some(std::time::Duration::from_millis(1));
            o.cache.dirty_limit_bytes = 512 << 10;
        }
        o
    }
}

struct Model {
    /// (dir index, name) -> file id.
    names: BTreeMap<(usize, String), u32>,
    data: HashMap<u32, Vec<u8>>,
    next_id: u32,
    /// File id -> its NOCOW flag.
    nocow: HashMap<u32, bool>,
    /// The two directories' NOCOW flags.
    dir_nocow: [bool; 2],
    /// The current mount's `datacow` (alternates at each remount).
    datacow: DataCow,
}

struct Sut {
    fs: Fs,
    dirs: [Ino; 2],
    inos: HashMap<u32, Ino>,
    handles: Vec<(u32, File)>,
}

struct Run {
    c: Cfg,
    rng: Rng,
    log: Vec<String>,
    seed: u64,
    model: Model,
    sut: Sut,
    targets: Vec<std::sync::Arc<dyn Target>>,
    ops: u64,
    /// File and end of the last read: half the reads go on from there (a sequential
    /// stream, so readahead runs, asynchronously by default).
    last_read: Option<(u32, u64)>,
    /// Bytes asynchronous readahead submitted, over every mount of the run.
    readahead_async_bytes: u64,
    /// Bytes device reads installed as whole folios' memory (`read_copy = swap`), over
    /// every mount of the run.
    read_swapped_bytes: u64,
    /// Multi-file writeback groups and the files in them, over every mount of the run.
    wb_groups: u64,
    wb_group_files: u64,
    /// Writes into folios whose memory a write in flight held, over every mount.
    lent_rewrites: u64,
    /// Inodes read back from the trees after eviction, over every mount.
    meta_inode_loads: u64,
    /// With `nocow_audit`: the blocks shared or checksummed before the running
    /// operation; in-place decisions audited and copy decisions, over every mount.
    forbidden: BTreeMap<(u32, u64), &'static str>,
    audited_in_place: u64,
    nocow_cow: u64,
    /// Targets not yet added (`Cfg::add_targets`), and how many were.
    spare: Vec<std::sync::Arc<dyn Target>>,
    added: u32,
    /// With `Cfg::evacuate`: the evacuation's state, evacuations completed, and writes
    /// copied because their target was read-only (over every mount).
    evac: Evac,
    evacuations: u64,
    read_only_copies: u64,
    /// Targets retired after their evacuation (at most [`MAX_RETIRED`] per run).
    retired: u32,
}

impl Run {
    fn fail(&self, what: &str) -> ! {
        let start = self.log.len().saturating_sub(40);
        let tail: Vec<String> = self.log[start..].iter().map(|s| format!("  {s}")).collect();
        panic!(
            "model mismatch ({:?}, seed {}): {what}\nlast ops:\n{}",
            self.c,
            self.seed,
            tail.join("\n")
        );
    }

    fn pick_name(&mut self) -> (usize, String) {
        (
            self.rng.below(2) as usize,
            format!("f{}", self.rng.below(6)),
        )
    }

    fn existing(&mut self) -> Option<((usize, String), u32)> {
        if self.model.names.is_empty() {
            return None;
        }
        let i = self.rng.below(self.model.names.len() as u64) as usize;
        self.model.names.iter().nth(i).map(|(k, v)| (k.clone(), *v))
    }

    fn step(&mut self) {
        self.ops += 1;
        // Only configurations with spare targets draw for it: the others' sequences
        // stay as they were.
        if !self.spare.is_empty() && self.rng.one_in(300) {
            self.op_add_target();
        }
        if self.c.evacuate && self.evacuation_step() && self.c.nocow_audit {
            let log = self.sut.fs.take_in_place_log();
            self.audit_in_place(&log);
        }
        if self.c.nocow_audit {
            self.forbidden = match self.sut.fs.shared_or_checksummed() {
                Ok(f) => f,
                Err(e) => self.fail(&format!("indexes: {e}")),
            };
            if self.rng.one_in(8) {
                self.op_clone();
                let log = self.sut.fs.take_in_place_log();
                self.audit_in_place(&log);
                return;
            }
        }
        match self.rng.below(100) {
            0..=21 => self.op_write(),
            22..=24 => self.op_clone(),
            25..=36 => self.op_read(),
            37..=41 => self.op_create(),
            42..=47 => self.op_truncate(),
            48..=51 => self.op_sync(),
            52..=57 => self.op_rename(),
            58..=61 => self.op_unlink(),
            62..=63 => self.op_link(),
            98 => self.op_flags(),
            64..=67 => self.op_falloc(),
            68..=71 => self.op_punch_or_zero(),
            72..=75 => self.op_seek(),
            76..=78 => self.op_open_handle(),
            79..=80 => self.op_close_handle(),
            81..=82 => self.op_remount(),
            83..=96 => self.op_direct(),
            97 => self.op_clone(),
            _ => self.verify_all(),
        }
        if self.c.nocow_audit {
            let log = self.sut.fs.take_in_place_log();
            self.audit_in_place(&log);
        }
        self.check_sizes();
        // With the flusher running, writeback may hold allocations not yet recorded: the
        // books balance only at rest, right after a (re)mount. With big directories the
        // books (a walk of every inode through the smallest cache) are checked at each
        // remount only.
        if !self.c.late_writes && !self.c.big_dirs {
            self.check_space();
        }
        self.check_evacuated();
    }

    /// Seed 001 (I-001-1): every in-place decision of the operation passed the file
    /// system's own look at the indexes under the lock it was acted on under (its audit),
    /// and, after an operation that changes no count before it writes (writes, reads,
    /// syncs), landed on no block shared or checksummed before the operation.
    fn audit_in_place(&mut self, log: &[stripefs::InPlace]) {
        let last = self.log.last().map_or("", String::as_str);
        let counts_fixed = [
            "write ",
            "dwrite ",
            "read ",
            "dread ",
            "fsync ",
            "fdatasync ",
        ]
        .iter()
        .any(|p| last.starts_with(p));
        for d in log {
            self.audited_in_place += 1;
            if let Some(v) = &d.violation {
                self.fail(&format!(
                    "in-place write of target {} blocks {}..+{}: {v}",
                    d.target, d.phys, d.blocks
                ));
            }
            // I-001-3: no write is admitted in place on a read-only target (the target
            // is read-only from before the operation to after it: `Evac` changes only
            // between operations, and the log is taken after each change).
            if self.evac.read_only() == Some(d.target) {
                self.fail(&format!(
                    "in-place write of target {} blocks {}..+{} while the target was \
                     read-only ({:?})",
                    d.target, d.phys, d.blocks, self.evac
                ));
            }
            if !counts_fixed {
                continue;
            }
            if let Some((b, why)) = (d.phys..d.phys + d.blocks)
                .find_map(|b| self.forbidden.get(&(d.target, b)).map(|w| (b, *w)))
            {
                self.fail(&format!(
                    "in-place write of target {} blocks {}..+{}: block {b} was {why} before \
                     the operation",
                    d.target, d.phys, d.blocks
                ));
            }
        }
    }

    /// Issue 9 item 1: after every operation each target's books balance (available +
    /// reserved + in extents + busy = data blocks) and every reservation is held by a
    /// delayed allocation, so no path (truncate, punch, unlink, failed writeback, eviction)
    /// leaks or double-returns space.
    fn check_space(&mut self) {
        // Issue 12: the reference-count index equals what all extent maps derive.
        if let Err(e) = self.sut.fs.check_refcounts() {
            self.fail(&format!("refcounts: {e}"));
        }
        // Issue 12: checksums exist exactly for written blocks of datacow files.
        if let Err(e) = self.sut.fs.check_csums() {
            self.fail(&format!("checksums: {e}"));
        }
        if let Err(e) = self.sut.fs.check_space_accounting() {
            self.fail(&format!("space accounting: {e}"));
        }
    }

    /// Clones (`clone_file`, `clone_range`) and `copy_file_range`: whole files, ranges,
    /// onto the same file at another offset, over existing data; the model copies bytes.
    fn op_clone(&mut self) {
        let (Some((sname, src)), Some((dname, dst))) = (self.existing(), self.existing()) else {
            return;
        };
        let bs = u64::from(self.c.block_size);
        let ssize = self.model.data[&src].len() as u64;
        let dsize = self.model.data[&dst].len() as u64;
        let (si, di) = (self.sut.inos[&src], self.sut.inos[&dst]);
        let what = format!("{}/{} -> {}/{}", sname.0, sname.1, dname.0, dname.1);
        // A clone between a copy-on-write file and a NOCOW one is refused (btrfs's rule:
        // no file partly checksummed); copy_file_range copies instead.
        let mixed = self.model.nocow[&src] != self.model.nocow[&dst];
        match self.rng.below(4) {
            0 if src != dst => {
                self.log.push(format!("clone_file {what}"));
                match self.sut.fs.clone_file(si, di) {
                    Err(FsError::Invalid(_)) if mixed => return,
                    Ok(_) if !mixed => {}
                    other => self.fail(&format!("clone_file: {other:?} (mixed {mixed})")),
                }
                let copy = self.model.data[&src].clone();
                self.model.data.insert(dst, copy);
            }
            0 | 1 => {
                let so = self.rng.below(ssize / bs + 1) * bs;
                let avail = ssize.saturating_sub(so);
                let mut len = if self.rng.one_in(3) || avail < bs {
                    avail
                } else {
                    self.rng.range(1, avail / bs) * bs
                };
                let d_off = (self.rng.below(dsize + 8 * bs) / bs * bs).min(MAX_FILE / 2);
                len = len.min((MAX_FILE - d_off) / bs * bs);
                if len == 0 {
                    return;
                }
                let span = len.next_multiple_of(bs);
                let overlap = src == dst && so < d_off + span && d_off < so + span;
                let bad_tail =
                    !len.is_multiple_of(bs) && (so + len != ssize || d_off + len < dsize);
                self.log.push(format!(
                    "clone_range {what} src_off={so} dst_off={d_off} len={len}"
                ));
                match self.sut.fs.clone_range(si, so, di, d_off, len) {
                    Err(FsError::Invalid(_)) if overlap || bad_tail || mixed => return,
                    Ok(n) if n == len && !overlap && !bad_tail && !mixed => {}
                    other => self.fail(&format!(
                        "clone_range returned {other:?} (overlap {overlap}, bad tail {bad_tail})"
                    )),
                }
                let bytes = self.model.data[&src][so as usize..(so + len) as usize].to_vec();
                self.model_write(dst, d_off, &bytes);
            }
            _ => {
                let so = self.rng.below(ssize + 2);
                let (d_off, len) = self.random_range(dsize, 300_000);
                let d_off = d_off.min(MAX_FILE / 2);
                let len = len.min(MAX_FILE - d_off);
                let n = len.min(ssize.saturating_sub(so));
                let overlap = src == dst && n > 0 && so < d_off + n && d_off < so + n;
                self.log.push(format!(
                    "copy_file_range {what} src_off={so} dst_off={d_off} len={len}"
                ));
                match self.sut.fs.copy_file_range(si, so, di, d_off, len) {
                    Err(FsError::Invalid(_)) if overlap => return,
                    Ok(got) if got == n && !overlap => {}
                    other => self.fail(&format!(
                        "copy_file_range returned {other:?}, model {n} (overlap {overlap})"
                    )),
                }
                if n > 0 {
                    let bytes = self.model.data[&src][so as usize..(so + n) as usize].to_vec();
                    self.model_write(dst, d_off, &bytes);
                }
            }
        }
    }

    /// Every file's size matches the model after every operation (cheap, and it points at
    /// the operation that went wrong).
    fn check_sizes(&mut self) {
        let ids: Vec<u32> = self.model.data.keys().copied().collect();
        for id in ids {
            let got = self.sut.fs.getattr(self.sut.inos[&id]).map(|a| a.size);
            let want = self.model.data[&id].len() as u64;
            if got.as_ref().ok() != Some(&want) {
                self.fail(&format!(
                    "file {id} size {got:?} after the last operation, model {want}"
                ));
            }
        }
    }

    /// fsx `-e 1`: garbage past EOF in the cached EOF folio, not in the model.
    fn pollute(&mut self, id: u32) {
        if !self.c.pollute {
            return;
        }
        let seed = self.rng.next_u64() as u8;
        self.log.push(format!("pollute file {id} past EOF"));
        if let Err(e) = self.sut.fs.debug_pollute_past_eof(self.sut.inos[&id], seed) {
            self.fail(&format!("pollute failed: {e}"));
        }
    }

    fn model_write(&mut self, id: u32, off: u64, data: &[u8]) {
        let m = self.model.data.get_mut(&id).expect("file");
        let end = off as usize + data.len();
        if m.len() < end {
            m.resize(end, 0);
        }
        m[off as usize..end].copy_from_slice(data);
    }

    fn op_create(&mut self) {
        let (d, n) = self.pick_name();
        self.log.push(format!("create {d}/{n}"));
        let r = self
            .sut
            .fs
            .create(self.sut.dirs[d], n.as_ref(), CreateParams::with_perm(0o644));
        match (self.model.names.contains_key(&(d, n.clone())), r) {
            (true, Err(FsError::Exists)) => {}
            (false, Ok(a)) => {
                let id = self.model.next_id;
                self.model.next_id += 1;
                self.model.names.insert((d, n), id);
                self.model.data.insert(id, Vec::new());
                let nocow = self.model.datacow == DataCow::Off || self.model.dir_nocow[d];
                self.model.nocow.insert(id, nocow);
                self.sut.inos.insert(id, a.ino);
                self.check_flags(id);
            }
            (e, r) => self.fail(&format!("create: model exists={e}, fs said {r:?}")),
        }
    }

    fn random_range(&mut self, size: u64, max_len: u64) -> (u64, u64) {
        let off = match self.rng.below(3) {
            0 => self.rng.below(size + 65536) & !4095,
            1 => self.rng.below(size + 65536) & !511,
            _ => self.rng.below(size + 65536),
        }
        .min(MAX_FILE - 1);
        let len = if self.rng.one_in(4) {
            self.rng.range(1, max_len)
        } else {
            self.rng.range(1, 9000)
        };
        (off, len.min(MAX_FILE - off))
    }

    fn op_write(&mut self) {
        let Some((name, id)) = self.existing() else {
            return self.op_create();
        };
        let size = self.model.data[&id].len() as u64;
        let (off, len) = self.random_range(size, 300_000);
        let data = pattern(self.rng.next_u64(), off, len as usize);
        if off + len > size {
            self.pollute(id);
        }
        self.log
            .push(format!("write {}/{} off={off} len={len}", name.0, name.1));
        match self.sut.fs.write_at(self.sut.inos[&id], off, &data) {
            Ok(n) if n as u64 == len => {}
            other => self.fail(&format!("write returned {other:?}")),
        }
        self.model_write(id, off, &data);
    }

    /// Direct reads and writes on the same files as buffered ones (fsx `-Z`).
    fn op_direct(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        // Direct I/O is sector-granular: offsets and lengths are multiples of 512.
        let (off, len) = self.random_range(size, 70_000);
        let off = off / 512 * 512;
        let len = len
            .next_multiple_of(512)
            .min((MAX_FILE - off) / 512 * 512)
            .max(512);
        if self.rng.one_in(2) {
            self.log
                .push(format!("dread {}/{} off={off} len={len}", name.0, name.1));
            let mut buf = vec![0u8; len as usize];
            let n = match self.sut.fs.read_direct(self.sut.inos[&id], off, &mut buf) {
                Ok(n) => n,
                Err(e) => self.fail(&format!("direct read: {e}")),
            };
            let m = &self.model.data[&id];
            let want = (m.len() as u64).saturating_sub(off).min(len) as usize;
            if n != want || (n > 0 && buf[..n] != m[off as usize..off as usize + n]) {
                self.fail(&format!("direct read of file {id} at {off}: {n} bytes (model {want}) or content differs"));
            }
            return;
        }
        let data = pattern(self.rng.next_u64(), off, len as usize);
        if off + len > size {
            self.pollute(id);
        }
        self.log
            .push(format!("dwrite {}/{} off={off} len={len}", name.0, name.1));
        if let Err(e) = self.sut.fs.write_direct(self.sut.inos[&id], off, &data) {
            self.fail(&format!("direct write failed: {e}"));
        }
        self.model_write(id, off, &data);
    }

    fn op_read(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let (name, id, off) = match self.last_read {
            Some((last, end))
                if self.rng.one_in(2) && self.model.names.values().any(|&v| v == last) =>
            {
                ((0, "(last read)".to_string()), last, end)
            }
            _ => {
                let size = self.model.data[&id].len() as u64;
                (name, id, self.rng.below(size + 4096))
            }
        };
        let len = self.rng.range(1, 200_000);
        self.log
            .push(format!("read {}/{} off={off} len={len}", name.0, name.1));
        self.last_read = Some((id, off + len));
        self.check_range(id, off, len);
    }

    fn check_range(&mut self, id: u32, off: u64, len: u64) {
        let mut buf = vec![0xAAu8; len as usize];
        let n = match self.sut.fs.read_at(self.sut.inos[&id], off, &mut buf) {
            Ok(n) => n,
            Err(e) => self.fail(&format!("read failed: {e}")),
        };
        let m = &self.model.data[&id];
        let want_n = (m.len() as u64).saturating_sub(off).min(len) as usize;
        if n != want_n {
            self.fail(&format!(
                "read of file {id} at {off}: got {n} bytes, model has {want_n}"
            ));
        }
        if n > 0 && buf[..n] != m[off as usize..off as usize + n] {
            let first = (0..n).find(|&i| buf[i] != m[off as usize + i]).unwrap_or(0);
            self.fail(&format!(
                "file {id} differs at byte {} (read at {off}): got {:#x}, model {:#x}",
                off as usize + first,
                buf[first],
                m[off as usize + first]
            ));
        }
    }

    fn op_truncate(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        let new = self.rng.below(size + size / 2 + 10_000).min(MAX_FILE);
        self.pollute(id);
        if self.rng.one_in(8) {
            self.huge_detour(id, size.max(new));
        }
        self.log
            .push(format!("truncate {}/{} {size} -> {new}", name.0, name.1));
        if let Err(e) = self.sut.fs.set_len(self.sut.inos[&id], new) {
            self.fail(&format!("truncate failed: {e}"));
        }
        self.model
            .data
            .get_mut(&id)
            .expect("file")
            .resize(new as usize, 0);
    }

    /// Issue 9 item 2: truncating up to the maximum file size (the following truncate
    /// brings the file back, so the model is unchanged) costs mapping lookups in
    /// proportion to the data the file holds or caches, never to the new size: at most a
    /// few per block of the larger model size plus one folio.
    fn huge_detour(&mut self, id: u32, held: u64) {
        self.log
            .push(format!("truncate file {id} to the maximum size"));
        let before = self.sut.fs.status().map_lookups;
        if let Err(e) = self
            .sut
            .fs
            .set_len(self.sut.inos[&id], stripefs::MAX_FILE_BYTES)
        {
            self.fail(&format!("truncate to the maximum size failed: {e}"));
        }
        let used = self.sut.fs.status().map_lookups - before;
        // The cached EOF folio may reach past both sizes.
        let cached = held + u64::from(self.c.folio_bytes);
        let budget = 64 + 4 * cached.div_ceil(u64::from(self.c.block_size));
        if used > budget {
            self.fail(&format!(
                "truncate to the maximum size made {used} mapping lookups (budget {budget})"
            ));
        }
    }

    /// Adds the current mount's counters to the run's.
    fn count_mount(&mut self) {
        let st = self.sut.fs.status();
        self.readahead_async_bytes += st.cache.readahead_async_bytes;
        self.read_swapped_bytes += st.cache.read_swapped_bytes;
        self.wb_groups += st.wb_groups;
        self.wb_group_files += st.wb_group_files;
        self.lent_rewrites += st.cache.lent_rewrites;
        self.meta_inode_loads += st.meta_inode_loads;
        self.nocow_cow += st.nocow_cow;
        self.read_only_copies += st.nocow_read_only;
    }

    fn op_sync(&mut self) {
        if self.c.inodes.is_some() && self.rng.one_in(2) {
            self.log.push("checkpoint".into());
            if let Err(e) = self.sut.fs.checkpoint() {
                self.fail(&format!("checkpoint failed: {e}"));
            }
            return;
        }
        if self.c.group_sync && self.rng.one_in(2) {
            self.log.push("sync".into());
            if let Err(e) = self.sut.fs.sync() {
                self.fail(&format!("sync failed: {e}"));
            }
            return;
        }
        let Some((name, id)) = self.existing() else {
            return;
        };
        let datasync = self.rng.one_in(2);
        self.log.push(format!(
            "{} {}/{}",
            if datasync { "fdatasync" } else { "fsync" },
            name.0,
            name.1
        ));
        if let Err(e) = self.sut.fs.fsync(
            self.sut.inos[&id],
            if datasync {
                stripefs::SyncScope::Data
            } else {
                stripefs::SyncScope::All
            },
        ) {
            self.fail(&format!("fsync failed: {e}"));
        }
    }

    fn op_rename(&mut self) {
        let Some((src, id)) = self.existing() else {
            return;
        };
        let dst = self.pick_name();
        self.log
            .push(format!("rename {}/{} -> {}/{}", src.0, src.1, dst.0, dst.1));
        let r = self.sut.fs.rename(
            self.sut.dirs[src.0],
            src.1.as_ref(),
            self.sut.dirs[dst.0],
            dst.1.as_ref(),
            RenameMode::Replace,
        );
        if let Err(e) = r {
            self.fail(&format!("rename failed: {e}"));
        }
        // POSIX: renaming onto another link of the same file does nothing.
        if src != dst && self.model.names.get(&dst) != Some(&id) {
            self.model.names.remove(&src);
            if let Some(old) = self.model.names.insert(dst, id) {
                self.forget_if_unreferenced(old);
            }
        }
    }

    fn forget_if_unreferenced(&mut self, id: u32) {
        let named = self.model.names.values().any(|&v| v == id);
        let open = self.sut.handles.iter().any(|(h, _)| *h == id);
        if !named && !open {
            self.model.data.remove(&id);
            self.sut.inos.remove(&id);
        }
    }

    fn op_unlink(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        self.log.push(format!("unlink {}/{}", name.0, name.1));
        if let Err(e) = self.sut.fs.unlink(self.sut.dirs[name.0], name.1.as_ref()) {
            self.fail(&format!("unlink failed: {e}"));
        }
        self.model.names.remove(&name);
        self.forget_if_unreferenced(id);
    }

    fn op_link(&mut self) {
        let Some((src, id)) = self.existing() else {
            return;
        };
        let dst = self.pick_name();
        self.log
            .push(format!("link {}/{} -> {}/{}", src.0, src.1, dst.0, dst.1));
        let r = self
            .sut
            .fs
            .link(self.sut.inos[&id], self.sut.dirs[dst.0], dst.1.as_ref());
        match (self.model.names.contains_key(&dst), r) {
            (true, Err(FsError::Exists)) => {}
            (false, Ok(_)) => {
                self.model.names.insert(dst, id);
            }
            (e, r) => self.fail(&format!("link: model exists={e}, fs said {r:?}")),
        }
    }

    fn op_falloc(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        let off = self.rng.below(size + 100_000).min(MAX_FILE - 1);
        let len = self.rng.range(1, 200_000).min(MAX_FILE - off);
        let keep = self.rng.one_in(2);
        if !keep {
            self.pollute(id);
        }
        self.log.push(format!(
            "falloc{} {}/{} off={off} len={len}",
            if keep { " -k" } else { "" },
            name.0,
            name.1
        ));
        let mode = if keep {
            FallocMode::KeepSize
        } else {
            FallocMode::Allocate
        };
        if let Err(e) = self.sut.fs.fallocate(self.sut.inos[&id], mode, off, len) {
            self.fail(&format!("fallocate failed: {e}"));
        }
        let m = self.model.data.get_mut(&id).expect("file");
        if !keep && (m.len() as u64) < off + len {
            m.resize((off + len) as usize, 0);
        }
    }

    fn op_punch_or_zero(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        let off = self.rng.below(size + 20_000).min(MAX_FILE - 1);
        let len = self.rng.range(1, 150_000).min(MAX_FILE - off);
        let (mode, what) = match self.rng.below(3) {
            0 => (FallocMode::PunchHole, "punch"),
            1 => (FallocMode::ZeroRange { keep_size: true }, "zero -k"),
            _ => (FallocMode::ZeroRange { keep_size: false }, "zero"),
        };
        let extends = mode == FallocMode::ZeroRange { keep_size: false } && off + len > size;
        if extends {
            self.pollute(id);
        }
        self.log
            .push(format!("{what} {}/{} off={off} len={len}", name.0, name.1));
        if let Err(e) = self.sut.fs.fallocate(self.sut.inos[&id], mode, off, len) {
            self.fail(&format!("{what} failed: {e}"));
        }
        let m = self.model.data.get_mut(&id).expect("file");
        let end = ((off + len) as usize).min(m.len());
        if (off as usize) < end {
            m[off as usize..end].fill(0);
        }
        if extends {
            m.resize((off + len) as usize, 0);
        }
    }

    /// SEEK_DATA may skip only zeros and may fail only when no non-zero byte follows;
    /// SEEK_HOLE must land on a zero byte or at EOF.
    fn op_seek(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        let off = self.rng.below(size + 2);
        let what = if self.rng.one_in(2) {
            Whence::Data
        } else {
            Whence::Hole
        };
        self.log
            .push(format!("seek {what:?} {}/{} off={off}", name.0, name.1));
        let r = self.sut.fs.seek(self.sut.inos[&id], off, what);
        let m = &self.model.data[&id];
        let first_data = m
            .iter()
            .enumerate()
            .skip(off as usize)
            .find(|(_, &b)| b != 0)
            .map(|(i, _)| i as u64);
        let ok = match (what, &r) {
            (_, Err(FsError::NoSuchOffset)) if off >= size => true,
            (Whence::Data, Err(FsError::NoSuchOffset)) => first_data.is_none(),
            (Whence::Data, Ok(r)) => *r >= off && *r < size && first_data.is_none_or(|d| *r <= d),
            (Whence::Hole, Ok(r)) => *r >= off && *r <= size && (*r == size || m[*r as usize] == 0),
            _ => false,
        };
        if !ok {
            self.fail(&format!("seek {what:?} from {off} in a {size}-byte file returned {r:?} (first data at {first_data:?})"));
        }
    }

    fn op_open_handle(&mut self) {
        let Some((_, id)) = self.existing() else {
            return;
        };
        self.log.push(format!("open file {id}"));
        match self.sut.fs.open_file(self.sut.inos[&id]) {
            Ok(f) => self.sut.handles.push((id, f)),
            Err(e) => self.fail(&format!("open failed: {e}")),
        }
    }

    fn op_close_handle(&mut self) {
        if self.sut.handles.is_empty() {
            return;
        }
        let i = self.rng.below(self.sut.handles.len() as u64) as usize;
        let (id, f) = self.sut.handles.swap_remove(i);
        self.log.push(format!("close file {id}"));
        if !self.model.names.values().any(|&v| v == id) {
            // Unlinked while open: still readable through the handle until the close.
            let len = self.model.data[&id].len() as u64;
            self.check_range(id, 0, len.max(1));
        }
        drop(f);
        self.forget_if_unreferenced(id);
    }

    /// `chattr +C`/`-C` on a directory (new files in it inherit) or a file (changes only
    /// while it is empty, silently kept otherwise).
    fn op_flags(&mut self) {
        let on = self.rng.one_in(2);
        let flags = if on {
            FileFlags::NOCOW
        } else {
            FileFlags::NONE
        };
        if self.rng.one_in(3) {
            let d = self.rng.below(2) as usize;
            self.log.push(format!("set_file_flags dir {d} nocow={on}"));
            if let Err(e) = self.sut.fs.set_file_flags(self.sut.dirs[d], flags) {
                self.fail(&format!("set_file_flags dir {d}: {e}"));
            }
            self.model.dir_nocow[d] = on;
            match self.sut.fs.file_flags(self.sut.dirs[d]) {
                Ok(f) if f == flags => {}
                r => self.fail(&format!("dir {d} flags {r:?}, model nocow={on}")),
            }
            return;
        }
        let Some((name, id)) = self.existing() else {
            return;
        };
        self.log
            .push(format!("set_file_flags {}/{} nocow={on}", name.0, name.1));
        if let Err(e) = self.sut.fs.set_file_flags(self.sut.inos[&id], flags) {
            self.fail(&format!("set_file_flags: {e}"));
        }
        if self.model.data[&id].is_empty() {
            self.model.nocow.insert(id, on);
        }
        self.check_flags(id);
    }

    fn check_flags(&mut self, id: u32) {
        let want = if self.model.nocow[&id] {
            FileFlags::NOCOW
        } else {
            FileFlags::NONE
        };
        match self.sut.fs.file_flags(self.sut.inos[&id]) {
            Ok(f) if f == want => {}
            r => self.fail(&format!("file {id}: flags {r:?}, model {want:?}")),
        }
    }

    fn op_remount(&mut self) {
        self.model.datacow = match self.model.datacow {
            DataCow::Off => DataCow::On,
            DataCow::On => DataCow::Off,
        };
        self.log
            .push(format!("remount datacow={:?}", self.model.datacow));
        let ids: Vec<u32> = self.sut.handles.drain(..).map(|(id, _)| id).collect();
        for id in ids {
            self.forget_if_unreferenced(id);
        }
        self.count_mount();
        if let Err(e) = self.sut.fs.unmount() {
            self.fail(&format!("unmount failed: {e}"));
        }
        if self.c.nocow_audit {
            let log = self.sut.fs.take_in_place_log();
            self.audit_in_place(&log);
        }
        let mut opts = self.c.mount_options();
        opts.datacow = self.model.datacow;
        let fs = match Fs::mount(self.targets.clone(), opts) {
            Ok((fs, _)) => fs,
            Err(e) => self.fail(&format!("mount failed: {e}")),
        };
        let d = match fs.lookup(Ino::ROOT, "d".as_ref()) {
            Ok(d) => d,
            Err(e) => self.fail(&format!("lookup d: {e}")),
        };
        self.sut.fs = fs;
        self.sut.dirs = [Ino::ROOT, d.ino];
        // The read-only state is persisted (decision 106): the evacuation goes on.
        if let Evac::Begun(t) | Evac::Done(t) = self.evac {
            if !self.sut.fs.target_read_only(stripefs::TargetId(t)) {
                self.fail(&format!("target {t} is writable again after the remount"));
            }
        }
        self.check_evacuated();
        self.check_space();
    }

    /// Adds the next spare target: it becomes the next index and every later mount gets
    /// it; new files may start on it and stripe over it.
    fn op_add_target(&mut self) {
        let t = self.spare.remove(0);
        self.log.push("add-target".into());
        let want = self.targets.len() as u32;
        match self.sut.fs.add_target(std::sync::Arc::clone(&t)) {
            Ok(id) if id.0 == want => {}
            Ok(id) => self.fail(&format!("added as target {id}, expected {want}")),
            Err(e) => self.fail(&format!("add-target: {e}")),
        }
        self.targets.push(t);
        self.added += 1;
        self.check_space();
    }

    /// Moves the evacuation on between operations, sometimes: begins one, completes or
    /// gives up the one begun, gives a completed one's target back. Returns whether it
    /// did anything (so that the in-place decisions it made are audited).
    fn evacuation_step(&mut self) -> bool {
        match self.evac {
            Evac::Idle if self.rng.one_in(EVACUATE_ONE_IN) => {
                let t = self.pick_evacuated();
                self.op_evacuate_begin(t);
                if self.rng.one_in(2) {
                    self.op_evacuate(t);
                }
            }
            Evac::Begun(t) if self.rng.one_in(6) => self.op_evacuate(t),
            Evac::Begun(t) if self.rng.one_in(12) => self.op_evacuate_cancel(t),
            Evac::Done(t) if self.rng.one_in(20) => self.op_evacuate_cancel(t),
            Evac::Done(t) if self.rng.one_in(12) && self.retired < MAX_RETIRED => {
                self.op_retire(t);
            }
            _ => return false,
        }
        true
    }

    /// A target other than 0 to evacuate: one holding file blocks if any does (with one
    /// stripe, files sit on few of the eight targets).
    fn pick_evacuated(&mut self) -> u32 {
        let books = self.sut.fs.space_accounting();
        let live = |t: &u32| !self.sut.fs.target_retired(stripefs::TargetId(*t));
        let mut holding: Vec<u32> = (1..books.len() as u32)
            .filter(|&t| books[t as usize].extent_blocks > 0)
            .filter(live)
            .collect();
        if holding.is_empty() {
            holding = (1..books.len() as u32).filter(live).collect();
        }
        holding[self.rng.below(holding.len() as u64) as usize]
    }

    /// `Fs::evacuate_begin`: `t` read-only from here on, its in-place writers drained,
    /// everything dirty written back (copied off `t` where it would have been in place).
    fn op_evacuate_begin(&mut self, t: u32) {
        self.log.push(format!("evacuate-begin target {t}"));
        self.evac = Evac::Begun(t);
        if let Err(e) = self.sut.fs.evacuate_begin(stripefs::TargetId(t)) {
            self.fail(&format!("evacuate_begin {t}: {e}"));
        }
    }

    /// `Fs::evacuate` (resuming the evacuation begun): `t` is empty when it returns, and
    /// every file still reads what the model holds.
    fn op_evacuate(&mut self, t: u32) {
        self.log.push(format!("evacuate target {t}"));
        if let Err(e) = self.sut.fs.evacuate(stripefs::TargetId(t), &mut |_| {}) {
            self.fail(&format!("evacuate {t}: {e}"));
        }
        self.evac = Evac::Done(t);
        self.evacuations += 1;
        self.check_evacuated();
        self.verify_all();
    }

    fn op_evacuate_cancel(&mut self, t: u32) {
        self.log.push(format!("evacuate-cancel target {t}"));
        if let Err(e) = self.sut.fs.evacuate_cancel(stripefs::TargetId(t)) {
            self.fail(&format!("evacuate_cancel {t}: {e}"));
        }
        self.evac = Evac::Idle;
    }

    /// `Fs::retire_target` of the evacuated target: it leaves for good, holds nothing,
    /// and every file still reads what the model holds (later mounts still give its
    /// device: a retired one given is ignored).
    fn op_retire(&mut self, t: u32) {
        self.log.push(format!("retire target {t}"));
        if let Err(e) = self.sut.fs.retire_target(stripefs::TargetId(t)) {
            self.fail(&format!("retire {t}: {e}"));
        }
        self.evac = Evac::Idle;
        self.retired += 1;
        let b = &self.sut.fs.space_accounting()[t as usize];
        if b.data_blocks != 0 || b.extent_blocks != 0 || b.meta_page_blocks != 0 {
            self.fail(&format!("retired target {t} still counts: {b:?}"));
        }
        self.verify_all();
        self.check_space();
    }

    /// While a completed evacuation's target stays read-only, no extent of any file and
    /// no metadata page is on it.
    fn check_evacuated(&mut self) {
        let Evac::Done(t) = self.evac else {
            return;
        };
        let books = self.sut.fs.space_accounting();
        let b = &books[t as usize];
        if b.extent_blocks != 0 || b.meta_page_blocks != 0 {
            self.fail(&format!(
                "evacuated target {t} holds {} blocks in extents and {} in metadata pages",
                b.extent_blocks, b.meta_page_blocks
            ));
        }
    }

    fn verify_all(&mut self) {
        self.log.push("verify".into());
        for (d, dir) in self.sut.dirs.into_iter().enumerate() {
            let listed: Vec<String> = match self.sut.fs.readdir(dir) {
                Ok(v) => v
                    .into_iter()
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .filter(|n| !(n.starts_with('z') || d == 0 && n == "d"))
                    .collect(),
                Err(e) => self.fail(&format!("readdir: {e}")),
            };
            let want: Vec<String> = self
                .model
                .names
                .keys()
                .filter(|(dd, _)| *dd == d)
                .map(|(_, n)| n.clone())
                .collect();
            if listed != want {
                self.fail(&format!("directory {d} lists {listed:?}, model {want:?}"));
            }
        }
        let ids: Vec<u32> = self.model.data.keys().copied().collect();
        for id in ids {
            let a = match self.sut.fs.getattr(self.sut.inos[&id]) {
                Ok(a) => a,
                Err(e) => self.fail(&format!("getattr: {e}")),
            };
            let links = self.model.names.values().filter(|&&v| v == id).count() as u32;
            if a.size != self.model.data[&id].len() as u64 || a.nlink != links {
                self.fail(&format!(
                    "file {id}: size {} nlink {}, model {} {links}",
                    a.size,
                    a.nlink,
                    self.model.data[&id].len()
                ));
            }
            self.check_range(id, 0, a.size.max(1));
            self.check_flags(id);
        }
    }
}

fn run_model(c: Cfg, seed: u64, ops: u64) -> u64 {
    let s = sims(TARGETS, TARGET_BYTES);
    let targets = if c.late_reads {
        s.into_iter()
            .map(|t| std::sync::Arc::new(LateReads::new(t)) as std::sync::Arc<dyn Target>)
            .collect()
    } else if c.late_writes {
        s.into_iter()
            .map(|t| std::sync::Arc::new(LateWrites::new(t)) as std::sync::Arc<dyn Target>)
            .collect()
    } else {
        dyns(&s)
    };
    run_model_on(targets, c, seed, ops)
}

fn run_model_on(targets: Vec<std::sync::Arc<dyn Target>>, c: Cfg, seed: u64, ops: u64) -> u64 {
    let opts = MkfsOptions {
        block_size: c.block_size,
        stripe_unit: c.block_size.max(4096) * 4,
        stripe_count: Some(c.stripe_count),
        ..MkfsOptions::default()
    };
    let mut targets = targets;
    let spare = targets.split_off(targets.len() - c.add_targets as usize);
    Fs::mkfs(&targets, &opts).expect("mkfs");
    let (fs, _) = Fs::mount(targets.clone(), c.mount_options()).expect("mount");
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .expect("mkdir");
    if c.big_dirs {
        for dir in [Ino::ROOT, d.ino] {
            for n in 0..BIG_DIR {
                let name = format!("z{n}");
                fs.mknod(
                    dir,
                    name.as_ref(),
                    stripefs::FileKind::Fifo,
                    CreateParams::with_perm(0o644),
                )
                .expect("filler entry");
            }
        }
        fs.checkpoint().expect("checkpoint");
    }
    let mut run = Run {
        c,
        rng: Rng::new(seed),
        log: Vec::new(),
        seed,
        model: Model {
            names: BTreeMap::new(),
            data: HashMap::new(),
            next_id: 0,
            nocow: HashMap::new(),
            dir_nocow: [false; 2],
            datacow: DataCow::Off,
        },
        sut: Sut {
            fs,
            dirs: [Ino::ROOT, d.ino],
            inos: HashMap::new(),
            handles: Vec::new(),
        },
        targets,
        ops: 0,
        last_read: None,
        readahead_async_bytes: 0,
        read_swapped_bytes: 0,
        wb_groups: 0,
        wb_group_files: 0,
        lent_rewrites: 0,
        meta_inode_loads: 0,
        forbidden: BTreeMap::new(),
        audited_in_place: 0,
        nocow_cow: 0,
        spare,
        added: 0,
        evac: Evac::Idle,
        evacuations: 0,
        read_only_copies: 0,
        retired: 0,
    };
    for _ in 0..ops {
        run.step();
    }
    run.verify_all();
    run.count_mount();
    assert!(
        !c.late_writes || run.lent_rewrites > 0,
        "({c:?}): no write met a folio lent to a write in flight: the configuration tests nothing"
    );
    assert!(
        !c.big_dirs || run.sut.fs.status().meta_cache.evictions > 0,
        "({c:?}): no metadata page was evicted: the configuration tests nothing"
    );
    assert!(
        c.inodes.is_none() || run.meta_inode_loads > 0,
        "({c:?}): no inode was read back from the trees: the configuration tests nothing"
    );
    assert!(
        !c.late_reads || run.readahead_async_bytes > 0,
        "({c:?}): no asynchronous readahead ran: the configuration tests nothing"
    );
    assert!(
        !c.late_reads || run.read_swapped_bytes > 0,
        "({c:?}): no read installed its buffer as a folio: the configuration tests nothing"
    );
    assert!(
        !c.group_sync || run.wb_group_files > run.wb_groups,
        "({c:?}): no writeback group held more than one file ({} files in {} groups): \
         the configuration tests nothing",
        run.wb_group_files,
        run.wb_groups
    );
    assert!(
        !c.nocow_audit || (run.audited_in_place > 0 && run.nocow_cow > 0),
        "({c:?}): {} in-place decisions audited, {} copies: the configuration tests nothing",
        run.audited_in_place,
        run.nocow_cow
    );
    assert!(
        !c.evacuate || run.evacuations > 0,
        "({c:?}): no target was evacuated: the configuration tests nothing"
    );
    assert!(
        !c.evacuate || run.retired > 0,
        "({c:?}): no target was retired: the configuration tests nothing"
    );
    assert!(
        !(c.evacuate && c.nocow_audit) || run.read_only_copies > 0,
        "({c:?}): no write met a read-only target: the configuration tests nothing"
    );
    assert!(
        c.add_targets == 0 || run.added > 0,
        "({c:?}): no target was added: the configuration tests nothing"
    );
    run.sut.handles.clear();
    run.sut.fs.unmount().expect("unmount");
    let report = stripefs::fsck::fsck(run.targets.clone(), &mut |_| {}).expect("fsck");
    assert!(
        report.is_clean(),
        "fsck after model run ({c:?}): {:?}",
        report.problems
    );
    // After a clean unmount the bytes past EOF in every last block are zero on disk.
    assert!(
        report.eof_tails_not_zero.is_empty(),
        "non-zero bytes past EOF after a clean unmount ({c:?}): {:?}",
        report.eof_tails_not_zero
    );
    run.ops
}

fn ops_per_config() -> u64 {
    std::env::var("STRIPEFS_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

fn cfg(stripe_count: u32, block_size: u32, folio_bytes: u32) -> Cfg {
    Cfg {
        stripe_count,
        block_size,
        folio_bytes,
        pollute: false,
        force_zero: false,
        folio_tracking: false,
        fixed_folios: false,
        late_reads: false,
        group_sync: false,
        late_writes: false,
        inodes: None,
        big_dirs: false,
        nocow_audit: false,
        nocow_check: stripefs::NocowCheck::Unlocked,
        add_targets: 0,
        evacuate: false,
    }
}

macro_rules! model_case {
    ($name:ident, $cfg:expr) => {
        model_case!($name, $cfg, #[test]);
    };
    ($name:ident, $cfg:expr, $(#[$attr:meta])+) => {
        $(#[$attr])+
        fn $name() {
            let ops = ops_per_config();
            let c: Cfg = $cfg;
            for seed in [1u64, 2] {
                let seed = seed
                    ^ u64::from(c.stripe_count) << 8
                    ^ u64::from(c.block_size) << 16
                    ^ u64::from(c.folio_bytes) << 32;
                run_model(c, seed, ops);
            }
        }
    };
}

// Stripe counts x block sizes (64 KiB folios).
model_case!(stripes1_bs1k, cfg(1, 1024, 65536));
model_case!(stripes1_bs4k, cfg(1, 4096, 65536));
model_case!(stripes1_bs64k, cfg(1, 65536, 65536));
model_case!(stripes3_bs1k, cfg(3, 1024, 65536));
model_case!(stripes3_bs4k, cfg(3, 4096, 65536));
model_case!(stripes3_bs64k, cfg(3, 65536, 65536));
model_case!(stripes8_bs1k, cfg(8, 1024, 65536));
model_case!(stripes8_bs4k, cfg(8, 4096, 65536));
model_case!(stripes8_bs64k, cfg(8, 65536, 65536));
// Stripe counts x folio sizes (4 KiB blocks; 64 KiB folios are covered above).
model_case!(stripes1_folio4k, cfg(1, 4096, 4096));
model_case!(stripes1_folio2m, cfg(1, 4096, 2 << 20));
model_case!(stripes3_folio4k, cfg(3, 4096, 4096));
model_case!(stripes3_folio2m, cfg(3, 4096, 2 << 20));
model_case!(stripes8_folio4k, cfg(8, 4096, 4096));
model_case!(stripes8_folio2m, cfg(8, 4096, 2 << 20));
// fsx -e 1 (EOF pollution) and zero range forced through the cache.
model_case!(
    eof_pollution_folio64k,
    Cfg {
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    eof_pollution_bs1k,
    Cfg {
        pollute: true,
        ..cfg(3, 1024, 65536)
    }
);
model_case!(
    eof_pollution_folio2m,
    Cfg {
        pollute: true,
        ..cfg(1, 4096, 2 << 20)
    }
);
model_case!(
    force_zero_via_cache,
    Cfg {
        force_zero: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    force_zero_and_pollution,
    Cfg {
        force_zero: true,
        pollute: true,
        ..cfg(8, 1024, 4096)
    }
);
// The dirty_tracking = folio switch (whole folios written back).
model_case!(
    folio_tracking_folio64k,
    Cfg {
        folio_tracking: true,
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
// The folio_sizing = fixed switch (every folio the largest size).
model_case!(
    fixed_folios_folio64k,
    Cfg {
        fixed_folios: true,
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    fixed_folios_folio_tracking_bs1k,
    Cfg {
        fixed_folios: true,
        folio_tracking: true,
        force_zero: true,
        ..cfg(3, 1024, 65536)
    }
);
model_case!(
    folio_tracking_bs1k_folio4k,
    Cfg {
        folio_tracking: true,
        force_zero: true,
        ..cfg(8, 1024, 4096)
    }
);

// Reads completing late: asynchronous readahead in flight under every operation.
model_case!(
    late_reads_stripes3,
    Cfg {
        late_reads: true,
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    late_reads_bs1k_folio4k,
    Cfg {
        late_reads: true,
        force_zero: true,
        ..cfg(8, 1024, 4096)
    }
);

// Multi-file writeback under a tiny cache: groups of dirty files written back by `sync`
// while writers are throttled and clean folios evicted.
model_case!(
    group_sync_stripes3,
    Cfg {
        group_sync: true,
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    group_sync_bs1k_folio4k,
    Cfg {
        group_sync: true,
        force_zero: true,
        ..cfg(8, 1024, 4096)
    }
);

// Writes reaching the device late while the flusher runs: rewrites of folios whose
// memory a write in flight holds, and foreground operations meeting writeback that holds
// no inode lock (they found a truncate zeroing the EOF block's tail under its write in
// flight, and an extending write whose size grew only after the flusher had taken its
// first folio: `truncate_writeback`, iomap's `write_extend_writeback`).
model_case!(
    late_writes_stripes3,
    Cfg {
        late_writes: true,
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    late_writes_bs1k_folio4k,
    Cfg {
        late_writes: true,
        force_zero: true,
        ..cfg(8, 1024, 4096)
    }
);

// A tiny in-core inode bound with frequent checkpoints: inodes are evicted and read
// back from the metadata trees constantly, every byte still compared with the model.
model_case!(
    tiny_inode_cache_stripes3,
    Cfg {
        inodes: Some(2),
        pollute: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    tiny_inode_cache_bs1k_folio4k,
    Cfg {
        inodes: Some(2),
        force_zero: true,
        ..cfg(8, 1024, 4096)
    }
);

// Large directories under the smallest metadata cache and a tiny inode bound: names are
// looked up, created and removed among thousands of entries held only in the trees.
model_case!(
    big_dirs_tiny_cache_stripes3,
    Cfg {
        inodes: Some(2),
        big_dirs: true,
        ..cfg(3, 4096, 65536)
    }
);

// Seed 001: NOCOW and datacow files (mounts alternate), clones four times as often, and
// every in-place decision audited against the blocks shared or checksummed before the
// operation; once with the checks under the lock. Issue 13: targets are evacuated
// between operations, and no in-place decision may land on one while it is read-only.
model_case!(
    nocow_audit_stripes3,
    Cfg {
        nocow_audit: true,
        evacuate: true,
        ..cfg(3, 4096, 65536)
    }
);
model_case!(
    nocow_audit_bs1k_locked,
    Cfg {
        nocow_audit: true,
        nocow_check: stripefs::NocowCheck::Locked,
        evacuate: true,
        ..cfg(1, 1024, 4096)
    }
);

// Issue 13: two of the eight targets join while mounted, between operations (mkfs on
// six, stripe count 3: new files start on and stripe over the added ones), and targets
// are evacuated between operations, added ones too.
model_case!(
    add_targets_stripes3,
    Cfg {
        add_targets: 2,
        evacuate: true,
        ..cfg(3, 4096, 65536)
    }
);

/// The model over 8 NBD targets (nbdkit memory servers on Unix sockets): a short run,
/// since every I/O crosses a socket; `STRIPEFS_MODEL_OPS` scales it like the others.
#[test]
fn nbd_targets_short_run() {
    let dir = nbdkit::Scratch::new("model-nbd");
    let size = format!("{TARGET_BYTES}");
    let servers = nbdkit::servers(&dir.0, TARGETS, &["memory", &size]);
    let targets = nbdkit::open(&servers, std::time::Duration::from_secs(30));
    run_model_on(
        targets,
        cfg(3, 4096, 65536),
        0x004e_4244,
        ops_per_config() / 2,
    );
}

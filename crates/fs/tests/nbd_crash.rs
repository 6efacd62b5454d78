//! Ordered data over NBD at every flush point: the file system runs a seeded workload on
//! three NBD targets (nbdkit `memory` servers), each reached through a recording proxy
//! (`crates/target/tests/nbd_proxy/`) that logs, from what passes on the wire, what a
//! server keeps across a restart: a write once its reply passed, made durable by a flush
//! sent after that (or at once if it carried `NBD_CMD_FLAG_FUA`). At every durability
//! point (each flush and FUA write after mkfs) the servers' durable images are rebuilt —
//! once with unflushed writes dropped, once with them kept at random and torn at sector
//! boundaries (the sim target's crash model), and each FUA write also caught in flight —
//! then mounted (recovery), checked with fsck and verified: every file fsynced before the
//! point and untouched since reads back exactly, and no byte that was never written is
//! visible. A sample of the images is served again by restarted nbdkit `file` servers
//! and mounted over NBD. Both kinds of server run: one advertising FUA, and one behind
//! nbdkit's `fua` filter (no FUA: the client sends write + flush).
//!
//! Needs Debian's `nbdkit` (`scripts/run-tests` installs it); fails without it.
mod common;
#[path = "../../target/tests/nbd_proxy/mod.rs"]
mod nbd_proxy;
#[path = "nbdkit/mod.rs"]
mod nbdkit;

use std::sync::Arc;
use std::time::Duration;

use common::{dyns, pattern, quiet, GARBAGE};
use nbd_proxy::{FlushMode, Proxy};
use nbdkit::{servers, Scratch, Server};
use stripefs::{CreateParams, Fs, Ino, MkfsOptions};
use stripefs_target::{NbdOptions, NbdTarget, Recorder, Rng, SimTarget, Target, UnflushedPolicy};

const NTARGETS: usize = 3;
const TARGET_BYTES: u64 = 4 << 20;
const SECTOR: usize = 512;

/// Whether the servers advertise `NBD_FLAG_SEND_FUA`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerFua {
    Advertised,
    Hidden,
}

/// Servers, one proxy in front of each, and the shared durability log.
struct Rig {
    dir: Scratch,
    _servers: Vec<Server>,
    proxies: Vec<Proxy>,
    rec: Arc<Recorder>,
}

impl Rig {
    fn new(fua: ServerFua) -> Self {
        let dir = Scratch::new("nbd-crash");
        let size = format!("{TARGET_BYTES}");
        let mut args = vec!["memory", size.as_str()];
        if fua == ServerFua::Hidden {
            args.insert(0, "--filter=fua"); // default fuamode=none
        }
        let srv = servers(&dir.0, NTARGETS, &args);
        let rec = Recorder::new();
        let proxies = srv
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let listen = dir.0.join(format!("p{i}.sock"));
                Proxy::start(&listen, &s.sock, i as u32, Some(Arc::clone(&rec)))
            })
            .collect();
        Self {
            dir,
            _servers: srv,
            proxies,
            rec,
        }
    }

    fn targets(&self) -> Vec<Arc<dyn Target>> {
        self.proxies
            .iter()
            .map(|p| {
                let t = NbdTarget::open(&p.uri(), opts()).expect("open NBD target via proxy");
                Arc::new(t) as Arc<dyn Target>
            })
            .collect()
    }
}

fn opts() -> NbdOptions {
    NbdOptions {
        timeout: Duration::from_secs(30),
        ..NbdOptions::default()
    }
}

struct FileState {
    name: String,
    ino: Ino,
    unlinked: bool,
    content: Vec<u8>,
    /// Each change (write, truncate, unlink): operation number and the event count when
    /// it started (its events, if any reached a server, come at or after it).
    changes: Vec<(u64, usize)>,
    /// Each fsync: operation number, event count when it returned, content then.
    snaps: Vec<(u64, usize, Vec<u8>)>,
}

impl FileState {
    /// The content the file must have after a crash at `cut`, if determined: its last
    /// fsync that returned before the crash, with no change started since.
    fn durable_at(&self, cut: Cut) -> Option<&[u8]> {
        let (op, _, content) = self.snaps.iter().rev().find(|s| s.1 <= cut.returned)?;
        let changed = self
            .changes
            .iter()
            .any(|&(o, at)| o > *op && at <= cut.started);
        (!changed).then_some(content)
    }
}

/// Where a crash cut the event log.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// An fsync that returned when at most this many events were logged is durable.
    returned: usize,
    /// A change that started at or before this event may be in the image.
    started: usize,
}

impl Cut {
    /// Server restarted right after event `p`.
    fn after(p: usize) -> Self {
        Self {
            returned: p + 1,
            started: p,
        }
    }

    /// Server restarted while the write logged as event `p` was in flight.
    fn during(p: usize) -> Self {
        Self {
            returned: p,
            started: p,
        }
    }
}

struct Workload {
    files: Vec<FileState>,
    /// Every write: offset and data.
    writes: Vec<(u64, Vec<u8>)>,
}

fn write(w: &mut Workload, fs: &Fs, id: usize, direct: bool, rng: &mut Rng, at: (u64, usize)) {
    let f = &mut w.files[id];
    let size = f.content.len() as u64;
    let (off, len) = if direct {
        (
            rng.below(size + 40_000) / 512 * 512,
            rng.range(1, 160) * 512,
        )
    } else {
        (rng.below(size + 40_000), rng.range(1, 70_000))
    };
    let seed = rng.next_u64();
    let data = pattern(seed, off, len as usize);
    if direct {
        fs.write_direct(f.ino, off, &data).unwrap();
    } else {
        fs.write_at(f.ino, off, &data).unwrap();
    }
    if f.content.len() < (off + len) as usize {
        f.content.resize((off + len) as usize, 0);
    }
    f.content[off as usize..(off + len) as usize].copy_from_slice(&data);
    w.writes.push((off, data));
    f.changes.push(at);
}

fn run_workload(fs: &Fs, rec: &Recorder, seed: u64, ops: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let mut w = Workload {
        files: Vec::new(),
        writes: Vec::new(),
    };
    let now = || rec.events().len();
    for opno in 0..ops {
        let live: Vec<usize> = (0..w.files.len())
            .filter(|&i| !w.files[i].unlinked)
            .collect();
        let start = now();
        let op = rng.below(16);
        if live.len() < 2 || op == 0 {
            let name = format!("f{}", w.files.len());
            let a = fs
                .create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
                .unwrap();
            w.files.push(FileState {
                name,
                ino: a.ino,
                unlinked: false,
                content: Vec::new(),
                changes: Vec::new(),
                snaps: Vec::new(),
            });
            continue;
        }
        let id = live[rng.below(live.len() as u64) as usize];
        match op {
            1..=3 => write(&mut w, fs, id, true, &mut rng, (opno, start)),
            4..=8 => write(&mut w, fs, id, false, &mut rng, (opno, start)),
            9..=12 => {
                fs.fsync(
                    w.files[id].ino,
                    if rng.one_in(3) {
                        stripefs::SyncScope::Data
                    } else {
                        stripefs::SyncScope::All
                    },
                )
                .unwrap();
                let f = &mut w.files[id];
                f.snaps.push((opno, now(), f.content.clone()));
            }
            13 => {
                let n = rng.below(w.files[id].content.len() as u64 + 5000);
                fs.set_len(w.files[id].ino, n).unwrap();
                w.files[id].content.resize(n as usize, 0);
                w.files[id].changes.push((opno, start));
            }
            14 => {
                fs.sync().unwrap();
                let t = now();
                for &i in &live {
                    let f = &mut w.files[i];
                    f.snaps.push((opno, t, f.content.clone()));
                }
            }
            _ => {
                fs.unlink(Ino::ROOT, w.files[id].name.as_ref()).unwrap();
                w.files[id].unlinked = true;
                w.files[id].changes.push((opno, start));
            }
        }
    }
    w
}

fn read_all(fs: &Fs, name: &str) -> Option<Vec<u8>> {
    let a = fs.lookup(Ino::ROOT, name.as_ref()).ok()?;
    let mut buf = vec![0u8; a.size as usize];
    let n = fs.read_at(a.ino, 0, &mut buf).expect("read after recovery");
    assert_eq!(n as u64, a.size);
    Some(buf)
}

/// Checks the mounted image against the workload; the first discrepancy is the error.
fn verify(fs: &Fs, w: &Workload, cut: Cut) -> Result<(), String> {
    for e in fs.readdir(Ino::ROOT).map_err(|e| format!("readdir: {e}"))? {
        let name = String::from_utf8(e.name).unwrap();
        let data = read_all(fs, &name).unwrap();
        for (i, &b) in data.iter().enumerate() {
            let o = i as u64;
            let written = |(off, d): &(u64, Vec<u8>)| {
                o >= *off && o < off + d.len() as u64 && d[(o - off) as usize] == b
            };
            if b != 0 && !w.writes.iter().any(written) {
                return Err(format!("{name}: byte {i} = {b:#x} was never written there"));
            }
        }
    }
    for f in &w.files {
        let Some(want) = f.durable_at(cut) else {
            continue;
        };
        match read_all(fs, &f.name) {
            None => return Err(format!("fsynced {} is missing", f.name)),
            Some(got) if got != want => {
                return Err(format!(
                    "fsynced {} differs ({} bytes, want {})",
                    f.name,
                    got.len(),
                    want.len()
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Mounts `images` (recovery), verifies, runs fsck.
fn check_on(targets: Vec<Arc<dyn Target>>, w: &Workload, cut: Cut) -> Result<(), String> {
    let (fs, _) =
        Fs::mount(targets.clone(), quiet()).map_err(|e| format!("recovery mount: {e}"))?;
    let r = verify(&fs, w, cut);
    drop(fs);
    r?;
    let report = stripefs::fsck::fsck(targets, &mut |_| {}).map_err(|e| format!("fsck: {e}"))?;
    if !report.is_clean() {
        return Err(format!("fsck: {:?}", report.problems));
    }
    Ok(())
}

fn check_in_memory(images: Vec<Vec<u8>>, w: &Workload, cut: Cut) -> Result<(), String> {
    let sims: Vec<Arc<SimTarget>> = images
        .into_iter()
        .enumerate()
        .map(|(i, img)| Arc::new(SimTarget::from_image(&format!("r{i}"), img, 512)))
        .collect();
    check_on(dyns(&sims), w, cut)
}

/// Serves `images` from files by freshly started nbdkit `file` servers and checks them
/// over NBD, as a client would after the real servers restarted.
fn check_over_restarted_servers(
    dir: &Scratch,
    images: &[Vec<u8>],
    w: &Workload,
    cut: Cut,
) -> Result<(), String> {
    // Apart from the running memory servers' sockets.
    let dir = dir.0.join("restart");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, img) in images.iter().enumerate() {
        std::fs::write(dir.join(format!("img{i}")), img).unwrap();
    }
    let file_arg = format!("file={}/img{{i}}", dir.display());
    let srv = servers(&dir, images.len(), &["file", &file_arg]);
    let targets = srv
        .iter()
        .map(|s| Arc::new(NbdTarget::open(&s.uri(), opts()).unwrap()) as Arc<dyn Target>)
        .collect();
    check_on(targets, w, cut)
}

/// Runs the workload through the proxies, then checks every durability point; returns the
/// number of images checked, or the first failure.
fn crash_points(fua: ServerFua, seed: u64, ops: u64, flushes: FlushMode) -> Result<usize, String> {
    let rig = Rig::new(fua);
    let targets = rig.targets();
    let mkfs = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16 << 10,
        journal_bytes: Some(64 << 10),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&targets, &mkfs).expect("mkfs");
    let base = rig.rec.events().len();
    for p in &rig.proxies {
        p.set_flush_mode(flushes);
    }
    let (fs, _) = Fs::mount(targets, quiet()).expect("mount");
    let w = run_workload(&fs, &rig.rec, seed, ops);
    // No unmount: the servers "restart" at points inside the workload.
    std::mem::forget(fs);
    for p in &rig.proxies {
        assert_eq!(p.flush_errors(), 0, "a server failed a flush");
    }
    let initial = vec![vec![GARBAGE; TARGET_BYTES as usize]; NTARGETS];
    let mut points: Vec<usize> = rig
        .rec
        .durability_points()
        .into_iter()
        .filter(|&p| p >= base)
        .collect();
    let fua_points: Vec<usize> = rig
        .rec
        .fua_points()
        .into_iter()
        .filter(|&p| p >= base)
        .collect();
    match fua {
        ServerFua::Advertised => assert!(!fua_points.is_empty(), "no FUA write on the wire"),
        ServerFua::Hidden => assert!(
            fua_points.is_empty(),
            "FUA flag sent to a server without it"
        ),
    }
    // The last event too: a restart after the workload, where every fsync counts.
    points.push(rig.rec.events().len() - 1);
    points.dedup();
    let mut checked = 0;
    for (k, &p) in points.iter().enumerate() {
        let tear = UnflushedPolicy::Tear {
            seed: seed ^ p as u64,
        };
        for policy in [UnflushedPolicy::Drop, tear] {
            let images = rig.rec.images_at(&initial, p + 1, policy, SECTOR);
            let at = |e: String| {
                format!("{fua:?} seed {seed}: server restart after event {p} ({policy:?}): {e}")
            };
            if policy == UnflushedPolicy::Drop && (k % 16 == 0 || k + 1 == points.len()) {
                check_over_restarted_servers(&rig.dir, &images, &w, Cut::after(p))
                    .map_err(|e| at(format!("over restarted nbdkit servers: {e}")))?;
                checked += 1;
            }
            check_in_memory(images, &w, Cut::after(p)).map_err(at)?;
            checked += 1;
        }
    }
    for &p in &fua_points {
        let images = rig
            .rec
            .images_in_flight(&initial, p, seed ^ (p as u64) << 1, SECTOR);
        check_in_memory(images, &w, Cut::during(p))
            .map_err(|e| format!("{fua:?} seed {seed}: restart during FUA write {p}: {e}"))?;
        checked += 1;
    }
    Ok(checked)
}

#[test]
fn ordered_data_holds_at_every_flush_point_over_nbd() {
    let mut total = 0;
    for (fua, seed) in [(ServerFua::Advertised, 1401), (ServerFua::Hidden, 1402)] {
        let n = crash_points(fua, seed, 100, FlushMode::Forward).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{fua:?}: {n} restart images checked");
        total += n;
    }
    assert!(
        total > 100,
        "workloads produced too few flush points: {total}"
    );
}

#[test]
fn a_proxy_that_loses_flushes_is_caught() {
    // The check above must be able to fail: with every flush after mkfs acknowledged by
    // the proxies but never reaching the servers, fsynced data is not durable.
    let e = crash_points(ServerFua::Hidden, 1403, 40, FlushMode::AckWithoutForwarding)
        .expect_err("lost flushes went unnoticed");
    eprintln!("caught as expected: {e}");
}

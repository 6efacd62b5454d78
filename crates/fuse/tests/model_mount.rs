//! The fsx-style model test through the kernel: random buffered and `O_DIRECT` writes,
//! reads, truncates, `fallocate` (allocate, punch, zero), fsyncs and reopens on a few
//! files of a FUSE mount, every read and every file at the end checked byte for byte
//! against an in-memory model. Needs root and `/dev/fuse`.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use stripefs::{Fs, MkfsOptions, MountOptions};
use stripefs_fuse::{serve, FuseConfig, ServeOptions};

mod common;
use common::{file_targets, Aligned};

const FILES: usize = 4;
const MAX_SIZE: u64 = 3 << 20;
const SECTOR: u64 = 512;

/// splitmix64: a seeded generator, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Handles {
    buffered: File,
    direct: File,
}

fn open(p: &Path) -> Handles {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    let buffered = o.open(p).unwrap();
    let direct = o.custom_flags(libc::O_DIRECT).open(p).unwrap();
    Handles { buffered, direct }
}

fn fallocate(f: &File, mode: i32, off: u64, len: u64) {
    let (o, l) = (i64::try_from(off).unwrap(), i64::try_from(len).unwrap());
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, o, l) };
    assert_eq!(
        r,
        0,
        "fallocate {mode:#x} {off}+{len}: {}",
        std::io::Error::last_os_error()
    );
}

struct Run {
    rng: Rng,
    model: Vec<Vec<u8>>,
    handles: Vec<Handles>,
    paths: Vec<PathBuf>,
    op: u64,
}

impl Run {
    fn check_read(&mut self, i: usize, off: u64, len: u64, direct: bool) {
        let size = self.model[i].len() as u64;
        let want_end = (off + len).min(size).max(off);
        let want = &self.model[i]
            [usize::try_from(off.min(size)).unwrap()..usize::try_from(want_end.min(size)).unwrap()];
        let got = if direct {
            let mut a = Aligned::new(usize::try_from(len).unwrap(), 0);
            let n = read_full(&self.handles[i].direct, a.buf(), off, true);
            a.buf()[..n].to_vec()
        } else {
            let mut b = vec![0u8; usize::try_from(len).unwrap()];
            let n = read_full(&self.handles[i].buffered, &mut b, off, false);
            b.truncate(n);
            b
        };
        assert!(
            got == want,
            "op {}: file {i} read {off}+{len} (direct {direct}) differs from the model (got {} bytes, want {})",
            self.op,
            got.len(),
            want.len()
        );
    }

    fn write(&mut self, i: usize, off: u64, len: u64, direct: bool) {
        let byte = (self.rng.next() & 0xff) as u8 | 1;
        let n = usize::try_from(len).unwrap();
        if direct {
            let mut a = Aligned::new(n, byte);
            self.handles[i].direct.write_all_at(a.buf(), off).unwrap();
        } else {
            self.handles[i]
                .buffered
                .write_all_at(&vec![byte; n], off)
                .unwrap();
        }
        let m = &mut self.model[i];
        let end = usize::try_from(off + len).unwrap();
        if m.len() < end {
            m.resize(end, 0);
        }
        m[usize::try_from(off).unwrap()..end].fill(byte);
    }

    fn step(&mut self) {
        let i = usize::try_from(self.rng.below(FILES as u64)).unwrap();
        let size = self.model[i].len() as u64;
        match self.rng.below(100) {
            0..=29 => {
                let off = self.rng.below(MAX_SIZE - 1);
                let len = 1 + self.rng.below((MAX_SIZE - off).min(200_000));
                self.write(i, off, len, false);
            }
            30..=44 => {
                let off = self.rng.below(MAX_SIZE / SECTOR - 1) * SECTOR;
                let len = SECTOR * (1 + self.rng.below(((MAX_SIZE - off) / SECTOR).min(256)));
                self.write(i, off, len, true);
            }
            45..=64 => {
                let off = self.rng.below(size + 4096);
                let len = 1 + self.rng.below(300_000);
                self.check_read(i, off, len, false);
            }
            65..=74 => {
                let off = self.rng.below((size + 4096) / SECTOR) * SECTOR;
                let len = SECTOR * (1 + self.rng.below(512));
                self.check_read(i, off, len, true);
            }
            75..=80 => {
                let new = self.rng.below(MAX_SIZE);
                self.handles[i].buffered.set_len(new).unwrap();
                self.model[i].resize(usize::try_from(new).unwrap(), 0);
            }
            81..=86 => {
                let off = self.rng.below(MAX_SIZE - 1);
                let len = 1 + self.rng.below((MAX_SIZE - off).min(1 << 20));
                let (mode, keep) = match self.rng.below(4) {
                    0 => (0, false),
                    1 => (libc::FALLOC_FL_KEEP_SIZE, true),
                    2 => (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, true),
                    _ => (libc::FALLOC_FL_ZERO_RANGE, false),
                };
                fallocate(&self.handles[i].buffered, mode, off, len);
                let m = &mut self.model[i];
                let end = usize::try_from(off + len).unwrap();
                if !keep && m.len() < end {
                    m.resize(end, 0);
                }
                if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                    let s = usize::try_from(off).unwrap().min(m.len());
                    let e = end.min(m.len());
                    m[s..e].fill(0);
                }
            }
            87..=91 => {
                if self.rng.below(2) == 0 {
                    self.handles[i].buffered.sync_all().unwrap();
                } else {
                    self.handles[i].direct.sync_data().unwrap();
                }
            }
            92..=96 => {
                let size_seen = self.handles[i].buffered.metadata().unwrap().len();
                assert_eq!(
                    size_seen,
                    self.model[i].len() as u64,
                    "op {}: file {i} size",
                    self.op
                );
            }
            _ => {
                self.handles[i] = open(&self.paths[i]);
            }
        }
        self.op += 1;
    }
}

/// Reads until `buf` is full or EOF. A short direct read is EOF (the next offset would
/// not be sector-aligned).
fn read_full(f: &File, buf: &mut [u8], off: u64, direct: bool) -> usize {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) if direct && n < buf.len() - done => return done + n,
            Ok(n) => done += n,
            Err(e) => panic!("read at {}: {e}", off + done as u64),
        }
    }
    done
}

fn ops() -> u64 {
    std::env::var("STRIPEFS_MOUNT_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000)
}

fn run_seed(seed: u64, ops: u64, fuse: FuseConfig) {
    let dir =
        std::env::temp_dir().join(format!("stripefs-fuse-model-{seed}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("mnt")).unwrap();
    let targets = || file_targets(&dir, 3, 128 << 20);
    let mkfs = MkfsOptions {
        stripe_unit: 64 << 10,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&targets(), &mkfs).unwrap();
    let (fs, _) = Fs::mount(targets(), MountOptions::default()).unwrap();
    let fs = Arc::new(fs);
    let mnt = dir.join("mnt");
    let opts = ServeOptions {
        fuse,
        ..common::serve_options()
    };
    let m = serve(fs.clone(), &mnt, &opts).unwrap();
    let paths: Vec<PathBuf> = (0..FILES).map(|i| mnt.join(format!("f{i}"))).collect();
    let mut run = Run {
        rng: Rng(seed),
        model: vec![Vec::new(); FILES],
        handles: paths.iter().map(|p| open(p)).collect(),
        paths,
        op: 0,
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..ops {
            run.step();
        }
        for i in 0..FILES {
            assert_eq!(
                fs::read(&run.paths[i]).unwrap(),
                run.model[i],
                "seed {seed}: file {i} at the end"
            );
        }
    }));
    drop(run.handles);
    let c = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    if let Err(p) = result {
        // SAFETY: valid C string; detach the mount before failing.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        std::panic::resume_unwind(p);
    }
    m.unmount().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let r = stripefs::fsck::fsck(targets(), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "seed {seed}: {:?}", r.problems);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn model_through_the_mount_mixed_buffered_and_direct() {
    let n = ops();
    // Seed 1 through the kernel's direct-I/O path (the default), seed 2 through
    // FOPEN_DIRECT_IO (`-o fopen_direct_io`).
    run_seed(1, n, FuseConfig::default());
    let old = FuseConfig {
        fopen_direct_io: true,
        ..FuseConfig::default()
    };
    run_seed(2, n, old);
}

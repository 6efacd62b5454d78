//! Shared helpers for the integration tests: simulated targets and mount shortcuts.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::sync::Arc;

use stripefs::{CreateParams, Fs, Ino, MkfsOptions, MountOptions};
use stripefs_target::{GateTarget, Recorder, RecordingTarget, SimTarget, Target};

/// Byte that fills fresh simulated disks: `pattern` never produces it (its bytes are odd),
/// so a never-written block that becomes visible shows up as a mismatch, not as zeros.
pub const GARBAGE: u8 = 0xEE;

/// `n` simulated targets of `bytes` each with 512-byte sectors, filled with [`GARBAGE`].
pub fn sims(n: usize, bytes: u64) -> Vec<Arc<SimTarget>> {
    (0..n)
        .map(|i| {
            Arc::new(SimTarget::from_image(
                &format!("sim{i}"),
                vec![GARBAGE; bytes as usize],
                512,
            ))
        })
        .collect()
}

/// The simulated targets as trait objects.
pub fn dyns(s: &[Arc<SimTarget>]) -> Vec<Arc<dyn Target>> {
    s.iter().map(|t| Arc::clone(t) as Arc<dyn Target>).collect()
}

/// The simulated targets wrapped so that `rec` records every write and flush (for
/// crash images at each durability point).
pub fn recorded(s: &[Arc<SimTarget>], rec: &Arc<Recorder>) -> Vec<Arc<dyn Target>> {
    s.iter()
        .enumerate()
        .map(|(i, t)| {
            Arc::new(RecordingTarget::new(
                Arc::clone(t) as Arc<dyn Target>,
                i as u32,
                Arc::clone(rec),
            )) as Arc<dyn Target>
        })
        .collect()
}

/// Mount options for deterministic tests: no background commit, writeback or checkpoint
/// threads.
pub fn quiet() -> MountOptions {
    MountOptions {
        commit_interval: None,
        writeback_interval: None,
        checkpoints: stripefs::Checkpoints::Inline,
        ..MountOptions::default()
    }
}

/// mkfs with block size `bs`, stripe unit `su`, all targets, then mount.
pub fn fresh(s: &[Arc<SimTarget>], bs: u32, su: u32) -> Fs {
    let opts = MkfsOptions {
        block_size: bs,
        stripe_unit: su,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(s), &opts).expect("mkfs");
    Fs::mount(dyns(s), quiet()).expect("mount").0
}

/// Deterministic file content: byte `i` of write `seed`.
pub fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i).wrapping_mul(31) ^ seed.wrapping_mul(0x9E37_79B9)) as u8 | 1)
        .collect()
}

/// Creates regular file `name` in the root directory (mode 0644).
pub fn file(fs: &Fs, name: &str) -> Ino {
    fs.create(Ino::ROOT, name.as_ref(), CreateParams::with_perm(0o644))
        .expect("create")
        .ino
}

/// The whole contents of `ino` (its size, read in one call).
pub fn read_all(fs: &Fs, ino: Ino) -> Vec<u8> {
    let size = fs.getattr(ino).expect("getattr").size;
    let mut buf = vec![0u8; size as usize];
    let n = fs.read_at(ino, 0, &mut buf).expect("read");
    assert_eq!(n as u64, size, "short read");
    buf
}

/// A file system on one 64 MiB simulated target behind a [`GateTarget`], mounted with
/// [`quiet`]: the gate, the targets as given (to remount or check them) and the file
/// system. For tests that hold one I/O in flight and look at what proceeds meanwhile.
pub fn gated_fs() -> (Arc<GateTarget>, Vec<Arc<dyn Target>>, Fs) {
    let s = sims(1, 64 << 20);
    let gate = Arc::new(GateTarget::new(Arc::clone(&s[0]) as Arc<dyn Target>));
    let targets: Vec<Arc<dyn Target>> = vec![Arc::clone(&gate) as Arc<dyn Target>];
    Fs::mkfs(&targets, &MkfsOptions::default()).expect("mkfs");
    let (fs, _) = Fs::mount(targets.clone(), quiet()).expect("mount");
    (gate, targets, fs)
}

/// Makes directories `d0` .. `d{n-1}` in the root (mode 0755); their inodes in order.
pub fn root_dirs(fs: &Fs, n: usize) -> Vec<Ino> {
    (0..n)
        .map(|d| {
            fs.mkdir(
                Ino::ROOT,
                format!("d{d}").as_ref(),
                CreateParams::with_perm(0o755),
            )
            .unwrap_or_else(|e| panic!("mkdir d{d}: {e}"))
            .ino
        })
        .collect()
}

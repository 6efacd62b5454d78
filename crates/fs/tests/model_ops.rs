//! Model-based test: seeded random namespace and data operations over several files,
//! every read compared byte for byte with an in-memory model (fsx-style), over stripe
//! counts {1, 3, 8} and block sizes {1 KiB, 4 KiB, 64 KiB}. On a mismatch the seed and the
//! tail of the operation log are printed.
mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use stripefs::{CreateParams, FallocMode, File, Fs, FsError, Ino, MkfsOptions, RenameMode};
use stripefs_target::{Rng, SimTarget};

const TARGETS: usize = 8;
const TARGET_BYTES: u64 = 24 << 20;
const MAX_FILE: u64 = 1 << 20;

struct Model {
    /// (dir index, name) -> file id.
    names: BTreeMap<(usize, String), u32>,
    data: HashMap<u32, Vec<u8>>,
    next_id: u32,
}

struct Sut {
    fs: Fs,
    dirs: [Ino; 2],
    inos: HashMap<u32, Ino>,
    handles: Vec<(u32, File)>,
}

struct Run {
    rng: Rng,
    log: Vec<String>,
    seed: u64,
    cfg: String,
    model: Model,
    sut: Sut,
    targets: Vec<std::sync::Arc<SimTarget>>,
    ops: u64,
}

impl Run {
    fn fail(&self, what: &str) -> ! {
        let tail: Vec<&String> = self
            .log
            .iter()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        panic!(
            "model mismatch ({}, seed {}): {what}\nlast ops:\n{}",
            self.cfg,
            self.seed,
            tail.iter()
                .map(|s| format!("  {s}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    fn pick_name(&mut self) -> (usize, String) {
        (
            (self.rng.below(2)) as usize,
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
        match self.rng.below(100) {
            0..=29 => self.op_write(),
            30..=44 => self.op_read(),
            45..=52 => self.op_create(),
            53..=60 => self.op_truncate(),
            61..=65 => self.op_sync(),
            66..=73 => self.op_rename(),
            74..=79 => self.op_unlink(),
            80..=82 => self.op_link(),
            83..=87 => self.op_falloc(),
            88..=91 => self.op_open_handle(),
            92..=94 => self.op_close_handle(),
            95..=96 => self.op_remount(),
            _ => self.verify_all(),
        }
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
                self.sut.inos.insert(id, a.ino);
            }
            (e, r) => self.fail(&format!("create: model exists={e}, fs said {r:?}")),
        }
    }

    fn op_write(&mut self) {
        let Some((name, id)) = self.existing() else {
            return self.op_create();
        };
        let size = self.model.data[&id].len() as u64;
        let off = match self.rng.below(3) {
            0 => self.rng.below(size + 65536) & !4095,
            1 => self.rng.below(size + 65536) & !511,
            _ => self.rng.below(size + 65536),
        }
        .min(MAX_FILE - 1);
        let len = if self.rng.one_in(4) {
            self.rng.range(1, 300_000)
        } else {
            self.rng.range(1, 9000)
        }
        .min(MAX_FILE - off);
        let seed = self.rng.next_u64();
        let data = pattern(seed, off, len as usize);
        self.log
            .push(format!("write {}/{} off={off} len={len}", name.0, name.1));
        if let Err(e) = self.sut.fs.write_at(self.sut.inos[&id], off, &data) {
            self.fail(&format!("write failed: {e}"));
        }
        let m = self.model.data.get_mut(&id).expect("file");
        let end = (off + len) as usize;
        if m.len() < end {
            m.resize(end, 0);
        }
        m[off as usize..end].copy_from_slice(&data);
    }

    fn op_read(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        let off = self.rng.below(size + 4096);
        let len = self.rng.range(1, 200_000);
        self.log
            .push(format!("read {}/{} off={off} len={len}", name.0, name.1));
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
                "file {id} differs at byte {} (read at {off})",
                off as usize + first
            ));
        }
    }

    fn op_truncate(&mut self) {
        let Some((name, id)) = self.existing() else {
            return;
        };
        let size = self.model.data[&id].len() as u64;
        let new = self.rng.below(size + size / 2 + 10_000).min(MAX_FILE);
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

    fn op_sync(&mut self) {
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
        if let Err(e) = self.sut.fs.fsync(self.sut.inos[&id], datasync) {
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

    fn op_remount(&mut self) {
        self.log.push("remount".into());
        let ids: Vec<u32> = self.sut.handles.drain(..).map(|(id, _)| id).collect();
        for id in ids {
            self.forget_if_unreferenced(id);
        }
        if let Err(e) = self.sut.fs.unmount() {
            self.fail(&format!("unmount failed: {e}"));
        }
        let (fs, _) = Fs::mount(dyns(&self.targets), quiet())
            .unwrap_or_else(|e| self.fail(&format!("mount failed: {e}")));
        let d = fs
            .lookup(Ino::ROOT, "d".as_ref())
            .unwrap_or_else(|e| self.fail(&format!("lookup d: {e}")));
        self.sut.fs = fs;
        self.sut.dirs = [Ino::ROOT, d.ino];
    }

    fn verify_all(&mut self) {
        self.log.push("verify".into());
        for (d, dir) in self.sut.dirs.into_iter().enumerate() {
            let listed: Vec<String> = match self.sut.fs.readdir(dir) {
                Ok(v) => v
                    .into_iter()
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .filter(|n| !(d == 0 && n == "d"))
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
            let a = self
                .sut
                .fs
                .getattr(self.sut.inos[&id])
                .unwrap_or_else(|e| self.fail(&format!("getattr: {e}")));
            let links = self.model.names.values().filter(|&&v| v == id).count() as u32;
            if a.size != self.model.data[&id].len() as u64 || a.nlink != links {
                self.fail(&format!(
                    "file {id}: size {} nlink {}, model {} {links}",
                    a.size,
                    a.nlink,
                    self.model.data[&id].len()
                ));
            }
            let len = a.size.max(1);
            self.check_range(id, 0, len);
        }
    }
}

fn run_model(stripe_count: u32, bs: u32, seed: u64, ops: u64) -> u64 {
    let targets = sims(TARGETS, TARGET_BYTES);
    let opts = MkfsOptions {
        block_size: bs,
        stripe_unit: bs * 4,
        stripe_count: Some(stripe_count),
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(&targets), &opts).expect("mkfs");
    let (fs, _) = Fs::mount(dyns(&targets), quiet()).expect("mount");
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .expect("mkdir");
    let mut run = Run {
        rng: Rng::new(seed),
        log: Vec::new(),
        seed,
        cfg: format!("stripe count {stripe_count}, block size {bs}"),
        model: Model {
            names: BTreeMap::new(),
            data: HashMap::new(),
            next_id: 0,
        },
        sut: Sut {
            fs,
            dirs: [Ino::ROOT, d.ino],
            inos: HashMap::new(),
            handles: Vec::new(),
        },
        targets,
        ops: 0,
    };
    for _ in 0..ops {
        run.step();
    }
    run.verify_all();
    run.sut.handles.clear();
    run.sut.fs.unmount().expect("unmount");
    let report = stripefs::fsck::fsck(dyns(&run.targets), &mut |_| {}).expect("fsck");
    assert!(
        report.is_clean(),
        "fsck after model run ({}): {:?}",
        run.cfg,
        report.problems
    );
    run.ops
}

fn ops_per_config() -> u64 {
    std::env::var("STRIPEFS_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

macro_rules! model_case {
    ($name:ident, $count:expr, $bs:expr) => {
        #[test]
        fn $name() {
            let ops = ops_per_config();
            for seed in [1u64, 2] {
                run_model(
                    $count,
                    $bs,
                    seed ^ ($count as u64) << 8 ^ ($bs as u64) << 16,
                    ops,
                );
            }
        }
    };
}

model_case!(stripes1_bs1k, 1, 1024);
model_case!(stripes1_bs4k, 1, 4096);
model_case!(stripes1_bs64k, 1, 65536);
model_case!(stripes3_bs1k, 3, 1024);
model_case!(stripes3_bs4k, 3, 4096);
model_case!(stripes3_bs64k, 3, 65536);
model_case!(stripes8_bs1k, 8, 1024);
model_case!(stripes8_bs4k, 8, 4096);
model_case!(stripes8_bs64k, 8, 65536);

//! The decoded inodes in core are a bounded cache over the metadata trees
//! (`docs/design/metadata.md`, "Stage 2"): past the bound (`-o inode_cache`), inodes whose
//! every change the trees hold leave core and are read back on their next use; a freed
//! inode is remembered as absent until the trees drop it too.
mod common;

use common::*;
use stripefs::{CreateParams, Fs, FsError, Ino, InodeBound, MkfsOptions, MountOptions, XattrMode};

const BOUND: usize = 64;
const CACHE: u64 = 256 << 10;
/// What may pin inodes in core at once here: a cached folio each (every file is smaller
/// than one 4 KiB folio), the files changed since the last checkpoint (16), the five
/// directories and the file being worked on.
const PINNED_MAX: usize = (CACHE / 4096) as usize + 16 + 5 + 1;
/// A sweep runs past the bound and again past twice what the last one kept.
const PEAK_MAX: usize = 2 * if BOUND > PINNED_MAX {
    BOUND
} else {
    PINNED_MAX
} + 1;

fn options() -> MountOptions {
    let mut o = quiet();
    o.inode_cache = Some(InodeBound(BOUND));
    // A small page cache, so that cached data does not pin every file in core.
    o.cache.folio_bytes = 4096;
    o.cache.budget_bytes = CACHE;
    o.cache.dirty_limit_bytes = 64 << 10;
    o
}

fn mkfs(s: &[std::sync::Arc<stripefs_target::SimTarget>]) {
    let m = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(s), &m).unwrap();
}

fn name(n: u64) -> String {
    format!("f{n}")
}

/// Every file: its size, first bytes and xattr, as written. Reads change access times
/// (`relatime`), so a checkpoint every 16 files lets them leave core again.
fn check_all(fs: &Fs, dirs: &[Ino], files: u64) {
    for n in 0..files {
        let d = dirs[(n % dirs.len() as u64) as usize];
        let a = fs.lookup(d, name(n).as_ref()).unwrap();
        assert_eq!(a.size, 100 + n, "file {n} size");
        let mut buf = vec![0u8; a.size as usize];
        assert_eq!(fs.read_at(a.ino, 0, &mut buf).unwrap(), buf.len());
        assert!(buf == pattern(n, 0, buf.len()), "file {n} reads back");
        let x = fs.getxattr(a.ino, "user.n".as_ref()).unwrap();
        assert_eq!(x, n.to_le_bytes(), "file {n} xattr");
        if n % 16 == 15 {
            fs.checkpoint().unwrap();
        }
    }
}

#[test]
fn many_files_stay_correct_with_a_small_inode_bound() {
    let s = sims(2, 64 << 20);
    mkfs(&s);
    let fs = Fs::mount(dyns(&s), options()).unwrap().0;
    let dirs: Vec<Ino> = (0..4)
        .map(|d| {
            let n = format!("d{d}");
            fs.mkdir(Ino::ROOT, n.as_ref(), CreateParams::with_perm(0o755))
                .unwrap()
                .ino
        })
        .collect();
    let files = 3000u64;
    let mut peak = 0;
    for n in 0..files {
        let d = dirs[(n % 4) as usize];
        let a = fs
            .create(d, name(n).as_ref(), CreateParams::with_perm(0o644))
            .unwrap();
        fs.write_at(a.ino, 0, &pattern(n, 0, 100 + n as usize))
            .unwrap();
        fs.setxattr(a.ino, "user.n".as_ref(), &n.to_le_bytes(), XattrMode::Any)
            .unwrap();
        if n % 16 == 15 {
            // Applies the journal to the trees: what was changed may leave core.
            fs.checkpoint().unwrap();
        }
        peak = peak.max(fs.status().meta_inodes);
    }
    let st = fs.status();
    eprintln!(
        "{files} files, bound {BOUND}: in core now {}, peak {} (sampled {peak}), read back {}, evicted {}",
        st.meta_inodes, st.meta_inodes_peak, st.meta_inode_loads, st.meta_inodes_evicted
    );
    assert!(
        st.meta_inodes_peak <= PEAK_MAX,
        "{} inodes in core at once, bound {BOUND}, at most {PINNED_MAX} pinned",
        st.meta_inodes_peak
    );
    assert!(st.meta_inodes_evicted > files / 2);
    check_all(&fs, &dirs, files);
    let st = fs.status();
    assert!(st.meta_inode_loads > files / 2, "{st:?}");
    assert!(st.meta_inodes_peak <= PEAK_MAX, "{st:?}");
    assert_eq!(st.inodes, files + 5);
    fs.unmount().unwrap();
    let fs = Fs::mount(dyns(&s), options()).unwrap().0;
    // The mount reads no inode: they come from the trees on first use.
    let st = fs.status();
    assert_eq!((st.meta_inodes_peak, st.meta_inode_loads), (0, 0), "{st:?}");
    assert_eq!(st.inodes, files + 5);
    check_all(&fs, &dirs, files);
    assert!(fs.status().meta_inodes_peak <= PEAK_MAX);
    assert_eq!(fs.status().inodes, files + 5);
    fs.unmount().unwrap();
    let report = stripefs::fsck::fsck(dyns(&s), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A freed inode whose `InodeFree` the trees do not have yet must stay gone: the trees'
/// copy is stale, and reading it back would bring the file back to life.
#[test]
fn a_freed_inode_does_not_come_back_from_the_trees() {
    let s = sims(2, 64 << 20);
    mkfs(&s);
    let fs = Fs::mount(dyns(&s), options()).unwrap().0;
    let a = fs
        .create(Ino::ROOT, "victim".as_ref(), CreateParams::with_perm(0o644))
        .unwrap();
    fs.write_at(a.ino, 0, b"old bytes").unwrap();
    // The trees hold the file.
    fs.checkpoint().unwrap();
    fs.unlink(Ino::ROOT, "victim".as_ref()).unwrap();
    // Freed in core only: the running transaction holds the `InodeFree`.
    for probe in 0..2 {
        match fs.getattr(a.ino) {
            Err(FsError::Stale(_)) => {}
            other => panic!("probe {probe}: freed inode {} came back: {other:?}", a.ino),
        }
        assert!(matches!(fs.by_handle(a.ino), Err(FsError::Stale(_))));
        fs.debug_evict_inodes();
    }
    fs.checkpoint().unwrap();
    assert!(matches!(fs.getattr(a.ino), Err(FsError::Stale(_))));
    fs.unmount().unwrap();
}

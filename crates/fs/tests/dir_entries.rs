//! Directory entries in the mount (issue 11, metadata.md "Directory entries"): a name is
//! looked up in the trees, not in a directory loaded whole, so one lookup, create, unlink
//! or emptiness check in a large directory reads a few pages and holds no entry in core;
//! readdir resumes from a cookie and returns every entry present throughout exactly once
//! while entries are created, removed and renamed, and while the checkpointer moves them
//! from the in-core overlay to the trees.
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::*;
use stripefs::{
    CreateParams, DirCookie, Fs, FsError, Ino, InodeBound, MetaCacheBytes, MkfsOptions,
    MountOptions, RenameMode,
};
use stripefs_target::SimTarget;

fn mkfs(s: &[Arc<SimTarget>]) {
    let m = MkfsOptions {
        block_size: 4096,
        stripe_unit: 16384,
        ..MkfsOptions::default()
    };
    Fs::mkfs(&dyns(s), &m).unwrap();
}

/// The smallest metadata cache (64 pages) and a small in-core inode bound.
fn small_cache() -> MountOptions {
    let mut o = quiet();
    o.meta_cache = MetaCacheBytes(MetaCacheBytes::MIN_PAGES * 4096);
    o.inode_cache = Some(InodeBound(1024));
    o
}

fn p() -> CreateParams {
    CreateParams::with_perm(0o644)
}

/// Page reads of the metadata trees since mount.
fn misses(fs: &Fs) -> u64 {
    fs.status().meta_cache.misses
}

/// Runs `f` and returns how many tree pages it read.
fn reads<T>(fs: &Fs, f: impl FnOnce() -> T) -> (T, u64) {
    let before = misses(fs);
    let r = f();
    (r, misses(fs) - before)
}

/// Entries in the big directory.
const BIG: u64 = 200_000;
/// Page reads one name's operation may take: two or three root-to-leaf paths (the entry's
/// name hash, the highest cookie, the inode) of a tree four or five levels deep, never
/// the directory (`BIG` entries are two items each: thousands of leaves).
const NAME_READS: u64 = 16;

#[test]
fn one_name_in_a_large_directory_reads_a_few_pages_and_holds_no_entry() {
    let s = sims(1, 256 << 20);
    mkfs(&s);
    // Filled with the default cache (quicker), measured with the smallest after remount.
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "big".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let sub = fs
        .mkdir(d, "sub".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    for n in 0..BIG {
        fs.mknod(d, format!("f{n}").as_ref(), stripefs::FileKind::Fifo, p())
            .unwrap();
    }
    let st = fs.status();
    assert!(
        st.dir_overlay_names < 20_000,
        "overlay holds {} names after {BIG} creates: applied ones are dropped",
        st.dir_overlay_names
    );
    fs.unmount().unwrap();

    let fs = Fs::mount(dyns(&s), small_cache()).unwrap().0;
    // The directory's own inode (its attributes, not its entries).
    let (a, r) = reads(&fs, || fs.getattr(d).unwrap());
    assert_eq!(a.nlink, 3);
    assert!(r <= NAME_READS, "getattr of the directory read {r} pages");

    let (a, r) = reads(&fs, || fs.lookup(d, "f123457".as_ref()).unwrap());
    assert_eq!(a.kind, stripefs::FileKind::Fifo);
    assert!(
        r <= NAME_READS,
        "lookup read {r} pages in a directory of {BIG}"
    );

    let (e, r) = reads(&fs, || fs.lookup(d, "absent".as_ref()).unwrap_err());
    assert!(matches!(e, FsError::NotFound), "{e}");
    assert!(r <= NAME_READS, "a failed lookup read {r} pages");

    let (e, r) = reads(&fs, || {
        fs.mknod(d, "f99".as_ref(), stripefs::FileKind::Fifo, p())
    });
    assert!(matches!(e, Err(FsError::Exists)), "{e:?}");
    assert!(r <= NAME_READS, "create of an existing name read {r} pages");

    let (_, r) = reads(&fs, || {
        fs.mknod(d, "new".as_ref(), stripefs::FileKind::Fifo, p())
            .unwrap()
    });
    assert!(r <= NAME_READS, "create read {r} pages");

    let (_, r) = reads(&fs, || fs.unlink(d, "f777".as_ref()).unwrap());
    assert!(r <= NAME_READS, "unlink read {r} pages");

    let (e, r) = reads(&fs, || fs.rmdir(Ino::ROOT, "big".as_ref()).unwrap_err());
    assert!(matches!(e, FsError::NotEmpty), "{e}");
    assert!(r <= NAME_READS, "rmdir of a full directory read {r} pages");

    let (_, r) = reads(&fs, || {
        fs.rename(d, "f5".as_ref(), d, "f6".as_ref(), RenameMode::Replace)
            .unwrap();
    });
    assert!(r <= 2 * NAME_READS, "rename over an entry read {r} pages");

    let (page, r) = reads(&fs, || fs.readdir_from(d, DirCookie::START, 10).unwrap());
    assert_eq!(page.len(), 10);
    assert!(r <= NAME_READS, "the first readdir page read {r} pages");
    let (next, r) = reads(&fs, || fs.readdir_from(d, page[9].cookie, 10).unwrap());
    assert!(next[0].cookie > page[9].cookie);
    assert!(r <= NAME_READS, "a resumed readdir page read {r} pages");

    // Nothing of the directory is held in core but what the operations changed.
    let st = fs.status();
    assert!(
        st.dir_overlay_names <= 8,
        "{} names in core",
        st.dir_overlay_names
    );
    assert!(
        st.meta_inodes < 64,
        "{} decoded inodes in core",
        st.meta_inodes
    );
    // The subdirectory is empty: rmdir checks without listing the parent.
    let (_, r) = reads(&fs, || fs.rmdir(d, "sub".as_ref()).unwrap());
    assert!(r <= 2 * NAME_READS, "rmdir read {r} pages");
    assert!(matches!(fs.getattr(sub), Err(FsError::Stale(_))));
    assert_eq!(
        fs.getattr(d).unwrap().nlink,
        2,
        "the subdirectory's link is gone"
    );
    fs.unmount().unwrap();
    let fs = Fs::mount(dyns(&s), small_cache()).unwrap().0;
    assert!(fs.lookup(d, "new".as_ref()).is_ok());
    assert!(matches!(
        fs.lookup(d, "f777".as_ref()),
        Err(FsError::NotFound)
    ));
    assert!(matches!(
        fs.lookup(d, "f5".as_ref()),
        Err(FsError::NotFound)
    ));
    assert!(fs.lookup(d, "f6".as_ref()).is_ok());
    fs.unmount().unwrap();
}

/// Lists `d` page by page, calling `between` after each page; returns every entry listed
/// (name, cookie), in order.
fn list_paged(fs: &Fs, d: Ino, page: usize, mut between: impl FnMut(usize)) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut at = DirCookie::START;
    for i in 0.. {
        let got = fs.readdir_from(d, at, page).unwrap();
        let Some(last) = got.last() else {
            break;
        };
        at = last.cookie;
        out.extend(got.into_iter().map(|e| (e.name, e.cookie.0)));
        between(i);
    }
    out
}

/// Every stable name exactly once, no name twice, cookies strictly increasing.
fn check_listing(listed: &[(Vec<u8>, u64)], stable: &BTreeSet<Vec<u8>>) {
    let mut seen = BTreeMap::new();
    for w in listed.windows(2) {
        assert!(w[0].1 < w[1].1, "cookies out of order: {w:?}");
    }
    for (n, c) in listed {
        if let Some(old) = seen.insert(n.clone(), *c) {
            panic!(
                "{:?} listed twice, at cookies {old} and {c}",
                String::from_utf8_lossy(n)
            );
        }
    }
    for n in stable {
        assert!(
            seen.contains_key(n),
            "{:?} was present throughout but not listed",
            String::from_utf8_lossy(n)
        );
    }
}

/// A deterministic PRNG (xorshift).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn paged_readdir_returns_each_entry_present_throughout_exactly_once() {
    let s = sims(1, 128 << 20);
    mkfs(&s);
    let fs = Fs::mount(dyns(&s), small_cache()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let mut stable = BTreeSet::new();
    let mut volatile: Vec<String> = Vec::new();
    for n in 0..3000 {
        let name = format!("s{n}");
        fs.create(d, name.as_ref(), p()).unwrap();
        if n % 3 == 0 {
            volatile.push(name);
        } else {
            stable.insert(name.into_bytes());
        }
    }
    // Half the entries in the trees, half in the overlay when the listing starts.
    fs.checkpoint().unwrap();
    for n in 0..500 {
        let name = format!("late{n}");
        fs.create(d, name.as_ref(), p()).unwrap();
        stable.insert(name.into_bytes());
    }
    let mut rng = Rng(0x5eed);
    let mut fresh = 0u64;
    let listed = list_paged(&fs, d, 37, |i| {
        for _ in 0..8 {
            match rng.below(4) {
                0 => {
                    fresh += 1;
                    let name = format!("new{fresh}");
                    fs.create(d, name.as_ref(), p()).unwrap();
                    volatile.push(name);
                }
                1 if !volatile.is_empty() => {
                    let v = volatile.swap_remove(rng.below(volatile.len() as u64) as usize);
                    fs.unlink(d, v.as_ref()).unwrap();
                }
                2 if volatile.len() >= 2 => {
                    // Rename one volatile entry over another: the target keeps its cookie.
                    let a = volatile.swap_remove(rng.below(volatile.len() as u64) as usize);
                    let b = &volatile[rng.below(volatile.len() as u64) as usize];
                    fs.rename(d, a.as_ref(), d, b.as_ref(), RenameMode::Replace)
                        .unwrap();
                }
                _ => {
                    fresh += 1;
                    let name = format!("moved{fresh}");
                    let v = volatile.swap_remove(rng.below(volatile.len() as u64) as usize);
                    fs.rename(d, v.as_ref(), d, name.as_ref(), RenameMode::Replace)
                        .unwrap();
                    volatile.push(name);
                }
            }
        }
        // Move the overlay's entries into the trees now and then, mid-listing.
        if i % 5 == 4 {
            fs.checkpoint().unwrap();
        }
    });
    check_listing(&listed, &stable);
    // And the final listing is the directory: every name present, once.
    let now: BTreeSet<Vec<u8>> = list_paged(&fs, d, 100, |_| {})
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let expect: BTreeSet<Vec<u8>> = stable
        .iter()
        .cloned()
        .chain(volatile.iter().map(|v| v.clone().into_bytes()))
        .collect();
    assert_eq!(now, expect);
    fs.unmount().unwrap();
}

#[test]
fn paged_readdir_is_stable_against_another_thread_changing_the_directory() {
    let s = sims(1, 128 << 20);
    mkfs(&s);
    let mut o = small_cache();
    o.checkpoints = stripefs::Checkpoints::Background;
    let fs = Arc::new(Fs::mount(dyns(&s), o).unwrap().0);
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let mut stable = BTreeSet::new();
    for n in 0..2000 {
        let name = format!("s{n}");
        fs.create(d, name.as_ref(), p()).unwrap();
        stable.insert(name.into_bytes());
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (fs, stop) = (Arc::clone(&fs), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            // Bounded: the directory grows by one entry per two turns, and a thread left
            // to run as long as a loaded machine takes to list filled the 128 MiB target
            // (`NoSpace`, "no room for more metadata").
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 20_000 {
                let a = format!("c{n}");
                fs.create(d, a.as_ref(), p()).unwrap();
                if n % 2 == 1 {
                    let b = format!("c{}", n - 1);
                    fs.unlink(d, b.as_ref()).unwrap();
                }
                if n.is_multiple_of(64) {
                    fs.checkpoint().unwrap();
                }
                n += 1;
            }
            n
        })
    };
    let mut rounds = 0;
    for _ in 0..5 {
        let listed = list_paged(&fs, d, 16, |_| std::thread::yield_now());
        check_listing(&listed, &stable);
        rounds += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let changes = churn.join().unwrap();
    assert_eq!(rounds, 5);
    assert!(changes > 0, "the other thread changed nothing");
    fs.unmount().unwrap();
}

#[test]
fn cookies_given_in_core_are_the_cookies_the_trees_give() {
    let s = sims(1, 64 << 20);
    mkfs(&s);
    let fs = Fs::mount(dyns(&s), small_cache()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    for n in 0..50 {
        fs.create(d, format!("a{n}").as_ref(), p()).unwrap();
    }
    fs.checkpoint().unwrap();
    // Unapplied: remove the entries with the highest cookies (in the trees), add names
    // whose cookies must reuse them, remove one of those again, replace another by rename.
    for n in 45..50 {
        fs.unlink(d, format!("a{n}").as_ref()).unwrap();
    }
    for n in 0..6 {
        fs.create(d, format!("b{n}").as_ref(), p()).unwrap();
    }
    fs.unlink(d, "b5".as_ref()).unwrap();
    fs.unlink(d, "b2".as_ref()).unwrap();
    fs.create(d, "c".as_ref(), p()).unwrap();
    fs.rename(d, "a3".as_ref(), d, "b1".as_ref(), RenameMode::Replace)
        .unwrap();
    let cookies =
        |fs: &Fs| -> BTreeMap<Vec<u8>, u64> { list_paged(fs, d, 7, |_| {}).into_iter().collect() };
    let in_core = cookies(&fs);
    assert!(fs.status().dir_overlay_names > 0);
    fs.checkpoint().unwrap();
    // Releasing the metadata lock drops what the trees now hold: the listing below
    // reads the trees' cookies.
    let _ = fs.lookup(d, "c".as_ref());
    assert_eq!(fs.status().dir_overlay_names, 0);
    let applied = cookies(&fs);
    assert_eq!(
        in_core, applied,
        "cookies changed when the trees took the entries"
    );
    fs.unmount().unwrap();
    let fs = Fs::mount(dyns(&s), small_cache()).unwrap().0;
    assert_eq!(cookies(&fs), applied, "cookies after remount");
    fs.unmount().unwrap();
}

/// A readdir page is read from the trees without the metadata lock, and merged with the
/// overlay of unapplied changes under it: a read that raced the checkpointer moving a
/// change from the overlay into the trees is discarded. Here "e0" is unlinked and created
/// again (a new cookie, at the end) by records not yet applied; the listing's read is
/// held at the device after it has read the leaf with e0's old cookie item, while the
/// checkpoint applies both records (the old item leaves, the new one enters the trees,
/// the overlay forgets e0). Merged with the overlay as it is after the read, the old item
/// would list e0 a second time; every entry present throughout must be listed once.
#[test]
fn a_readdir_page_read_racing_creates_unlinks_and_their_apply_lists_each_entry_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;
    use stripefs_target::{GateTarget, IoOp, Target};

    const N: usize = 1000;
    let s = sims(1, 128 << 20);
    mkfs(&s);
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    for n in 0..N {
        fs.create(d, format!("e{n}").as_ref(), p()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let image = s[0].live_image();
    let mount = |gate: &Arc<GateTarget>| {
        let fs = Fs::mount(vec![Arc::clone(gate) as Arc<dyn Target>], quiet())
            .unwrap()
            .0;
        // Records the trees do not have yet: e0's cookie item moves to the end.
        fs.unlink(d, "e0".as_ref()).unwrap();
        fs.create(d, "e0".as_ref(), p()).unwrap();
        fs
    };
    // The page reads a cold listing makes, in order (a dry run on an identical mount):
    // hold the last, by then the leaf of e0's old cookie item has been read.
    let fresh = || {
        let sim = SimTarget::from_image("sim0", image.clone(), 512);
        Arc::new(GateTarget::new(Arc::new(sim) as Arc<dyn Target>))
    };
    let last_read = {
        let gate = fresh();
        let fs = mount(&gate);
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let rec = Arc::clone(&seen);
        gate.hold_next(move |op| {
            if let IoOp::Read { offset, .. } = op {
                rec.lock().push(*offset);
            }
            false
        });
        assert_eq!(
            fs.readdir_from(d, DirCookie::START, 2 * N).unwrap().len(),
            N
        );
        gate.release();
        fs.unmount().unwrap();
        let seen = seen.lock();
        assert!(
            seen.len() >= 2,
            "the listing reads several leaves: {seen:?}"
        );
        *seen.last().unwrap()
    };
    let gate = fresh();
    let fs = Arc::new(mount(&gate));
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    gate.hold_next(move |op| {
        let hit = matches!(op, IoOp::Read { offset, .. } if *offset == last_read);
        hit && count.fetch_add(1, Ordering::Relaxed) == 0
    });
    let reader = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || fs.readdir_from(d, DirCookie::START, 2 * N))
    };
    assert!(
        gate.wait_held(Duration::from_secs(60)),
        "the listing's last page read was held"
    );
    let stale_before = fs.status().meta_inode_stale_reads;
    let (tx, rx) = mpsc::channel();
    let checkpointer = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || tx.send(fs.checkpoint()).unwrap())
    };
    let applied = rx.recv_timeout(Duration::from_secs(30));
    gate.release();
    applied
        .expect("the checkpoint completed while the listing's read was held")
        .unwrap();
    let listed: Vec<(Vec<u8>, u64)> = reader
        .join()
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.cookie.0))
        .collect();
    let all: BTreeSet<Vec<u8>> = (0..N).map(|n| format!("e{n}").into_bytes()).collect();
    check_listing(&listed, &all);
    assert_eq!(listed.len(), N);
    assert!(
        fs.status().meta_inode_stale_reads > stale_before,
        "the raced read was discarded"
    );
    checkpointer.join().unwrap();
    Arc::try_unwrap(fs).unwrap().unmount().unwrap();
}

/// A lookup reads a name's entry items from the trees without the metadata lock: while
/// its page read is held at the device, other calls run (the stat of the directory, a
/// create in it), and the lookup then answers as the trees and the overlay say.
#[test]
fn a_lookup_held_in_its_entry_read_does_not_stall_other_calls() {
    use std::sync::mpsc;
    use std::time::Duration;
    use stripefs_target::{GateTarget, IoOp, Target};

    let s = sims(1, 128 << 20);
    mkfs(&s);
    let fs = Fs::mount(dyns(&s), quiet()).unwrap().0;
    let d = fs
        .mkdir(Ino::ROOT, "d".as_ref(), CreateParams::with_perm(0o755))
        .unwrap()
        .ino;
    let mut inos = Vec::new();
    for n in 0..2000 {
        inos.push(fs.create(d, format!("e{n}").as_ref(), p()).unwrap().ino);
    }
    fs.unmount().unwrap();
    drop(fs);
    let gate = Arc::new(GateTarget::new(Arc::clone(&s[0]) as Arc<dyn Target>));
    let fs = Arc::new(
        Fs::mount(vec![Arc::clone(&gate) as Arc<dyn Target>], quiet())
            .unwrap()
            .0,
    );
    // The directory in core: the lookup's first read is of the name's entry items.
    fs.getattr(d).unwrap();
    gate.hold_next(|op| matches!(op, IoOp::Read { .. }));
    let reader = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || fs.lookup(d, "e1234".as_ref()).map(|a| a.ino))
    };
    assert!(
        gate.wait_held(Duration::from_secs(60)),
        "the lookup's entry read was held"
    );
    let (tx, rx) = mpsc::channel();
    let other_thread = {
        let fs = Arc::clone(&fs);
        std::thread::spawn(move || {
            let r = fs
                .getattr(d)
                .and_then(|_| fs.create(d, "late".as_ref(), p()))
                .map(|a| a.ino);
            tx.send(r).unwrap();
        })
    };
    let other = rx.recv_timeout(Duration::from_secs(20));
    gate.release();
    let late = other
        .expect("another call waited for the metadata lock while a lookup's read was held")
        .unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), inos[1234]);
    assert_eq!(fs.lookup(d, "late".as_ref()).unwrap().ino, late);
    other_thread.join().unwrap();
    Arc::try_unwrap(fs).unwrap().unmount().unwrap();
}

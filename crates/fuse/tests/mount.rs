//! Mounts stripefs through the kernel's FUSE and drives it with ordinary system calls.
//! Needs root and `/dev/fuse` (CI has both; see the README).

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use stripefs::{Fs, MkfsOptions, MountOptions};
use stripefs_fuse::{serve, Mounted, Op, ServeOptions, Transport, TransportChoice};
use stripefs_target::Target;

mod common;
use common::{enable_fuse_uring, file_targets, serve_options, Aligned};

struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("stripefs-fuse-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("mnt")).unwrap();
        Self { dir }
    }

    fn targets(&self) -> Vec<Arc<dyn Target>> {
        file_targets(&self.dir, 3, 64 << 20)
    }

    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// mkfs, mount and serve at [`Scratch::mnt`] with the default options.
    fn serve(&self) -> (Arc<Fs>, Mounted) {
        self.serve_with(MountOptions::default())
    }

    /// mkfs, mount with `opts` and serve at [`Scratch::mnt`].
    fn serve_with(&self, opts: MountOptions) -> (Arc<Fs>, Mounted) {
        Fs::mkfs(&self.targets(), &MkfsOptions::default()).unwrap();
        let (fs, _) = Fs::mount(self.targets(), opts).unwrap();
        let fs = Arc::new(fs);
        let m = serve(fs.clone(), &self.mnt(), &serve_options()).unwrap();
        (fs, m)
    }
}

/// Unmounts the FUSE session, then the engine.
fn finish(m: Mounted, fs: Arc<Fs>) {
    unmount_retrying(&m.unmounter());
    m.join().unwrap();
    Arc::into_inner(fs).unwrap().unmount().unwrap();
}

/// Unmounts, retrying `EBUSY` for up to 2 s: the kernel may drop a file closed by an
/// io_uring worker a moment after the close (deferred `fput`), and a child another test
/// thread is forking holds copies of this process's descriptors until it execs.
fn unmount_retrying(u: &stripefs_fuse::Unmounter) {
    let mut tries = 0;
    loop {
        match u.unmount() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let m = CString::new(self.mnt().as_os_str().as_bytes()).unwrap();
        // SAFETY: `m` is a valid C string; a lazy unmount of a path we own.
        unsafe { libc::umount2(m.as_ptr(), libc::MNT_DETACH) };
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn namespace_data_and_direct_io_through_the_kernel() {
    let s = Scratch::new("ops");
    let (fs, m) = s.serve();
    let mnt = s.mnt();
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(mnt.to_str().unwrap()))
        .expect("the mount point is in /proc/self/mounts");
    assert!(
        line.starts_with("stripefs ") && line.contains(" fuse "),
        "{line}"
    );

    // Buffered data, a directory, rename, links.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::create_dir(mnt.join("d")).unwrap();
    fs::write(mnt.join("d/a"), &data).unwrap();
    assert_eq!(fs::read(mnt.join("d/a")).unwrap(), data);
    // O_TRUNC of an existing file (FUSE_ATOMIC_O_TRUNC leaves it to the daemon).
    fs::write(mnt.join("d/t"), b"old contents").unwrap();
    fs::write(mnt.join("d/t"), b"new").unwrap();
    assert_eq!(fs::read(mnt.join("d/t")).unwrap(), b"new");
    fs::remove_file(mnt.join("d/t")).unwrap();
    fs::rename(mnt.join("d/a"), mnt.join("b")).unwrap();
    fs::hard_link(mnt.join("b"), mnt.join("d/b2")).unwrap();
    std::os::unix::fs::symlink("b", mnt.join("s")).unwrap();
    assert_eq!(fs::read_link(mnt.join("s")).unwrap(), Path::new("b"));
    assert_eq!(fs::metadata(mnt.join("b")).unwrap().nlink(), 2);
    let mut names: Vec<_> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "d", "s"]);
    fs::File::open(mnt.join("d")).unwrap().sync_all().unwrap(); // FUSE_FSYNCDIR
    assert_eq!(
        fs::remove_dir(mnt.join("d")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );

    // st_blocks follows allocation.
    let md = fs::metadata(mnt.join("b")).unwrap();
    assert_eq!(md.len(), data.len() as u64);
    assert!(md.blocks() * 512 >= data.len() as u64, "{}", md.blocks());

    // Unlinked but open: readable until the last close.
    let mut f = fs::File::open(mnt.join("b")).unwrap();
    fs::remove_file(mnt.join("b")).unwrap();
    fs::remove_file(mnt.join("d/b2")).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
    drop(f);

    // Extended attributes.
    let p = cpath(&mnt.join("d"));
    let (name, val) = (c"user.k", b"value");
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), val.as_ptr().cast(), val.len(), 0) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let mut buf = [0u8; 16];
    // SAFETY: as above.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(&buf[..usize::try_from(n).unwrap()], val);

    // fallocate, punch, SEEK_DATA / SEEK_HOLE.
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("sparse"))
        .unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: fd is open for writing.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 1 << 20) }, 0);
    f.write_all_at(&[0xab; 65536], 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fallocate(fd, punch, 0, 1 << 20) }, 0);
    // SAFETY: as above.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 65536) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );
    f.write_all_at(b"tail", 700_000).unwrap();
    // SAFETY: as above.
    let data_at = unsafe { libc::lseek(fd, 0, libc::SEEK_DATA) };
    assert!(data_at > 0 && data_at <= 700_000, "{data_at}");
    // SAFETY: as above.
    let hole_at = unsafe { libc::lseek(fd, data_at, libc::SEEK_HOLE) };
    assert!(hole_at > 700_000, "{hole_at}");
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut head = [1u8; 4096];
    f.read_exact(&mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0));
    f.sync_all().unwrap();
    drop(f);

    // O_DIRECT, including a 2 KiB overwrite inside a written block.
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("direct"))
        .unwrap();
    f.write_all(Aligned::new(1 << 20, 0x5a).buf()).unwrap();
    f.write_all_at(Aligned::new(2048, 0xc3).buf(), 8192 + 2048)
        .unwrap();
    let mut r = Aligned::new(16384, 0);
    f.read_exact_at(r.buf(), 0).unwrap();
    let got = r.buf();
    assert!(got[..10240].iter().all(|&b| b == 0x5a));
    assert!(got[10240..12288].iter().all(|&b| b == 0xc3));
    assert!(got[12288..].iter().all(|&b| b == 0x5a));
    f.sync_all().unwrap();
    drop(f);
    let mut f = fs::File::create(mnt.join("late")).unwrap();
    f.write_all(b"written, never fsynced: the clean unmount keeps it")
        .unwrap();
    drop(f);

    // statfs.
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-parameter.
    assert_eq!(unsafe { libc::statvfs(cpath(&mnt).as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bfree <= st.f_blocks);
    // f_bavail is what a default-layout file can get: target 0 holds the journal and
    // checkpoints, so less than the total free (decision 28).
    assert!(
        st.f_bavail > 0 && st.f_bavail < st.f_bfree,
        "f_bavail {} f_bfree {}",
        st.f_bavail,
        st.f_bfree
    );

    // Retrying EBUSY: other tests fork children (see `unmount_retrying`).
    unmount_retrying(&m.unmounter());
    m.join().unwrap();
    fs.unmount().unwrap();
    drop(fs);

    // Everything is on the targets: the library sees it, fsck is clean.
    let r = stripefs::fsck::fsck(s.targets(), &mut |_| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    let (fs, _) = Fs::mount(s.targets(), MountOptions::default()).unwrap();
    let d = fs.lookup(stripefs::Ino::ROOT, "direct".as_ref()).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(fs.read_at(d.ino, 0, &mut buf).unwrap(), 1 << 20);
    assert!(buf[10240..12288].iter().all(|&b| b == 0xc3));
    let l = fs.lookup(stripefs::Ino::ROOT, "late".as_ref()).unwrap();
    assert!(l.size > 0);
    fs.unmount().unwrap();
}

/// Runs `script` with `sh -c` as the unprivileged user `nobody` (uid and gid 65534).
fn as_nobody(script: &str) {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "{script}: {out:?}");
}

/// Each way a change drops set-ID bits, done in `dir`; returns the modes left.
fn set_id_scenario(dir: &Path) -> Vec<(&'static str, u32)> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let cases: [(&str, u32, Option<u32>); 13] = [
        ("append", 0o6777, None),
        ("append-sgid-other-group", 0o2767, None),
        ("append-sgid-own-group", 0o2767, Some(65534)),
        ("append-root", 0o6777, None),
        ("truncate", 0o6777, None),
        ("open-trunc", 0o6777, None),
        ("direct", 0o6777, None),
        ("chown", 0o6755, None),
        ("chown-dir", 0o2755, None),
        ("fallocate", 0o6777, None),
        ("fallocate-root", 0o6777, None),
        ("chown-neither", 0o6755, None),
        ("utimens-omit", 0o6755, None),
    ];
    let mut modes = Vec::new();
    for (name, mode, group) in cases {
        let p = dir.join(name);
        if name == "chown-dir" {
            fs::create_dir(&p).unwrap();
        } else {
            fs::write(&p, vec![7u8; 8192]).unwrap();
        }
        chown(&p, Some(0), group.or(Some(0))).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        let q = p.display();
        match name {
            "append-root" => {
                let mut f = OpenOptions::new().append(true).open(&p).unwrap();
                f.write_all(b"x").unwrap();
            }
            "truncate" => as_nobody(&format!("truncate -s 100 '{q}'")),
            "open-trunc" => as_nobody(&format!(": > '{q}'")),
            "direct" => as_nobody(&format!(
                "dd if=/dev/zero of='{q}' bs=4096 count=1 oflag=direct conv=notrunc status=none"
            )),
            "chown" | "chown-dir" => chown(&p, Some(65534), Some(65534)).unwrap(),
            "chown-neither" => chown(&p, None, None).unwrap(),
            "utimens-omit" => {
                let omit = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                };
                let c = cpath(&p);
                // SAFETY: a valid C path and two timespecs.
                let r = unsafe {
                    libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [omit, omit].as_ptr(), 0)
                };
                assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            }
            "fallocate" => as_nobody(&format!("fallocate -l 65536 '{q}'")),
            "fallocate-root" => {
                let f = OpenOptions::new().write(true).open(&p).unwrap();
                // SAFETY: plain system call on an open file.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 65536) };
                assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            }
            _ => as_nobody(&format!("printf x >> '{q}'")),
        }
        modes.push((name, fs::metadata(&p).unwrap().mode() & 0o7777));
    }
    modes
}

/// FUSE_HANDLE_KILLPRIV_V2 leaves set-ID bits to the server: writes, truncates and
/// chowns through the mount must leave exactly the modes a local file system leaves.
#[test]
fn set_id_bits_drop_as_on_a_local_file_system() {
    let s = Scratch::new("setid");
    let local = s.dir.join("local");
    fs::create_dir(&local).unwrap();
    let expected = set_id_scenario(&local);
    // The oracle itself: a writer without CAP_FSETID loses set-user-ID.
    assert_eq!(expected[0], ("append", 0o777), "{expected:?}");
    let (fs, m) = s.serve();
    let got = set_id_scenario(&s.mnt());
    finish(m, fs);
    assert_eq!(got, expected);
}

/// A target whose writes complete 20 ms late, counting how many are in flight at once.
#[derive(Debug)]
struct SlowWrites {
    inner: Arc<dyn Target>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

impl Target for SlowWrites {
    fn info(&self) -> &stripefs_target::TargetInfo {
        self.inner.info()
    }

    fn submit(&self, op: stripefs_target::IoOp, done: stripefs_target::Completion) {
        use std::sync::atomic::Ordering::SeqCst;
        if !matches!(op, stripefs_target::IoOp::Write { .. }) {
            return self.inner.submit(op, done);
        }
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        let (inner, count) = (Arc::clone(&self.inner), Arc::clone(&self.in_flight));
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            inner.submit(
                op,
                Box::new(move |d| {
                    count.fetch_sub(1, SeqCst);
                    done(d);
                }),
            );
        });
    }
}

/// A program at queue depth 64 gets its 64 direct writes to the targets at once: the
/// kernel's `max_background` and the daemon's worker count must not cap it (fuser's
/// default `max_background` of 16 did, with a worker parked per request).
#[test]
fn queue_depth_64_reaches_the_targets() {
    use io_uring::{opcode, types, IoUring};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let s = Scratch::new("qd");
    Fs::mkfs(&s.targets(), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(s.targets(), MountOptions::default()).unwrap();
    let f = fs
        .create(
            stripefs::Ino::ROOT,
            "f".as_ref(),
            stripefs::CreateParams::with_perm(0o644),
        )
        .unwrap();
    fs.write_direct(f.ino, 0, &vec![1u8; 64 << 16]).unwrap();
    fs.unmount().unwrap();
    drop(fs); // Its targets stay open (and locked) until dropped.
    let (in_flight, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let views: Vec<Arc<dyn Target>> = s
        .targets()
        .into_iter()
        .map(|inner| {
            Arc::new(SlowWrites {
                inner,
                in_flight: Arc::clone(&in_flight),
                peak: Arc::clone(&peak),
            }) as Arc<dyn Target>
        })
        .collect();
    let (fs, _) = Fs::mount(views, MountOptions::default()).unwrap();
    let fs = Arc::new(fs);
    let m = serve(fs.clone(), &s.mnt(), &serve_options()).unwrap();
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(s.mnt().join("f"))
        .unwrap();
    let mut buf = Aligned::new(64 * 4096, 9);
    let mut ring = IoUring::new(64).unwrap();
    peak.store(0, SeqCst);
    for i in 0..64usize {
        let piece = buf.buf()[i * 4096..(i + 1) * 4096].as_mut_ptr();
        let sqe = opcode::Write::new(types::Fd(file.as_raw_fd()), piece, 4096)
            .offset((i as u64) << 16)
            .build()
            .user_data(i as u64);
        // SAFETY: `buf` outlives the ring's use of it: every completion is reaped below.
        unsafe { ring.submission().push(&sqe).unwrap() };
    }
    ring.submit_and_wait(64).unwrap();
    let results: Vec<i32> = ring.completion().map(|c| c.result()).collect();
    assert_eq!(results, vec![4096; 64]);
    let peak = peak.load(SeqCst);
    drop((ring, file));
    finish(m, fs);
    assert!(
        peak >= 48,
        "only {peak} of 64 direct writes reached the targets at once"
    );
}

/// Shared writable `mmap` through the mount: stores reach the engine after `msync`, and a
/// later `O_DIRECT` write through the mount is what the mapping then shows.
#[test]
fn shared_mmap_is_coherent_with_the_engine_and_direct_io() {
    let s = Scratch::new("mmap");
    let (fs, m) = s.serve();
    let path = s.mnt().join("m");
    fs::write(&path, vec![1u8; 65536]).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: a fresh shared mapping of 64 KiB of an open file; unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            65536,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is 65536 bytes long and writable.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), 65536) };
    bytes[4096..8192].fill(7);
    // SAFETY: `map` is the mapping above.
    assert_eq!(unsafe { libc::msync(map, 65536, libc::MS_SYNC) }, 0);
    let ino = fs.resolve(Path::new("/m"), stripefs::Follow::Yes).unwrap();
    let mut back = vec![0u8; 8192];
    fs.read_at(ino, 0, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 1) && back[4096..].iter().all(|&b| b == 7));
    // An O_DIRECT write through the mount replaces what the mapping shows.
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let mut buf = Aligned::new(4096, 9);
    direct.write_all_at(buf.buf(), 4096).unwrap();
    assert!(bytes[4096..8192].iter().all(|&b| b == 9), "stale mapping");
    // SAFETY: as above; nothing uses `bytes` after this.
    assert_eq!(unsafe { libc::munmap(map, 65536) }, 0);
    drop((file, direct));
    finish(m, fs);
}

/// `EBUSY` from an unmount leaves the file system mounted and served, and a later
/// unmount, once the file is closed, really unmounts (fuser's own unmounter reported
/// success without unmounting after a first refusal).
#[test]
fn unmount_after_ebusy_can_be_retried() {
    let s = Scratch::new("busy");
    let (fs, m) = s.serve();
    let mnt = fs::canonicalize(s.mnt()).unwrap();
    let f = fs::File::create(mnt.join("open")).unwrap();
    let u = m.unmounter();
    let busy = u.unmount().unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::EBUSY), "{busy}");
    fs::write(mnt.join("still-served"), b"yes").unwrap();
    drop(f);
    unmount_retrying(&u);
    assert!(
        stripefs_fuse::mount_source(&mnt).is_none(),
        "unmount reported success but the file system is still mounted"
    );
    m.join().unwrap();
    let ino = fs.resolve(Path::new("/still-served"), stripefs::Follow::Yes);
    assert!(ino.is_ok());
    Arc::into_inner(fs).unwrap().unmount().unwrap();
}

/// Page-cache writeback of a shared mapping arrives on whatever handle the file has open,
/// here an `O_DIRECT` one, and is not held to `O_DIRECT` alignment: the last page of a
/// file whose end is not sector-aligned is written back, `msync` succeeds, and the bytes
/// survive a remount (issue 9, item 3).
#[test]
fn mmap_writes_through_an_o_direct_handle_reach_the_disk() {
    const SIZE: i64 = 0x69690;
    const OFF: usize = 0x69200;
    const LEN: usize = 0x490;
    let s = Scratch::new("mmapdirect");
    let (fs, m) = s.serve();
    let path = s.mnt().join("f");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    // SAFETY: plain system call on an open descriptor.
    assert_eq!(unsafe { libc::ftruncate(file.as_raw_fd(), SIZE) }, 0);
    let page = OFF & !4095;
    let map_len = SIZE as usize - page;
    // SAFETY: a fresh shared mapping of the file's last page; unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            page as libc::off_t,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is `map_len` bytes long and writable.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), map_len) };
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 + 1).collect();
    bytes[OFF - page..OFF - page + LEN].copy_from_slice(&pattern);
    // SAFETY: `map` is the mapping above.
    let rc = unsafe { libc::msync(map, map_len, libc::MS_SYNC) };
    assert_eq!(rc, 0, "msync: {}", std::io::Error::last_os_error());
    // SAFETY: as above; nothing uses `bytes` after this.
    assert_eq!(unsafe { libc::munmap(map, map_len) }, 0);
    drop(file);
    finish(m, fs);
    let (fs, _) = Fs::mount(s.targets(), MountOptions::default()).unwrap();
    let ino = fs.resolve(Path::new("/f"), stripefs::Follow::Yes).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, SIZE as u64);
    let mut back = vec![0u8; LEN];
    fs.read_at(ino, OFF as u64, &mut back).unwrap();
    assert_eq!(back, pattern, "mapped stores lost after remount");
    fs.unmount().unwrap();
}

fn fstat(f: &fs::File) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is valid; `fstat` fills it from an open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    match unsafe { libc::fstat(f.as_raw_fd(), &mut st) } {
        0 => Ok(st),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A directory removed (or renamed over) while open or while a process works in it stays
/// answerable with link count 0, as on a kernel file system, instead of `ESTALE`
/// (issue 9, item 9).
#[test]
fn removed_directory_stays_answerable_while_held() {
    let s = Scratch::new("rmdir");
    let (fs, m) = s.serve();
    let mnt = s.mnt();
    fs::create_dir(mnt.join("d")).unwrap();
    let d = fs::File::open(mnt.join("d")).unwrap();
    fs::remove_dir(mnt.join("d")).unwrap();
    let st = fstat(&d).expect("fstat on an open removed directory");
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(st.st_nlink, 0);
    // Nothing can be created in it.
    let at = CString::new("new").unwrap();
    // SAFETY: valid descriptor and C string.
    let rc = unsafe { libc::mkdirat(d.as_raw_fd(), at.as_ptr(), 0o755) };
    let e = std::io::Error::last_os_error();
    assert_eq!((rc, e.raw_os_error()), (-1, Some(libc::ENOENT)), "{e}");
    drop(d);

    // Renamed over while open.
    fs::create_dir(mnt.join("a")).unwrap();
    fs::create_dir(mnt.join("b")).unwrap();
    let b = fs::File::open(mnt.join("b")).unwrap();
    fs::rename(mnt.join("a"), mnt.join("b")).unwrap();
    assert_eq!(fstat(&b).expect("fstat after rename over").st_nlink, 0);
    drop(b);

    // A shell whose working directory is removed (held by the kernel, no open file).
    fs::create_dir(mnt.join("cwd")).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("cd cwd && rmdir ../cwd && stat -c %h . && ls -a .")
        .current_dir(&mnt)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let errs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{errs}");
    assert_eq!(text.lines().next(), Some("0"), "{text}{errs}");
    finish(m, fs);
}

/// As `nobody` with umask 0, creates `path` with `open(O_CREAT, mode)`.
fn create_as_nobody(path: &Path, mode: libc::mode_t) {
    use std::os::unix::process::CommandExt;
    let c = cpath(path);
    let mut cmd = std::process::Command::new("true");
    cmd.uid(65534).gid(65534);
    // SAFETY: the closure runs in the forked child after the uid change and calls only
    // async-signal-safe system calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(0);
            let fd = libc::open(c.as_ptr(), libc::O_CREAT | libc::O_WRONLY, mode);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        });
    }
    let st = cmd.status().unwrap();
    assert!(st.success(), "create {} as nobody", path.display());
}

/// The set-group-ID directory cases of issue 9 item 8 in `dir`: returns (name, gid,
/// permission bits) of each new inode.
fn setgid_scenario(dir: &Path) -> Vec<(&'static str, u32, u32)> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let p = dir.join("p");
    fs::create_dir(&p).unwrap();
    chown(&p, Some(100), Some(100)).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o2755)).unwrap();
    fs::create_dir(p.join("sub")).unwrap();
    fs::write(p.join("file"), b"").unwrap();
    fs::create_dir(p.join("sub/deeper")).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o2777)).unwrap();
    // Not in group 100: a group-executable set-group-ID file loses the bit.
    create_as_nobody(&p.join("nobody-file"), 0o2775);
    as_nobody(&format!("mkdir '{}'", p.join("nobody-dir").display()));
    let plain = dir.join("plain");
    fs::create_dir(&plain).unwrap();
    fs::set_permissions(&plain, fs::Permissions::from_mode(0o777)).unwrap();
    create_as_nobody(&plain.join("nobody-file"), 0o2775);
    [
        "p/sub",
        "p/file",
        "p/sub/deeper",
        "p/nobody-file",
        "p/nobody-dir",
        "plain/nobody-file",
    ]
    .into_iter()
    .map(|n| {
        let m = fs::metadata(dir.join(n)).unwrap();
        (n, m.gid(), m.mode() & 0o7777)
    })
    .collect()
}

/// New entries in a set-group-ID directory take its group, subdirectories inherit the
/// bit, and a creator outside the group loses set-group-ID on a new file: as on a local
/// file system (issue 9, item 8).
#[test]
fn setgid_directories_pass_their_group_on_as_on_a_local_file_system() {
    let s = Scratch::new("setgid");
    let local = s.dir.join("local");
    fs::create_dir(&local).unwrap();
    let expected = setgid_scenario(&local);
    assert_eq!(expected[0], ("p/sub", 100, 0o2755), "{expected:?}");
    assert_eq!(expected[1].1, 100, "{expected:?}");
    let (fs, m) = s.serve();
    let got = setgid_scenario(&s.mnt());
    finish(m, fs);
    assert_eq!(got, expected);
}

/// Access time of `p` (through the kernel, which asks the daemon after a read).
fn atime_of(p: &Path) -> (i64, i64) {
    let m = fs::metadata(p).unwrap();
    (m.atime(), m.atime_nsec())
}

/// What reads and listings through the mount do to access times under one policy:
/// (a file read after a modification updates, a second read updates, a listing after
/// an entry changed updates).
fn atime_through_the_mount(name: &str, atime: stripefs::AtimePolicy) -> [bool; 3] {
    let s = Scratch::new(name);
    let (fs, m) = s.serve_with(MountOptions {
        atime,
        ..MountOptions::default()
    });
    let (f, d) = (s.mnt().join("f"), s.mnt().join("d"));
    fs::write(&f, b"first").unwrap();
    fs::create_dir(&d).unwrap();
    let before = atime_of(&f);
    assert_eq!(fs::read(&f).unwrap(), b"first");
    let after_mod = atime_of(&f);
    assert_eq!(fs::read(&f).unwrap(), b"first");
    let again = atime_of(&f);
    fs::write(d.join("x"), b"").unwrap();
    let dir_before = atime_of(&d);
    assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
    let dir_after = atime_of(&d);
    finish(m, fs);
    [
        before != after_mod,
        after_mod != again,
        dir_before != dir_after,
    ]
}

/// relatime (the default), strictatime, noatime, nodiratime and lazytime through the
/// kernel behave as on a kernel file system; under lazytime the update is seen at once
/// and written at unmount (issue 9, item 10).
#[test]
fn access_times_follow_the_mount_options() {
    use stripefs::{AtimePolicy, AtimeUpdate, AtimeWrite, DirAtime};
    let strict = AtimePolicy {
        update: AtimeUpdate::Strict,
        ..AtimePolicy::default()
    };
    let cases = [
        ("relatime", AtimePolicy::default(), [true, false, true]),
        ("strictatime", strict, [true, true, true]),
        (
            "noatime",
            AtimePolicy {
                update: AtimeUpdate::Never,
                ..AtimePolicy::default()
            },
            [false, false, false],
        ),
        (
            "nodiratime",
            AtimePolicy {
                dirs: DirAtime::Skip,
                ..AtimePolicy::default()
            },
            [true, false, false],
        ),
        (
            "lazytime",
            AtimePolicy {
                write: AtimeWrite::Lazy,
                ..strict
            },
            [true, true, true],
        ),
    ];
    for (name, policy, want) in cases {
        assert_eq!(atime_through_the_mount(name, policy), want, "{name}");
    }
    // The lazily kept time was written at unmount.
    let s = Scratch::new("lazy-written");
    let lazy = AtimePolicy {
        write: AtimeWrite::Lazy,
        ..AtimePolicy::default()
    };
    let (fs, m) = s.serve_with(MountOptions {
        atime: lazy,
        ..MountOptions::default()
    });
    let f = s.mnt().join("f");
    fs::write(&f, b"data").unwrap();
    let created = atime_of(&f);
    fs::read(&f).unwrap();
    let seen = atime_of(&f);
    assert_ne!(seen, created);
    finish(m, fs);
    let (fs, _) = Fs::mount(s.targets(), MountOptions::default()).unwrap();
    let ino = fs.resolve(Path::new("/f"), stripefs::Follow::Yes).unwrap();
    let a = fs.getattr(ino).unwrap().atime;
    assert_eq!((a.sec, i64::from(a.nsec)), seen);
    fs.unmount().unwrap();
}

/// A POSIX ACL attribute value: version 2, then (tag, perm, id) entries.
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn set_acl(p: &Path, name: &str, v: &[u8]) -> std::io::Result<()> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid C strings and a buffer of `v.len()` bytes.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The ACL attribute `name` of `p`, or the errno reading it failed with.
fn get_acl(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 1024];
    // SAFETY: valid C strings and a buffer of `buf.len()` bytes.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    match usize::try_from(r) {
        Ok(n) => Ok(buf[..n].to_vec()),
        Err(_) => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
    }
}

/// Whether `sh -c script` succeeds as `nobody` (uid and gid 65534).
fn nobody_can(script: &str) -> bool {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(65534)
        .gid(65534)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// ACL enforcement, mode and mask kept in step, and default ACL inheritance, in `dir`;
/// returns every observation (modes, ACL values, who could write).
fn acl_scenario(dir: &Path) -> Vec<(&'static str, String)> {
    use std::os::unix::fs::PermissionsExt;
    const U: u32 = u32::MAX;
    const ACCESS: &str = "system.posix_acl_access";
    const DEFAULT: &str = "system.posix_acl_default";
    let mode = |p: &Path| format!("{:o}", fs::metadata(p).unwrap().mode() & 0o7777);
    let mut seen = Vec::new();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();

    // user::rw- user:nobody:rw- group::--- mask::rw- other::--- on a 0600 file.
    let f = dir.join("f");
    fs::write(&f, b"secret\n").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let q = f.display();
    seen.push((
        "before-acl",
        nobody_can(&format!("echo x >> '{q}'")).to_string(),
    ));
    let named = acl_value(&[
        (1, 6, U),
        (2, 6, 65534),
        (4, 0, U),
        (0x10, 6, U),
        (0x20, 0, U),
    ]);
    set_acl(&f, ACCESS, &named).unwrap();
    seen.push(("acl-mode", mode(&f)));
    seen.push((
        "acl-write",
        nobody_can(&format!("echo x >> '{q}'")).to_string(),
    ));
    seen.push((
        "acl-read",
        nobody_can(&format!("cat '{q}' >/dev/null")).to_string(),
    ));
    // chmod rewrites the mask: nobody loses write.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    seen.push(("chmod-acl", format!("{:?}", get_acl(&f, ACCESS))));
    seen.push((
        "chmod-write",
        nobody_can(&format!("echo x >> '{q}'")).to_string(),
    ));
    seen.push((
        "chmod-read",
        nobody_can(&format!("cat '{q}' >/dev/null")).to_string(),
    ));

    // An ACL that says no more than the mode sets the mode and is not stored.
    let g = dir.join("g");
    fs::write(&g, b"").unwrap();
    set_acl(
        &g,
        ACCESS,
        &acl_value(&[(1, 7, U), (4, 5, U), (0x20, 4, U)]),
    )
    .unwrap();
    seen.push(("minimal-mode", mode(&g)));
    seen.push(("minimal-stored", format!("{:?}", get_acl(&g, ACCESS))));
    seen.push((
        "default-on-file",
        format!(
            "{:?}",
            set_acl(&g, DEFAULT, &named).map_err(|e| e.raw_os_error())
        ),
    ));
    seen.push((
        "invalid-acl",
        format!(
            "{:?}",
            set_acl(
                &g,
                ACCESS,
                &acl_value(&[(1, 6, U), (2, 6, 5), (4, 0, U), (0x20, 0, U)])
            )
            .map_err(|e| e.raw_os_error())
        ),
    ));

    // A default ACL replaces the umask for new files and directories.
    let d = dir.join("d");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    let default = acl_value(&[
        (1, 7, U),
        (2, 7, 65534),
        (4, 5, U),
        (0x10, 7, U),
        (0x20, 0, U),
    ]);
    set_acl(&d, DEFAULT, &default).unwrap();
    let dq = d.display();
    let made = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 077 && : > '{dq}/new' && mkdir '{dq}/sub' && : > '{dq}/../plain'"
        ))
        .status()
        .unwrap();
    assert!(made.success());
    for (name, p) in [
        ("new", d.join("new")),
        ("sub", d.join("sub")),
        ("plain", dir.join("plain")),
    ] {
        seen.push((name, mode(&p)));
        seen.push((name, format!("{:?}", get_acl(&p, ACCESS))));
        seen.push((name, format!("{:?}", get_acl(&p, DEFAULT))));
    }
    let nq = d.join("new");
    seen.push((
        "inherited-write",
        nobody_can(&format!("echo x >> '{}'", nq.display())).to_string(),
    ));
    seen
}

/// POSIX ACLs are enforced by the kernel (`FUSE_POSIX_ACL`) and kept in step with the
/// mode, as on a local file system (issue 9, item 13: they were stored and ignored).
#[test]
fn posix_acls_behave_as_on_a_local_file_system() {
    let s = Scratch::new("acl");
    let local = s.dir.join("local");
    fs::create_dir(&local).unwrap();
    let expected = acl_scenario(&local);
    // The oracle itself: the ACL lets nobody write a 0600 file.
    assert!(
        expected.contains(&("acl-write", "true".into())),
        "{expected:?}"
    );
    let (fs, m) = s.serve();
    let got = acl_scenario(&s.mnt());
    finish(m, fs);
    assert_eq!(got, expected);
}

/// `name_to_handle_at(2)`: the handle (header included) of `p`.
fn file_handle(p: &Path) -> Vec<u8> {
    const MAX: usize = 128;
    let mut buf = vec![0u8; 8 + MAX];
    buf[..4].copy_from_slice(&(MAX as u32).to_ne_bytes());
    let mut mount_id: libc::c_int = 0;
    let c = cpath(p);
    // SAFETY: a valid path and a `struct file_handle` with room for MAX bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at: {}",
        std::io::Error::last_os_error()
    );
    let len = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize;
    buf.truncate(8 + len);
    buf
}

/// `open_by_handle_at(2)` on the mount whose root `mount` is.
fn open_by_handle(mount: &fs::File, handle: &[u8], flags: i32) -> std::io::Result<fs::File> {
    let mut h = handle.to_vec();
    // SAFETY: a descriptor of the mount and a `struct file_handle` from name_to_handle_at.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            h.as_mut_ptr(),
            flags,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { <fs::File as std::os::unix::io::FromRawFd>::from_raw_fd(fd as i32) })
}

/// The kernel forgets the inodes and dentries nobody holds.
fn drop_inode_caches() {
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

/// File handles (`FUSE_EXPORT_SUPPORT`) outlive the kernel's inode cache and the mount
/// (issue 9, item 12: after drop_caches, open_by_handle_at answered ESTALE); a handle to
/// a removed file is stale.
#[test]
fn file_handles_survive_cache_drops_and_remounts() {
    let s = Scratch::new("handles");
    let (fs, m) = s.serve();
    let mnt = s.mnt();
    fs::create_dir_all(mnt.join("d/e")).unwrap();
    fs::write(mnt.join("d/e/f"), b"by handle").unwrap();
    fs::write(mnt.join("gone"), b"x").unwrap();
    let (hf, hd, hgone) = (
        file_handle(&mnt.join("d/e/f")),
        file_handle(&mnt.join("d/e")),
        file_handle(&mnt.join("gone")),
    );
    let want_dir = fs::metadata(mnt.join("d/e")).unwrap().ino();
    fs::remove_file(mnt.join("gone")).unwrap();
    let check = |root: &fs::File| {
        drop_inode_caches();
        let mut f = open_by_handle(root, &hf, libc::O_RDONLY).unwrap();
        let mut got = String::new();
        f.read_to_string(&mut got).unwrap();
        assert_eq!(got, "by handle");
        drop(f);
        drop_inode_caches();
        let d = open_by_handle(root, &hd, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
        assert_eq!(d.metadata().unwrap().ino(), want_dir);
        drop_inode_caches();
        let e = open_by_handle(root, &hgone, libc::O_RDONLY).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    };
    let root = fs::File::open(&mnt).unwrap();
    check(&root);
    drop(root);
    finish(m, fs);

    // A new mount of the same file system takes the same handles.
    let (fs, _) = Fs::mount(s.targets(), MountOptions::default()).unwrap();
    let fs = Arc::new(fs);
    let m = serve(fs.clone(), &mnt, &serve_options()).unwrap();
    let root = fs::File::open(&mnt).unwrap();
    check(&root);
    drop(root);
    finish(m, fs);
}

/// FUSE over io_uring (`-o transport=uring`) carries namespace operations, buffered
/// and `O_DIRECT` I/O (answered from the target threads), writes as large as the
/// ring's payload buffers, and directory listings; the ring, not `/dev/fuse`, served
/// them. Switches `enable_uring` on (CI runs as root); see `enable_fuse_uring`.
#[test]
fn io_uring_transport_carries_the_requests() {
    if !enable_fuse_uring() {
        return;
    }
    let s = Scratch::new("uring");
    Fs::mkfs(&s.targets(), &MkfsOptions::default()).unwrap();
    let (fs, _) = Fs::mount(s.targets(), MountOptions::default()).unwrap();
    let fs = Arc::new(fs);
    let opts = ServeOptions {
        transport: TransportChoice::Uring,
        ..serve_options()
    };
    let m = serve(fs.clone(), &s.mnt(), &opts).unwrap();
    assert!(
        matches!(m.transport(), Transport::Uring { queues, .. } if queues >= 1),
        "{:?}",
        m.transport()
    );
    let mnt = s.mnt();
    let before = m.ring_requests();
    fs::create_dir(mnt.join("d")).unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("file-{i:03}")).collect();
    for n in &names {
        fs::write(mnt.join("d").join(n), n.as_bytes()).unwrap();
    }
    let mut listed: Vec<String> = fs::read_dir(mnt.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, names);
    for n in &names {
        assert_eq!(fs::read(mnt.join("d").join(n)).unwrap(), n.as_bytes());
    }
    // 4 MiB buffered: requests as large as the ring's payload buffers.
    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(mnt.join("big"), &big).unwrap();
    assert_eq!(fs::read(mnt.join("big")).unwrap(), big);
    // O_DIRECT: the answers come from the target threads, not the ring thread.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("direct"))
        .unwrap();
    let mut w = Aligned::new(1 << 20, 0x5a);
    f.write_all_at(w.buf(), 0).unwrap();
    let mut r = Aligned::new(1 << 20, 0);
    f.read_exact_at(r.buf(), 0).unwrap();
    assert!(r.buf().iter().all(|&b| b == 0x5a));
    f.sync_all().unwrap();
    drop(f);
    fs::rename(mnt.join("big"), mnt.join("d").join("big")).unwrap();
    fs::remove_file(mnt.join("d").join("file-000")).unwrap();
    assert!(!mnt.join("d").join("file-000").exists());
    let served = m.ring_requests() - before;
    assert!(
        served >= 200,
        "only {served} requests went through the ring"
    );
    finish(m, fs);
}

/// Creating, writing and closing a small file costs the kernel's minimum of round trips:
/// LOOKUP (the name is new), CREATE, GETXATTR `security.capability` (the first write to
/// an inode, before the kernel marks it `S_NOSEC`), WRITE, GETATTR of the directory the
/// create changed, and RELEASE. No FLUSH: handles are opened `FOPEN_NOFLUSH`, since
/// close writes nothing back (issue 15, `docs/design/fuse.md`).
#[test]
fn small_file_creates_cost_no_flush_round_trip() {
    let s = Scratch::new("small-creates");
    let (fs, m) = s.serve();
    let dir = s.mnt().join("d");
    fs::create_dir(&dir).unwrap();
    let c = m.request_counts();
    let (flush0, create0, write0, total0) = (
        c.get(Op::Flush),
        c.get(Op::Create),
        c.get(Op::Write),
        c.total(),
    );
    const N: u64 = 20;
    for i in 0..N {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(format!("f{i}")))
            .unwrap();
        f.write_all(&[b'a' + i as u8; 4096]).unwrap();
    }
    let per_file = (c.total() - total0) as f64 / N as f64;
    let counts = c.to_string();
    assert_eq!(c.get(Op::Flush) - flush0, 0, "close sent FLUSH: {counts}");
    assert_eq!(c.get(Op::Create) - create0, N, "{counts}");
    assert_eq!(c.get(Op::Write) - write0, N, "{counts}");
    assert!(per_file <= 6.0, "{per_file} requests per file: {counts}");
    for i in 0..N {
        assert_eq!(
            fs::read(dir.join(format!("f{i}"))).unwrap(),
            [b'a' + i as u8; 4096]
        );
    }
    finish(m, fs);
}

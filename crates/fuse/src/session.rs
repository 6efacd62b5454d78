//! Mounting: the FUSE session runs on its own threads until the kernel unmounts.

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use parking_lot::Mutex;
use stripefs::{Access, Fs};

use crate::uring::{self, RingStats, Rings};
use crate::{
    FuseConfig, RequestCounts, StripeFuse, Transport, TransportChoice, UringNeed, UringOffer,
};

/// How to present the file system to the kernel.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `fsname` in `/proc/mounts` (the targets, as `mount` was given them).
    pub fsname: String,
    /// Threads reading requests: the most requests served at once.
    pub threads: usize,
    /// What the kernel is asked for (`-o writeback_cache`, `-o fopen_direct_io`).
    pub fuse: FuseConfig,
    /// Let users other than the mounter in (`allow_other`).
    pub allow_other: bool,
    /// Mount read-only.
    pub read_only: bool,
    /// Generic mount flags, as `mount(8)` spells them: `noatime`, `nodev`, `nosuid`,
    /// `noexec`, `sync`, `dirsync` and their opposites. See [`generic_flag`].
    pub flags: Vec<String>,
    /// Which transport carries the requests (`-o transport=`).
    pub transport: TransportChoice,
    /// Ring entries per queue under io_uring; `None`: [`uring::default_entries`].
    pub uring_entries: Option<usize>,
    /// How `add-target` requests open their targets (`target_ioctl`); `None` refuses
    /// them.
    pub open_target: Option<crate::target_ioctl::TargetOpener>,
}

/// Whether `word` is a generic mount flag [`serve`] passes to the kernel.
#[must_use]
pub fn generic_flag(word: &str) -> bool {
    flag_option(word).is_some()
}

fn flag_option(word: &str) -> Option<MountOption> {
    Some(match word {
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        _ => return None,
    })
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            fsname: "stripefs".into(),
            threads: 8,
            fuse: FuseConfig::default(),
            allow_other: true,
            read_only: false,
            flags: Vec::new(),
            transport: TransportChoice::default(),
            uring_entries: None,
            open_target: None,
        }
    }
}

/// A mounted file system being served.
#[derive(Debug)]
pub struct Mounted {
    unmounter: Unmounter,
    thread: JoinHandle<io::Result<()>>,
    transport: Transport,
    rings: Option<Arc<RingStats>>,
    counts: Arc<RequestCounts>,
    note: Option<String>,
}

impl Mounted {
    /// The transport the kernel's requests arrive on.
    #[must_use]
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Why `-o transport=auto` stayed on `/dev/fuse`, if it did (`enable_uring` is `N`,
    /// the kernel lacks FUSE over io_uring, did not offer it...).
    #[must_use]
    pub fn transport_note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Requests served through the io_uring rings so far (0 on `/dev/fuse`).
    #[must_use]
    pub fn ring_requests(&self) -> u64 {
        self.rings.as_ref().map_or(0, |s| s.requests())
    }

    /// The requests served so far, by kind.
    #[must_use]
    pub fn request_counts(&self) -> &RequestCounts {
        &self.counts
    }

    /// A handle that unmounts from another thread (a signal handler's thread).
    #[must_use]
    pub fn unmounter(&self) -> Unmounter {
        self.unmounter.clone()
    }

    /// Unmounts and waits for the session to end. The caller then unmounts the `Fs`.
    ///
    /// # Errors
    /// The kernel refused the unmount (busy), or the session failed.
    pub fn unmount(self) -> io::Result<()> {
        self.unmounter.unmount()?;
        self.join()
    }

    /// Waits until the kernel ends the session (`umount`).
    ///
    /// # Errors
    /// The session failed.
    pub fn join(self) -> io::Result<()> {
        let served = self
            .thread
            .join()
            .map_err(|_| io::Error::other("FUSE session thread panicked"))?;
        tracing::info!(requests = %self.counts, "FUSE session ended");
        served
    }
}

/// Unmounts a [`Mounted`] from another thread.
///
/// fuser's own unmounter gives up its mount handle on the first attempt, so after an
/// `EBUSY` every later call would report success and do nothing; this one calls
/// `umount2` itself each time, and hands fuser its handle only once the kernel has let
/// go (so fuser does not try again when the session ends).
#[derive(Debug, Clone)]
pub struct Unmounter {
    mountpoint: PathBuf,
    fuser: Arc<Mutex<SessionUnmounter>>,
}

impl Unmounter {
    /// Detaches the mount; the session then ends. Unmounting an already unmounted file
    /// system is harmless; after `EBUSY` it may be tried again.
    ///
    /// # Errors
    /// The kernel refused (`EBUSY`: the mount is in use).
    pub fn unmount(&self) -> io::Result<()> {
        if mount_source(&self.mountpoint).is_some() {
            match umount2(&self.mountpoint) {
                // EINVAL: no longer a mount point (unmounted meanwhile).
                Err(e) if e.raw_os_error() != Some(libc::EINVAL) => return Err(e),
                _ => {}
            }
        }
        // Disarm fuser's handle; it may still try umount itself and find nothing there.
        match self.fuser.lock().unmount() {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            r => r,
        }
    }
}

/// Unmounts the FUSE mount at `mountpoint` (an absolute, canonical path) served by
/// another process, and returns its source (`fsname`) so that the caller can wait for
/// the daemon to let go of it. The kernel ends that daemon's session; the daemon then
/// unmounts its engine.
///
/// # Errors
/// `InvalidInput` if `mountpoint` is no FUSE mount; the kernel's refusal (`EBUSY`: in
/// use).
pub fn unmount(mountpoint: &Path) -> io::Result<String> {
    let source = mount_source(mountpoint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a FUSE mount", mountpoint.display()),
        )
    })?;
    umount2(mountpoint)?;
    Ok(source)
}

/// One `umount2(2)` of `mountpoint`, no flags.
fn umount2(mountpoint: &Path) -> io::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid C string naming a mount point.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The source (`fsname`) of the FUSE mount at `mountpoint` (an absolute, canonical
/// path) in `/proc/self/mounts`, if there is one.
#[must_use]
pub fn mount_source(mountpoint: &Path) -> Option<String> {
    fuse_mounts()
        .into_iter()
        .rev()
        .find(|(_, dir)| dir == mountpoint)
        .map(|(src, _)| src)
}

/// Every FUSE mount in `/proc/self/mounts`, oldest first: (source, mount point).
#[must_use]
pub fn fuse_mounts() -> Vec<(String, PathBuf)> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (src, dir, kind) = (f.next()?, f.next()?, f.next()?);
            kind.starts_with("fuse").then(|| {
                (
                    String::from_utf8_lossy(&unescape(src)).into_owned(),
                    PathBuf::from(std::ffi::OsString::from_vec(unescape(dir))),
                )
            })
        })
        .collect()
}

/// Whether the kernel has the superblock of the FUSE mount at `mountpoint` (canonical)
/// read-only, from `/proc/self/mountinfo`; `None` when it is not mounted.
fn kernel_access(mountpoint: &Path) -> Option<Access> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    info.lines().rev().find_map(|l| {
        let (mount, sb) = l.split_once(" - ")?;
        let dir = mount.split(' ').nth(4)?;
        let mut f = sb.split(' ');
        let (kind, _source, options) = (f.next()?, f.next()?, f.next()?);
        (unescape(dir) == want && kind.starts_with("fuse")).then(|| {
            if options.split(',').any(|o| o == "ro") {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            }
        })
    })
}

/// The kernel does not tell a FUSE daemon about `mount -o remount,ro` (nor `rw`): it
/// only flips its superblock's read-only flag, after writing its dirty pages to us and
/// only if no file is open for writing. So the engine follows that flag: it is the
/// engine's access source (asked when a change meets a read-only engine), a thread
/// applies it whenever the mount table changes (`poll` on `/proc/self/mountinfo`), and
/// `fsyncdir` applies it before answering. The thread ends when the mount is gone.
fn follow_kernel_access(fs: Arc<Fs>, mountpoint: PathBuf) {
    let mp = mountpoint.clone();
    fs.set_access_source(Arc::new(move || kernel_access(&mp)));
    let table = match std::fs::File::open("/proc/self/mountinfo") {
        Ok(t) => t,
        Err(e) => {
            return tracing::error!(%e, "cannot watch the mount table; remounts are followed only on demand")
        }
    };
    let fs = Arc::downgrade(&fs);
    let spawned = std::thread::Builder::new()
        .name("stripefs-remount".into())
        .spawn(move || {
            // Weak, and only upgraded when this mount's flag changed (other mounts wake
            // us too): the caller unwraps its `Arc<Fs>` once the session ends.
            let mut followed = None;
            loop {
                let Some(now) = kernel_access(&mountpoint) else {
                    return;
                };
                if followed != Some(now) {
                    let Some(fs) = fs.upgrade() else { return };
                    match fs.follow_access_source() {
                        Ok(()) => followed = Some(now),
                        Err(e) => tracing::error!(%e, "following a remount failed"),
                    }
                }
                if !wait_for_mount_change(&table) {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(%e, "no remount thread; remounts are followed only on demand");
    }
}

/// Sleeps until the mount table changes; false if it cannot be watched.
fn wait_for_mount_change(table: &std::fs::File) -> bool {
    loop {
        let mut p = libc::pollfd {
            fd: std::os::unix::io::AsRawFd::as_raw_fd(table),
            events: libc::POLLPRI,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the mount table marks a change with POLLPRI.
        if unsafe { libc::poll(&mut p, 1, -1) } >= 0 {
            return true;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            tracing::error!("cannot watch the mount table; remounts are followed only on demand");
            return false;
        }
    }
}

/// Undoes the octal escapes of `/proc/self/mounts` (`\040` for a space, ...).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Mounts `fs` at `mountpoint` and serves it on background threads.
///
/// # Errors
/// The mount failed (no `/dev/fuse`, not permitted, bad mount point), or
/// `transport=uring` was asked for and the kernel cannot carry it.
pub fn serve(fs: Arc<Fs>, mountpoint: &Path, opts: &ServeOptions) -> io::Result<Mounted> {
    let mut cfg = Config::default();
    cfg.mount_options = mount_options(opts);
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    // Before mounting: afterwards resolving the path would ask the not yet running session.
    let canonical = std::fs::canonicalize(mountpoint)?;
    if opts.read_only {
        // Read-only from the first request: a read must not write an access time.
        fs.set_access(Access::ReadOnly).map_err(io::Error::other)?;
    }
    let fs_for_access = Arc::clone(&fs);
    let (offer, mut note) = uring_offer(opts.transport)?;
    let mut fuse = StripeFuse::new(fs, opts.fuse);
    let counts = fuse.counts();
    if let Some(o) = &offer {
        fuse = fuse.with_uring(o.clone());
    }
    if let Some(o) = &opts.open_target {
        fuse = fuse.with_target_opener(o.clone());
    }
    let mut session = Session::new(fuse, mountpoint, &cfg)?;
    let unmounter = Unmounter {
        mountpoint: canonical,
        fuser: Arc::new(Mutex::new(session.unmount_callable())),
    };
    let negotiated = offer
        .as_ref()
        .is_some_and(|o| o.negotiated.load(Ordering::Acquire));
    let (thread, transport, rings) = if negotiated {
        let entries = opts
            .uring_entries
            .unwrap_or_else(|| uring::default_entries(uring::possible_cpus().unwrap_or(1)));
        let payload = offer_payload();
        let rings = Rings::new(session.as_fd(), entries, payload).map_err(|e| {
            io::Error::new(e.kind(), format!("FUSE over io_uring negotiated, but {e}"))
        })?;
        let (transport, stats) = (rings.transport(), rings.stats());
        let (tx, rx) = mpsc::channel();
        let queues = match transport {
            Transport::Uring { queues, .. } => queues,
            Transport::Dev => 0,
        };
        let thread = std::thread::Builder::new()
            .name("stripefs-fuse".into())
            .spawn(move || session.run_with_transport(move |d| rings.run(d, tx)))?;
        if let Err(e) = wait_registered(&rx, queues) {
            // The kernel waits for the ring once it is negotiated: take the mount down.
            let _ = unmounter.unmount();
            let _ = thread.join();
            return Err(e);
        }
        (thread, transport, Some(stats))
    } else {
        if offer.is_some() {
            note = Some("the kernel did not offer FUSE_OVER_IO_URING at FUSE_INIT".into());
        }
        let thread = std::thread::Builder::new()
            .name("stripefs-fuse".into())
            .spawn(move || session.run())?;
        (thread, Transport::Dev, None)
    };
    match &note {
        Some(why) => tracing::info!(%transport, why, "FUSE transport"),
        None => tracing::info!(%transport, "FUSE transport"),
    }
    follow_kernel_access(fs_for_access, unmounter.mountpoint.clone());
    Ok(Mounted {
        unmounter,
        thread,
        transport,
        rings,
        counts,
        note,
    })
}

/// What the mount asks the kernel for (`fsname`, permissions, generic flags, ro/rw).
fn mount_options(opts: &ServeOptions) -> Vec<MountOption> {
    let mut mount_options = vec![
        MountOption::FSName(opts.fsname.clone()),
        MountOption::DefaultPermissions,
    ];
    // Devices and set-id bits work as on a local file system unless the caller says not.
    for (default, unless) in [("dev", "nodev"), ("suid", "nosuid")] {
        if !opts.flags.iter().any(|f| f == unless) {
            mount_options.extend(flag_option(default));
        }
    }
    for f in &opts.flags {
        if let Some(o) = flag_option(f) {
            if !mount_options.contains(&o) {
                mount_options.push(o);
            }
        }
    }
    mount_options.push(if opts.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    mount_options
}

/// The payload buffer of every ring entry: the request cap under the ring.
fn offer_payload() -> usize {
    uring::max_write(crate::MAX_WRITE) as usize
}

/// What to offer at `FUSE_INIT` for `choice`: nothing for `dev`; for `auto` only if the
/// kernel allows io_uring (else nothing, and the reason); for `uring` the same, but a
/// kernel that does not allow it fails the mount.
fn uring_offer(choice: TransportChoice) -> io::Result<(Option<UringOffer>, Option<String>)> {
    offer_given(choice, uring::probe)
}

/// [`uring_offer`] with the kernel's answer from `probe` (run only if `choice` asks).
fn offer_given(
    choice: TransportChoice,
    probe: impl FnOnce() -> io::Result<()>,
) -> io::Result<(Option<UringOffer>, Option<String>)> {
    let need = match choice {
        TransportChoice::Dev => return Ok((None, None)),
        TransportChoice::Uring => UringNeed::Required,
        TransportChoice::Auto => UringNeed::IfOffered,
    };
    if let Err(e) = probe() {
        return match need {
            UringNeed::Required => Err(io::Error::new(e.kind(), format!("transport=uring: {e}"))),
            UringNeed::IfOffered => Ok((None, Some(e.to_string()))),
        };
    }
    let offer = UringOffer {
        max_write: uring::max_write(crate::MAX_WRITE),
        need,
        negotiated: Arc::new(AtomicBool::new(false)),
    };
    Ok((Some(offer), None))
}

/// Waits until every queue has registered its entries (or one failed).
fn wait_registered(rx: &mpsc::Receiver<io::Result<()>>, queues: usize) -> io::Result<()> {
    for _ in 0..queues {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("FUSE ring queues did not register")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{offer_given, unescape, unmount, ServeOptions, TransportChoice, UringNeed};
    use std::io;

    fn off() -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "FUSE over io_uring is off",
        ))
    }

    /// The default mount takes io_uring where the kernel allows it and says why not
    /// where it does not; `dev` never asks; `uring` fails without it (decision 142).
    #[test]
    fn the_default_transport_offers_io_uring_and_says_why_not() {
        assert_eq!(ServeOptions::default().transport, TransportChoice::Auto);
        let (offer, note) = offer_given(TransportChoice::Auto, || Ok(())).unwrap();
        assert!(offer.is_some_and(|o| o.need == UringNeed::IfOffered));
        assert_eq!(note, None);
        let (offer, note) = offer_given(TransportChoice::Auto, off).unwrap();
        assert!(offer.is_none());
        assert_eq!(note.as_deref(), Some("FUSE over io_uring is off"));
        let asked = std::cell::Cell::new(false);
        let (offer, note) = offer_given(TransportChoice::Dev, || {
            asked.set(true);
            Ok(())
        })
        .unwrap();
        assert!(offer.is_none() && note.is_none() && !asked.get());
        let (offer, note) = offer_given(TransportChoice::Uring, || Ok(())).unwrap();
        assert!(offer.is_some_and(|o| o.need == UringNeed::Required));
        assert_eq!(note, None);
        let e = offer_given(TransportChoice::Uring, off).unwrap_err();
        assert_eq!(e.to_string(), "transport=uring: FUSE over io_uring is off");
    }

    #[test]
    fn unescapes_proc_mounts_fields() {
        assert_eq!(unescape(r"/tmp/a\040b\134c"), b"/tmp/a b\\c");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"trailing\04"), b"trailing\\04");
    }

    #[test]
    fn unmounting_what_is_no_fuse_mount_says_so() {
        let e = unmount(std::path::Path::new("/")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), "/ is not a FUSE mount");
    }
}

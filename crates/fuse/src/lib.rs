//! FUSE front end: serves a mounted [`stripefs::Fs`] to the kernel through `fuser`.
//!
//! Only this crate knows FUSE. Each FUSE request maps to one library call; errors map
//! to the errno of [`stripefs::FsError::errno`]. See `docs/design/fuse.md` for what the
//! kernel is told (capabilities, open flags, cache timeouts) and why.

mod convert;
mod counts;
pub mod evacuate_ioctl;
mod kernel_refs;
mod options;
mod privs;
pub mod scrub_ioctl;
mod session;
pub mod target_ioctl;
mod transport;
pub mod uring;
mod wire;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use stripefs::{
    CreateParams, Fh, FileKind, Fs, FsError, Ino, OpenMode, RenameMode, SetAttr, SgidDrop,
    SyncScope, TimeSet, Whence, WriteOrigin, XattrMode,
};

pub use counts::{Op, RequestCounts};
pub use options::{split_options, OptionError, FUSE_KEYS};
pub use session::{
    fuse_mounts, generic_flag, mount_source, serve, unmount, Mounted, ServeOptions, Unmounter,
};
pub use transport::{Transport, TransportChoice};

/// How long the kernel may cache attributes and names. Every change goes through this
/// mount, so the kernel's own updates keep its cache right; the timeout only bounds how
/// long a change made by the library beside the mount (none in `stripefs mount`) hides.
const TTL: Duration = Duration::from_secs(1);

/// The access ACL's extended attribute (`FUSE_POSIX_ACL`: the kernel enforces it).
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";

/// Largest write we accept in one request. The kernel caps it at `fs.fuse.max_pages_limit`
/// pages (256, i.e. 1 MiB, by default); raising that sysctl lets 16 MiB through, which
/// keeps several stripe units in one request (`BENCHMARKS.md`). fuser's per-worker read
/// buffer is 16 MiB whatever this says.
pub const MAX_WRITE: u32 = 16 << 20;

/// Asynchronous requests the kernel keeps outstanding at once (`max_background`). Direct
/// I/O under `FUSE_ASYNC_DIO` counts here: at fuser's default (16) a program at queue
/// depth 64 finds its `io_submit` sleeping in the kernel until earlier answers arrive.
const MAX_BACKGROUND: u16 = 256;
/// Entries read from the engine per `READDIR` request (a reply of 4 KiB holds about a
/// hundred; the rest are read again by the next request, from its cookie).
const READDIR_BATCH: usize = 128;

/// What the kernel is asked for; see `docs/design/fuse.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuseConfig {
    /// Ask for the kernel's writeback cache (`FUSE_WRITEBACK_CACHE`).
    pub writeback_cache: bool,
    /// Open `O_DIRECT` files with `FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES`
    /// (the old behaviour; `-o fopen_direct_io`). By default the kernel's own direct-I/O
    /// path carries them, which sends every piece of a large synchronous request at once
    /// where `FOPEN_DIRECT_IO` waits for each in turn.
    pub fopen_direct_io: bool,
}

/// Whether the mount insists on FUSE over io_uring when offering it at `FUSE_INIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UringNeed {
    /// `-o transport=uring`: a kernel that does not offer it fails the mount.
    Required,
    /// `-o transport=auto`: take it if offered.
    IfOffered,
}

/// FUSE over io_uring as offered to the kernel at `FUSE_INIT`.
#[derive(Debug, Clone)]
pub struct UringOffer {
    /// `max_write` under the ring: every ring entry has a payload buffer this big, so
    /// it is the kernel's request cap (`fs.fuse.max_pages_limit`), not 16 MiB.
    pub max_write: u32,
    /// Whether the mount fails when the kernel does not offer it.
    pub need: UringNeed,
    /// Set at `FUSE_INIT` when `FUSE_OVER_IO_URING` was negotiated.
    pub negotiated: Arc<AtomicBool>,
}

/// The `fuser::Filesystem` over a stripefs file system.
#[derive(Debug)]
pub struct StripeFuse {
    fs: Arc<Fs>,
    /// Directories the kernel holds, pinned until it forgets them.
    dirs: kernel_refs::DirRefs,
    cfg: FuseConfig,
    uring: Option<UringOffer>,
    counts: Arc<RequestCounts>,
    /// Opens a target for `add-target` (`target_ioctl`); none: such requests are refused.
    opener: Option<target_ioctl::TargetOpener>,
}

impl StripeFuse {
    /// Serves `fs`.
    #[must_use]
    pub fn new(fs: Arc<Fs>, cfg: FuseConfig) -> Self {
        Self {
            fs,
            dirs: kernel_refs::DirRefs::default(),
            cfg,
            uring: None,
            counts: Arc::default(),
            opener: None,
        }
    }

    /// Serves `add-target` requests, opening their targets with `opener`.
    #[must_use]
    pub fn with_target_opener(mut self, opener: target_ioctl::TargetOpener) -> Self {
        self.opener = Some(opener);
        self
    }

    /// The requests served so far, by kind (`counts.rs`).
    #[must_use]
    pub fn counts(&self) -> Arc<RequestCounts> {
        Arc::clone(&self.counts)
    }

    /// Offers FUSE over io_uring at `FUSE_INIT` (`transport.rs`).
    #[must_use]
    pub fn with_uring(mut self, offer: UringOffer) -> Self {
        self.uring = Some(offer);
        self
    }

    /// `FUSE_INIT` under an io_uring offer: ask for `FUSE_OVER_IO_URING` if the kernel
    /// offers it (it does when `enable_uring` is `Y`), with `max_write` no larger than
    /// the ring's payload buffers.
    fn init_uring(&self, config: &mut KernelConfig) -> std::io::Result<()> {
        let Some(offer) = &self.uring else {
            return Ok(());
        };
        if !config
            .capabilities()
            .contains(InitFlags::FUSE_OVER_IO_URING)
        {
            let why = "the kernel does not offer FUSE_OVER_IO_URING at FUSE_INIT";
            return match offer.need {
                UringNeed::Required => Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    format!("transport=uring: {why}"),
                )),
                UringNeed::IfOffered => {
                    tracing::info!("{why}; FUSE requests stay on /dev/fuse");
                    Ok(())
                }
            };
        }
        config
            .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
            .map_err(|_| std::io::Error::other("FUSE_OVER_IO_URING refused"))?;
        let _ = config.set_max_write(offer.max_write);
        // Refused only when the kernel's readahead is smaller already.
        let _ = config.set_max_readahead(offer.max_write);
        offer.negotiated.store(true, Ordering::Release);
        Ok(())
    }

    /// Creation parameters for a non-directory in `parent`: set-group-ID cleared as the
    /// VFS does when the directory is set-group-ID and the creator is neither in its
    /// group nor privileged (a new kernel has done so already; an older one has not).
    fn file_params(
        &self,
        req: &Request,
        parent: Ino,
        mode: u32,
        umask: u32,
    ) -> stripefs::Result<CreateParams> {
        let mut p = params(req, mode, umask);
        if p.perm & 0o2000 != 0 {
            let dir = self.fs.peek_attr(parent)?;
            let dir_perm = (dir.mode & 0o7777) as u16;
            p.perm = privs::new_file_perm(p.perm, dir_perm, || {
                privs::in_group_or_capable(req.pid(), req.gid(), dir.gid)
            });
        }
        Ok(p)
    }

    /// Setting an access ACL drops set-group-ID when the caller is neither in the file's
    /// group nor privileged, as `chmod` would (`posix_acl_update_mode`); the kernel
    /// says so only under `FUSE_SETXATTR_EXT`, which we do not ask for.
    fn acl_kill_sgid(&self, req: &Request, i: Ino) -> stripefs::Result<()> {
        let a = self.fs.peek_attr(i)?;
        if a.mode & 0o2000 == 0 || privs::in_group_or_capable(req.pid(), req.gid(), a.gid) {
            return Ok(());
        }
        let mode = Some(a.mode & 0o7777 & !0o2000);
        self.fs
            .setattr(
                i,
                &SetAttr {
                    mode,
                    ..SetAttr::default()
                },
            )
            .map(drop)
    }

    /// Answers with an entry the kernel will hold: a directory is pinned first.
    fn entry(&self, reply: ReplyEntry, r: stripefs::Result<stripefs::Attr>) {
        entry(
            reply,
            r.and_then(|a| self.dirs.add(&self.fs, &a).map(|()| a)),
        );
    }

    /// The online scrub's ioctl (`scrub_ioctl`): one bounded `Fs::scrub_step` from the
    /// caller's cursor. Only on the root directory, only for root (uid 0: the daemon
    /// cannot see the caller's capabilities; scrub reads every file's data); the budget
    /// is capped so every mismatch of the step fits the reply.
    fn scrub_step(
        &self,
        req: &Request,
        i: INodeNo,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let asked = (in_data, out_size, scrub_ioctl::BYTES);
        let (from, budget) = match private_request(req, i, asked, scrub_ioctl::decode_request) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let budget = budget.clamp(1, scrub_ioctl::MAX_ENTRIES as u64);
        match self.fs.scrub_step(from, budget) {
            Ok(step) => match scrub_ioctl::encode_step(&step) {
                Some(b) => reply.ioctl(0, &b),
                None => {
                    tracing::error!("a scrub step of {budget} blocks had more entries");
                    reply.error(Errno::EOVERFLOW);
                }
            },
            Err(e) => reply.error(err(&e)),
        }
    }

    /// The online evacuation's ioctl (`evacuate_ioctl`): one part of the evacuation of a
    /// target, a step's budget capped. Only on the root directory, only for root.
    fn evacuate_part(
        &self,
        req: &Request,
        i: INodeNo,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        use evacuate_ioctl::{Part, Reply};
        let asked = (in_data, out_size, evacuate_ioctl::BYTES);
        let r = match private_request(req, i, asked, evacuate_ioctl::decode_request) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let t = r.target;
        let answer = match r.part {
            Part::Begin => self.fs.evacuate_begin(t).map(|()| Reply::default()),
            Part::Step { from, budget } => self
                .fs
                .evacuate_step(t, from, budget.clamp(1, evacuate_ioctl::MAX_BUDGET))
                .map(|step| Reply {
                    step,
                    meta_paths: 0,
                }),
            Part::Finish => self.fs.evacuate_finish(t).map(|meta_paths| Reply {
                meta_paths,
                ..Reply::default()
            }),
            Part::Cancel => self.fs.evacuate_cancel(t).map(|()| Reply::default()),
            Part::Retire => self.fs.retire_target(t).map(|()| Reply::default()),
        };
        match answer {
            Ok(a) => reply.ioctl(0, &evacuate_ioctl::encode_reply(&a)),
            Err(e) => {
                tracing::warn!(target = t.0, error = %e, "evacuation");
                reply.error(err(&e))
            }
        }
    }

    /// `add-target`'s ioctl (`target_ioctl`): opens the target at the path given and adds
    /// it (`Fs::add_target`). Only on the root directory, only for root (uid 0: it opens
    /// a device as the daemon). A refusal travels in the reply with its reason, so the
    /// caller can print it.
    fn add_target(
        &self,
        req: &Request,
        i: INodeNo,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let asked = (in_data, out_size, target_ioctl::BYTES);
        let path = match private_request(req, i, asked, target_ioctl::decode_request) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let added = self.open_and_add(&path);
        reply.ioctl(0, &target_ioctl::encode_reply(&added));
    }

    fn open_and_add(&self, path: &std::path::Path) -> target_ioctl::Added {
        use target_ioctl::Added;
        let Some(open) = &self.opener else {
            return Added::Refused("this daemon was started without a way to open targets".into());
        };
        let t = match (open.0)(path) {
            Ok(t) => t,
            Err(e) => return Added::Refused(e),
        };
        match self.fs.add_target(t) {
            Ok(n) => {
                let blocks = self
                    .fs
                    .status()
                    .targets
                    .get(n.index())
                    .map_or(0, |s| s.data_blocks);
                tracing::info!(target = n.0, path = %path.display(), "target added");
                Added::Joined {
                    index: n.0,
                    blocks,
                    block_size: self.fs.geometry().block_size.bytes(),
                }
            }
            Err(e) => Added::Refused(format!("{}: {e}", path.display())),
        }
    }

    /// The engine's handle behind a FUSE file handle (they are the same number; the
    /// engine keeps the handle's state, `O_DIRECT` included).
    fn open_file(&self, fh: FileHandle) -> Result<Fh, Errno> {
        self.fs
            .handle_ino(Fh(fh.0))
            .map(|_| Fh(fh.0))
            .map_err(|_| Errno::EBADF)
    }

    fn register(
        &self,
        req: &Request,
        ino: Ino,
        flags: i32,
    ) -> stripefs::Result<(FileHandle, FopenFlags)> {
        let direct = flags & libc::O_DIRECT != 0;
        let mode = if direct {
            OpenMode::Direct
        } else {
            OpenMode::Cached
        };
        let fh = self.fs.open_with(ino, mode)?;
        if flags & libc::O_TRUNC != 0 {
            if let Err(e) = self.truncate_on_open(req, ino) {
                let _ = self.fs.release(fh);
                return Err(e);
            }
        }
        // close(2) writes nothing back here (`flush`), so the kernel need not ask: one
        // round trip less per file. It still flushes under `-o writeback_cache`, where
        // the kernel ignores the flag and writes its dirty pages back first.
        let mut fo = FopenFlags::FOPEN_NOFLUSH;
        if direct && self.cfg.fopen_direct_io {
            fo |= FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        }
        Ok((FileHandle(fh.0), fo))
    }

    /// `FUSE_ATOMIC_O_TRUNC`: the kernel leaves `O_TRUNC` to us. POSIX marks mtime and
    /// ctime even when the file was already empty; an unprivileged caller loses the
    /// set-ID bits (`FUSE_OPEN_KILL_SUIDGID`).
    fn truncate_on_open(&self, req: &Request, ino: Ino) -> stripefs::Result<()> {
        let now = stripefs::time_now();
        let trunc = SetAttr {
            size: Some(0),
            mtime: Some(TimeSet::At(now)),
            ctime: Some(now),
            kill_setid: self.kill_on_truncate(req, ino)?,
            ..SetAttr::default()
        };
        self.fs.setattr(ino, &trunc).map(drop)
    }

    /// The file's group when it has a set-ID bit some change could drop (no `/proc`
    /// read otherwise: most files have none).
    fn setid_group(&self, ino: Ino) -> stripefs::Result<Option<u32>> {
        let a = self.fs.peek_attr(ino)?;
        let perm = (a.mode & 0o7777) as u16;
        Ok((stripefs::setid_dropped(a.kind, perm, SgidDrop::Always) != perm).then_some(a.gid))
    }

    /// Whether the VFS would drop set-group-ID even without group execute: the caller
    /// is neither in the file's group nor privileged (`setattr_should_drop_sgid`).
    fn sgid_rule(req: &Request, gid: u32) -> SgidDrop {
        if privs::in_group_or_capable(req.pid(), req.gid(), gid) {
            SgidDrop::IfGroupExecutable
        } else {
            SgidDrop::Always
        }
    }

    /// Truncate by a caller without `CAP_FSETID`: set-user-ID, and set-group-ID when
    /// group-executable, go.
    fn kill_on_truncate(&self, req: &Request, ino: Ino) -> stripefs::Result<Option<SgidDrop>> {
        let has = self.setid_group(ino)?.is_some();
        Ok((has && !privs::has_fsetid(req.pid())).then_some(SgidDrop::IfGroupExecutable))
    }

    /// Chown: set-user-ID goes, set-group-ID too when group-executable or when the
    /// caller is neither in the group nor privileged.
    fn kill_on_chown(&self, req: &Request, ino: Ino) -> stripefs::Result<Option<SgidDrop>> {
        Ok(self.setid_group(ino)?.map(|gid| Self::sgid_rule(req, gid)))
    }

    /// A write (or fallocate) by a caller without `CAP_FSETID` drops set-ID bits as a
    /// chown does.
    fn kill_on_write(&self, req: &Request, ino: Ino, fsetid: Fsetid) -> stripefs::Result<()> {
        match self.setid_group(ino)? {
            Some(_) if fsetid == Fsetid::Unknown && privs::has_fsetid(req.pid()) => Ok(()),
            Some(gid) => self.fs.drop_setid(ino, Self::sgid_rule(req, gid)),
            None => Ok(()),
        }
    }
}

/// What is known of a writer's `CAP_FSETID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fsetid {
    /// The kernel said the writer lacks it (`FUSE_WRITE_KILL_SUIDGID`).
    Lacking,
    /// The kernel said nothing (fallocate): ask `/proc`.
    Unknown,
}

fn err(e: &FsError) -> Errno {
    match e {
        FsError::Io(_) | FsError::Corrupted(_) | FsError::Poisoned(_) => {
            tracing::warn!(%e, "request failed");
        }
        _ => tracing::debug!(%e, "request failed"),
    }
    Errno::from_i32(e.errno())
}

fn done(reply: ReplyEmpty, r: stripefs::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(&e)),
    }
}

fn entry(reply: ReplyEntry, r: stripefs::Result<stripefs::Attr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &convert::attr(&a), Generation(0)),
        Err(e) => reply.error(err(&e)),
    }
}

fn attr(reply: ReplyAttr, r: stripefs::Result<stripefs::Attr>) {
    match r {
        Ok(a) => reply.attr(&TTL, &convert::attr(&a)),
        Err(e) => reply.error(err(&e)),
    }
}

fn written(reply: ReplyWrite, r: stripefs::Result<usize>) {
    match r {
        Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
        Err(e) => reply.error(err(&e)),
    }
}

fn ino(i: INodeNo) -> Ino {
    Ino(i.0)
}

/// With `FUSE_DONT_MASK` the kernel leaves the umask to us: the engine applies it unless
/// the parent has a default ACL.
fn params(req: &Request, mode: u32, umask: u32) -> CreateParams {
    CreateParams {
        perm: convert::perm(mode),
        umask: convert::perm(umask) & 0o777,
        uid: req.uid(),
        gid: req.gid(),
        layout: None,
        rdev: 0,
    }
}

fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(convert::timespec(s)),
    })
}

impl Filesystem for StripeFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut want = InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK
            | InitFlags::FUSE_EXPORT_SUPPORT;
        if self.cfg.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        let have = config.capabilities();
        if let Err(missing) = config.add_capabilities(want & have) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        if (want & !have) != InitFlags::empty() {
            tracing::info!(missing = ?(want & !have), "kernel lacks FUSE capabilities");
        }
        if let Err(max) = config.set_max_write(MAX_WRITE) {
            tracing::info!(max, "kernel caps max_write");
            let _ = config.set_max_write(max);
        }
        if let Err(nearest) = config.set_max_background(MAX_BACKGROUND) {
            tracing::warn!(nearest, "max_background refused; the kernel default stays");
        }
        self.init_uring(config)
    }

    fn destroy(&mut self) {
        self.dirs.release_all(&self.fs);
        tracing::info!("FUSE session ends");
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.dirs.forget(&self.fs, ino(i), nlookup);
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The handle keeps a directory removed while open answerable (link count 0).
        match self.fs.open(ino(i)) {
            Ok(fh) => reply.opened(FileHandle(fh.0), FopenFlags::empty()),
            Err(e) => reply.error(err(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        done(reply, self.fs.release(Fh(fh.0)));
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.counts.add(Op::Lookup);
        // FUSE_EXPORT_SUPPORT: a file handle whose inode the kernel no longer caches
        // comes back as LOOKUP(node id, "."), whatever the inode's kind; a directory's
        // parent as LOOKUP(node id, "..").
        let r = if name.as_bytes() == b"." {
            self.fs.by_handle(ino(parent))
        } else {
            self.fs.lookup(ino(parent), name)
        };
        self.entry(reply, r);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.counts.add(Op::Getattr);
        attr(reply, self.fs.getattr(ino(i)))
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.counts.add(Op::Setattr);
        // FUSE_HANDLE_KILLPRIV_V2: chown and truncate drop set-ID bits here.
        // A SETATTR that changes nothing (at most ctime) comes only from the kernel's
        // "remove privileges" step once it has taken the kill bits out: chown(f, -1, -1),
        // or a write, truncate or fallocate by a caller without CAP_FSETID. Each of
        // those drops set-ID bits by the chown rule.
        let bare_ctime = atime.is_none() && mtime.is_none();
        let kill = match (mode, uid.or(gid), size) {
            (Some(_), _, _) => Ok(None),
            (None, Some(_), _) => self.kill_on_chown(req, ino(i)),
            (None, None, Some(_)) => self.kill_on_truncate(req, ino(i)),
            (None, None, None) if bare_ctime => self.kill_on_chown(req, ino(i)),
            (None, None, None) => Ok(None),
        };
        let kill_setid = match kill {
            Ok(k) => k,
            Err(e) => return reply.error(err(&e)),
        };
        let s = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
            ctime: ctime.map(convert::timespec),
            kill_setid,
        };
        attr(reply, self.fs.setattr(ino(i), &s))
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino(i)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = convert::kind_of_mode(mode) else {
            reply.error(Errno::EINVAL);
            return;
        };
        let r = self
            .file_params(req, ino(parent), mode, umask)
            .and_then(|p| {
                let p = CreateParams {
                    rdev: u64::from(rdev),
                    ..p
                };
                if kind == FileKind::Regular {
                    self.fs.create(ino(parent), name, p)
                } else {
                    self.fs.mknod(ino(parent), name, kind, p)
                }
            });
        entry(reply, r)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.fs.mkdir(ino(parent), name, params(req, mode, umask)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.fs.unlink(ino(parent), name))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.fs.rmdir(ino(parent), name))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let p = params(req, 0o777, 0);
        entry(
            reply,
            self.fs
                .symlink(ino(parent), link_name, target.as_os_str(), p),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else if flags.is_empty() {
            RenameMode::Replace
        } else {
            reply.error(Errno::EINVAL);
            return;
        };
        let r = self
            .fs
            .rename(ino(parent), name, ino(newparent), newname, mode);
        done(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.fs.link(ino(i), ino(newparent), newname))
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.counts.add(Op::Open);
        match self.register(req, ino(i), flags.0) {
            Ok((fh, fo)) => reply.opened(fh, fo),
            Err(e) => reply.error(err(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.counts.add(Op::Create);
        let p = self.file_params(req, ino(parent), mode, umask);
        let a = match p.and_then(|p| self.fs.create(ino(parent), name, p)) {
            Ok(a) => a,
            Err(e) => return reply.error(err(&e)),
        };
        match self.register(req, a.ino, flags) {
            Ok((fh, fo)) => reply.created(&TTL, &convert::attr(&a), Generation(0), fh, fo),
            Err(e) => reply.error(err(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.counts.add(Op::Read);
        // An `O_DIRECT` handle is answered from the targets' completion thread (this
        // worker moves on), a cached one before `read` returns.
        self.fs
            .read(Fh(fh.0), offset, size as usize, move |r| match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(err(&e)),
            });
    }

    fn write(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.counts.add(Op::Write);
        let fh = match self.open_file(fh) {
            Ok(fh) => fh,
            Err(e) => return reply.error(e),
        };
        // FUSE_HANDLE_KILLPRIV_V2: the kernel marks writers without CAP_FSETID; their
        // write drops the set-ID bits first, as the VFS does before writing.
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.kill_on_write(req, ino(i), Fsetid::Lacking) {
                return reply.error(err(&e));
            }
        }
        // Page-cache writeback (a shared mapping's dirty pages) may come through an
        // `O_DIRECT` handle; it is buffered data, not held to direct-I/O alignment.
        let origin = if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            WriteOrigin::PageCache
        } else {
            WriteOrigin::Caller
        };
        // An `O_DIRECT` handle is answered from the targets' completion thread.
        self.fs
            .write(fh, offset, data, origin, move |r| written(reply, r));
    }

    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Op::Flush);
        // Sent only under `-o writeback_cache` (handles are `FOPEN_NOFLUSH`), after the
        // kernel wrote its pages back. close(2) does not write back (as on XFS and
        // ext4); it only reports a shutdown.
        match self.open_file(fh) {
            Ok(_) if self.fs.is_poisoned() => reply.error(Errno::EIO),
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Op::Release);
        match self.open_file(fh) {
            Ok(fh) => done(reply, self.fs.release(fh)),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.counts.add(Op::Fsync);
        match self.open_file(fh) {
            Ok(fh) => {
                let scope = if datasync {
                    SyncScope::Data
                } else {
                    SyncScope::All
                };
                done(reply, self.fs.fsync_handle(fh, scope));
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Makes the directory's entries durable: one journal commit if any is pending.
        // First it catches up with a remount (`session::follow_kernel_access`), so that
        // `fsync` on the mount after `mount -o remount,ro` returns once the engine is
        // read-only and checkpointed: the mount helper relies on it.
        let r = self.fs.follow_access_source();
        let scope = if datasync {
            SyncScope::Data
        } else {
            SyncScope::All
        };
        done(reply, r.and_then(|()| self.fs.fsync(ino(i), scope)))
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // The offset is a cookie (`DirCookie`): "." is 1, ".." is 2, an entry its own
        // cookie (3 and up), so a listing resumed across creates and unlinks returns
        // every entry present throughout exactly once.
        let after = stripefs::DirCookie(offset.max(2));
        let entries = match self.fs.readdir_from(ino(i), after, READDIR_BATCH) {
            Ok(v) => v,
            Err(e) => return reply.error(err(&e)),
        };
        let parent = self
            .fs
            .lookup(ino(i), "..".as_ref())
            .map_or(i.0, |a| a.ino.0);
        let dots = [(i.0, 1, b".".to_vec()), (parent, 2, b"..".to_vec())];
        let all = dots
            .into_iter()
            .filter(|&(_, next, _)| next > offset)
            .map(|(n, next, name)| (n, next, fuser::FileType::Directory, name))
            .chain(
                entries
                    .into_iter()
                    .map(|e| (e.ino.0, e.cookie.0, convert::file_type(e.kind), e.name)),
            );
        for (n, next, kind, name) in all {
            if reply.add(INodeNo(n), next, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files + s.files_free,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(err(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let r = self.fs.setxattr(ino(i), name, value, mode);
        let r = r.and_then(|()| match name.as_bytes() {
            ACL_ACCESS => self.acl_kill_sgid(req, ino(i)),
            _ => Ok(()),
        });
        done(reply, r)
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.counts.add(Op::Getxattr);
        match self.fs.getxattr(ino(i), name) {
            Ok(v) => xattr_reply(reply, &v, size),
            Err(e) => reply.error(err(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino(i)) {
            Ok(names) => {
                let mut v = Vec::new();
                for n in names {
                    v.extend_from_slice(&n);
                    v.push(0);
                }
                xattr_reply(reply, &v, size);
            }
            Err(e) => reply.error(err(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.fs.removexattr(ino(i), name))
    }

    fn fallocate(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let Some(m) = convert::falloc_mode(mode) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        // As a write (the VFS's file_modified), but the kernel sends no kill flag here.
        if let Err(e) = self.kill_on_write(req, ino(i), Fsetid::Unknown) {
            return reply.error(err(&e));
        }
        done(reply, self.fs.fallocate(ino(i), m, offset, length))
    }

    /// `copy_file_range` (`FUSE_COPY_FILE_RANGE`): the kernel wrote back both ranges of
    /// its cache first and drops the destination's after the reply. Answered by sharing
    /// the block-aligned middle (a clone) and copying the unaligned edges
    /// (`Fs::copy_file_range`), so `cp` of a large file is instant and takes no space.
    /// The reply's byte count is 32 bits: at most `u32::MAX` rounded down to a page per
    /// request (the kernel clamps `len` the same way; `cp` loops).
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        if let Err(e) = self.open_file(fh_in).and(self.open_file(fh_out)) {
            return reply.error(e);
        }
        // As a write of the destination (the VFS's file_modified).
        if let Err(e) = self.kill_on_write(req, ino(ino_out), Fsetid::Unknown) {
            return reply.error(err(&e));
        }
        let len = len.min(u64::from(u32::MAX) & !4095);
        let r = self
            .fs
            .copy_file_range(ino(ino_in), offset_in, ino(ino_out), offset_out, len);
        written(reply, r.map(|n| usize::try_from(n).unwrap_or(usize::MAX)));
    }

    /// The attribute-flag ioctls (`chattr`, `lsattr`). The kernel never passes the
    /// user's `FS_IOC_GETFLAGS`/`SETFLAGS` through: its `fileattr_get`/`fileattr_set`
    /// (after checking that the caller owns the file) send their own restricted ioctl on
    /// a handle it opens for the purpose, with a 4-byte `int` in (`SETFLAGS`) or out
    /// (`GETFLAGS`), whatever the size encoded in the command. A `SETFLAGS` is preceded
    /// by an `FS_IOC_FSGETXATTR` (the kernel reads the old attributes in the XFS form
    /// first), so that one is answered too: no XFS flag applies (NOCOW has none), so all
    /// fields are 0, `fsx_nextents` included (not counted). `FS_IOC_FSSETXATTR` succeeds
    /// only when it asks for nothing (all fields 0), else `EOPNOTSUPP`. Everything else
    /// is `ENOTTY` (not an ioctl of this file system).
    fn ioctl(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd == scrub_ioctl::SCRUB_STEP {
            return self.scrub_step(req, i, in_data, out_size, reply);
        }
        if cmd == target_ioctl::ADD_TARGET {
            return self.add_target(req, i, in_data, out_size, reply);
        }
        if cmd == evacuate_ioctl::EVACUATE {
            return self.evacuate_part(req, i, in_data, out_size, reply);
        }
        match convert::flags_ioctl(cmd) {
            Some(convert::FlagsIoctl::Get) if out_size >= 4 => match self.fs.file_flags(ino(i)) {
                Ok(f) => reply.ioctl(0, &f.0.to_ne_bytes()),
                Err(e) => reply.error(err(&e)),
            },
            Some(convert::FlagsIoctl::Set) => {
                let Some(v) = in_data.first_chunk::<4>() else {
                    return reply.error(Errno::EINVAL);
                };
                let f = stripefs::FileFlags(u32::from_ne_bytes(*v));
                match self.fs.set_file_flags(ino(i), f) {
                    Ok(()) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(err(&e)),
                }
            }
            Some(convert::FlagsIoctl::FsxGet) if out_size >= convert::FSXATTR_BYTES => {
                match self.fs.file_flags(ino(i)) {
                    Ok(_) => reply.ioctl(0, &[0u8; convert::FSXATTR_BYTES as usize]),
                    Err(e) => reply.error(err(&e)),
                }
            }
            Some(convert::FlagsIoctl::FsxSet) => {
                if in_data.len() < convert::FSXATTR_BYTES as usize {
                    return reply.error(Errno::EINVAL);
                }
                // xflags, extent size, (nextents: read-only), project, cow extent size.
                let asks = [0..4, 4..8, 12..16, 16..20]
                    .into_iter()
                    .any(|r| in_data[r].iter().any(|&b| b != 0));
                match self.fs.file_flags(ino(i)) {
                    Ok(_) if asks => reply.error(Errno::EOPNOTSUPP),
                    Ok(_) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(err(&e)),
                }
            }
            Some(_) => reply.error(Errno::EINVAL),
            None => {
                tracing::debug!(cmd = format_args!("{cmd:#x}"), "ioctl not supported");
                reply.error(Errno::ENOTTY);
            }
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let what = match whence {
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek(ino(i), off, what) {
            Ok(o) => reply.offset(i64::try_from(o).unwrap_or(i64::MAX)),
            Err(e) => reply.error(err(&e)),
        }
    }
}

fn xattr_reply(reply: ReplyXattr, v: &[u8], size: u32) {
    if size == 0 {
        reply.size(u32::try_from(v.len()).unwrap_or(u32::MAX));
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(v);
    }
}

/// The private ioctls (scrub, evacuation, add-target) are answered on the mount's root
/// only (`ENOTTY` elsewhere, as for an unknown command) and for root only (`EPERM`: the
/// daemon cannot see the caller's capabilities).
fn root_only(req: &Request, i: INodeNo) -> Option<Errno> {
    if ino(i) != Ino::ROOT {
        return Some(Errno::ENOTTY);
    }
    (req.uid() != 0).then_some(Errno::EPERM)
}

/// A private ioctl's request: [`root_only`], then `decode` of the argument `in_data`,
/// whose reply room `out_size` must hold the ioctl's `bytes` (`EINVAL` otherwise).
fn private_request<T>(
    req: &Request,
    i: INodeNo,
    (in_data, out_size, bytes): (&[u8], u32, usize),
    decode: impl FnOnce(&[u8]) -> Option<T>,
) -> Result<T, Errno> {
    if let Some(e) = root_only(req, i) {
        return Err(e);
    }
    decode(in_data)
        .filter(|_| out_size as usize >= bytes)
        .ok_or(Errno::EINVAL)
}

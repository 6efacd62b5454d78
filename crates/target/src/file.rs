//! `FileTarget`: a regular file or block device opened with `O_DIRECT`.
//!
//! The logical sector size comes from the device (`BLKSSZGET`) or, for regular files, from
//! `statx(STATX_DIOALIGN)`. Submitted operations are served asynchronously by an io_uring
//! thread per target ([`EngineKind::Uring`]); where io_uring cannot be set up (old kernel,
//! seccomp, `io_uring_disabled`) a pool of threads issuing `preadv`/`pwritev` takes over
//! ([`EngineKind::Threads`]). The synchronous methods (`read_sync`, `flush_sync`, ...) run
//! their system call on the calling thread instead (`Target::submit_here`). File systems that refuse `O_DIRECT` (tmpfs) are opened buffered
//! and say so in the log; flush still means `fdatasync`.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use crate::pool::PoolEngine;
use crate::uring::UringEngine;
use crate::{fail_now, validate, Completion, IoDone, IoOp, Target, TargetError, TargetInfo};
use crate::{FuaSupport, LockWait, OpCounters, OpCounts, OpKind, TargetErrorKind};

/// Which submission engine serves a [`FileTarget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// io_uring if it can be set up, otherwise threads.
    #[default]
    Auto,
    /// io_uring only (fail to open otherwise).
    Uring,
    /// A pool of threads issuing positioned system calls.
    Threads,
}

/// How to open a file target.
#[derive(Debug, Clone, Copy)]
pub struct FileTargetOptions {
    /// Submission engine.
    pub engine: EngineKind,
    /// Per-target limit of operations in flight (back-pressure beyond it).
    pub queue_depth: u32,
    /// Create the file with this size if it does not exist.
    pub create_size: Option<u64>,
}

impl Default for FileTargetOptions {
    fn default() -> Self {
        Self {
            engine: EngineKind::Auto,
            queue_depth: 128,
            create_size: None,
        }
    }
}

#[derive(Debug)]
enum Engine {
    Uring(UringEngine),
    Threads(PoolEngine),
}

/// A file or block device target; see the module documentation.
#[derive(Debug)]
pub struct FileTarget {
    info: TargetInfo,
    fd: Arc<OwnedFd>,
    engine: Engine,
    direct: bool,
    block_device: bool,
    counters: OpCounters,
    /// Slow synchronous operations are logged (debug logging was on at open).
    timed: bool,
}

const STATX_DIOALIGN: u32 = 0x2000;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileTarget {
    /// Opens (and with `create_size`, creates) the target at `path`, and holds its
    /// exclusive lock (`flock`, see `lock.rs`) until dropped.
    ///
    /// # Errors
    /// `Open` errors for missing files, wrong file types, sector sizes above 4 KiB, or an
    /// engine that cannot be started; `InUse`, naming the holder, when the target is open
    /// elsewhere (another process, or another `FileTarget` here).
    pub fn open(path: &Path, opts: FileTargetOptions) -> Result<Self, TargetError> {
        let name: Arc<str> = Arc::from(path.display().to_string());
        let open_err = |e: std::io::Error| {
            TargetError::from_errno(
                name.clone(),
                OpKind::Open,
                0,
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        };
        if let Some(size) = opts.create_size {
            if !path.exists() {
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(open_err)?;
                f.set_len(size).map_err(open_err)?;
            }
        }
        let (file, direct) = open_direct(path).map_err(open_err)?;
        // Before anything else: a target open elsewhere is not touched (geometry ioctls
        // and engine set-up included).
        crate::lock::lock(&file, &name, LockWait::No)?;
        let meta = file.metadata().map_err(open_err)?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.file_type().is_file() {
            let why = "not a regular file or block device".to_string();
            return Err(TargetError::new(
                name,
                OpKind::Open,
                0,
                TargetErrorKind::Unusable(why),
            ));
        }
        let (size, sector) = geometry(&file, block_device, direct).map_err(open_err)?;
        if !(512..=4096).contains(&sector) || !sector.is_power_of_two() {
            let why = format!("logical sector size {sector} is not a power of two in 512..=4096");
            return Err(TargetError::new(
                name,
                OpKind::Open,
                0,
                TargetErrorKind::Unusable(why),
            ));
        }
        if !direct {
            tracing::warn!(target = %name, "O_DIRECT refused by the host file system; using buffered I/O");
        }
        let size_bytes = size - size % u64::from(sector);
        let fd = Arc::new(OwnedFd::from(file));
        let engine = start_engine(&fd, &name, opts).map_err(open_err)?;
        let info = TargetInfo {
            name,
            size_bytes,
            sector_size: sector,
            // `RWF_DSYNC` on every kind of file: the kernel sends `REQ_FUA` (or a write and
            // a cache flush where the device lacks FUA, or, for a regular file, whatever
            // its file system needs to make the written range durable).
            fua: FuaSupport::Native,
        };
        Ok(Self {
            info,
            fd,
            engine,
            direct,
            block_device,
            counters: OpCounters::default(),
            timed: tracing::enabled!(tracing::Level::DEBUG),
        })
    }

    /// True when io_uring can be set up on this machine (else [`EngineKind::Auto`] uses
    /// threads).
    #[must_use]
    pub fn io_uring_available() -> bool {
        UringEngine::probe().is_ok()
    }

    /// True when the target was opened with `O_DIRECT`.
    #[must_use]
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// True for block devices.
    #[must_use]
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// The engine serving this target: `"io_uring"` or `"threads"`.
    #[must_use]
    pub fn engine_name(&self) -> &'static str {
        match self.engine {
            Engine::Uring(_) => "io_uring",
            Engine::Threads(_) => "threads",
        }
    }

    /// Runs `op` on the calling thread, with the same system calls as the thread engine,
    /// leaving the buffers in `op` ([`Target::submit_here`]).
    ///
    /// A caller that waits for one operation would otherwise hand it to the engine's
    /// thread and sleep until that thread hands the completion back: two wake-ups per
    /// operation, which on a small virtual machine cost as much as a 4 KiB device write.
    /// The synchronous methods of [`Target`] come here; concurrent batches still go
    /// through the engine, which keeps many in flight.
    fn execute_here(&self, op: &mut IoOp) -> Result<(), TargetError> {
        validate(&self.info, op)?;
        self.counters.note(op);
        if let IoOp::Discard { offset, len } = *op {
            return self.discard(offset, len);
        }
        // Timed only with this module's debug log on, as the io_uring engine's operations.
        let start = self.timed.then(std::time::Instant::now);
        let res = crate::pool::execute(self.fd.as_raw_fd(), op)
            .map_err(|(at, kind)| TargetError::new(self.info.name.clone(), op.kind(), at, kind));
        if let Some(took) = start
            .map(|t| t.elapsed())
            .filter(|d| *d >= crate::uring::SLOW_OP)
        {
            tracing::debug!(
                target = %self.info.name,
                op = ?op.kind(),
                offset = op.offset(),
                len = op.len(),
                total_ms = took.as_secs_f64() * 1e3,
                "slow operation (on the caller's thread)"
            );
        }
        res
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), TargetError> {
        let fd = self.fd.as_raw_fd();
        let rc = if self.block_device {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 from the pointer, which lives across the call.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: plain system call on an fd we own.
            unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) }
        };
        if rc < 0 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            return Err(TargetError::from_errno(
                self.info.name.clone(),
                OpKind::Discard,
                offset,
                errno,
            ));
        }
        Ok(())
    }
}

fn open_direct(path: &Path) -> std::io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC);
    match o.open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let f = OpenOptions::new().read(true).write(true).open(path)?;
            Ok((f, false))
        }
        Err(e) => Err(e),
    }
}

fn geometry(file: &File, block_device: bool, direct: bool) -> std::io::Result<(u64, u32)> {
    let fd = file.as_raw_fd();
    if block_device {
        let mut size: u64 = 0;
        let mut sector: libc::c_int = 0;
        // SAFETY: the ioctls write one u64 / one int into the pointed-to locals.
        let rc = unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut size) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        let rc = unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut sector) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        return Ok((size, u32::try_from(sector).unwrap_or(0)));
    }
    let size = file.metadata()?.len();
    let sector = if direct {
        dio_alignment(fd).unwrap_or(512)
    } else {
        512
    };
    Ok((size, sector))
}

/// `statx(STATX_DIOALIGN)`: the offset alignment `O_DIRECT` requires on this file.
fn dio_alignment(fd: RawFd) -> Option<u32> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    // SAFETY: valid fd, NUL-terminated empty path with AT_EMPTY_PATH, and a valid out pointer.
    let rc = unsafe {
        libc::statx(
            fd,
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some(stx.stx_dio_offset_align)
}

fn start_engine(
    fd: &Arc<OwnedFd>,
    name: &Arc<str>,
    opts: FileTargetOptions,
) -> std::io::Result<Engine> {
    let depth = opts.queue_depth.clamp(1, 4096) as usize;
    match opts.engine {
        EngineKind::Uring => Ok(Engine::Uring(UringEngine::new(
            Arc::clone(fd),
            name.clone(),
            depth,
        )?)),
        EngineKind::Threads => Ok(Engine::Threads(PoolEngine::new(
            Arc::clone(fd),
            name.clone(),
            depth,
        )?)),
        EngineKind::Auto => match UringEngine::new(Arc::clone(fd), name.clone(), depth) {
            Ok(u) => Ok(Engine::Uring(u)),
            Err(e) => {
                tracing::info!(target = %name, error = %e, "io_uring unavailable; using threads");
                Ok(Engine::Threads(PoolEngine::new(
                    Arc::clone(fd),
                    name.clone(),
                    depth,
                )?))
            }
        },
    }
}

impl Target for FileTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn submit(&self, op: IoOp, done: Completion) {
        if let Err(e) = validate(&self.info, &op) {
            return fail_now(op, done, e);
        }
        self.counters.note(&op);
        if let IoOp::Discard { offset, len } = op {
            return done(IoDone {
                bufs: Vec::new(),
                result: self.discard(offset, len),
            });
        }
        match &self.engine {
            Engine::Uring(u) => u.submit(op, done),
            Engine::Threads(p) => p.submit(op, done),
        }
    }

    fn submit_here(&self, mut op: IoOp, done: Completion) {
        let result = self.execute_here(&mut op);
        done(IoDone {
            bufs: op.into_bufs(),
            result,
        });
    }

    fn op_counts(&self) -> Option<OpCounts> {
        Some(self.counters.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, IoBuf};

    fn roundtrip(engine: EngineKind) {
        let dir =
            std::env::temp_dir().join(format!("stripefs-ft-{}-{engine:?}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let opts = FileTargetOptions {
            engine,
            queue_depth: 8,
            create_size: Some(1 << 20),
        };
        let t = FileTarget::open(&dir, opts).unwrap();
        let batch = Batch::new();
        for i in 0..64u64 {
            let buf = IoBuf::from_slice(&[i as u8 + 1; 4096]);
            batch.submit(
                &t,
                IoOp::Write {
                    offset: i * 4096,
                    bufs: vec![buf],
                },
            );
        }
        assert!(batch.wait().iter().all(|d| d.result.is_ok()));
        t.write_fua_sync(4096, IoBuf::from_slice(&[0xee; 4096]))
            .unwrap();
        assert_eq!(t.read_sync(4096, 4096).unwrap()[0], 0xee);
        t.write_sync(4096, IoBuf::from_slice(&[2; 4096])).unwrap();
        t.flush_sync().unwrap();
        let c = t.op_counts().unwrap();
        assert_eq!((c.writes, c.fua_writes, c.flushes), (65, 1, 1));
        for i in [0u64, 17, 63] {
            assert_eq!(t.read_sync(i * 4096, 4096).unwrap()[100], i as u8 + 1);
        }
        let e = t.read_sync(1 << 20, 4096).unwrap_err();
        assert!(matches!(e.kind, TargetErrorKind::OutOfRange { .. }));
        drop(t);
        std::fs::remove_file(&dir).unwrap();
    }

    /// `submit_here` completes before it returns, with the buffers back, on success and
    /// on a refused operation alike.
    #[test]
    fn submit_here_completes_before_returning() {
        let path = std::env::temp_dir().join(format!("stripefs-fth-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let opts = FileTargetOptions {
            create_size: Some(1 << 20),
            ..FileTargetOptions::default()
        };
        let t = FileTarget::open(&path, opts).unwrap();
        for (offset, ok) in [(8192, true), (1 << 20, false)] {
            let got = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
            let g = std::sync::Arc::clone(&got);
            let bufs = vec![IoBuf::from_slice(&[7; 4096])];
            t.submit_here(
                IoOp::Write { offset, bufs },
                Box::new(move |d| g.lock().push((d.result.is_ok(), d.bufs.len()))),
            );
            assert_eq!(*got.lock(), vec![(ok, 1)], "write at {offset}");
        }
        assert_eq!(t.read_sync(8192, 4096).unwrap()[0], 7);
        assert_eq!(
            t.op_counts().unwrap().writes,
            1,
            "the refused write is not counted"
        );
        drop(t);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn uring_roundtrip() {
        if FileTarget::io_uring_available() {
            roundtrip(EngineKind::Uring);
        }
    }

    #[test]
    fn threads_roundtrip() {
        roundtrip(EngineKind::Threads);
    }

    /// A target open once is locked: a second open, here or in another process, fails
    /// with `InUse` naming the path and the holder; once the first is dropped (or the
    /// other process exits) it opens.
    #[test]
    fn a_second_open_fails_naming_the_path_and_the_holder() {
        let path = std::env::temp_dir().join(format!("stripefs-ft-lock-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let opts = FileTargetOptions {
            create_size: Some(1 << 20),
            ..FileTargetOptions::default()
        };
        let first = FileTarget::open(&path, opts).unwrap();
        let e = FileTarget::open(&path, opts).unwrap_err();
        assert!(matches!(e.kind, TargetErrorKind::InUse { .. }), "{e}");
        assert_eq!(e.errno(), libc::EBUSY);
        let msg = e.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("in use by this process"), "{msg}");
        drop(first);
        drop(FileTarget::open(&path, opts).expect("the lock goes with the target"));
        // Another process: util-linux flock(1) holds the lock while its child sleeps.
        let mut holder = std::process::Command::new("flock")
            .args(["-x", "-o"])
            .arg(&path)
            .args(["sleep", "30"])
            .spawn()
            .expect("flock(1) from util-linux");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let e = loop {
            match FileTarget::open(&path, opts) {
                Err(e) => break e,
                Ok(t) if std::time::Instant::now() < deadline => {
                    drop(t);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Ok(_) => panic!("flock(1) never took the lock"),
            }
        };
        let msg = e.to_string();
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(
            msg.contains(&format!("in use by process {} (flock)", holder.id())),
            "{msg}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

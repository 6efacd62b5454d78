//! Mounting: the FUSE session runs on its own threads until the kernel unmounts.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use parking_lot::Mutex;
use stripefs::Fs;

use crate::{FuseConfig, StripeFuse};

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
        }
    }
}

/// A mounted file system being served.
#[derive(Debug)]
pub struct Mounted {
    unmounter: Unmounter,
    thread: JoinHandle<io::Result<()>>,
}

impl Mounted {
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
        self.thread
            .join()
            .map_err(|_| io::Error::other("FUSE session thread panicked"))?
    }
}

/// Unmounts a [`Mounted`] from another thread.
#[derive(Debug, Clone)]
pub struct Unmounter(Arc<Mutex<SessionUnmounter>>);

impl Unmounter {
    /// Detaches the mount; the session then ends. Unmounting twice is harmless.
    ///
    /// # Errors
    /// The kernel refused (the mount is busy).
    pub fn unmount(&self) -> io::Result<()> {
        self.0.lock().unmount()
    }
}

/// Mounts `fs` at `mountpoint` and serves it on background threads.
///
/// # Errors
/// The mount failed (no `/dev/fuse`, not permitted, bad mount point).
pub fn serve(fs: Arc<Fs>, mountpoint: &Path, opts: &ServeOptions) -> io::Result<Mounted> {
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
    let mut cfg = Config::default();
    cfg.mount_options = mount_options;
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    let mut session = Session::new(StripeFuse::new(fs, opts.fuse), mountpoint, &cfg)?;
    let unmounter = Unmounter(Arc::new(Mutex::new(session.unmount_callable())));
    let thread = std::thread::Builder::new()
        .name("stripefs-fuse".into())
        .spawn(move || session.run())?;
    Ok(Mounted { unmounter, thread })
}

//! `stripefs mount` and `stripefs umount`: serve a file system through FUSE.
//!
//! Every open target holds an exclusive `flock` (`FileTarget::open`, `NbdTarget::open`),
//! so the daemon holds them for as long as the engine is mounted: a second mount (or `io`, `fsck`, `inspect`) of the same targets is refused,
//! and `stripefs umount` waits on the locks, so when it returns the journal is
//! checkpointed and the targets are closed. After a plain `umount` (which does not wait)
//! the next mount waits for the old daemon ([`LockWait::WhileReleasing`]).

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use stripefs::Fs;
use stripefs_fuse::{serve, ServeOptions};

use crate::targets::{lock_targets, open_all_with, LockWait};

/// Mount a stripefs file system through FUSE.
#[derive(Debug, clap::Args)]
#[command(after_help = format!("FUSE keys of -o: {}.", stripefs_fuse::FUSE_KEYS))]
pub struct MountArgs {
    /// Mount options: engine keys (see `stripefs io --help`), the FUSE front end's keys
    /// (listed below) and NBD target keys (nbd_timeout=SECS|NNms, nbd_conns=N).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground (logs go to stderr; set STRIPEFS_LOG=info for more).
    #[arg(short = 'f')]
    foreground: bool,
    /// Print nothing on success (the mount helper always passes it: `mount(8)` helpers
    /// are silent).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The targets (paths or NBD URIs), then the mount point.
    #[arg(required = true, num_args = 2.., value_name = "TARGET... MOUNTPOINT")]
    paths: Vec<PathBuf>,
}

/// Unmount a stripefs mount and wait until its daemon has checkpointed and exited.
#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
}

/// Splits `-o` into engine options and the FUSE front end's (parsed by it).
///
/// # Errors
/// A sentence naming the unknown word or the bad value.
pub fn split_options(list: &[String]) -> Result<(Vec<String>, ServeOptions), String> {
    let engine_word =
        |w: &str| crate::mount_opts::atime_word(&mut stripefs::AtimePolicy::default(), w);
    stripefs_fuse::split_options(list, engine_word).map_err(|e| match e {
        stripefs_fuse::OptionError::Unknown(_) => {
            format!("{e}; engine keys: {}", crate::mount_opts::KEYS)
        }
        stripefs_fuse::OptionError::BadValue(_) => e.to_string(),
    })
}

/// The name `mount(8)` runs for `-t fuse.stripefs` (install it as a link to `stripefs`:
/// `scripts/install-mount-helper`).
pub const HELPER_NAME: &str = "mount.fuse.stripefs";

/// When run as the mount helper (`mount.fuse.stripefs SOURCE MOUNTPOINT [-sfnv] [-o OPTS]`,
/// SOURCE the targets joined by `:`), the equivalent `stripefs mount` command line.
/// `None` when run under any other name.
///
/// # Errors
/// A usage error.
pub fn helper_args(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> Option<Result<Vec<std::ffi::OsString>, String>> {
    let mut args = args.peekable();
    let argv0 = PathBuf::from(args.next()?);
    if argv0.file_name()? != HELPER_NAME {
        return None;
    }
    Some(translate_helper(
        args.map(|a| a.to_string_lossy().into_owned()).collect(),
    ))
}

fn translate_helper(args: Vec<String>) -> Result<Vec<std::ffi::OsString>, String> {
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => opts.push(it.next().ok_or("-o needs a value")?),
            // No mtab, sloppy, verbose: nothing to do. Fake (-f) is refused rather than
            // pretended.
            "-n" | "-s" | "-v" => {}
            "-f" => return Err("fake mounts (-f) are not supported".into()),
            "-t" => {
                it.next();
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ => positional.push(a),
        }
    }
    let [source, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|_| format!("usage: {HELPER_NAME} SOURCE MOUNTPOINT [-o OPTIONS]"))?;
    let remount = opts
        .iter()
        .flat_map(|o| o.split(','))
        .any(|w| w == "remount");
    if remount {
        let mut out: Vec<std::ffi::OsString> = vec!["stripefs".into(), "remount".into()];
        for o in opts {
            out.push("-o".into());
            out.push(o.into());
        }
        out.push(mountpoint.into());
        return Ok(out);
    }
    let mut out: Vec<std::ffi::OsString> = vec!["stripefs".into(), "mount".into(), "-q".into()];
    for o in opts {
        out.push("-o".into());
        out.push(o.into());
    }
    out.extend(
        crate::targets::split_source(&source)
            .into_iter()
            .map(Into::into),
    );
    out.push(mountpoint.into());
    Ok(out)
}

/// Runs `stripefs mount`.
pub fn run(a: &MountArgs) -> Result<i32, String> {
    let (targets, mp) = a.paths.split_at(a.paths.len() - 1);
    let mp = &mp[0];
    let (engine, mut serve_opts) = split_options(&a.options)?;
    let (engine, target_opts) = crate::targets::split_target_options(&engine)?;
    let mount_opts = crate::mount_opts::parse(&engine)?;
    let abs: Vec<PathBuf> = targets
        .iter()
        .map(|t| crate::targets::absolute(t))
        .collect();
    serve_opts.fsname = abs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    if !mp.is_dir() {
        return Err(format!("mount point {} is not a directory", mp.display()));
    }
    if is_mounted(mp) {
        return Err(format!("{} is already a FUSE mount point", mp.display()));
    }
    if !a.foreground {
        // Refuse here, with a clear error, what the daemon would refuse.
        drop(lock_targets(&abs, LockWait::WhileReleasing)?);
        return daemonize(a, mp);
    }
    block_signals();
    let nbd = target_opts;
    serve_opts.open_target = Some(stripefs_fuse::target_ioctl::TargetOpener(Arc::new(
        move |p: &Path| crate::targets::open_one_with(p, &nbd),
    )));
    let targets = open_all_with(&abs, &target_opts)?;
    let (fs, report) = Fs::mount(targets, mount_opts).map_err(|e| e.to_string())?;
    tracing::info!(?report, "engine mounted");
    let fs = Arc::new(fs);
    let mounted = match serve(fs.clone(), mp, &serve_opts) {
        Ok(m) => m,
        Err(e) => {
            let mut msg = format!("cannot mount {} through FUSE: {e}", mp.display());
            if let Err(u) = fs.unmount() {
                msg.push_str(&format!("; unmounting the engine then failed too: {u}"));
            }
            return Err(msg);
        }
    };
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    if !a.quiet {
        // The transport is worth a line (`auto` may have fallen back, and says why): in the
        // foreground on the terminal, from the daemon through the starting `mount`, which
        // prints what the daemon wrote before it detached.
        let why = mounted
            .transport_note()
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        eprintln!(
            "stripefs: {} mounted; FUSE transport: {}{why}",
            mp.display(),
            mounted.transport()
        );
    }
    if daemon {
        detach_stderr();
    }
    let unmounter = mounted.unmounter();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            // Each signal tries again: a busy mount (EBUSY) keeps being served.
            let sig = wait_signal();
            tracing::info!(sig, "signal: unmounting");
            match unmounter.unmount() {
                Ok(()) => break,
                Err(e) => tracing::error!(%e, "unmount on signal failed; still mounted"),
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    let served = mounted.join();
    let flushed = fs.unmount();
    if let Err(e) = &served {
        eprintln!("stripefs mount: FUSE session failed: {e}");
    }
    if let Err(e) = &flushed {
        eprintln!("stripefs mount: final writeback or checkpoint failed: {e}");
    }
    Ok(i32::from(served.is_err() || flushed.is_err()))
}

/// Set for the daemon `mount` starts without `-f`.
const DAEMON_ENV: &str = "STRIPEFS_DAEMON";

/// Once mounted, a background daemon's stderr (a pipe to the `mount` command, which
/// exits) goes to `/dev/null`: a log line written to the dead pipe killed the daemon
/// (found by stress-ng; `cli_mount` tests it), and an unread pipe
/// would block the daemon once full. Run with `-f` to see its logs.
fn detach_stderr() {
    match std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto fd 2 of a descriptor we own; the old pipe end is closed.
        Ok(null) => unsafe {
            libc::dup2(null.as_raw_fd(), 2);
        },
        Err(e) => tracing::warn!(%e, "cannot open /dev/null; stderr stays a pipe"),
    }
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts, so that only
/// [`wait_signal`] sees them.
fn block_signals() {
    // SAFETY: sigset manipulation on a local, then pthread_sigmask on the calling thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn wait_signal() -> i32 {
    let mut sig = 0;
    // SAFETY: as in `block_signals`; sigwait writes the signal number into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigwait(&set, &mut sig);
    }
    sig
}

fn is_mounted(mp: &Path) -> bool {
    let Ok(mp) = std::fs::canonicalize(mp) else {
        return false;
    };
    stripefs_fuse::mount_source(&mp).is_some()
}

/// Starts the daemon (this program with `-f`) in a new session and waits until the
/// mount appears or the daemon fails.
fn daemonize(a: &MountArgs, mp: &Path) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut args: Vec<std::ffi::OsString> = vec!["mount".into(), "-f".into()];
    for o in &a.options {
        args.push("-o".into());
        args.push(o.into());
    }
    args.extend(a.paths.iter().map(Into::into));
    let mut cmd = Command::new(exe);
    cmd.args(&args)
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let startup = child.stderr.take().map(read_until_detached);
    let start = Instant::now();
    loop {
        // The daemon closes its stderr once it serves requests (`detach_stderr`, after
        // `serve`): under io_uring the mount shows in `/proc/mounts` before the rings
        // are registered, and a log line written after we exited went to a dead pipe.
        let detached = startup
            .as_ref()
            .is_none_or(|(done, _)| done.try_recv().is_ok());
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            if let Some((done, _)) = &startup {
                let _ = done.recv_timeout(Duration::from_secs(5));
            }
            eprint!("{}", startup_output(startup.as_ref()));
            return Err(format!("the daemon exited ({status}) before mounting"));
        }
        if detached && is_mounted(mp) {
            if a.quiet {
                return Ok(0);
            }
            // What the daemon logged while starting (warnings; more under STRIPEFS_LOG).
            eprint!("{}", startup_output(startup.as_ref()));
            println!(
                "mounted at {} (daemon pid {}); unmount with: stripefs umount {}",
                mp.display(),
                child.id(),
                mp.display()
            );
            return Ok(0);
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err("the daemon did not mount within 120 s (still running)".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a starting daemon writes to its stderr, read on a thread of its own (so a
/// chatty daemon never blocks on a full pipe) until it closes it; the receiver hears
/// once when it has.
type Startup = (mpsc::Receiver<()>, Arc<Mutex<Vec<u8>>>);

fn read_until_detached(mut pipe: std::process::ChildStderr) -> Startup {
    let (tx, rx) = mpsc::channel();
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&out);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match std::io::Read::read(&mut pipe, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => sink
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send(());
    });
    (rx, out)
}

fn startup_output(startup: Option<&Startup>) -> String {
    startup.map_or_else(String::new, |(_, out)| {
        let out = out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&out).into_owned()
    })
}

/// Runs `stripefs umount`.
pub fn run_umount(a: &UmountArgs) -> Result<i32, String> {
    let mp = std::fs::canonicalize(&a.mountpoint)
        .map_err(|e| format!("{}: {e}", a.mountpoint.display()))?;
    let source = stripefs_fuse::unmount(&mp).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => e.to_string(),
        _ => format!("cannot unmount {}: {e}", mp.display()),
    })?;
    // The daemon holds the targets' locks until its checkpoint is on disk and they are
    // closed. Sources not written by `stripefs mount` (absolute paths) are not waited on.
    let targets = crate::targets::split_source(&source);
    if targets
        .iter()
        .all(|t| crate::targets::is_uri(t) || (t.is_absolute() && t.exists()))
    {
        drop(lock_targets(&targets, LockWait::Forever)?);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_helper_becomes_stripefs_mount() {
        let args = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let got = helper_args(
            args(&[
                "/sbin/mount.fuse.stripefs",
                "/d/t0:/d/t1",
                "/mnt",
                "-n",
                "-o",
                "rw,threads=8",
            ])
            .into_iter(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            args(&[
                "stripefs",
                "mount",
                "-q",
                "-o",
                "rw,threads=8",
                "/d/t0",
                "/d/t1",
                "/mnt"
            ])
        );
        assert!(helper_args(args(&["stripefs", "mount"]).into_iter()).is_none());
        let bad = helper_args(args(&["mount.fuse.stripefs", "/d/t0"]).into_iter()).unwrap();
        assert!(bad.unwrap_err().contains("usage"));
    }

    #[test]
    fn engine_words_stay_with_the_engine_and_unknown_words_name_both_key_lists() {
        let (engine, s) = split_options(&[
            "writeback_cache,threads=4,noatime".into(),
            "dirty_tracking=folio,meta_cache=32m".into(),
        ])
        .unwrap();
        assert_eq!(
            engine,
            ["noatime", "dirty_tracking=folio", "meta_cache=32m"]
        );
        let o = crate::mount_opts::parse(&engine).unwrap();
        assert_eq!(o.meta_cache, stripefs::MetaCacheBytes(32 << 20));
        assert_eq!((s.threads, s.flags), (4, vec!["noatime".to_string()]));
        let e = split_options(&["bogus".into()]).unwrap_err();
        assert!(
            e.contains("unknown mount option") && e.contains("FUSE keys:"),
            "{e}"
        );
        assert!(e.contains("engine keys: folio_size"), "{e}");
    }
}

//! Opening targets named on the command line: files and block devices by path, NBD
//! exports by URI (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`). Every
//! command goes through here, so a URI is accepted wherever a target path is.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stripefs_target::{
    FileTarget, FileTargetOptions, NbdOptions, NbdTarget, NbdUri, Target, TargetError,
    TargetErrorKind, TargetLock,
};

/// How targets are opened, from the `-o` keys `nbd_timeout=SECS|NNms` (default 30 s) and
/// `nbd_conns=N` (default 2, used when the server advertises multi-conn).
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetOptions {
    pub nbd: NbdOptions,
}

/// Takes the target keys out of a `-o` list, returning the rest for the engine.
///
/// # Errors
/// A bad value for a target key.
pub fn split_target_options(list: &[String]) -> Result<(Vec<String>, TargetOptions), String> {
    let mut o = TargetOptions::default();
    let mut rest = Vec::new();
    for item in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        match item.split_once('=') {
            Some(("nbd_timeout", v)) => o.nbd.timeout = parse_timeout(v)?,
            Some(("nbd_conns", v)) => {
                o.nbd.connections = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| format!("nbd_conns must be 1 to 64, not {v:?}"))?;
            }
            _ => rest.push(item.to_string()),
        }
    }
    Ok((rest, o))
}

fn parse_timeout(v: &str) -> Result<Duration, String> {
    let bad = || format!("nbd_timeout must be a positive number of seconds or NNms, not {v:?}");
    let d = match v.strip_suffix("ms") {
        Some(ms) => Duration::from_millis(ms.parse().map_err(|_| bad())?),
        None => Duration::from_secs(v.parse().map_err(|_| bad())?),
    };
    if d.is_zero() {
        return Err(bad());
    }
    Ok(d)
}

/// True when `p` names an NBD export rather than a file.
#[must_use]
pub fn is_uri(p: &Path) -> bool {
    p.to_str().is_some_and(NbdUri::looks_like_uri)
}

/// True when the target exists (a URI is taken to: opening it says otherwise).
#[must_use]
pub fn exists(p: &Path) -> bool {
    is_uri(p) || p.exists()
}

/// The form a mount records: absolute for paths, unchanged for URIs.
#[must_use]
pub fn absolute(p: &Path) -> PathBuf {
    if is_uri(p) {
        return p.to_path_buf();
    }
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Splits a mount SOURCE (targets joined by `:`) into targets. A `:` inside an NBD URI's
/// scheme separator or host:port does not split; one in its export or query does, so a
/// socket path containing `:` cannot appear in a SOURCE.
#[must_use]
pub fn split_source(source: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut rest = source;
    while !rest.is_empty() {
        let end = match rest.split_once("://") {
            Some((scheme, after)) if NbdUri::looks_like_uri(rest) && !scheme.contains(':') => {
                let authority = authority_len(after);
                let tail = &after[authority..];
                scheme.len() + 3 + authority + tail.find(':').unwrap_or(tail.len())
            }
            _ => rest.find(':').unwrap_or(rest.len()),
        };
        if end > 0 {
            out.push(PathBuf::from(&rest[..end]));
        }
        rest = rest.get(end + 1..).unwrap_or("");
    }
    out
}

/// Length of a URI's authority (`host`, `host:port`, `[v6]:port`) at the start of `s`.
fn authority_len(s: &str) -> usize {
    let b = s.as_bytes();
    let mut i = 0;
    let mut bracket = false;
    while i < b.len() {
        match b[i] {
            b'[' => bracket = true,
            b']' => bracket = false,
            b'/' if !bracket => return i,
            b':' if !bracket => {
                let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                let after = b.get(i + 1 + digits);
                if digits == 0 || !matches!(after, None | Some(b'/' | b':')) {
                    return i;
                }
                i += digits;
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Opens every target (must exist) with default options.
///
/// # Errors
/// The first target that cannot be opened, with the reason.
pub fn open_all(paths: &[PathBuf]) -> Result<Vec<Arc<dyn Target>>, String> {
    open_all_with(paths, &TargetOptions::default())
}

/// Opens every target (must exist).
///
/// # Errors
/// The first target that cannot be opened, with the reason.
pub fn open_all_with(paths: &[PathBuf], o: &TargetOptions) -> Result<Vec<Arc<dyn Target>>, String> {
    paths.iter().map(|p| open_with(p, None, o)).collect()
}

/// Opens one target, creating a regular file of `create_size` if it is missing.
///
/// # Errors
/// A sentence naming the target.
pub fn open_one(p: &Path, create_size: Option<u64>) -> Result<Arc<dyn Target>, String> {
    open_with(p, create_size, &TargetOptions::default())
}

/// Opens one existing target with `o` (what a mount's `add-target` uses: the mount's own
/// target options).
///
/// # Errors
/// A sentence naming the target.
pub fn open_one_with(p: &Path, o: &TargetOptions) -> Result<Arc<dyn Target>, String> {
    open_with(p, None, o)
}

fn open_with(
    p: &Path,
    create_size: Option<u64>,
    o: &TargetOptions,
) -> Result<Arc<dyn Target>, String> {
    while_releasing(p, || -> Result<Arc<dyn Target>, TargetError> {
        if is_uri(p) {
            let uri = p.to_str().expect("URIs are UTF-8");
            return Ok(Arc::new(NbdTarget::open(uri, o.nbd)?));
        }
        let opts = FileTargetOptions {
            create_size,
            ..FileTargetOptions::default()
        };
        Ok(Arc::new(FileTarget::open(p, opts)?))
    })
}

/// What [`lock_targets`] does when another process holds a target's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    /// Wait as long as it takes (`stripefs umount` waiting for its own daemon).
    Forever,
    /// As every open here: refuse at once while a mount visible here serves the target;
    /// otherwise the holder is a daemon finishing its unmount (after a plain `umount`,
    /// which returns before the final checkpoint) or a command that is about to end:
    /// wait for it, up to [`RELEASE_WAIT`], as a kernel mount waits for the old
    /// superblock to go.
    WhileReleasing,
}

/// How long an open (or [`LockWait::WhileReleasing`]) waits for a holder that is not a
/// mount.
pub const RELEASE_WAIT: Duration = Duration::from_secs(30);

const POLL: Duration = Duration::from_millis(10);

/// Takes the targets' exclusive locks without opening them (the lock every open target
/// holds, `stripefs_target::TargetLock`): to check before starting a daemon, or to wait
/// for one to let go.
///
/// # Errors
/// The targets are in use (see [`LockWait`]), or a file cannot be opened.
pub fn lock_targets(paths: &[PathBuf], wait: LockWait) -> Result<Vec<TargetLock>, String> {
    paths
        .iter()
        .map(|p| {
            let name = p.to_string_lossy();
            match wait {
                LockWait::Forever => TargetLock::take(&name, stripefs_target::LockWait::Forever)
                    .map_err(|e| format!("cannot lock {}: {}", p.display(), e.kind)),
                LockWait::WhileReleasing => {
                    while_releasing(p, || TargetLock::take(&name, stripefs_target::LockWait::No))
                }
            }
        })
        .collect()
}

/// Runs `attempt` (an open, or a lock) until the target at `path` is not in use, with the
/// policy of [`LockWait::WhileReleasing`].
fn while_releasing<T>(
    path: &Path,
    mut attempt: impl FnMut() -> Result<T, TargetError>,
) -> Result<T, String> {
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        let e = match attempt() {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let TargetErrorKind::InUse { holder } = &e.kind else {
            return Err(format!("cannot open target {}: {}", path.display(), e.kind));
        };
        if let Some(mp) = mounted_at(path) {
            return Err(format!(
                "{} is in use by a stripefs mount (at {}); unmount it first",
                path.display(),
                mp.display()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} is still in use after {} s, by {holder} and no mount: a stripefs daemon \
                 still writing back after its unmount, or a stripefs command; try again \
                 when it has exited",
                path.display(),
                RELEASE_WAIT.as_secs()
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// The mount point of a FUSE mount whose source (targets joined by `:`) names `target`.
fn mounted_at(target: &Path) -> Option<PathBuf> {
    let same = |t: &Path| -> bool {
        if is_uri(target) {
            return t == target;
        }
        let want = std::fs::canonicalize(target);
        want.is_ok_and(|w| std::fs::canonicalize(t).is_ok_and(|t| t == w))
    };
    stripefs_fuse::fuse_mounts()
        .into_iter()
        .find(|(source, _)| split_source(source).iter().any(|t| same(t)))
        .map(|(_, mp)| mp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_split_around_uris() {
        let s = "/d/t0:nbd://h:10809/e1:nbd+unix:///e2?socket=/run/s.sock:rel/t3:nbd://[::1]/x";
        let got: Vec<String> = split_source(s)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            got,
            [
                "/d/t0",
                "nbd://h:10809/e1",
                "nbd+unix:///e2?socket=/run/s.sock",
                "rel/t3",
                "nbd://[::1]/x"
            ]
        );
        assert_eq!(split_source("/a:/b"), [PathBuf::from("/a"), "/b".into()]);
        assert_eq!(
            split_source("nbd://[::1]:10809:nbd://h:/t"),
            [
                PathBuf::from("nbd://[::1]:10809"),
                "nbd://h".into(),
                "/t".into()
            ]
        );
    }

    #[test]
    fn target_keys_are_taken_out() {
        let (rest, o) = split_target_options(&[
            "nbd_timeout=500ms,dio_submit=serial".into(),
            "nbd_conns=4".into(),
        ])
        .unwrap();
        assert_eq!(rest, ["dio_submit=serial"]);
        assert_eq!(o.nbd.timeout, Duration::from_millis(500));
        assert_eq!(o.nbd.connections, 4);
        assert!(split_target_options(&["nbd_timeout=0".into()]).is_err());
        assert!(split_target_options(&["nbd_conns=x".into()]).is_err());
        assert_eq!(absolute(Path::new("nbd://h/e")), PathBuf::from("nbd://h/e"));
        assert!(exists(Path::new("nbd+unix:///e?socket=/nonexistent")));
    }
}

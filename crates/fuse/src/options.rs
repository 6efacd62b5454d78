//! `-o` mount options: the FUSE front end's keys are parsed here, the rest is handed back
//! for the engine (and the targets), so a front end calls [`split_options`] and knows no
//! FUSE option names.

use std::fmt;

use crate::session::{generic_flag, ServeOptions};

/// The keys of `-o` that the FUSE front end (not the engine) understands, for help texts
/// and errors.
pub const FUSE_KEYS: &str = "writeback_cache, fopen_direct_io, allow_other, ro, rw, threads=N, \
transport=auto|uring|dev (default auto), uring_entries=N, \
the access-time options relatime, strictatime, noatime, nodiratime, lazytime, and the generic \
flags nodev, nosuid, noexec, sync, dirsync and their opposites";

/// Generic `fstab` options that need nothing from us.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "nouser",
    "users",
    "dev",
    "suid",
    "exec",
    "async",
    "x-systemd.automount",
];

/// Why `-o` was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionError {
    /// A word neither the front end nor the engine knows.
    Unknown(String),
    /// A known key with a bad value (the sentence says which).
    BadValue(String),
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(w) => write!(f, "unknown mount option {w:?} (FUSE keys: {FUSE_KEYS})"),
            Self::BadValue(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for OptionError {}

/// Splits `-o` values (each a comma-separated list) into what the engine gets back (every
/// `key=value` not the front end's, and the bare words `engine_word` accepts) and the
/// front end's [`ServeOptions`]. Access-time words are the engine's (FUSE leaves access
/// times to the server); those the kernel also knows (`noatime`, `atime`) are passed to
/// it as well, so `/proc/mounts` shows them. Generic `fstab` words are ignored.
///
/// # Errors
/// [`OptionError::Unknown`] for a bare word nobody knows; [`OptionError::BadValue`] for a
/// front-end key with a bad value.
pub fn split_options(
    list: &[String],
    engine_word: impl Fn(&str) -> bool,
) -> Result<(Vec<String>, ServeOptions), OptionError> {
    let mut serve = ServeOptions::default();
    let mut engine = Vec::new();
    for item in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        match item.split_once('=') {
            None => bare_word(item, &engine_word, &mut serve, &mut engine)?,
            Some((key, v)) => {
                if !serve_key(key, v, &mut serve)? {
                    engine.push(item.to_string());
                }
            }
        }
    }
    Ok((engine, serve))
}

/// A word without `=`.
fn bare_word(
    item: &str,
    engine_word: &impl Fn(&str) -> bool,
    serve: &mut ServeOptions,
    engine: &mut Vec<String>,
) -> Result<(), OptionError> {
    match item {
        "writeback_cache" => serve.fuse.writeback_cache = true,
        "fopen_direct_io" => serve.fuse.fopen_direct_io = true,
        "allow_other" => serve.allow_other = true,
        "ro" => serve.read_only = true,
        "rw" => serve.read_only = false,
        _ if engine_word(item) => {
            engine.push(item.to_string());
            if generic_flag(item) {
                serve.flags.push(item.to_string());
            }
        }
        _ if IGNORED.contains(&item) => {}
        _ if generic_flag(item) => serve.flags.push(item.to_string()),
        _ => return Err(OptionError::Unknown(item.to_string())),
    }
    Ok(())
}

/// A `key=value` of the front end's; `false` if `key` is not one.
fn serve_key(key: &str, v: &str, serve: &mut ServeOptions) -> Result<bool, OptionError> {
    let in_range = |lo: usize, hi: usize| {
        v.parse::<usize>()
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| OptionError::BadValue(format!("{key} must be {lo} to {hi}, not {v:?}")))
    };
    match key {
        "threads" => serve.threads = in_range(1, 256)?,
        "transport" => serve.transport = v.parse().map_err(OptionError::BadValue)?,
        "uring_entries" => serve.uring_entries = Some(in_range(1, 1024)?),
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransportChoice;

    fn atime(w: &str) -> bool {
        ["relatime", "nodiratime", "noatime", "lazytime"].contains(&w)
    }

    fn split(list: &[&str]) -> Result<(Vec<String>, ServeOptions), OptionError> {
        let list: Vec<String> = list.iter().map(|s| (*s).to_string()).collect();
        split_options(&list, atime)
    }

    #[test]
    fn fuse_and_engine_options_split() {
        let (engine, s) =
            split(&["writeback_cache,threads=4,defaults", "dirty_tracking=folio"]).unwrap();
        assert_eq!(engine, ["dirty_tracking=folio"]);
        assert!(s.fuse.writeback_cache && !s.fuse.fopen_direct_io);
        assert_eq!(s.threads, 4);
        let (engine, s) = split(&["relatime,nodiratime,noatime,lazytime"]).unwrap();
        assert_eq!(engine, ["relatime", "nodiratime", "noatime", "lazytime"]);
        assert_eq!(s.flags, ["noatime"], "the kernel shows noatime");
        let (engine, s) = split(&["ro,nosuid,nofail"]).unwrap();
        assert!(engine.is_empty() && s.read_only);
        assert_eq!(s.flags, ["nosuid"]);
        assert!(
            matches!(split(&["threads=0"]), Err(OptionError::BadValue(m)) if m.contains("threads must be 1 to 256"))
        );
        let (_, s) = split(&["transport=uring,uring_entries=16"]).unwrap();
        assert_eq!(s.transport, TransportChoice::Uring);
        assert_eq!(s.uring_entries, Some(16));
        assert!(matches!(
            split(&["transport=fast"]),
            Err(OptionError::BadValue(_))
        ));
        assert!(matches!(
            split(&["uring_entries=0"]),
            Err(OptionError::BadValue(_))
        ));
        let e = split(&["bogus"]).unwrap_err();
        assert_eq!(e, OptionError::Unknown("bogus".into()));
        assert!(e
            .to_string()
            .contains("unknown mount option \"bogus\" (FUSE keys: "));
    }
}

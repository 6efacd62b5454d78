//! Access times: which reads update `atime` (`relatime`, `strictatime`, `noatime`,
//! `nodiratime`) and when the update is written (at once, or kept in memory under
//! `lazytime`), with the kernel's rules for local file systems.
//!
//! A read of a file (buffered or direct), a directory listing and `readlink` are
//! accesses. Under `lazytime` the new time lives in [`MetaCore`]'s `lazy_atime` and is
//! what `stat` shows; it is written with the inode's next other change (every logged
//! `InodeSet` takes it), by `fsync`, `sync` and unmount, and at once by an access that
//! finds the on-disk time more than a day old. A crash loses what was not written, as
//! with `lazytime` on a kernel file system.

use stripefs_core::inode::{FileKind, InodeAttrs, Timespec};
use stripefs_core::record::Record;
use stripefs_core::Ino;

use crate::fs::Fs;
use crate::inner::MetaCore;

/// A day: `relatime` updates an access time at least this old, and `lazytime` keeps one
/// in memory at most this long past the on-disk time.
const DAY_SECS: i64 = 24 * 60 * 60;

/// Which accesses update `atime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeUpdate {
    /// `relatime`: only if `atime` is not after `mtime` or `ctime`, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: every access.
    Strict,
    /// `noatime`: none.
    Never,
}

/// Whether directories follow [`AtimeUpdate`] (`nodiratime`: they never update).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirAtime {
    #[default]
    Update,
    /// `nodiratime`.
    Skip,
}

/// When an `atime` update is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeWrite {
    /// Logged in the running transaction at the access.
    #[default]
    Journal,
    /// `lazytime`: kept in memory (see the module documentation).
    Lazy,
}

/// The access-time mount options; the default is `relatime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtimePolicy {
    pub update: AtimeUpdate,
    pub dirs: DirAtime,
    pub write: AtimeWrite,
}

impl AtimePolicy {
    /// Whether an access at `now` to an inode with `a` (access time `atime`, which may be
    /// newer than `a.atime` under `lazytime`) updates its access time.
    #[must_use]
    pub fn wants(&self, a: &InodeAttrs, atime: Timespec, now: Timespec) -> bool {
        if a.kind == FileKind::Directory && self.dirs == DirAtime::Skip || atime == now {
            return false;
        }
        match self.update {
            AtimeUpdate::Never => false,
            AtimeUpdate::Strict => true,
            AtimeUpdate::Relative => {
                atime <= a.mtime || atime <= a.ctime || now.sec - atime.sec >= DAY_SECS
            }
        }
    }
}

impl MetaCore {
    /// `ino`'s access time as `stat` shows it: a lazily kept one if newer.
    pub(crate) fn atime_of(&self, a: &InodeAttrs) -> Timespec {
        self.inodes
            .get(a.ino)
            .and_then(|c| c.lazy_atime)
            .map_or(a.atime, |t| t.max(a.atime))
    }

    /// Puts a lazily kept access time into an `InodeSet` about to be logged (the inode
    /// is written anyway) and forgets it.
    pub(crate) fn fold_lazy_atime(&mut self, rec: &mut Record) {
        if let Record::InodeSet(a) = rec {
            if let Some(t) = self.inodes.get_mut(a.ino).and_then(|c| c.lazy_atime.take()) {
                a.atime = a.atime.max(t);
            }
        }
    }
}

impl Fs {
    /// An access to `ino` (a read, a listing, `readlink`) at the current time. Never
    /// fails the access: an update that cannot be logged is skipped, as the VFS does,
    /// and a read-only file system updates nothing.
    pub(crate) fn touch_atime(&self, ino: Ino) {
        let policy = self.inner.opts.atime;
        if policy.update == AtimeUpdate::Never || self.inner.check().is_err() {
            return;
        }
        let Ok(_change) = self.inner.begin_change() else {
            return;
        };
        let now = crate::clock::time_now();
        let mut m = self.inner.meta.lock();
        let Ok(Some(i)) = m.state.get(ino) else {
            return;
        };
        if !policy.wants(&i.attrs, m.atime_of(&i.attrs), now) {
            return;
        }
        if policy.write == AtimeWrite::Lazy && now.sec - i.attrs.atime.sec < DAY_SECS {
            m.inodes.entry(ino).lazy_atime = Some(now);
            self.inner.sweep_inodes_if_due(&mut m);
            return;
        }
        let mut a = i.attrs.clone();
        a.atime = now;
        if let Err(e) = self.inner.log_all(&mut m, vec![Record::InodeSet(a)]) {
            tracing::debug!(%e, ino = ino.0, "access time not updated");
        }
    }

    /// Logs the lazily kept access time of `ino` (all inodes for `None`): `fsync`,
    /// `sync`, unmount and the switch to read-only write them.
    pub(crate) fn write_lazy_atimes(
        &self,
        m: &mut MetaCore,
        ino: Option<Ino>,
    ) -> crate::Result<()> {
        let lazy = |c: &crate::icache::InCoreInode| c.lazy_atime.is_some();
        let inos: Vec<Ino> = match ino {
            Some(i) if m.inodes.get(i).is_some_and(lazy) => vec![i],
            Some(_) => return Ok(()),
            None => m
                .inodes
                .iter()
                .filter(|(_, c)| lazy(c))
                .map(|(i, _)| i)
                .collect(),
        };
        let mut recs = Vec::new();
        for i in inos {
            match m.state.get(i)? {
                Some(n) => recs.push(Record::InodeSet(n.attrs.clone())),
                None => {
                    if let Some(c) = m.inodes.get_mut(i) {
                        c.lazy_atime = None;
                    }
                }
            }
        }
        // Logging folds each inode's kept time in (`fold_lazy_atime`).
        self.inner.log_all(m, recs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripefs_core::layout::StripeLayout;

    fn ts(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    fn attrs(kind: FileKind, atime: i64, mtime: i64, ctime: i64) -> InodeAttrs {
        InodeAttrs {
            ino: Ino(5),
            kind,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            atime: ts(atime),
            mtime: ts(mtime),
            ctime: ts(ctime),
            crtime: ts(0),
            rdev: 0,
            parent: Ino(0),
            layout: StripeLayout {
                count: 0,
                unit_bytes: 0,
                first_target: 0,
            },
            flags: 0,
        }
    }

    #[test]
    fn the_kernel_rules() {
        let now = ts(10 * DAY_SECS);
        let rel = AtimePolicy::default();
        let strict = AtimePolicy {
            update: AtimeUpdate::Strict,
            ..rel
        };
        let never = AtimePolicy {
            update: AtimeUpdate::Never,
            ..rel
        };
        let nodir = AtimePolicy {
            dirs: DirAtime::Skip,
            ..strict
        };
        let f = |a, m, c| attrs(FileKind::Regular, a, m, c);
        let recent = now.sec - 3600;
        // relatime: after a change (mtime or ctime not before atime), or a day old.
        let modified = f(recent, recent, recent - 10);
        assert!(rel.wants(&modified, modified.atime, now));
        let changed = f(recent, recent - 10, recent + 5);
        assert!(rel.wants(&changed, changed.atime, now));
        let read_since = f(recent, recent - 10, recent - 10);
        assert!(!rel.wants(&read_since, read_since.atime, now));
        let old = f(
            now.sec - DAY_SECS,
            now.sec - 2 * DAY_SECS,
            now.sec - 2 * DAY_SECS,
        );
        assert!(rel.wants(&old, old.atime, now));
        // A lazily kept newer time counts.
        assert!(!rel.wants(&modified, ts(recent + 1), now));
        assert!(strict.wants(&read_since, read_since.atime, now));
        assert!(!strict.wants(&read_since, now, now), "already now");
        assert!(!never.wants(&modified, modified.atime, now));
        let d = attrs(FileKind::Directory, recent, recent, recent);
        assert!(strict.wants(&d, d.atime, now));
        assert!(!nodir.wants(&d, d.atime, now));
        assert!(
            nodir.wants(&read_since, read_since.atime, now),
            "files still update"
        );
    }
}

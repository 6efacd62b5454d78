//! Directories the kernel still refers to.
//!
//! The kernel keeps an inode (a shell's working directory, a dentry under an open file)
//! until it sends `FORGET`, and counts one reference per successful entry reply
//! (`LOOKUP`, `MKDIR`, and the like). A removed directory must stay answerable until then:
//! `fstat` and `getcwd` on it succeed with link count 0 on a kernel file system, where
//! an engine that had already freed it answers `ESTALE`. So each directory the kernel
//! holds is pinned with one engine handle ([`Fs::open`]), taken at its first reference
//! and released when `FORGET` brings the count to 0. Files need no pin: the kernel opens
//! them before any use that could outlive their last link, and an open handle keeps them.
//! Inode numbers are never reused, so a count cannot outlive the inode it was for.

use std::collections::HashMap;

use parking_lot::Mutex;
use stripefs::{Attr, Fh, FileKind, Fs, Ino};

/// One pinned directory: the kernel's lookup count and the handle that keeps it.
#[derive(Debug)]
struct Pin {
    lookups: u64,
    fh: Fh,
}

/// The kernel's lookup counts of directories, each with an engine handle.
#[derive(Debug, Default)]
pub(crate) struct DirRefs {
    pins: Mutex<HashMap<Ino, Pin>>,
}

impl DirRefs {
    /// Counts one kernel reference to `a` (about to be sent in an entry reply); the first
    /// to a directory pins it.
    ///
    /// # Errors
    /// As [`Fs::open`]: `Stale` if the directory went away since `a` was read (the entry
    /// reply must then not be sent).
    pub(crate) fn add(&self, fs: &Fs, a: &Attr) -> stripefs::Result<()> {
        if a.kind != FileKind::Directory {
            return Ok(());
        }
        let mut pins = self.pins.lock();
        if let Some(p) = pins.get_mut(&a.ino) {
            p.lookups += 1;
            return Ok(());
        }
        // Opening takes only the metadata lock (no I/O), so it may run under ours.
        let fh = fs.open(a.ino)?;
        pins.insert(a.ino, Pin { lookups: 1, fh });
        Ok(())
    }

    /// `FORGET`: the kernel drops `n` references to `ino`; at 0 the pin goes (and a
    /// removed directory with it).
    pub(crate) fn forget(&self, fs: &Fs, ino: Ino, n: u64) {
        let fh = {
            let mut pins = self.pins.lock();
            let Some(p) = pins.get_mut(&ino) else {
                return; // Not a directory, or the root (never looked up).
            };
            debug_assert!(n <= p.lookups, "kernel forgets more than it looked up");
            p.lookups = p.lookups.saturating_sub(n);
            if p.lookups > 0 {
                return;
            }
            pins.remove(&ino).map(|p| p.fh)
        };
        if let Some(fh) = fh {
            release(fs, fh);
        }
    }

    /// Releases every pin (the session ended; the kernel forgets without telling).
    pub(crate) fn release_all(&self, fs: &Fs) {
        let all: Vec<Fh> = self.pins.lock().drain().map(|(_, p)| p.fh).collect();
        for fh in all {
            release(fs, fh);
        }
    }

    /// How many directories are pinned (tests).
    #[cfg(test)]
    fn pinned(&self) -> usize {
        self.pins.lock().len()
    }
}

fn release(fs: &Fs, fh: Fh) {
    if let Err(e) = fs.release(fh) {
        tracing::warn!(%e, "releasing a directory the kernel forgot failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use stripefs::{CreateParams, MkfsOptions, MountOptions};
    use stripefs_target::{SimTarget, Target};

    fn fs() -> Fs {
        let t: Vec<Arc<dyn Target>> = (0..2)
            .map(|_| Arc::new(SimTarget::new("t", 16 << 20, 4096)) as Arc<dyn Target>)
            .collect();
        Fs::mkfs(&t, &MkfsOptions::default()).unwrap();
        Fs::mount(t, MountOptions::default()).unwrap().0
    }

    #[test]
    fn a_directory_lives_until_the_kernel_forgets_it() {
        let fs = fs();
        let refs = DirRefs::default();
        let p = CreateParams::with_perm(0o755);
        let d = fs.mkdir(Ino::ROOT, "d".as_ref(), p).unwrap();
        let f = fs.create(Ino::ROOT, "f".as_ref(), p).unwrap();
        refs.add(&fs, &d).unwrap();
        refs.add(&fs, &d).unwrap();
        refs.add(&fs, &f).unwrap();
        assert_eq!(refs.pinned(), 1, "only directories are pinned");
        fs.rmdir(Ino::ROOT, "d".as_ref()).unwrap();
        refs.forget(&fs, d.ino, 1);
        assert_eq!(fs.getattr(d.ino).unwrap().nlink, 0);
        refs.forget(&fs, f.ino, 1);
        refs.forget(&fs, d.ino, 1);
        assert_eq!(fs.getattr(d.ino).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(refs.pinned(), 0);
        let e = fs.mkdir(Ino::ROOT, "e".as_ref(), p).unwrap();
        refs.add(&fs, &e).unwrap();
        refs.release_all(&fs);
        assert_eq!(refs.pinned(), 0);
        fs.unmount().unwrap();
    }
}

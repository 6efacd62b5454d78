//! Path resolution inside the file system (for the CLI and embedders; the FUSE front end
//! works on inode numbers). Absolute symlink targets resolve from the file system's root.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use stripefs_core::inode::FileKind;
use stripefs_core::Ino;

use crate::error::{FsError, Result};
use crate::fs::Fs;

/// Most symlinks followed while resolving one path.
const MAX_SYMLINKS: u32 = 40;

/// Whether the last component is followed if it is a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Follow (like `stat`).
    Yes,
    /// Do not follow (like `lstat`).
    No,
}

impl Fs {
    /// Resolves `path` (relative to the root) to an inode.
    ///
    /// # Errors
    /// `NotFound`, `NotDir`, `Loop`, `NameTooLong`.
    pub fn resolve(&self, path: &Path, follow: Follow) -> Result<Ino> {
        let mut links = 0;
        self.walk(Ino::ROOT, path, follow, &mut links)
    }

    /// Resolves the parent directory of `path` and returns it with the final name.
    ///
    /// # Errors
    /// As [`Fs::resolve`]; `Invalid` for a path without a final name.
    pub fn resolve_parent<'p>(&self, path: &'p Path) -> Result<(Ino, &'p OsStr)> {
        let name = path
            .file_name()
            .ok_or_else(|| FsError::invalid(format!("{} has no file name", path.display())))?;
        let parent = path.parent().unwrap_or(Path::new("/"));
        let ino = self.resolve(parent, Follow::Yes)?;
        Ok((ino, name))
    }

    fn walk(&self, start: Ino, path: &Path, follow: Follow, links: &mut u32) -> Result<Ino> {
        let comps: Vec<Component<'_>> = path.components().collect();
        let mut cur = start;
        for (i, c) in comps.iter().enumerate() {
            let name: &OsStr = match c {
                Component::RootDir | Component::Prefix(_) => {
                    cur = Ino::ROOT;
                    continue;
                }
                Component::CurDir => continue,
                Component::ParentDir => OsStr::from_bytes(b".."),
                Component::Normal(n) => n,
            };
            let dir = cur;
            let a = self.lookup(dir, name)?;
            let last = i + 1 == comps.len();
            if a.kind == FileKind::Symlink && (!last || follow == Follow::Yes) {
                *links += 1;
                if *links > MAX_SYMLINKS {
                    return Err(FsError::Loop);
                }
                let target = self.readlink(a.ino)?;
                cur = self.walk(
                    dir,
                    Path::new(OsStr::from_bytes(&target)),
                    Follow::Yes,
                    links,
                )?;
            } else {
                cur = a.ino;
            }
        }
        Ok(cur)
    }
}

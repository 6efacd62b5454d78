//! The in-memory metadata model and its single mutation path.
//!
//! All metadata (inodes, extent maps, directories, xattrs) lives in memory as a
//! [`MetaState`]. The running file system changes it only by appending [`Record`]s through
//! [`MetaState::apply`]; recovery replays the journal through the same function. The
//! persistent form is the metadata trees (`stripefs-meta`), to which a checkpoint applies
//! the same records; in stage 1 of issue 11 the file system still keeps this full
//! in-memory copy, loaded from the trees at mount (`docs/design/metadata.md`).

use std::collections::BTreeMap;

use crate::csum::CsumMap;
use crate::extent::Extent;
use crate::inode::{FileKind, Inode};
use crate::record::Record;
use crate::refcount::RefcountIndex;
use crate::{CoreError, Ino};

/// Every inode of the file system, by number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaState {
    pub inodes: BTreeMap<Ino, Inode>,
    /// Next inode number to hand out; inode numbers are never reused.
    pub next_ino: u64,
    /// The reference-count index: blocks two or more extents map (`crate::refcount`).
    pub refs: RefcountIndex,
    /// The data checksums, per physical block (`crate::csum`).
    pub csums: CsumMap,
}

impl MetaState {
    /// An empty model (no root yet).
    #[must_use]
    pub fn new() -> Self {
        Self {
            inodes: BTreeMap::new(),
            next_ino: Ino::ROOT.0,
            refs: RefcountIndex::new(),
            csums: CsumMap::new(),
        }
    }

    /// The inode `ino`, if it exists.
    #[must_use]
    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    fn get_mut(&mut self, ino: Ino, rec: &Record) -> Result<&mut Inode, CoreError> {
        self.inodes.get_mut(&ino).ok_or_else(|| {
            CoreError::corrupted(
                "metadata record",
                format!("{rec:?} refers to missing inode {ino}"),
            )
        })
    }

    /// Applies one record. This is the only way the model changes.
    ///
    /// # Errors
    /// `Corrupted` if the record does not fit the model (missing inode, entry in a
    /// non-directory, extent of a non-file, object index out of range...): a record that
    /// the runtime produced always fits, so a misfit means damaged metadata.
    pub fn apply(&mut self, rec: &Record) -> Result<(), CoreError> {
        if let Some(why) = rec.range_misfit() {
            return Err(misfit(why));
        }
        match rec {
            Record::InodeSet(a) => {
                self.next_ino = self.next_ino.max(a.ino.0 + 1);
                match self.inodes.get_mut(&a.ino) {
                    Some(i) => apply_to(i, rec)?,
                    None => {
                        self.inodes.insert(a.ino, new_inode(rec)?);
                    }
                }
            }
            Record::InodeFree(ino) => {
                if self.inodes.remove(ino).is_none() {
                    return Err(misfit(format!("free of missing inode {ino}")));
                }
            }
            Record::RefcountSet {
                target,
                phys,
                len,
                count,
            } => self.refs.set(*target, *phys, *len, *count),
            Record::CsumSet {
                target,
                phys,
                csums,
            } => self.csums.set(*target, *phys, csums),
            Record::CsumClear { target, phys, len } => self.csums.clear(*target, *phys, *len),
            // Membership is not part of the model (its geometry is the runtime's).
            Record::TargetAdd { .. } | Record::TargetState { .. } => {}
            _ => {
                let ino = rec.subject().expect("every other record names an inode");
                apply_to(self.get_mut(ino, rec)?, rec)?;
            }
        }
        Ok(())
    }

    /// Total extents across all files.
    #[must_use]
    pub fn extent_count(&self) -> usize {
        self.inodes
            .values()
            .flat_map(|i| i.objects.iter())
            .map(crate::extent::ExtentMap::len)
            .sum()
    }
}

fn misfit(detail: String) -> CoreError {
    CoreError::corrupted("metadata record", detail)
}

/// The inode an `InodeSet` record creates (the inode did not exist).
///
/// # Errors
/// `Corrupted` if `rec` is not an `InodeSet`, or creates a regular file without stripes.
pub fn new_inode(rec: &Record) -> Result<Inode, CoreError> {
    let Record::InodeSet(a) = rec else {
        return Err(misfit(format!("{rec:?} refers to a missing inode")));
    };
    if a.kind == FileKind::Regular && a.layout.count == 0 {
        return Err(misfit(format!("regular file {} has no stripes", a.ino)));
    }
    Ok(Inode::new(a.clone()))
}

/// Applies `rec` to `i`, the existing inode it is about (`rec.subject()`): every record
/// but the `InodeSet` that creates an inode and `InodeFree`, which the caller's map
/// handles. Shared by [`MetaState::apply`] and the file system's in-core inodes, so both
/// accept and refuse the same records.
///
/// # Errors
/// `Corrupted` as [`MetaState::apply`].
pub fn apply_to(i: &mut Inode, rec: &Record) -> Result<(), CoreError> {
    debug_assert_eq!(
        Some(i.attrs.ino),
        rec.subject(),
        "record applied to another inode"
    );
    if let Some(why) = rec.range_misfit() {
        return Err(misfit(why));
    }
    match rec {
        Record::InodeSet(a) => {
            if i.attrs.kind != a.kind {
                return Err(misfit(format!("inode {} changes type", a.ino)));
            }
            i.attrs = a.clone();
        }
        Record::InodeFree(ino) => {
            return Err(misfit(format!("free of inode {ino} applied in place")));
        }
        Record::ExtentSet {
            ino,
            object,
            block,
            len,
            phys,
            state,
            target,
        } => {
            let map = i
                .objects
                .get_mut(*object as usize)
                .ok_or_else(|| misfit(format!("inode {ino} has no object {object}")))?;
            map.set(
                *block,
                Extent {
                    len: *len,
                    phys: *phys,
                    state: *state,
                    target: *target,
                },
            );
        }
        Record::ExtentClear {
            ino,
            object,
            block,
            len,
        } => {
            let map = i
                .objects
                .get_mut(*object as usize)
                .ok_or_else(|| misfit(format!("inode {ino} has no object {object}")))?;
            map.clear(*block, *len);
        }
        Record::DirAdd {
            dir,
            name,
            ino,
            kind,
        } => {
            if i.attrs.kind != FileKind::Directory {
                return Err(misfit(format!("entry added to non-directory {dir}")));
            }
            let e = crate::inode::DirEntry {
                ino: *ino,
                kind: *kind,
            };
            i.entries.insert(name.clone(), e);
        }
        Record::DirRemove { dir, name } => {
            if i.entries.remove(name).is_none() {
                return Err(misfit(format!(
                    "directory {dir} has no entry {:?} to remove",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        Record::XattrSet { name, value, .. } => {
            i.xattrs.insert(name.clone(), value.clone());
        }
        Record::XattrRemove { ino, name } => {
            if i.xattrs.remove(name).is_none() {
                return Err(misfit(format!("inode {ino} has no xattr to remove")));
            }
        }
        Record::SymlinkSet { target, .. } => i.symlink.clone_from(target),
        Record::RefcountSet { .. }
        | Record::CsumSet { .. }
        | Record::CsumClear { .. }
        | Record::TargetAdd { .. }
        | Record::TargetState { .. } => {
            return Err(misfit(format!("{rec:?} applied to inode {}", i.attrs.ino)));
        }
    }
    Ok(())
}

//! Namespace operations: lookup, create, link, unlink, rename, readdir, attributes,
//! extended attributes, and open/release accounting for unlinked-but-open files.
//!
//! Every operation validates under the metadata lock, then logs all of its records in one
//! go, so each operation lands in a single transaction and is atomic across a crash
//! (rename included).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use stripefs_core::btree::schema;
use stripefs_core::inode::{
    FileKind, Inode, InodeAttrs, Timespec, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_TOTAL_MAX,
    XATTR_VALUE_MAX,
};
use stripefs_core::layout::StripeLayout;
use stripefs_core::record::Record;
use stripefs_core::Ino;

use crate::acl::{self, Acl};
use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::inner::MetaCore;
use crate::types::{
    Attr, CreateParams, DirCookie, DirEntryInfo, Fh, OpenMode, RenameMode, SetAttr, SgidDrop,
    SyncScope, TimeSet,
};

/// Entries read per page by [`Fs::readdir`].
const READDIR_PAGE: usize = 1024;

/// Most hard links to one inode (and subdirectories of one directory).
pub const LINK_MAX: u32 = 65000;

/// How `setxattr` treats an existing attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `Exists` if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with `NoData` if it does not exist (`XATTR_REPLACE`).
    Replace,
}

fn check_name(name: &OsStr) -> Result<&[u8]> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(FsError::invalid(format!("bad file name {name:?}")));
    }
    if b == b"." || b == b".." {
        return Err(FsError::Exists);
    }
    Ok(b)
}

pub(crate) fn inode(m: &MetaCore, ino: Ino) -> Result<&Inode> {
    m.state.get(ino)?.ok_or(FsError::Stale(ino.0))
}

/// The entry `name` of directory `parent` (`NotFound` if it has none).
fn entry(m: &MetaCore, parent: Ino, name: &[u8]) -> Result<stripefs_core::inode::DirEntry> {
    dir(m, parent)?;
    let e = m.state.entry(parent, name)?.ok_or(FsError::NotFound)?;
    Ok(e.entry)
}

fn dir(m: &MetaCore, ino: Ino) -> Result<&Inode> {
    let d = inode(m, ino)?;
    if d.attrs.kind != FileKind::Directory {
        return Err(FsError::NotDir);
    }
    Ok(d)
}

/// A directory that can take a new entry: removed ones (link count 0, alive only while
/// open) take none, as on a kernel file system (`ENOENT`).
fn live_dir(m: &MetaCore, ino: Ino) -> Result<&Inode> {
    let d = dir(m, ino)?;
    if d.attrs.nlink == 0 {
        return Err(FsError::NotFound);
    }
    Ok(d)
}

/// Set-group-ID on a directory (`S_ISGID`).
const SGID: u16 = 0o2000;

/// Group and permission bits of a new `kind` inode in directory `parent`, as a kernel
/// file system sets them (`inode_init_owner`): in a set-group-ID directory the new inode
/// takes the directory's group, and a new subdirectory inherits the set-group-ID bit;
/// elsewhere the creator's group and the asked-for bits stand. (Clearing set-group-ID
/// from a new file whose creator is not in that group needs the caller's credentials:
/// the front end does it before asking.)
fn inherited_group(parent: &InodeAttrs, kind: FileKind, p: &CreateParams) -> (u32, u16) {
    let perm = p.perm & 0o7777;
    if parent.perm & SGID == 0 {
        return (p.gid, perm);
    }
    let perm = if kind == FileKind::Directory {
        perm | SGID
    } else {
        perm
    };
    (parent.gid, perm)
}

/// Permission bits of a new inode and the ACL records it starts with: with a default ACL
/// in the parent, the ACL masked by the requested bits (and, for a directory, the default
/// ACL again) and no umask; otherwise the umask. Symbolic links get neither.
fn inherited_acl(
    parent: &Inode,
    ino: Ino,
    kind: FileKind,
    perm: u16,
    umask: u16,
) -> (u16, Vec<Record>) {
    if kind == FileKind::Symlink {
        return (perm, Vec::new());
    }
    let masked = perm & !(umask & 0o777);
    let Some(default) = parent.xattrs.get(acl::DEFAULT) else {
        return (masked, Vec::new());
    };
    let mut a = match Acl::parse(default) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(dir = %parent.attrs.ino, %e, "default ACL ignored");
            return (masked, Vec::new());
        }
    };
    let set = |name: &[u8], value: Vec<u8>| Record::XattrSet {
        ino,
        name: name.to_vec(),
        value,
    };
    let mut recs = Vec::new();
    if kind == FileKind::Directory {
        recs.push(set(acl::DEFAULT, default.clone()));
    }
    let perm = a.inherit(perm);
    if !a.is_minimal() {
        recs.push(set(acl::ACCESS, a.encode()));
    }
    (perm, recs)
}

/// The access ACL of `i` after `chmod` to `perm`, if it has one.
fn chmodded_acl(i: &Inode, perm: u16) -> Option<Record> {
    let v = i.xattrs.get(acl::ACCESS)?;
    let mut a = match Acl::parse(v) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(ino = %i.attrs.ino, %e, "access ACL left as it is by chmod");
            return None;
        }
    };
    a.chmod(perm);
    Some(Record::XattrSet {
        ino: i.attrs.ino,
        name: acl::ACCESS.to_vec(),
        value: a.encode(),
    })
}

/// The value to store for extended attribute `name` of an inode with attributes `a`:
/// `value` itself, except for POSIX ACLs, which are validated and stored canonically; an
/// access ACL also sets the permission bits, and is not stored (`None`) when it says no
/// more than they do.
fn acl_xattr(a: &mut InodeAttrs, name: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>> {
    let is_acl = name == acl::ACCESS || name == acl::DEFAULT;
    if !is_acl {
        return Ok(Some(value.to_vec()));
    }
    if a.kind == FileKind::Symlink {
        return Err(FsError::NotSupported("ACLs on a symbolic link".into()));
    }
    let parsed = Acl::parse(value)?;
    if name == acl::DEFAULT {
        if a.kind != FileKind::Directory {
            return Err(FsError::AccessDenied(
                "a default ACL is for directories only".into(),
            ));
        }
        return Ok(Some(parsed.encode()));
    }
    a.perm = (a.perm & !0o777) | parsed.mode();
    Ok((!parsed.is_minimal()).then(|| parsed.encode()))
}

/// The attributes of `ino` with `mtime` and `ctime` set to now: its data (or size)
/// changed. The caller adds what else changed and logs them.
pub(crate) fn data_changed(m: &MetaCore, ino: Ino) -> Result<stripefs_core::inode::InodeAttrs> {
    let mut a = inode(m, ino)?.attrs.clone();
    let now = crate::clock::time_now();
    a.mtime = now;
    a.ctime = now;
    Ok(a)
}

/// The attributes of `ino` after a write of its data, or `None` when its times stay as
/// they are (`clock::data_stamp`: at the coarse clock's granularity, while nobody has
/// read them since the last stamp).
pub(crate) fn data_times(m: &mut MetaCore, ino: Ino) -> Result<Option<InodeAttrs>> {
    let seen = m.inodes.entry(ino).io.stamp_seen();
    let mut a = inode(m, ino)?.attrs.clone();
    let Some(now) = crate::clock::data_stamp(a.mtime, a.ctime, seen) else {
        return Ok(None);
    };
    a.mtime = now;
    a.ctime = now;
    m.inodes.entry(ino).io.stamped();
    Ok(Some(a))
}

/// Parent attributes after an entry change: new times, link count adjusted by `dlink`.
fn touched_dir(d: &Inode, now: Timespec, dlink: i32) -> Record {
    let mut a = d.attrs.clone();
    a.mtime = now;
    a.ctime = now;
    a.nlink = a.nlink.saturating_add_signed(dlink);
    Record::InodeSet(a)
}

impl Fs {
    fn block_size(&self) -> u32 {
        self.inner.geo.block_size.bytes()
    }

    /// Attributes of `ino`: the in-core size (buffered writes included) and every block
    /// the file holds or has reserved (`st_blocks` counts delayed allocations and
    /// preallocation beyond EOF).
    ///
    /// # Errors
    /// `Stale` if the inode does not exist; `Poisoned`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        self.attr_of(&m, ino)
    }

    /// The attributes of `ino` for a server's own checks (the set-ID rules of a write,
    /// truncate or ACL change): given to nobody, so reading them does not count as its
    /// times being seen (`clock::data_stamp`), as [`Fs::getattr`] does.
    ///
    /// # Errors
    /// As [`Fs::getattr`].
    pub fn peek_attr(&self, ino: Ino) -> Result<Attr> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        self.attr_unseen(&m, ino)
    }

    /// The attributes of `ino` as given to a caller: its times count as seen.
    pub(crate) fn attr_of(&self, m: &MetaCore, ino: Ino) -> Result<Attr> {
        if let Some(c) = m.inodes.get(ino) {
            c.io.times_seen();
        }
        self.attr_unseen(m, ino)
    }

    fn attr_unseen(&self, m: &MetaCore, ino: Ino) -> Result<Attr> {
        let i = inode(m, ino)?;
        let mut a = Attr::of(i, self.block_size());
        a.atime = m.atime_of(&i.attrs);
        a.size = m.size_of(ino).unwrap_or(a.size);
        a.blocks += m.delalloc_blocks(ino) * u64::from(self.block_size()) / 512;
        Ok(a)
    }

    /// Looks `name` up in directory `parent` (`.` and `..` included).
    ///
    /// # Errors
    /// `NotFound`, `NotDir`, `NameTooLong`, `Stale`, `Poisoned`.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.inner.check()?;
        // The directory first, then the inode its entry names: each read, if missed,
        // without the metadata lock (`FsInner::meta_with`).
        let mut want = vec![parent];
        loop {
            let m = self.inner.meta_with(&want)?;
            let d = dir(&m, parent)?;
            let (m, target) = match name.as_bytes() {
                b"." => (m, parent),
                b".." => {
                    let up = d.attrs.parent;
                    (m, up)
                }
                b if b.len() > NAME_MAX => return Err(FsError::NameTooLong),
                // The entry's items read without the lock if the overlay lacks the name.
                b => {
                    let (m, e) = self.inner.dir_entry(m, parent, b)?;
                    (m, e.ok_or(FsError::NotFound)?.entry.ino)
                }
            };
            if want.len() == 1 && m.state.miss(target).is_some() {
                want.push(target);
                continue;
            }
            return self.attr_of(&m, target);
        }
    }

    /// The inode a file handle names (`open_by_handle_at`, an NFS server): any kind, as
    /// long as it has a name. Inode numbers are never reused, so a number alone is a
    /// handle that cannot reach another file.
    ///
    /// # Errors
    /// `Stale` if the inode is gone or unlinked.
    pub fn by_handle(&self, ino: Ino) -> Result<Attr> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        if inode(&m, ino)?.attrs.nlink == 0 {
            return Err(FsError::Stale(ino.0));
        }
        self.attr_of(&m, ino)
    }

    /// Creates a regular file.
    ///
    /// # Errors
    /// `Exists`, `NotDir`, `NameTooLong`, `Invalid` (bad layout), `NoSpace` (metadata area).
    pub fn create(&self, parent: Ino, name: &OsStr, p: CreateParams) -> Result<Attr> {
        self.make(parent, name, FileKind::Regular, p, None)
    }

    /// Creates a directory.
    ///
    /// # Errors
    /// As [`Fs::create`], plus `TooManyLinks`.
    pub fn mkdir(&self, parent: Ino, name: &OsStr, p: CreateParams) -> Result<Attr> {
        self.make(parent, name, FileKind::Directory, p, None)
    }

    /// Creates a special file (FIFO, socket, character or block device) or a regular file.
    ///
    /// # Errors
    /// As [`Fs::create`]; `Invalid` for directories and symlinks (use their own calls).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileKind,
        p: CreateParams,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return Err(FsError::invalid(
                "mknod cannot create directories or symlinks",
            ));
        }
        self.make(parent, name, kind, p, None)
    }

    /// Creates a symbolic link to `target`.
    ///
    /// # Errors
    /// As [`Fs::create`]; `NameTooLong` for targets over 4095 bytes; `NotFound` for empty.
    pub fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &OsStr,
        p: CreateParams,
    ) -> Result<Attr> {
        let t = target.as_bytes();
        if t.is_empty() {
            return Err(FsError::NotFound);
        }
        if t.len() > SYMLINK_MAX {
            return Err(FsError::NameTooLong);
        }
        self.make(parent, name, FileKind::Symlink, p, Some(t))
    }

    fn make(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileKind,
        p: CreateParams,
        link: Option<&[u8]>,
    ) -> Result<Attr> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        self.admit_metadata_growth()?;
        let name = check_name(name)?;
        let (mut m, _ahead) = self.lock_for_new_entry(parent, name)?;
        live_dir(&m, parent)?;
        if m.state.entry(parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        if kind == FileKind::Directory && live_dir(&m, parent)?.attrs.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        let layout = match kind {
            FileKind::Regular => match p.layout {
                Some(l) => self.check_layout(l)?,
                None => self.default_layout(&mut m),
            },
            _ => StripeLayout {
                count: 0,
                unit_bytes: 0,
                first_target: 0,
            },
        };
        let now = crate::clock::time_now();
        let ino = Ino(m.state.next_ino());
        let is_dir = kind == FileKind::Directory;
        let (gid, perm) = inherited_group(&live_dir(&m, parent)?.attrs, kind, &p);
        let (perm, acl_recs) = inherited_acl(live_dir(&m, parent)?, ino, kind, perm, p.umask);
        let attrs = InodeAttrs {
            ino,
            kind,
            perm,
            uid: p.uid,
            gid,
            nlink: if is_dir { 2 } else { 1 },
            size: link.map_or(0, |l| l.len() as u64),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            rdev: p.rdev,
            parent: if is_dir { parent } else { Ino(0) },
            layout,
            flags: crate::fileflags::new_inode_flags(
                kind,
                live_dir(&m, parent)?.attrs.flags,
                self.inner.opts.datacow,
            ),
        };
        let d = dir(&m, parent)?;
        let mut recs = vec![Record::InodeSet(attrs)];
        recs.extend(acl_recs);
        if let Some(t) = link {
            recs.push(Record::SymlinkSet {
                ino,
                target: t.to_vec(),
            });
        }
        recs.push(Record::DirAdd {
            dir: parent,
            name: name.to_vec(),
            ino,
            kind,
        });
        recs.push(touched_dir(d, now, i32::from(is_dir)));
        self.inner.log_all(&mut m, recs)?;
        self.attr_of(&m, ino)
    }

    /// Reads ahead, without the metadata lock, the pages a change of the entries
    /// `(dir, name)` looks up under it: each directory's inode, the leaf of each name's
    /// entry and the leaf of the directory's highest cookie (a new entry takes the next
    /// one) (issue 11: a create that missed the cache read them with the lock
    /// held, and every `fsync` waited behind it). A hint: the pages stay held while the
    /// guard lives; a failed read is read again, and reported, by the lookup that needs
    /// it.
    fn read_ahead_entries(
        &self,
        entries: &[(Ino, &[u8])],
    ) -> Option<stripefs_meta::Prefetched<'_>> {
        let store = &self.inner.store;
        let keys: Vec<_> = entries
            .iter()
            .flat_map(|&(dir, name)| {
                let hash = stripefs_core::btree::name_hash(store.uuid(), name);
                [
                    schema::inode_key(dir),
                    schema::dir_entry_key(dir, hash, 0),
                    // The directory's highest cookie: a new entry takes the next one.
                    schema::dir_cookie_key(dir, u64::MAX),
                ]
            })
            .collect();
        store.prefetch(&keys).ok()
    }

    /// The metadata lock for adding entry `name` to `dir`, with what the change reads in
    /// core or read without the lock first: the directory's inode (`FsInner::meta_with`),
    /// the name's entry (`FsInner::dir_entry`: through the mount, the kernel's negative
    /// `LOOKUP` just before a `CREATE` left its answer kept, and nothing is read), and,
    /// unless its next cookie is remembered, the pages of the directory's highest cookie
    /// (read ahead and held by the returned guard). So a run of creates takes the lock
    /// once or twice per create and reads no page under it; the caller checks the
    /// directory and the name again under the lock it gets.
    ///
    /// # Errors
    /// A read error the tickets show is not a torn read (the trees' own).
    fn lock_for_new_entry<'a>(
        &'a self,
        dir: Ino,
        name: &[u8],
    ) -> Result<(
        crate::inner::MetaGuard<'a>,
        Option<stripefs_meta::Prefetched<'a>>,
    )> {
        let m = self.inner.meta_with(&[dir])?;
        let m = match m.state.resident(dir) {
            // Not a directory: the caller's check fails at once.
            Some(d) if d.attrs.kind != FileKind::Directory => return Ok((m, None)),
            Some(_) => {
                let (m, e) = self.inner.dir_entry(m, dir, name)?;
                // The name exists (the caller fails), or nothing is left to read.
                if e.is_some() || m.state.remembers_next_cookie(dir) {
                    return Ok((m, None));
                }
                m
            }
            // Still not in core after `meta_with`'s retries: read everything ahead.
            None => m,
        };
        drop(m);
        let ahead = self.read_ahead_entries(&[(dir, name)]);
        Ok((self.inner.meta.lock(), ahead))
    }

    /// Reads ahead the inodes `inos` (as [`Self::read_ahead_entries`]).
    fn read_ahead_inodes(&self, inos: &[Ino]) -> Option<stripefs_meta::Prefetched<'_>> {
        let keys: Vec<_> = inos.iter().map(|&i| schema::inode_key(i)).collect();
        self.inner.store.prefetch(&keys).ok()
    }

    /// Reads ahead the inodes the entries `(dir, name)` name in the trees now (the
    /// entries' leaves read ahead already): the inodes an unlink or rename changes.
    fn read_ahead_named(&self, entries: &[(Ino, &[u8])]) -> Option<stripefs_meta::Prefetched<'_>> {
        let store = &self.inner.store;
        let inos: Vec<Ino> = entries
            .iter()
            .filter_map(|&(dir, name)| {
                stripefs_meta::items::lookup_entry(store, dir, name)
                    .ok()
                    .flatten()
                    .map(|e| e.ino)
            })
            .collect();
        self.read_ahead_inodes(&inos)
    }

    fn check_layout(&self, l: StripeLayout) -> Result<StripeLayout> {
        let g = &self.inner.geo;
        let n = self.inner.target_count();
        let ok = l.count >= 1
            && l.count <= n
            && l.unit_bytes > 0
            && l.unit_bytes.is_multiple_of(g.block_size.bytes())
            && l.first_target < n;
        if !ok {
            return Err(FsError::invalid(format!(
                "stripe layout {}x{} from target {} does not fit {} targets of {}-byte blocks",
                l.count,
                l.unit_bytes,
                l.first_target,
                n,
                g.block_size.bytes()
            )));
        }
        Ok(l)
    }

    /// Target of symlink `ino`.
    ///
    /// # Errors
    /// `Invalid` if `ino` is not a symlink; `Stale`.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        let i = inode(&m, ino)?;
        if i.attrs.kind != FileKind::Symlink {
            return Err(FsError::invalid("not a symbolic link"));
        }
        let target = i.symlink.clone();
        drop(m);
        self.touch_atime(ino);
        Ok(target)
    }

    /// Adds a hard link to `ino` as `newname` in `newparent`.
    ///
    /// # Errors
    /// `NotPermitted` for directories; `Exists`; `TooManyLinks`; `NotDir`.
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr) -> Result<Attr> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        self.admit_metadata_growth()?;
        let name = check_name(newname)?;
        let _ahead = self.read_ahead_entries(&[(newparent, name)]);
        let _child = self.read_ahead_inodes(&[ino]);
        let mut m = self.inner.meta.lock();
        let i = inode(&m, ino)?;
        if i.attrs.kind == FileKind::Directory {
            return Err(FsError::NotPermitted("hard links to directories".into()));
        }
        if i.attrs.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if i.attrs.nlink == 0 {
            return Err(FsError::NotFound);
        }
        live_dir(&m, newparent)?;
        if m.state.entry(newparent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        let d = live_dir(&m, newparent)?;
        let now = crate::clock::time_now();
        let mut a = i.attrs.clone();
        a.nlink += 1;
        a.ctime = now;
        let recs = vec![
            Record::DirAdd {
                dir: newparent,
                name: name.to_vec(),
                ino,
                kind: a.kind,
            },
            Record::InodeSet(a),
            touched_dir(d, now, 0),
        ];
        self.inner.log_all(&mut m, recs)?;
        self.attr_of(&m, ino)
    }

    /// Removes a non-directory entry; the inode goes when its last link and last open
    /// handle are gone.
    ///
    /// # Errors
    /// `NotFound`, `IsDir`, `NotDir`.
    pub fn unlink(&self, parent: Ino, name: &OsStr) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        let name = name.as_bytes();
        let _ahead = self.read_ahead_entries(&[(parent, name)]);
        let _child = self.read_ahead_named(&[(parent, name)]);
        let m = self.inner.meta.lock();
        let e = entry(&m, parent, name)?;
        if e.kind == FileKind::Directory {
            return Err(FsError::IsDir);
        }
        self.remove_entry(m, parent, name, e.ino, 0)
    }

    /// Removes entry `name` (for `child`) from `parent`, adjusts the parent's times and
    /// link count by `dlink`, drops the child's link, and reaps freed caches.
    fn remove_entry(
        &self,
        mut m: crate::inner::MetaGuard<'_>,
        parent: Ino,
        name: &[u8],
        child: Ino,
        dlink: i32,
    ) -> Result<()> {
        let now = crate::clock::time_now();
        let d = dir(&m, parent)?;
        let recs = vec![
            Record::DirRemove {
                dir: parent,
                name: name.to_vec(),
            },
            touched_dir(d, now, dlink),
        ];
        self.inner.log_all(&mut m, recs)?;
        self.drop_link(&mut m, child, now)?;
        drop(m);
        self.reap_dead();
        Ok(())
    }

    /// Decrements `ino`'s link count; frees it if no link and no open handle remain.
    fn drop_link(&self, m: &mut MetaCore, ino: Ino, now: Timespec) -> Result<()> {
        let mut a = inode(m, ino)?.attrs.clone();
        a.nlink = a.nlink.saturating_sub(if a.kind == FileKind::Directory {
            a.nlink
        } else {
            1
        });
        a.ctime = now;
        let gone = a.nlink == 0;
        self.inner.log_all(m, vec![Record::InodeSet(a)])?;
        if gone && m.open_count(ino) == 0 {
            self.free_inode(m, ino)?;
        }
        Ok(())
    }

    /// Removes an empty directory.
    ///
    /// # Errors
    /// `NotFound`, `NotDir`, `NotEmpty`, `Invalid` for `.`.
    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        match name.as_bytes() {
            b"." => return Err(FsError::invalid("cannot remove '.'")),
            b".." => return Err(FsError::NotEmpty),
            _ => {}
        }
        let name = name.as_bytes();
        let _ahead = self.read_ahead_entries(&[(parent, name)]);
        let _child = self.read_ahead_named(&[(parent, name)]);
        let m = self.inner.meta.lock();
        let e = entry(&m, parent, name)?;
        if e.kind != FileKind::Directory {
            return Err(FsError::NotDir);
        }
        dir(&m, e.ino)?;
        if !m.state.dir_is_empty(e.ino)? {
            return Err(FsError::NotEmpty);
        }
        self.remove_entry(m, parent, name, e.ino, -1)
    }

    /// Renames `parent/name` to `newparent/newname` atomically.
    ///
    /// # Errors
    /// `NotFound`; `Exists` (no-replace or exchange rules); `IsDir`/`NotDir` for type
    /// mismatches; `NotEmpty` when replacing a non-empty directory; `Invalid` when moving a
    /// directory under itself.
    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        mode: RenameMode,
    ) -> Result<()> {
        let _change = self.begin_change()?;
        let r = self.rename_locked(parent, name, newparent, newname, mode);
        self.reap_dead();
        r
    }

    fn rename_locked(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        mode: RenameMode,
    ) -> Result<()> {
        self.inner.check()?;
        let new = check_name(newname)?;
        let old = name.as_bytes();
        if old.is_empty() || old == b"." || old == b".." {
            return Err(FsError::invalid("cannot rename '.' or '..'"));
        }
        let both = [(parent, old), (newparent, new)];
        let _ahead = self.read_ahead_entries(&both);
        let _children = self.read_ahead_named(&both);
        let mut m = self.inner.meta.lock();
        let src = entry(&m, parent, old)?;
        live_dir(&m, newparent)?;
        let dst = m.state.entry(newparent, new)?.map(|p| p.entry);
        if src.kind == FileKind::Directory && self.is_ancestor(&m, src.ino, newparent)? {
            return Err(FsError::invalid("cannot move a directory into itself"));
        }
        let now = crate::clock::time_now();
        match (mode, dst) {
            (RenameMode::NoReplace, Some(_)) => Err(FsError::Exists),
            (RenameMode::Exchange, None) => Err(FsError::NotFound),
            (RenameMode::Exchange, Some(d)) => {
                self.exchange(&mut m, (parent, old, src), (newparent, new, d), now)
            }
            (_, Some(d)) if d.ino == src.ino => Ok(()),
            (_, Some(d)) => {
                self.check_replace(&m, src.kind, d)?;
                self.move_entry(&mut m, (parent, old, src), (newparent, new), now)?;
                self.drop_link(&mut m, d.ino, now)?;
                if d.kind == FileKind::Directory {
                    let nd = dir(&m, newparent)?;
                    let rec = touched_dir(nd, now, -1);
                    self.inner.log_all(&mut m, vec![rec])?;
                }
                Ok(())
            }
            (_, None) => self.move_entry(&mut m, (parent, old, src), (newparent, new), now),
        }
    }

    fn check_replace(
        &self,
        m: &MetaCore,
        src_kind: FileKind,
        d: stripefs_core::inode::DirEntry,
    ) -> Result<()> {
        match (
            src_kind == FileKind::Directory,
            d.kind == FileKind::Directory,
        ) {
            (true, false) => Err(FsError::NotDir),
            (false, true) => Err(FsError::IsDir),
            (true, true) if !m.state.dir_is_empty(d.ino)? => Err(FsError::NotEmpty),
            _ => Ok(()),
        }
    }

    /// True if `a` is `b` or one of `b`'s ancestors.
    fn is_ancestor(&self, m: &MetaCore, a: Ino, mut b: Ino) -> Result<bool> {
        for _ in 0..100_000 {
            if a == b {
                return Ok(true);
            }
            if b == Ino::ROOT {
                return Ok(false);
            }
            b = inode(m, b)?.attrs.parent;
        }
        Err(FsError::Corrupted(stripefs_core::CoreError::corrupted(
            "directory tree",
            "parent chain does not reach the root",
        )))
    }

    fn move_entry(
        &self,
        m: &mut MetaCore,
        from: (Ino, &[u8], stripefs_core::inode::DirEntry),
        to: (Ino, &[u8]),
        now: Timespec,
    ) -> Result<()> {
        let (sp, sname, e) = from;
        let (dp, dname) = to;
        let is_dir = e.kind == FileKind::Directory;
        let mut recs = vec![
            Record::DirAdd {
                dir: dp,
                name: dname.to_vec(),
                ino: e.ino,
                kind: e.kind,
            },
            Record::DirRemove {
                dir: sp,
                name: sname.to_vec(),
            },
        ];
        let moved_dir = is_dir && sp != dp;
        recs.push(touched_dir(
            dir(m, sp)?,
            now,
            if moved_dir { -1 } else { 0 },
        ));
        if sp != dp {
            recs.push(touched_dir(dir(m, dp)?, now, i32::from(moved_dir)));
        }
        let mut a = inode(m, e.ino)?.attrs.clone();
        a.ctime = now;
        if is_dir {
            a.parent = dp;
        }
        recs.push(Record::InodeSet(a));
        self.inner.log_all(m, recs)
    }

    fn exchange(
        &self,
        m: &mut MetaCore,
        a: (Ino, &[u8], stripefs_core::inode::DirEntry),
        b: (Ino, &[u8], stripefs_core::inode::DirEntry),
        now: Timespec,
    ) -> Result<()> {
        let ((ap, an, ae), (bp, bn, be)) = (a, b);
        if ae.kind == FileKind::Directory && self.is_ancestor(m, ae.ino, bp)?
            || be.kind == FileKind::Directory && self.is_ancestor(m, be.ino, ap)?
        {
            return Err(FsError::invalid(
                "cannot exchange a directory with its descendant",
            ));
        }
        let mut recs = vec![
            Record::DirAdd {
                dir: ap,
                name: an.to_vec(),
                ino: be.ino,
                kind: be.kind,
            },
            Record::DirAdd {
                dir: bp,
                name: bn.to_vec(),
                ino: ae.ino,
                kind: ae.kind,
            },
        ];
        let dirs_a = i32::from(ae.kind == FileKind::Directory);
        let dirs_b = i32::from(be.kind == FileKind::Directory);
        if ap == bp {
            recs.push(touched_dir(dir(m, ap)?, now, 0));
        } else {
            recs.push(touched_dir(dir(m, ap)?, now, dirs_b - dirs_a));
            recs.push(touched_dir(dir(m, bp)?, now, dirs_a - dirs_b));
        }
        for (e, newp) in [(ae, bp), (be, ap)] {
            let mut at = inode(m, e.ino)?.attrs.clone();
            at.ctime = now;
            if at.kind == FileKind::Directory {
                at.parent = newp;
            }
            recs.push(Record::InodeSet(at));
        }
        self.inner.log_all(m, recs)
    }

    /// Entries of directory `ino` in name order (without `.` and `..`): every page of
    /// [`Fs::readdir_from`], sorted. Memory grows with the directory: a front end lists
    /// page by page instead.
    ///
    /// # Errors
    /// `NotDir`, `Stale`.
    pub fn readdir(&self, ino: Ino) -> Result<Vec<DirEntryInfo>> {
        let mut all = Vec::new();
        let mut at = DirCookie::START;
        loop {
            let page = self.readdir_page(ino, at, READDIR_PAGE)?;
            let Some(last) = page.last() else {
                break;
            };
            at = last.cookie;
            all.extend(page);
        }
        self.touch_atime(ino);
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Up to `limit` entries of directory `ino` after cookie `after`, in cookie order
    /// (without `.` and `..`); resume with the last one's cookie. An entry present for
    /// the whole listing is returned exactly once, whatever is created, removed or
    /// renamed meanwhile (metadata.md, "Directory entries"). Reads the directory's
    /// cookie items from `after` on, not the whole directory.
    ///
    /// # Errors
    /// `NotDir`, `Stale`.
    pub fn readdir_from(
        &self,
        ino: Ino,
        after: DirCookie,
        limit: usize,
    ) -> Result<Vec<DirEntryInfo>> {
        let page = self.readdir_page(ino, after, limit)?;
        self.touch_atime(ino);
        Ok(page)
    }

    fn readdir_page(&self, ino: Ino, after: DirCookie, limit: usize) -> Result<Vec<DirEntryInfo>> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        dir(&m, ino)?;
        let page = self.inner.dir_page(m, ino, after, limit)?;
        Ok(page
            .into_iter()
            .map(|(name, p)| DirEntryInfo {
                name,
                ino: p.entry.ino,
                kind: p.entry.kind,
                cookie: p.cookie,
            })
            .collect())
    }

    /// Changes attributes. A size change truncates or extends (see [`Fs::set_len`]).
    ///
    /// # Errors
    /// As [`Fs::set_len`] for size changes; `Stale`.
    pub fn setattr(&self, ino: Ino, s: &SetAttr) -> Result<Attr> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        if let Some(size) = s.size {
            self.set_len(ino, size)?;
        }
        let now = crate::clock::time_now();
        let mut m = self.inner.meta_with(&[ino])?;
        let i = inode(&m, ino)?;
        let mut a = i.attrs.clone();
        let mut recs = Vec::new();
        if let Some(mode) = s.mode {
            a.perm = (mode & 0o7777) as u16;
            recs.extend(chmodded_acl(i, a.perm));
        } else if let Some(sgid) = s.kill_setid {
            a.perm = setid_dropped(a.kind, a.perm, sgid);
        }
        if let Some(uid) = s.uid {
            a.uid = uid;
        }
        if let Some(gid) = s.gid {
            a.gid = gid;
        }
        let pick = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = s.atime {
            a.atime = pick(t);
            if let Some(c) = m.inodes.get_mut(ino) {
                c.lazy_atime = None; // Set, not folded in.
            }
        }
        if let Some(t) = s.mtime {
            a.mtime = pick(t);
        }
        a.ctime = s.ctime.unwrap_or(now);
        recs.push(Record::InodeSet(a));
        self.inner.log_all(&mut m, recs)?;
        self.attr_of(&m, ino)
    }

    /// Drops the set-ID bits a change of content takes away from a file that is not a
    /// directory (the VFS's `file_remove_privs`, for a writer without `CAP_FSETID`):
    /// set-user-ID always, set-group-ID when the file is group-executable or
    /// `sgid` says so. Logs nothing when no bit is set.
    ///
    /// # Errors
    /// `Stale`; `NoSpace` when the journal is full.
    pub fn drop_setid(&self, ino: Ino, sgid: SgidDrop) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        let mut m = self.inner.meta.lock();
        let mut a = inode(&m, ino)?.attrs.clone();
        let perm = setid_dropped(a.kind, a.perm, sgid);
        if perm == a.perm {
            return Ok(());
        }
        a.perm = perm;
        a.ctime = crate::clock::time_now();
        self.inner.log_all(&mut m, vec![Record::InodeSet(a)])
    }

    /// Value of extended attribute `name`.
    ///
    /// # Errors
    /// `NoData` if absent; `Stale`.
    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        inode(&m, ino)?
            .xattrs
            .get(name.as_bytes())
            .cloned()
            .ok_or(FsError::NoData)
    }

    /// Sets extended attribute `name`.
    ///
    /// # Errors
    /// `Exists`/`NoData` per `mode`; `Range` for names over 255 bytes; `TooBig` for
    /// values over 64 KiB; `NoSpace` past 256 KiB of attributes on one inode.
    pub fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], mode: XattrMode) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        self.admit_metadata_growth()?;
        let n = name.as_bytes();
        if n.is_empty() {
            return Err(FsError::invalid("empty extended attribute name"));
        }
        if n.len() > XATTR_NAME_MAX {
            return Err(FsError::Range);
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(FsError::TooBig);
        }
        let mut m = self.inner.meta.lock();
        let i = inode(&m, ino)?;
        let old = i.xattrs.get(n).map(Vec::len);
        match (mode, old) {
            (XattrMode::Create, Some(_)) => return Err(FsError::Exists),
            (XattrMode::Replace, None) => return Err(FsError::NoData),
            _ => {}
        }
        let total = i.xattr_bytes() - old.map_or(0, |l| l + n.len()) + n.len() + value.len();
        if total > XATTR_TOTAL_MAX {
            return Err(FsError::NoSpace(format!(
                "extended attributes of inode {ino} would exceed {XATTR_TOTAL_MAX} bytes"
            )));
        }
        let mut a = i.attrs.clone();
        a.ctime = crate::clock::time_now();
        let value = acl_xattr(&mut a, n, value)?;
        let mut recs = Vec::new();
        match value {
            Some(value) => recs.push(Record::XattrSet {
                ino,
                name: n.to_vec(),
                value,
            }),
            None if old.is_some() => recs.push(Record::XattrRemove {
                ino,
                name: n.to_vec(),
            }),
            None => {}
        }
        recs.push(Record::InodeSet(a));
        self.inner.log_all(&mut m, recs)
    }

    /// Names of all extended attributes.
    ///
    /// # Errors
    /// `Stale`.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.inner.check()?;
        let m = self.inner.meta_with(&[ino])?;
        Ok(inode(&m, ino)?.xattrs.keys().cloned().collect())
    }

    /// Removes extended attribute `name`.
    ///
    /// # Errors
    /// `NoData` if absent; `Stale`.
    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> Result<()> {
        self.inner.check()?;
        let _change = self.begin_change()?;
        let mut m = self.inner.meta.lock();
        let i = inode(&m, ino)?;
        if !i.xattrs.contains_key(name.as_bytes()) {
            return Err(FsError::NoData);
        }
        let mut a = i.attrs.clone();
        a.ctime = crate::clock::time_now();
        let recs = vec![
            Record::XattrRemove {
                ino,
                name: name.as_bytes().to_vec(),
            },
            Record::InodeSet(a),
        ];
        self.inner.log_all(&mut m, recs)
    }

    /// Opens `ino`: returns a handle that keeps an unlinked inode alive until released
    /// and through which writeback errors are reported once.
    ///
    /// # Errors
    /// `Stale` if the inode is gone.
    pub fn open(&self, ino: Ino) -> Result<Fh> {
        self.open_with(ino, OpenMode::Cached)
    }

    /// Opens `ino` for I/O in `mode` (`O_DIRECT` or through the cache), which
    /// [`Fs::read`] and [`Fs::write`] follow; otherwise as [`Fs::open`].
    ///
    /// # Errors
    /// `Stale` if the inode is gone.
    pub fn open_with(&self, ino: Ino, mode: OpenMode) -> Result<Fh> {
        self.inner.check()?;
        let mut m = self.inner.meta_with(&[ino])?;
        inode(&m, ino)?;
        m.inodes.entry(ino).open += 1;
        self.inner.sweep_inodes_if_due(&mut m);
        drop(m);
        let seen = self
            .inner
            .cache
            .existing(ino.0)
            .map_or(0, |fc| fc.err_seq());
        let fh = self
            .inner
            .next_fh
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .handles
            .lock()
            .insert(fh, crate::inner::Handle { ino, seen, mode });
        Ok(Fh(fh))
    }

    /// `fsync` through a handle: reports a writeback error this handle has not been told
    /// about yet, once.
    ///
    /// # Errors
    /// As [`Fs::fsync`]; `Invalid` for an unknown handle.
    pub fn fsync_handle(&self, fh: Fh, scope: SyncScope) -> Result<()> {
        let h = self.handle(fh)?;
        let mut seen = h.seen;
        let r = self.sync_file(h.ino, scope, &mut seen);
        if let Some(h) = self.inner.handles.lock().get_mut(&fh.0) {
            h.seen = seen;
        }
        r
    }

    /// The inode of an open handle.
    ///
    /// # Errors
    /// `Invalid` for an unknown handle.
    pub fn handle_ino(&self, fh: Fh) -> Result<Ino> {
        Ok(self.handle(fh)?.ino)
    }

    /// An open handle.
    pub(crate) fn handle(&self, fh: Fh) -> Result<crate::inner::Handle> {
        self.inner
            .handles
            .lock()
            .get(&fh.0)
            .copied()
            .ok_or_else(|| FsError::invalid("unknown file handle"))
    }

    /// Releases a handle. At the last release of an inode its unused speculative
    /// preallocation is trimmed, and an unlinked inode is freed.
    ///
    /// # Errors
    /// `Poisoned` (the handle is released regardless).
    pub fn release(&self, fh: Fh) -> Result<()> {
        let Some(crate::inner::Handle { ino, .. }) = self.inner.handles.lock().remove(&fh.0) else {
            return Ok(());
        };
        let mut m = self.inner.meta.lock();
        let Some(c) = m.inodes.get_mut(ino).filter(|c| c.open > 0) else {
            return Ok(());
        };
        c.open -= 1;
        if c.open > 0 {
            return Ok(());
        }
        self.inner.check()?;
        drop(m);
        // Queued direct I/O may still be in flight on this inode: its blocks must not be
        // freed or trimmed under it. Completions take the metadata lock, so wait without it.
        self.inner.io_lock(ino).dio.drain();
        let mut m = self.inner.meta.lock();
        if m.open_count(ino) > 0 {
            return Ok(()); // Reopened meanwhile.
        }
        if self.inner.read_only() {
            // Nothing is written while read-only: an unlinked inode stays an orphan,
            // freed when the file system is made read-write again or at the next mount.
            return Ok(());
        }
        let orphan = m.state.get(ino)?.is_some_and(|i| i.attrs.nlink == 0);
        if orphan {
            self.free_inode(&mut m, ino)?;
        } else {
            self.trim_prealloc(&mut m, ino)?;
        }
        drop(m);
        self.reap_dead();
        Ok(())
    }
}

/// `perm` without the set-ID bits a change of content or owner drops (see
/// [`Fs::drop_setid`]); directories keep theirs (set-group-ID on a directory is
/// inheritance, not privilege).
#[must_use]
pub fn setid_dropped(kind: FileKind, perm: u16, sgid: SgidDrop) -> u16 {
    const SUID: u16 = 0o4000;
    const XGRP: u16 = 0o0010;
    if kind == FileKind::Directory {
        return perm;
    }
    let mut p = perm & !SUID;
    if sgid == SgidDrop::Always || perm & XGRP != 0 {
        p &= !SGID;
    }
    p
}

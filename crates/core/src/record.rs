//! Logical redo records: the journal's payload and the checkpoint's contents.
//!
//! Every metadata change is one or more records, applied through
//! [`crate::meta::MetaState::apply`]. Records are idempotent "set" operations, so replaying
//! a prefix of the log on top of the checkpoint it follows reproduces the state exactly.
//!
//! Encoding: `tag u8 | body_len u32 | body`, little-endian.

use crate::codec::{Dec, Enc};
use crate::csum::{BlockCsum, CSUM_RUN_MAX};
use crate::extent::ExtentState;
use crate::inode::{
    FileKind, InodeAttrs, Timespec, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};
use crate::layout::StripeLayout;
use crate::units::phys_run_fits;
use crate::{CoreError, Ino, TargetId};

/// One metadata change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Create an inode or replace its attributes.
    InodeSet(InodeAttrs),
    /// Delete an inode and everything it owns.
    InodeFree(Ino),
    /// Map object blocks `[block, block + len)` to physical `phys..` of `target` in
    /// `state`.
    ExtentSet {
        ino: Ino,
        object: u32,
        block: u64,
        len: u64,
        phys: u64,
        state: ExtentState,
        target: TargetId,
    },
    /// Unmap object blocks `[block, block + len)`.
    ExtentClear {
        ino: Ino,
        object: u32,
        block: u64,
        len: u64,
    },
    /// Add (or replace) entry `name` in directory `dir`.
    DirAdd {
        dir: Ino,
        name: Vec<u8>,
        ino: Ino,
        kind: FileKind,
    },
    /// Remove entry `name` from directory `dir`.
    DirRemove { dir: Ino, name: Vec<u8> },
    /// Set an extended attribute.
    XattrSet {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    /// Remove an extended attribute.
    XattrRemove { ino: Ino, name: Vec<u8> },
    /// Set a symlink's target.
    SymlinkSet { ino: Ino, target: Vec<u8> },
    /// Physical blocks `[phys, phys + len)` of `target` are mapped by `count` extents
    /// (`crate::refcount`): 2 or more is an entry of the reference-count index; 1 drops
    /// them from it (one owner left).
    RefcountSet {
        target: TargetId,
        phys: u64,
        len: u64,
        count: u32,
    },
    /// Physical blocks `[phys, phys + csums.len())` of `target` hold data whose crc32c are
    /// `csums`, one per block (`crate::csum`): logged with the `ExtentSet` that makes the
    /// data visible; at most [`CSUM_RUN_MAX`] blocks.
    CsumSet {
        target: TargetId,
        phys: u64,
        csums: Vec<BlockCsum>,
    },
    /// Physical blocks `[phys, phys + len)` of `target` have no checksum: logged with the
    /// release that frees them.
    CsumClear {
        target: TargetId,
        phys: u64,
        len: u64,
    },
    /// Target `target` joins the file system (the commit point of `add-target`,
    /// `docs/design/targets.md`): its data area `[data_start, blocks)` becomes free
    /// space. `target` is the member count before it (members are `0..count`).
    /// `member_id` is the random id written in its superblock (0 in records of builds
    /// before it: then nothing is compared).
    TargetAdd {
        target: TargetId,
        blocks: u64,
        data_start: u64,
        member_id: u64,
    },
    /// Target `target`'s state changes (`docs/design/targets.md`, "Retiring a target"):
    /// read-only when an evacuation begins, writable again when it is cancelled, retired
    /// once it is empty. A retired target stays retired.
    TargetState {
        target: TargetId,
        state: TargetState,
    },
}

/// What a member target may hold, persisted so that a remount keeps it (decision 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetState {
    /// The default: new blocks and in-place writes go there.
    Writable,
    /// Being evacuated: no new block, page or in-place write goes there.
    ReadOnly,
    /// Out of the file system: its data area `[data_start, blocks)` was wholly free when
    /// it left and no longer counts; mount does not need its device.
    Retired { data_start: u64, blocks: u64 },
}

const S_WRITABLE: u8 = 0;
const S_READ_ONLY: u8 = 1;
const S_RETIRED: u8 = 2;

impl TargetState {
    /// Whether nothing new may go there (read-only or retired).
    #[must_use]
    pub fn is_read_only(self) -> bool {
        !matches!(self, TargetState::Writable)
    }

    /// Appends the encoded state: code u8, then for `Retired` the data area.
    pub fn encode(self, b: &mut Enc) {
        match self {
            TargetState::Writable => b.u8(S_WRITABLE),
            TargetState::ReadOnly => b.u8(S_READ_ONLY),
            TargetState::Retired { data_start, blocks } => {
                b.u8(S_RETIRED);
                b.u64(data_start);
                b.u64(blocks);
            }
        }
    }

    /// Decodes what [`TargetState::encode`] wrote.
    ///
    /// # Errors
    /// `Corrupted` for an unknown code or a data area that is empty or does not fit.
    pub fn decode(d: &mut Dec<'_>) -> Result<Self, CoreError> {
        match d.u8()? {
            S_WRITABLE => Ok(TargetState::Writable),
            S_READ_ONLY => Ok(TargetState::ReadOnly),
            S_RETIRED => {
                let (data_start, blocks) = (d.u64()?, d.u64()?);
                if data_start == 0 || data_start >= blocks || !phys_run_fits(0, blocks) {
                    return Err(d.err(format!(
                        "retired target with data area {data_start}..{blocks}"
                    )));
                }
                Ok(TargetState::Retired { data_start, blocks })
            }
            other => Err(d.err(format!("unknown target state {other}"))),
        }
    }
}

impl std::fmt::Display for TargetState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetState::Writable => f.write_str("writable"),
            TargetState::ReadOnly => f.write_str("read-only"),
            TargetState::Retired { .. } => f.write_str("retired"),
        }
    }
}

const T_INODE_SET: u8 = 1;
const T_INODE_FREE: u8 = 2;
const T_EXTENT_SET: u8 = 3;
const T_EXTENT_CLEAR: u8 = 4;
const T_DIR_ADD: u8 = 5;
const T_DIR_REMOVE: u8 = 6;
const T_XATTR_SET: u8 = 7;
const T_XATTR_REMOVE: u8 = 8;
const T_SYMLINK_SET: u8 = 9;
const T_REFCOUNT_SET: u8 = 10;
const T_CSUM_SET: u8 = 11;
const T_CSUM_CLEAR: u8 = 12;
const T_TARGET_ADD: u8 = 13;
const T_TARGET_STATE: u8 = 14;

fn enc_time(e: &mut Enc, t: Timespec) {
    e.i64(t.sec);
    e.u32(t.nsec);
}

fn dec_time(d: &mut Dec<'_>) -> Result<Timespec, CoreError> {
    let sec = d.i64()?;
    let nsec = d.u32()?;
    if nsec >= 1_000_000_000 {
        return Err(d.err(format!("timestamp nanoseconds {nsec} out of range")));
    }
    Ok(Timespec { sec, nsec })
}

/// Encodes `a` as an `InodeSet` record's body (also the inode item's value, `btree::schema`).
pub(crate) fn enc_attrs(e: &mut Enc, a: &InodeAttrs) {
    e.u64(a.ino.0);
    e.u8(a.kind.code());
    e.u16(a.perm);
    e.u32(a.uid);
    e.u32(a.gid);
    e.u32(a.nlink);
    e.u64(a.size);
    for t in [a.atime, a.mtime, a.ctime, a.crtime] {
        enc_time(e, t);
    }
    e.u64(a.rdev);
    e.u64(a.parent.0);
    e.u32(a.layout.count);
    e.u32(a.layout.unit_bytes);
    e.u32(a.layout.first_target);
    e.u32(a.flags);
}

/// Decodes what [`enc_attrs`] wrote; `Corrupted` (naming `d`'s subject) on bad bytes.
pub(crate) fn dec_attrs(d: &mut Dec<'_>) -> Result<InodeAttrs, CoreError> {
    let ino = Ino(d.u64()?);
    let code = d.u8()?;
    let kind = FileKind::from_code(code)
        .ok_or_else(|| d.err(format!("inode {ino}: unknown file type {code}")))?;
    let perm = d.u16()?;
    if perm > 0o7777 {
        return Err(d.err(format!(
            "inode {ino}: permission bits {perm:o} out of range"
        )));
    }
    Ok(InodeAttrs {
        ino,
        kind,
        perm,
        uid: d.u32()?,
        gid: d.u32()?,
        nlink: d.u32()?,
        size: d.u64()?,
        atime: dec_time(d)?,
        mtime: dec_time(d)?,
        ctime: dec_time(d)?,
        crtime: dec_time(d)?,
        rdev: d.u64()?,
        parent: Ino(d.u64()?),
        layout: StripeLayout {
            count: d.u32()?,
            unit_bytes: d.u32()?,
            first_target: d.u32()?,
        },
        flags: {
            let f = d.u32()?;
            if f & !crate::inode::FLAGS_KNOWN != 0 {
                return Err(d.err(format!("inode {ino}: unknown flag bits {f:#x}")));
            }
            f
        },
    })
}

impl Record {
    /// Why this record cannot describe its range, if it cannot: no blocks, an object
    /// range that passes the end of the block numbers, or a physical run that passes the
    /// end of every target ([`phys_run_fits`]: past `u64::MAX` or
    /// [`crate::units::PHYS_BLOCKS_MAX`]). `MetaState::apply` and the trees'
    /// `apply_record` refuse such a record with this text before reading anything, so
    /// the arithmetic of the models over its range cannot overflow.
    #[must_use]
    pub fn range_misfit(&self) -> Option<String> {
        match self {
            Record::ExtentSet {
                ino,
                object,
                block,
                len,
                phys,
                ..
            } if *len == 0 || block.checked_add(*len).is_none() || !phys_run_fits(*phys, *len) => {
                Some(format!(
                    "inode {ino} object {object}: extent of {len} blocks at block {block} \
                     (physical {phys})"
                ))
            }
            Record::ExtentClear {
                ino,
                object,
                block,
                len,
            } if block.checked_add(*len).is_none() => Some(format!(
                "inode {ino} object {object}: clear of {len} blocks at block {block}"
            )),
            Record::RefcountSet {
                target, phys, len, ..
            }
            | Record::CsumClear { target, phys, len }
                if !phys_run_fits(*phys, *len) =>
            {
                Some(format!(
                    "{} of {len} blocks at target {target} block {phys}",
                    self.name()
                ))
            }
            Record::CsumSet {
                target,
                phys,
                csums,
            } if csums.len() > CSUM_RUN_MAX || !phys_run_fits(*phys, csums.len() as u64) => {
                Some(format!(
                    "checksums of {} blocks at target {target} block {phys}",
                    csums.len()
                ))
            }
            _ => None,
        }
    }

    /// The record's kind, for messages.
    fn name(&self) -> &'static str {
        match self {
            Record::InodeSet(_) => "inode set",
            Record::InodeFree(_) => "inode free",
            Record::ExtentSet { .. } => "extent set",
            Record::ExtentClear { .. } => "extent clear",
            Record::DirAdd { .. } => "entry add",
            Record::DirRemove { .. } => "entry remove",
            Record::XattrSet { .. } => "xattr set",
            Record::XattrRemove { .. } => "xattr remove",
            Record::SymlinkSet { .. } => "symlink set",
            Record::RefcountSet { .. } => "refcount",
            Record::CsumSet { .. } => "checksum set",
            Record::CsumClear { .. } => "checksum clear",
            Record::TargetAdd { .. } => "target add",
            Record::TargetState { .. } => "target state",
        }
    }

    /// Appends the encoded record to `e`.
    pub fn encode(&self, e: &mut Enc) {
        // Tag, body length, body: the body is written in place and its length patched
        // after (this runs under the metadata lock for every record a change logs).
        let start = e.len();
        e.u8(0);
        e.u32(0);
        let body = e.len();
        let tag = self.encode_body(e);
        let len = u32::try_from(e.len() - body).expect("record body below 4 GiB");
        e.buf[start] = tag;
        e.buf[start + 1..body].copy_from_slice(&len.to_le_bytes());
    }

    /// Appends the record's body to `b` and returns its tag.
    fn encode_body(&self, b: &mut Enc) -> u8 {
        match self {
            Record::InodeSet(a) => {
                enc_attrs(b, a);
                T_INODE_SET
            }
            Record::InodeFree(ino) => {
                b.u64(ino.0);
                T_INODE_FREE
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
                b.u64(ino.0);
                b.u32(*object);
                b.u64(*block);
                b.u64(*len);
                b.u64(*phys);
                b.u8(state.code());
                b.u32(target.0);
                T_EXTENT_SET
            }
            Record::ExtentClear {
                ino,
                object,
                block,
                len,
            } => {
                b.u64(ino.0);
                b.u32(*object);
                b.u64(*block);
                b.u64(*len);
                T_EXTENT_CLEAR
            }
            Record::DirAdd {
                dir,
                name,
                ino,
                kind,
            } => {
                b.u64(dir.0);
                b.blob(name);
                b.u64(ino.0);
                b.u8(kind.code());
                T_DIR_ADD
            }
            Record::DirRemove { dir, name } => {
                b.u64(dir.0);
                b.blob(name);
                T_DIR_REMOVE
            }
            Record::XattrSet { ino, name, value } => {
                b.u64(ino.0);
                b.blob(name);
                b.blob(value);
                T_XATTR_SET
            }
            Record::XattrRemove { ino, name } => {
                b.u64(ino.0);
                b.blob(name);
                T_XATTR_REMOVE
            }
            Record::SymlinkSet { ino, target } => {
                b.u64(ino.0);
                b.blob(target);
                T_SYMLINK_SET
            }
            Record::RefcountSet {
                target,
                phys,
                len,
                count,
            } => {
                b.u32(target.0);
                b.u64(*phys);
                b.u64(*len);
                b.u32(*count);
                T_REFCOUNT_SET
            }
            Record::CsumSet {
                target,
                phys,
                csums,
            } => {
                b.u32(target.0);
                b.u64(*phys);
                b.u32(u32::try_from(csums.len()).expect("a run of at most CSUM_RUN_MAX"));
                for c in csums {
                    b.u32(c.0);
                }
                T_CSUM_SET
            }
            Record::CsumClear { target, phys, len } => {
                b.u32(target.0);
                b.u64(*phys);
                b.u64(*len);
                T_CSUM_CLEAR
            }
            Record::TargetAdd {
                target,
                blocks,
                data_start,
                member_id,
            } => {
                b.u32(target.0);
                b.u64(*blocks);
                b.u64(*data_start);
                b.u64(*member_id);
                T_TARGET_ADD
            }
            Record::TargetState { target, state } => {
                b.u32(target.0);
                state.encode(b);
                T_TARGET_STATE
            }
        }
    }

    /// Encoded size in bytes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        // Encoded into a buffer kept per thread: a change sizes each record it logs,
        // and a fresh vector grew five times per record (issue 11's create profile).
        thread_local! {
            static SCRATCH: std::cell::RefCell<Enc> = std::cell::RefCell::new(Enc::new());
        }
        SCRATCH.with(|s| {
            let mut e = s.borrow_mut();
            e.buf.clear();
            self.encode(&mut e);
            let n = e.len();
            // A large record (a checksum run, an xattr value) does not keep its
            // buffer's size.
            e.buf.clear();
            e.buf.shrink_to(4096);
            n
        })
    }

    /// Decodes one record.
    ///
    /// # Errors
    /// `Corrupted` for unknown tags, truncated bodies, out-of-range values, or trailing
    /// bytes inside a body.
    pub fn decode(d: &mut Dec<'_>) -> Result<Self, CoreError> {
        let tag = d.u8()?;
        let len = d.u32()? as usize;
        let body = d.bytes(len)?;
        let mut b = Dec::new(body, "metadata record");
        let rec = match tag {
            T_INODE_SET => Record::InodeSet(dec_attrs(&mut b)?),
            T_INODE_FREE => Record::InodeFree(Ino(b.u64()?)),
            T_EXTENT_SET => {
                let (ino, object, block, len, phys) =
                    (Ino(b.u64()?), b.u32()?, b.u64()?, b.u64()?, b.u64()?);
                let code = b.u8()?;
                let state = ExtentState::from_code(code)
                    .ok_or_else(|| b.err(format!("extent state {code}")))?;
                let target = TargetId(b.u32()?);
                if len == 0 || block.checked_add(len).is_none() || !phys_run_fits(phys, len) {
                    return Err(b.err(format!(
                        "inode {ino} extent at {block} has impossible length {len}"
                    )));
                }
                Record::ExtentSet {
                    ino,
                    object,
                    block,
                    len,
                    phys,
                    state,
                    target,
                }
            }
            T_EXTENT_CLEAR => {
                let (ino, object, block, len) = (Ino(b.u64()?), b.u32()?, b.u64()?, b.u64()?);
                if len == 0 || block.checked_add(len).is_none() {
                    return Err(b.err(format!(
                        "inode {ino} extent clear at {block} of length {len}"
                    )));
                }
                Record::ExtentClear {
                    ino,
                    object,
                    block,
                    len,
                }
            }
            T_DIR_ADD => {
                let dir = Ino(b.u64()?);
                let name = b.blob(NAME_MAX)?.to_vec();
                let ino = Ino(b.u64()?);
                let code = b.u8()?;
                let kind =
                    FileKind::from_code(code).ok_or_else(|| b.err(format!("entry type {code}")))?;
                Record::DirAdd {
                    dir,
                    name,
                    ino,
                    kind,
                }
            }
            T_DIR_REMOVE => Record::DirRemove {
                dir: Ino(b.u64()?),
                name: b.blob(NAME_MAX)?.to_vec(),
            },
            T_XATTR_SET => Record::XattrSet {
                ino: Ino(b.u64()?),
                name: b.blob(XATTR_NAME_MAX)?.to_vec(),
                value: b.blob(XATTR_VALUE_MAX)?.to_vec(),
            },
            T_XATTR_REMOVE => Record::XattrRemove {
                ino: Ino(b.u64()?),
                name: b.blob(XATTR_NAME_MAX)?.to_vec(),
            },
            T_SYMLINK_SET => Record::SymlinkSet {
                ino: Ino(b.u64()?),
                target: b.blob(SYMLINK_MAX)?.to_vec(),
            },
            T_REFCOUNT_SET => {
                let (target, phys, len, count) = (TargetId(b.u32()?), b.u64()?, b.u64()?, b.u32()?);
                if !phys_run_fits(phys, len) || count == 0 {
                    return Err(b.err(format!(
                        "refcount of {len} blocks at target {target} block {phys}: count {count}"
                    )));
                }
                Record::RefcountSet {
                    target,
                    phys,
                    len,
                    count,
                }
            }
            T_CSUM_SET => {
                let (target, phys, n) = (TargetId(b.u32()?), b.u64()?, b.u32()? as usize);
                if n > CSUM_RUN_MAX || !phys_run_fits(phys, n as u64) {
                    return Err(b.err(format!(
                        "checksums of {n} blocks at target {target} block {phys}"
                    )));
                }
                let csums = (0..n)
                    .map(|_| b.u32().map(BlockCsum))
                    .collect::<Result<Vec<_>, _>>()?;
                Record::CsumSet {
                    target,
                    phys,
                    csums,
                }
            }
            T_CSUM_CLEAR => {
                let (target, phys, len) = (TargetId(b.u32()?), b.u64()?, b.u64()?);
                if !phys_run_fits(phys, len) {
                    return Err(b.err(format!(
                        "checksum clear of {len} blocks at target {target} block {phys}"
                    )));
                }
                Record::CsumClear { target, phys, len }
            }
            T_TARGET_ADD => {
                let (target, blocks, data_start) = (TargetId(b.u32()?), b.u64()?, b.u64()?);
                if data_start == 0 || data_start >= blocks || !phys_run_fits(0, blocks) {
                    return Err(b.err(format!(
                        "target {target} added with data area {data_start}..{blocks}"
                    )));
                }
                // Records written before the member id end here.
                let member_id = if b.remaining() == 0 { 0 } else { b.u64()? };
                Record::TargetAdd {
                    target,
                    blocks,
                    data_start,
                    member_id,
                }
            }
            T_TARGET_STATE => {
                let target = TargetId(b.u32()?);
                let state = TargetState::decode(&mut b)?;
                Record::TargetState { target, state }
            }
            other => return Err(d.err(format!("unknown record type {other}"))),
        };
        if b.remaining() != 0 {
            return Err(d.err(format!(
                "record type {tag} has {} trailing bytes",
                b.remaining()
            )));
        }
        Ok(rec)
    }

    /// Decodes a whole buffer of records.
    ///
    /// # Errors
    /// As [`Record::decode`].
    pub fn decode_all(buf: &[u8], what: &str) -> Result<Vec<Record>, CoreError> {
        let mut d = Dec::new(buf, what);
        let mut out = Vec::new();
        while d.remaining() > 0 {
            out.push(Record::decode(&mut d)?);
        }
        Ok(out)
    }

    /// The inode this record is about (the directory for entry records); `None` for
    /// reference counts and checksums, which are about physical blocks.
    #[must_use]
    pub fn subject(&self) -> Option<Ino> {
        match self {
            Record::InodeSet(a) => Some(a.ino),
            Record::InodeFree(i) => Some(*i),
            Record::ExtentSet { ino, .. }
            | Record::ExtentClear { ino, .. }
            | Record::XattrSet { ino, .. }
            | Record::XattrRemove { ino, .. }
            | Record::SymlinkSet { ino, .. } => Some(*ino),
            Record::DirAdd { dir, .. } | Record::DirRemove { dir, .. } => Some(*dir),
            Record::RefcountSet { .. }
            | Record::CsumSet { .. }
            | Record::CsumClear { .. }
            | Record::TargetAdd { .. }
            | Record::TargetState { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_add_without_a_member_id_decodes_with_none() {
        // The body a build before member ids wrote: target, blocks, data start.
        let mut b = Enc::new();
        b.u32(3);
        b.u64(4096);
        b.u64(256);
        let mut e = Enc::new();
        e.u8(T_TARGET_ADD);
        e.u32(b.len() as u32);
        e.bytes(&b.buf);
        let recs = Record::decode_all(&e.buf, "t").unwrap();
        assert_eq!(
            recs,
            vec![Record::TargetAdd {
                target: TargetId(3),
                blocks: 4096,
                data_start: 256,
                member_id: 0,
            }]
        );
    }

    #[test]
    fn records_roundtrip() {
        let attrs = InodeAttrs {
            ino: Ino(9),
            kind: FileKind::Regular,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 12345,
            atime: Timespec { sec: 1, nsec: 2 },
            mtime: Timespec { sec: 3, nsec: 4 },
            ctime: Timespec { sec: 5, nsec: 6 },
            crtime: Timespec { sec: 7, nsec: 8 },
            rdev: 0,
            parent: Ino(0),
            layout: StripeLayout {
                count: 2,
                unit_bytes: 65536,
                first_target: 1,
            },
            flags: crate::inode::FLAG_NOCOW,
        };
        let recs = vec![
            Record::InodeSet(attrs.clone()),
            Record::ExtentSet {
                ino: Ino(9),
                object: 1,
                block: 3,
                len: 4,
                phys: 99,
                state: ExtentState::Unwritten,
                target: TargetId(0),
            },
            Record::ExtentClear {
                ino: Ino(9),
                object: 0,
                block: 0,
                len: 1,
            },
            Record::DirAdd {
                dir: Ino(1),
                name: b"f".to_vec(),
                ino: Ino(9),
                kind: FileKind::Regular,
            },
            Record::DirRemove {
                dir: Ino(1),
                name: b"g".to_vec(),
            },
            Record::XattrSet {
                ino: Ino(9),
                name: b"user.a".to_vec(),
                value: vec![1, 2],
            },
            Record::XattrRemove {
                ino: Ino(9),
                name: b"user.a".to_vec(),
            },
            Record::SymlinkSet {
                ino: Ino(9),
                target: b"/x".to_vec(),
            },
            Record::RefcountSet {
                target: TargetId(2),
                phys: 77,
                len: 3,
                count: 2,
            },
            Record::CsumSet {
                target: TargetId(1),
                phys: 5,
                csums: vec![BlockCsum(7), BlockCsum(u32::MAX)],
            },
            Record::CsumClear {
                target: TargetId(0),
                phys: 4,
                len: 9,
            },
            Record::TargetAdd {
                target: TargetId(3),
                blocks: 4096,
                data_start: 256,
                member_id: 0x1234_5678_9abc_def0,
            },
            Record::TargetState {
                target: TargetId(2),
                state: TargetState::ReadOnly,
            },
            Record::TargetState {
                target: TargetId(2),
                state: TargetState::Retired {
                    data_start: 256,
                    blocks: 4096,
                },
            },
            Record::TargetState {
                target: TargetId(1),
                state: TargetState::Writable,
            },
            Record::InodeFree(Ino(9)),
        ];
        let mut e = Enc::new();
        for r in &recs {
            e.buf.len();
            r.encode(&mut e);
        }
        assert_eq!(Record::decode_all(&e.buf, "t").unwrap(), recs);
        for cut in 0..e.buf.len() {
            // Any truncation is an error, never a panic.
            let _ = Record::decode_all(&e.buf[..cut], "t");
        }
    }

    #[test]
    fn unknown_inode_flag_bits_are_corruption() {
        let attrs = InodeAttrs {
            ino: Ino(9),
            kind: FileKind::Directory,
            perm: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: 0,
            atime: Timespec { sec: 1, nsec: 0 },
            mtime: Timespec { sec: 1, nsec: 0 },
            ctime: Timespec { sec: 1, nsec: 0 },
            crtime: Timespec { sec: 1, nsec: 0 },
            rdev: 0,
            parent: Ino(1),
            layout: StripeLayout {
                count: 0,
                unit_bytes: 0,
                first_target: 0,
            },
            flags: 1 << 7,
        };
        let mut e = Enc::new();
        Record::InodeSet(attrs).encode(&mut e);
        let err = Record::decode_all(&e.buf, "t").unwrap_err().to_string();
        assert!(err.contains("inode 9: unknown flag bits 0x80"), "{err}");
    }

    /// Guards: `CsumMap::set` panicked (debug overflow) on a `CsumSet` ending at
    /// `u64::MAX`, `RefcountIndex::set` on a range passing it; such records decoded from
    /// the journal must be corruption, not a panic and not a silent wrap.
    #[test]
    fn physical_runs_past_every_target_are_corruption() {
        let t = TargetId(0);
        let max = crate::units::PHYS_BLOCKS_MAX;
        let bad = [
            Record::CsumSet {
                target: t,
                phys: u64::MAX - 1,
                csums: vec![BlockCsum(1)],
            },
            Record::CsumSet {
                target: t,
                phys: max - 1,
                csums: vec![BlockCsum(1); 2],
            },
            Record::CsumClear {
                target: t,
                phys: max,
                len: 1,
            },
            Record::RefcountSet {
                target: t,
                phys: u64::MAX,
                len: 1,
                count: 2,
            },
            Record::RefcountSet {
                target: t,
                phys: 1,
                len: max,
                count: 2,
            },
            Record::ExtentSet {
                ino: Ino(9),
                object: 0,
                block: 0,
                len: 2,
                phys: max - 1,
                state: ExtentState::Written,
                target: TargetId(0),
            },
        ];
        for rec in bad {
            let mut e = Enc::new();
            rec.encode(&mut e);
            let err = Record::decode_all(&e.buf, "t").unwrap_err().to_string();
            assert!(
                err.starts_with("corruption in metadata record"),
                "{rec:?}: {err}"
            );
            let mut m = crate::meta::MetaState::new();
            let err = m.apply(&rec).unwrap_err().to_string();
            assert!(
                err.starts_with("corruption in metadata record"),
                "{rec:?}: {err}"
            );
            assert!(rec.range_misfit().is_some(), "{rec:?}");
        }
        let fits = Record::CsumSet {
            target: t,
            phys: max - 1,
            csums: vec![BlockCsum(1)],
        };
        assert_eq!(fits.range_misfit(), None);
        crate::meta::MetaState::new().apply(&fits).unwrap();
    }
}

//! Keys and values of the metadata keyspace (`docs/design/format.md`, "Metadata
//! keyspace"): directory entries and their readdir cookies, extents, free space, and
//! the chunking of symlink targets and xattrs into items of at most [`VALUE_MAX`]
//! bytes, and the inode item with the file-system counter item. Every decoder checks
//! lengths and codes and names the key in its error.

use std::fmt;

use super::key::{Key, KeyKind, COLLISIONS_MAX, VALUE_MAX};
use crate::codec::{Dec, Enc};
use crate::extent::{Extent, ExtentState};
use crate::inode::{FileKind, InodeAttrs, NAME_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX};
use crate::record::{dec_attrs, enc_attrs, TargetState};
use crate::refcount::Shared;
use crate::units::phys_run_fits;
use crate::{CoreError, Ino, TargetId};

/// Version byte that starts an inode item's value.
pub const INODE_VALUE_V1: u8 = 1;

/// Cookie of the first entry of a directory: readdir offsets 0, 1 and 2 stand for the
/// start, after "." and after ".." (`docs/design/format.md`, "Metadata keyspace").
pub const COOKIE_FIRST: u64 = 3;

/// The key of inode `ino`'s attributes.
#[must_use]
pub fn inode_key(ino: Ino) -> Key {
    Key::new(ino.0, KeyKind::Inode, 0, 0)
}

/// The key of the file-system counter item: object 0, which no inode has (the root is
/// inode 1 and `Ino(0)` means "none"). Its value is the next inode number, u64.
#[must_use]
pub fn counter_key() -> Key {
    Key::new(0, KeyKind::Inode, 0, 0)
}

/// The key of the orphan item of `ino` (present while its link count is 0). Orphan items
/// are an index at object 0, next to the counter, so a mount finds every inode to free
/// with one short scan ([`orphan_range`]) instead of reading every inode.
#[must_use]
pub fn orphan_key(ino: Ino) -> Key {
    Key::new(0, KeyKind::Orphan, ino.0, 0)
}

/// The keys of every orphan item: `from..to`.
#[must_use]
pub fn orphan_range() -> (Key, Option<Key>) {
    (
        Key::new(0, KeyKind::Orphan, 0, 0),
        Key::new(0, KeyKind::Orphan, u64::MAX, u64::MAX).successor(),
    )
}

/// The value of an inode item: version byte, then the attributes as an `InodeSet`
/// record carries them.
#[must_use]
pub fn encode_inode(a: &InodeAttrs) -> Vec<u8> {
    // 112 bytes today; a little room should the attributes grow.
    let mut v = Enc::with_capacity(128);
    v.u8(INODE_VALUE_V1);
    enc_attrs(&mut v, a);
    v.buf
}

/// Decodes an inode item.
///
/// # Errors
/// `Corrupted` naming the key: unknown version, bad attributes, an inode number that
/// is not the key's, trailing bytes.
pub fn decode_inode(key: &Key, value: &[u8]) -> Result<InodeAttrs, CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let version = d.u8()?;
    if version != INODE_VALUE_V1 {
        return Err(d.err(format!("inode value version {version}")));
    }
    let a = dec_attrs(&mut d)?;
    if a.ino.0 != key.object || key.object == 0 || d.remaining() != 0 {
        return Err(d.err(format!(
            "inode {} with {} trailing bytes",
            a.ino,
            d.remaining()
        )));
    }
    Ok(a)
}

/// What the counter item holds: the next inode number and how many inodes exist, so a
/// mount knows both without reading the inodes (`statfs`, the inode count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    pub next_ino: u64,
    pub inodes: u64,
}

impl Counter {
    /// Empty trees: no inode yet, the next one is the root.
    pub const EMPTY: Counter = Counter {
        next_ino: Ino::ROOT.0,
        inodes: 0,
    };
}

/// The value of the counter item.
#[must_use]
pub fn encode_counter(c: Counter) -> Vec<u8> {
    let mut v = c.next_ino.to_le_bytes().to_vec();
    v.extend_from_slice(&c.inodes.to_le_bytes());
    v
}

/// Decodes the counter item: the next inode number (at least 1, the root's) and the
/// inode count (below it: inode numbers start at 1 and are never reused).
///
/// # Errors
/// `Corrupted` naming the key: wrong length, next inode 0, or more inodes than numbers.
pub fn decode_counter(key: &Key, value: &[u8]) -> Result<Counter, CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let next = d.u64()?;
    let inodes = d.u64()?;
    if next < Ino::ROOT.0 || inodes >= next || d.remaining() != 0 {
        return Err(d.err(format!(
            "next inode {next}, {inodes} inodes in a {}-byte value",
            value.len()
        )));
    }
    Ok(Counter {
        next_ino: next,
        inodes,
    })
}

/// A directory entry as both its items carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryItem {
    pub ino: Ino,
    pub kind: FileKind,
    /// Readdir position of the entry (from 3; kept for the entry's life).
    pub cookie: u64,
    pub name: Vec<u8>,
}

/// The key of the entry `name` of `dir` with hash `hash` and collision index `collision`.
#[must_use]
pub fn dir_entry_key(dir: Ino, hash: u64, collision: u64) -> Key {
    Key::new(dir.0, KeyKind::DirEntry, hash, collision)
}

/// The key of the readdir item at `cookie` of `dir`.
#[must_use]
pub fn dir_cookie_key(dir: Ino, cookie: u64) -> Key {
    Key::new(dir.0, KeyKind::DirCookie, cookie, 0)
}

/// The two items of an entry: by name hash, and by cookie.
#[must_use]
pub fn dir_entry_items(
    dir: Ino,
    hash: u64,
    collision: u64,
    e: &DirEntryItem,
) -> [(Key, Vec<u8>); 2] {
    debug_assert!(!e.name.is_empty() && e.name.len() <= NAME_MAX);
    let mut by_name = Enc::with_capacity(17 + e.name.len());
    by_name.u64(e.ino.0);
    by_name.u8(e.kind.code());
    by_name.u64(e.cookie);
    by_name.bytes(&e.name);
    let mut by_cookie = Enc::with_capacity(25 + e.name.len());
    by_cookie.u64(hash);
    by_cookie.u64(collision);
    by_cookie.u64(e.ino.0);
    by_cookie.u8(e.kind.code());
    by_cookie.bytes(&e.name);
    [
        (dir_entry_key(dir, hash, collision), by_name.buf),
        (dir_cookie_key(dir, e.cookie), by_cookie.buf),
    ]
}

/// Names an item in decoding errors (formatted only when an error is made).
struct ItemName<'a>(&'a Key);

impl fmt::Display for ItemName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "metadata item {}", self.0)
    }
}

fn what(key: &Key) -> ItemName<'_> {
    ItemName(key)
}

fn name_of(d: &mut Dec<'_>, max: usize) -> Result<Vec<u8>, CoreError> {
    let name = d.bytes(d.remaining())?;
    if name.is_empty() || name.len() > max {
        return Err(d.err(format!("name of {} bytes", name.len())));
    }
    Ok(name.to_vec())
}

fn kind_of(d: &mut Dec<'_>) -> Result<FileKind, CoreError> {
    let code = d.u8()?;
    FileKind::from_code(code).ok_or_else(|| d.err(format!("file kind {code}")))
}

/// Decodes a [`KeyKind::DirEntry`] item.
///
/// # Errors
/// `Corrupted` naming the key when the value does not parse.
pub fn decode_dir_entry(key: &Key, value: &[u8]) -> Result<DirEntryItem, CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let ino = Ino(d.u64()?);
    let kind = kind_of(&mut d)?;
    let cookie = d.u64()?;
    let name = name_of(&mut d, NAME_MAX)?;
    Ok(DirEntryItem {
        ino,
        kind,
        cookie,
        name,
    })
}

/// Decodes a [`KeyKind::DirCookie`] item: the entry and its (hash, collision).
///
/// # Errors
/// `Corrupted` naming the key when the value does not parse.
pub fn decode_dir_cookie(key: &Key, value: &[u8]) -> Result<(DirEntryItem, u64, u64), CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let hash = d.u64()?;
    let collision = d.u64()?;
    let ino = Ino(d.u64()?);
    let kind = kind_of(&mut d)?;
    let name = name_of(&mut d, NAME_MAX)?;
    let e = DirEntryItem {
        ino,
        kind,
        cookie: key.a,
        name,
    };
    Ok((e, hash, collision))
}

/// The lowest collision index not in `taken` (the indices present under one hash).
///
/// # Errors
/// `Limit` when all 65,536 are taken.
pub fn free_collision(taken: impl IntoIterator<Item = u64>) -> Result<u64, CoreError> {
    let mut used: Vec<u64> = taken.into_iter().collect();
    used.sort_unstable();
    let mut next = 0;
    for u in used {
        if u == next {
            next += 1;
        } else if u > next {
            break;
        }
    }
    if next > COLLISIONS_MAX {
        return Err(CoreError::Limit(format!(
            "{} names share one hash",
            COLLISIONS_MAX + 1
        )));
    }
    Ok(next)
}

/// The key of the extent of stripe object `object` of `ino` starting at object block
/// `block`.
#[must_use]
pub fn extent_key(ino: Ino, object: u32, block: u64) -> Key {
    Key::new(ino.0, KeyKind::Extent, u64::from(object), block)
}

/// The value of an extent item.
#[must_use]
pub fn encode_extent(e: &Extent) -> Vec<u8> {
    let mut v = Enc::new();
    v.u64(e.len);
    v.u64(e.phys);
    v.u8(e.state.code());
    v.u32(e.target.0);
    v.buf
}

/// Decodes an extent item.
///
/// # Errors
/// `Corrupted` naming the key: wrong length, zero length, unknown state, an
/// object run past `u64::MAX` or a physical run past every target's end
/// ([`crate::units::phys_run_fits`]; past *its* target's end is `check`'s, which knows
/// the geometry).
pub fn decode_extent(key: &Key, value: &[u8]) -> Result<Extent, CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let e = Extent {
        len: d.u64()?,
        phys: d.u64()?,
        state: {
            let c = d.u8()?;
            ExtentState::from_code(c).ok_or_else(|| d.err(format!("extent state {c}")))?
        },
        target: TargetId(d.u32()?),
    };
    if d.remaining() != 0
        || e.len == 0
        || key.b.checked_add(e.len).is_none()
        || !phys_run_fits(e.phys, e.len)
    {
        return Err(d.err(format!("extent {e:?} in a {}-byte value", value.len())));
    }
    Ok(e)
}

/// The item of a free run of `len` blocks from `start` on `target`.
#[must_use]
pub fn free_space_item(target: TargetId, start: u64, len: u64) -> (Key, Vec<u8>) {
    let key = Key::new(u64::from(target.0), KeyKind::FreeSpace, start, 0);
    (key, len.to_le_bytes().to_vec())
}

/// Decodes a free-space item: (target, start, length).
///
/// # Errors
/// `Corrupted` naming the key: wrong length, a run empty or past every target's end
/// ([`crate::units::phys_run_fits`]).
pub fn decode_free_space(key: &Key, value: &[u8]) -> Result<(TargetId, u64, u64), CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let len = d.u64()?;
    let target = u32::try_from(key.object).map_err(|_| d.err("target out of range"))?;
    if d.remaining() != 0 || !phys_run_fits(key.a, len) || key.b != 0 {
        return Err(d.err(format!("free run of {len} blocks at {}", key.a)));
    }
    Ok((TargetId(target), key.a, len))
}

/// The key of `target`'s state item.
#[must_use]
pub fn target_state_key(target: TargetId) -> Key {
    Key::new(u64::from(target.0), KeyKind::TargetState, 0, 0)
}

/// A target-state item: `(target, TargetState, 0, 0)` -> the state as a
/// `Record::TargetState` body encodes it. Only non-writable states have items.
#[must_use]
pub fn target_state_item(target: TargetId, state: TargetState) -> (Key, Vec<u8>) {
    let mut v = Enc::new();
    state.encode(&mut v);
    (target_state_key(target), v.buf)
}

/// Decodes a target-state item: (target, state).
///
/// # Errors
/// `Corrupted` naming the key: a state that does not decode, trailing bytes, a writable
/// state (which has no item), or a key with non-zero fields.
pub fn decode_target_state(key: &Key, value: &[u8]) -> Result<(TargetId, TargetState), CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let state = TargetState::decode(&mut d)?;
    let target = u32::try_from(key.object).map_err(|_| d.err("target out of range"))?;
    if d.remaining() != 0 || key.a != 0 || key.b != 0 || state == TargetState::Writable {
        return Err(d.err(format!("target state {state} of target {target}")));
    }
    Ok((TargetId(target), state))
}

/// The key of `target`'s member-id item.
#[must_use]
pub fn target_member_key(target: TargetId) -> Key {
    Key::new(u64::from(target.0), KeyKind::TargetMember, 0, 0)
}

/// Decodes a member-id item: (target, id), the id not zero.
///
/// # Errors
/// `Corrupted` naming the key: a value that is not one non-zero u64, or a key with
/// non-zero fields.
pub fn decode_target_member(key: &Key, value: &[u8]) -> Result<(TargetId, u64), CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let id = d.u64()?;
    let target = u32::try_from(key.object).map_err(|_| d.err("target out of range"))?;
    if d.remaining() != 0 || key.a != 0 || key.b != 0 || id == 0 {
        return Err(d.err(format!("member id {id:#x} of target {target}")));
    }
    Ok((TargetId(target), id))
}

/// The key of the reference-count item of `target`'s shared range at `start`.
#[must_use]
pub fn refcount_key(target: TargetId, start: u64) -> Key {
    Key::new(u64::from(target.0), KeyKind::Refcount, start, 0)
}

/// A reference-count item: `(target, Refcount, first block, 0)` -> length u64, count u32.
#[must_use]
pub fn refcount_item(target: TargetId, start: u64, e: Shared) -> (Key, Vec<u8>) {
    let mut v = Enc::new();
    v.u64(e.len);
    v.u32(e.count);
    (refcount_key(target, start), v.buf)
}

/// Decodes a reference-count item: (target, first block, range).
///
/// # Errors
/// `Corrupted` naming the key: wrong length, a range empty or past every target's end
/// ([`crate::units::phys_run_fits`]), a count below 2.
pub fn decode_refcount(key: &Key, value: &[u8]) -> Result<(TargetId, u64, Shared), CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let len = d.u64()?;
    let count = d.u32()?;
    let target = u32::try_from(key.object).map_err(|_| d.err("target out of range"))?;
    if d.remaining() != 0 || !phys_run_fits(key.a, len) || key.b != 0 || count < 2 {
        return Err(d.err(format!(
            "shared range of {len} blocks at {} with count {count}",
            key.a
        )));
    }
    Ok((TargetId(target), key.a, Shared { len, count }))
}

/// The key of the checksum item of `target`'s run starting at physical block `start`.
#[must_use]
pub fn csum_key(target: TargetId, start: u64) -> Key {
    Key::new(u64::from(target.0), KeyKind::DataCsum, start, 0)
}

/// A checksum item: `(target, DataCsum, first block, 0)` -> crc32c u32 per block of the
/// run (1 to [`crate::csum::CSUM_RUN_MAX`] blocks).
#[must_use]
pub fn csum_item(target: TargetId, start: u64, csums: &[crate::csum::BlockCsum]) -> (Key, Vec<u8>) {
    let mut v = Enc::new();
    for c in csums {
        v.u32(c.0);
    }
    (csum_key(target, start), v.buf)
}

/// Decodes a checksum item: (target, first block, checksums).
///
/// # Errors
/// `Corrupted` naming the key: an empty run, a length not a multiple of 4, more than
/// `CSUM_RUN_MAX` blocks, a run past every target's end ([`crate::units::phys_run_fits`]).
pub fn decode_csum(
    key: &Key,
    value: &[u8],
) -> Result<(TargetId, u64, Vec<crate::csum::BlockCsum>), CoreError> {
    let w = what(key);
    let mut d = Dec::shown(value, &w);
    let n = value.len() / 4;
    let target = u32::try_from(key.object).map_err(|_| d.err("target out of range"))?;
    if value.is_empty()
        || !value.len().is_multiple_of(4)
        || n > crate::csum::CSUM_RUN_MAX
        || key.b != 0
        || !phys_run_fits(key.a, n as u64)
    {
        return Err(d.err(format!(
            "checksum run of {} bytes at block {}",
            value.len(),
            key.a
        )));
    }
    let csums = (0..n)
        .map(|_| d.u32().map(crate::csum::BlockCsum))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((TargetId(target), key.a, csums))
}

/// The items of a symlink target: chunks of at most [`VALUE_MAX`] bytes.
#[must_use]
pub fn symlink_items(ino: Ino, target: &[u8]) -> Vec<(Key, Vec<u8>)> {
    debug_assert!(!target.is_empty() && target.len() <= SYMLINK_MAX);
    target
        .chunks(VALUE_MAX)
        .enumerate()
        .map(|(i, c)| (Key::new(ino.0, KeyKind::Symlink, i as u64, 0), c.to_vec()))
        .collect()
}

/// Reassembles a symlink target from its items (in key order).
///
/// # Errors
/// `Corrupted` when chunks are missing, out of place, or the target is too long.
pub fn assemble_symlink(ino: Ino, items: &[(Key, Vec<u8>)]) -> Result<Vec<u8>, CoreError> {
    let bad = |d: String| CoreError::corrupted(format!("symlink target of inode {ino}"), d);
    let mut out = Vec::new();
    for (i, (k, v)) in items.iter().enumerate() {
        let last = i + 1 == items.len();
        let want = Key::new(ino.0, KeyKind::Symlink, i as u64, 0);
        if *k != want || v.is_empty() || (!last && v.len() != VALUE_MAX) {
            return Err(bad(format!(
                "chunk {k} of {} bytes where {want} belongs",
                v.len()
            )));
        }
        out.extend_from_slice(v);
    }
    if out.is_empty() || out.len() > SYMLINK_MAX {
        return Err(bad(format!("{} bytes", out.len())));
    }
    Ok(out)
}

/// The items of xattr `name` = `value` under (hash, collision): chunk 0 holds the name
/// length, the name, the value length and the first bytes; the next chunks the rest.
#[must_use]
pub fn xattr_items(
    ino: Ino,
    hash: u64,
    collision: u64,
    name: &[u8],
    value: &[u8],
) -> Vec<(Key, Vec<u8>)> {
    debug_assert!(!name.is_empty() && name.len() <= XATTR_NAME_MAX);
    debug_assert!(value.len() <= XATTR_VALUE_MAX && collision <= COLLISIONS_MAX);
    let key = |chunk: u64| Key::new(ino.0, KeyKind::Xattr, hash, collision << 16 | chunk);
    let mut head = Enc::new();
    head.u8(name.len() as u8);
    head.bytes(name);
    head.u32(value.len() as u32);
    let first = value.len().min(VALUE_MAX - head.len());
    head.bytes(&value[..first]);
    let mut out = vec![(key(0), head.buf)];
    for (i, c) in value[first..].chunks(VALUE_MAX).enumerate() {
        out.push((key(i as u64 + 1), c.to_vec()));
    }
    out
}

/// Decodes the items of one xattr (chunk 0 first, in key order): its name and value.
///
/// # Errors
/// `Corrupted` naming the first item when chunks are missing, extra or inconsistent.
pub fn decode_xattr(items: &[(Key, Vec<u8>)]) -> Result<(Vec<u8>, Vec<u8>), CoreError> {
    let Some((k0, v0)) = items.first() else {
        return Err(CoreError::corrupted("xattr items", "none"));
    };
    let w = what(k0);
    let mut d = Dec::shown(v0, &w);
    let nlen = usize::from(d.u8()?);
    if nlen == 0 || nlen > XATTR_NAME_MAX || k0.b & 0xFFFF != 0 {
        return Err(d.err(format!("name of {nlen} bytes, chunk {}", k0.b & 0xFFFF)));
    }
    let name = d.bytes(nlen)?.to_vec();
    let vlen = d.u32()? as usize;
    if vlen > XATTR_VALUE_MAX {
        return Err(d.err(format!("value of {vlen} bytes")));
    }
    let mut value = d.bytes(d.remaining())?.to_vec();
    for (i, (k, v)) in items.iter().enumerate().skip(1) {
        let want = Key {
            b: k0.b | i as u64,
            ..*k0
        };
        if *k != want || v.is_empty() || v.len() > VALUE_MAX {
            return Err(d.err(format!("chunk {k} where {want} belongs")));
        }
        value.extend_from_slice(v);
    }
    if value.len() != vlen {
        return Err(d.err(format!(
            "value of {} bytes, header says {vlen}",
            value.len()
        )));
    }
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btree::key::name_hash;
    use crate::Uuid;

    #[test]
    fn dir_entry_roundtrip_and_damage() {
        let e = DirEntryItem {
            ino: Ino(77),
            kind: FileKind::Symlink,
            cookie: 12,
            name: b"hello".to_vec(),
        };
        let h = name_hash(Uuid([1; 16]), &e.name);
        let [(k1, v1), (k2, v2)] = dir_entry_items(Ino(5), h, 3, &e);
        assert_eq!(k1, Key::new(5, KeyKind::DirEntry, h, 3));
        assert_eq!(decode_dir_entry(&k1, &v1).unwrap(), e);
        assert_eq!(decode_dir_cookie(&k2, &v2).unwrap(), (e.clone(), h, 3));
        let mut bad = v1.clone();
        bad[8] = 99;
        let msg = decode_dir_entry(&k1, &bad).unwrap_err().to_string();
        assert!(
            msg.contains("file kind 99") && msg.contains(&k1.to_string()),
            "{msg}"
        );
        assert!(decode_dir_entry(&k1, &v1[..17]).is_err(), "empty name");
        assert!(decode_dir_cookie(&k2, &v2[..10]).is_err(), "truncated");
    }

    #[test]
    fn collisions_take_the_lowest_free_index() {
        assert_eq!(free_collision([]).unwrap(), 0);
        assert_eq!(free_collision([0, 1, 3]).unwrap(), 2);
        assert_eq!(free_collision([1, 2]).unwrap(), 0);
        assert!(matches!(
            free_collision(0..=COLLISIONS_MAX),
            Err(CoreError::Limit(_))
        ));
    }

    #[test]
    fn extent_and_free_space_roundtrip_and_damage() {
        let e = Extent {
            len: 9,
            phys: 1000,
            state: ExtentState::Written,
            target: TargetId(0),
        };
        let k = extent_key(Ino(4), 2, 50);
        assert_eq!(decode_extent(&k, &encode_extent(&e)).unwrap(), e);
        let mut bad = encode_extent(&e);
        bad[16] = 7;
        assert!(decode_extent(&k, &bad).is_err(), "unknown state");
        let zero = encode_extent(&Extent { len: 0, ..e });
        assert!(decode_extent(&k, &zero).is_err(), "empty extent");
        let (fk, fv) = free_space_item(TargetId(3), 100, 20);
        assert_eq!(decode_free_space(&fk, &fv).unwrap(), (TargetId(3), 100, 20));
        assert!(decode_free_space(&fk, &0u64.to_le_bytes()).is_err());
        assert!(decode_free_space(&fk, &fv[..4]).is_err());
        let sh = Shared { len: 5, count: 3 };
        let (rk, rv) = refcount_item(TargetId(1), 70, sh);
        assert_eq!(decode_refcount(&rk, &rv).unwrap(), (TargetId(1), 70, sh));
        let (_, one) = refcount_item(TargetId(1), 70, Shared { len: 5, count: 1 });
        assert!(
            decode_refcount(&rk, &one).is_err(),
            "count 1 is not an entry"
        );
        assert!(decode_refcount(&rk, &rv[..8]).is_err());
    }

    #[test]
    fn symlink_and_xattr_chunks_roundtrip_at_their_limits() {
        for len in [1, VALUE_MAX, VALUE_MAX + 1, SYMLINK_MAX] {
            let t: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let items = symlink_items(Ino(9), &t);
            assert!(items.iter().all(|(_, v)| v.len() <= VALUE_MAX));
            assert_eq!(assemble_symlink(Ino(9), &items).unwrap(), t);
            if items.len() > 1 {
                assert!(
                    assemble_symlink(Ino(9), &items[1..]).is_err(),
                    "missing chunk"
                );
            }
        }
        for (nlen, vlen) in [(1, 0), (255, 700), (10, VALUE_MAX), (255, XATTR_VALUE_MAX)] {
            let name = vec![b'n'; nlen];
            let value: Vec<u8> = (0..vlen).map(|i| i as u8).collect();
            let items = xattr_items(Ino(2), 0xabc, 5, &name, &value);
            assert!(items.iter().all(|(_, v)| v.len() <= VALUE_MAX));
            assert!(items.windows(2).all(|w| w[0].0 < w[1].0));
            assert_eq!(decode_xattr(&items).unwrap(), (name, value));
            if items.len() > 1 {
                let short = &items[..items.len() - 1];
                assert!(decode_xattr(short).is_err(), "missing last chunk");
            }
        }
    }

    #[test]
    fn inode_and_counter_roundtrip_and_damage() {
        let a = InodeAttrs {
            ino: Ino(42),
            kind: FileKind::Directory,
            perm: 0o755,
            uid: 1,
            gid: 2,
            nlink: 3,
            size: 4,
            atime: crate::inode::Timespec { sec: 5, nsec: 6 },
            mtime: crate::inode::Timespec { sec: 7, nsec: 8 },
            ctime: crate::inode::Timespec { sec: 9, nsec: 10 },
            crtime: crate::inode::Timespec { sec: 11, nsec: 12 },
            rdev: 0,
            parent: Ino(1),
            layout: crate::layout::StripeLayout {
                count: 0,
                unit_bytes: 0,
                first_target: 0,
            },
            flags: 0,
        };
        let k = inode_key(Ino(42));
        let v = encode_inode(&a);
        assert!(v.len() <= VALUE_MAX);
        assert_eq!(decode_inode(&k, &v).unwrap(), a);
        let msg = decode_inode(&inode_key(Ino(43)), &v)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("(43, Inode, 0, 0)"), "{msg}");
        let mut bad = v.clone();
        bad[0] = 2;
        let msg = decode_inode(&k, &bad).unwrap_err().to_string();
        assert!(msg.contains("version 2"), "{msg}");
        assert!(decode_inode(&k, &v[..v.len() - 1]).is_err(), "truncated");
        let mut long = v.clone();
        long.push(0);
        assert!(decode_inode(&k, &long).is_err(), "trailing byte");
        for i in 0..v.len() {
            for b in [0, 1, 0x7f, 0xff] {
                let mut m = v.clone();
                m[i] = b;
                let _ = decode_inode(&k, &m); // never panics
            }
        }
        let c = counter_key();
        let n = Counter {
            next_ino: 77,
            inodes: 70,
        };
        assert_eq!(decode_counter(&c, &encode_counter(n)).unwrap(), n);
        let zero = Counter {
            next_ino: 0,
            inodes: 0,
        };
        assert!(decode_counter(&c, &encode_counter(zero)).is_err());
        let more = Counter {
            next_ino: 5,
            inodes: 5,
        };
        assert!(decode_counter(&c, &encode_counter(more)).is_err());
        assert!(decode_counter(&c, &[1, 2, 3]).is_err());
        assert!(decode_counter(&c, &77u64.to_le_bytes()).is_err());
    }

    /// Arbitrary values never panic a decoder.
    #[test]
    fn decoders_fuzz_never_panic() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let k = Key::new(1, KeyKind::DirEntry, 2, 3);
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 64) as usize;
            let v: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            let _ = decode_dir_entry(&k, &v);
            let _ = decode_dir_cookie(&k, &v);
            let _ = decode_extent(&k, &v);
            let _ = decode_free_space(&k, &v);
            let _ = decode_inode(&k, &v);
            let _ = decode_counter(&k, &v);
            let _ = decode_xattr(&[(Key { b: x & 3, ..k }, v.clone())]);
            let _ = assemble_symlink(Ino(1), &[(Key::new(1, KeyKind::Symlink, 0, 0), v)]);
        }
    }
}

//! The ordered keyspace of the metadata trees (format version 2).
//!
//! A key is 25 bytes, `object u64 | kind u8 | a u64 | b u64`, every field big-endian, so
//! that comparing the bytes (what a page, a range scan or a distributed store does)
//! is comparing the tuple. `object` groups everything about one inode (or one target, for
//! the space kinds) together; `kind` says what the item is; `a` and `b` order items of one
//! kind. The full schema, with the value layouts and the mapping to a transactional
//! key-value store, is in `docs/design/format.md` ("Metadata keyspace").

use std::fmt;

use crate::Uuid;

/// Bytes of an encoded key.
pub const KEY_BYTES: usize = 25;

/// Largest value an item may carry, for every page size. A value that can be longer
/// (a symlink target, an xattr value) is split into chunks of at most this size, each its
/// own item (see [`KeyKind::Symlink`] and [`KeyKind::Xattr`]). Chosen so that an item
/// (key, length, value) takes at most a quarter of a 4 KiB page's body: a leaf that
/// overflows by one item always splits into two halves that fit.
pub const VALUE_MAX: usize = 960;

/// Largest collision index of one name hash in a directory or an xattr set: a 65,537th
/// name with the same 64-bit hash is refused (`CoreError::Limit`).
pub const COLLISIONS_MAX: u64 = 0xFFFF;

/// What an item is. Each kind lives in exactly one tree ([`KeyKind::tree`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum KeyKind {
    /// `(ino, Inode, 0, 0)`: the inode's attributes.
    Inode = 0x01,
    /// `(ino, Symlink, chunk, 0)`: the symlink target, in chunks of at most [`VALUE_MAX`].
    Symlink = 0x02,
    /// `(ino, Orphan, 0, 0)`: an inode with link count 0 still open, freed at mount.
    Orphan = 0x03,
    /// `(dir, DirEntry, name hash, collision)`: ino, file kind, readdir cookie, name.
    DirEntry = 0x10,
    /// `(dir, DirCookie, cookie, 0)`: name hash, collision, ino, file kind, name; readdir
    /// walks these in cookie order, so it resumes stably across concurrent changes.
    DirCookie = 0x11,
    /// `(ino, Xattr, name hash, collision << 16 | chunk)`: chunk 0 holds the name, the
    /// value's length and its first bytes; chunk k the next bytes.
    Xattr = 0x20,
    /// `(ino, Extent, stripe object index, object block)`: length, physical block, state,
    /// reference count: one extent of the extent map of that stripe object.
    Extent = 0x30,
    /// `(target, FreeSpace, first block, 0)`: length of a free run in the data area.
    FreeSpace = 0x40,
    /// `(target, TargetState, 0, 0)`: the target's state when it is not writable
    /// (read-only or retired: `record::TargetState`); a writable target has no item.
    TargetState = 0x41,
    /// `(target, TargetMember, 0, 0)`: the member id of a target `add-target` joined (the
    /// one in its superblock); targets mkfs made have none.
    TargetMember = 0x42,
    /// Reserved (next issue): `(target, Refcount, physical block, 0)`: length and owner
    /// count of a shared physical extent.
    Refcount = 0x50,
    /// Reserved (next issue): `(target, DataCsum, physical block, 0)`: crc32c of each
    /// data block of a run starting there.
    DataCsum = 0x60,
}

impl KeyKind {
    /// Every kind, in key order.
    pub const ALL: [KeyKind; 12] = [
        KeyKind::Inode,
        KeyKind::Symlink,
        KeyKind::Orphan,
        KeyKind::DirEntry,
        KeyKind::DirCookie,
        KeyKind::Xattr,
        KeyKind::Extent,
        KeyKind::FreeSpace,
        KeyKind::TargetState,
        KeyKind::TargetMember,
        KeyKind::Refcount,
        KeyKind::DataCsum,
    ];

    /// The kind with on-disk code `code`, if any.
    #[must_use]
    pub fn from_code(code: u8) -> Option<KeyKind> {
        Self::ALL.into_iter().find(|k| *k as u8 == code)
    }

    /// The tree that holds items of this kind.
    #[must_use]
    pub fn tree(self) -> TreeId {
        match self {
            KeyKind::Inode
            | KeyKind::Symlink
            | KeyKind::Orphan
            | KeyKind::DirEntry
            | KeyKind::DirCookie
            | KeyKind::Xattr
            | KeyKind::Extent => TreeId::Fs,
            KeyKind::FreeSpace | KeyKind::TargetState | KeyKind::TargetMember => TreeId::Space,
            KeyKind::Refcount => TreeId::Refcount,
            KeyKind::DataCsum => TreeId::Csum,
        }
    }
}

/// Which tree a page belongs to (stamped into every page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum TreeId {
    /// Inodes, symlinks, orphans, directories, xattrs, extent maps.
    Fs = 1,
    /// Free space per target.
    Space = 2,
    /// Reserved: reference counts by physical extent.
    Refcount = 3,
    /// Reserved: per-block data checksums.
    Csum = 4,
}

impl TreeId {
    /// Every tree, in code order.
    pub const ALL: [TreeId; 4] = [TreeId::Fs, TreeId::Space, TreeId::Refcount, TreeId::Csum];

    /// The tree with on-disk code `code`, if any.
    #[must_use]
    pub fn from_code(code: u8) -> Option<TreeId> {
        Self::ALL.into_iter().find(|t| *t as u8 == code)
    }

    /// Lower-case name used in messages.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            TreeId::Fs => "fs",
            TreeId::Space => "space",
            TreeId::Refcount => "refcount",
            TreeId::Csum => "csum",
        }
    }

    /// Whether `kind` belongs in this tree.
    #[must_use]
    pub fn holds(self, kind: u8) -> bool {
        KeyKind::from_code(kind).is_some_and(|k| k.tree() == self)
    }
}

impl fmt::Display for TreeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A key of the metadata keyspace. The derived order (object, kind, a, b) is the order
/// of the encoded bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub object: u64,
    /// A [`KeyKind`] code; kept as the raw byte so that a decoded page can be checked
    /// against its tree rather than refused while parsing.
    pub kind: u8,
    pub a: u64,
    pub b: u64,
}

impl Key {
    /// The smallest key.
    pub const MIN: Key = Key {
        object: 0,
        kind: 0,
        a: 0,
        b: 0,
    };

    /// The largest key.
    pub const MAX: Key = Key {
        object: u64::MAX,
        kind: u8::MAX,
        a: u64::MAX,
        b: u64::MAX,
    };

    /// A key of kind `kind`.
    #[must_use]
    pub fn new(object: u64, kind: KeyKind, a: u64, b: u64) -> Key {
        Key {
            object,
            kind: kind as u8,
            a,
            b,
        }
    }

    /// The 25 big-endian bytes.
    #[must_use]
    pub fn to_bytes(self) -> [u8; KEY_BYTES] {
        let mut out = [0u8; KEY_BYTES];
        out[0..8].copy_from_slice(&self.object.to_be_bytes());
        out[8] = self.kind;
        out[9..17].copy_from_slice(&self.a.to_be_bytes());
        out[17..25].copy_from_slice(&self.b.to_be_bytes());
        out
    }

    /// Decodes 25 big-endian bytes.
    #[must_use]
    pub fn from_bytes(b: &[u8; KEY_BYTES]) -> Key {
        let u = |r: std::ops::Range<usize>| u64::from_be_bytes(b[r].try_into().expect("8 bytes"));
        Key {
            object: u(0..8),
            kind: b[8],
            a: u(9..17),
            b: u(17..25),
        }
    }

    /// The next key in order, or `None` for [`Key::MAX`].
    #[must_use]
    pub fn successor(self) -> Option<Key> {
        let n = u128::from(self.a) << 64 | u128::from(self.b);
        if let Some(n) = n.checked_add(1) {
            return Some(Key {
                a: (n >> 64) as u64,
                b: n as u64,
                ..self
            });
        }
        let ok = u16::from(self.kind) + 1;
        if let Ok(kind) = u8::try_from(ok) {
            return Some(Key {
                object: self.object,
                kind,
                a: 0,
                b: 0,
            });
        }
        self.object
            .checked_add(1)
            .map(|object| Key { object, ..Key::MIN })
    }

    /// The previous key in order, or `None` for [`Key::MIN`].
    #[must_use]
    pub fn predecessor(self) -> Option<Key> {
        let n = u128::from(self.a) << 64 | u128::from(self.b);
        if let Some(n) = n.checked_sub(1) {
            return Some(Key {
                a: (n >> 64) as u64,
                b: n as u64,
                ..self
            });
        }
        if let Some(kind) = self.kind.checked_sub(1) {
            return Some(Key { kind, ..Key::MAX }.with_object(self.object));
        }
        self.object
            .checked_sub(1)
            .map(|object| Key { object, ..Key::MAX })
    }

    fn with_object(self, object: u64) -> Key {
        Key { object, ..self }
    }

    /// The first key of the range `[object, kind, a, *]`.
    #[must_use]
    pub fn first_of(object: u64, kind: KeyKind, a: u64) -> Key {
        Key::new(object, kind, a, 0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = KeyKind::from_code(self.kind)
            .map_or_else(|| format!("kind {:#04x}", self.kind), |k| format!("{k:?}"));
        write!(f, "({}, {kind}, {}, {})", self.object, self.a, self.b)
    }
}

/// The 64-bit hash that orders directory entries and xattr names (the `a` of
/// [`KeyKind::DirEntry`] and [`KeyKind::Xattr`]): FNV-1a over the first 8 bytes of the
/// file system's uuid followed by the name, then the MurmurHash3 64-bit finaliser.
/// Collisions are resolved by the collision index `b`; the seed makes names that collide
/// on one file system unlikely to collide on another.
#[must_use]
pub fn name_hash(uuid: Uuid, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in uuid.0[..8].iter().chain(name) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_is_key_order() {
        let keys = [
            Key::new(1, KeyKind::Inode, 0, 0),
            Key::new(1, KeyKind::DirEntry, 5, u64::MAX),
            Key::new(1, KeyKind::DirEntry, 6, 0),
            Key::new(1, KeyKind::Extent, 0, 1 << 40),
            Key::new(1, KeyKind::Extent, 1, 0),
            Key::new(2, KeyKind::Inode, 0, 0),
            Key::new(u64::MAX, KeyKind::DataCsum, 0, 0),
        ];
        for w in keys.windows(2) {
            assert!(w[0] < w[1]);
            assert!(w[0].to_bytes() < w[1].to_bytes(), "{} vs {}", w[0], w[1]);
        }
        for k in keys {
            assert_eq!(Key::from_bytes(&k.to_bytes()), k);
        }
    }

    #[test]
    fn successor_is_the_next_key() {
        let k = Key::new(4, KeyKind::Extent, 2, 9);
        assert_eq!(k.successor(), Some(Key::new(4, KeyKind::Extent, 2, 10)));
        let k = Key::new(4, KeyKind::Extent, 2, u64::MAX);
        assert_eq!(k.successor(), Some(Key::new(4, KeyKind::Extent, 3, 0)));
        let k = Key::new(4, KeyKind::Extent, u64::MAX, u64::MAX);
        assert_eq!(k.successor().unwrap().kind, KeyKind::Extent as u8 + 1);
        let k = Key {
            kind: u8::MAX,
            ..Key::new(4, KeyKind::Extent, u64::MAX, u64::MAX)
        };
        assert_eq!(
            k.successor(),
            Some(Key {
                object: 5,
                ..Key::MIN
            })
        );
        assert_eq!(Key::MAX.successor(), None);
        for k in [
            Key::new(4, KeyKind::Extent, 2, 9),
            Key::new(4, KeyKind::Extent, 3, 0),
            Key::new(4, KeyKind::Extent, 0, 0),
            Key {
                object: 5,
                ..Key::MIN
            },
            Key::MAX,
        ] {
            assert_eq!(k.predecessor().unwrap().successor(), Some(k), "{k}");
        }
        assert_eq!(Key::MIN.predecessor(), None);
    }

    #[test]
    fn every_kind_has_one_tree_and_codes_roundtrip() {
        for k in KeyKind::ALL {
            assert_eq!(KeyKind::from_code(k as u8), Some(k));
            assert!(k.tree().holds(k as u8));
            let others = TreeId::ALL.iter().filter(|t| t.holds(k as u8)).count();
            assert_eq!(others, 1, "{k:?}");
        }
        assert_eq!(KeyKind::from_code(0x99), None);
        for t in TreeId::ALL {
            assert_eq!(TreeId::from_code(t as u8), Some(t));
        }
    }

    #[test]
    fn name_hash_is_stable_and_seeded() {
        let u = Uuid([7; 16]);
        // Pinned values: the hash is part of the format.
        assert_eq!(name_hash(u, b"a"), name_hash(u, b"a"));
        assert_ne!(name_hash(u, b"a"), name_hash(u, b"b"));
        assert_ne!(name_hash(u, b"a"), name_hash(Uuid([8; 16]), b"a"));
        assert_eq!(name_hash(Uuid([0; 16]), b""), PINNED_EMPTY);
    }

    const PINNED_EMPTY: u64 = 8_922_497_616_986_557_598;
}

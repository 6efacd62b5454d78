//! POSIX access control lists, as Linux stores them in the extended attributes
//! `system.posix_acl_access` and `system.posix_acl_default` (little-endian: a 4-byte
//! version 2, then 8-byte entries of tag, permission and id, sorted by tag then id).
//!
//! The engine keeps an inode's ACL and its mode consistent, as a kernel file system does:
//! setting an access ACL sets the permission bits it implies (and an ACL that says no more
//! than the mode is not stored); `chmod` rewrites the owner, mask (or group) and other
//! entries; a new inode in a directory with a default ACL inherits it, masked by the
//! creation mode, instead of having the umask applied. Checking access against an ACL is
//! the kernel's work (`FUSE_POSIX_ACL`, `docs/design/fuse.md`).

use crate::error::{FsError, Result};

/// The access ACL's attribute name.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's attribute name (directories only).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const ENTRY_BYTES: usize = 8;
const UNDEFINED_ID: u32 = u32::MAX;

/// Entry tags, in the order a valid ACL lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tag {
    UserObj = 0x01,
    User = 0x02,
    GroupObj = 0x04,
    Group = 0x08,
    Mask = 0x10,
    Other = 0x20,
}

impl Tag {
    fn from_raw(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn named(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    tag: Tag,
    /// `rwx` as 4, 2, 1.
    perm: u16,
    /// User or group id for named entries; undefined otherwise.
    id: u32,
}

/// A valid POSIX ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(Vec<Entry>);

impl Acl {
    /// Parses and validates an ACL attribute value.
    ///
    /// # Errors
    /// `Invalid` naming what is wrong: bad size or version, an unknown tag or permission,
    /// entries out of order or repeated, a missing owner, group or other entry, or named
    /// entries without a mask.
    pub fn parse(v: &[u8]) -> Result<Self> {
        let bad = |why: &str| FsError::invalid(format!("invalid POSIX ACL: {why}"));
        let (head, body) = v.split_at_checked(4).ok_or_else(|| bad("too short"))?;
        if u32::from_le_bytes(head.try_into().unwrap_or_default()) != VERSION {
            return Err(bad("not version 2"));
        }
        if body.is_empty() || body.len() % ENTRY_BYTES != 0 {
            return Err(bad("size is not a whole number of entries"));
        }
        let mut entries = Vec::with_capacity(body.len() / ENTRY_BYTES);
        for e in body.chunks_exact(ENTRY_BYTES) {
            let tag = Tag::from_raw(u16::from_le_bytes([e[0], e[1]]))
                .ok_or_else(|| bad("unknown entry tag"))?;
            let perm = u16::from_le_bytes([e[2], e[3]]);
            if perm & !7 != 0 {
                return Err(bad("permission other than rwx"));
            }
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let id = if tag.named() { id } else { UNDEFINED_ID };
            entries.push(Entry { tag, perm, id });
        }
        let acl = Self(entries);
        acl.validate().map_err(bad)?;
        Ok(acl)
    }

    fn validate(&self) -> std::result::Result<(), &'static str> {
        let sorted = self
            .0
            .windows(2)
            .all(|w| (w[0].tag, w[0].id) < (w[1].tag, w[1].id));
        if !sorted {
            return Err("entries out of order or repeated");
        }
        for required in [Tag::UserObj, Tag::GroupObj, Tag::Other] {
            if !self.0.iter().any(|e| e.tag == required) {
                return Err("owner, group or other entry missing");
            }
        }
        if self.0.iter().any(|e| e.tag.named()) && self.find(Tag::Mask).is_none() {
            return Err("named entries without a mask");
        }
        Ok(())
    }

    /// The attribute value.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            v.extend_from_slice(&(e.tag as u16).to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    fn find(&self, tag: Tag) -> Option<usize> {
        self.0.iter().position(|e| e.tag == tag)
    }

    fn perm_of(&self, tag: Tag) -> u16 {
        self.find(tag).map_or(0, |i| self.0[i].perm)
    }

    /// The entry the mode's group bits stand for: the mask if there is one.
    fn group_class(&self) -> Tag {
        if self.find(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        }
    }

    /// The permission bits (`0o777` part of the mode) the ACL implies.
    #[must_use]
    pub fn mode(&self) -> u16 {
        (self.perm_of(Tag::UserObj) << 6)
            | (self.perm_of(self.group_class()) << 3)
            | self.perm_of(Tag::Other)
    }

    /// Whether the ACL says no more than the permission bits (owner, group and other
    /// only), so that it need not be stored.
    #[must_use]
    pub fn is_minimal(&self) -> bool {
        self.0.len() == 3
    }

    fn set(&mut self, tag: Tag, perm: u16) {
        if let Some(i) = self.find(tag) {
            self.0[i].perm = perm & 7;
        }
    }

    /// `chmod`: the owner, group class and other entries take `perm`'s bits.
    pub fn chmod(&mut self, perm: u16) {
        self.set(Tag::UserObj, perm >> 6);
        self.set(self.group_class(), perm >> 3);
        self.set(Tag::Other, perm);
    }

    /// Turns a directory's default ACL into the access ACL of a new inode created with
    /// permission bits `perm` (no umask: the default ACL replaces it): the owner, group
    /// class and other entries keep only what `perm` allows. Returns the new inode's
    /// permission bits (`perm`'s special bits kept).
    pub fn inherit(&mut self, perm: u16) -> u16 {
        for (tag, shift) in [(Tag::UserObj, 6), (self.group_class(), 3), (Tag::Other, 0)] {
            let masked = self.perm_of(tag) & (perm >> shift);
            self.set(tag, masked);
        }
        (perm & !0o777) | self.mode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(t, p, id) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    const U: u32 = UNDEFINED_ID;

    #[test]
    fn mode_chmod_and_inheritance() {
        // user::rw- user:65534:rw- group::r-- mask::rw- other::---
        let v = acl(&[
            (1, 6, U),
            (2, 6, 65534),
            (4, 4, U),
            (0x10, 6, U),
            (0x20, 0, U),
        ]);
        let mut a = Acl::parse(&v).unwrap();
        assert_eq!(a.encode(), v);
        assert_eq!(a.mode(), 0o660, "the mask stands for the group bits");
        assert!(!a.is_minimal());
        a.chmod(0o604);
        assert_eq!(a.mode(), 0o604);
        assert_eq!(
            a.perm_of(Tag::GroupObj),
            4,
            "chmod changes the mask, not group::"
        );
        assert_eq!(a.perm_of(Tag::User), 6, "named entries are untouched");

        let mut d = Acl::parse(&v).unwrap();
        assert_eq!(d.inherit(0o2644), 0o2640);
        assert_eq!(d.perm_of(Tag::Mask), 4);

        let minimal = Acl::parse(&acl(&[(1, 7, U), (4, 5, U), (0x20, 1, U)])).unwrap();
        assert!(minimal.is_minimal());
        assert_eq!(minimal.mode(), 0o751);
    }

    #[test]
    fn invalid_acls_are_refused() {
        let bad = [
            vec![1, 0, 0, 0],                                      // version 1, no entries
            acl(&[(1, 6, U), (4, 4, U)]),                          // no other
            acl(&[(4, 4, U), (1, 6, U), (0x20, 0, U)]),            // out of order
            acl(&[(1, 6, U), (2, 6, 5), (4, 4, U), (0x20, 0, U)]), // named, no mask
            acl(&[(1, 8, U), (4, 4, U), (0x20, 0, U)]),            // perm 8
            acl(&[(1, 6, U), (3, 4, U), (0x20, 0, U)]),            // tag 3
            acl(&[
                (1, 6, U),
                (2, 6, 5),
                (2, 6, 5),
                (4, 4, U),
                (0x10, 6, U),
                (0x20, 0, U),
            ]),
        ];
        for v in bad {
            assert!(Acl::parse(&v).is_err(), "{v:?}");
        }
        let mut short = acl(&[(1, 6, U), (4, 4, U), (0x20, 0, U)]);
        short.pop();
        assert!(Acl::parse(&short).is_err());
    }
}

//! Striping: how a file's byte range maps onto per-target objects.
//!
//! A file with stripe count `c`, stripe unit `u` and first target `f` is `c` objects. Byte
//! `off` lies in stripe unit `s = off / u`, which belongs to object `i = s % c` on target
//! `(f + i) % targets`, at object offset `(s / c) * u + off % u`. Each object has its own
//! extent map in object-block space, so consecutive stripe units of one object are
//! contiguous on their target and a sequential file stays a handful of extents.
//!
//! ```text
//! file:    | u0 | u1 | u2 | u3 | u4 | u5 |      c = 3
//! obj 0:   | u0 | u3 |        (target f)
//! obj 1:   | u1 | u4 |        (target f+1)
//! obj 2:   | u2 | u5 |        (target f+2)
//! ```

use crate::TargetId;

/// A file's striping parameters (fixed at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeLayout {
    /// Number of objects (targets) the file is striped over.
    pub count: u32,
    /// Bytes per stripe unit (a multiple of the block size).
    pub unit_bytes: u32,
    /// Target of object 0.
    pub first_target: u32,
}

/// The part of a file range that lies in one stripe unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripePiece {
    /// Object (stripe index) holding the piece.
    pub object: u32,
    /// Byte offset within the object.
    pub obj_off: u64,
    /// Bytes from the start of the piece to the end of its stripe unit or of the request.
    pub len: u64,
}

impl StripeLayout {
    /// The piece of `[off, off + len)` that starts at `off` (never crosses a stripe unit).
    ///
    /// # Panics
    /// Debug-asserts `len > 0`.
    #[must_use]
    pub fn piece(&self, off: u64, len: u64) -> StripePiece {
        debug_assert!(len > 0);
        let unit = u64::from(self.unit_bytes);
        let count = u64::from(self.count);
        let s = off / unit;
        let within = off % unit;
        StripePiece {
            object: (s % count) as u32,
            obj_off: (s / count) * unit + within,
            len: (unit - within).min(len),
        }
    }

    /// File offset of byte `obj_off` of object `object` (inverse of [`Self::piece`]).
    #[must_use]
    pub fn file_off(&self, object: u32, obj_off: u64) -> u64 {
        let unit = u64::from(self.unit_bytes);
        let row = obj_off / unit;
        (row * u64::from(self.count) + u64::from(object)) * unit + obj_off % unit
    }

    /// The target holding `object` in a file system of `targets` targets.
    #[must_use]
    pub fn target_of(&self, object: u32, targets: u32) -> TargetId {
        TargetId((self.first_target + object) % targets)
    }

    /// Bytes of object `object` needed to hold a file of `size` bytes.
    #[must_use]
    pub fn object_len(&self, object: u32, size: u64) -> u64 {
        let unit = u64::from(self.unit_bytes);
        let count = u64::from(self.count);
        let full_rows = size / (unit * count);
        let rest = size % (unit * count);
        let this = rest.saturating_sub(u64::from(object) * unit).min(unit);
        full_rows * unit + this
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_and_inverse_agree() {
        let l = StripeLayout {
            count: 3,
            unit_bytes: 8192,
            first_target: 1,
        };
        for off in (0..200_000u64).step_by(777) {
            let p = l.piece(off, 1 << 20);
            assert!(p.len > 0 && p.len <= 8192);
            assert_eq!(l.file_off(p.object, p.obj_off), off);
        }
        assert_eq!(l.target_of(2, 3), TargetId(0));
    }

    #[test]
    fn object_len_sums_to_size() {
        let l = StripeLayout {
            count: 3,
            unit_bytes: 4096,
            first_target: 0,
        };
        for size in [0u64, 1, 4095, 4096, 4097, 12288, 12289, 100_000] {
            let total: u64 = (0..3).map(|o| l.object_len(o, size)).sum();
            assert_eq!(total, size);
        }
    }
}

//! `iterate`: drive a range through mappings, enforcing the contract.
//!
//! Contract (see docs/design/iomap.md):
//! 1. `begin(pos, len)` returns a mapping that covers `pos`; it may be shorter than asked.
//! 2. The body gets `(map, pos, len)` with `len` clipped to the mapping and returns how many
//!    bytes it consumed: at least 1 and at most `len`, or an error.
//! 3. `end` is called exactly once per successful `begin`, on every exit path, with the
//!    bytes used (0 when the body failed).
//! 4. Iteration stops at the end of the range or at the first error; the result is the
//!    number of bytes processed, or the error if nothing was processed.

use crate::{Iomap, IomapOp, IomapOps};

/// Why an iteration stopped early.
#[derive(Debug)]
pub enum IterError<E> {
    /// The file system or the body failed after `done` bytes had been processed.
    Failed { done: u64, error: E },
    /// The file system broke the mapping contract (a bug, reported rather than trusted).
    Contract(String),
}

/// Walks `[pos, pos + len)` one mapping at a time, calling `body` on each piece.
///
/// # Errors
/// [`IterError::Failed`] with the bytes completed before the error, or
/// [`IterError::Contract`] when `begin` or the body violates the contract.
pub fn iterate<O, F>(
    ops: &O,
    pos: u64,
    len: u64,
    op: IomapOp,
    mut body: F,
) -> Result<u64, IterError<O::Error>>
where
    O: IomapOps + ?Sized,
    F: FnMut(&Iomap<O::Addr>, u64, u64) -> Result<u64, O::Error>,
{
    let end = pos
        .checked_add(len)
        .ok_or_else(|| IterError::Contract("range overflows".into()))?;
    let mut cur = pos;
    while cur < end {
        let map = ops
            .begin(cur, end - cur, op)
            .map_err(|error| IterError::Failed {
                done: cur - pos,
                error,
            })?;
        if !map.covers(cur) {
            let _ = ops.end(&map, cur, 0, op);
            return Err(IterError::Contract(format!(
                "mapping {}..{} does not cover {cur}",
                map.offset,
                map.end()
            )));
        }
        let piece = (map.end() - cur).min(end - cur);
        match body(&map, cur, piece) {
            Ok(used) if used >= 1 && used <= piece => {
                ops.end(&map, cur, used, op)
                    .map_err(|error| IterError::Failed {
                        done: cur + used - pos,
                        error,
                    })?;
                cur += used;
            }
            Ok(used) => {
                let _ = ops.end(&map, cur, 0, op);
                return Err(IterError::Contract(format!(
                    "body advanced {used} of a {piece}-byte piece"
                )));
            }
            Err(error) => {
                let _ = ops.end(&map, cur, 0, op);
                return Err(IterError::Failed {
                    done: cur - pos,
                    error,
                });
            }
        }
    }
    Ok(cur - pos)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::{IomapFlags, IomapKind};

    /// A mapper that returns adversarial mappings: short ones, ones starting before `pos`,
    /// boundaries every 3 bytes, and one that fails to cover `pos` when asked.
    struct Fake {
        begins: RefCell<u32>,
        ends: RefCell<Vec<(u64, u64)>>,
        uncovering_at: Option<u64>,
    }

    impl IomapOps for Fake {
        type Addr = u64;
        type Error = String;
        fn begin(&self, pos: u64, len: u64, _op: IomapOp) -> Result<Iomap<u64>, String> {
            *self.begins.borrow_mut() += 1;
            if Some(pos) == self.uncovering_at {
                return Ok(Iomap {
                    offset: pos + 1,
                    length: 5,
                    kind: IomapKind::Hole,
                    flags: IomapFlags::NONE,
                    addr: 0,
                    seq: 0,
                });
            }
            let start = pos - pos % 3;
            Ok(Iomap {
                offset: start,
                length: (3).min(pos - start + len),
                kind: IomapKind::Mapped,
                flags: IomapFlags::BOUNDARY,
                addr: start * 10,
                seq: 1,
            })
        }
        fn end(&self, _m: &Iomap<u64>, pos: u64, used: u64, _op: IomapOp) -> Result<(), String> {
            self.ends.borrow_mut().push((pos, used));
            Ok(())
        }
        fn still_valid(&self, m: &Iomap<u64>) -> bool {
            m.seq == 1
        }
    }

    fn fake(uncovering_at: Option<u64>) -> Fake {
        Fake {
            begins: RefCell::new(0),
            ends: RefCell::new(Vec::new()),
            uncovering_at,
        }
    }

    #[test]
    fn walks_short_mappings_and_ends_each() {
        let f = fake(None);
        let mut seen = Vec::new();
        let n = iterate(&f, 1, 10, IomapOp::Read, |m, pos, len| {
            assert!(m.covers(pos) && pos + len <= m.end());
            seen.push((pos, len));
            Ok(len)
        })
        .unwrap();
        assert_eq!(n, 10);
        assert_eq!(seen, vec![(1, 2), (3, 3), (6, 3), (9, 2)]);
        assert_eq!(*f.begins.borrow() as usize, f.ends.borrow().len());
    }

    #[test]
    fn partial_advance_re_maps() {
        let f = fake(None);
        let n = iterate(&f, 0, 6, IomapOp::Write, |_, _, _| Ok(1)).unwrap();
        assert_eq!(n, 6);
        assert_eq!(f.ends.borrow().len(), 6);
    }

    #[test]
    fn contract_violations_are_reported_and_end_still_runs() {
        let f = fake(Some(3));
        let e = iterate(&f, 0, 9, IomapOp::Read, |_, _, len| Ok(len)).unwrap_err();
        assert!(matches!(e, IterError::Contract(_)));
        assert_eq!(f.ends.borrow().last(), Some(&(3, 0)));
        let f = fake(None);
        let e = iterate(&f, 0, 9, IomapOp::Read, |_, _, _| Ok(0)).unwrap_err();
        assert!(
            matches!(e, IterError::Contract(_)),
            "zero advance is refused"
        );
        let f = fake(None);
        let e = iterate(&f, 0, 9, IomapOp::Read, |_, pos, len| {
            if pos >= 3 {
                Err("boom".into())
            } else {
                Ok(len)
            }
        })
        .unwrap_err();
        assert!(matches!(e, IterError::Failed { done: 3, .. }));
        assert_eq!(*f.begins.borrow() as usize, f.ends.borrow().len());
    }
}

//! `iterate`: drive a range through mappings, enforcing the contract.
//!
//! Contract (see docs/design/iomap.md):
//! 1. `begin(pos, len)` returns a mapping that covers `pos`; it may be shorter than asked.
//! 2. The body gets `(map, pos, len)` with `len` clipped to the mapping and says what it did
//!    ([`Step`]): consumed at least 1 and at most `len` bytes and goes on (a plain `u64`);
//!    consumed at most `len` bytes (0 allowed) and ends the walk; or found the mapping stale
//!    (Linux's `IOMAP_F_STALE`): nothing consumed, map the same position again. Or it fails.
//! 3. `end` is called exactly once per successful `begin`, on every exit path, with the
//!    bytes used (0 when the body failed or found the mapping stale).
//! 4. Iteration stops at the end of the range, when the body ends it, or at the first
//!    error; the result is the number of bytes processed, or the error.
//!
//! This is the only way the paths walk a file's mappings: none calls `begin`/`end` itself.

use crate::{Iomap, IomapOp, IomapOps};

/// What the body of [`iterate`] did with one mapping piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Consumed this many bytes (at least 1, at most the piece); the walk goes on.
    Advance(u64),
    /// Consumed this many bytes (0 allowed, at most the piece); the walk ends here.
    Done(u64),
    /// The mapping no longer describes the file (its sequence cookie is old): nothing was
    /// consumed; `end` it and map the same position again (`IOMAP_F_STALE`).
    Stale,
}

impl From<u64> for Step {
    fn from(n: u64) -> Self {
        Self::Advance(n)
    }
}

/// Why an iteration stopped early.
#[derive(Debug)]
pub enum IterError<E> {
    /// The file system or the body failed after `done` bytes had been processed.
    Failed { done: u64, error: E },
    /// The file system broke the mapping contract (a bug, reported rather than trusted).
    Contract(String),
}

impl<E> IterError<E> {
    /// The bytes processed before the walk stopped and the error, a contract violation
    /// turned into the file system's error by `contract`.
    pub fn into_parts(self, contract: impl FnOnce(String) -> E) -> (u64, E) {
        match self {
            Self::Failed { done, error } => (done, error),
            Self::Contract(m) => (0, contract(m)),
        }
    }
}

/// Walks `[pos, pos + len)` one mapping at a time, calling `body` on each piece.
///
/// # Errors
/// [`IterError::Failed`] with the bytes completed before the error, or
/// [`IterError::Contract`] when `begin` or the body violates the contract.
pub fn iterate<O, F, S>(
    ops: &O,
    pos: u64,
    len: u64,
    op: IomapOp,
    mut body: F,
) -> Result<u64, IterError<O::Error>>
where
    O: IomapOps + ?Sized,
    F: FnMut(&Iomap<O::Addr>, u64, u64) -> Result<S, O::Error>,
    S: Into<Step>,
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
        debug_assert!(piece >= 1 && map.covers(cur), "a piece is never empty");
        match body(&map, cur, piece).map(Into::into) {
            Ok(Step::Stale) => {
                ops.end(&map, cur, 0, op)
                    .map_err(|error| IterError::Failed {
                        done: cur - pos,
                        error,
                    })?;
            }
            Ok(Step::Done(used)) if used <= piece => {
                ops.end(&map, cur, used, op)
                    .map_err(|error| IterError::Failed {
                        done: cur + used - pos,
                        error,
                    })?;
                return Ok(cur + used - pos);
            }
            Ok(Step::Advance(used)) if used >= 1 && used <= piece => {
                ops.end(&map, cur, used, op)
                    .map_err(|error| IterError::Failed {
                        done: cur + used - pos,
                        error,
                    })?;
                cur += used;
            }
            Ok(Step::Advance(used) | Step::Done(used)) => {
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
    fn stale_maps_again_and_done_ends_the_walk() {
        let f = fake(None);
        let mut stale_once = true;
        let mut seen = Vec::new();
        let n = iterate(&f, 0, 9, IomapOp::Read, |_, pos, len| {
            seen.push(pos);
            if pos == 3 && stale_once {
                stale_once = false;
                return Ok(Step::Stale);
            }
            Ok(if pos == 6 {
                Step::Done(1)
            } else {
                Step::Advance(len)
            })
        })
        .unwrap();
        assert_eq!(n, 7, "stopped one byte into the third mapping");
        assert_eq!(
            seen,
            vec![0, 3, 3, 6],
            "the stale mapping was asked for again"
        );
        assert_eq!(*f.begins.borrow() as usize, f.ends.borrow().len());
        assert_eq!(
            f.ends.borrow()[1],
            (3, 0),
            "a stale mapping ends with nothing used"
        );
        let f = fake(None);
        let e = iterate(&f, 0, 9, IomapOp::Read, |_, _, len| Ok(Step::Done(len + 1)));
        assert!(
            matches!(e, Err(IterError::Contract(_))),
            "overlong final step"
        );
        assert_eq!(f.ends.borrow().last(), Some(&(0, 0)));
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

//! `BufPool`: recycles [`IoBuf`]s so that the data path does not pay for a fresh, zeroed,
//! page-faulting allocation on every I/O.
//!
//! A recycled buffer holds whatever its last user left in it (initialised memory, never
//! uninitialised): callers must overwrite or zero every byte they rely on. The pool keeps at
//! most `limit_bytes` of idle buffers; beyond that, returned buffers are freed.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::IoBuf;

/// A bounded pool of idle I/O buffers, by exact length.
#[derive(Debug)]
pub struct BufPool {
    inner: Mutex<Inner>,
    limit_bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    free: HashMap<usize, Vec<IoBuf>>,
    idle_bytes: usize,
}

impl BufPool {
    /// A pool keeping at most `limit_bytes` of idle buffers.
    #[must_use]
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            limit_bytes,
        }
    }

    /// A buffer of exactly `len` bytes with unspecified (but initialised) contents.
    #[must_use]
    pub fn get(&self, len: usize) -> IoBuf {
        let mut inner = self.inner.lock();
        if let Some(b) = inner.free.get_mut(&len).and_then(Vec::pop) {
            inner.idle_bytes -= len;
            return b;
        }
        drop(inner);
        IoBuf::zeroed(len)
    }

    /// A buffer of `len` zero bytes.
    #[must_use]
    pub fn get_zeroed(&self, len: usize) -> IoBuf {
        let mut b = self.get(len);
        b.fill(0);
        b
    }

    /// Returns buffers to the pool (freed if the pool is full). A lent window gives back
    /// its whole allocation if it was the last holder of it, and is dropped otherwise (its
    /// lender still uses the memory).
    pub fn put_all(&self, bufs: impl IntoIterator<Item = IoBuf>) {
        let mut inner = self.inner.lock();
        for b in bufs.into_iter().filter_map(IoBuf::into_unshared) {
            if b.is_empty() || inner.idle_bytes + b.len() > self.limit_bytes {
                continue;
            }
            inner.idle_bytes += b.len();
            inner.free.entry(b.len()).or_default().push(b);
        }
    }

    /// Bytes held idle.
    #[must_use]
    pub fn idle_bytes(&self) -> usize {
        self.inner.lock().idle_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles_within_the_limit() {
        let p = BufPool::new(8192);
        let a = p.get(4096);
        let ptr = a.as_ptr();
        p.put_all([a, IoBuf::zeroed(4096), IoBuf::zeroed(4096)]);
        assert_eq!(
            p.idle_bytes(),
            8192,
            "third buffer exceeds the limit and is freed"
        );
        let b = p.get(4096);
        assert!(b.as_ptr() == ptr || p.idle_bytes() == 4096);
        let z = p.get_zeroed(4096);
        assert!(z.iter().all(|&x| x == 0));
    }
}

//! `IoBuf`: a buffer aligned for `O_DIRECT`, owned or lent; `SharedBuf`: aligned memory
//! shared between its owner and the writes it lends windows of.
//!
//! Every buffer handed to a target is an `IoBuf`, so alignment is a type property rather
//! than a runtime hope. The allocation is aligned to [`IO_ALIGN`] bytes, which covers every
//! logical sector size we accept (512 B to 4 KiB).
//!
//! Lending (issue 15, writeback without the staging copy): the page cache keeps a folio's
//! bytes in a [`SharedBuf`] and hands a write read-only windows of it
//! ([`SharedBuf::window`]) instead of copying them into a staging buffer.
//!
//! Stable pages (invariant): bytes lent to a write never change until every window onto
//! them is dropped, which a target does only after the device has finished with them
//! (an NBD client may send them long after submission; a checksum may be computed over
//! them). It holds by construction: a window keeps a reference to the memory, and the
//! only mutable access to that memory ([`SharedBuf`]'s `DerefMut`) copies it first while
//! any window exists (copy on write), so the owner writes into fresh memory and the
//! device keeps reading the old. Debug builds also checksum every window when it is made
//! and again when it is dropped, and panic if the bytes changed.
//!
//! A lent `IoBuf` behaves as a value like any other: mutable access to it
//! ([`IoBuf::as_mut_ptr`], `DerefMut`) first copies it into memory of its own, so a read
//! into one never touches the lender's bytes (and costs a copy: only writes should be
//! given windows).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every [`IoBuf`] allocation, in bytes.
pub const IO_ALIGN: usize = 4096;

/// An owned, zero-initialised allocation aligned to [`IO_ALIGN`].
struct Alloc {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Alloc` uniquely owns its allocation, like `Vec<u8>`; no interior aliasing.
unsafe impl Send for Alloc {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for Alloc {}

impl Alloc {
    fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self::empty();
        }
        let layout = Self::layout(len);
        // SAFETY: `layout` has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self { ptr, len }
    }

    /// No allocation (what a moved-out buffer is left holding).
    fn empty() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }

    fn copy_of(data: &[u8]) -> Self {
        let mut a = Self::zeroed(data.len());
        a.bytes_mut().copy_from_slice(data);
        a
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, IO_ALIGN).expect("IoBuf length overflows a Layout")
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at allocation), or
        // dangling with `len == 0`, which is allowed for slices.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` guarantees uniqueness.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

/// A read-only window `[off, off + len)` onto shared memory.
struct Window {
    mem: Arc<Alloc>,
    off: usize,
    len: usize,
    /// Checksum of the bytes when the window was made (stable pages, debug builds).
    #[cfg(debug_assertions)]
    sum: u64,
}

impl Window {
    fn new(mem: Arc<Alloc>, off: usize, len: usize) -> Self {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= mem.len),
            "window [{off}, +{len}) outside a buffer of {} bytes",
            mem.len
        );
        let w = Self {
            mem,
            off,
            len,
            #[cfg(debug_assertions)]
            sum: 0,
        };
        #[cfg(debug_assertions)]
        let w = Self {
            sum: checksum(w.bytes()),
            ..w
        };
        w
    }

    fn bytes(&self) -> &[u8] {
        &self.mem.bytes()[self.off..self.off + self.len]
    }

    /// Debug builds: the stable-pages invariant (the bytes did not change under the
    /// window).
    fn check_stable(&self) {
        #[cfg(debug_assertions)]
        if !std::thread::panicking() {
            assert_eq!(
                checksum(self.bytes()),
                self.sum,
                "stable pages: {} lent bytes changed while a write held them",
                self.len
            );
        }
    }
}

/// FNV-1a over 8-byte words (debug builds only: the stable-pages check).
#[cfg(debug_assertions)]
fn checksum(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x100_0000_01b3);
    }
    for &x in words.remainder() {
        h = (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

enum Repr {
    Owned(Alloc),
    Lent(Window),
}

/// A byte buffer whose start is aligned to [`IO_ALIGN`]: owned, or a read-only window lent
/// by a [`SharedBuf`] (see the module documentation).
pub struct IoBuf {
    repr: Repr,
}

impl IoBuf {
    /// Allocates `len` zeroed bytes aligned to [`IO_ALIGN`].
    ///
    /// # Panics
    /// Panics if the allocator fails (as `Vec` does).
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self {
            repr: Repr::Owned(Alloc::zeroed(len)),
        }
    }

    /// Allocates a buffer holding a copy of `data`.
    #[must_use]
    pub fn from_slice(data: &[u8]) -> Self {
        Self {
            repr: Repr::Owned(Alloc::copy_of(data)),
        }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Owned(a) => a.len,
            Repr::Lent(w) => w.len,
        }
    }

    /// True for a zero-length buffer.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for a window lent by a [`SharedBuf`].
    #[must_use]
    pub fn is_lent(&self) -> bool {
        matches!(self.repr, Repr::Lent(_))
    }

    /// Raw pointer for handing to the kernel; valid for `len` bytes while `self` lives,
    /// for reading only.
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        self.deref().as_ptr()
    }

    /// Raw mutable pointer for handing to the kernel (a lent window is copied into memory
    /// of its own first).
    #[must_use]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.deref_mut().as_mut_ptr()
    }

    /// Splits the buffer at byte `at` without copying: an owned buffer becomes shared
    /// memory with two windows onto it.
    ///
    /// # Panics
    /// Panics if `at` is past the end.
    #[must_use]
    pub fn split_at(mut self, at: usize) -> (IoBuf, IoBuf) {
        let len = self.len();
        assert!(at <= len, "split at {at} of a {len}-byte buffer");
        let (mem, off) = match std::mem::replace(&mut self.repr, Repr::Owned(Alloc::empty())) {
            Repr::Owned(a) => (Arc::new(a), 0),
            Repr::Lent(w) => (Arc::clone(&w.mem), w.off),
        };
        let head = Window::new(Arc::clone(&mem), off, at);
        let tail = Window::new(mem, off + at, len - at);
        (
            IoBuf {
                repr: Repr::Lent(head),
            },
            IoBuf {
                repr: Repr::Lent(tail),
            },
        )
    }

    /// The whole allocation back as an owned buffer, if no other window or owner shares
    /// it (what a buffer pool keeps); `None` for a window whose memory is still shared.
    #[must_use]
    pub fn into_unshared(mut self) -> Option<IoBuf> {
        match std::mem::replace(&mut self.repr, Repr::Owned(Alloc::empty())) {
            Repr::Owned(a) => Some(IoBuf {
                repr: Repr::Owned(a),
            }),
            Repr::Lent(w) => {
                w.check_stable();
                Arc::try_unwrap(w.mem).ok().map(|a| IoBuf {
                    repr: Repr::Owned(a),
                })
            }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.repr {
            Repr::Owned(a) => a.bytes(),
            Repr::Lent(w) => w.bytes(),
        }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        if let Repr::Lent(w) = &self.repr {
            let own = Alloc::copy_of(w.bytes());
            // Dropping the window runs its stable-pages check.
            self.repr = Repr::Owned(own);
        }
        match &mut self.repr {
            Repr::Owned(a) => a.bytes_mut(),
            Repr::Lent(_) => unreachable!("a lent buffer was just copied"),
        }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Repr::Lent(w) = &self.repr {
            w.check_stable();
        }
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len())
            .field("lent", &self.is_lent())
            .finish()
    }
}

/// Aligned memory that lends read-only windows of itself to writes ([`SharedBuf::window`])
/// and copies itself on write while any is out (see the module documentation: stable
/// pages). What the page cache keeps a folio's bytes in.
pub struct SharedBuf {
    mem: Arc<Alloc>,
}

impl SharedBuf {
    /// `len` zeroed bytes.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self::from(IoBuf::zeroed(len))
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// True for a zero-length buffer.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// A read-only window onto bytes `[off, off + len)`, for a write. Until it is dropped,
    /// the next mutable access to `self` copies the memory first.
    ///
    /// # Panics
    /// Panics if the range is outside the buffer.
    #[must_use]
    pub fn window(&self, off: usize, len: usize) -> IoBuf {
        IoBuf {
            repr: Repr::Lent(Window::new(Arc::clone(&self.mem), off, len)),
        }
    }

    /// True while windows onto this memory are out (a mutable access would copy).
    #[must_use]
    pub fn is_lent(&self) -> bool {
        Arc::strong_count(&self.mem) > 1
    }

    /// The memory as an owned buffer, if no window onto it is out.
    #[must_use]
    pub fn into_unshared(self) -> Option<IoBuf> {
        Arc::try_unwrap(self.mem).ok().map(|a| IoBuf {
            repr: Repr::Owned(a),
        })
    }
}

impl From<IoBuf> for SharedBuf {
    /// Shares an owned buffer's memory without copying (a lent window's bytes are
    /// copied).
    fn from(mut b: IoBuf) -> Self {
        let mem = match std::mem::replace(&mut b.repr, Repr::Owned(Alloc::empty())) {
            Repr::Owned(a) => a,
            Repr::Lent(w) => Alloc::copy_of(w.bytes()),
        };
        Self { mem: Arc::new(mem) }
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.mem.bytes()
    }
}

impl DerefMut for SharedBuf {
    /// Copy on write: while a window is lent, the bytes move to fresh memory first (the
    /// write keeps the old, unchanged).
    fn deref_mut(&mut self) -> &mut [u8] {
        if Arc::get_mut(&mut self.mem).is_none() {
            self.mem = Arc::new(Alloc::copy_of(self.mem.bytes()));
        }
        Arc::get_mut(&mut self.mem)
            .expect("memory just made unshared")
            .bytes_mut()
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuf")
            .field("len", &self.len())
            .field("lent", &self.is_lent())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [1, 512, 4096, 70_000] {
            let b = IoBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(b.len(), len);
        }
        assert!(IoBuf::zeroed(0).is_empty());
    }

    #[test]
    fn a_window_shares_memory_and_writes_copy() {
        let mut s = SharedBuf::zeroed(8192);
        s[..].fill(7);
        let base = s.as_ptr();
        let w = s.window(4096, 4096);
        assert!(w.is_lent() && s.is_lent());
        assert_eq!(w.as_ptr(), base.wrapping_add(4096), "no copy to lend");
        // Copy on write: the owner's change goes to fresh memory, the window keeps the old.
        s[4096] = 9;
        assert_ne!(s.as_ptr(), base);
        assert!(!s.is_lent());
        assert!(w.iter().all(|&x| x == 7));
        assert_eq!(s[4096], 9);
        // The window, last holder of the old memory, gives it back whole.
        let back = w.into_unshared().expect("last holder");
        assert_eq!((back.len(), back.as_ptr()), (8192, base));
        // Unshared again: writes go in place.
        let p = s.as_ptr();
        s[0] = 1;
        assert_eq!(s.as_ptr(), p);
    }

    #[test]
    fn mutating_a_window_copies_it() {
        let mut s = SharedBuf::zeroed(4096);
        s[..].fill(3);
        let mut w = s.window(0, 4096);
        w[0] = 5;
        assert!(!w.is_lent());
        assert_eq!(s[0], 3, "the lender's bytes are untouched");
        assert!(!s.is_lent());
    }

    #[test]
    fn split_shares_without_copying() {
        let mut b = IoBuf::zeroed(8192);
        b[4096] = 1;
        let p = b.as_ptr();
        let (h, t) = b.split_at(4096);
        assert_eq!((h.as_ptr(), t.as_ptr()), (p, p.wrapping_add(4096)));
        assert_eq!(t[0], 1);
        assert!(h.into_unshared().is_none(), "the tail still shares it");
        assert_eq!(t.into_unshared().map(|b| b.len()), Some(8192));
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "stable pages")]
    fn a_change_under_a_window_is_caught() {
        let s = SharedBuf::zeroed(4096);
        let w = s.window(0, 4096);
        // What the copy on write prevents: a write into lent memory. This breaks the
        // invariant the check guards, on purpose.
        // SAFETY: the pointer is the allocation's own, valid for 4096 bytes, and no
        // reference to its bytes is live.
        unsafe { s.mem.ptr.as_ptr().write(1) };
        drop(w);
    }
}

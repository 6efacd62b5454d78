//! `IoBuf`: an owned, heap-allocated buffer aligned for `O_DIRECT`.
//!
//! Every buffer handed to a target is an `IoBuf`, so alignment is a type property rather
//! than a runtime hope. The allocation is aligned to [`IO_ALIGN`] bytes, which covers every
//! logical sector size we accept (512 B to 4 KiB).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`IoBuf`] allocation, in bytes.
pub const IO_ALIGN: usize = 4096;

/// An owned, zero-initialised byte buffer whose start is aligned to [`IO_ALIGN`].
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `IoBuf` uniquely owns its allocation, like `Vec<u8>`; no interior aliasing.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// Allocates `len` zeroed bytes aligned to [`IO_ALIGN`].
    ///
    /// # Panics
    /// Panics if the allocator fails (as `Vec` does).
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: NonNull::dangling(),
                len: 0,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: `layout` has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self { ptr, len }
    }

    /// Allocates a buffer holding a copy of `data`.
    #[must_use]
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len());
        buf.copy_from_slice(data);
        buf
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, IO_ALIGN).expect("IoBuf length overflows a Layout")
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer for handing to the kernel; valid for `len` bytes while `self` lives.
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw mutable pointer for handing to the kernel.
    #[must_use]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at allocation), or
        // dangling with `len == 0`, which is allowed for slices.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees uniqueness.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
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
        f.debug_struct("IoBuf").field("len", &self.len).finish()
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
}

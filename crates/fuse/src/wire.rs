//! Little-endian fields at fixed offsets: the byte layout of the private ioctls' buffers
//! (`scrub_ioctl`, `evacuate_ioctl`, `target_ioctl`). Callers check a buffer's length
//! before they read it.

/// Writes `v` at `at`.
pub(crate) fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// The u32 at `at`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The u64 at `at`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

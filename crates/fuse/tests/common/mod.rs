//! Helpers shared by the FUSE tests.

use std::path::Path;
use std::sync::Arc;

use stripefs_target::{FileTarget, FileTargetOptions, Target};

/// `n` file targets `t0..` of `size` bytes in `dir` (created if missing).
pub fn file_targets(dir: &Path, n: usize, size: u64) -> Vec<Arc<dyn Target>> {
    (0..n)
        .map(|i| {
            let opts = FileTargetOptions {
                create_size: Some(size),
                ..FileTargetOptions::default()
            };
            Arc::new(FileTarget::open(&dir.join(format!("t{i}")), opts).unwrap()) as Arc<dyn Target>
        })
        .collect()
}

/// A 4 KiB-aligned buffer for `O_DIRECT`.
pub struct Aligned {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize, fill: u8) -> Self {
        let v = vec![fill; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        Self { v, off, len }
    }

    pub fn buf(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

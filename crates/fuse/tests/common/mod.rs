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

/// The serve options of the mount tests. `STRIPEFS_FUSE_TRANSPORT=dev|uring|auto`
/// picks the transport for a whole run (default `dev`), so the suite runs once per
/// transport; `uring` needs `enable_uring=Y` (see [`enable_fuse_uring`]).
pub fn serve_options() -> stripefs_fuse::ServeOptions {
    let transport = match std::env::var("STRIPEFS_FUSE_TRANSPORT") {
        Ok(t) => t.parse().unwrap(),
        Err(_) => stripefs_fuse::TransportChoice::Dev,
    };
    stripefs_fuse::ServeOptions {
        transport,
        ..stripefs_fuse::ServeOptions::default()
    }
}

/// Switches FUSE over io_uring on (`enable_uring=Y`; root may at run time) and says
/// whether this kernel has it. A kernel without the parameter is a loud skip (or a
/// failure with `STRIPEFS_REQUIRE_FUSE_URING=1`); a parameter that cannot be written
/// fails the test: it would otherwise pass without testing anything. The parameter is
/// left on: other tests of the same run may be mounting over the ring.
#[allow(dead_code)] // mount.rs only
pub fn enable_fuse_uring() -> bool {
    let param = stripefs_fuse::uring::ENABLE_URING;
    match std::fs::read_to_string(param) {
        Err(e) => {
            let msg = format!("{param}: {e}: this kernel has no FUSE over io_uring");
            assert!(
                std::env::var_os("STRIPEFS_REQUIRE_FUSE_URING").is_none(),
                "{msg}, and STRIPEFS_REQUIRE_FUSE_URING is set"
            );
            eprintln!("SKIPPED (io_uring transport NOT tested): {msg}");
            false
        }
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) => {
            if let Err(e) = std::fs::write(param, "Y") {
                panic!("cannot switch FUSE over io_uring on ({param}: {e}); run as root or write Y there first");
            }
            true
        }
    }
}

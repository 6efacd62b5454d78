//! Opening targets named on the command line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stripefs_target::{FileTarget, FileTargetOptions, Target};

/// Opens every path as a file target (must exist).
///
/// # Errors
/// The first target that cannot be opened, with the reason.
pub fn open_all(paths: &[PathBuf]) -> Result<Vec<Arc<dyn Target>>, String> {
    paths.iter().map(|p| open_one(p, None)).collect()
}

/// Opens one target, creating a regular file of `create_size` if it is missing.
///
/// # Errors
/// A sentence naming the target.
pub fn open_one(p: &Path, create_size: Option<u64>) -> Result<Arc<dyn Target>, String> {
    let opts = FileTargetOptions {
        create_size,
        ..FileTargetOptions::default()
    };
    let t = FileTarget::open(p, opts)
        .map_err(|e| format!("cannot open target {}: {}", p.display(), e.kind))?;
    Ok(Arc::new(t))
}

//! `stripefs add-target MOUNTPOINT PATH`: grows a mounted file system by the target at
//! PATH (a file, a block device or an `nbd://` URI), through the daemon's add-target
//! ioctl on the mount's root (`stripefs_fuse::target_ioctl`, `docs/design/targets.md`).
//! The daemon opens the target as it opened its own and formats only its superblock:
//! there is no long step to show progress for (decision 116).

use std::path::{Path, PathBuf};

use stripefs_fuse::target_ioctl::{self, Added};

/// Add a target to a mounted file system (new files stripe over it; existing data stays).
#[derive(Debug, clap::Args)]
pub struct AddTargetArgs {
    /// The mount point of a mounted stripefs file system (as root).
    mountpoint: PathBuf,
    /// The new target: a file, a block device or an NBD URI. Its first sector must not
    /// hold another stripefs file system's superblock.
    path: PathBuf,
}

/// Runs the add; prints the new target's index and size.
///
/// # Errors
/// A sentence: the mount point is not a stripefs mount's root, not root, or the daemon
/// refused the target (its reason).
pub fn run(a: &AddTargetArgs) -> Result<i32, String> {
    let path = crate::targets::absolute(&a.path);
    if !crate::targets::is_uri(&path) && !crate::targets::exists(&path) {
        return Err(format!("{}: no such file or device", path.display()));
    }
    let mut b = target_ioctl::encode_request(&path)
        .ok_or_else(|| format!("{}: path too long or not UTF-8", path.display()))?;
    println!("adding {} to {}", path.display(), a.mountpoint.display());
    call(&a.mountpoint, &mut b)?;
    match target_ioctl::decode_reply(&b)? {
        Added::Joined {
            index,
            blocks,
            block_size,
        } => {
            let bytes = blocks * u64::from(block_size);
            println!(
                "target {index}: {} ({blocks} data blocks of {block_size} bytes, {:.1} GiB); new files stripe over it",
                path.display(),
                bytes as f64 / f64::from(1u32 << 30)
            );
            Ok(0)
        }
        Added::Refused(why) => Err(format!("add-target refused: {why}")),
    }
}

/// One ioctl on the mount's root with the request in `b`; the reply replaces it.
fn call(mnt: &Path, b: &mut [u8]) -> Result<(), String> {
    let dir = std::fs::File::open(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    crate::root_ioctl::call(&dir, mnt, target_ioctl::ADD_TARGET, b, "add-target")?;
    Ok(())
}

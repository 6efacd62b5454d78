//! The binary's policy for the C allocator (glibc's malloc), which the engine's heap
//! lives in: one arena, and freed memory handed back to the kernel when the resident set
//! grows (decisions.md, 83 and 123). The library sets none of this: a program that embeds
//! the engine owns its allocator.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::Duration;

/// How often the trimmer looks at the resident set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_PERIOD: Duration = Duration::from_secs(1);

/// Growth of the resident set since the last trim that makes the trimmer trim again.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_GROWTH_BYTES: u64 = 16 << 20;

/// One malloc arena for the whole process (decisions.md, 83). glibc gives each thread
/// that meets contention an arena of its own and keeps what is freed in each, so memory
/// freed by the checkpointer, the committers and the FUSE workers stayed resident:
/// `stripefs bench -w meta --files 300000` peaked at 478 MiB with the default and 280 MiB
/// with one arena, at the same create rate (BENCHMARKS.md, "Resident memory at scale").
/// Call before any thread starts. Other C libraries have no such option.
pub(crate) fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes two integers and changes only the allocator's tuning;
    // called on the main thread before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Starts the trimmer thread (decisions.md, 123): once a second it reads the resident
/// set, and when that has grown by [`TRIM_GROWTH_BYTES`] since the last trim it calls
/// `malloc_trim(0)`, which gives the kernel back every whole free page of the heap, not
/// only its top. Without it the heap kept the pages of what a phase had freed (the
/// checkpoint's page copies and write buffers, replay's decoded inodes) and grew past
/// them when later allocations did not fit the holes: `stripefs bench -w meta` at a
/// million files peaked at 247 MiB in its unlinks with about 100 MiB of live heap.
/// An idle process reads one small `/proc` file a second and trims nothing.
pub(crate) fn start_trimmer() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let spawned = std::thread::Builder::new()
            .name("heap-trim".into())
            .spawn(|| {
                let mut last = resident_bytes().unwrap_or(0);
                loop {
                    std::thread::sleep(TRIM_PERIOD);
                    let Some(now) = resident_bytes() else { return };
                    if now >= last + TRIM_GROWTH_BYTES {
                        // SAFETY: `malloc_trim` takes the allocator's own locks; it is
                        // safe to call from any thread at any time.
                        unsafe { libc::malloc_trim(0) };
                        last = resident_bytes().unwrap_or(now);
                        tracing::debug!(before = now, after = last, "heap trimmed");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no heap trimmer: freed memory stays resident");
        }
    }
}

/// The process's resident set in bytes (`/proc/self/statm`, second field, in pages).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn resident_bytes_reads_this_process() {
        let r = resident_bytes().expect("statm");
        // A test binary holds at least its own code and stack, far below a terabyte.
        assert!(r > 1 << 20 && r < 1 << 40, "{r}");
    }
}

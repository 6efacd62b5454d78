//! `stripefs`: create, check, inspect and drive stripefs file systems.

mod add_target;
mod bench;
mod bench_dio;
mod bench_meta;
mod bench_nocow;
mod evacuate;
mod fsck;
mod inspect;
mod io;
mod mkfs;
mod mount;
mod mount_opts;
mod progress;
mod remount;
mod root_ioctl;
mod scrub;
mod size;
mod targets;

use clap::{Parser, Subcommand};

/// A file system striped over several targets (files or block devices).
#[derive(Debug, Parser)]
#[command(name = "stripefs", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    Mkfs(mkfs::MkfsArgs),
    Fsck(fsck::FsckArgs),
    Io(io::IoArgs),
    Inspect(inspect::InspectArgs),
    Bench(Box<bench::BenchArgs>),
    Mount(mount::MountArgs),
    Umount(mount::UmountArgs),
    Remount(remount::RemountArgs),
    Scrub(scrub::ScrubArgs),
    Evacuate(evacuate::EvacuateArgs),
    AddTarget(add_target::AddTargetArgs),
    RemoveTarget(evacuate::RemoveTargetArgs),
}

/// One malloc arena for the whole process (glibc; decisions.md, 83). glibc gives each
/// thread that meets contention an arena of its own and keeps what is freed in each, so
/// memory freed by the checkpointer, the committers and the FUSE workers stayed
/// resident: `stripefs bench -w meta --files 300000` peaked at 478 MiB with the default
/// and 280 MiB with one arena, at the same create rate (BENCHMARKS.md, "Resident memory
/// at scale"). Set before any thread starts. Other C libraries have no such option.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes two integers and changes only the allocator's tuning;
    // called on the main thread before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() {
    one_malloc_arena();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRIPEFS_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // A failed log write is reported with `eprintln!`, which panics when stderr is a
        // closed pipe: a daemon must never die over a log line.
        .log_internal_errors(false)
        .init();
    let cli = match mount::helper_args(std::env::args_os()) {
        Some(Ok(args)) => Cli::parse_from(args),
        Some(Err(e)) => {
            eprintln!("mount.fuse.stripefs: {e}");
            std::process::exit(1);
        }
        None => Cli::parse(),
    };
    let res = match &cli.cmd {
        Cmd::Mkfs(a) => mkfs::run(a),
        Cmd::Fsck(a) => fsck::run(a),
        Cmd::Io(a) => io::run(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Mount(a) => mount::run(a),
        Cmd::Umount(a) => mount::run_umount(a),
        Cmd::Remount(a) => remount::run(a),
        Cmd::Scrub(a) => scrub::run(a),
        Cmd::Evacuate(a) => evacuate::run(a),
        Cmd::AddTarget(a) => add_target::run(a),
        Cmd::RemoveTarget(a) => evacuate::run(&a.evacuation()),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("stripefs: {e}");
            std::process::exit(1);
        }
    }
}

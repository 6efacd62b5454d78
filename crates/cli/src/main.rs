//! `stripefs`: create, check, inspect and drive stripefs file systems.

mod add_target;
mod bench;
mod bench_dio;
mod bench_meta;
mod bench_nocow;
mod evacuate;
mod fsck;
mod heap;
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

fn main() {
    heap::one_arena();
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
    heap::start_trimmer();
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

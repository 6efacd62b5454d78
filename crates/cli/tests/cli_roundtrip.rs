//! The `stripefs` binary end to end on file-backed targets: mkfs, io, fsck, inspect, and
//! the errors a user sees for bad arguments and damaged targets.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stripefs"))
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stripefs-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn targets(d: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| d.join(format!("t{i}")).display().to_string())
        .collect()
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn mkfs_io_fsck_inspect() {
    let d = dir("roundtrip");
    let t = targets(&d, 3);
    let (code, out, err) = run(bin()
        .args(["mkfs", "--size", "32m", "--stripe-unit", "64k"])
        .args(&t));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("targets=3"), "{out}");
    let (code, out, err) = run(bin().arg("io").args(&t).args([
        "-c",
        "open -f /a",
        "-c",
        "pwrite -S 0x61 1000 300k",
        "-c",
        "fsync",
        "-c",
        "pread -v 1000 16",
        "-c",
        "stat",
        "-c",
        "bmap",
        "-c",
        "mkdir /d",
        "-c",
        "rename /a /d/b",
        "-c",
        "ls /d",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("wrote 307200/307200 bytes at offset 1000"),
        "{out}"
    );
    assert!(out.contains("61 61 61 61"), "{out}");
    assert!(out.contains("stat.size = 308200"), "{out}");
    assert!(out.contains("target 1"), "bmap shows striping: {out}");
    assert!(out.contains(" b"), "{out}");
    let (code, out, err) = run(bin().arg("fsck").args(t.iter().rev()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("clean"), "{out}");
    let (code, out, _) = run(bin().arg("inspect").args(&t));
    assert_eq!(code, 0);
    assert!(
        out.contains("superblock of target 2") && out.contains("(active)"),
        "{out}"
    );
    let (code, _, err) = run(bin().arg("io").args(&t).args(["-c", "open /missing"]));
    assert_eq!(code, 1);
    assert!(
        err.contains("No such file") || err.contains("no such file"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn user_errors_are_clear() {
    let d = dir("errors");
    let t = targets(&d, 2);
    let (code, _, err) = run(bin().arg("mkfs").args(&t));
    assert_ne!(code, 0);
    assert!(err.contains("does not exist; give --size"), "{err}");
    let (code, _, err) = run(bin()
        .args(["mkfs", "--size", "16m", "--block-size", "3000"])
        .args(&t));
    assert_ne!(code, 0);
    assert!(err.contains("block size 3000"), "{err}");
    let (code, _, err) = run(bin()
        .args(["mkfs", "--size", "16m", "--stripe-unit", "6k"])
        .args(&t));
    assert_ne!(code, 0);
    assert!(err.contains("stripe unit"), "{err}");
    let (code, _, err) = run(bin().args(["mkfs", "--size", "12x"]).args(&t));
    assert_ne!(code, 0);
    assert!(err.contains("unknown suffix"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn fsck_reports_damage_with_status_4() {
    let d = dir("damage");
    let t = targets(&d, 2);
    assert_eq!(
        run(bin()
            .args(["mkfs", "--size", "16m", "--no-prezero"])
            .args(&t))
        .0,
        0
    );
    let mut img = std::fs::read(&t[1]).unwrap();
    img[200] ^= 0xff;
    std::fs::write(&t[1], &img).unwrap();
    let (code, out, err) = run(bin().arg("fsck").args(&t));
    assert_eq!(code, 4, "{out}{err}");
    assert!(
        err.contains("superblock of target") && err.contains("checksum"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A damaged older root record slot (the previous generation of the metadata trees, the
/// fallback) is a warning with its own exit-status bit (1), not silence and not a problem
/// (4); the next checkpoint rewrites the slot and the warning goes away.
#[test]
fn fsck_warns_about_a_damaged_older_root_slot_with_status_1() {
    let d = dir("older-root");
    let t = targets(&d, 2);
    let mkfs = run(bin()
        .args([
            "mkfs",
            "--size",
            "16m",
            "--no-prezero",
            "--block-size",
            "4k",
        ])
        .args(&t));
    assert_eq!(mkfs.0, 0, "{mkfs:?}");
    // Right after mkfs slot 0 has never been written: not damage.
    let (code, out, err) = run(bin().arg("fsck").args(&t));
    assert_eq!((code, out.contains("clean")), (0, true), "{out}{err}");
    // One mount and unmount: generation 2 goes to slot 0, generation 1 stays in slot 1.
    let io = |dir: &str| run(bin().arg("io").args(&t).args(["-c", dir]));
    assert_eq!(io("mkdir /d").0, 0);
    let clean = std::fs::read(&t[0]).unwrap();
    let (code, out, err) = run(bin().arg("fsck").args(&t));
    assert_eq!(code, 0, "{out}{err}");
    // Slot 1 is block 2 of target 0.
    let mut img = clean.clone();
    img[2 * 4096 + 40] ^= 0x20;
    std::fs::write(&t[0], &img).unwrap();
    let (code, out, err) = run(bin().arg("fsck").args(&t));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("warning: metadata root record slot 1: no valid record (torn or damaged)"),
        "{out}"
    );
    assert!(out.contains("clean, 1 warnings"), "{out}");
    // The file system is usable, and its next checkpoint (generation 3) rewrites slot 1.
    assert_eq!(io("mkdir /e").0, 0);
    let (code, out, err) = run(bin().arg("fsck").args(&t));
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("warning"), "{out}");
    let (code, help, _) = run(bin().args(["fsck", "--help"]));
    assert_eq!(code, 0);
    assert!(
        help.contains("Exit status")
            && help.contains("1  warnings")
            && help.contains("4  problems"),
        "{help}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn punch_zero_seek_and_direct() {
    let d = dir("punch");
    let t = targets(&d, 2);
    assert_eq!(
        run(bin()
            .args([
                "mkfs",
                "--size",
                "32m",
                "--stripe-unit",
                "64k",
                "--no-prezero"
            ])
            .args(&t))
        .0,
        0
    );
    let (code, out, err) = run(bin().arg("io").args(&t).args([
        "-c",
        "open -f /s",
        "-c",
        "pwrite -S 0x41 0 64k",
        "-c",
        "fpunch 16k 16k",
        "-c",
        "seek -h 0",
        "-c",
        "seek -d 16k",
        "-c",
        "fzero 0 4k",
        "-c",
        "pread -v 0 16",
        "-c",
        "fsync",
        "-c",
        "bmap",
        "-c",
        "open -d /s",
        "-c",
        "pwrite -S 0x42 512 1024",
        "-c",
        "pread -v 512 512",
        "-c",
        "stat",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("HOLE\t16384"), "{out}");
    assert!(out.contains("DATA\t32768"), "{out}");
    assert!(
        out.contains("00000000:  00 00 00 00"),
        "fzero reads zeros: {out}"
    );
    assert!(
        out.contains("00000200:  42 42 42 42"),
        "direct write over zeroed block: {out}"
    );
    assert!(
        out.contains("fd.flags = non-sync,direct,read-write"),
        "{out}"
    );
    assert!(out.contains("hole"), "punched range shows as a hole: {out}");
    let (code, out, err) = run(bin().arg("fsck").args(&t));
    assert_eq!(code, 0, "{out}{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn queued_direct_io_from_the_command_line() {
    let d = dir("queued");
    let t = targets(&d, 2);
    assert_eq!(
        run(bin()
            .args(["mkfs", "--size", "32m", "--no-prezero"])
            .args(&t))
        .0,
        0
    );
    let (code, out, err) = run(bin().arg("io").args(&t).args([
        "-c",
        "open -f -d /q",
        "-c",
        "pwrite -b 64k 0 1m",
        "-c",
        "pwrite -q 16 -b 2k -S 0x77 0 256k",
        "-c",
        "pread -q 8 -b 4k 0 1m",
        "-c",
        "pread -v 0 512",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("wrote 262144/262144 bytes at offset 0"),
        "{out}"
    );
    assert!(
        out.contains("read 1048576/1048576 bytes at offset 0"),
        "{out}"
    );
    assert!(out.contains("00000000:  77 77 77 77"), "{out}");
    let (code, _, err) =
        run(bin()
            .arg("io")
            .args(&t)
            .args(["-c", "open /q", "-c", "pwrite -q 4 0 4k"]));
    assert_eq!(code, 1);
    assert!(
        err.contains("-q needs a file opened with 'open -d'"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// The value of `"key":` in a flat JSON text (the first occurrence), as text.
fn json_field<'a>(j: &'a str, key: &str) -> &'a str {
    let at = j
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {j}"))
        + key.len()
        + 3;
    let rest = &j[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    &rest[..end]
}

/// `bench -w meta` at a tiny size, so the workload cannot rot: every phase runs, the
/// crash finds the journal at its limit and is recovered by replaying it (with an
/// in-core inode bound small enough that, before the crash phase had its own, a
/// change applied the queue and checkpointed at half the journal), the plot is drawn; a run past version 1's
/// checkpoint-area limit creates every file; and a run that fills the data area stops
/// with the count reached instead of failing.
#[test]
fn bench_meta_runs_and_reports_enospc() {
    let d = dir("bench-meta");
    let svg = d.join("p.svg");
    let (code, out, err) = run(bin()
        .args(["bench", "-w", "meta", "--files", "2000", "--dirs", "10"])
        .args([
            "--target-size",
            "32m",
            "--inode-cache",
            "256",
            "--json",
            "--dir",
        ])
        .arg(&d)
        .arg("--plot")
        .arg(&svg));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_field(&out, "files_created"), "2000", "{out}");
    assert_eq!(json_field(&out, "enospc"), "null", "{out}");
    assert_eq!(json_field(&out, "count"), "2", "two timed fsyncs: {out}");
    assert_eq!(
        out.matches("\"files\":").count(),
        1 + 10,
        "ten steps: {out}"
    );
    let crash = &out[out.find("\"mount_crash\"").unwrap()..];
    let replayed: u64 = json_field(crash, "replayed_txns").parse().unwrap();
    assert!(replayed > 0, "the crash left transactions to replay: {out}");
    let fill: f64 = json_field(crash, "journal_fill").parse().unwrap();
    assert!(
        (0.5..0.75).contains(&fill),
        "journal fill {fill}, not at its limit (75%): {out}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(plot.matches("<circle").count(), 2 + 1, "{plot}");
    assert!(!d.join("meta-t0").exists(), "targets removed");

    // 8 MiB targets: version 1's 256 KiB checkpoint area held about 1,500 empty files;
    // metadata pages share the data area now, so 4,000 fit.
    let (code, out, err) = run(bin()
        .args(["bench", "-w", "meta", "--files", "4000", "--dirs", "10"])
        .args(["--target-size", "8m", "--json", "--dir"])
        .arg(&d));
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_field(&out, "files_created"), "4000", "{out}");
    assert_eq!(json_field(&out, "enospc"), "null", "{out}");
    // 16 KiB files fill the data area first: the creates stop at ENOSPC with the count.
    let (code, out, err) = run(bin()
        .args(["bench", "-w", "meta", "--files", "4000", "--dirs", "10"])
        .args([
            "--file-size",
            "16k",
            "--target-size",
            "8m",
            "--json",
            "--dir",
        ])
        .arg(&d));
    assert_eq!(code, 0, "{out}{err}");
    let created: u64 = json_field(&out, "files_created").parse().unwrap();
    assert!((500..4000).contains(&created), "{out}");
    assert!(json_field(&out, "enospc").contains("is full"), "{out}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn chattr_and_lsattr_in_io() {
    let d = dir("chattr");
    let t = targets(&d, 2);
    let (code, out, err) = run(bin().args(["mkfs", "--size", "32m"]).args(&t));
    assert_eq!(code, 0, "{out}{err}");
    // datacow=off (default): a new file is NOCOW; -C takes while it is empty.
    let (code, out, err) = run(bin().arg("io").args(&t).args([
        "-c",
        "open -f /a",
        "-c",
        "lsattr",
        "-c",
        "chattr -C",
        "-c",
        "lsattr /a",
        "-c",
        "pwrite 0 4k",
        "-c",
        "chattr +C",
        "-c",
        "lsattr",
        "-c",
        "mkdir /d",
        "-c",
        "chattr +C /d",
        "-c",
        "lsattr /d",
        "-c",
        "chattr +i /d",
    ]));
    assert_eq!(code, 1, "chattr +i fails: {out}{err}");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.ends_with("/a") || l.ends_with("/d"))
        .collect();
    assert_eq!(
        lines,
        [
            "---------------C------ /a",
            "---------------------- /a",
            "---------------------- /a",
            "---------------C------ /d",
        ],
        "{out}"
    );
    assert!(err.contains("attribute 'i' is not supported"), "{err}");
    // datacow=on: a new file in the NOCOW directory inherits it, one in / does not.
    let (code, out, err) = run(bin().arg("io").args(&t).args([
        "-o",
        "datacow=on",
        "-c",
        "open -f /d/f",
        "-c",
        "lsattr",
        "-c",
        "open -f /g",
        "-c",
        "lsattr",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("---------------C------ /d/f"), "{out}");
    assert!(out.contains("---------------------- /g"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `stripefs scrub`: a clean file system scrubs clean (exit 0) with every checksummed
/// block counted; a byte flipped in a copy-on-write file's block on its target image is
/// reported by inode, file offset, target and block (exit 1); a NOCOW file's blocks are
/// not counted (no checksum); a mount point is refused (online scrub is absent).
#[test]
fn scrub_reports_a_damaged_block_by_file_and_offset() {
    let d = dir("scrub");
    let t = targets(&d, 2);
    let (code, out, err) = run(bin().args(["mkfs", "--size", "32m"]).args(&t));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(bin().arg("io").args(&t).args([
        "-o",
        "datacow=on",
        "-c",
        "open -f /c",
        "-c",
        "pwrite -S 0x63 0 512k",
        "-c",
        "fsync",
        "-c",
        "stat",
        "-c",
        "open -f /n",
        "-c",
        "chattr +C",
        "-c",
        "pwrite -S 0x6e 0 64k",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let ino = out
        .lines()
        .find_map(|l| l.strip_prefix("stat.ino = "))
        .expect("stat.ino")
        .trim()
        .parse::<u64>()
        .unwrap();
    let (code, out, err) = run(bin().arg("scrub").args(&t));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("128 checksummed blocks (524288 bytes) verified: clean"),
        "{out}"
    );
    // /c's first mapped range, from bmap: " 0: [0..N]: target T [A..B]" (512-byte units).
    let (code, out, err) = run(bin()
        .arg("io")
        .args(&t)
        .args(["-c", "open /c", "-c", "bmap"]));
    assert_eq!(code, 0, "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(" 0: [0.."))
        .expect("bmap");
    let tgt: usize = line.split("target ").nth(1).unwrap()[..1].parse().unwrap();
    let sector: u64 = line
        .rsplit('[')
        .next()
        .unwrap()
        .split("..")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Its second block (file offset 4096).
    let at = (sector * 512 + 4096 + 100) as usize;
    let mut img = std::fs::read(&t[tgt]).unwrap();
    img[at] ^= 0x10;
    std::fs::write(&t[tgt], &img).unwrap();
    let (code, out, err) = run(bin().arg("scrub").args(&t));
    assert_eq!(code, 1, "{out}{err}");
    let want = format!(
        "mismatch: inode {ino} offset 4096 (target {tgt} block {})",
        (sector * 512 + 4096) / 4096
    );
    assert!(out.contains(&want), "{want} in {out}");
    assert!(out.contains("verified: 1 mismatches"), "{out}");
    assert_eq!(out.matches("mismatch:").count(), 1, "{out}");
    // A directory that is not a stripefs mount's root: the ioctl is refused.
    let (code, _, err) = run(bin().arg("scrub").arg(&d));
    assert_eq!(code, 8);
    assert!(err.contains("not the root of a stripefs mount"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

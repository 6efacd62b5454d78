//! Direct-I/O benchmarks: `w1-unaligned-dio` and `w3-striped-dio` (see `bench.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stripefs::UnalignedPolicy;
use stripefs::{CreateParams, DioSubmit, Fs, Ino, OpenMode, StripeLayout};
use stripefs_target::{Batch, IoBuf, IoOp, Rng, Target};

use crate::bench::{cleanup, make_fs, median, mount, quiet_with, Output};
use crate::io::Dir;
use crate::targets::open_one;

const W1_FILE: u64 = 1 << 30;
const W1_DEPTH: usize = 64;
const W1_SECS: f64 = 2.0;

/// Creates the benchmark file over all targets and writes it whole.
fn prewrite(fs: &Fs, name: &str, count: u32, bytes: u64) -> Result<Ino, String> {
    let layout = StripeLayout {
        count,
        unit_bytes: STRIPE_UNIT as u32,
        first_target: 0,
    };
    let f = fs
        .create(
            Ino::ROOT,
            name.as_ref(),
            CreateParams {
                layout: Some(layout),
                ..CreateParams::with_perm(0o644)
            },
        )
        .map_err(|e| e.to_string())?;
    let file = fs
        .open_file_with(f.ino, OpenMode::Direct)
        .map_err(|e| e.to_string())?;
    let chunk = vec![0x5au8; 16 << 20];
    for off in (0..bytes).step_by(chunk.len()) {
        file.write_at(
            off,
            &chunk[..(bytes - off).min(chunk.len() as u64) as usize],
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(f.ino)
}

/// `jobs` threads, each keeping `W1_DEPTH` random `io`-byte direct overwrites in flight for
/// `W1_SECS`; returns IOPS.
fn w1_fs(fs: &Fs, ino: Ino, io: u64, jobs: usize, seed: u64) -> Result<f64, String> {
    let count = AtomicU64::new(0);
    let t = Instant::now();
    let deadline = t + Duration::from_secs_f64(W1_SECS);
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = (0..jobs)
            .map(|j| {
                let (fs, count) = (fs.clone(), &count);
                s.spawn(move || -> Result<(), String> {
                    let file = fs
                        .open_file_with(ino, OpenMode::Direct)
                        .map_err(|e| e.to_string())?;
                    let q = fs.dio_queue();
                    let mut rng = Rng::new(seed * 977 + j as u64);
                    let buf = vec![0xa5u8; io as usize];
                    while Instant::now() < deadline {
                        while q.in_flight() < W1_DEPTH {
                            let off = rng.below(W1_FILE / io) * io;
                            q.submit_write(0, file.fh(), off, &buf)
                                .map_err(|e| e.to_string())?;
                        }
                        for c in q.reap(1) {
                            c.result.map_err(|e| e.to_string())?;
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    q.reap(q.in_flight());
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "job panicked".to_string())??;
        }
        Ok(())
    })?;
    Ok(count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

/// The raw backing files driven the same way: `jobs` x depth random `io`-byte `O_DIRECT`
/// writes over the files' data areas.
fn w1_raw(paths: &[PathBuf], io: u64, jobs: usize, seed: u64) -> Result<f64, String> {
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|p| open_one(p, None))
        .collect::<Result<_, _>>()?;
    let per = W1_FILE / targets.len() as u64;
    let count = AtomicU64::new(0);
    let t = Instant::now();
    let deadline = t + Duration::from_secs_f64(W1_SECS);
    std::thread::scope(|s| {
        for j in 0..jobs {
            let (targets, count) = (&targets, &count);
            s.spawn(move || {
                let mut rng = Rng::new(seed * 31 + j as u64);
                let in_flight =
                    Arc::new((parking_lot::Mutex::new(0usize), parking_lot::Condvar::new()));
                while Instant::now() < deadline {
                    let mut n = in_flight.0.lock();
                    while *n >= W1_DEPTH {
                        in_flight.1.wait(&mut n);
                    }
                    *n += 1;
                    drop(n);
                    let tgt = &targets[rng.below(targets.len() as u64) as usize];
                    let off = (1 << 20) + rng.below(per / io) * io;
                    let flight = Arc::clone(&in_flight);
                    tgt.submit(
                        IoOp::Write {
                            offset: off,
                            bufs: vec![IoBuf::zeroed(io as usize)],
                        },
                        Box::new(move |_| {
                            *flight.0.lock() -= 1;
                            flight.1.notify_one();
                        }),
                    );
                    count.fetch_add(1, Ordering::Relaxed);
                }
                let mut n = in_flight.0.lock();
                while *n > 0 {
                    in_flight.1.wait(&mut n);
                }
            });
        }
    });
    Ok(count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

pub(crate) fn w1(
    dir: &Path,
    runs: usize,
    jobs: usize,
    datacow: stripefs::DataCow,
    output: Output,
) -> Result<String, String> {
    let paths = make_fs(dir, 4, (W1_FILE / 4) + (64 << 20))?;
    let ino = {
        let fs = mount(&paths, quiet_with(datacow))?;
        let ino = prewrite(&fs, "dio", 4, W1_FILE)?;
        fs.unmount().map_err(|e| e.to_string())?;
        ino
    };
    let mut rows = Vec::new();
    for io in [2048u64, 4096] {
        let (mut shared, mut excl) = (Vec::new(), Vec::new());
        for run in 0..runs {
            for (policy, out) in [
                (UnalignedPolicy::Shared, &mut shared),
                (UnalignedPolicy::Exclusive, &mut excl),
            ] {
                let mut o = quiet_with(datacow);
                o.dio_unaligned = policy;
                let fs = mount(&paths, o)?;
                out.push(w1_fs(&fs, ino, io, jobs, run as u64 + 1)?);
                fs.unmount().map_err(|e| e.to_string())?;
            }
        }
        rows.push((io, median(shared), median(excl)));
    }
    // The raw backing files last: they overwrite the file system.
    let raw: Vec<(u64, f64)> = [2048u64, 4096]
        .iter()
        .map(|&io| {
            Ok((
                io,
                median(
                    (0..runs)
                        .map(|r| w1_raw(&paths, io, jobs, r as u64 + 1))
                        .collect::<Result<Vec<_>, String>>()?,
                ),
            ))
        })
        .collect::<Result<_, String>>()?;
    cleanup(&paths);
    if output == Output::Table {
        println!("\nw1-unaligned-dio: prewritten 1 GiB {} file on 4 KiB blocks over 4 targets, random direct overwrites, {jobs} jobs x queue depth {W1_DEPTH}, {W1_SECS} s per measurement, median of {runs} runs", cow_label(datacow));
        println!("| size | IOPS dio_unaligned=shared | IOPS dio_unaligned=exclusive | shared/exclusive | raw backing files IOPS | shared/raw |");
        println!("|---|---|---|---|---|---|");
        for ((io, sh, ex), (_, rw)) in rows.iter().zip(&raw) {
            println!(
                "| {} KiB | {sh:.0} | {ex:.0} | {:.1}x | {rw:.0} | {:.2} |",
                io / 1024,
                sh / ex,
                sh / rw
            );
        }
        println!("2 KiB shared / 4 KiB shared: {:.2}", rows[0].1 / rows[1].1);
    }
    Ok(format!(
        "{{\"workload\":\"w1-unaligned-dio\",\"datacow\":{},\"jobs\":{jobs},\"depth\":{W1_DEPTH},\"runs\":{runs},\"rows\":[{}]}}",
        datacow == stripefs::DataCow::On,
        rows.iter()
            .zip(&raw)
            .map(|((io, sh, ex), (_, rw))| format!("{{\"size\":{io},\"shared_iops\":{sh:.0},\"exclusive_iops\":{ex:.0},\"raw_iops\":{rw:.0}}}"))
            .collect::<Vec<_>>()
            .join(",")
    ))
}

/// How the tables name the benchmark file's kind.
fn cow_label(datacow: stripefs::DataCow) -> &'static str {
    match datacow {
        stripefs::DataCow::On => "copy-on-write (datacow=on)",
        stripefs::DataCow::Off => "NOCOW",
    }
}

const W3_REGION: u64 = 128 << 20;
/// The stripe unit of the benchmark file.
const STRIPE_UNIT: u64 = 1 << 20;

/// MiB/s of synchronous direct I/O of `io` bytes covering `W3_REGION`, after one untimed
/// operation: a fresh mount's bounce-buffer pool is empty, and allocating (page-faulting)
/// 64 MiB of buffers inside a region of only two 64 MiB operations would measure the
/// allocator, not the steady state of a mounted file system.
fn w3_fs(fs: &Fs, ino: Ino, io: u64, dir: Dir) -> Result<f64, String> {
    let file = fs
        .open_file_with(ino, OpenMode::Direct)
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0x3cu8; io as usize];
    let mut one = |off: u64| {
        if dir == Dir::Write {
            file.write_at(off, &buf).map(|_| ())
        } else {
            file.read_at(off, &mut buf).map(|_| ())
        }
        .map_err(|e| e.to_string())
    };
    one(0)?;
    let t = Instant::now();
    for off in (0..W3_REGION).step_by(io as usize) {
        one(off)?;
    }
    Ok(W3_REGION as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64())
}

/// The raw targets: each `io`-byte operation cut into the pieces striping makes (split at
/// 1 MiB stripe-unit boundaries, unit `u` on target `u % n`, a target's units adjacent on
/// it), all submitted, one wait; one untimed operation first, as for the file system.
/// Buffers are allocated once per piece size and hold non-zero bytes, so that the
/// comparison is with the file system's pooled buffers and an NBD target sends real
/// writes (an all-zero write would go as `WRITE_ZEROES`, without payload).
fn w3_raw(paths: &[PathBuf], io: u64, dir: Dir) -> Result<f64, String> {
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|p| open_one(p, None))
        .collect::<Result<_, _>>()?;
    let n = targets.len();
    let mut idle: HashMap<usize, Vec<IoBuf>> = HashMap::new();
    let mut one = |file_off: u64| -> Result<(), String> {
        let batch = Batch::new();
        for p in raw_pieces(file_off, io, n) {
            let buf = idle.get_mut(&p.len).and_then(Vec::pop);
            let bufs = vec![buf.unwrap_or_else(|| {
                let mut b = IoBuf::zeroed(p.len);
                b.fill(0x3c);
                b
            })];
            let offset = p.offset;
            let op = if dir == Dir::Write {
                IoOp::Write { offset, bufs }
            } else {
                IoOp::Read { offset, bufs }
            };
            batch.submit(targets[p.target].as_ref(), op);
        }
        for d in batch.wait() {
            d.result.map_err(|e| e.to_string())?;
            for b in d.bufs {
                idle.entry(b.len()).or_default().push(b);
            }
        }
        Ok(())
    };
    one(0)?;
    let t = Instant::now();
    for off in (0..W3_REGION).step_by(io as usize) {
        one(off)?;
    }
    Ok(W3_REGION as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64())
}

/// `io` in MiB when whole, else in KiB (sizes are multiples of 4 KiB).
fn size_label(io: u64) -> String {
    if io.is_multiple_of(1 << 20) {
        format!("{} MiB", io >> 20)
    } else {
        format!("{} KiB", io >> 10)
    }
}

/// One raw request: `len` bytes at `offset` of target `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawPiece {
    target: usize,
    offset: u64,
    len: usize,
}

/// The pieces striping makes of `io` bytes at file offset `file_off` over `n` targets:
/// split at stripe-unit boundaries, unit `u` on target `u % n` at unit `u / n` of that
/// target's span (`W3_REGION / n` rounded down to whole units, wrapping), which starts at
/// 1 MiB, past the superblock.
fn raw_pieces(file_off: u64, io: u64, n: usize) -> Vec<RawPiece> {
    let n = n as u64;
    let span = (W3_REGION / n / STRIPE_UNIT).max(1) * STRIPE_UNIT;
    let mut out = Vec::new();
    let mut pos = file_off;
    while pos < file_off + io {
        let len = (STRIPE_UNIT - pos % STRIPE_UNIT).min(file_off + io - pos);
        let u = pos / STRIPE_UNIT;
        out.push(RawPiece {
            target: (u % n) as usize,
            offset: (1 << 20) + (u / n * STRIPE_UNIT) % span + pos % STRIPE_UNIT,
            len: len as usize,
        });
        pos += len;
    }
    out
}

/// What `w3-striped-dio` runs on.
#[derive(Debug, Clone)]
pub(crate) struct W3Params {
    /// Given targets (paths or NBD URIs); empty: files created in the bench directory.
    pub targets: Vec<PathBuf>,
    /// Target counts, one block of rows each.
    pub counts: Vec<usize>,
    /// Synchronous I/O sizes.
    pub sizes: Vec<u64>,
    /// Whether the benchmark's files are copy on write (`--datacow`).
    pub datacow: stripefs::DataCow,
}

/// The first `n` given targets with a fresh file system on them (not pre-zeroed, never
/// removed afterwards), or `n` new files in `dir`.
fn w3_targets(dir: &Path, p: &W3Params, n: usize) -> Result<Vec<PathBuf>, String> {
    if p.targets.is_empty() {
        return make_fs(dir, n, W3_REGION / n as u64 + (48 << 20));
    }
    let paths = p.targets[..n].to_vec();
    let targets: Vec<Arc<dyn Target>> = paths
        .iter()
        .map(|t| open_one(t, None))
        .collect::<Result<_, _>>()?;
    stripefs::Fs::mkfs(&targets, &stripefs::MkfsOptions::default()).map_err(|e| e.to_string())?;
    Ok(paths)
}

pub(crate) fn w3(dir: &Path, p: &W3Params, runs: usize, output: Output) -> Result<String, String> {
    let mut rows = Vec::new();
    let mut raws: Vec<f64> = Vec::new();
    for &targets in &p.counts {
        let paths = w3_targets(dir, p, targets)?;
        let ino = {
            let fs = mount(&paths, quiet_with(p.datacow))?;
            let ino = prewrite(&fs, "striped", targets as u32, W3_REGION)?;
            fs.unmount().map_err(|e| e.to_string())?;
            ino
        };
        for &io in &p.sizes {
            for dir in [Dir::Write, Dir::Read] {
                let (mut par, mut ser) = (Vec::new(), Vec::new());
                for _ in 0..runs {
                    for (mode, out) in [
                        (DioSubmit::Parallel, &mut par),
                        (DioSubmit::Serial, &mut ser),
                    ] {
                        let mut o = quiet_with(p.datacow);
                        o.dio_submit = mode;
                        let fs = mount(&paths, o)?;
                        out.push(w3_fs(&fs, ino, io, dir)?);
                        fs.unmount().map_err(|e| e.to_string())?;
                    }
                }
                rows.push((targets, io, dir, median(par), median(ser)));
            }
        }
        // The raw targets last: they overwrite the file system's data.
        for &io in &p.sizes {
            for dir in [Dir::Write, Dir::Read] {
                raws.push(median(
                    (0..runs)
                        .map(|_| w3_raw(&paths, io, dir))
                        .collect::<Result<Vec<_>, String>>()?,
                ));
            }
        }
        if p.targets.is_empty() {
            cleanup(&paths);
        }
    }
    if output == Output::Table {
        let on = if p.targets.is_empty() {
            "target files".to_string()
        } else {
            format!("of the given targets ({}, ...)", p.targets[0].display())
        };
        println!("\nw3-striped-dio: synchronous direct I/O over a 128 MiB region of a {} file striped over N {on} (1 MiB stripe unit), MiB/s, median of {runs} runs", cow_label(p.datacow));
        println!(
            "| targets | size | op | parallel | serial | parallel/serial | raw | parallel/raw |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for ((t, io, w, p, s), raw) in rows.iter().zip(&raws) {
            println!(
                "| {t} | {} | {} | {p:.0} | {s:.0} | {:.2}x | {raw:.0} | {:.2} |",
                size_label(*io),
                w.name(),
                p / s,
                p / raw
            );
        }
    }
    Ok(format!(
        "{{\"workload\":\"w3-striped-dio\",\"datacow\":{},\"runs\":{runs},\"rows\":[{}]}}",
        p.datacow == stripefs::DataCow::On,
        rows.iter()
            .zip(&raws)
            .map(|((t, io, w, p, s), raw)| format!("{{\"targets\":{t},\"size\":{io},\"op\":\"{}\",\"parallel\":{p:.0},\"serial\":{s:.0},\"raw\":{raw:.0}}}", w.name()))
            .collect::<Vec<_>>()
            .join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw pieces cover the operation exactly, each inside one stripe unit, on the
    /// target striping puts it, past the superblock and within the target's span, and
    /// no two pieces of one operation overlap on a target.
    #[test]
    fn sizes_are_labelled_exactly() {
        assert_eq!(size_label(64 << 20), "64 MiB");
        assert_eq!(size_label(3 << 19), "1536 KiB");
        assert_eq!(size_label(4096), "4 KiB");
    }

    #[test]
    fn raw_pieces_are_the_stripe_pieces_within_each_span() {
        for n in [1usize, 2, 3, 8] {
            let span = (W3_REGION / n as u64 / STRIPE_UNIT).max(1) * STRIPE_UNIT;
            for io in [4096u64, 1 << 20, 3 << 19, 16 << 20, 64 << 20] {
                for file_off in (0..W3_REGION).step_by(io as usize).take(40) {
                    let ps = raw_pieces(file_off, io, n);
                    assert_eq!(ps.iter().map(|p| p.len as u64).sum::<u64>(), io);
                    let mut pos = file_off;
                    let mut used: Vec<(usize, u64, u64)> = Vec::new();
                    for p in &ps {
                        assert_eq!(p.target, (pos / STRIPE_UNIT) as usize % n);
                        assert_eq!(p.offset % STRIPE_UNIT, pos % STRIPE_UNIT);
                        assert!(pos % STRIPE_UNIT + p.len as u64 <= STRIPE_UNIT);
                        assert!(p.offset >= 1 << 20);
                        assert!(p.offset + p.len as u64 <= (1 << 20) + span);
                        let (a, b) = (p.offset, p.offset + p.len as u64);
                        if io.div_ceil(n as u64) + STRIPE_UNIT <= span {
                            assert!(
                                used.iter()
                                    .all(|&(t, c, d)| t != p.target || b <= c || d <= a),
                                "n={n} io={io} off={file_off}: overlap on target {}",
                                p.target
                            );
                        }
                        used.push((p.target, a, b));
                        pos += p.len as u64;
                    }
                }
            }
        }
    }
}

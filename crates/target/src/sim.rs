//! `SimTarget`: an in-memory target with crash semantics, for deterministic tests.
//!
//! It keeps two images. Writes land in the *live* image and in a list of unflushed writes; a
//! flush applies that list to the *durable* image. [`SimTarget::crash`] throws the live
//! image away and restarts from the durable one, optionally keeping a seeded subset of the
//! unflushed writes, each possibly torn at a sector boundary: the media model is "a write
//! not yet flushed may be lost, partly applied at sector granularity, or reordered with
//! other unflushed writes; a completed flush makes every earlier completed write durable;
//! a completed FUA write ([`IoOp::WriteFua`]) is durable itself, and only itself". A FUA
//! write also replaces, in the cache, the unflushed bytes it overwrites: a crash never
//! brings an older cached write back over it.
//! Operations complete synchronously inside `submit`, so runs are deterministic.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::fault::{FaultInjector, FaultKind, FaultPoint};
use crate::{fail_now, validate, Completion, IoDone, IoOp, Rng, Target, TargetError, TargetInfo};
use crate::{FuaSupport, OpCounts, OpKind, TargetErrorKind};

/// What a crash keeps of the writes that were not flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Lose every unflushed write.
    DropUnflushed,
    /// Keep every unflushed write (as if the cache had been written out).
    KeepUnflushed,
    /// Keep each unflushed write with probability 1/2, in a shuffled order, and tear each
    /// kept write after a random number of sectors with probability 1/4; seeded.
    Tear { seed: u64 },
}

/// Counters of what reached the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// FUA writes (also counted in `writes` and `write_bytes`).
    pub fua_writes: u64,
    pub flushes: u64,
    pub discards: u64,
}

#[derive(Debug)]
struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    unflushed: Vec<(u64, Vec<u8>)>,
    stats: SimStats,
}

/// An in-memory target; see the module documentation for the media model.
#[derive(Debug)]
pub struct SimTarget {
    info: TargetInfo,
    index: u32,
    state: Mutex<State>,
    faults: Option<Arc<FaultInjector>>,
}

impl SimTarget {
    /// A zero-filled target of `size_bytes` with the given logical sector size.
    ///
    /// # Panics
    /// Panics unless `size_bytes` is a multiple of `sector_size`.
    #[must_use]
    pub fn new(name: &str, size_bytes: u64, sector_size: u32) -> Self {
        let len = usize::try_from(size_bytes).expect("sim target fits in memory");
        Self::from_image(name, vec![0; len], sector_size)
    }

    /// A target whose live and durable images are both `image`.
    ///
    /// # Panics
    /// Panics unless the image length is a multiple of `sector_size`.
    #[must_use]
    pub fn from_image(name: &str, image: Vec<u8>, sector_size: u32) -> Self {
        assert_eq!(
            image.len() % sector_size as usize,
            0,
            "image is whole sectors"
        );
        let info = TargetInfo {
            name: Arc::from(name),
            size_bytes: image.len() as u64,
            sector_size,
            fua: FuaSupport::Native,
        };
        let state = State {
            live: image.clone(),
            durable: image,
            unflushed: Vec::new(),
            stats: SimStats::default(),
        };
        Self {
            info,
            index: 0,
            state: Mutex::new(state),
            faults: None,
        }
    }

    /// Routes this target's reads, writes and flushes through `faults` as points
    /// `TargetRead(index)` etc.
    #[must_use]
    pub fn with_faults(mut self, index: u32, faults: Arc<FaultInjector>) -> Self {
        self.index = index;
        self.faults = Some(faults);
        self
    }

    /// Simulates power loss: the live image becomes the durable image plus whatever `mode`
    /// keeps of the unflushed writes. The target stays usable (as after a reboot).
    pub fn crash(&self, mode: CrashMode) {
        let mut st = self.state.lock();
        let unflushed = std::mem::take(&mut st.unflushed);
        let mut image = st.durable.clone();
        apply_unflushed(&mut image, unflushed, mode, self.info.sector_size as usize);
        st.durable.clone_from(&image);
        st.live = image;
    }

    /// A copy of the live image.
    #[must_use]
    pub fn live_image(&self) -> Vec<u8> {
        self.state.lock().live.clone()
    }

    /// A copy of the durable image.
    #[must_use]
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// XORs `mask` into the byte at `offset` in both images (bit-rot / corruption tests).
    pub fn corrupt(&self, offset: u64, mask: u8) {
        let mut st = self.state.lock();
        let at = usize::try_from(offset).expect("offset fits");
        st.live[at] ^= mask;
        st.durable[at] ^= mask;
    }

    /// Counters so far.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        self.state.lock().stats
    }

    fn injected(&self, op: &IoOp) -> Option<TargetError> {
        let faults = self.faults.as_ref()?;
        let point = match op.kind() {
            OpKind::Read => FaultPoint::TargetRead(self.index),
            OpKind::Write | OpKind::Discard => FaultPoint::TargetWrite(self.index),
            OpKind::Flush => FaultPoint::TargetFlush(self.index),
            OpKind::Open => return None,
        };
        let kind = match faults.check(point)? {
            FaultKind::Eio => TargetErrorKind::Os(libc::EIO),
            FaultKind::Enospc => TargetErrorKind::NoSpace,
            FaultKind::Eagain => TargetErrorKind::Os(libc::EAGAIN),
        };
        Some(TargetError::new(
            self.info.name.clone(),
            op.kind(),
            op.offset(),
            kind,
        ))
    }

    fn execute(&self, op: &mut IoOp) {
        let mut st = self.state.lock();
        match op {
            IoOp::Read { offset, bufs } => {
                let mut at = to_usize(*offset);
                for b in bufs.iter_mut() {
                    let n = b.len();
                    b.copy_from_slice(&st.live[at..at + n]);
                    at += n;
                    st.stats.read_bytes += n as u64;
                }
                st.stats.reads += 1;
            }
            IoOp::Write { offset, bufs } => {
                let mut at = to_usize(*offset);
                for b in bufs.iter() {
                    st.live[at..at + b.len()].copy_from_slice(b);
                    st.unflushed.push((at as u64, b.to_vec()));
                    at += b.len();
                    st.stats.write_bytes += b.len() as u64;
                }
                st.stats.writes += 1;
            }
            IoOp::WriteFua { offset, bufs } => {
                let mut at = to_usize(*offset);
                for b in bufs.iter() {
                    let end = at + b.len();
                    st.live[at..end].copy_from_slice(b);
                    st.durable[at..end].copy_from_slice(b);
                    forget_unflushed(&mut st.unflushed, at as u64, end as u64);
                    at = end;
                    st.stats.write_bytes += b.len() as u64;
                }
                st.stats.writes += 1;
                st.stats.fua_writes += 1;
            }
            IoOp::Flush => {
                let pending = std::mem::take(&mut st.unflushed);
                for (off, data) in pending {
                    let at = to_usize(off);
                    st.durable[at..at + data.len()].copy_from_slice(&data);
                }
                st.stats.flushes += 1;
            }
            // Discard keeps the old bytes: "may read back as anything" includes unchanged.
            IoOp::Discard { .. } => st.stats.discards += 1,
        }
    }
}

/// Removes `[start, end)` from the unflushed writes (a FUA write replaced those bytes in
/// the cache), keeping the parts of each write outside the range.
fn forget_unflushed(unflushed: &mut Vec<(u64, Vec<u8>)>, start: u64, end: u64) {
    let old = std::mem::take(unflushed);
    for (off, data) in old {
        let stop = off + data.len() as u64;
        if stop <= start || off >= end {
            unflushed.push((off, data));
            continue;
        }
        if off < start {
            unflushed.push((off, data[..to_usize(start - off)].to_vec()));
        }
        if stop > end {
            unflushed.push((end, data[to_usize(end - off)..].to_vec()));
        }
    }
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).expect("sim offsets fit in usize")
}

fn apply_unflushed(
    image: &mut [u8],
    mut writes: Vec<(u64, Vec<u8>)>,
    mode: CrashMode,
    sector: usize,
) {
    match mode {
        CrashMode::DropUnflushed => {}
        CrashMode::KeepUnflushed => {
            for (off, data) in writes {
                let at = to_usize(off);
                image[at..at + data.len()].copy_from_slice(&data);
            }
        }
        CrashMode::Tear { seed } => {
            let mut rng = Rng::new(seed);
            // Fisher-Yates shuffle: unflushed writes may reach the media in any order.
            for i in (1..writes.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                writes.swap(i, j);
            }
            for (off, data) in writes {
                if rng.one_in(2) {
                    continue;
                }
                let sectors = data.len() / sector;
                let keep = if rng.one_in(4) {
                    rng.below(sectors as u64 + 1) as usize
                } else {
                    sectors
                };
                let at = to_usize(off);
                image[at..at + keep * sector].copy_from_slice(&data[..keep * sector]);
            }
        }
    }
}

impl Target for SimTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn submit(&self, mut op: IoOp, done: Completion) {
        if let Err(e) = validate(&self.info, &op) {
            return fail_now(op, done, e);
        }
        if let Some(e) = self.injected(&op) {
            return fail_now(op, done, e);
        }
        self.execute(&mut op);
        done(IoDone {
            bufs: op.into_bufs(),
            result: Ok(()),
        });
    }

    fn op_counts(&self) -> Option<OpCounts> {
        let s = self.stats();
        Some(OpCounts {
            reads: s.reads,
            writes: s.writes - s.fua_writes,
            fua_writes: s.fua_writes,
            flushes: s.flushes,
            discards: s.discards,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;

    #[test]
    fn crash_keeps_only_flushed_writes() {
        let t = SimTarget::new("t", 8192, 512);
        t.write_sync(0, IoBuf::from_slice(&[1u8; 512])).unwrap();
        t.flush_sync().unwrap();
        t.write_sync(512, IoBuf::from_slice(&[2u8; 512])).unwrap();
        assert_eq!(t.read_sync(512, 512).unwrap()[0], 2);
        t.crash(CrashMode::DropUnflushed);
        assert_eq!(t.read_sync(0, 512).unwrap()[0], 1);
        assert_eq!(t.read_sync(512, 512).unwrap()[0], 0);
    }

    #[test]
    fn fua_write_is_durable_without_a_flush() {
        let t = SimTarget::new("t", 8192, 512);
        t.write_sync(0, IoBuf::from_slice(&[1u8; 1536])).unwrap();
        t.write_fua_sync(512, IoBuf::from_slice(&[2u8; 512]))
            .unwrap();
        // Keeping every unflushed write must not bring the older cached bytes back over
        // the FUA write; dropping them must not take the FUA write away.
        t.crash(CrashMode::KeepUnflushed);
        let img = t.live_image();
        assert_eq!((img[0], img[512], img[1024]), (1, 2, 1));
        t.write_sync(0, IoBuf::from_slice(&[3u8; 1536])).unwrap();
        t.write_fua_sync(512, IoBuf::from_slice(&[4u8; 512]))
            .unwrap();
        t.crash(CrashMode::DropUnflushed);
        let img = t.live_image();
        assert_eq!((img[0], img[512], img[1024]), (1, 4, 1));
        let c = t.op_counts().unwrap();
        assert_eq!((c.writes, c.fua_writes, c.flushes), (2, 2, 0));
    }

    #[test]
    fn misaligned_and_out_of_range_are_rejected() {
        let t = SimTarget::new("t", 4096, 512);
        let e = t.write_sync(100, IoBuf::zeroed(512)).unwrap_err();
        assert!(matches!(e.kind, TargetErrorKind::Misaligned { .. }));
        let e = t.write_sync(4096, IoBuf::zeroed(512)).unwrap_err();
        assert!(matches!(e.kind, TargetErrorKind::OutOfRange { .. }));
    }

    #[test]
    fn tear_is_reproducible_from_the_seed() {
        let run = |seed| {
            let t = SimTarget::new("t", 64 * 512, 512);
            for i in 0..16u8 {
                t.write_sync(u64::from(i) * 1024, IoBuf::from_slice(&[i + 1; 1024]))
                    .unwrap();
            }
            t.crash(CrashMode::Tear { seed });
            t.live_image()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}

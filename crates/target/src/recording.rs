//! `RecordingTarget`: logs every completed write, FUA write and flush (across all targets of
//! a file system, in one global order) so that a crash test can rebuild what each target
//! would hold if power failed at any chosen point. The media model is [`crate::SimTarget`]'s:
//! a flush makes the target's earlier completed writes durable, a FUA write is durable at
//! completion (and replaces the cached bytes it overwrote), anything else may be lost,
//! torn or reordered.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Completion, IoDone, IoOp, OpCounts, Rng, Target, TargetInfo};

/// One logged event.
#[derive(Debug, Clone)]
pub enum Event {
    /// A completed write of `data` at `offset` on target `target`.
    Write {
        target: u32,
        offset: u64,
        data: Arc<[u8]>,
    },
    /// A completed forced-unit-access write: durable from here on.
    FuaWrite {
        target: u32,
        offset: u64,
        data: Arc<[u8]>,
    },
    /// A completed flush of target `target`.
    Flush { target: u32 },
    /// A marker the test inserted (for instance "fsync of file 3 returned").
    Mark(u64),
}

/// What a rebuilt image keeps of writes that no flush covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnflushedPolicy {
    /// Drop all of them.
    Drop,
    /// Keep each with probability 1/2 and tear kept ones at a sector boundary with
    /// probability 1/4, seeded.
    Tear { seed: u64 },
}

/// The shared event log.
#[derive(Debug, Default)]
pub struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    /// An empty log.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Appends an event observed elsewhere (for instance by a proxy in front of a network
    /// server, which sees completions on the wire rather than through a [`Target`]).
    pub fn push(&self, e: Event) {
        self.events.lock().push(e);
    }

    /// Appends a test marker.
    pub fn mark(&self, tag: u64) {
        self.events.lock().push(Event::Mark(tag));
    }

    /// A copy of the log.
    #[must_use]
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// Indices of the flush events (the crash points of interest).
    #[must_use]
    pub fn flush_points(&self) -> Vec<usize> {
        let ev = self.events.lock();
        ev.iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Flush { .. }))
            .map(|(i, _)| i)
            .collect()
    }

    /// Indices of the events after which more became durable: flushes and FUA writes
    /// (the crash points of interest).
    #[must_use]
    pub fn durability_points(&self) -> Vec<usize> {
        let ev = self.events.lock();
        ev.iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Flush { .. } | Event::FuaWrite { .. }))
            .map(|(i, _)| i)
            .collect()
    }

    /// Indices of the FUA write events.
    #[must_use]
    pub fn fua_points(&self) -> Vec<usize> {
        let ev = self.events.lock();
        ev.iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::FuaWrite { .. }))
            .map(|(i, _)| i)
            .collect()
    }

    /// Rebuilds every target's image as a crash right after event `upto` (exclusive of
    /// later events) would leave it, starting from `initial` images.
    ///
    /// Writes to a target followed by a flush of that target before `upto` are durable, as
    /// are FUA writes; the others are treated per `policy`.
    #[must_use]
    pub fn images_at(
        &self,
        initial: &[Vec<u8>],
        upto: usize,
        policy: UnflushedPolicy,
        sector: usize,
    ) -> Vec<Vec<u8>> {
        let ev = self.events.lock();
        let upto = upto.min(ev.len());
        rebuild(initial, &ev[..upto], None, policy, sector)
    }

    /// Rebuilds the images as a crash *while* the write logged as event `at` was in flight
    /// would leave them: events before `at` as in [`Recorder::images_at`] with
    /// [`UnflushedPolicy::Tear`], and that write lost, kept or torn like an unflushed one
    /// (for a FUA write: the moment before it became durable).
    ///
    /// # Panics
    /// Panics unless event `at` is a write or a FUA write.
    #[must_use]
    pub fn images_in_flight(
        &self,
        initial: &[Vec<u8>],
        at: usize,
        seed: u64,
        sector: usize,
    ) -> Vec<Vec<u8>> {
        let ev = self.events.lock();
        let e = &ev[at];
        assert!(
            matches!(e, Event::Write { .. } | Event::FuaWrite { .. }),
            "event {at} is not a write"
        );
        rebuild(
            initial,
            &ev[..at],
            Some(e),
            UnflushedPolicy::Tear { seed },
            sector,
        )
    }
}

type Pending = Vec<Vec<(u64, Arc<[u8]>)>>;

fn rebuild(
    initial: &[Vec<u8>],
    events: &[Event],
    in_flight: Option<&Event>,
    policy: UnflushedPolicy,
    sector: usize,
) -> Vec<Vec<u8>> {
    let mut images: Vec<Vec<u8>> = initial.to_vec();
    let mut pending: Pending = vec![Vec::new(); initial.len()];
    for e in events {
        match e {
            Event::Write {
                target,
                offset,
                data,
            } => {
                pending[*target as usize].push((*offset, Arc::clone(data)));
            }
            Event::FuaWrite {
                target,
                offset,
                data,
            } => {
                let t = *target as usize;
                let at = *offset as usize;
                images[t][at..at + data.len()].copy_from_slice(data);
                forget(&mut pending[t], *offset, *offset + data.len() as u64);
            }
            Event::Flush { target } => {
                let t = *target as usize;
                for (off, data) in pending[t].drain(..) {
                    let at = off as usize;
                    images[t][at..at + data.len()].copy_from_slice(&data);
                }
            }
            Event::Mark(_) => {}
        }
    }
    if let Some(
        Event::Write {
            target,
            offset,
            data,
        }
        | Event::FuaWrite {
            target,
            offset,
            data,
        },
    ) = in_flight
    {
        pending[*target as usize].push((*offset, Arc::clone(data)));
    }
    if let UnflushedPolicy::Tear { seed } = policy {
        tear(&mut images, &pending, seed, sector);
    }
    images
}

/// Applies each pending write with probability 1/2, torn at a sector boundary with
/// probability 1/4.
fn tear(images: &mut [Vec<u8>], pending: &Pending, seed: u64, sector: usize) {
    let mut rng = Rng::new(seed);
    for (t, writes) in pending.iter().enumerate() {
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
            let at = *off as usize;
            images[t][at..at + keep * sector].copy_from_slice(&data[..keep * sector]);
        }
    }
}

/// Removes `[start, end)` from a target's pending writes (a FUA write replaced them).
fn forget(pending: &mut Vec<(u64, Arc<[u8]>)>, start: u64, end: u64) {
    let old = std::mem::take(pending);
    for (off, data) in old {
        let stop = off + data.len() as u64;
        if stop <= start || off >= end {
            pending.push((off, data));
            continue;
        }
        if off < start {
            pending.push((off, Arc::from(&data[..(start - off) as usize])));
        }
        if stop > end {
            pending.push((end, Arc::from(&data[(end - off) as usize..])));
        }
    }
}

/// A target wrapper that logs completed writes and flushes into a [`Recorder`].
#[derive(Debug)]
pub struct RecordingTarget {
    inner: Arc<dyn Target>,
    index: u32,
    recorder: Arc<Recorder>,
}

impl RecordingTarget {
    /// Wraps `inner`, logging under target number `index`.
    #[must_use]
    pub fn new(inner: Arc<dyn Target>, index: u32, recorder: Arc<Recorder>) -> Self {
        Self {
            inner,
            index,
            recorder,
        }
    }
}

impl Target for RecordingTarget {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let recorder = Arc::clone(&self.recorder);
        let index = self.index;
        let log = match op {
            IoOp::Write { .. } => LogAs::Write,
            IoOp::WriteFua { .. } => LogAs::FuaWrite,
            IoOp::Flush => LogAs::Flush,
            IoOp::Read { .. } | IoOp::Discard { .. } => LogAs::Nothing,
        };
        let offset = op.offset();
        self.inner.submit(
            op,
            Box::new(move |d: IoDone| {
                if d.result.is_ok() {
                    log_completion(&recorder, index, log, offset, &d);
                }
                done(d);
            }),
        );
    }

    fn op_counts(&self) -> Option<OpCounts> {
        self.inner.op_counts()
    }
}

/// Which event a completed operation becomes.
#[derive(Debug, Clone, Copy)]
enum LogAs {
    Write,
    FuaWrite,
    Flush,
    Nothing,
}

fn log_completion(rec: &Recorder, target: u32, log: LogAs, offset: u64, d: &IoDone) {
    let mut ev = rec.events.lock();
    match log {
        LogAs::Write | LogAs::FuaWrite => {
            let mut at = offset;
            for b in &d.bufs {
                let data = Arc::from(&b[..]);
                ev.push(match log {
                    LogAs::FuaWrite => Event::FuaWrite {
                        target,
                        offset: at,
                        data,
                    },
                    _ => Event::Write {
                        target,
                        offset: at,
                        data,
                    },
                });
                at += b.len() as u64;
            }
        }
        LogAs::Flush => ev.push(Event::Flush { target }),
        LogAs::Nothing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoBuf, SimTarget};

    #[test]
    fn rebuild_at_flush_points() {
        let rec = Recorder::new();
        let sim: Arc<dyn Target> = Arc::new(SimTarget::new("a", 4096, 512));
        let t = RecordingTarget::new(sim, 0, Arc::clone(&rec));
        t.write_sync(0, IoBuf::from_slice(&[7; 512])).unwrap();
        t.flush_sync().unwrap();
        t.write_sync(512, IoBuf::from_slice(&[9; 512])).unwrap();
        let initial = vec![vec![0u8; 4096]];
        let pts = rec.flush_points();
        assert_eq!(pts, vec![1]);
        let before = rec.images_at(&initial, 1, UnflushedPolicy::Drop, 512);
        assert_eq!(before[0][0], 0, "the write is not durable before its flush");
        let after = rec.images_at(&initial, 2, UnflushedPolicy::Drop, 512);
        assert_eq!(after[0][0], 7);
        let end = rec.images_at(&initial, 3, UnflushedPolicy::Drop, 512);
        assert_eq!(end[0][512], 0, "unflushed write dropped");
    }

    #[test]
    fn fua_write_is_a_durability_point() {
        let rec = Recorder::new();
        let sim: Arc<dyn Target> = Arc::new(SimTarget::new("a", 4096, 512));
        let t = RecordingTarget::new(sim, 0, Arc::clone(&rec));
        t.write_sync(0, IoBuf::from_slice(&[7; 1024])).unwrap();
        t.write_fua_sync(512, IoBuf::from_slice(&[9; 512])).unwrap();
        assert_eq!(rec.durability_points(), vec![1]);
        assert_eq!(rec.fua_points(), vec![1]);
        assert!(rec.flush_points().is_empty());
        let initial = vec![vec![0u8; 4096]];
        let after = rec.images_at(&initial, 2, UnflushedPolicy::Drop, 512);
        assert_eq!(
            (after[0][0], after[0][512]),
            (0, 9),
            "only the FUA write is durable"
        );
        // Keep-everything tearing (some seed keeps the plain write) never puts the older
        // cached bytes back over the FUA write.
        for seed in 0..32 {
            let img = rec.images_at(&initial, 2, UnflushedPolicy::Tear { seed }, 512);
            assert_eq!(img[0][512], 9, "seed {seed}");
        }
        // In flight, the FUA write may be lost or torn.
        let lost = (0..64).any(|seed| rec.images_in_flight(&initial, 1, seed, 512)[0][512] != 9);
        assert!(lost, "an in-flight FUA write is not yet durable");
        assert_eq!(t.op_counts().unwrap().fua_writes, 1);
    }
}

//! `RecordingTarget`: logs every completed write and flush (across all targets of a file
//! system, in one global order) so that a crash test can rebuild what each target would hold
//! if power failed at any chosen point.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::{Completion, IoDone, IoOp, Rng, Target, TargetInfo};

/// One logged event.
#[derive(Debug, Clone)]
pub enum Event {
    /// A completed write of `data` at `offset` on target `target`.
    Write {
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

    /// Rebuilds every target's image as a crash right after event `upto` (exclusive of
    /// later events) would leave it, starting from `initial` images.
    ///
    /// Writes to a target followed by a flush of that target before `upto` are durable;
    /// the others are treated per `policy`.
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
        let mut images: Vec<Vec<u8>> = initial.to_vec();
        let mut pending: Vec<Vec<(u64, Arc<[u8]>)>> = vec![Vec::new(); initial.len()];
        for e in &ev[..upto] {
            match e {
                Event::Write {
                    target,
                    offset,
                    data,
                } => {
                    pending[*target as usize].push((*offset, Arc::clone(data)));
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
        if let UnflushedPolicy::Tear { seed } = policy {
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
        images
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
        let (kind, offset) = (op.kind(), op.offset());
        self.inner.submit(
            op,
            Box::new(move |d: IoDone| {
                if d.result.is_ok() {
                    log_completion(&recorder, index, kind, offset, &d);
                }
                done(d);
            }),
        );
    }
}

fn log_completion(rec: &Recorder, target: u32, kind: crate::OpKind, offset: u64, d: &IoDone) {
    let mut ev = rec.events.lock();
    match kind {
        crate::OpKind::Write => {
            let mut at = offset;
            for b in &d.bufs {
                ev.push(Event::Write {
                    target,
                    offset: at,
                    data: Arc::from(&b[..]),
                });
                at += b.len() as u64;
            }
        }
        crate::OpKind::Flush => ev.push(Event::Flush { target }),
        _ => {}
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
}

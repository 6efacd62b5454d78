//! A checkpoint whose page write, flush or root record write fails returns the error
//! and poisons the store (every later call fails); after a crash the trees open at the
//! previous generation, intact.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Key, KeyKind};
use stripefs_meta::{JournalMark, MetaError, Store};
use stripefs_target::{
    Completion, CrashMode, IoDone, IoOp, SimTarget, Target, TargetError, TargetErrorKind,
    TargetInfo,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fails {
    PageWrite,
    Flush,
    RootWrite,
}

/// Fails the chosen kind of operation once armed.
#[derive(Debug)]
struct Failing {
    inner: Arc<SimTarget>,
    what: Fails,
    armed: AtomicBool,
}

impl Target for Failing {
    fn info(&self) -> &TargetInfo {
        self.inner.info()
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let hit = matches!(
            (&op, self.what),
            (IoOp::Write { .. }, Fails::PageWrite)
                | (IoOp::Flush, Fails::Flush)
                | (IoOp::WriteFua { .. }, Fails::RootWrite)
        );
        if hit && self.armed.load(Ordering::SeqCst) {
            let err = TargetError::new(
                self.info().name.clone(),
                op.kind(),
                op.offset(),
                TargetErrorKind::Os(5),
            );
            return done(IoDone {
                bufs: op.into_bufs(),
                result: Err(err),
            });
        }
        self.inner.submit(op, done);
    }
}

fn inode(i: u64) -> Key {
    Key::new(i, KeyKind::Inode, 0, 0)
}

#[test]
fn a_failed_checkpoint_poisons_and_the_previous_generation_survives() {
    for what in [Fails::PageWrite, Fails::Flush, Fails::RootWrite] {
        let sim = Arc::new(SimTarget::new("t", TARGET_BYTES, SECTOR));
        let t = Arc::new(Failing {
            inner: Arc::clone(&sim),
            what,
            armed: AtomicBool::new(false),
        });
        let store = Store::create(
            config(32),
            vec![Arc::clone(&t) as Arc<dyn Target>],
            region(1),
        );
        let mut oracle = Oracle::new();
        for i in 0..1000u64 {
            store.insert(inode(i), &[7; 50]).unwrap();
            oracle.insert(inode(i), vec![7; 50]);
        }
        let durable = JournalMark { tail: 10, seq: 3 };
        store.checkpoint_at(durable).unwrap();
        for i in 0..1000u64 {
            store.remove(&inode(i * 2)).unwrap();
        }
        t.armed.store(true, Ordering::SeqCst);
        let e = store
            .checkpoint_at(JournalMark { tail: 20, seq: 5 })
            .unwrap_err();
        assert_eq!(
            store.journal_mark(),
            durable,
            "{what:?}: mark of a failed checkpoint"
        );
        assert!(matches!(e, MetaError::Target(_)), "{what:?}: {e}");
        assert!(
            matches!(store.get(&inode(1)), Err(MetaError::Poisoned)),
            "{what:?}"
        );
        assert!(matches!(
            store.insert(inode(1), b"x"),
            Err(MetaError::Poisoned)
        ));
        assert!(matches!(store.checkpoint(), Err(MetaError::Poisoned)));
        drop(store);
        sim.crash(CrashMode::KeepUnflushed);
        let (store, _) = reopen(vec![Arc::clone(&sim) as Arc<dyn Target>], 32);
        assert_eq!(store.durable_generation().0, 1, "{what:?}");
        assert_eq!(store.journal_mark(), durable, "{what:?}");
        assert_eq!(contents(&store), oracle, "{what:?}");
    }
}

//! The tree model test across crashes (issue 11): random inserts, replacements and
//! removes over two simulated targets against a `BTreeMap` oracle, with a page cache of
//! 6 pages (eviction on nearly every step), checkpoints every so often; then, for every
//! flush and FUA point of the run, the images a crash there leaves (unflushed writes
//! dropped, or kept torn and reordered), and every root record write caught in flight:
//! the store opened on them holds exactly the oracle as of the last checkpoint whose
//! root record is durable.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use stripefs_core::btree::{Generation, Key, KeyKind};
use stripefs_meta::Store;
use stripefs_target::{Recorder, Rng, SimTarget, Target, UnflushedPolicy};

/// Small enough that the pinned dirty pages often leave no room for clean ones.
const CACHE_PAGES: usize = 16;

struct Run {
    recorder: Arc<Recorder>,
    /// Per checkpoint: the index of its root record's FUA event, its generation.
    commits: Vec<(usize, Generation)>,
    snapshots: HashMap<Generation, Oracle>,
}

fn run(seed: u64, steps: usize) -> Run {
    let recorder = Recorder::new();
    let targets = recording_targets(2, TARGET_BYTES, &recorder);
    let store = Store::create(config(CACHE_PAGES), targets, region(2));
    let mut rng = Rng::new(seed);
    let mut oracle = Oracle::new();
    let mut out = Run {
        recorder,
        commits: Vec::new(),
        snapshots: HashMap::from([(Generation(0), Oracle::new())]),
    };
    for step in 0..steps {
        let k = random_key(&mut rng, 400);
        let del = if step * 3 < steps * 2 { 30 } else { 70 };
        if rng.below(100) < del {
            assert_eq!(
                store.remove(&k).unwrap(),
                oracle.remove(&k),
                "seed {seed} step {step}"
            );
        } else {
            let v = random_value(&mut rng);
            assert_eq!(
                store.insert(k, &v).unwrap(),
                oracle.insert(k, v),
                "seed {seed} step {step}"
            );
        }
        if rng.one_in(10) {
            let q = random_key(&mut rng, 400);
            assert_eq!(
                store.get(&q).unwrap().as_ref(),
                oracle.get(&q),
                "seed {seed} step {step}"
            );
            let tree = |k: &Key| KeyKind::from_code(k.kind).map(KeyKind::tree);
            let want = oracle.range(..=q).rev().find(|(k, _)| tree(k) == tree(&q));
            let want = want.map(|(k, v)| (*k, v.clone()));
            assert_eq!(store.floor(&q).unwrap(), want, "seed {seed} step {step}");
        }
        let s = store.stats();
        assert!(
            s.cache.bytes <= CACHE_PAGES * PAGE,
            "cache over budget: {s:?}"
        );
        if rng.one_in(80) {
            let g = store.checkpoint().expect("checkpoint");
            out.commits.push((out.recorder.events().len() - 1, g));
            out.snapshots.insert(g, oracle.clone());
        }
    }
    assert_eq!(contents(&store), oracle, "seed {seed}: final contents");
    let s = store.stats().cache;
    eprintln!("seed {seed}: {s:?}");
    assert!(
        s.evictions > 500 && s.misses > 500,
        "the cache evicts constantly: {s:?}"
    );
    out
}

fn open_images(images: Vec<Vec<u8>>) -> Result<(Store, Generation), stripefs_meta::MetaError> {
    let targets: Vec<Arc<dyn Target>> = images
        .into_iter()
        .map(|img| Arc::new(SimTarget::from_image("t", img, SECTOR)) as Arc<dyn Target>)
        .collect();
    let store = Store::open(config(256), targets, region(2))?;
    let g = store.durable_generation();
    Ok((store, g))
}

fn check_point(r: &Run, initial: &[Vec<u8>], at: usize, policy: UnflushedPolicy, seed: u64) {
    let expected = r
        .commits
        .iter()
        .rev()
        .find(|(i, _)| *i <= at)
        .map_or(Generation(0), |(_, g)| *g);
    let images = r
        .recorder
        .images_at(initial, at + 1, policy, SECTOR as usize);
    match open_images(images) {
        Ok((store, g)) => {
            assert_eq!(
                g, expected,
                "seed {seed}: crash after event {at} ({policy:?})"
            );
            let want = &r.snapshots[&g];
            assert_eq!(
                &contents(&store),
                want,
                "seed {seed}: event {at} ({policy:?})"
            );
        }
        Err(e) => {
            assert_eq!(expected, Generation(0), "seed {seed}: event {at}: {e}");
            assert!(e.to_string().contains("neither slot"), "{e}");
        }
    }
}

#[test]
fn tree_survives_a_crash_at_every_flush_point() {
    for seed in [1, 2] {
        crash_everywhere(seed, 2500);
    }
}

/// The same over 20 more seeds and twice the steps (about 4 minutes here).
#[test]
#[ignore = "long: cargo test -p stripefs-meta --test tree_crash -- --ignored"]
fn tree_survives_a_crash_at_every_flush_point_many_seeds() {
    for seed in 3..=22 {
        crash_everywhere(seed, 5000);
    }
}

fn crash_everywhere(seed: u64, steps: usize) {
    {
        let r = run(seed, steps);
        assert!(
            r.commits.len() >= 15,
            "seed {seed}: {} checkpoints",
            r.commits.len()
        );
        let initial = vec![vec![0u8; TARGET_BYTES as usize]; 2];
        let points = r.recorder.durability_points();
        eprintln!(
            "seed {seed}: {} checkpoints, {} crash points",
            r.commits.len(),
            points.len()
        );
        for &at in &points {
            check_point(&r, &initial, at, UnflushedPolicy::Drop, seed);
            let tear = UnflushedPolicy::Tear {
                seed: seed * 1000 + at as u64,
            };
            check_point(&r, &initial, at, tear, seed);
        }
        // A root record write in flight: either generation, never a mixture.
        for (n, &(at, g)) in r.commits.iter().enumerate() {
            let before = if n == 0 {
                Generation(0)
            } else {
                r.commits[n - 1].1
            };
            for s in 0..3 {
                let images = r
                    .recorder
                    .images_in_flight(&initial, at, s, SECTOR as usize);
                match open_images(images) {
                    Ok((store, got)) => {
                        assert!(
                            got == g || got == before,
                            "seed {seed}: commit {n}: {got:?}"
                        );
                        assert_eq!(
                            contents(&store),
                            r.snapshots[&got],
                            "seed {seed} commit {n}"
                        );
                    }
                    Err(e) => assert_eq!(before, Generation(0), "seed {seed} commit {n}: {e}"),
                }
            }
        }
    }
}

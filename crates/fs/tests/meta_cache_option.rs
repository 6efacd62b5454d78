//! `-o meta_cache=SIZE` (issue 11, "Bounded memory"): a budget too small for the trees
//! to work in is refused at mount with the value and the minimum, never accepted and
//! failed later.

mod common;

use stripefs::{Fs, FsError, MetaCacheBytes, MountOptions};

#[test]
fn a_meta_cache_below_the_minimum_is_refused_at_mount() {
    let s = common::sims(2, 16 << 20);
    common::fresh(&s, 4096, 65536).unmount().unwrap();
    let small = MountOptions {
        meta_cache: MetaCacheBytes(64 << 10),
        ..common::quiet()
    };
    let Err(e) = Fs::mount(common::dyns(&s), small) else {
        panic!("a 64 KiB metadata cache was accepted");
    };
    assert!(matches!(e, FsError::Invalid(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("65536 bytes") && msg.contains("64 pages"),
        "{msg}"
    );
    let least = MountOptions {
        meta_cache: MetaCacheBytes(MetaCacheBytes::MIN_PAGES * 4096),
        ..common::quiet()
    };
    let (fs, _) = Fs::mount(common::dyns(&s), least).expect("the minimum mounts");
    fs.unmount().unwrap();
}

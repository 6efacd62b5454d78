//! A hasher for maps keyed by numbers this program hands out (node ids, inode numbers,
//! page addresses): one multiplication per word instead of SipHash.
//!
//! The keys are counters or addresses the allocator chose, never strings a caller
//! picks, so no input can be chosen to collide. Maps keyed by names (directory entries,
//! xattrs) keep the standard randomly seeded hasher.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing of each word written: the high bits, which the table's control
/// bytes use, depend on every bit of the key.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The low bits of a product depend only on the low bits of the key, and the
        // table picks buckets by the low bits: rotate the mixed middle bits down (page
        // addresses step by the page's blocks, up to 8).
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(GOLDEN);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by ids (see the module's note).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of ids (see the module's note).
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(v: &T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(v)
    }

    #[test]
    fn distinct_ids_spread_over_the_high_bits() {
        // The table picks buckets by the low bits and control bytes by the top 7: both
        // must vary across consecutive ids and across (target, block) pairs.
        let tops: HashSet<u64> = (0..1024u64).map(|i| hash(&i) >> 57).collect();
        assert!(tops.len() > 100, "{} distinct top-7-bit values", tops.len());
        let lows: HashSet<u64> = (0..1024u64).map(|i| hash(&i) & 1023).collect();
        assert!(
            lows.len() > 600,
            "{} distinct low-10-bit values",
            lows.len()
        );
        let pairs: HashSet<u64> = (0..32u32)
            .flat_map(|t| (0..32u64).map(move |b| (t, b)))
            .map(|p| hash(&p))
            .collect();
        assert_eq!(pairs.len(), 1024, "(target, block) pairs hash apart");
        // Page addresses step by a page's blocks (up to 8): the low bits must still vary.
        let strided: HashSet<u64> = (0..1024u64).map(|i| hash(&(1u32, i * 8)) & 1023).collect();
        assert!(
            strided.len() > 600,
            "{} distinct low-10-bit values",
            strided.len()
        );
    }
}

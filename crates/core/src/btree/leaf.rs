//! A leaf's items in memory: the keys in one vector and the values back to back in one
//! byte buffer, so a decoded, dirty or frozen leaf costs three allocations, not one per
//! item (`docs/design/metadata.md`, "Memory"; decision 120).
//!
//! Invariant: `ends` has one entry per key, non-decreasing, and its last is
//! `bytes.len()`; item `i`'s value is `bytes[start(i)..ends[i]]`.

use super::key::Key;
use super::page::ITEM_OVERHEAD;

/// The items of a leaf in ascending key order (the order is the tree's to keep).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeafItems {
    keys: Vec<Key>,
    ends: Vec<u32>,
    bytes: Vec<u8>,
}

impl LeafItems {
    /// No items.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// No items, with room for `items` items of `bytes` value bytes in all.
    #[must_use]
    pub fn with_capacity(items: usize, bytes: usize) -> Self {
        LeafItems {
            keys: Vec::with_capacity(items),
            ends: Vec::with_capacity(items),
            bytes: Vec::with_capacity(bytes),
        }
    }

    /// Number of items.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when there is no item.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys, in order.
    #[must_use]
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// Item `i`'s key.
    ///
    /// # Panics
    /// If there is no item `i`.
    #[must_use]
    pub fn key(&self, i: usize) -> Key {
        self.keys[i]
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.ends[i - 1] as usize
        }
    }

    /// Item `i`'s value.
    ///
    /// # Panics
    /// If there is no item `i`.
    #[must_use]
    pub fn value(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..self.ends[i] as usize]
    }

    /// Item `i`'s key and value.
    ///
    /// # Panics
    /// If there is no item `i`.
    #[must_use]
    pub fn get(&self, i: usize) -> (Key, &[u8]) {
        (self.keys[i], self.value(i))
    }

    /// The items from `from` on, in order.
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = (Key, &[u8])> + '_ {
        (from..self.len()).map(|i| self.get(i))
    }

    /// The items, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Key, &[u8])> + '_ {
        self.iter_from(0)
    }

    /// Where `key` is (`Ok`) or would go (`Err`).
    pub fn search(&self, key: &Key) -> Result<usize, usize> {
        self.keys.binary_search(key)
    }

    /// Number of items whose key is `pred`-true, the items being partitioned by it.
    pub fn partition_point(&self, pred: impl FnMut(&Key) -> bool) -> usize {
        self.keys.partition_point(pred)
    }

    /// Bytes item `i` takes in a page.
    #[must_use]
    pub fn item_bytes(&self, i: usize) -> usize {
        ITEM_OVERHEAD + self.ends[i] as usize - self.start(i)
    }

    /// Body bytes the items encode to.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        self.len() * ITEM_OVERHEAD + self.bytes.len()
    }

    /// Bytes of memory the items take (their buffers' capacities).
    #[must_use]
    pub fn mem_bytes(&self) -> usize {
        self.keys.capacity() * std::mem::size_of::<Key>()
            + self.ends.capacity() * std::mem::size_of::<u32>()
            + self.bytes.capacity()
    }

    /// Appends an item. The caller keeps the order: a page being decoded may be out of
    /// order, which its verification then reports.
    pub fn push(&mut self, key: Key, value: &[u8]) {
        let end = offset(self.bytes.len() + value.len());
        self.keys.push(key);
        self.ends.push(end);
        self.bytes.extend_from_slice(value);
    }

    /// Inserts an item at position `i`.
    ///
    /// # Panics
    /// If `i` is past the end.
    pub fn insert(&mut self, i: usize, key: Key, value: &[u8]) {
        let at = self.start(i);
        let grow = offset(value.len());
        offset(self.bytes.len() + value.len()); // the new total fits too
        self.bytes.splice(at..at, value.iter().copied());
        for e in &mut self.ends[i..] {
            *e += grow;
        }
        self.keys.insert(i, key);
        self.ends.insert(i, offset(at + value.len()));
        self.check();
    }

    /// Replaces item `i`'s value; returns the old one.
    ///
    /// # Panics
    /// If there is no item `i`.
    pub fn replace(&mut self, i: usize, value: &[u8]) -> Vec<u8> {
        let (at, end) = (self.start(i), self.ends[i] as usize);
        let old: Vec<u8> = self.bytes.splice(at..end, value.iter().copied()).collect();
        let new_end = at + value.len();
        for e in &mut self.ends[i..] {
            *e = offset(*e as usize - end + new_end);
        }
        self.check();
        old
    }

    /// Removes item `i`; returns its key and value.
    ///
    /// # Panics
    /// If there is no item `i`.
    pub fn remove(&mut self, i: usize) -> (Key, Vec<u8>) {
        let (at, end) = (self.start(i), self.ends[i] as usize);
        let value: Vec<u8> = self.bytes.drain(at..end).collect();
        let shrink = offset(end - at);
        self.ends.remove(i);
        for e in &mut self.ends[i..] {
            *e -= shrink;
        }
        let key = self.keys.remove(i);
        self.check();
        (key, value)
    }

    /// Moves the items from `at` on into a new set.
    ///
    /// # Panics
    /// If `at` is past the end.
    #[must_use]
    pub fn split_off(&mut self, at: usize) -> LeafItems {
        let cut = self.start(at);
        let keys = self.keys.split_off(at);
        let mut ends = self.ends.split_off(at);
        let bytes = self.bytes.split_off(cut);
        let cut = offset(cut);
        for e in &mut ends {
            *e -= cut;
        }
        let right = LeafItems { keys, ends, bytes };
        self.check();
        right.check();
        right
    }

    /// Appends every item of `other`, all of whose keys are above this set's.
    pub fn append(&mut self, other: LeafItems) {
        debug_assert!(
            self.keys
                .last()
                .zip(other.keys.first())
                .is_none_or(|(l, f)| l < f),
            "appended items out of order"
        );
        let base = offset(self.bytes.len());
        offset(self.bytes.len() + other.bytes.len()); // the joined total fits too
        self.keys.extend(other.keys);
        self.ends.extend(other.ends.iter().map(|e| e + base));
        self.bytes.extend(other.bytes);
        self.check();
    }

    fn check(&self) {
        debug_assert_eq!(self.keys.len(), self.ends.len());
        debug_assert!(self.ends.windows(2).all(|w| w[0] <= w[1]));
        debug_assert_eq!(
            self.ends.last().map_or(0, |e| *e as usize),
            self.bytes.len()
        );
    }
}

/// `n` as an offset into a leaf's values. A leaf holds at most a page and one more item
/// before it splits (values of at most [`super::VALUE_MAX`]), so its values never
/// approach `u32::MAX` bytes: failing here is a bug in the tree, never a property of
/// data read from disk (a decoded page's body is at most a page).
fn offset(n: usize) -> u32 {
    u32::try_from(n).expect("a leaf's values fit u32")
}

impl<'a> FromIterator<(Key, &'a [u8])> for LeafItems {
    fn from_iter<I: IntoIterator<Item = (Key, &'a [u8])>>(iter: I) -> Self {
        let mut l = LeafItems::new();
        for (k, v) in iter {
            l.push(k, v);
        }
        l
    }
}

impl FromIterator<(Key, Vec<u8>)> for LeafItems {
    fn from_iter<I: IntoIterator<Item = (Key, Vec<u8>)>>(iter: I) -> Self {
        let mut l = LeafItems::new();
        for (k, v) in iter {
            l.push(k, &v);
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btree::key::KeyKind;

    fn k(i: u64) -> Key {
        Key::new(i, KeyKind::Inode, 0, 0)
    }

    fn oracle(l: &LeafItems) -> Vec<(Key, Vec<u8>)> {
        l.iter().map(|(k, v)| (k, v.to_vec())).collect()
    }

    /// Every edit against a vector of owned items, the representation this replaced.
    #[test]
    fn edits_match_a_vector_of_owned_items() {
        let mut want: Vec<(Key, Vec<u8>)> = Vec::new();
        let mut l = LeafItems::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..4000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = k(x % 64);
            let value = vec![step as u8; (x >> 20) as usize % 40];
            match (x >> 8) % 4 {
                0 | 1 => match want.binary_search_by(|(a, _)| a.cmp(&key)) {
                    Ok(i) => {
                        let old = std::mem::replace(&mut want[i].1, value.clone());
                        assert_eq!(l.replace(i, &value), old);
                    }
                    Err(i) => {
                        want.insert(i, (key, value.clone()));
                        l.insert(i, key, &value);
                    }
                },
                2 => {
                    if let Ok(i) = want.binary_search_by(|(a, _)| a.cmp(&key)) {
                        assert_eq!(l.remove(i), want.remove(i));
                    }
                }
                _ => {
                    let at = want.len() / 2;
                    let right = want.split_off(at);
                    let lr = l.split_off(at);
                    assert_eq!(oracle(&lr), right);
                    assert_eq!(oracle(&l), want);
                    want.extend(right);
                    l.append(lr);
                }
            }
            assert_eq!(oracle(&l), want);
            assert_eq!(l.search(&key).is_ok(), want.iter().any(|(a, _)| *a == key));
            let bytes: usize = want.iter().map(|(_, v)| ITEM_OVERHEAD + v.len()).sum();
            assert_eq!(l.encoded_len(), bytes);
        }
    }
}

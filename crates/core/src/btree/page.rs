//! Self-describing tree pages: layout, encoding and verification.
//!
//! ```text
//! header (64 bytes, little-endian):
//!   0 magic "SFBTPG01"   8 crc32c(12..page end)   12 tree u8   13 level u8 (0 = leaf)
//!  14 item count u16    16 fs uuid [16]           32 own target u32   36 body bytes u32
//!  40 own block u64     48 generation u64         56 log2(page size) u8   57..64 zero
//! leaf body:   per item  key [25] | value length u16 | value
//! branch body: per child key [25] (lowest key of the child) | target u32 | block u64 |
//!              child generation u64
//! the rest of the page is zero (covered by the checksum)
//! ```
//!
//! [`decode`] checks, in this order, and names the first failure ([`PageCheck`]): magic,
//! checksum, uuid, own address, tree, level, generation, layout (sizes, counts, reserved
//! bytes, child generations not newer than the page), key order, key bounds (every key
//! inside the range the parent gave), and that every key's kind belongs to the tree.
//! A page from disk never causes a panic: any byte string decodes to a page or an error.

use std::fmt;

use super::key::{Key, TreeId, KEY_BYTES, VALUE_MAX};
use super::leaf::LeafItems;
use crate::{crc32c, CoreError, PhysBlock, TargetId, Uuid};

/// Bytes of the page header.
pub const HEADER_BYTES: usize = 64;
/// Bytes of one branch entry: key, child target, block and generation.
pub const BRANCH_ENTRY_BYTES: usize = KEY_BYTES + 4 + 8 + 8;
/// Bytes a leaf item takes besides its value: key and value length.
pub const ITEM_OVERHEAD: usize = KEY_BYTES + 2;
/// Deepest tree accepted (level of the root): far beyond what 2^64 keys need.
pub const MAX_LEVEL: u8 = 15;
const MAGIC: u64 = u64::from_le_bytes(*b"SFBTPG01");

/// The size of a tree page: a power of two from 4 KiB to 64 KiB (see
/// `docs/design/metadata.md` for the choice of 4 KiB as the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSize(u32);

impl PageSize {
    /// The default: 4 KiB.
    pub const DEFAULT: PageSize = PageSize(4096);

    /// Validates `bytes`.
    ///
    /// # Errors
    /// A description of the rule when `bytes` is not a power of two in 4 KiB..=64 KiB.
    pub fn new(bytes: u32) -> Result<PageSize, String> {
        if !bytes.is_power_of_two() || !(4096..=65536).contains(&bytes) {
            return Err(format!(
                "page size {bytes} is not a power of two from 4 KiB to 64 KiB"
            ));
        }
        Ok(PageSize(bytes))
    }

    /// Bytes per page.
    #[must_use]
    pub fn bytes(self) -> usize {
        self.0 as usize
    }

    /// Body bytes available to items or children.
    #[must_use]
    pub fn body(self) -> usize {
        self.bytes() - HEADER_BYTES
    }

    /// Children a branch page holds at most.
    #[must_use]
    pub fn fanout(self) -> usize {
        self.body() / BRANCH_ENTRY_BYTES
    }
}

/// A checkpoint generation: the pages a checkpoint writes carry its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Generation(pub u64);

impl Generation {
    /// The next generation.
    #[must_use]
    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a page lives: its first block on one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PageAddr {
    pub target: TargetId,
    pub block: PhysBlock,
}

impl fmt::Display for PageAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "target {} block {}", self.target, self.block.0)
    }
}

/// A pointer to a written page, as a parent or a root record stores it: the address and
/// the generation the page must carry (a stale or lost page write is caught by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRef {
    pub addr: PageAddr,
    pub generation: Generation,
}

/// What the reader of a page knows before reading it, from the parent or the root record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub tree: TreeId,
    pub at: PageRef,
    pub level: u8,
    /// Every key of the page is at least this.
    pub low: Key,
    /// Every key of the page is below this (`None`: no upper bound).
    pub high: Option<Key>,
}

/// The content of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageBody {
    /// Items in ascending key order.
    Leaf(LeafItems),
    /// Children in ascending key order; each key is the lowest key of its child's range.
    Branch(Vec<(Key, PageRef)>),
}

impl PageBody {
    /// Number of items or children.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            PageBody::Leaf(v) => v.len(),
            PageBody::Branch(v) => v.len(),
        }
    }

    /// True when the page holds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Body bytes this content encodes to.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        match self {
            PageBody::Leaf(v) => v.encoded_len(),
            PageBody::Branch(v) => v.len() * BRANCH_ENTRY_BYTES,
        }
    }
}

/// A verified page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub tree: TreeId,
    pub level: u8,
    pub generation: Generation,
    pub body: PageBody,
}

/// Which verification of a page failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCheck {
    Magic,
    Checksum,
    Uuid,
    Address,
    Tree,
    Level,
    Generation,
    Layout,
    KeyOrder,
    KeyBounds,
    KeyKind,
}

impl PageCheck {
    fn name(self) -> &'static str {
        match self {
            PageCheck::Magic => "bad magic (not a tree page)",
            PageCheck::Checksum => "checksum mismatch",
            PageCheck::Uuid => "belongs to another file system",
            PageCheck::Address => "misdirected (records another address)",
            PageCheck::Tree => "belongs to another tree",
            PageCheck::Level => "wrong level",
            PageCheck::Generation => "wrong generation (stale or lost write)",
            PageCheck::Layout => "bad layout",
            PageCheck::KeyOrder => "keys out of order",
            PageCheck::KeyBounds => "key outside the range its parent gives",
            PageCheck::KeyKind => "key of a kind this tree does not hold",
        }
    }
}

/// A page that failed verification: which tree, which page, which check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata page of tree {tree} at {addr} (generation {generation} expected): {}: {detail}", check.name())]
pub struct PageError {
    pub tree: TreeId,
    pub addr: PageAddr,
    pub generation: Generation,
    pub check: PageCheck,
    pub detail: String,
}

impl From<PageError> for CoreError {
    fn from(e: PageError) -> CoreError {
        CoreError::corrupted(
            format!("metadata page of tree {} at {}", e.tree, e.addr),
            format!("{}: {}", e.check.name(), e.detail),
        )
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn key_at(b: &[u8], at: usize) -> Key {
    Key::from_bytes(b[at..at + KEY_BYTES].try_into().expect("key bytes"))
}

/// What a page's header says of it besides its address, for [`encode_into`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHead {
    pub tree: TreeId,
    pub level: u8,
    pub generation: Generation,
}

/// A page's content, borrowed, for [`encode_into`].
#[derive(Debug, Clone, Copy)]
pub enum BodyRef<'a> {
    /// Items in ascending key order.
    Leaf(&'a LeafItems),
    /// Children in ascending key order.
    Branch(&'a [(Key, PageRef)]),
}

impl BodyRef<'_> {
    fn len(self) -> usize {
        match self {
            BodyRef::Leaf(v) => v.len(),
            BodyRef::Branch(v) => v.len(),
        }
    }

    fn encoded_len(self) -> usize {
        match self {
            BodyRef::Leaf(v) => v.encoded_len(),
            BodyRef::Branch(v) => v.len() * BRANCH_ENTRY_BYTES,
        }
    }
}

/// Encodes `page` for address `addr` of a file system `uuid`.
///
/// # Panics
/// As [`encode_into`].
#[must_use]
pub fn encode(size: PageSize, uuid: Uuid, addr: PageAddr, page: &Page) -> Vec<u8> {
    let body = match &page.body {
        PageBody::Leaf(v) => BodyRef::Leaf(v),
        PageBody::Branch(v) => BodyRef::Branch(v),
    };
    let mut b = vec![0u8; size.bytes()];
    encode_into(
        size,
        uuid,
        addr,
        PageHead {
            tree: page.tree,
            level: page.level,
            generation: page.generation,
        },
        body,
        &mut b,
    );
    b
}

/// Encodes the page `head` describes, holding `body`, for address `addr` of a file system `uuid` into `out` (exactly one page; every byte
/// is written), so a checkpoint encodes straight into its write buffers.
///
/// # Panics
/// Panics if `out` is not one page, the content does not fit the page, a value exceeds
/// [`VALUE_MAX`], or the level does not match the body: the tree never builds such a page.
pub fn encode_into(
    size: PageSize,
    uuid: Uuid,
    addr: PageAddr,
    head: PageHead,
    body: BodyRef<'_>,
    out: &mut [u8],
) {
    let PageHead {
        tree,
        level,
        generation,
    } = head;
    assert_eq!(out.len(), size.bytes(), "one page");
    let used = body.encoded_len();
    assert!(used <= size.body(), "page content {used} exceeds the page");
    assert_eq!(
        level == 0,
        matches!(body, BodyRef::Leaf(_)),
        "level matches body"
    );
    let b = out;
    b.fill(0);
    put64(b, 0, MAGIC);
    b[12] = tree as u8;
    b[13] = level;
    let count = u16::try_from(body.len()).expect("count fits u16");
    b[14..16].copy_from_slice(&count.to_le_bytes());
    b[16..32].copy_from_slice(&uuid.0);
    put32(b, 32, addr.target.0);
    put32(b, 36, u32::try_from(used).expect("body fits u32"));
    put64(b, 40, addr.block.0);
    put64(b, 48, generation.0);
    b[56] = size.0.trailing_zeros() as u8;
    let mut at = HEADER_BYTES;
    match body {
        BodyRef::Leaf(items) => {
            for (k, v) in items.iter() {
                assert!(v.len() <= VALUE_MAX, "value of {} bytes", v.len());
                b[at..at + KEY_BYTES].copy_from_slice(&k.to_bytes());
                let len = u16::try_from(v.len()).expect("value below 64 KiB");
                b[at + KEY_BYTES..at + ITEM_OVERHEAD].copy_from_slice(&len.to_le_bytes());
                b[at + ITEM_OVERHEAD..at + ITEM_OVERHEAD + v.len()].copy_from_slice(v);
                at += ITEM_OVERHEAD + v.len();
            }
        }
        BodyRef::Branch(children) => {
            for (k, r) in children {
                b[at..at + KEY_BYTES].copy_from_slice(&k.to_bytes());
                put32(b, at + KEY_BYTES, r.addr.target.0);
                put64(b, at + KEY_BYTES + 4, r.addr.block.0);
                put64(b, at + KEY_BYTES + 12, r.generation.0);
                at += BRANCH_ENTRY_BYTES;
            }
        }
    }
    let crc = crc32c(&b[12..]);
    put32(b, 8, crc);
}

/// Decodes and verifies the page read at `want.at`.
///
/// # Errors
/// [`PageError`] naming the tree, the address and the first check that failed.
pub fn decode(size: PageSize, uuid: Uuid, want: &Expect, buf: &[u8]) -> Result<Page, PageError> {
    let fail = |check, detail: String| PageError {
        tree: want.tree,
        addr: want.at.addr,
        generation: want.at.generation,
        check,
        detail,
    };
    if buf.len() != size.bytes() {
        let detail = format!("{} bytes read for a {}-byte page", buf.len(), size.bytes());
        return Err(fail(PageCheck::Layout, detail));
    }
    verify_header(size, uuid, want, buf).map_err(|(c, d)| fail(c, d))?;
    let count = usize::from(get16(buf, 14));
    let used = get32(buf, 36) as usize;
    let body = &buf[HEADER_BYTES..HEADER_BYTES + used];
    let page_body = if want.level == 0 {
        PageBody::Leaf(decode_leaf(body, count).map_err(|d| fail(PageCheck::Layout, d))?)
    } else {
        let children = decode_branch(body, count).map_err(|d| fail(PageCheck::Layout, d))?;
        check_children(&children, want).map_err(|d| fail(PageCheck::Generation, d))?;
        PageBody::Branch(children)
    };
    if buf[HEADER_BYTES + used..].iter().any(|&x| x != 0) {
        let detail = "bytes after the body are not zero".to_string();
        return Err(fail(PageCheck::Layout, detail));
    }
    check_keys(&page_body, want).map_err(|(c, d)| fail(c, d))?;
    Ok(Page {
        tree: want.tree,
        level: want.level,
        generation: want.at.generation,
        body: page_body,
    })
}

fn verify_header(
    size: PageSize,
    uuid: Uuid,
    want: &Expect,
    b: &[u8],
) -> Result<(), (PageCheck, String)> {
    if get64(b, 0) != MAGIC {
        return Err((PageCheck::Magic, format!("magic {:#018x}", get64(b, 0))));
    }
    let (stored, computed) = (get32(b, 8), crc32c(&b[12..]));
    if stored != computed {
        let d = format!("stored {stored:#010x}, computed {computed:#010x}");
        return Err((PageCheck::Checksum, d));
    }
    if b[16..32] != uuid.0 {
        return Err((
            PageCheck::Uuid,
            format!("uuid {}", Uuid(b[16..32].try_into().expect("16"))),
        ));
    }
    let own = PageAddr {
        target: TargetId(get32(b, 32)),
        block: PhysBlock(get64(b, 40)),
    };
    if own != want.at.addr {
        return Err((PageCheck::Address, format!("page says {own}")));
    }
    if b[12] != want.tree as u8 {
        let name = TreeId::from_code(b[12]).map_or("unknown", TreeId::name);
        return Err((
            PageCheck::Tree,
            format!("page says tree {} ({name})", b[12]),
        ));
    }
    if b[13] != want.level || b[13] > MAX_LEVEL {
        let d = format!("page says level {}, parent expects {}", b[13], want.level);
        return Err((PageCheck::Level, d));
    }
    let generation = get64(b, 48);
    if generation != want.at.generation.0 {
        return Err((
            PageCheck::Generation,
            format!("page says generation {generation}"),
        ));
    }
    let used = get32(b, 36) as usize;
    if u32::from(b[56]) != size.0.trailing_zeros() || b[57..64].iter().any(|&x| x != 0) {
        return Err((
            PageCheck::Layout,
            "page size or reserved header bytes".into(),
        ));
    }
    if used > size.body() {
        return Err((PageCheck::Layout, format!("body of {used} bytes")));
    }
    Ok(())
}

fn decode_leaf(body: &[u8], count: usize) -> Result<LeafItems, String> {
    let values = body.len().saturating_sub(count * ITEM_OVERHEAD);
    let mut items = LeafItems::with_capacity(count, values);
    let mut at = 0;
    for i in 0..count {
        if at + ITEM_OVERHEAD > body.len() {
            return Err(format!("item {i} of {count} runs past the body"));
        }
        let key = key_at(body, at);
        let len = usize::from(get16(body, at + KEY_BYTES));
        if len > VALUE_MAX || at + ITEM_OVERHEAD + len > body.len() {
            return Err(format!("item {i} value of {len} bytes"));
        }
        items.push(key, &body[at + ITEM_OVERHEAD..at + ITEM_OVERHEAD + len]);
        at += ITEM_OVERHEAD + len;
    }
    if at != body.len() {
        return Err(format!(
            "{count} items take {at} bytes, header says {}",
            body.len()
        ));
    }
    Ok(items)
}

fn decode_branch(body: &[u8], count: usize) -> Result<Vec<(Key, PageRef)>, String> {
    if count == 0 || count * BRANCH_ENTRY_BYTES != body.len() {
        return Err(format!("{count} children in {} body bytes", body.len()));
    }
    Ok(body
        .chunks_exact(BRANCH_ENTRY_BYTES)
        .map(|e| {
            let addr = PageAddr {
                target: TargetId(get32(e, KEY_BYTES)),
                block: PhysBlock(get64(e, KEY_BYTES + 4)),
            };
            let generation = Generation(get64(e, KEY_BYTES + 12));
            (key_at(e, 0), PageRef { addr, generation })
        })
        .collect())
}

fn check_children(children: &[(Key, PageRef)], want: &Expect) -> Result<(), String> {
    match children
        .iter()
        .find(|(_, r)| r.generation > want.at.generation)
    {
        Some((k, r)) => Err(format!(
            "child {k} at {} has generation {}, newer than its parent",
            r.addr, r.generation
        )),
        None => Ok(()),
    }
}

fn check_keys(body: &PageBody, want: &Expect) -> Result<(), (PageCheck, String)> {
    let keys: Vec<Key> = match body {
        PageBody::Leaf(v) => v.keys().to_vec(),
        PageBody::Branch(v) => v.iter().map(|(k, _)| *k).collect(),
    };
    if let Some(w) = keys.windows(2).find(|w| w[0] >= w[1]) {
        return Err((PageCheck::KeyOrder, format!("{} before {}", w[0], w[1])));
    }
    let outside = |k: &Key| *k < want.low || want.high.is_some_and(|h| *k >= h);
    if let Some(k) = keys.iter().find(|k| outside(k)) {
        let high = want.high.map_or("the end".to_string(), |h| h.to_string());
        return Err((
            PageCheck::KeyBounds,
            format!("{k} outside {}..{high}", want.low),
        ));
    }
    // A branch's first key is its own lower bound (Key::MIN on the leftmost spine), so
    // it may be of any kind; leaf keys must be of the tree's kinds.
    if let PageBody::Branch(children) = body {
        if children[0].0 != want.low {
            let d = format!(
                "first key {} is not the lower bound {}",
                children[0].0, want.low
            );
            return Err((PageCheck::KeyBounds, d));
        }
    }
    if let PageBody::Leaf(items) = body {
        if let Some(k) = items.keys().iter().find(|k| !want.tree.holds(k.kind)) {
            return Err((PageCheck::KeyKind, format!("{k}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::btree::key::KeyKind;

    const U: Uuid = Uuid([3; 16]);
    const SIZE: PageSize = PageSize::DEFAULT;

    fn addr(block: u64) -> PageAddr {
        PageAddr {
            target: TargetId(1),
            block: PhysBlock(block),
        }
    }

    fn at(block: u64, generation: u64) -> PageRef {
        PageRef {
            addr: addr(block),
            generation: Generation(generation),
        }
    }

    fn leaf() -> Page {
        let items = (0..20u64)
            .map(|i| {
                (
                    Key::new(i, KeyKind::Inode, 0, 0),
                    vec![i as u8; i as usize * 7],
                )
            })
            .collect();
        Page {
            tree: TreeId::Fs,
            level: 0,
            generation: Generation(9),
            body: PageBody::Leaf(items),
        }
    }

    fn branch() -> Page {
        let children = (0..30u64)
            .map(|i| {
                // The first key of a branch is its lower bound.
                let k = Key::new(i * 10, KeyKind::Inode, 0, 0);
                (if i == 0 { Key::MIN } else { k }, at(100 + i, 1 + i % 9))
            })
            .collect();
        Page {
            tree: TreeId::Fs,
            level: 2,
            generation: Generation(9),
            body: PageBody::Branch(children),
        }
    }

    fn expect_for(p: &Page, block: u64) -> Expect {
        Expect {
            tree: p.tree,
            at: at(block, p.generation.0),
            level: p.level,
            low: Key::MIN,
            high: None,
        }
    }

    #[test]
    fn roundtrip_leaf_and_branch() {
        for p in [leaf(), branch()] {
            let bytes = encode(SIZE, U, addr(77), &p);
            assert_eq!(bytes.len(), 4096);
            assert_eq!(decode(SIZE, U, &expect_for(&p, 77), &bytes).unwrap(), p);
        }
    }

    /// A decoded leaf of small values costs about its page in memory: a key and an end
    /// offset (36 bytes) per item against 27 on the page. As one heap value per item it
    /// took 56 bytes per item before the value's allocation (decision 120).
    #[test]
    fn a_decoded_leaf_of_small_values_takes_about_its_page_in_memory() {
        let per_page = SIZE.body() / ITEM_OVERHEAD;
        let items = (0..per_page as u64).map(|i| (Key::new(i, KeyKind::Inode, 0, 0), vec![]));
        let p = Page {
            tree: TreeId::Fs,
            level: 0,
            generation: Generation(9),
            body: PageBody::Leaf(items.collect()),
        };
        let bytes = encode(SIZE, U, addr(77), &p);
        let PageBody::Leaf(got) = decode(SIZE, U, &expect_for(&p, 77), &bytes).unwrap().body else {
            panic!("a leaf decodes as a leaf");
        };
        assert_eq!(got.len(), per_page);
        let limit = SIZE.body() * 36 / 27;
        assert!(
            got.mem_bytes() <= limit,
            "{} bytes decoded for a {}-byte body",
            got.mem_bytes(),
            SIZE.body()
        );
    }

    #[test]
    fn geometry() {
        assert_eq!(SIZE.fanout(), 89);
        assert!(PageSize::new(2048).is_err());
        assert!(PageSize::new(5000).is_err());
        assert!(
            4 * (ITEM_OVERHEAD + VALUE_MAX) <= SIZE.body(),
            "an item is at most a quarter"
        );
    }

    fn refused(p: &Page, want: &Expect, bytes: &[u8]) -> PageError {
        let e = decode(SIZE, U, want, bytes).expect_err("damaged page refused");
        let msg = CoreError::from(e.clone()).to_string();
        let named = format!(
            "tree {} at target 1 block {}",
            want.tree, want.at.addr.block.0
        );
        assert!(msg.contains(&named), "{msg}");
        assert_eq!(e.tree, p.tree);
        e
    }

    /// Every check, on both kinds of page, names the page and the check.
    #[test]
    fn damaged_pages_of_every_kind_are_refused_by_name() {
        for p in [leaf(), branch()] {
            let good = encode(SIZE, U, addr(77), &p);
            let want = expect_for(&p, 77);
            let mut b = good.clone();
            b[0] ^= 1;
            assert_eq!(refused(&p, &want, &b).check, PageCheck::Magic);
            let mut b = good.clone();
            b[3000] ^= 0x10;
            assert_eq!(refused(&p, &want, &b).check, PageCheck::Checksum);
            let zero = vec![0u8; 4096];
            assert_eq!(refused(&p, &want, &zero).check, PageCheck::Magic);
            let other = encode(SIZE, Uuid([4; 16]), addr(77), &p);
            assert_eq!(refused(&p, &want, &other).check, PageCheck::Uuid);
            let moved = encode(SIZE, U, addr(78), &p);
            assert_eq!(refused(&p, &want, &moved).check, PageCheck::Address);
            let mut w = want;
            w.tree = TreeId::Space;
            assert_eq!(
                refused(
                    &Page {
                        tree: TreeId::Space,
                        ..p.clone()
                    },
                    &w,
                    &good
                )
                .check,
                PageCheck::Tree
            );
            let mut w = want;
            w.level = p.level + 1;
            assert_eq!(refused(&p, &w, &good).check, PageCheck::Level);
            let mut w = want;
            w.at.generation = Generation(10);
            assert_eq!(refused(&p, &w, &good).check, PageCheck::Generation);
            let mut w = want;
            w.low = Key::new(5, KeyKind::Inode, 0, 0);
            assert_eq!(refused(&p, &w, &good).check, PageCheck::KeyBounds);
            let mut w = want;
            w.high = Some(Key::new(5, KeyKind::Inode, 0, 0));
            assert_eq!(refused(&p, &w, &good).check, PageCheck::KeyBounds);
            assert_eq!(refused(&p, &want, &good[..2048]).check, PageCheck::Layout);
        }
    }

    fn reseal(b: &mut [u8]) {
        let crc = crc32c(&b[12..]);
        put32(b, 8, crc);
    }

    #[test]
    fn checksummed_but_inconsistent_content_is_refused() {
        let p = leaf();
        let want = expect_for(&p, 77);
        let good = encode(SIZE, U, addr(77), &p);
        // Swap the first two keys: order.
        let mut b = good.clone();
        b[HEADER_BYTES + 7] = 1;
        reseal(&mut b);
        assert_eq!(refused(&p, &want, &b).check, PageCheck::KeyOrder);
        // A kind of another tree in an fs leaf.
        let mut b = good.clone();
        b[HEADER_BYTES + 8] = KeyKind::FreeSpace as u8;
        reseal(&mut b);
        assert_eq!(refused(&p, &want, &b).check, PageCheck::KeyKind);
        // Count larger than the items present.
        let mut b = good.clone();
        b[14] = 21;
        reseal(&mut b);
        assert_eq!(refused(&p, &want, &b).check, PageCheck::Layout);
        // Garbage after the body.
        let mut b = good.clone();
        b[4000] = 1;
        reseal(&mut b);
        assert_eq!(refused(&p, &want, &b).check, PageCheck::Layout);
        // A branch pointing at a child newer than itself.
        let p = branch();
        let want = expect_for(&p, 77);
        let mut b = encode(SIZE, U, addr(77), &p);
        put64(&mut b, HEADER_BYTES + KEY_BYTES + 12, 10);
        reseal(&mut b);
        assert_eq!(refused(&p, &want, &b).check, PageCheck::Generation);
        // A branch with no children.
        let mut b = encode(SIZE, U, addr(77), &p);
        b[14..16].copy_from_slice(&0u16.to_le_bytes());
        reseal(&mut b);
        assert_eq!(refused(&p, &want, &b).check, PageCheck::Layout);
    }

    struct Mix(u64);
    impl Mix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// Arbitrary bytes never panic the decoder, whether or not they carry a valid
    /// checksum and header (the resealed cases reach the body parsers).
    #[test]
    fn decoder_fuzz_never_panics() {
        let mut rng = Mix(0x5eed);
        let templates = [
            encode(SIZE, U, addr(77), &leaf()),
            encode(SIZE, U, addr(77), &branch()),
        ];
        for round in 0..20_000u32 {
            let mut b = templates[(round % 2) as usize].clone();
            let flips = 1 + rng.next() % 16;
            for _ in 0..flips {
                let i = (rng.next() % 4096) as usize;
                b[i] = rng.next() as u8;
            }
            if round % 3 == 0 {
                // Random used length and count with a valid checksum.
                put32(&mut b, 36, (rng.next() % 5000) as u32);
                b[14..16].copy_from_slice(&((rng.next() % 300) as u16).to_le_bytes());
            }
            if round % 2 == 0 {
                reseal(&mut b);
            }
            for level in [0, 2] {
                let want = Expect {
                    tree: TreeId::Fs,
                    at: at(77, 9),
                    level,
                    low: Key::MIN,
                    high: None,
                };
                let _ = decode(SIZE, U, &want, &b);
            }
        }
    }
}

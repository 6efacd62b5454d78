//! The streaming check of the fs tree's items: they come in key order, grouped by inode
//! (its inode item, symlink chunks, orphan item, directory entries, cookies, xattrs,
//! extents: `format.md`, "Metadata keyspace"); each group is checked as it passes and
//! dropped, leaving only the per-inode [`Tallies`] and the [`BlockMap`]. The rules and
//! their wording are those of `stripefs_core::check` (which checks a whole `MetaState`).

use std::sync::Arc;

use stripefs_core::btree::schema::{
    assemble_symlink, counter_key, decode_counter, decode_dir_cookie, decode_dir_entry,
    decode_extent, decode_free_space, decode_inode, decode_xattr, COOKIE_FIRST,
};
use stripefs_core::btree::{name_hash, Key, KeyKind, TreeId};
use stripefs_core::check::{extent_problem, layout_problem, name_problem};
use stripefs_core::extent::ExtentState;
use stripefs_core::geometry::Geometry;
use stripefs_core::inode::{FileKind, InodeAttrs};
use stripefs_core::{Ino, TargetId, Uuid};
use stripefs_target::Target;

use super::tally::{BlockMap, Claimant, Tallies};
use crate::error::Result;

/// A problem, and the inode it concerns (to name the journal transaction that last
/// changed that inode, when one did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub ino: Option<Ino>,
    pub text: String,
}

/// Everything one fsck run accumulates.
pub struct Checker<'a> {
    pub geo: &'a Geometry,
    pub uuid: Uuid,
    pub targets: &'a [Arc<dyn Target>],
    pub tallies: Tallies,
    pub blocks: BlockMap,
    pub problems: Vec<Problem>,
    /// The counter item's next inode number (0: none seen).
    pub next_ino: u64,
    /// Orphan index items (object 0, read before any inode) not yet matched with theirs.
    pub orphan_index: std::collections::BTreeSet<u64>,
    pub extents: u64,
    /// Free runs recorded in the space tree (`FreeSpace` items), claimed while the
    /// complement is checked (bounded by the device size: at most one per two blocks).
    pub free_runs: Vec<(TargetId, u64, u64)>,
    /// `FreeSpace` items read.
    pub free_items: u64,
    /// Files with non-zero bytes past EOF in their last block.
    pub eof_tails: Vec<u64>,
    cur: Option<Group>,
    /// The object of the group being skipped after an item that does not decode.
    skip: Option<u64>,
    /// Pages whose blocks something claimed first: (target, block, blocks, the page).
    page_collisions: Vec<(TargetId, u64, u64, String)>,
    /// Largest tracked state seen (bytes), for the bound test.
    pub peak_bytes: usize,
    /// The reference-count index (shared ranges only: memory follows what is shared),
    /// loaded before the walk; its ranges are claimed once.
    pub refs: stripefs_core::refcount::RefcountIndex,
    /// Pieces of extents inside shared ranges, counted against the index after the walk.
    pub shared_seen: Vec<stripefs_core::refcount::PhysPiece>,
    /// The end of the last checksum run read: (target, block past it).
    csum_end: Option<(TargetId, u64)>,
    /// Checksum items read and blocks they cover.
    pub csum_items: u64,
    pub csum_blocks: u64,
}

/// One inode's items while they pass.
struct Group {
    attrs: InodeAttrs,
    /// Whether its stripe layout is valid (else its extents are not claimed).
    layout_ok: bool,
    orphan: bool,
    symlink: Vec<(Key, Vec<u8>)>,
    xattr: Vec<(Key, Vec<u8>)>,
    /// Names of the xattrs read under the hash being read (a name twice is adjacent).
    xattr_names: (u64, Vec<Vec<u8>>),
    entries: u64,
    cookies: u64,
    /// Sums of a digest of each entry as its entry item and as its cookie item says:
    /// equal sums and counts mean the two agree (a multiset check in constant memory).
    entry_sum: u128,
    cookie_sum: u128,
    /// Names under the hash being read (duplicates are adjacent: same name, same hash).
    hash_names: (u64, Vec<Vec<u8>>),
    subdirs: u32,
    /// Per stripe object, the end of the last extent read.
    ext_end: Vec<u64>,
    /// Whether the extents' objects were already reported as not the inode's.
    ext_reported: bool,
    /// The physical block holding the EOF block, when written: (target, block).
    eof: Option<(TargetId, u64)>,
}

/// The number of stripe objects (extent maps) an inode has.
fn objects_of(a: &InodeAttrs) -> usize {
    if a.kind == FileKind::Regular {
        a.layout.count as usize
    } else {
        0
    }
}

fn digest(hash: u64, collision: u64, cookie: u64, ino: Ino, kind: FileKind, name: &[u8]) -> u128 {
    // FNV-1a 128 over the fields: not cryptographic, a corruption check.
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    let prime: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u128::from(x);
            h = h.wrapping_mul(prime);
        }
    };
    eat(&hash.to_le_bytes());
    eat(&collision.to_le_bytes());
    eat(&cookie.to_le_bytes());
    eat(&ino.0.to_le_bytes());
    eat(&[kind.code()]);
    eat(name);
    h
}

impl<'a> Checker<'a> {
    pub fn new(geo: &'a Geometry, uuid: Uuid, targets: &'a [Arc<dyn Target>]) -> Self {
        Checker {
            geo,
            uuid,
            targets,
            tallies: Tallies::default(),
            blocks: BlockMap::new(geo),
            problems: Vec::new(),
            next_ino: 0,
            orphan_index: std::collections::BTreeSet::new(),
            extents: 0,
            free_runs: Vec::new(),
            free_items: 0,
            eof_tails: Vec::new(),
            cur: None,
            skip: None,
            page_collisions: Vec::new(),
            peak_bytes: 0,
            refs: stripefs_core::refcount::RefcountIndex::new(),
            shared_seen: Vec::new(),
            csum_end: None,
            csum_items: 0,
            csum_blocks: 0,
        }
    }

    /// Takes the reference-count index and claims its ranges (once each: the extents
    /// over them are counted, not claimed).
    pub fn set_refs(&mut self, refs: stripefs_core::refcount::RefcountIndex) {
        for (t, s, e) in refs.iter() {
            if t.index() >= self.geo.targets.len() {
                self.problem(None, format!("refcount index names missing target {t}"));
                continue;
            }
            if let Err(err) = self.blocks.claim(t, s, e.len, Claimant::Extent) {
                let p = format!(
                    "refcount index range {s}..{} of target {t}: {err}",
                    s + e.len
                );
                self.problem(None, p);
            }
        }
        self.refs = refs;
    }

    /// After the walk: every shared range is mapped by as many extents as its count.
    pub fn check_refcounts(&mut self) {
        let seen = std::mem::take(&mut self.shared_seen);
        let derived = stripefs_core::refcount::RefcountIndex::derive(seen);
        if let Some(p) = self.refs.first_difference(&derived) {
            self.problem(None, p);
        }
    }

    pub fn problem(&mut self, ino: Option<Ino>, text: String) {
        self.problems.push(Problem { ino, text });
    }

    fn item_problem(&mut self, k: &Key, detail: impl std::fmt::Display) {
        let ino = (k.object != 0).then_some(Ino(k.object));
        self.problem(ino, format!("metadata item {k}: {detail}"));
    }

    /// Tracked state now, in bytes (what grows with the file count).
    #[must_use]
    pub fn tracked_bytes(&self) -> usize {
        self.tallies.bytes()
    }

    /// Claims a metadata page's blocks. A page over blocks an extent claimed before is
    /// remembered, to name the extent's inode after the walk ([`Checker::page_owners`]).
    pub fn page(&mut self, tree: TreeId, at: stripefs_core::btree::PageAddr) {
        let pb = self.geo.page_blocks();
        if let Err(e) = self.blocks.claim(at.target, at.block.0, pb, Claimant::Page) {
            let page = format!("metadata page of tree {tree} at {at} (+{pb} blocks)");
            self.problem(None, format!("{page}: {e}"));
            self.page_collisions.push((at.target, at.block.0, pb, page));
        }
    }

    /// Names the extents that share blocks with a metadata page (found by reading the
    /// extent items again; only when there are such pages).
    ///
    /// # Errors
    /// A page read's error.
    pub fn page_owners(&mut self, store: &stripefs_meta::Store) -> Result<()> {
        let pages = std::mem::take(&mut self.page_collisions);
        if pages.is_empty() {
            return Ok(());
        }
        let n = self.geo.target_count();
        let mut layout = None;
        let mut at = Key::MIN;
        loop {
            let items = store.scan(TreeId::Fs, at, None, 512)?;
            let Some(&(last, _)) = items.last() else {
                return Ok(());
            };
            for (k, v) in &items {
                if k.kind == KeyKind::Inode as u8 && k.object != 0 {
                    layout = decode_inode(k, v).ok().map(|a| (a.ino, a.layout));
                }
                let Some((ino, l)) = layout.filter(|(i, _)| i.0 == k.object) else {
                    continue;
                };
                let (Some(e), Ok(obj)) = (
                    (k.kind == KeyKind::Extent as u8)
                        .then(|| decode_extent(k, v).ok())
                        .flatten(),
                    u32::try_from(k.a),
                ) else {
                    continue;
                };
                if obj >= l.count || e.target.0 >= n {
                    continue;
                }
                let target = e.target;
                for (t, b, len, page) in &pages {
                    let overlaps =
                        *t == target && e.phys < b + len && *b < e.phys.saturating_add(e.len);
                    if overlaps {
                        let p = format!(
                            "inode {ino} object {obj} block {}: extent at target {target} block {} (+{}) overlaps the {page}",
                            k.b, e.phys, e.len
                        );
                        self.problem(Some(ino), p);
                    }
                }
            }
            match last.successor() {
                Some(k) => at = k,
                None => return Ok(()),
            }
        }
    }

    /// One item of tree `tree`, in key order.
    ///
    /// # Errors
    /// Target read errors (checking a file's EOF block).
    pub fn item(&mut self, tree: TreeId, k: Key, v: &[u8]) -> Result<()> {
        match tree {
            TreeId::Fs => self.fs_item(k, v),
            TreeId::Space if k.kind == KeyKind::TargetState as u8 => {
                self.target_state_item(&k, v);
                Ok(())
            }
            TreeId::Space if k.kind == KeyKind::TargetMember as u8 => {
                match stripefs_core::btree::schema::decode_target_member(&k, v) {
                    Ok((t, _)) if t.0 >= self.geo.target_count() => {
                        self.item_problem(&k, format!("member id of target {t}, not a member"));
                    }
                    Ok(_) => {}
                    Err(e) => self.item_problem(&k, e),
                }
                Ok(())
            }
            TreeId::Space => {
                self.free_space_item(&k, v);
                Ok(())
            }
            // Loaded whole before the walk (`Checker::set_refs`): checked to decode here.
            TreeId::Refcount => {
                if let Err(e) = stripefs_core::btree::schema::decode_refcount(&k, v) {
                    self.item_problem(&k, e);
                }
                Ok(())
            }
            TreeId::Csum => {
                self.csum_item(&k, v);
                Ok(())
            }
        }
    }

    /// A checksum item (after the fs tree's walk marked every written block of a datacow
    /// file): it decodes, follows the previous run without overlap, and each block it
    /// covers is such a block.
    fn csum_item(&mut self, k: &Key, v: &[u8]) {
        let (t, s, c) = match stripefs_core::btree::schema::decode_csum(k, v) {
            Ok(x) => x,
            Err(e) => return self.item_problem(k, e),
        };
        if let Some((pt, pe)) = self.csum_end {
            if pt == t && s < pe {
                return self.item_problem(
                    k,
                    format!(
                        "checksum run at block {s} overlaps the previous run, which ends at {pe}"
                    ),
                );
            }
        }
        self.csum_end = Some((t, s + c.len() as u64));
        self.csum_items += 1;
        self.csum_blocks += c.len() as u64;
        let mut stray = None;
        for b in s..s + c.len() as u64 {
            if !self.blocks.csum_seen(t, b) && stray.is_none() {
                stray = Some(b);
            }
        }
        if let Some(b) = stray {
            self.item_problem(
                k,
                format!(
                    "checksum of target {t} block {b}, which no written extent of a \
                     copy-on-write file maps"
                ),
            );
        }
    }

    /// After the walk of the `csum` tree: every written block of a datacow file had its
    /// checksum.
    pub fn check_csums_complete(&mut self) {
        let (first, n) = self.blocks.csums_missing(4);
        if n == 0 {
            return;
        }
        let shown: Vec<String> = first
            .iter()
            .map(|(t, b)| format!("target {t} block {b}"))
            .collect();
        self.problem(
            None,
            format!(
                "{n} written blocks of copy-on-write files have no checksum (first: {})",
                shown.join(", ")
            ),
        );
    }

    fn fs_item(&mut self, k: Key, v: &[u8]) -> Result<()> {
        if k.object == 0 {
            match decode_counter(&k, v) {
                _ if k.kind == KeyKind::Orphan as u8 && k.b == 0 && v.is_empty() => {
                    self.orphan_index.insert(k.a);
                }
                Ok(c) if k == counter_key() => self.next_ino = c.next_ino,
                Ok(_) => self.item_problem(&k, "an item of object 0 other than the counter"),
                Err(e) => self.item_problem(&k, e),
            }
            return Ok(());
        }
        if self.cur.as_ref().is_some_and(|g| g.attrs.ino.0 != k.object) {
            self.finish_group()?;
        }
        if self.skip.is_some_and(|o| o == k.object) {
            return Ok(());
        }
        self.skip = None;
        if self.cur.is_none() {
            self.start_group(&k, v);
            return Ok(());
        }
        match KeyKind::from_code(k.kind) {
            Some(KeyKind::Symlink) => self.group().symlink.push((k, v.to_vec())),
            Some(KeyKind::DirEntry) => self.entry(&k, v),
            Some(KeyKind::DirCookie) => self.cookie(&k, v),
            Some(KeyKind::Xattr) => {
                let g = self.group();
                let next_name = g
                    .xattr
                    .first()
                    .is_some_and(|(f, _)| (f.a, f.b >> 16) != (k.a, k.b >> 16));
                if next_name {
                    self.xattr_done();
                }
                self.group().xattr.push((k, v.to_vec()));
            }
            Some(KeyKind::Extent) => self.extent(&k, v),
            _ => self.item_problem(&k, format!("unexpected item of {} bytes", v.len())),
        }
        Ok(())
    }

    fn group(&mut self) -> &mut Group {
        self.cur.as_mut().expect("a group is open")
    }

    /// The first item of an inode must be its attributes.
    fn start_group(&mut self, k: &Key, v: &[u8]) {
        if k.kind != KeyKind::Inode as u8 {
            self.item_problem(k, "belongs to no inode");
            self.skip = Some(k.object);
            return;
        }
        let attrs = match decode_inode(k, v) {
            Ok(a) => a,
            Err(e) => {
                self.item_problem(k, e);
                self.skip = Some(k.object);
                return;
            }
        };
        let layout_ok = layout_problem(&attrs, objects_of(&attrs), self.geo).is_none();
        // With a bad layout, extents are not mapped to targets (it may not name one).
        let objects = if layout_ok { objects_of(&attrs) } else { 0 };
        let orphan = self.orphan_index.remove(&attrs.ino.0);
        self.cur = Some(Group {
            layout_ok,
            attrs,
            orphan,
            symlink: Vec::new(),
            xattr: Vec::new(),
            xattr_names: (0, Vec::new()),
            entries: 0,
            cookies: 0,
            entry_sum: 0,
            cookie_sum: 0,
            hash_names: (0, Vec::new()),
            subdirs: 0,
            ext_end: vec![0; objects],
            ext_reported: false,
            eof: None,
        });
    }

    fn entry(&mut self, k: &Key, v: &[u8]) {
        let e = match decode_dir_entry(k, v) {
            Ok(e) => e,
            Err(e) => return self.item_problem(k, e),
        };
        let dir = Ino(k.object);
        if name_hash(self.uuid, &e.name) != k.a || e.cookie < COOKIE_FIRST {
            let d = format!(
                "entry with cookie {} under the wrong hash or cookie",
                e.cookie
            );
            return self.item_problem(k, d);
        }
        if let Some(p) = name_problem(dir, &e.name) {
            self.problem(Some(dir), p);
        }
        let g = self.group();
        if g.hash_names.0 != k.a {
            g.hash_names = (k.a, Vec::new());
        }
        if g.hash_names.1.contains(&e.name) {
            return self.item_problem(k, "a second entry of the same name");
        }
        g.hash_names.1.push(e.name.clone());
        g.entries += 1;
        g.entry_sum = g
            .entry_sum
            .wrapping_add(digest(k.a, k.b, e.cookie, e.ino, e.kind, &e.name));
        if e.kind == FileKind::Directory {
            g.subdirs = g.subdirs.saturating_add(1);
        }
        self.tallies.add_entry(dir, e.ino, e.kind);
    }

    fn cookie(&mut self, k: &Key, v: &[u8]) {
        match decode_dir_cookie(k, v) {
            Ok((e, hash, collision)) if k.b == 0 && k.a == e.cookie => {
                let g = self.group();
                g.cookies += 1;
                g.cookie_sum = g
                    .cookie_sum
                    .wrapping_add(digest(hash, collision, e.cookie, e.ino, e.kind, &e.name));
            }
            Ok(_) => self.item_problem(k, "a cookie item its entry item does not match"),
            Err(e) => self.item_problem(k, e),
        }
    }

    fn extent(&mut self, k: &Key, v: &[u8]) {
        let e = match decode_extent(k, v) {
            Ok(e) => e,
            Err(e) => return self.item_problem(k, e),
        };
        let geo = self.geo;
        let g = self.cur.as_ref().expect("a group is open");
        let a = g.attrs.clone();
        if a.kind != FileKind::Regular {
            if !g.ext_reported {
                self.group().ext_reported = true;
                let p = format!("inode {} of type {:?} owns extents", a.ino, a.kind);
                self.problem(Some(a.ino), p);
            }
            return;
        }
        if !g.layout_ok {
            return; // the layout was reported
        }
        let Some(obj) = u32::try_from(k.a)
            .ok()
            .filter(|o| (*o as usize) < g.ext_end.len())
        else {
            return self.problem(
                Some(a.ino),
                format!("inode {} has no object {}", a.ino, k.a),
            );
        };
        let block = k.b;
        self.extents += 1;
        if block < g.ext_end[obj as usize] {
            let p = format!(
                "inode {} object {obj}: extent at object block {block} overlaps the previous one",
                a.ino
            );
            self.problem(Some(a.ino), p);
        }
        if let Some(p) = extent_problem(a.ino, obj, block, &e, geo.target_count()) {
            return self.problem(Some(a.ino), p);
        }
        self.group().ext_end[obj as usize] = block + e.len;
        let target = e.target;
        if e.state == ExtentState::Written && stripefs_core::csum::datacow(&a) {
            self.blocks.want_csum(target, e.phys, e.len);
        }
        for (p, l, c) in self.refs.pieces(target, e.phys, e.len) {
            if c >= 2 {
                // Claimed once by the index's range; counted here.
                self.shared_seen.push((target, p, l));
            } else if let Err(err) = self.blocks.claim(target, p, l, Claimant::Extent) {
                let p = format!("inode {} object {obj} block {block}: {err}", a.ino);
                self.problem(Some(a.ino), p);
            }
        }
        // The extent holding the EOF block, if the size ends inside a block.
        let bs = geo.block_size;
        if bs.offset_in_block(a.size) != 0 && e.state == ExtentState::Written {
            let piece = a.layout.piece(bs.round_down(a.size), 1);
            let ob = bs.block_of(piece.obj_off);
            if piece.object == obj && ob >= block && ob - block < e.len {
                self.group().eof = Some((target, e.phys + (ob - block)));
            }
        }
    }

    fn xattr_done(&mut self) {
        let items = std::mem::take(&mut self.group().xattr);
        let Some(&(k0, _)) = items.first() else {
            return;
        };
        let name = match decode_xattr(&items) {
            Ok((name, _)) if name_hash(self.uuid, &name) == k0.a => name,
            Ok(_) => return self.item_problem(&k0, "xattr under the wrong hash"),
            Err(e) => return self.item_problem(&k0, e),
        };
        let g = self.group();
        if g.xattr_names.0 != k0.a {
            g.xattr_names = (k0.a, Vec::new());
        }
        if g.xattr_names.1.contains(&name) {
            return self.item_problem(&k0, "a second xattr of the same name");
        }
        g.xattr_names.1.push(name);
    }

    /// Checks the inode whose items have all passed.
    ///
    /// # Errors
    /// Target read errors (its EOF block).
    pub fn finish_group(&mut self) -> Result<()> {
        if self.cur.is_none() {
            return Ok(());
        }
        self.xattr_done();
        let g = self.cur.take().expect("a group is open");
        let a = &g.attrs;
        let ino = a.ino;
        let what = format!("metadata items of inode {ino}");
        let mut out = Vec::new();
        let symlink = if g.symlink.is_empty() {
            Ok(Vec::new())
        } else {
            assemble_symlink(ino, &g.symlink)
        };
        match &symlink {
            Err(e) => out.push(e.to_string()),
            Ok(t) if t.is_empty() && a.kind == FileKind::Symlink && a.nlink != 0 => {
                out.push(format!("symlink {ino} has an empty target"));
            }
            Ok(t) if !t.is_empty() && a.kind != FileKind::Symlink => {
                out.push(format!("{what}: a symlink target in a {:?}", a.kind));
            }
            Ok(_) => {}
        }
        if g.orphan != (a.nlink == 0) {
            out.push(format!(
                "{what}: orphan item {}, link count {}",
                g.orphan, a.nlink
            ));
        }
        if g.cookies != g.entries || g.entry_sum != g.cookie_sum {
            out.push(format!(
                "{what}: {} entries and {} cookie items that do not match them",
                g.entries, g.cookies
            ));
        }
        if g.entries > 0 && a.kind != FileKind::Directory {
            out.push(format!("{what}: entries in a non-directory"));
        }
        if a.kind == FileKind::Directory && a.nlink != 0 && a.nlink != 2 + g.subdirs {
            out.push(format!(
                "directory {ino} has link count {}, expected {}",
                a.nlink,
                2 + g.subdirs
            ));
        }
        if !g.layout_ok {
            out.extend(layout_problem(a, objects_of(a), self.geo));
        }
        if ino.0 >= self.next_ino {
            out.push(format!(
                "inode {ino} is not below the next inode number {}",
                self.next_ino
            ));
        }
        for p in out {
            self.problem(Some(ino), p);
        }
        self.tallies.inode(ino).set_inode(a.kind, a.nlink);
        if a.kind == FileKind::Directory {
            self.tallies.dir(ino).parent = a.parent;
        }
        if let Some((target, phys)) = g.eof.filter(|_| a.nlink != 0) {
            if self.eof_tail_dirty(target, phys, a.size)? {
                self.eof_tails.push(ino.0);
            }
        }
        self.peak_bytes = self.peak_bytes.max(self.tracked_bytes());
        Ok(())
    }

    /// Whether the bytes past EOF in the block at `phys` are not all zero.
    pub fn eof_tail_dirty(&self, target: TargetId, phys: u64, size: u64) -> Result<bool> {
        let bs = self.geo.block_size;
        let Some(t) = self.targets.get(target.index()) else {
            return Ok(false);
        };
        let block = t.read_sync(bs.to_bytes(phys), bs.bytes() as usize)?;
        let tail = bs.offset_in_block(size) as usize;
        Ok(block[tail..].iter().any(|&b| b != 0))
    }

    /// A `TargetState` item: it decodes, names a target of the geometry, and a retired
    /// one has no data area left (recovery gave it none; any claim there is a problem).
    fn target_state_item(&mut self, k: &Key, v: &[u8]) {
        match stripefs_core::btree::schema::decode_target_state(k, v) {
            Ok((t, _)) if t.0 == 0 || t.0 >= self.geo.target_count() => {
                self.item_problem(k, format!("state of target {t}, which cannot have one"));
            }
            Ok(_) => {}
            Err(e) => self.item_problem(k, e),
        }
    }

    /// A `FreeSpace` item of the durable space tree: checked to decode; its run is claimed
    /// by [`Checker::persisted_free_space`], with the page log applied.
    fn free_space_item(&mut self, k: &Key, v: &[u8]) {
        match decode_free_space(k, v) {
            Ok(_) => self.free_items += 1,
            Err(e) => self.item_problem(k, e),
        }
    }

    /// Claims the persisted free space: the space tree's runs with the durable page log
    /// applied (`stripefs_meta::space::free_runs`; the durable tree holds the pages of the
    /// generation before), and the log's blocks as pages (metadata.md, "Persisted free
    /// space"). Call after the walk of every tree and before any journal record is applied.
    ///
    /// # Errors
    /// A page read's error; a page log that does not fit the space tree's runs is a
    /// problem, not an error.
    pub fn persisted_free_space(&mut self, store: &stripefs_meta::Store) -> Result<()> {
        for at in store.log_blocks() {
            self.page(TreeId::Space, at);
        }
        let runs = match stripefs_meta::space::free_runs(store) {
            Ok(r) => r,
            Err(stripefs_meta::MetaError::Corrupted(e)) => {
                self.problem(None, format!("persisted free space: {e}"));
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        for (target, start, len) in runs {
            match self.blocks.claim(target, start, len, Claimant::FreeSpace) {
                Ok(()) => self.free_runs.push((target, start, len)),
                Err(e) => self.problem(
                    None,
                    format!(
                        "free run at target {target} blocks {start}..{}: {e}",
                        start + len
                    ),
                ),
            }
        }
        Ok(())
    }

    /// Every data block must be in use or recorded free: a block that is neither is
    /// leaked. Then the free runs' claims are
    /// dropped (journal records may allocate from them).
    pub fn free_space_complement(&mut self, members: u32) {
        // Free space is always recorded (even a full file system's: no runs at all), on
        // the trees' members (a target the journal adds has none before its record).
        for t in 0..members {
            let target = TargetId(t);
            let runs = self.blocks.unused_runs(target);
            let leaked: u64 = runs.iter().map(|r| r.1).sum();
            if let Some((s, l)) = runs.first() {
                self.problem(
                    None,
                    format!(
                        "target {target}: {leaked} blocks are neither in use nor recorded free (leaked), the first {l} at block {s}"
                    ),
                );
            }
        }
        for (t, s, l) in std::mem::take(&mut self.free_runs) {
            self.blocks.release(t, s, l);
        }
    }
}

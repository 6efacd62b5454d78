//! Per-block data checksums at run time (`docs/design/reflink.md`, "Data checksums").
//!
//! The index lives in the `csum` tree and is never held whole in memory. What the trees
//! do not hold yet (changes of records not applied by the checkpointer) is the
//! [`CsumOverlay`]: runs of changed blocks with the transaction that changed them,
//! dropped once the trees hold that transaction. A lookup ([`Fs::expected_csums`]) asks
//! the overlay (its own small lock, innermost), then reads the trees for the blocks the
//! overlay does not hold, holding no lock of the file system: the checksum of a block a
//! file maps cannot change while the file maps it (a block gets a checksum only when it
//! is written while nothing maps it yet: a new block of a copy-on-write write; it loses it
//! only when it is freed), and the trees apply a record so that a block the record does
//! not change stays covered throughout (`stripefs_meta::csum`). This is the equivalent of
//! decision 57's `MissTicket` for checksums: no ticket is needed because nothing a
//! reader relies on can change under it.
//!
//! Writes: [`WriteCsums`] keeps the checksums computed from the bytes submitted to a
//! target for a datacow file's new (or unwritten) blocks until the completion's
//! transaction logs them (`CsumSet`) with its `ExtentSet` (`Fs::log_remapped`).
//!
//! Reads: [`VerifyRead`] wraps one device read of checksummed blocks: it reads whole
//! blocks (a sub-block read is widened and the caller's bytes copied out), verifies each
//! block, and fails the read with `EIO` on a mismatch, counted and logged once per block.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use stripefs_core::csum::{BlockCsum, CSUM_RUN_MAX};
use stripefs_core::record::Record;
use stripefs_core::{BlockSize, Ino, TargetId};
use stripefs_iomap::Iomap;
use stripefs_target::{
    Completion, IoBuf, IoDone, IoOp, OpKind, Target, TargetError, TargetErrorKind, TargetInfo,
};

use crate::error::{FsError, Result};
use crate::mapping::DevAddr;
use crate::runmap::{RunMap, RunValue};
use crate::Fs;

/// The checksums a record gave a run of blocks, one per block (`None`: cleared).
#[derive(Debug, Clone)]
struct Csums(Option<Vec<BlockCsum>>);

impl RunValue for Csums {
    fn slice(&self, from: u64, to: u64) -> Self {
        let at = |b: u64| usize::try_from(b).expect("in run");
        Csums(self.0.as_ref().map(|v| v[at(from)..at(to)].to_vec()))
    }
}

impl Csums {
    /// Block `b` of the run (counted from its first): its checksum, or `None` (cleared).
    fn block(&self, b: u64) -> Option<BlockCsum> {
        self.0
            .as_ref()
            .map(|v| v[usize::try_from(b).expect("in run")])
    }
}

/// The checksum changes of records the trees do not hold yet (see the module
/// documentation). Its size follows the records not yet applied (a clear is one run
/// however many blocks it covers), never the index.
#[derive(Debug, Default)]
pub(crate) struct CsumOverlay {
    runs: Mutex<RunMap<Csums>>,
}

impl CsumOverlay {
    /// Records a change of `[start, start + len)` of `t` by transaction `seq`.
    pub fn set(&self, t: TargetId, start: u64, len: u64, csums: Option<&[BlockCsum]>, seq: u64) {
        let value = Csums(csums.map(<[BlockCsum]>::to_vec));
        self.runs
            .lock()
            .set(t, start, start.saturating_add(len), value, seq);
    }

    /// Drops the changes of transactions at or below `applied` (the trees hold them):
    /// constant time when there are none.
    pub fn drop_applied(&self, applied: u64) {
        self.runs.lock().drop_applied(applied);
    }

    /// For each block of `[start, start + len)` of `t`: `Some(what the overlay says)`
    /// (`Some(None)`: cleared) or `None` (the trees answer).
    fn lookup(&self, t: TargetId, start: u64, len: u64) -> Vec<Option<Option<BlockCsum>>> {
        let end = start.saturating_add(len);
        let mut out = vec![None; usize::try_from(len).unwrap_or(0)];
        let o = self.runs.lock();
        for (s, r) in o.overlapping(t, start, end) {
            for b in s.max(start)..r.end.min(end) {
                out[usize::try_from(b - start).expect("in range")] = Some(r.value.block(b - s));
            }
        }
        out
    }

    /// Runs held (statistics, tests).
    pub fn runs(&self) -> usize {
        self.runs.lock().len()
    }
}

/// Checksums computed from the bytes a write submitted, until its completion logs them.
#[derive(Debug, Default)]
pub(crate) struct WriteCsums {
    map: Mutex<HashMap<(TargetId, u64), BlockCsum>>,
}

impl WriteCsums {
    /// The checksums of the whole blocks of `bufs`, to be written at `phys..` of `t`.
    pub fn compute(&self, t: TargetId, phys: u64, bufs: &[IoBuf], block_bytes: usize) {
        let mut at = phys;
        let mut got = Vec::new();
        let mut partial: Vec<u8> = Vec::new();
        for b in bufs {
            let mut bytes: &[u8] = b;
            if !partial.is_empty() {
                let take = (block_bytes - partial.len()).min(bytes.len());
                partial.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if partial.len() == block_bytes {
                    got.push((at, BlockCsum::of(&partial)));
                    at += 1;
                    partial.clear();
                }
            }
            let whole = bytes.len() / block_bytes * block_bytes;
            for c in bytes[..whole].chunks(block_bytes) {
                got.push((at, BlockCsum::of(c)));
                at += 1;
            }
            partial.extend_from_slice(&bytes[whole..]);
        }
        debug_assert!(partial.is_empty(), "a checksummed write is whole blocks");
        let mut m = self.map.lock();
        for (b, c) in got {
            m.insert((t, b), c);
        }
    }

    /// Sets the checksum of one block.
    pub fn put(&self, t: TargetId, b: u64, c: BlockCsum) {
        self.map.lock().insert((t, b), c);
    }

    /// Takes the checksums of `[phys, phys + len)` of `t`; `None` if some block has none.
    pub fn take(&self, t: TargetId, phys: u64, len: u64) -> Option<Vec<BlockCsum>> {
        let mut m = self.map.lock();
        let v: Option<Vec<BlockCsum>> = (phys..phys + len).map(|b| m.remove(&(t, b))).collect();
        v
    }

    /// Blocks held (statistics, tests: 0 when no write is in flight).
    pub fn pending(&self) -> usize {
        self.map.lock().len()
    }

    /// Forgets the checksums of `[phys, phys + len)` of `t` (a write that failed).
    pub fn forget(&self, t: TargetId, phys: u64, len: u64) {
        let mut m = self.map.lock();
        for b in phys..phys + len {
            m.remove(&(t, b));
        }
    }

    /// Forgets the checksums of the device write `[pos, pos + len)` through `map` (a
    /// writeback or direct write that failed: its blocks will never be logged).
    pub fn forget_write(&self, bs: BlockSize, map: &Iomap<DevAddr>, pos: u64, len: u64) {
        let first = map.addr.phys + bs.block_of(pos - map.offset);
        self.forget(map.addr.target, first, bs.blocks_for(len));
    }
}

/// Checksum mismatches since mount, and the blocks already logged (once per block).
#[derive(Debug, Default)]
pub(crate) struct CsumErrors {
    pub count: AtomicU64,
    logged: Mutex<HashSet<(TargetId, u64)>>,
}

/// Most distinct blocks logged; later mismatches are only counted.
const LOGGED_MAX: usize = 1024;

impl CsumErrors {
    fn report(&self, what: &ReadCtx, b: u64, want: BlockCsum, got: BlockCsum) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut l = self.logged.lock();
        if l.len() < LOGGED_MAX && l.insert((what.target, b)) {
            let off = what.file_off + (b - what.phys) * what.block_bytes as u64;
            tracing::error!(
                "data checksum mismatch: inode {} offset {off}, target {} ({}) block {b}: \
                 stored {want}, read {got}; the read fails with EIO",
                what.ino,
                what.target,
                what.name
            );
        }
    }
}

/// Where a verified read reads, for the log line.
#[derive(Debug, Clone)]
pub(crate) struct ReadCtx {
    pub ino: Ino,
    /// File offset of block `phys`.
    pub file_off: u64,
    pub target: TargetId,
    pub phys: u64,
    pub block_bytes: usize,
    pub name: Arc<str>,
}

/// One device read of checksummed blocks, as a [`Target`] for `Batch::submit`: see the
/// module documentation.
pub(crate) struct VerifyRead {
    pub target: Arc<dyn Target>,
    pub ctx: ReadCtx,
    /// Expected checksum of each block from `ctx.phys` (`None`: not checked).
    pub want: Vec<Option<BlockCsum>>,
    /// The expected checksums could not be read: the read fails with `EIO`.
    pub lookup_failed: bool,
    pub errors: Arc<CsumErrors>,
}

impl std::fmt::Debug for VerifyRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyRead")
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Target for VerifyRead {
    fn info(&self) -> &TargetInfo {
        self.target.info()
    }

    fn submit(&self, op: IoOp, done: Completion) {
        let IoOp::Read { offset, bufs } = op else {
            return self.target.submit(op, done);
        };
        let bs = self.ctx.block_bytes as u64;
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let first = offset / bs * bs;
        let whole = (offset + len).next_multiple_of(bs) - first;
        let ctx = self.ctx.clone();
        let want = self.want.clone();
        let errors = Arc::clone(&self.errors);
        let name = self.target.info().name.clone();
        let widened = first != offset || whole != len;
        let lookup_failed = self.lookup_failed;
        let (read_bufs, orig) = if widened {
            (vec![IoBuf::zeroed(whole as usize)], Some(bufs))
        } else {
            (bufs, None)
        };
        self.target.submit(
            IoOp::Read {
                offset: first,
                bufs: read_bufs,
            },
            Box::new(move |d: IoDone| {
                let mut result = d.result;
                if lookup_failed && result.is_ok() {
                    result = Err(TargetError::new(
                        name.clone(),
                        OpKind::Read,
                        first,
                        TargetErrorKind::Os(EIO),
                    ));
                }
                let joined: Option<Vec<u8>> = (widened
                    || d.bufs.iter().any(|b| !(b.len() as u64).is_multiple_of(bs)))
                .then(|| d.bufs.iter().flat_map(|b| b.iter().copied()).collect());
                if result.is_ok() {
                    let blocks: Vec<&[u8]> = match &joined {
                        Some(all) => all.chunks(bs as usize).collect(),
                        None => d.bufs.iter().flat_map(|b| b.chunks(bs as usize)).collect(),
                    };
                    let first_block = first / bs;
                    for (i, block) in blocks.into_iter().enumerate() {
                        let b = first_block + i as u64;
                        let Some(Some(w)) = b
                            .checked_sub(ctx.phys)
                            .and_then(|k| want.get(usize::try_from(k).ok()?))
                        else {
                            continue;
                        };
                        let got = BlockCsum::of(block);
                        if got != *w {
                            errors.report(&ctx, b, *w, got);
                            result = Err(TargetError::new(
                                name.clone(),
                                OpKind::Read,
                                b * bs,
                                TargetErrorKind::Os(EIO),
                            ));
                            break;
                        }
                    }
                }
                let bufs = match orig {
                    Some(mut orig) => {
                        if let (Ok(()), Some(all)) = (&result, &joined) {
                            let mut at = usize::try_from(offset - first).expect("in block");
                            for o in &mut orig {
                                let n = o.len();
                                o.copy_from_slice(&all[at..at + n]);
                                at += n;
                            }
                        }
                        orig
                    }
                    None => d.bufs,
                };
                done(IoDone { bufs, result });
            }),
        );
    }
}

/// `EIO`: what a checksum mismatch fails the read with.
const EIO: i32 = 5;

impl Fs {
    /// The expected checksum of each block of `[phys, phys + len)` on `t`: the overlay's
    /// answer, else the trees' (read with no lock of the file system held).
    ///
    /// # Errors
    /// The trees' read or decode error.
    pub(crate) fn expected_csums(
        &self,
        t: TargetId,
        phys: u64,
        len: u64,
    ) -> Result<Vec<Option<BlockCsum>>> {
        let over = self.inner.csum_overlay.lookup(t, phys, len);
        if over.iter().all(Option::is_some) {
            return Ok(over.into_iter().map(Option::flatten).collect());
        }
        let trees =
            stripefs_meta::csum::lookup(&self.inner.store, t, phys, len).map_err(FsError::from)?;
        Ok(over
            .into_iter()
            .zip(trees)
            .map(|(o, tr)| o.unwrap_or(tr))
            .collect())
    }

    /// Whether any block of `[phys, phys + len)` on `t` has a checksum: the overlay, then
    /// for each run of blocks it does not hold one floor and one single-item scan of the
    /// trees, with no lock of the file system held (issue 13's question, asked without
    /// the extent map's lock).
    ///
    /// # Errors
    /// As [`Fs::expected_csums`].
    pub fn csums_exist(&self, t: TargetId, phys: u64, len: u64) -> Result<bool> {
        let over = self.inner.csum_overlay.lookup(t, phys, len);
        if over.iter().any(|o| matches!(o, Some(Some(_)))) {
            return Ok(true);
        }
        // The trees answer only for the blocks the overlay does not hold: a block it
        // holds as cleared may still have its checksum in the trees until the clear is
        // applied (a freed datacow block given to a NOCOW file meanwhile).
        let mut b = 0;
        while b < over.len() {
            if over[b].is_some() {
                b += 1;
                continue;
            }
            let run = over[b..].iter().take_while(|o| o.is_none()).count();
            if stripefs_meta::csum::any(&self.inner.store, t, phys + b as u64, run as u64)
                .map_err(FsError::from)?
            {
                return Ok(true);
            }
            b += run;
        }
        Ok(false)
    }

    /// The `CsumSet` records for a datacow file's blocks `[phys, phys + len)` of `t`,
    /// from the checksums their write computed.
    pub(crate) fn csum_records(&self, t: TargetId, phys: u64, len: u64) -> Vec<Record> {
        let Some(csums) = self.inner.write_csums.take(t, phys, len) else {
            debug_assert!(
                false,
                "no checksums for written blocks {phys}..+{len} of {t}"
            );
            tracing::error!(
                "no checksums computed for written blocks {phys}..+{len} of target {t}"
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut at = phys;
        for chunk in csums.chunks(CSUM_RUN_MAX) {
            out.push(Record::CsumSet {
                target: t,
                phys: at,
                csums: chunk.to_vec(),
            });
            at += chunk.len() as u64;
        }
        out
    }

    /// Verifies one block read outside the I/O paths (a copy on write's source), of
    /// `ino` at file offset `file_off`: `EIO` on a mismatch, counted and logged.
    ///
    /// # Errors
    /// `Io` (`EIO`) on a mismatch; the lookup's error.
    pub(crate) fn verify_block(
        &self,
        ino: Ino,
        file_off: u64,
        t: TargetId,
        phys: u64,
        block: &[u8],
    ) -> Result<()> {
        let Some(want) = self.expected_csums(t, phys, 1)?.pop().flatten() else {
            return Ok(());
        };
        let got = BlockCsum::of(block);
        if got == want {
            return Ok(());
        }
        let target = &self.inner.targets[t.index()];
        let ctx = ReadCtx {
            ino,
            file_off,
            target: t,
            phys,
            block_bytes: block.len(),
            name: target.info().name.clone(),
        };
        self.inner.csum_errors.report(&ctx, phys, want, got);
        Err(TargetError::new(
            ctx.name,
            OpKind::Read,
            phys * block.len() as u64,
            TargetErrorKind::Os(EIO),
        )
        .into())
    }

    /// Checks that the checksum index (the trees with the overlay over them) holds a
    /// checksum exactly for every written block of every datacow file (what the extent
    /// maps derive), and for nothing else: what the model tests check after every
    /// operation. Reads every inode and the whole index under the metadata lock (a test's
    /// check, small file systems only).
    ///
    /// # Errors
    /// The first difference, described, or a read error.
    pub fn check_csums(&self) -> std::result::Result<(), String> {
        let m = self.inner.meta.lock();
        let mut want = std::collections::BTreeSet::new();
        m.state
            .each_inode(&mut |i| {
                if !stripefs_core::csum::datacow(&i.attrs) {
                    return;
                }
                for map in &i.objects {
                    for (_, e) in map.iter() {
                        if e.state == stripefs_core::extent::ExtentState::Written {
                            let t = e.target;
                            want.extend((e.phys..e.phys + e.len).map(|b| (t, b)));
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        let have = self.checksummed_blocks()?;
        drop(m);
        for (&(t, b), c) in &have {
            if !want.remove(&(t, b)) {
                return Err(format!(
                    "checksum {c} of target {t} block {b}, which no written extent of a \
                     copy-on-write file maps"
                ));
            }
        }
        match want.first() {
            Some((t, b)) => Err(format!(
                "target {t} block {b}: written block of a copy-on-write file without a checksum"
            )),
            None => Ok(()),
        }
    }

    /// Every data checksum, the trees with the overlay over them, by `(target, block)`
    /// (tests and tools: memory follows the index). Takes no lock of the file system but
    /// the overlay's: a caller that needs it consistent with the extent maps holds the
    /// metadata lock around it.
    ///
    /// # Errors
    /// A tree that could not be read.
    pub(crate) fn checksummed_blocks(
        &self,
    ) -> std::result::Result<std::collections::BTreeMap<(TargetId, u64), BlockCsum>, String> {
        let mut have = std::collections::BTreeMap::new();
        stripefs_meta::csum::each(&self.inner.store, &mut |t, b, c| {
            have.insert((t, b), c);
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        let o = self.inner.csum_overlay.runs.lock();
        for (t, s, r) in o.iter() {
            for b in s..r.end {
                match r.value.block(b - s) {
                    Some(c) => {
                        have.insert((t, b), c);
                    }
                    None => {
                        have.remove(&(t, b));
                    }
                }
            }
        }
        Ok(have)
    }

    /// Data checksum mismatches since mount.
    #[must_use]
    pub fn csum_errors(&self) -> u64 {
        self.inner.csum_errors.count.load(Ordering::Relaxed)
    }
}

impl crate::mapping::FileMapper<'_> {
    /// Submits a read of a datacow file's written blocks through [`VerifyRead`]: the
    /// expected checksums are looked up first (no lock of the file system held), then the
    /// read is verified at completion. A lookup error fails the read with it.
    pub(crate) fn submit_verified(
        &self,
        batch: &stripefs_target::Batch,
        map: &stripefs_iomap::Iomap<crate::mapping::DevAddr>,
        pos: u64,
        offset: u64,
        bufs: Vec<IoBuf>,
    ) -> usize {
        let inner = &self.fs.inner;
        let bs = inner.geo.block_size;
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let t = map.addr.target;
        let first = bs.block_of(offset);
        let blocks = bs.blocks_for(offset + len) - first;
        let target = Arc::clone(&inner.targets[t.index()]);
        let ctx = ReadCtx {
            ino: self.ino,
            file_off: bs.round_down(pos),
            target: t,
            phys: first,
            block_bytes: bs.bytes() as usize,
            name: target.info().name.clone(),
        };
        // A lookup that fails (a damaged checksum page) fails the read: its bytes
        // could not be verified.
        let (want, lookup_failed) = match self.fs.expected_csums(t, first, blocks) {
            Ok(w) => (w, false),
            Err(e) => {
                tracing::error!(ino = self.ino.0, error = %e, "checksum lookup failed");
                (Vec::new(), true)
            }
        };
        let v = VerifyRead {
            target,
            ctx,
            want,
            lookup_failed,
            errors: Arc::clone(&inner.csum_errors),
        };
        batch.submit(&v, IoOp::Read { offset, bufs })
    }
}

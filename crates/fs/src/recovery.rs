//! Mount-time loading: superblocks, the metadata trees as the newest valid root record
//! leaves them (nothing of them is loaded whole: issue 11 stage 2), and journal replay
//! from the position that root record names.
//!
//! Replay (`replay.rs`) checks each transaction and applies it to the trees in memory,
//! writing nothing, so a crash during it changes nothing. The caller (mount) then
//! checkpoints, which writes the pages; a crash before that checkpoint's root record is
//! durable simply replays again on the same durable trees. fsck uses `open` and
//! `read_journal` read-only.

use std::sync::Arc;

use stripefs_core::geometry::Geometry;
use stripefs_core::journal::{
    decode_header, find_later, log_limit, verify_payload, HeaderMismatch,
};
use stripefs_core::record::{Record, TargetState};
use stripefs_core::superblock::{Superblock, SB_BYTES};
use stripefs_core::CoreError;
use stripefs_meta::{JournalMark, RootSlots, Store, StoreConfig};
use stripefs_target::{AbsentTarget, Target};

use crate::error::{FsError, Result};
use crate::metapages::MetaPages;
use crate::options::{InodeBound, MetaCacheBytes};
use crate::replay::Replayer;

/// What loading found.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub geo: Geometry,
    /// The members sorted by index.
    pub targets: Vec<Arc<dyn Target>>,
    /// Targets given that are not members: formatted by an `add-target` that never
    /// committed (ignored, `targets.md`).
    pub ignored: Vec<String>,
    /// The metadata trees as the durable root record leaves them, with the replayed
    /// transactions applied in memory (not yet written: the mount's checkpoint does).
    pub store: Store,
    /// Their page allocation (not attached to an allocator yet).
    pub pages: Arc<MetaPages>,
    /// Where the durable root record says replay starts.
    pub mark: JournalMark,
    /// Journal position after the last replayed transaction.
    pub head: u64,
    /// Sequence number of the next transaction.
    pub next_seq: u64,
    pub replayed_txns: u64,
    /// Records replayed (applied to the trees).
    pub replayed_records: u64,
    /// The most inodes the replay's checks held at once.
    pub replay_peak_inodes: u64,
    /// Inodes the replay's checks read from the trees.
    pub replay_inode_reads: u64,
    /// Keys the replay gave the store to read ahead.
    pub replay_keys_read_ahead: u64,
    /// Each member's state (read-only and retired ones are persisted, decision 106).
    pub states: Vec<TargetState>,
}

/// Targets in index order with their superblocks.
pub(crate) struct Ordered {
    pub targets: Vec<Arc<dyn Target>>,
    pub superblocks: Vec<Superblock>,
    /// Indices not given: their places hold an `AbsentTarget` and a superblock with an
    /// empty data area (acceptable only for retired targets).
    pub absent: Absence,
}

/// Reads and cross-checks the superblocks; returns the targets in index order.
///
/// # Errors
/// A clear message when a target is not stripefs, damaged, truncated, of another file
/// system, duplicated or missing.
pub(crate) fn read_superblocks(targets: Vec<Arc<dyn Target>>) -> Result<Ordered> {
    if targets.is_empty() {
        return Err(FsError::invalid("no targets given"));
    }
    let mut found: Vec<(Superblock, Arc<dyn Target>)> = Vec::with_capacity(targets.len());
    for t in targets {
        let info = t.info();
        let len = (SB_BYTES as u64).next_multiple_of(u64::from(info.sector_size));
        if info.size_bytes < len {
            return Err(CoreError::corrupted(
                format!("target {}", info.name),
                "too small to hold a superblock",
            )
            .into());
        }
        let buf = t.read_sync(0, len as usize)?;
        let sb = Superblock::decode(&buf, &info.name)?;
        let want = sb.target_blocks * u64::from(sb.block_size);
        if info.size_bytes < want {
            return Err(CoreError::corrupted(
                format!("target {}", info.name),
                format!(
                    "it is {} bytes but its superblock says {want}: truncated, or the wrong device",
                    info.size_bytes
                ),
            )
            .into());
        }
        found.push((sb, t));
    }
    let uuid = found[0].0.uuid;
    for (sb, t) in &found[1..] {
        if sb.uuid != uuid {
            return Err(FsError::invalid(format!(
                "target {} belongs to file system {uuid} but target {} to {}: targets of different file systems",
                found[0].1.info().name,
                t.info().name,
                sb.uuid
            )));
        }
    }
    found.sort_by_key(|(sb, _)| sb.target_index);
    for w in found.windows(2) {
        if w[0].0.target_index == w[1].0.target_index {
            return Err(FsError::invalid(format!(
                "target index {} given twice: {} and {}",
                w[0].0.target_index,
                w[0].1.info().name,
                w[1].1.info().name
            )));
        }
    }
    // Target 0's superblock counts the targets of mkfs; targets added later
    // (`targets.md`) follow them in index order, members once their `TargetAdd` is.
    let have: Vec<u32> = found.iter().map(|(sb, _)| sb.target_index.0).collect();
    if have[0] != 0 {
        return Err(FsError::invalid(format!(
            "file system {uuid}: target 0 (the journal and the root records) was not given; {} targets were given",
            found.len()
        )));
    }
    let count = found[0].0.target_count;
    let (sbs, ts): (Vec<Superblock>, Vec<Arc<dyn Target>>) = found.into_iter().unzip();
    let mut o = Ordered {
        targets: ts,
        superblocks: sbs,
        absent: Absence {
            indices: Vec::new(),
            given: have.len(),
            mkfs_count: count,
        },
    };
    // Indices below the highest given (or below mkfs's count) that were not given are
    // kept as absent places: retired targets need no device (`targets.md`, "Retiring a
    // target"); `load` and fsck refuse any that is not retired.
    o.pad_to(count.max(have.last().map_or(0, |h| h + 1)));
    Ok(o)
}

impl Ordered {
    /// Fills every index below `len` that has no target with an `AbsentTarget` and a
    /// superblock with an empty data area, keeping index order.
    fn pad_to(&mut self, len: u32) {
        let have: Vec<u32> = self.superblocks.iter().map(|s| s.target_index.0).collect();
        let mut found: Vec<(Superblock, Arc<dyn Target>)> = std::mem::take(&mut self.superblocks)
            .into_iter()
            .zip(std::mem::take(&mut self.targets))
            .collect();
        for i in (0..len).filter(|i| !have.contains(i)) {
            let mut sb = found[0].0.clone();
            sb.target_index = stripefs_core::TargetId(i);
            (sb.target_blocks, sb.data_start) = (0, 0);
            let t: Arc<dyn Target> = Arc::new(AbsentTarget::new(i, sb.sector_size));
            found.push((sb, t));
            self.absent.indices.push(i);
        }
        found.sort_by_key(|(sb, _)| sb.target_index);
        self.absent.indices.sort_unstable();
        (self.superblocks, self.targets) = found.into_iter().unzip();
    }
}

/// The indices a mount was given no device for, and what to say when one is needed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Absence {
    pub indices: Vec<u32>,
    /// Targets given.
    pub given: usize,
    /// Target 0's count (the targets mkfs made).
    pub mkfs_count: u32,
}

impl Absence {
    /// Whether index `i` was given no device.
    pub fn contains(&self, i: u32) -> bool {
        self.indices.contains(&i)
    }

    /// The error for members `which` of `members`, given no device (`why` follows).
    pub fn missing(
        &self,
        uuid: stripefs_core::Uuid,
        members: u32,
        which: &str,
        why: &str,
    ) -> FsError {
        let mkfs = self.mkfs_count;
        FsError::invalid(format!(
            "file system {uuid} has {members} targets{} but {} were given (missing target index {which}{why}): give its path too",
            if members > mkfs {
                format!(" ({mkfs} from mkfs and more added)")
            } else {
                " from mkfs".into()
            },
            self.given,
        ))
    }

    /// Every absent member must be retired by the time the journal is replayed
    /// (`states`: each member's state after the replay).
    ///
    /// # Errors
    /// `Invalid` naming the first absent member that is not.
    pub fn check_retired(&self, uuid: stripefs_core::Uuid, states: &[TargetState]) -> Result<()> {
        for &i in &self.indices {
            match states.get(i as usize) {
                None | Some(TargetState::Retired { .. }) => {}
                Some(state) => {
                    let why = format!(", which is {state}, not retired");
                    let members = states.len() as u32;
                    return Err(self.missing(uuid, members, &i.to_string(), &why));
                }
            }
        }
        Ok(())
    }

    /// A metadata read that reached an absent target: that target holds pages, so it is
    /// not retired and its device is missing. Other errors pass through.
    fn unreadable(&self, uuid: stripefs_core::Uuid, e: stripefs_meta::MetaError) -> FsError {
        match &e {
            stripefs_meta::MetaError::Target(t) if AbsentTarget::failed(t) => {
                let list: Vec<String> = self.indices.iter().map(u32::to_string).collect();
                let why = format!(", which the metadata still uses: {e}");
                self.missing(uuid, self.mkfs_count, &list.join(", "), &why)
            }
            _ => e.into(),
        }
    }
}

/// Targets given at mount past the trees' members: each becomes a member if the
/// journal replays its `TargetAdd`; the rest are adds that never committed.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    pub list: Vec<(Superblock, Arc<dyn Target>)>,
}

/// What a `TargetAdd` record says of the target it adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Joining {
    pub target: stripefs_core::TargetId,
    pub data_start: u64,
    pub blocks: u64,
    /// 0 in records of builds before member ids: nothing to compare.
    pub member_id: u64,
}

impl Joining {
    /// The join `rec` records, if it is a `TargetAdd`.
    pub fn of(rec: &Record) -> Option<Joining> {
        match *rec {
            Record::TargetAdd {
                target,
                blocks,
                data_start,
                member_id,
            } => Some(Joining {
                target,
                data_start,
                blocks,
                member_id,
            }),
            _ => None,
        }
    }

    /// Its data area as a geometry.
    pub fn geometry(&self) -> stripefs_core::geometry::TargetGeometry {
        stripefs_core::geometry::TargetGeometry {
            data_start: self.data_start,
            blocks: self.blocks,
        }
    }
}

impl Candidates {
    /// The target a replayed `TargetAdd` (`j`, at `at`) adds.
    ///
    /// # Errors
    /// `Invalid` when it was not given (naming the transaction), or when the target given
    /// with that index carries another member id (a disk an add formatted but never made
    /// a member); `Corrupted` when its superblock does not describe what the record adds.
    pub fn take(&mut self, at: &str, j: Joining) -> Result<(Superblock, Arc<dyn Target>)> {
        let (index, blocks, data_start) = (j.target, j.blocks, j.data_start);
        let Some(pos) = self
            .list
            .iter()
            .position(|(sb, _)| sb.target_index == index)
        else {
            return Err(FsError::invalid(format!(
                "{at} adds target {index} ({blocks} blocks) to this file system, and no target with index {index} was given: give its path too"
            )));
        };
        let (sb, t) = self.list.remove(pos);
        if j.member_id != 0 && sb.member_id != j.member_id {
            return Err(not_the_member(
                t.info().name.as_ref(),
                index,
                sb.member_id,
                j.member_id,
            ));
        }
        if sb.data_start != data_start || sb.target_blocks != blocks {
            return Err(CoreError::corrupted(
                format!("superblock of target {}", t.info().name),
                format!(
                    "says data blocks {}..{} but {at} adds target {index} with {data_start}..{blocks}",
                    sb.data_start, sb.target_blocks
                ),
            )
            .into());
        }
        Ok((sb, t))
    }
}

/// The error for a device whose superblock claims member `index` with member id `has`
/// while the file system's member `index` joined with `want` (decision 118).
fn not_the_member(name: &str, index: stripefs_core::TargetId, has: u64, want: u64) -> FsError {
    FsError::invalid(format!(
        "target {name} has index {index} of this file system but member id {has:#018x}, and member {index} joined with {want:#018x}: it is a disk an add-target formatted but never made a member (or a copy of one); give the device of member {index}"
    ))
}

/// Every member given that joined by `add-target` must carry the member id the trees
/// keep for it.
///
/// # Errors
/// `Invalid` naming the first that does not; the trees' errors.
fn check_member_ids(store: &Store, o: &Ordered, members: usize) -> Result<()> {
    let uuid = o.superblocks[0].uuid;
    for (sb, t) in o.superblocks.iter().zip(&o.targets).take(members) {
        if o.absent.contains(sb.target_index.0) {
            continue;
        }
        let id = store.target_member_id(sb.target_index);
        if let Some(want) = id.map_err(|e| o.absent.unreadable(uuid, e))? {
            if sb.member_id != want {
                let name = t.info().name.to_string();
                return Err(not_the_member(&name, sb.target_index, sb.member_id, want));
            }
        }
    }
    Ok(())
}

/// The metadata store's configuration for `geo`.
pub(crate) fn store_config(geo: &Geometry, cache: MetaCacheBytes) -> StoreConfig {
    StoreConfig {
        uuid: geo.uuid,
        page_size: geo.page_size(),
        block_size: geo.block_size,
        cache_bytes: usize::try_from(cache.0).unwrap_or(usize::MAX),
        slots: RootSlots {
            target: stripefs_core::TargetId(0),
            offsets: geo.root_slot_offsets(),
        },
        space: stripefs_meta::SpaceBooks::Kept,
    }
}

/// The file system opened read-only: superblocks, geometry and the trees of the newest
/// valid root record and its page log (nothing else of the trees loaded).
#[derive(Debug)]
pub(crate) struct Opened {
    pub geo: Geometry,
    /// Targets sorted by their superblock index.
    pub targets: Vec<Arc<dyn Target>>,
    /// The metadata trees as the durable root record leaves them.
    pub store: Store,
    /// Their page allocation (not attached to an allocator yet).
    pub pages: Arc<MetaPages>,
    /// Targets given past the members (`TargetAdd`s in the journal, or adds that never
    /// committed).
    pub candidates: Candidates,
    /// Member indices not given (retired targets: `AbsentTarget`s hold their places;
    /// checked once the journal is replayed: [`Absence::check_retired`]).
    pub absent: Absence,
}

/// Opens the file system read-only: superblocks, geometry, the trees' root record.
///
/// # Errors
/// As [`read_superblocks`]; `Corrupted` for damaged root records.
pub(crate) fn open(targets: Vec<Arc<dyn Target>>, cache: MetaCacheBytes) -> Result<Opened> {
    let mut o = read_superblocks(targets)?;
    let uuid = o.superblocks[0].uuid;
    let mkfs_count = o.absent.mkfs_count;
    // The page log may count members past every index given (a retired target that was
    // the last one added): their places are filled and the store opened again.
    let (store, pages) = loop {
        let all = Geometry::from_superblocks(&o.superblocks)?;
        let pages = Arc::new(MetaPages::for_mount(&all));
        let alloc: Arc<dyn stripefs_meta::PageAlloc> = Arc::clone(&pages) as _;
        match Store::open(store_config(&all, cache), o.targets.clone(), alloc) {
            Err(stripefs_meta::MetaError::TargetNotGiven { members, .. })
                if members as usize > o.targets.len() =>
            {
                o.pad_to(members);
            }
            r => break (r.map_err(|e| o.absent.unreadable(uuid, e))?, pages),
        }
    };
    let members = store.members() as usize;
    if members < mkfs_count as usize {
        let d = format!("counts {members} targets, fewer than the {mkfs_count} of mkfs");
        return Err(CoreError::corrupted("metadata page log", d).into());
    }
    check_member_ids(&store, &o, members)?;
    let states = (0..members as u32)
        .map(|i| store.target_state(stripefs_core::TargetId(i)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| o.absent.unreadable(uuid, e))?;
    let Ordered {
        mut targets,
        superblocks: mut sbs,
        absent,
    } = o;
    // A retired member has no data area, whether its device was given or not.
    for (sb, state) in sbs.iter_mut().zip(&states) {
        if let TargetState::Retired { .. } = state {
            (sb.target_blocks, sb.data_start) = (0, 0);
        }
    }
    pages.set_members(members as u32);
    let candidates = Candidates {
        list: sbs
            .split_off(members)
            .into_iter()
            .zip(targets.split_off(members))
            .filter(|(sb, _)| !absent.contains(sb.target_index.0))
            .collect(),
    };
    Ok(Opened {
        geo: Geometry::from_superblocks(&sbs)?,
        targets,
        store,
        pages,
        candidates,
        absent,
    })
}

/// Loads the whole file system: superblocks, metadata trees, journal replay.
///
/// # Errors
/// As [`read_superblocks`]; `Corrupted` for damaged root records, tree pages or journal
/// records.
pub(crate) fn load(
    targets: Vec<Arc<dyn Target>>,
    cache: MetaCacheBytes,
    inodes: InodeBound,
) -> Result<Loaded> {
    let Opened {
        geo,
        mut targets,
        store,
        pages,
        candidates,
        absent,
    } = open(targets, cache)?;
    // No walk of the pages: the free space is the space tree's (metadata.md, "Persisted
    // free space").
    let mark = store.journal_mark();
    let t0 = Arc::clone(&targets[0]);
    let window = replay_window_keys(&geo, cache);
    let mut r = Replayer::new(&store, geo.clone(), candidates, window, inodes.0);
    let end = read_journal(t0.as_ref(), &geo, mark, &mut |at, recs| r.push(at, recs));
    // The window's transactions come before whatever ended the read: their errors first.
    r.finish()?;
    let end = end?;
    let replayed_records = r.records;
    let replay_peak_inodes = r.peak_inodes;
    let replay_inode_reads = r.inode_reads;
    let replay_keys_read_ahead = r.keys_read_ahead;
    let crate::replay::Members {
        mut geo,
        added,
        left,
    } = r.into_members();
    targets.extend(added);
    // Every member's state as the replayed trees hold it; one retired by a replayed
    // record loses its data area here, as `open` did for those the checkpoint retired.
    let states = (0..geo.target_count())
        .map(|i| store.target_state(stripefs_core::TargetId(i)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // A retirement still in the journal counts: replay never reads a retired target.
    absent.check_retired(geo.uuid, &states)?;
    for (g, s) in geo.targets.iter_mut().zip(&states) {
        if let TargetState::Retired { .. } = s {
            *g = stripefs_core::geometry::TargetGeometry {
                blocks: 0,
                data_start: 0,
            };
        }
    }
    let ignored = left
        .list
        .into_iter()
        .map(|(sb, t)| {
            let name = t.info().name.to_string();
            tracing::warn!(
                target = %name,
                index = sb.target_index.0,
                "ignoring a target formatted for this file system whose add-target never committed; add-target may use it again"
            );
            name
        })
        .collect();
    Ok(Loaded {
        geo,
        targets,
        ignored,
        store,
        pages,
        mark,
        head: end.head,
        next_seq: end.next_seq,
        replayed_txns: end.txns,
        replayed_records,
        replay_peak_inodes,
        replay_inode_reads,
        replay_keys_read_ahead,
        states,
    })
}

/// Distinct keys replay reads ahead at a time: a quarter of the metadata cache's pages
/// (at least 256), so a window's pages, held beyond the cache's budget while the window
/// is applied, add at most that much memory for the moment (decisions.md, 79).
fn replay_window_keys(geo: &Geometry, cache: MetaCacheBytes) -> usize {
    let pages = cache.0 / geo.page_size().bytes() as u64;
    usize::try_from(pages / 4).unwrap_or(usize::MAX).max(256)
}

/// Where a journal transaction is: its sequence number and first journal unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxnAt {
    pub seq: u64,
    pub lsn: u64,
}

impl std::fmt::Display for TxnAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "journal transaction {} at journal unit {}",
            self.seq, self.lsn
        )
    }
}

/// The end of the log [`read_journal`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogEnd {
    /// Journal position after the last transaction.
    pub head: u64,
    /// Sequence number of the next transaction.
    pub next_seq: u64,
    /// Transactions read.
    pub txns: u64,
}

/// Reads `n` journal units from logical position `lsn`, wrapping around the region.
fn read_units(t0: &dyn Target, geo: &Geometry, lsn: u64, n: u64) -> Result<Vec<u8>> {
    let unit = u64::from(geo.journal_unit);
    let cap = geo.journal_units();
    let first = n.min(cap - lsn % cap);
    let mut out = t0
        .read_sync(geo.journal_unit_offset(lsn), (first * unit) as usize)?
        .to_vec();
    if first < n {
        let rest = t0.read_sync(
            geo.journal_unit_offset(lsn + first),
            ((n - first) * unit) as usize,
        )?;
        out.extend_from_slice(&rest);
    }
    Ok(out)
}

/// Bytes of the journal [`LogReader`] reads at a time.
const READ_AHEAD_BYTES: u64 = 4 << 20;

/// Reads the log front to back through a window of [`READ_AHEAD_BYTES`]: replay asks for
/// each transaction's header unit and then its whole length, two synchronous reads per
/// transaction when each went to the target (1,694 for the 847 transactions of a full
/// 128 MiB journal). The window ends at the log's limit past its tail, which no
/// transaction passes and which [`end_of_log`] searches up to anyway, so reading ahead
/// reads nothing a mount did not read before; a request past the window (a damaged
/// header's length) is read as asked.
struct LogReader<'a> {
    t0: &'a dyn Target,
    geo: &'a Geometry,
    /// The log's limit: `log_limit` units past the tail.
    end: u64,
    /// The first unit in `buf`.
    at: u64,
    buf: Vec<u8>,
}

impl<'a> LogReader<'a> {
    fn new(t0: &'a dyn Target, geo: &'a Geometry, mark: JournalMark) -> Self {
        Self {
            t0,
            geo,
            end: mark.tail + log_limit(geo.journal_units()),
            at: mark.tail,
            buf: Vec::new(),
        }
    }

    /// Units `[lsn, lsn + n)`, from the window or read into a new one that starts at
    /// `lsn`.
    fn units(&mut self, lsn: u64, n: u64) -> Result<&[u8]> {
        let unit = u64::from(self.geo.journal_unit);
        let held = self.buf.len() as u64 / unit;
        if lsn < self.at || lsn + n > self.at + held {
            let ahead = (READ_AHEAD_BYTES / unit).min(self.end.saturating_sub(lsn));
            self.buf = read_units(self.t0, self.geo, lsn, n.max(ahead))?;
            self.at = lsn;
        }
        let off = usize::try_from((lsn - self.at) * unit).expect("window fits memory");
        let len = usize::try_from(n * unit).expect("window fits memory");
        Ok(&self.buf[off..off + len])
    }
}

/// Reads the transactions after `mark`, each verified, and hands each one's records to
/// `visit` in journal order (nothing is written).
///
/// The log ends at the first transaction that does not verify. That is a torn final write
/// only if no later transaction follows it; otherwise acknowledged transactions would be
/// dropped, so it is reported as corruption naming the damaged one.
///
/// # Errors
/// Target read errors; `Corrupted` naming the transaction; `visit`'s error.
pub(crate) fn read_journal(
    t0: &dyn Target,
    geo: &Geometry,
    mark: JournalMark,
    visit: &mut dyn FnMut(TxnAt, Vec<Record>) -> Result<()>,
) -> Result<LogEnd> {
    let cap = geo.journal_units();
    let (mut lsn, mut seq) = (mark.tail, mark.seq);
    let mut txns = 0u64;
    let mut log = LogReader::new(t0, geo, mark);
    while lsn - mark.tail < cap {
        let at = TxnAt { seq, lsn };
        let what = at.to_string();
        let room = cap - (lsn - mark.tail);
        let (units, payload) = match read_txn(&mut log, lsn, seq, room)? {
            TxnRead::Found(units, payload) => (units, payload),
            TxnRead::Missing(why) => {
                end_of_log(&mut log, lsn, seq, &what, &why)?;
                break;
            }
        };
        visit(at, Record::decode_all(&payload, &what)?)?;
        txns += 1;
        lsn += units;
        seq += 1;
    }
    Ok(LogEnd {
        head: lsn,
        next_seq: seq,
        txns,
    })
}

/// What is at the position of the next transaction.
enum TxnRead {
    /// The transaction: its length in units and its verified payload.
    Found(u64, Vec<u8>),
    /// Not the transaction expected there, and why (a damaged, stale or foreign header, or
    /// a payload checksum mismatch).
    Missing(String),
}

/// Reads transaction `seq` at `lsn`.
///
/// # Errors
/// Target read errors (never taken for the end of the log).
fn read_txn(log: &mut LogReader<'_>, lsn: u64, seq: u64, room: u64) -> Result<TxnRead> {
    let uuid = log.geo.uuid;
    let hdr = match decode_header(log.units(lsn, 1)?, uuid, lsn, seq, room) {
        Ok(h) => h,
        Err(HeaderMismatch::NotNext(why)) => {
            return Ok(TxnRead::Missing(format!("header not valid ({why})")))
        }
    };
    let whole = log.units(lsn, u64::from(hdr.units))?;
    Ok(match verify_payload(&hdr, whole) {
        Some(p) => TxnRead::Found(u64::from(hdr.units), p.to_vec()),
        None => TxnRead::Missing("payload checksum mismatch".into()),
    })
}

/// Units read at a time while searching for later transactions.
const SCAN_BYTES: u64 = 1 << 20;

/// The log ended at transaction `seq` at `lsn` because of `why`. Fails, naming it, if a
/// later transaction is on disk: the log can only extend [`log_limit`] units past its tail,
/// so every position up to there is searched.
fn end_of_log(log: &mut LogReader<'_>, lsn: u64, seq: u64, what: &str, why: &str) -> Result<()> {
    let (unit, uuid, end) = (log.geo.journal_unit, log.geo.uuid, log.end);
    let step = (SCAN_BYTES / u64::from(unit)).max(1);
    let mut at = lsn;
    while at < end {
        let n = step.min(end - at);
        let units = log.units(at, n)?;
        if let Some((l, s)) = find_later(units, unit, at, uuid, seq) {
            return Err(CoreError::corrupted(
                what.to_string(),
                format!(
                    "{why}, yet later transactions exist (transaction {s} at journal unit {l}): acknowledged changes would be lost"
                ),
            )
            .into());
        }
        at += n;
    }
    Ok(())
}

//! Growing the file system by one target while it is mounted (`add-target`, issue 13;
//! the protocol and its crash argument are in `docs/design/targets.md`).
//!
//! 1. The new target is checked (sector size, size, what its first sector holds) and
//!    given its superblock (index `n`, count `n + 1`) with one FUA write.
//! 2. With every change excluded (the access lock held for writing) and every delayed
//!    allocation written back, the allocator learns the target and a `TargetAdd` record
//!    is logged and committed: the commit point. The store is given the target first,
//!    so the checkpoint that applies the record can put pages there.
//! 3. Only then is the target published to the runtime (`FsInner::targets`): new
//!    files' home targets, which `StripeLayout::target_of` computes from the member
//!    count, may be it from the next change on.

use std::sync::Arc;

use stripefs_core::alloc::Allocator;
use stripefs_core::geometry::TargetGeometry;
use stripefs_core::record::{Record, TargetState};
use stripefs_core::superblock::{Superblock, SB_BYTES, SB_MAGIC};
use stripefs_core::TargetId;
use stripefs_target::{IoBuf, Target};

use crate::error::{FsError, Result};
use crate::fs::Fs;
use crate::journal::CommitMode;
use crate::recovery::Joining;

/// What the first sector of a target offered to `add-target` holds.
#[derive(Debug)]
enum Found {
    /// No stripefs superblock: free to format.
    Blank,
    /// The superblock of this file system's target `n` from an add that never
    /// committed (`n` is the next index): formatted again.
    HalfAdded,
}

impl Fs {
    /// Adds `target` to the mounted file system as target `n` (the member count) and
    /// returns `n`. New files stripe over it from the next change on; existing data
    /// stays where it is. Changes wait while the add runs (it writes back delayed
    /// allocations first); reads go on.
    ///
    /// # Errors
    /// `Invalid` for a target that cannot join (sector size, size, a member already,
    /// another file system's, a damaged stripefs superblock, the target limit);
    /// `ReadOnly`; `Poisoned`; the superblock write's or the commit's I/O error (the
    /// commit's poisons, as every failed commit).
    pub fn add_target(&self, target: Arc<dyn Target>) -> Result<TargetId> {
        self.inner.check()?;
        // Serialises adds with each other and with read-only switches.
        let _switch = self.inner.access_switch.lock();
        let n = TargetId(self.inner.target_count());
        let g = self.check_new_target(target.as_ref(), n)?;
        let joining = Joining {
            target: n,
            data_start: g.data_start,
            blocks: g.blocks,
            member_id: new_member_id(),
        };
        self.write_new_superblock(target.as_ref(), joining)?;
        let access = self.inner.access.write();
        if *access == crate::types::Access::ReadOnly {
            return Err(FsError::ReadOnly);
        }
        self.settle(|_, _| false)?;
        self.no_reservations()?;
        self.commit_target_add(&target, joining)?;
        let at = self
            .inner
            .targets
            .push(target)
            .map_err(|e| FsError::invalid(e.to_string()))?;
        debug_assert_eq!(at, n.index(), "members grow one at a time");
        drop(access);
        tracing::info!(target = n.0, blocks = g.blocks, "target added");
        Ok(n)
    }

    /// Retires `target`, which an evacuation emptied (`Fs::evacuate`): it leaves the
    /// file system for good. Its data area no longer counts in the free space or `df`,
    /// nothing is placed there again, and a later mount does not need its device
    /// (`targets.md`, "Retiring a target"). The `TargetState` record is committed (the
    /// commit point: a later mount replays it) and checkpointed before this returns, so
    /// the device can be detached once the file system is unmounted (this process keeps
    /// it open until then).
    ///
    /// # Errors
    /// `Invalid` for target 0, a target that does not exist, is retired already, is not
    /// read-only (evacuate it first) or still holds blocks; `ReadOnly`; `Poisoned`; the
    /// commit's and the checkpoint's errors.
    pub fn retire_target(&self, target: TargetId) -> Result<()> {
        self.inner.check()?;
        let _switch = self.inner.access_switch.lock();
        let _change = self.begin_change()?;
        let n = self.inner.target_count();
        if target.0 == 0 || target.0 >= n {
            return Err(FsError::invalid(format!(
                "target {target} cannot be retired (the file system has {n} targets; target 0 holds the journal)"
            )));
        }
        if self.inner.states.is_retired(target) {
            return Err(FsError::invalid(format!(
                "target {target} is retired already"
            )));
        }
        if !self.inner.states.is_read_only(target) {
            return Err(FsError::invalid(format!(
                "target {target} is writable: evacuate it first"
            )));
        }
        // What was freed there (the evacuation's old blocks, relocated pages) becomes
        // durable and reaches the trees' free space first.
        self.sync()?;
        self.checkpoint()?;
        let seq = {
            let mut m = self.inner.meta.lock();
            // Cancels and other retirements are serialised by the switch; this is the
            // state every placement decision reads, checked where they are excluded.
            if !self.inner.states.is_read_only(target) || self.inner.states.is_retired(target) {
                return Err(FsError::invalid(format!(
                    "target {target} changed state while it was being retired"
                )));
            }
            let u = self.usage(&m, target);
            if u.extent_blocks + u.page_blocks + u.reserved_blocks > 0 {
                return Err(FsError::invalid(format!(
                    "target {target} still holds {} blocks in extents, {} in metadata pages and {} reserved: evacuate it first",
                    u.extent_blocks, u.page_blocks, u.reserved_blocks
                )));
            }
            let (data_start, blocks) = m.alloc.data_area(target);
            m.alloc
                .retire(target)
                .map_err(|e| FsError::invalid(e.to_string()))?;
            self.inner.states.set_retired(target);
            let rec = Record::TargetState {
                target,
                state: TargetState::Retired { data_start, blocks },
            };
            self.inner.log_all(&mut m, vec![rec])?;
            m.txn.seq
        };
        self.inner
            .journal
            .commit(&self.inner, seq, CommitMode::Append)?;
        self.checkpoint()?;
        tracing::info!(target = target.0, "target retired");
        Ok(())
    }

    /// The new target's layout, once it is found fit to join as target `n`.
    fn check_new_target(&self, t: &dyn Target, n: TargetId) -> Result<TargetGeometry> {
        let geo = &self.inner.geo;
        let info = t.info();
        if n.index() >= stripefs_core::btree::pagelog::MAX_TARGETS {
            return Err(FsError::invalid(format!(
                "the file system has {n} targets, the most it may have"
            )));
        }
        let bs = geo.block_size.bytes();
        if info.sector_size > bs || !info.sector_size.is_power_of_two() {
            return Err(FsError::invalid(format!(
                "target {}: sector size {} does not fit the block size {bs}",
                info.name, info.sector_size
            )));
        }
        // Direct I/O is admitted at the file system's sector size: a target with larger
        // sectors would fail its sub-block direct I/O.
        if info.sector_size > geo.sector_size {
            return Err(FsError::invalid(format!(
                "target {}: sector size {} is larger than the file system's {}",
                info.name, info.sector_size, geo.sector_size
            )));
        }
        let g = geo
            .plan_added(info.size_bytes)
            .map_err(|e| FsError::invalid(format!("target {}: {e}", info.name)))?;
        match self.found_on(t, n)? {
            Found::Blank => {}
            Found::HalfAdded => tracing::warn!(
                target = %info.name,
                "formatting again a target whose earlier add never committed"
            ),
        }
        Ok(g)
    }

    /// Reads the target's first sector: it may be blank (anything but a stripefs
    /// superblock), or the half-done add of exactly index `n` of this file system.
    fn found_on(&self, t: &dyn Target, n: TargetId) -> Result<Found> {
        let info = t.info();
        let len = (SB_BYTES as u64).next_multiple_of(u64::from(info.sector_size));
        if info.size_bytes < len {
            return Err(FsError::invalid(format!(
                "target {} is too small",
                info.name
            )));
        }
        let buf = t.read_sync(0, len as usize)?;
        if buf[..SB_MAGIC.len()] != SB_MAGIC {
            return Ok(Found::Blank);
        }
        let sb = Superblock::decode(&buf, &info.name).map_err(|e| {
            FsError::invalid(format!(
                "{e}: it looks like a damaged stripefs target; erase its first sector to add it"
            ))
        })?;
        let uuid = self.inner.geo.uuid;
        if sb.uuid != uuid {
            return Err(FsError::invalid(format!(
                "target {} belongs to file system {}, not {uuid}: erase its first sector to add it",
                info.name, sb.uuid
            )));
        }
        if sb.target_index != n && self.target_retired(sb.target_index) {
            tracing::warn!(
                target = %info.name,
                index = sb.target_index.0,
                "formatting again a retired target of this file system"
            );
            return Ok(Found::HalfAdded);
        }
        if sb.target_index != n {
            return Err(FsError::invalid(format!(
                "target {} is target {} of this file system already (it has {n} members)",
                info.name, sb.target_index
            )));
        }
        Ok(Found::HalfAdded)
    }

    /// Writes target `n`'s superblock (count `n + 1`) with one FUA write, before the
    /// record that makes it a member.
    fn write_new_superblock(&self, t: &dyn Target, j: Joining) -> Result<()> {
        let mut sb = self.inner.geo.superblock(TargetId(0));
        sb.target_index = j.target;
        sb.target_count = j.target.0 + 1;
        sb.target_blocks = j.blocks;
        sb.data_start = j.data_start;
        sb.member_id = j.member_id;
        let sector = t.info().sector_size as usize;
        let mut buf = sb.encode();
        buf.resize(SB_BYTES.next_multiple_of(sector), 0);
        t.write_fua_sync(0, IoBuf::from_slice(&buf))?;
        Ok(())
    }

    /// With every change excluded and delayed allocations written back, nothing is
    /// promised on any target: no reservation can outlive the member count its home
    /// target was computed with.
    fn no_reservations(&self) -> Result<()> {
        let m = self.inner.meta.lock();
        let held: u64 = (0..self.inner.target_count())
            .map(|t| m.alloc.reserved_blocks(TargetId(t)))
            .sum();
        if held > 0 {
            return Err(FsError::invalid(format!(
                "{held} blocks are still promised to delayed allocations after writeback; try again"
            )));
        }
        Ok(())
    }

    /// The commit point: the allocator and the store learn target `n`, and the
    /// `TargetAdd` record is logged and committed.
    fn commit_target_add(&self, t: &Arc<dyn Target>, j: Joining) -> Result<()> {
        let (n, g) = (j.target, j.geometry());
        let given = self.inner.store.give_target(Arc::clone(t))?;
        if given != n {
            return Err(FsError::invalid(format!(
                "the metadata store holds {given} targets, expected {n}"
            )));
        }
        let seq = {
            let mut m = self.inner.meta.lock();
            m.alloc.add_target(n, g)?;
            let reserve = Allocator::meta_reserve_for(g.data_blocks(), self.inner.geo.block_size);
            m.alloc.set_meta_reserve(n, reserve);
            let rec = Record::TargetAdd {
                target: n,
                blocks: g.blocks,
                data_start: g.data_start,
                member_id: j.member_id,
            };
            self.inner.log_all(&mut m, vec![rec])?;
            m.txn.seq
        };
        self.inner
            .journal
            .commit(&self.inner, seq, CommitMode::Append)
    }
}

/// A random, non-zero member id for a target being added (decision 118).
fn new_member_id() -> u64 {
    let u = crate::fs::random_uuid().0;
    let id = u64::from_le_bytes(u[..8].try_into().expect("8 bytes"))
        ^ u64::from_le_bytes(u[8..].try_into().expect("8 bytes"));
    id.max(1)
}

//! The store's side of the page log (`stripefs_core::btree::pagelog`; the design is in
//! `docs/design/metadata.md`, "Persisted free space").
//!
//! With [`SpaceBooks::Kept`], every checkpoint of generation `G` writes a log of the
//! pages `G` allocated (its trees' pages and the log's own blocks) and freed (the pages
//! it superseded and the blocks of `G - 1`'s log) with its pages, before the flush, and
//! names it in the root record. Once `G` is durable (or the trees are opened at `G`) the
//! log is *pending*: it is folded into the open generation's space tree before the next
//! record is applied or the next checkpoint starts ([`Store::fold_pending`]); reading the
//! free space applies it in memory. So a checkpoint with nothing else to write still
//! finds no dirty page, and a walk of freshly opened trees finds them clean. The log's blocks are
//! allocated with the pages, before the freeze, so a shortage is `NoSpace` with nothing
//! changed.

use std::sync::Arc;

use stripefs_core::btree::pagelog::{self as codec, LogEntry, LogOp, PageLog};
use stripefs_core::btree::root::{LogRef, RootRecord};
use stripefs_core::btree::tree::Frozen;
use stripefs_core::btree::{Generation, PageAddr};
use stripefs_core::{CoreError, TargetId};
use stripefs_target::IoBuf;

use crate::space::{self, SpaceBooks};
use crate::{MetaError, Store};

/// The durable generation's log: its blocks (freed by the next generation) and the pages
/// held per target.
#[derive(Debug)]
pub(crate) struct Durable {
    blocks: Vec<PageAddr>,
    pub(crate) pages: Vec<u64>,
    /// Its changes, until they are folded into the open space tree.
    pending: Vec<LogEntry>,
}

impl Durable {
    pub(crate) fn empty(targets: usize) -> Durable {
        Durable {
            blocks: Vec::new(),
            pages: vec![0; targets],
            pending: Vec::new(),
        }
    }
}

/// A log encoded for the checkpoint writing it.
#[derive(Debug)]
pub(crate) struct Written {
    log: PageLog,
    addrs: Vec<PageAddr>,
    bufs: Vec<Vec<u8>>,
}

impl Written {
    pub(crate) fn blocks(&self) -> impl Iterator<Item = (PageAddr, &[u8])> {
        self.addrs
            .iter()
            .copied()
            .zip(self.bufs.iter().map(Vec::as_slice))
    }

    pub(crate) fn root_ref(&self) -> LogRef {
        LogRef {
            first: self.addrs[0],
            blocks: self.addrs.len() as u32,
        }
    }
}

fn bad_count(t: TargetId) -> MetaError {
    CoreError::corrupted(
        "metadata page log",
        format!("frees more pages of target {t} than it holds"),
    )
    .into()
}

impl Store {
    /// Whether extent changes change the space tree (the store keeps free space).
    pub(crate) fn keeps_space(&self) -> bool {
        self.cfg.space == SpaceBooks::Kept
    }

    /// Blocks of one page.
    pub(crate) fn page_blocks(&self) -> u64 {
        (self.cfg.page_size.bytes() as u64 / u64::from(self.cfg.block_size.bytes())).max(1)
    }

    /// Addresses for the next checkpoint's log, counted before the freeze (the
    /// checkpoint gives back the surplus or tops up after it).
    pub(crate) fn alloc_log(&self) -> Result<Vec<PageAddr>, MetaError> {
        self.alloc.alloc(self.log_pages(0))
    }

    /// Pages the next checkpoint's log takes as [`Store::alloc_log`] sizes it, if `more`
    /// pages are dirtied before it, each superseding a clean one (two log entries each).
    pub(crate) fn log_pages(&self, more: usize) -> usize {
        if self.cfg.space == SpaceBooks::Off {
            return 0;
        }
        let changes = self.changed_pages();
        let (blocks, members) = {
            let d = self.log.lock();
            (d.blocks.len(), d.pages.len())
        };
        codec::blocks_for(self.cfg.page_size, members, changes + 2 * more + blocks)
    }

    /// The log of the frozen generation whose pages go to `addrs`, in `log_addrs` (made
    /// exactly as many as it needs), encoded.
    pub(crate) fn log_of(
        &self,
        frozen: &[Arc<Frozen>],
        addrs: &[Vec<PageAddr>],
        log_addrs: &mut Vec<PageAddr>,
    ) -> Result<Option<Written>, MetaError> {
        if self.cfg.space == SpaceBooks::Off {
            return Ok(None);
        }
        let durable = self.log.lock();
        let entry = |op, at| LogEntry { op, at };
        let mut entries: Vec<LogEntry> = addrs
            .iter()
            .flatten()
            .map(|&a| entry(LogOp::Allocated, a))
            .collect();
        for f in frozen {
            entries.extend(f.superseded().into_iter().map(|a| entry(LogOp::Freed, a)));
        }
        entries.extend(durable.blocks.iter().map(|&a| entry(LogOp::Freed, a)));
        let k = codec::blocks_for(self.cfg.page_size, durable.pages.len(), entries.len());
        if k > log_addrs.len() {
            log_addrs.extend(self.alloc.alloc(k - log_addrs.len())?);
        } else {
            self.alloc.free(&log_addrs.split_off(k));
        }
        entries.extend(log_addrs.iter().map(|&a| entry(LogOp::Allocated, a)));
        let mut pages = durable.pages.clone();
        for e in &entries {
            let p = &mut pages[e.at.target.index()];
            *p = match e.op {
                LogOp::Allocated => *p + 1,
                LogOp::Freed => p.checked_sub(1).ok_or_else(|| bad_count(e.at.target))?,
            };
        }
        let log = PageLog { pages, entries };
        let g = frozen[0].generation;
        let bufs = codec::encode(&log, g, self.cfg.page_size, self.cfg.uuid, log_addrs);
        Ok(Some(Written {
            log,
            addrs: log_addrs.clone(),
            bufs,
        }))
    }

    /// After the root record naming `w` is durable: the previous log's blocks are free,
    /// and `w` is the durable log, its changes pending.
    pub(crate) fn publish_log(&self, w: Written) {
        let old = {
            let mut d = self.log.lock();
            debug_assert!(d.pending.is_empty(), "the checkpoint folded the last log");
            d.pages = w.log.pages;
            d.pending = w.log.entries;
            std::mem::replace(&mut d.blocks, w.addrs)
        };
        self.alloc.free(&old);
    }

    /// Folds the durable generation's page log into the open space tree if that is not
    /// done yet (see the module documentation). A failure poisons the store: the open
    /// space tree may be half changed.
    ///
    /// # Errors
    /// `Corrupted` when the log frees a block the space tree shows free or allocates one
    /// it does not; a page read's error; `Poisoned`.
    pub fn fold_pending(&self) -> Result<(), MetaError> {
        self.live()?;
        let pending = std::mem::take(&mut self.log.lock().pending);
        if pending.is_empty() {
            return Ok(());
        }
        space::fold(self, &pending, self.page_blocks()).inspect_err(|_| {
            self.poisoned
                .store(true, std::sync::atomic::Ordering::Release);
        })
    }

    /// How many of the durable generation's page log entries are not yet folded.
    pub(crate) fn pending_len(&self) -> usize {
        self.log.lock().pending.len()
    }

    /// The durable generation's page log entries not yet folded into the space tree.
    pub(crate) fn pending_log(&self) -> Vec<LogEntry> {
        self.log.lock().pending.clone()
    }

    /// Pages (tree pages and page log blocks) the durable generation holds per target.
    #[must_use]
    pub fn page_counts(&self) -> Vec<u64> {
        self.log.lock().pages.clone()
    }

    /// The blocks of the durable generation's page log (pages no tree reaches, held
    /// until the next generation is durable).
    #[must_use]
    pub fn log_blocks(&self) -> Vec<PageAddr> {
        self.log.lock().blocks.clone()
    }
}

/// Reads generation `rec`'s page log for the just opened trees (its changes pending).
///
/// # Errors
/// `Corrupted` when the record names no log or a block fails verification (named); a
/// read error.
pub(crate) fn open(store: &Store, rec: &RootRecord) -> Result<(), MetaError> {
    let Some(r) = rec.log else {
        let d = format!("generation {} names no page log", rec.generation);
        return Err(CoreError::corrupted("metadata root record", d).into());
    };
    let (log, blocks) = read(store, rec.generation, r)?;
    *store.log.lock() = Durable {
        blocks,
        pages: log.pages,
        pending: log.entries,
    };
    Ok(())
}

fn read(store: &Store, g: Generation, r: LogRef) -> Result<(PageLog, Vec<PageAddr>), MetaError> {
    let mut ctx = (
        store.cfg.page_size,
        store.cfg.uuid,
        store.targets.len() as u32,
    );
    let mut log = PageLog::default();
    let mut blocks = Vec::with_capacity(r.blocks as usize);
    let mut at = r.first;
    let not_given = |target: TargetId, members: u32| MetaError::TargetNotGiven {
        target,
        members,
        generation: g.0,
    };
    for i in 0..r.blocks {
        let Some(t) = store.targets.get(at.target.index()) else {
            if at.target.index() < codec::MAX_TARGETS {
                return Err(not_given(at.target, at.target.0 + 1));
            }
            let what = format!("metadata page log of generation {g}, block {i}");
            return Err(CoreError::corrupted(what, format!("at {at}: no such target")).into());
        };
        let offset = store.cfg.block_size.to_bytes(at.block.0);
        let buf: IoBuf = t.read_sync(offset, store.cfg.page_size.bytes())?;
        let limit = if i == 0 {
            codec::MAX_TARGETS as u32
        } else {
            ctx.2
        };
        let b = codec::decode(&buf, (ctx.0, ctx.1, limit), g, i, at)?;
        if i == 0 && b.pages.len() > ctx.2 as usize {
            let members = b.pages.len() as u32;
            return Err(not_given(TargetId(ctx.2), members));
        }
        if i == 0 {
            log.pages = b.pages;
            ctx.2 = log.pages.len() as u32;
        }
        log.entries.extend(b.entries);
        blocks.push(at);
        at = b.next;
    }
    Ok((log, blocks))
}

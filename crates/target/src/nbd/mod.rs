//! `NbdTarget`: a block device served by another machine over the Network Block Device
//! protocol, written from the protocol specification (`doc/proto.md` of the NBD project;
//! see `docs/design/decisions.md` for why not libnbd).
//!
//! - Opening runs the fixed newstyle handshake with `NBD_OPT_GO`, asking for the block-size
//!   constraints: the minimum block (at least 512) becomes the sector size, the maximum
//!   bounds each request's payload (32 MiB when unstated, as the spec advises).
//! - Operations map one to one: read, write, flush (`NBD_CMD_FLUSH`, only when advertised: a
//!   server without it has no volatile cache), discard (`NBD_CMD_TRIM` when advertised,
//!   otherwise nothing: discarded contents may read back as anything). A write whose bytes
//!   are all zero goes as `NBD_CMD_WRITE_ZEROES` when advertised (no payload on the wire).
//!   A FUA write ([`IoOp::WriteFua`]) goes as `NBD_CMD_WRITE` with `NBD_CMD_FLAG_FUA` when
//!   the server advertises `NBD_FLAG_SEND_FUA`; as a plain write when it has no volatile
//!   cache (no `NBD_FLAG_SEND_FLUSH`); otherwise as a write and a flush
//!   ([`FuaSupport::Emulated`]). [`NbdTarget::supports_fua`] reports the server's flag.
//! - Many requests are in flight on each connection; with `NBD_FLAG_CAN_MULTI_CONN` the
//!   target opens [`NbdOptions::connections`] connections and spreads requests over them
//!   (each request's pieces stay on one connection); one flush on any of them covers writes
//!   completed on all of them, which is what that flag promises.
//! - Failures: a request unanswered after [`NbdOptions::timeout`] fails alone with
//!   `TimedOut` (`EIO`); a lost connection fails everything queued or in flight on it with
//!   `Disconnected` (`EIO`). The next I/O reconnects, with back-off between failed
//!   attempts, and each loss and reconnection is logged. A reconnection to an export whose
//!   size changed is refused.
//! - A lost connection may have lost writes the server acknowledged but had not made
//!   durable (a restarted server). If any write was acknowledged after the last completed
//!   flush when a connection is lost, every later flush of this target fails: a flush must
//!   never report durable what may be gone.

mod conn;
mod proto;
mod uri;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::{fail_now, validate, Completion, IoDone, IoOp, Target, TargetError, TargetInfo};
use crate::{write_then_flush, FuaSupport, OpCounters, OpCounts, OpKind, TargetErrorKind};
use conn::{Conn, ConnParams, OnSuccess, Outcome, Req, Stream};
use proto::{Cmd, Export};
pub use uri::{NbdAddr, NbdUri, NBD_DEFAULT_PORT};

/// How to open an NBD target.
#[derive(Debug, Clone, Copy)]
pub struct NbdOptions {
    /// A request not answered within this time fails with `EIO`; also bounds connecting,
    /// the handshake, and a server that stops reading.
    pub timeout: Duration,
    /// Connections to open when the server advertises multi-conn (otherwise one).
    pub connections: u32,
    /// Requests queued or in flight per connection before submitters wait.
    pub queue_depth: u32,
}

impl Default for NbdOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            connections: 2,
            queue_depth: 64,
        }
    }
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Flush accounting across connections (see the module documentation).
#[derive(Debug, Default)]
struct Durability {
    /// Writes acknowledged so far.
    acked: AtomicU64,
    /// `acked` as it was when the latest successful flush was submitted.
    durable: AtomicU64,
    /// `acked` when a connection was lost with acknowledged, unflushed writes.
    at_risk: AtomicU64,
}

impl Durability {
    fn record(&self, o: Outcome) {
        match o {
            Outcome::WriteAcked => {
                self.acked.fetch_add(1, Ordering::AcqRel);
            }
            Outcome::Flushed { acked_before } => {
                self.durable.fetch_max(acked_before, Ordering::AcqRel);
            }
            Outcome::Other => {}
        }
    }

    fn connection_lost(&self) {
        let acked = self.acked.load(Ordering::Acquire);
        if acked > self.durable.load(Ordering::Acquire) {
            self.at_risk.fetch_max(acked, Ordering::AcqRel);
        }
    }

    fn flush_poisoned(&self) -> bool {
        self.at_risk.load(Ordering::Acquire) > self.durable.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct Slot {
    conn: Option<Arc<Conn>>,
    retry_at: Instant,
    backoff: Duration,
    last_error: String,
}

/// A target served by an NBD server; see the module documentation.
pub struct NbdTarget {
    info: TargetInfo,
    uri: NbdUri,
    opts: NbdOptions,
    export: Export,
    max_payload: u32,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    durability: Arc<Durability>,
    on_success: OnSuccess,
    counters: OpCounters,
    /// The export's lock on this machine (`lock.rs`), held while the target is open.
    _lock: std::fs::File,
}

impl std::fmt::Debug for NbdTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdTarget")
            .field("info", &self.info)
            .field("export", &self.export)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl NbdTarget {
    /// Connects to the export named by `uri` (see [`NbdUri`]), holding its lock on this
    /// machine (`lock.rs`) until dropped.
    ///
    /// # Errors
    /// `Open` errors naming the URI: a malformed URI, an unreachable or refusing server,
    /// or an export whose geometry stripefs cannot use; `InUse`, naming the holder, when
    /// the export is open elsewhere on this machine.
    pub fn open(uri: &str, opts: NbdOptions) -> Result<Self, TargetError> {
        let name: Arc<str> = Arc::from(uri);
        let open_err = |kind| TargetError::new(name.clone(), OpKind::Open, 0, kind);
        let parsed = NbdUri::parse(uri).map_err(|e| open_err(TargetErrorKind::Unusable(e)))?;
        let lock = crate::lock::nbd_lock_file(&parsed)
            .map_err(|e| open_err(TargetErrorKind::Os(e.raw_os_error().unwrap_or(libc::EIO))))?;
        crate::lock::lock(&lock, &name, crate::LockWait::No)?;
        let (sock, export) = connect(&parsed, opts.timeout)
            .map_err(|e| open_err(TargetErrorKind::Disconnected(e)))?;
        let (sector, max_payload) =
            geometry(&export).map_err(|e| open_err(TargetErrorKind::Unusable(e)))?;
        let info = TargetInfo {
            name: name.clone(),
            size_bytes: export.size - export.size % u64::from(sector),
            sector_size: sector,
            fua: if export.has(proto::TF_SEND_FUA) || !export.has(proto::TF_SEND_FLUSH) {
                FuaSupport::Native
            } else {
                FuaSupport::Emulated
            },
        };
        if info.size_bytes == 0 {
            return Err(open_err(TargetErrorKind::Unusable(format!(
                "export is smaller than one {sector}-byte sector"
            ))));
        }
        let durability = Arc::new(Durability::default());
        let d = Arc::clone(&durability);
        let on_success: OnSuccess = Arc::new(move |o| d.record(o));
        let n = if export.has(proto::TF_CAN_MULTI_CONN) {
            opts.connections.clamp(1, 64) as usize
        } else {
            1
        };
        let slots = (0..n)
            .map(|_| {
                Mutex::new(Slot {
                    conn: None,
                    retry_at: Instant::now(),
                    backoff: BACKOFF_MIN,
                    last_error: String::new(),
                })
            })
            .collect();
        let t = Self {
            info,
            uri: parsed,
            opts,
            export,
            max_payload,
            slots,
            next: AtomicUsize::new(0),
            durability,
            on_success,
            counters: OpCounters::default(),
            _lock: lock,
        };
        let first = t
            .start_conn(0, sock)
            .map_err(|e| open_err(TargetErrorKind::Disconnected(e)))?;
        t.slots[0].lock().conn = Some(first);
        for i in 1..n {
            if let Err(e) = t.reconnect(i, &mut t.slots[i].lock()) {
                tracing::warn!(target = %t.info.name, conn = i, error = %e, "extra NBD connection failed; continuing with fewer");
            }
        }
        tracing::info!(
            target = %t.info.name,
            size = t.info.size_bytes,
            sector,
            max_payload,
            flush = export.has(proto::TF_SEND_FLUSH),
            fua = export.has(proto::TF_SEND_FUA),
            trim = export.has(proto::TF_SEND_TRIM),
            write_zeroes = export.has(proto::TF_SEND_WRITE_ZEROES),
            multi_conn = export.has(proto::TF_CAN_MULTI_CONN),
            connections = n,
            "NBD target connected"
        );
        Ok(t)
    }

    /// The parsed URI.
    #[must_use]
    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    /// Connections this target uses (more than one only with multi-conn).
    #[must_use]
    pub fn connections(&self) -> usize {
        self.slots.len()
    }

    /// What an acknowledged write leaves for a flush to cover: nothing on a server without
    /// a volatile cache (no `NBD_FLAG_SEND_FLUSH`), so losing its connection puts nothing
    /// at risk.
    fn write_outcome(&self) -> Outcome {
        if self.export.has(proto::TF_SEND_FLUSH) {
            Outcome::WriteAcked
        } else {
            Outcome::Other
        }
    }

    /// Whether the server advertised `NBD_FLAG_SEND_FUA`.
    #[must_use]
    pub fn supports_fua(&self) -> bool {
        self.export.has(proto::TF_SEND_FUA)
    }

    /// Whether the server advertised `NBD_FLAG_SEND_FLUSH` (without it, acknowledged writes
    /// are durable and flush sends nothing).
    #[must_use]
    pub fn supports_flush(&self) -> bool {
        self.export.has(proto::TF_SEND_FLUSH)
    }

    /// Largest payload of one NBD request.
    #[must_use]
    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    fn start_conn(&self, index: usize, sock: Stream) -> Result<Arc<Conn>, String> {
        let d = Arc::clone(&self.durability);
        let name = self.info.name.clone();
        let on_dead = Arc::new(move |i: usize, why: &str| {
            tracing::warn!(target = %name, conn = i, reason = why, "NBD connection lost; reconnecting on the next I/O");
            d.connection_lost();
        });
        let p = ConnParams {
            index,
            timeout: self.opts.timeout,
            depth: self.opts.queue_depth.clamp(1, 4096) as usize,
            on_dead,
        };
        Conn::start(sock, p)
            .map(Arc::new)
            .map_err(|e| format!("cannot start the connection threads: {e}"))
    }

    /// Connects slot `i` again, unless the last attempt failed less than the back-off ago.
    fn reconnect(&self, i: usize, slot: &mut Slot) -> Result<Arc<Conn>, String> {
        let now = Instant::now();
        if now < slot.retry_at {
            return Err(format!(
                "{} (next reconnection attempt in {:?})",
                slot.last_error,
                slot.retry_at - now
            ));
        }
        let attempt = connect(&self.uri, self.opts.timeout).and_then(|(sock, export)| {
            if export.size != self.export.size {
                return Err(format!(
                    "export size changed from {} to {} bytes; refusing it",
                    self.export.size, export.size
                ));
            }
            self.start_conn(i, sock)
        });
        match attempt {
            Ok(c) => {
                if !slot.last_error.is_empty() || slot.conn.is_some() {
                    tracing::warn!(target = %self.info.name, conn = i, "NBD connection re-established");
                }
                slot.conn = Some(Arc::clone(&c));
                slot.backoff = BACKOFF_MIN;
                slot.last_error.clear();
                Ok(c)
            }
            Err(e) => {
                tracing::warn!(target = %self.info.name, conn = i, error = %e, retry_in = ?slot.backoff, "NBD reconnection failed");
                slot.conn = None;
                slot.last_error = format!("cannot reconnect: {e}");
                slot.retry_at = now + slot.backoff;
                slot.backoff = (slot.backoff * 2).min(BACKOFF_MAX);
                Err(slot.last_error.clone())
            }
        }
    }

    /// A live connection: round robin, reconnecting a dead one on the way.
    fn pick(&self) -> Result<Arc<Conn>, String> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut first_err = None;
        for k in 0..n {
            let i = (start + k) % n;
            let mut slot = self.slots[i].lock();
            if let Some(c) = &slot.conn {
                if c.dead().is_none() {
                    return Ok(Arc::clone(c));
                }
            }
            match self.reconnect(i, &mut slot) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(first_err.unwrap_or_else(|| "no connection".into()))
    }

    fn fail(&self, op: IoOp, done: Completion, kind: TargetErrorKind) {
        let e = TargetError::new(self.info.name.clone(), op.kind(), op.offset(), kind);
        fail_now(op, done, e);
    }
}

/// Connects and runs the handshake, both bounded by `timeout`.
fn connect(uri: &NbdUri, timeout: Duration) -> Result<(Stream, Export), String> {
    let mut sock = Stream::connect(&uri.addr, timeout).map_err(|e| match &uri.addr {
        NbdAddr::Unix(p) => format!("cannot connect to {}: {e}", p.display()),
        NbdAddr::Tcp { host, port } => format!("cannot connect to {host}:{port}: {e}"),
    })?;
    sock.set_timeouts(timeout, timeout)
        .map_err(|e| format!("cannot set socket timeouts: {e}"))?;
    let export = proto::handshake(&mut sock, &uri.export)?;
    Ok((sock, export))
}

/// Sector size and payload limit from the server's block-size constraints.
fn geometry(e: &Export) -> Result<(u32, u32), String> {
    let sector = e.min_block.max(512);
    if !sector.is_power_of_two() || sector > 4096 {
        return Err(format!(
            "server's minimum block size {} is not a power of two up to 4096",
            e.min_block
        ));
    }
    // Smaller requests than the server allows are always legal; 32 MiB keeps one request's
    // share of a connection bounded.
    let max = e.max_block.min(proto::DEFAULT_MAX_PAYLOAD);
    let max = max - max % sector;
    if max == 0 {
        return Err(format!(
            "server's maximum block size {} is below the {sector}-byte sector",
            e.max_block
        ));
    }
    Ok((sector, max))
}

fn all_zero(bufs: &[crate::IoBuf]) -> bool {
    bufs.iter().all(|b| {
        let (head, words, tail) = {
            // SAFETY: reinterpreting initialised bytes as u64 words is valid for any bit
            // pattern; `align_to` handles the unaligned ends.
            unsafe { b.align_to::<u64>() }
        };
        head.iter().all(|&x| x == 0)
            && words.iter().all(|&x| x == 0)
            && tail.iter().all(|&x| x == 0)
    })
}

impl Target for NbdTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn submit(&self, op: IoOp, done: Completion) {
        if let Err(e) = validate(&self.info, &op) {
            return fail_now(op, done, e);
        }
        let read_only = self.export.has(proto::TF_READ_ONLY);
        if self.info.fua == FuaSupport::Emulated && !read_only {
            if let IoOp::WriteFua { offset, bufs } = op {
                return write_then_flush(self, offset, bufs, done);
            }
        }
        self.counters.note(&op);
        let mut flags = 0;
        let (cmd, outcome) = match &op {
            IoOp::Read { .. } => (Cmd::Read, Outcome::Other),
            IoOp::Write { .. } | IoOp::WriteFua { .. } | IoOp::Discard { .. } if read_only => {
                return self.fail(op, done, TargetErrorKind::Os(libc::EROFS));
            }
            IoOp::Write { bufs, .. } => {
                let zeroes = self.export.has(proto::TF_SEND_WRITE_ZEROES) && all_zero(bufs);
                let cmd = if zeroes { Cmd::WriteZeroes } else { Cmd::Write };
                (cmd, self.write_outcome())
            }
            // Durable when acknowledged: it leaves nothing for a flush to cover.
            IoOp::WriteFua { .. } if self.export.has(proto::TF_SEND_FUA) => {
                flags = proto::CMD_FLAG_FUA;
                (Cmd::Write, Outcome::Other)
            }
            // No volatile cache: every write is durable when acknowledged.
            IoOp::WriteFua { .. } => (Cmd::Write, self.write_outcome()),
            IoOp::Discard { .. } if !self.export.has(proto::TF_SEND_TRIM) => {
                return done(IoDone {
                    bufs: Vec::new(),
                    result: Ok(()),
                });
            }
            IoOp::Discard { .. } => (Cmd::Trim, Outcome::Other),
            IoOp::Flush => {
                if self.durability.flush_poisoned() {
                    let why = "a connection was lost after the server acknowledged writes that no flush had covered; they may not be durable".to_string();
                    return self.fail(op, done, TargetErrorKind::Disconnected(why));
                }
                let acked_before = self.durability.acked.load(Ordering::Acquire);
                if !self.export.has(proto::TF_SEND_FLUSH) || read_only {
                    self.durability.record(Outcome::Flushed { acked_before });
                    return done(IoDone {
                        bufs: Vec::new(),
                        result: Ok(()),
                    });
                }
                (Cmd::Flush, Outcome::Flushed { acked_before })
            }
        };
        if op.is_empty() && cmd != Cmd::Flush {
            return done(IoDone {
                bufs: op.into_bufs(),
                result: Ok(()),
            });
        }
        let conn = match self.pick() {
            Ok(c) => c,
            Err(why) => return self.fail(op, done, TargetErrorKind::Disconnected(why)),
        };
        let (kind, offset, len) = (op.kind(), op.offset(), op.len());
        let req = Req::new(
            self.info.name.clone(),
            kind,
            op.into_bufs(),
            done,
            outcome,
            Arc::clone(&self.on_success),
        );
        let deadline = Instant::now() + self.opts.timeout;
        let max = if cmd == Cmd::Flush {
            1
        } else {
            self.max_payload
        };
        let pieces = conn::pieces(&req, (cmd, flags), offset, len, max, deadline);
        if let Err((why, pieces)) = conn.enqueue(pieces) {
            for p in pieces {
                p.req
                    .fail(p.offset, TargetErrorKind::Disconnected(why.clone()));
            }
        }
    }

    fn op_counts(&self) -> Option<OpCounts> {
        Some(self.counters.snapshot())
    }
}

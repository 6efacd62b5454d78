//! FUSE over io_uring (Linux 6.14+; uAPI in `include/uapi/linux/fuse.h`, protocol in the
//! kernel's `Documentation/filesystems/fuse-io-uring.rst`).
//!
//! After `FUSE_INIT` negotiated `FUSE_OVER_IO_URING`, the daemon registers ring entries
//! on its `/dev/fuse` fd with `IORING_OP_URING_CMD` (128-byte SQEs):
//! `FUSE_IO_URING_CMD_REGISTER` hands the kernel an entry's two buffers, a header buffer
//! (`struct fuse_uring_req_header`) and a payload buffer. The kernel keeps one queue per
//! possible CPU and puts a request on the queue of the CPU its caller runs on; it
//! switches from `/dev/fuse` to the ring once every queue has an entry. A request
//! arrives as the completion of an entry's command; the reply goes back with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also re-arms the entry.
//!
//! ```text
//!  entry memory (one mapping per queue, entries back to back):
//!  | header page                                             | payload (max_write)   |
//!  | in_out | op_in | ent_in_out | ...    | in hdr | op hdr  | request args / reply  |
//!  0        128     256          288      ^ copied here so the request is contiguous
//! ```
//!
//! The kernel writes the request's `fuse_in_header` to `in_out`, its per-operation
//! header to `op_in` and the rest of its arguments (names, write data) to the payload.
//! The queue thread copies the two headers (at most 168 bytes) to the end of the header
//! page, right in front of the payload, so the request is one contiguous, 8-byte
//! aligned buffer in the layout a read of `/dev/fuse` gives; fuser's dispatcher takes it
//! from there, and write data stays where the kernel put it (page aligned). A reply is
//! the `fuse_out_header` in `in_out` and its arguments in the payload.
//!
//! Threads: one per queue, pinned to its CPU, waits for completions, dispatches, and
//! commits the replies given during dispatch with its next wait (one system call for
//! the reply and the wait). A reply given later from another thread (a direct I/O
//! completing on a target thread) is written into the entry by that thread and handed
//! to the queue thread (a list and an eventfd the ring keeps a read armed on), which
//! commits it: every command then belongs to the queue thread, and the kernel delivers
//! the entry's next request by waking the queue thread, not the target thread that
//! would otherwise have submitted the command.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use fuser::{Dispatcher, Filesystem, ReplySink};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use parking_lot::Mutex;

/// `sizeof(struct fuse_in_header)`.
const IN_HEADER: usize = 40;
/// `sizeof(struct fuse_out_header)`.
const OUT_HEADER: usize = 16;
/// Offset of `op_in` in `struct fuse_uring_req_header` (`FUSE_URING_IN_OUT_HEADER_SZ`).
const OP_IN: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: the largest per-operation header.
const OP_IN_SIZE: usize = 128;
/// Offset of `ring_ent_in_out` (`struct fuse_uring_ent_in_out`).
const ENT_IN_OUT: usize = OP_IN + OP_IN_SIZE;
/// `sizeof(struct fuse_uring_req_header)`.
const REQ_HEADER: usize = ENT_IN_OUT + 32;
/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Bytes of an entry in front of its payload: the ring header, then the request's
/// headers copied in front of the payload.
const HEADER_PAGE: usize = 4096;
/// `FUSE_MIN_READ_BUFFER`: the kernel's smallest payload buffer.
const MIN_PAYLOAD: usize = 8192;
/// Ring entries over all queues by default (each holds one request in flight).
const ENTRIES_TOTAL: usize = 128;
/// A queue thread gives up on entries the kernel never returns this long after the
/// connection has ended.
const GONE_GRACE: Duration = Duration::from_secs(5);

const _: () = assert!(REQ_HEADER + IN_HEADER + OP_IN_SIZE <= HEADER_PAGE);

/// Entry state bits: a request is being dispatched; its reply has been given.
const DISPATCHING: u8 = 1;
const REPLIED: u8 = 2;

/// The module parameter that lets FUSE use io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why the kernel cannot carry this mount's requests over io_uring, if it cannot:
/// the module parameter, and whether an io_uring with 128-byte SQEs can be set up.
///
/// # Errors
/// The reason, as a sentence for the log or the mount's error.
pub fn probe() -> io::Result<()> {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" => {}
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("FUSE over io_uring is off: {ENABLE_URING} is N; root may write Y to it"),
            ))
        }
        Err(e) => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("this kernel has no FUSE over io_uring ({ENABLE_URING}: {e})"),
            ))
        }
    }
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .map(drop)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot set up an io_uring: {e}")))
}

/// Number of possible CPUs (`/sys/devices/system/cpu/possible`): the kernel makes one
/// queue per possible CPU, and the ring starts only when every one has an entry.
///
/// # Errors
/// The list cannot be read or parsed.
pub fn possible_cpus() -> io::Result<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(list.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cannot parse the possible CPUs {list:?}"),
        )
    })
}

/// Counts the CPUs of a list such as `0-3,5`.
fn parse_cpu_list(list: &str) -> Option<usize> {
    list.split(',').try_fold(0, |n, part| {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
        (lo <= hi).then(|| n + hi - lo + 1)
    })
}

/// The largest request the kernel may send (`max_write`) when its requests are capped
/// at `fs.fuse.max_pages_limit` pages: the payload buffer of every entry is this big.
#[must_use]
pub fn max_write(cap: u32) -> u32 {
    let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        // Kernels before the sysctl capped requests at 256 pages.
        .unwrap_or(256);
    limit
        .saturating_mul(4096)
        .clamp(MIN_PAYLOAD as u32, cap.max(MIN_PAYLOAD as u32))
}

/// Ring entries per queue when the mount does not say: about [`ENTRIES_TOTAL`] in all.
#[must_use]
pub fn default_entries(queues: usize) -> usize {
    (ENTRIES_TOTAL / queues.max(1)).clamp(8, 64)
}

/// Requests served through the rings (for the daemon's status and the tests).
#[derive(Debug, Default)]
pub struct RingStats {
    requests: AtomicU64,
}

impl RingStats {
    /// Requests the rings have carried so far.
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// Anonymous memory for a queue's entries.
struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory; who may touch which entry when is the protocol described on
// `Entry` (the kernel between a command and its completion, the dispatcher or the
// replier otherwise).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(Self { ptr, len })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the ring that could still write to it was
        // dropped first (field order in `Queue`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One ring entry. Its memory belongs to the kernel from a command's submission to its
/// completion; then to the queue thread while it dispatches the request (`DISPATCHING`);
/// the reply is written by whoever gives it, but into the payload only once the
/// dispatch is over when the request had a payload (the request's bytes are borrowed
/// until then), else it waits in `stash`. Whoever sees both "dispatch over" and
/// "replied" commits.
struct Entry {
    base: *mut u8,
    /// The two buffers, at a fixed address while `REGISTER` reads them.
    iov: Box<[libc::iovec; 2]>,
    commit_id: AtomicU64,
    state: AtomicU8,
    /// Payload bytes of the request being dispatched.
    req_payload: AtomicU32,
    /// A reply given while the request it answers was still borrowed.
    stash: Mutex<Option<Vec<u8>>>,
    /// The command to resubmit on `EAGAIN`/`EINTR`.
    last_cmd: AtomicU32,
}

// SAFETY: `base` points into the queue's `Region`; see `Entry` for who touches it when.
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

/// One queue: its ring, its entries, its CPU.
struct Queue {
    qid: u16,
    /// Dropped before `region`: the kernel may write entries until the ring is gone.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fuse_fd: Arc<OwnedFd>,
    /// Serialises pushes onto the submission queue.
    sq: Mutex<()>,
    entries: Vec<Entry>,
    /// Entries whose reply another thread gave after the dispatch: the queue thread
    /// commits them, so every command, and with it the delivery of the entry's next
    /// request, stays on the queue thread (a command belongs to the task that submitted
    /// it: committed from a target's completion thread, the next request would first
    /// have to wake that thread).
    handoff: Mutex<Vec<usize>>,
    /// Wakes the queue thread for `handoff`.
    efd: OwnedFd,
    /// Where the queue's armed read of `efd` lands.
    efd_word: Box<AtomicU64>,
    payload: usize,
    stats: Arc<RingStats>,
    _region: Region,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("qid", &self.qid)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// `user_data` of the armed read of the hand-off eventfd.
const EVENTFD_TOKEN: u64 = u64::MAX;

impl Queue {
    fn new(
        qid: u16,
        fuse_fd: Arc<OwnedFd>,
        entries: usize,
        payload: usize,
        stats: Arc<RingStats>,
    ) -> io::Result<Self> {
        let stride = HEADER_PAGE + payload;
        let region = Region::new(stride * entries)?;
        // One command per entry, plus the eventfd read.
        let slots = u32::try_from((entries + 1).next_power_of_two()).unwrap_or(u32::MAX);
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(slots * 2)
            .build(slots)?;
        let entries = (0..entries)
            .map(|i| {
                // SAFETY: inside the region: i < entries.
                let base = unsafe { region.ptr.as_ptr().add(i * stride) };
                Entry {
                    base,
                    iov: Box::new([
                        libc::iovec {
                            iov_base: base.cast(),
                            iov_len: REQ_HEADER,
                        },
                        libc::iovec {
                            // SAFETY: the payload follows the header page in the region.
                            iov_base: unsafe { base.add(HEADER_PAGE) }.cast(),
                            iov_len: payload,
                        },
                    ]),
                    commit_id: AtomicU64::new(0),
                    state: AtomicU8::new(0),
                    req_payload: AtomicU32::new(0),
                    stash: Mutex::new(None),
                    last_cmd: AtomicU32::new(CMD_REGISTER),
                }
            })
            .collect();
        // SAFETY: eventfd(2) with valid flags; the new fd is owned below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let efd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(efd) };
        Ok(Self {
            qid,
            ring,
            fuse_fd,
            sq: Mutex::new(()),
            entries,
            handoff: Mutex::new(Vec::new()),
            efd,
            efd_word: Box::new(AtomicU64::new(0)),
            payload,
            stats,
            _region: region,
        })
    }

    /// The command (`struct fuse_uring_cmd_req`) for entry `idx`.
    fn cmd_req(&self, commit_id: u64) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }

    /// Pushes entry `idx`'s `cmd_op` onto the submission queue; the queue thread's next
    /// wait submits it. Only the queue thread calls this.
    fn push(&self, idx: usize, cmd_op: u32) -> io::Result<()> {
        let e = &self.entries[idx];
        e.last_cmd.store(cmd_op, Ordering::Relaxed);
        let commit_id = match cmd_op {
            CMD_REGISTER => 0,
            _ => e.commit_id.load(Ordering::Acquire),
        };
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.fuse_fd.as_raw_fd()), cmd_op)
            .cmd(self.cmd_req(commit_id));
        if cmd_op == CMD_REGISTER {
            sqe = sqe.addr(Some(e.iov.as_ptr() as u64));
        }
        let mut sqe = sqe.build().user_data(idx as u64);
        if cmd_op == CMD_REGISTER {
            sqe = with_len(sqe, 2);
        }
        self.push_sqe(&sqe)
    }

    fn push_sqe(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _g = self.sq.lock();
        // SAFETY: every push goes through `sq`, so this is the only view of the
        // submission queue; what the entry points to (an entry's iovec, `efd_word`)
        // lives as long as the queue.
        unsafe { self.ring.submission_shared().push(sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))
    }

    /// Arms a read of the hand-off eventfd.
    fn arm_handoff(&self) -> io::Result<()> {
        let sqe = opcode::Read::new(
            types::Fd(self.efd.as_raw_fd()),
            self.efd_word.as_ptr().cast::<u8>(),
            8,
        )
        .build()
        .user_data(EVENTFD_TOKEN);
        self.push_sqe(&squeue::Entry128::from(sqe))
    }

    /// Commits the replies other threads handed off.
    fn take_handoff(&self) {
        let list = std::mem::take(&mut *self.handoff.lock());
        for idx in list {
            self.commit(idx);
        }
    }

    /// Another thread gave entry `idx`'s reply after the dispatch: the queue thread
    /// commits it. The eventfd is written only when the list was empty.
    fn hand_off(&self, idx: usize) {
        let wake = {
            let mut h = self.handoff.lock();
            h.push(idx);
            h.len() == 1
        };
        if wake {
            let one = 1u64;
            // SAFETY: an 8-byte write of a valid u64 to our eventfd.
            let n =
                unsafe { libc::write(self.efd.as_raw_fd(), std::ptr::from_ref(&one).cast(), 8) };
            if n != 8 {
                tracing::error!(qid = self.qid, error = %io::Error::last_os_error(), "cannot wake a FUSE ring thread");
            }
        }
    }

    /// Registers every entry. A refused entry completes at once with the error.
    fn register(&self) -> io::Result<Vec<cqueue::Entry>> {
        for idx in 0..self.entries.len() {
            self.push(idx, CMD_REGISTER)?;
        }
        self.arm_handoff()?;
        self.ring.submitter().submit()?;
        // SAFETY: only this (the queue) thread reads the completion queue.
        let early: Vec<cqueue::Entry> = unsafe { self.ring.completion_shared() }.collect();
        if let Some(bad) = early
            .iter()
            .find(|c| c.result() < 0 && c.user_data() != EVENTFD_TOKEN)
        {
            let e = io::Error::from_raw_os_error(-bad.result());
            return Err(io::Error::new(
                e.kind(),
                format!("FUSE_IO_URING_CMD_REGISTER on queue {}: {e}", self.qid),
            ));
        }
        Ok(early)
    }

    /// Serves requests until every entry has ended (the connection went away).
    fn serve<FS: Filesystem>(
        self: &Arc<Self>,
        dispatcher: &Dispatcher<FS>,
        early: Vec<cqueue::Entry>,
    ) {
        let sinks: Vec<Arc<dyn ReplySink>> = (0..self.entries.len())
            .map(|idx| {
                Arc::new(EntrySink {
                    queue: Arc::clone(self),
                    idx,
                }) as Arc<dyn ReplySink>
            })
            .collect();
        let mut live = self.entries.len();
        for c in early {
            live -= usize::from(self.complete(&c, dispatcher, &sinks));
        }
        let mut gone_since = None;
        while live > 0 {
            let ts = types::Timespec::new().sec(1);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) => {
                    return tracing::error!(qid = self.qid, %e, "FUSE ring wait failed; queue stops");
                }
            }
            // SAFETY: only this thread reads the completion queue.
            let done: Vec<cqueue::Entry> = unsafe { self.ring.completion_shared() }.collect();
            for c in &done {
                live -= usize::from(self.complete(c, dispatcher, &sinks));
            }
            if done.is_empty() && self.connection_gone() {
                let since = *gone_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > GONE_GRACE {
                    return tracing::warn!(
                        qid = self.qid,
                        live,
                        "FUSE connection ended but ring entries never came back"
                    );
                }
            }
        }
    }

    /// `/dev/fuse` reports an error once the connection is aborted or unmounted.
    fn connection_gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fuse_fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
    }

    /// Handles one completion; true when the entry has ended.
    fn complete<FS: Filesystem>(
        &self,
        c: &cqueue::Entry,
        dispatcher: &Dispatcher<FS>,
        sinks: &[Arc<dyn ReplySink>],
    ) -> bool {
        if c.user_data() == EVENTFD_TOKEN {
            self.take_handoff();
            if c.result() < 0 {
                tracing::error!(qid = self.qid, error = %io::Error::from_raw_os_error(-c.result()), "FUSE ring hand-off read failed");
            }
            if let Err(e) = self.arm_handoff() {
                tracing::error!(qid = self.qid, %e, "cannot re-arm the FUSE ring hand-off");
            }
            return false;
        }
        let Some(idx) = usize::try_from(c.user_data())
            .ok()
            .filter(|&i| i < self.entries.len())
        else {
            tracing::error!(
                qid = self.qid,
                user_data = c.user_data(),
                "unknown ring completion"
            );
            return false;
        };
        match -c.result() {
            0 => {
                self.request(idx, dispatcher, &sinks[idx]);
                false
            }
            libc::EAGAIN | libc::EINTR => {
                let cmd = self.entries[idx].last_cmd.load(Ordering::Relaxed);
                if let Err(e) = self.push(idx, cmd) {
                    tracing::error!(qid = self.qid, %e, "cannot resubmit a ring entry");
                    return true;
                }
                false
            }
            // The connection ended (unmount, abort): the entry is released.
            libc::ENOTCONN | libc::ECONNABORTED => true,
            errno => {
                tracing::error!(
                    qid = self.qid,
                    error = %io::Error::from_raw_os_error(errno),
                    "FUSE ring entry failed; the kernel no longer uses it"
                );
                true
            }
        }
    }

    /// The kernel put a request in entry `idx`: make it contiguous and dispatch it.
    fn request<FS: Filesystem>(
        &self,
        idx: usize,
        dispatcher: &Dispatcher<FS>,
        sink: &Arc<dyn ReplySink>,
    ) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let e = &self.entries[idx];
        let base = e.base;
        // SAFETY: the kernel filled the header before completing the command and does
        // not touch the entry again until the next commit.
        let (in_len, unique, commit_id, payload_sz) = unsafe {
            (
                read_u32(base, 0) as usize,
                read_u64(base, 8),
                read_u64(base, ENT_IN_OUT + 8),
                read_u32(base, ENT_IN_OUT + 16) as usize,
            )
        };
        e.commit_id.store(commit_id, Ordering::Release);
        let op_len = in_len
            .checked_sub(IN_HEADER + payload_sz)
            .filter(|&n| n <= OP_IN_SIZE && n % 8 == 0 && payload_sz <= self.payload);
        e.req_payload.store(
            u32::try_from(payload_sz).unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );
        e.state.store(DISPATCHING, Ordering::Release);
        let dispatched = match op_len {
            Some(op_len) => {
                let start = HEADER_PAGE - IN_HEADER - op_len;
                // SAFETY: source and destination lie in this entry's header page and do
                // not overlap (start >= REQ_HEADER, asserted at compile time); the
                // request is then `in_len` contiguous bytes from `start`, which ends
                // inside the payload (payload_sz <= payload); nothing writes there while
                // it is borrowed (see `Entry`).
                let bytes = unsafe {
                    std::ptr::copy_nonoverlapping(base, base.add(start), IN_HEADER);
                    std::ptr::copy_nonoverlapping(
                        base.add(OP_IN),
                        base.add(start + IN_HEADER),
                        op_len,
                    );
                    std::slice::from_raw_parts(base.add(start).cast_const(), in_len)
                };
                dispatcher.dispatch(bytes, Arc::clone(sink))
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ring request of {in_len} bytes with a {payload_sz}-byte payload"),
            )),
        };
        if let Err(err) = dispatched {
            tracing::error!(qid = self.qid, %err, "bad FUSE request on the ring; answering EIO");
            let mut h = [0u8; OUT_HEADER];
            h[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            h[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            h[8..16].copy_from_slice(&unique.to_ne_bytes());
            let _ = self.reply(idx, &[IoSlice::new(&h)]);
        }
        self.dispatch_over(idx);
    }

    /// The queue thread is done with entry `idx`'s request bytes.
    fn dispatch_over(&self, idx: usize) {
        let e = &self.entries[idx];
        let prev = e.state.fetch_and(!DISPATCHING, Ordering::AcqRel);
        if prev & REPLIED != 0 {
            self.commit(idx);
        }
    }

    /// Gives the reply to entry `idx`'s request (`ReplySink::send`).
    fn reply(&self, idx: usize, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.entries[idx];
        let borrowed = e.state.load(Ordering::Acquire) & DISPATCHING != 0
            && e.req_payload.load(Ordering::Relaxed) > 0;
        if borrowed {
            *e.stash.lock() = Some(data.iter().flat_map(|s| s.iter().copied()).collect());
        } else {
            self.write_reply(idx, data);
        }
        let prev = e.state.fetch_or(REPLIED, Ordering::AcqRel);
        if prev & DISPATCHING == 0 {
            self.hand_off(idx);
        }
        Ok(())
    }

    /// Commits entry `idx`'s reply (the stashed one if there is one) and re-arms it,
    /// with the queue thread's next wait.
    fn commit(&self, idx: usize) {
        let e = &self.entries[idx];
        if let Some(v) = e.stash.lock().take() {
            self.write_reply(idx, &[IoSlice::new(&v)]);
        }
        e.state.store(0, Ordering::Release);
        if let Err(err) = self.push(idx, CMD_COMMIT_AND_FETCH) {
            tracing::error!(qid = self.qid, %err, "cannot commit a FUSE reply on the ring");
        }
    }

    /// Writes a reply (`fuse_out_header` and arguments) into entry `idx`.
    fn write_reply(&self, idx: usize, data: &[IoSlice<'_>]) {
        let base = self.entries[idx].base;
        let total: usize = data.iter().map(|s| s.len()).sum();
        let mut header = [0u8; OUT_HEADER];
        let mut at = 0;
        let mut body = 0usize;
        let body_fits = total >= OUT_HEADER && total - OUT_HEADER <= self.payload;
        for s in data {
            let chunk: &[u8] = s;
            let h = chunk.len().min(OUT_HEADER.saturating_sub(at));
            header[at..at + h].copy_from_slice(&chunk[..h]);
            at += h;
            let rest = &chunk[h..];
            if body_fits && !rest.is_empty() {
                // SAFETY: body + rest.len() <= total - OUT_HEADER <= payload, inside this
                // entry's payload, which nothing else reads or writes now.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        rest.as_ptr(),
                        base.add(HEADER_PAGE + body),
                        rest.len(),
                    );
                }
                body += rest.len();
            }
        }
        if !body_fits {
            tracing::error!(
                qid = self.qid,
                total,
                "FUSE reply larger than the ring payload; answering EIO"
            );
            header[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            body = 0;
        }
        // SAFETY: the out header goes to `in_out`, the payload size to `ring_ent_in_out`,
        // both in this entry's header page, which nothing else touches now.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), base, OUT_HEADER);
            std::ptr::copy_nonoverlapping(
                u32::try_from(body).unwrap_or(0).to_ne_bytes().as_ptr(),
                base.add(ENT_IN_OUT + 16),
                4,
            );
        }
    }
}

/// Where fuser sends the reply to a request that came in entry `idx`.
#[derive(Debug)]
struct EntrySink {
    queue: Arc<Queue>,
    idx: usize,
}

impl ReplySink for EntrySink {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        self.queue.reply(self.idx, data)
    }
}

/// Sets the SQE's `len` (for `REGISTER`, the number of iovecs), which the `io-uring`
/// crate's `UringCmd80` does not expose.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)`: the 64-byte `io_uring_sqe` then 64 bytes of
    // command; every byte pattern is a valid value, and `len` is the u32 at offset 24
    // of `struct io_uring_sqe`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(raw) }
}

/// # Safety
/// `base + at .. + 4` must be readable.
unsafe fn read_u32(base: *const u8, at: usize) -> u32 {
    // SAFETY: the caller's promise.
    unsafe { base.add(at).cast::<u32>().read_unaligned() }
}

/// # Safety
/// `base + at .. + 8` must be readable.
unsafe fn read_u64(base: *const u8, at: usize) -> u64 {
    // SAFETY: the caller's promise.
    unsafe { base.add(at).cast::<u64>().read_unaligned() }
}

/// Pins the calling thread to `cpu`, so a queue's requests are served where they
/// were made. A failure costs only locality.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        tracing::debug!(cpu, error = %io::Error::last_os_error(), "FUSE ring thread not pinned");
    }
}

/// The rings of one mount, set up after `FUSE_INIT` negotiated `FUSE_OVER_IO_URING`.
#[derive(Debug)]
pub struct Rings {
    queues: Vec<Arc<Queue>>,
    stats: Arc<RingStats>,
}

impl Rings {
    /// One queue per possible CPU with `entries` entries of `payload` bytes each, on a
    /// duplicate of the session's `/dev/fuse` fd. Nothing is registered yet.
    ///
    /// # Errors
    /// No memory, or the io_uring could not be set up.
    pub fn new(session: BorrowedFd<'_>, entries: usize, payload: usize) -> io::Result<Self> {
        let fd = Arc::new(session.try_clone_to_owned()?);
        let stats = Arc::new(RingStats::default());
        let payload = payload.max(MIN_PAYLOAD);
        let queues = (0..possible_cpus()?)
            .map(|q| {
                let qid = u16::try_from(q).map_err(|_| io::Error::other("too many CPUs"))?;
                Queue::new(
                    qid,
                    Arc::clone(&fd),
                    entries.max(1),
                    payload,
                    Arc::clone(&stats),
                )
                .map(Arc::new)
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { queues, stats })
    }

    /// Requests served so far.
    #[must_use]
    pub fn stats(&self) -> Arc<RingStats> {
        Arc::clone(&self.stats)
    }

    /// What to call the transport.
    #[must_use]
    pub fn transport(&self) -> crate::Transport {
        crate::Transport::Uring {
            queues: self.queues.len(),
            entries: self.queues.first().map_or(0, |q| q.entries.len()),
        }
    }

    /// Registers and serves every queue on a thread of its own, pinned to its CPU;
    /// each queue's registration result goes to `registered`. Returns when every queue
    /// has ended (the connection went away).
    ///
    /// # Errors
    /// A queue thread could not be started.
    pub fn run<FS: Filesystem>(
        self,
        dispatcher: Dispatcher<FS>,
        registered: mpsc::Sender<io::Result<()>>,
    ) -> io::Result<()> {
        let mut threads = Vec::new();
        for q in self.queues {
            let d = dispatcher.clone();
            let tx = registered.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("stripefs-ring{}", q.qid))
                .spawn(move || {
                    pin_to(usize::from(q.qid));
                    match q.register() {
                        Ok(early) => {
                            let _ = tx.send(Ok(()));
                            q.serve(&d, early);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let _ = registered.send(Err(io::Error::new(
                        e.kind(),
                        format!("cannot start a FUSE ring thread: {e}"),
                    )));
                }
            }
        }
        drop(dispatcher);
        for t in threads {
            t.join()
                .map_err(|_| io::Error::other("FUSE ring thread panicked"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0-3,5,7-8"), Some(7));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn sqe_len_lands_in_the_len_field() {
        let sqe = opcode::UringCmd80::new(types::Fd(3), CMD_REGISTER)
            .addr(Some(0x1000))
            .build();
        // SAFETY: as in `with_len`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(with_len(sqe, 2)) };
        assert_eq!(raw[0], opcode::UringCmd80::CODE);
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        assert_eq!(u64::from_ne_bytes(raw[16..24].try_into().unwrap()), 0x1000);
    }

    #[test]
    fn default_entries_stay_in_bounds() {
        assert_eq!(default_entries(2), 64);
        assert_eq!(default_entries(64), 8);
        assert_eq!(default_entries(0), 64);
    }
}

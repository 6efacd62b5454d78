//! One NBD connection in transmission phase: a writer thread sending requests from a queue
//! and a reader thread matching simple replies to requests by cookie.
//!
//! ```text
//!  submit --pieces--> [queue] --writer--> socket --> server
//!                        |                             |
//!                   [in flight by cookie] <--reader--- replies  -> done(IoDone), once
//! ```
//!
//! Every caller operation is a [`Req`]; it is sent as one or more pieces (requests of at
//! most the server's payload limit), all on the same connection. A piece's buffers are
//! lent to the thread moving its payload and never touched under a lock, so no lock is held
//! across socket I/O. A request not answered within the timeout fails alone (`TimedOut`);
//! its late reply is read and dropped. A socket error, end of stream, protocol violation or
//! a server that stops reading or answering kills the connection: every queued and
//! in-flight request fails (`Disconnected`), and the target reconnects on its next I/O.

use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::proto::{self, Cmd, REPLY_LEN};
use super::uri::NbdAddr;
use crate::{Completion, IoBuf, IoDone, OpKind, TargetError, TargetErrorKind};

/// A connected socket of either family.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn connect(addr: &NbdAddr, timeout: Duration) -> std::io::Result<Self> {
        match addr {
            NbdAddr::Unix(p) => UnixStream::connect(p).map(Stream::Unix),
            NbdAddr::Tcp { host, port } => {
                let mut last = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "host has no address")
                }))
            }
        }
    }

    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub(crate) fn set_timeouts(&self, read: Duration, write: Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(b),
            Stream::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a finished request reports to the target (durability accounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    WriteAcked,
    /// A flush succeeded; it covers writes acknowledged before it was submitted.
    Flushed {
        acked_before: u64,
    },
    Other,
}

/// Called once per request that completed successfully.
pub(crate) type OnSuccess = Arc<dyn Fn(Outcome) + Send + Sync>;

/// Called once when a connection dies (not when it is closed): its index and why.
pub(crate) type OnDead = Arc<dyn Fn(usize, &str) + Send + Sync>;

/// One caller operation, completed exactly once.
pub(crate) struct Req {
    name: Arc<str>,
    kind: OpKind,
    outcome: Outcome,
    on_success: OnSuccess,
    inner: Mutex<ReqInner>,
}

struct ReqInner {
    /// `None` while lent to the thread moving a piece's payload.
    bufs: Option<Vec<IoBuf>>,
    done: Option<Completion>,
    /// Pieces not yet answered.
    remaining: usize,
    error: Option<TargetError>,
    /// Fail as soon as the buffers are back (timeout or lost connection).
    abort: bool,
}

impl Req {
    pub(crate) fn new(
        name: Arc<str>,
        kind: OpKind,
        bufs: Vec<IoBuf>,
        done: Completion,
        outcome: Outcome,
        on_success: OnSuccess,
    ) -> Arc<Self> {
        Arc::new(Self {
            name,
            kind,
            outcome,
            on_success,
            inner: Mutex::new(ReqInner {
                bufs: Some(bufs),
                done: Some(done),
                remaining: 0,
                error: None,
                abort: false,
            }),
        })
    }

    fn error(&self, offset: u64, kind: TargetErrorKind) -> TargetError {
        TargetError::new(self.name.clone(), self.kind, offset, kind)
    }

    /// Records the answer to one piece.
    fn piece_done(&self, offset: u64, res: Result<(), TargetErrorKind>) {
        let mut g = self.inner.lock();
        if g.done.is_none() {
            return;
        }
        if let Err(k) = res {
            if g.error.is_none() {
                g.error = Some(self.error(offset, k));
            }
        }
        debug_assert!(g.remaining > 0, "more answers than pieces");
        g.remaining -= 1;
        self.complete_if_ready(g);
    }

    /// Fails the whole request now (or as soon as its buffers are back).
    pub(crate) fn fail(&self, offset: u64, kind: TargetErrorKind) {
        let mut g = self.inner.lock();
        if g.done.is_none() {
            return;
        }
        if g.error.is_none() {
            g.error = Some(self.error(offset, kind));
        }
        g.abort = true;
        self.complete_if_ready(g);
    }

    fn is_finished(&self) -> bool {
        self.inner.lock().done.is_none()
    }

    /// Takes the buffers for moving a payload; `None` once the request has completed.
    fn lend(&self) -> Option<Vec<IoBuf>> {
        let mut g = self.inner.lock();
        g.done.as_ref()?;
        let bufs = g.bufs.take();
        debug_assert!(bufs.is_some(), "buffers lent twice");
        bufs
    }

    fn give_back(&self, bufs: Vec<IoBuf>) {
        let mut g = self.inner.lock();
        g.bufs = Some(bufs);
        self.complete_if_ready(g);
    }

    fn complete_if_ready(&self, mut g: parking_lot::MutexGuard<'_, ReqInner>) {
        if g.bufs.is_none() || !(g.remaining == 0 || g.abort) {
            return;
        }
        let (Some(done), Some(bufs)) = (g.done.take(), g.bufs.take()) else {
            return;
        };
        let result = match g.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        drop(g);
        if result.is_ok() {
            (self.on_success)(self.outcome);
        }
        done(IoDone { bufs, result });
    }
}

/// One NBD request of a [`Req`]: `len` bytes at `offset`, payload at byte `at` of the
/// request's buffers.
#[derive(Clone)]
pub(crate) struct Piece {
    pub req: Arc<Req>,
    pub cmd: Cmd,
    /// Command flags (`NBD_CMD_FLAG_*`) sent with every piece.
    pub flags: u16,
    pub offset: u64,
    pub len: u32,
    pub at: usize,
    pub deadline: Instant,
}

/// Splits a request into pieces of at most `max` bytes (one piece for a flush).
pub(crate) fn pieces(
    req: &Arc<Req>,
    (cmd, flags): (Cmd, u16),
    offset: u64,
    len: u64,
    max: u32,
    deadline: Instant,
) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut done = 0u64;
    loop {
        let n = (len - done).min(u64::from(max));
        out.push(Piece {
            req: Arc::clone(req),
            cmd,
            flags,
            offset: offset + done,
            len: u32::try_from(n).expect("piece bounded by a u32"),
            at: usize::try_from(done).expect("in-memory buffers"),
            deadline,
        });
        done += n;
        if done >= len {
            break;
        }
    }
    req.inner.lock().remaining = out.len();
    out
}

struct Sent {
    piece: Piece,
    expired: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Piece>,
    inflight: HashMap<u64, Sent>,
    /// In flight and not yet timed out (what back-pressure counts).
    live: usize,
    next_cookie: u64,
    dead: Option<String>,
    closing: bool,
}

struct Shared {
    index: usize,
    sock: Stream,
    state: Mutex<State>,
    work: Condvar,
    space: Condvar,
    timeout: Duration,
    tick: Duration,
    depth: usize,
    on_dead: OnDead,
}

/// A live connection; dropping it sends `NBD_CMD_DISC` and joins its threads.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("index", &self.shared.index)
            .field("dead", &self.shared.state.lock().dead)
            .finish()
    }
}

/// Parameters of a connection.
pub(crate) struct ConnParams {
    pub index: usize,
    pub timeout: Duration,
    pub depth: usize,
    pub on_dead: OnDead,
}

impl Conn {
    /// Starts the threads of a connection whose handshake is done.
    pub(crate) fn start(sock: Stream, p: ConnParams) -> std::io::Result<Self> {
        let tick = (p.timeout / 8).clamp(Duration::from_millis(10), Duration::from_millis(250));
        sock.set_timeouts(tick, p.timeout)?;
        let reader_sock = sock.try_clone()?;
        let writer_sock = sock.try_clone()?;
        let shared = Arc::new(Shared {
            index: p.index,
            sock,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            space: Condvar::new(),
            timeout: p.timeout,
            tick,
            depth: p.depth.max(1),
            on_dead: p.on_dead,
        });
        let mut conn = Self {
            shared: Arc::clone(&shared),
            writer: None,
            reader: None,
        };
        let s = Arc::clone(&shared);
        conn.writer = Some(
            std::thread::Builder::new()
                .name("stripefs-nbd-tx".into())
                .spawn(move || writer(&s, writer_sock))?,
        );
        let s = Arc::clone(&shared);
        conn.reader = Some(
            std::thread::Builder::new()
                .name("stripefs-nbd-rx".into())
                .spawn(move || reader(&s, reader_sock))?,
        );
        Ok(conn)
    }

    /// Why the connection is dead, if it is.
    pub(crate) fn dead(&self) -> Option<String> {
        self.shared.state.lock().dead.clone()
    }

    /// Queues the pieces of one request, waiting while the connection is at its depth.
    ///
    /// # Errors
    /// The connection is dead (the pieces are given back for failing).
    pub(crate) fn enqueue(&self, pieces: Vec<Piece>) -> Result<(), (String, Vec<Piece>)> {
        let s = &self.shared;
        let mut st = s.state.lock();
        loop {
            if let Some(why) = &st.dead {
                return Err((why.clone(), pieces));
            }
            if st.queue.len() + st.live < s.depth {
                break;
            }
            s.space.wait(&mut st);
        }
        st.queue.extend(pieces);
        drop(st);
        s.work.notify_one();
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.state.lock().closing = true;
        self.shared.work.notify_all();
        let me = std::thread::current().id();
        if let Some(w) = self.writer.take() {
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
        self.shared.sock.shutdown();
        if let Some(r) = self.reader.take() {
            if r.thread().id() != me {
                let _ = r.join();
            }
        }
        kill(&self.shared, "target closed".into());
    }
}

/// Marks the connection dead and fails everything queued or in flight.
fn kill(s: &Shared, why: String) {
    let (queued, inflight, closing) = {
        let mut st = s.state.lock();
        if st.dead.is_some() {
            return;
        }
        st.dead = Some(why.clone());
        st.live = 0;
        let q: Vec<Piece> = st.queue.drain(..).collect();
        let f: Vec<Piece> = st.inflight.drain().map(|(_, sent)| sent.piece).collect();
        (q, f, st.closing)
    };
    s.sock.shutdown();
    s.work.notify_all();
    s.space.notify_all();
    if !closing {
        (s.on_dead)(s.index, &why);
    }
    for p in queued.into_iter().chain(inflight) {
        p.req
            .fail(p.offset, TargetErrorKind::Disconnected(why.clone()));
    }
}

fn writer(s: &Shared, mut sock: Stream) {
    loop {
        let piece = {
            let mut st = s.state.lock();
            loop {
                if st.dead.is_some() {
                    return;
                }
                if let Some(p) = st.queue.pop_front() {
                    break p;
                }
                if st.closing {
                    // Polite goodbye; the reader sees the end of the stream.
                    let h = proto::request(Cmd::Disconnect, 0, u64::MAX, 0, 0);
                    drop(st);
                    let _ = sock.write_all(&h);
                    return;
                }
                s.work.wait(&mut st);
            }
        };
        // A piece of a request that already completed (another piece timed out) is
        // dropped unsent.
        let bufs = if piece.cmd == Cmd::Write {
            match piece.req.lend() {
                Some(b) => Some(b),
                None => continue,
            }
        } else if piece.req.is_finished() {
            continue;
        } else {
            None
        };
        let cookie = {
            let mut st = s.state.lock();
            let cookie = st.next_cookie;
            st.next_cookie += 1;
            if st.dead.is_none() {
                st.live += 1;
                let sent = Sent {
                    piece: piece.clone(),
                    expired: false,
                };
                st.inflight.insert(cookie, sent);
            }
            cookie
        };
        let res = send(&mut sock, cookie, &piece, bufs.as_deref());
        if let Some(b) = bufs {
            piece.req.give_back(b);
        }
        if let Err(e) = res {
            let why = if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                format!("server stopped reading requests for {:?}", s.timeout)
            } else {
                format!("sending a request: {e}")
            };
            piece
                .req
                .fail(piece.offset, TargetErrorKind::Disconnected(why.clone()));
            kill(s, why);
            return;
        }
    }
}

/// Sends one piece: the header, and for a write the payload from the lent buffers.
fn send(sock: &mut Stream, cookie: u64, p: &Piece, bufs: Option<&[IoBuf]>) -> std::io::Result<()> {
    let header = proto::request(p.cmd, p.flags, cookie, p.offset, p.len);
    let Some(bufs) = bufs else {
        return sock.write_all(&header);
    };
    let mut slices = vec![IoSlice::new(&header)];
    slices.extend(byte_range(bufs, p.at, p.len as usize).map(IoSlice::new));
    write_all_vectored(sock, &mut slices)
}

/// The parts of `bufs` covering `len` bytes from byte `at`.
fn byte_range(bufs: &[IoBuf], at: usize, len: usize) -> impl Iterator<Item = &[u8]> {
    let mut skip = at;
    let mut want = len;
    bufs.iter().filter_map(move |b| {
        if want == 0 {
            return None;
        }
        if skip >= b.len() {
            skip -= b.len();
            return None;
        }
        let n = (b.len() - skip).min(want);
        let s = &b[skip..skip + n];
        skip = 0;
        want -= n;
        Some(s)
    })
}

fn write_all_vectored(sock: &mut Stream, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        match sock.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether the reader may wait indefinitely for the first byte (between replies).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Idle,
    MidReply,
}

struct Rx<'a> {
    s: &'a Shared,
    sock: Stream,
    next_scan: Instant,
}

impl Rx<'_> {
    /// Fills `buf`, scanning for timed-out requests whenever the socket is quiet.
    fn read_full(&mut self, buf: &mut [u8], wait: Wait) -> Result<(), String> {
        let mut got = 0;
        let mut quiet_since = Instant::now();
        while got < buf.len() {
            match self.sock.read(&mut buf[got..]) {
                Ok(0) => return Err("server closed the connection".into()),
                Ok(n) => {
                    got += n;
                    quiet_since = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    self.scan();
                    let st = self.s.state.lock();
                    if let Some(why) = &st.dead {
                        return Err(why.clone());
                    }
                    drop(st);
                    let mid = got > 0 || wait == Wait::MidReply;
                    if mid && quiet_since.elapsed() > self.s.timeout {
                        return Err(format!(
                            "server stalled for {:?} in the middle of a reply",
                            self.s.timeout
                        ));
                    }
                }
                Err(e) => return Err(format!("receiving a reply: {e}")),
            }
        }
        Ok(())
    }

    /// Fails requests past their deadline (each alone); kills a connection whose server
    /// has stopped answering altogether.
    fn scan(&mut self) {
        let now = Instant::now();
        if now < self.next_scan {
            return;
        }
        self.next_scan = now + self.s.tick;
        let mut expired = Vec::new();
        let abandoned = {
            let mut st = self.s.state.lock();
            let mut keep = VecDeque::with_capacity(st.queue.len());
            for p in st.queue.drain(..) {
                if p.deadline <= now {
                    expired.push(p);
                } else {
                    keep.push_back(p);
                }
            }
            st.queue = keep;
            let mut newly = 0;
            for sent in st.inflight.values_mut() {
                if !sent.expired && sent.piece.deadline <= now {
                    sent.expired = true;
                    newly += 1;
                    expired.push(sent.piece.clone());
                }
            }
            st.live -= newly;
            st.inflight.len() - st.live
        };
        if !expired.is_empty() {
            self.s.space.notify_all();
        }
        let after_ms = u64::try_from(self.s.timeout.as_millis()).unwrap_or(u64::MAX);
        for p in expired {
            p.req.fail(p.offset, TargetErrorKind::TimedOut { after_ms });
        }
        if abandoned > self.s.depth {
            kill(
                self.s,
                format!("server left {abandoned} requests unanswered past the timeout"),
            );
        }
    }

    fn discard(&mut self, mut len: usize) -> Result<(), String> {
        let mut scratch = vec![0u8; len.min(64 << 10)];
        while len > 0 {
            let n = len.min(scratch.len());
            self.read_full(&mut scratch[..n], Wait::MidReply)?;
            len -= n;
        }
        Ok(())
    }

    fn read_payload(&mut self, p: &Piece) -> Result<(), String> {
        let Some(mut bufs) = p.req.lend() else {
            return self.discard(p.len as usize);
        };
        let mut res = Ok(());
        let mut skip = p.at;
        let mut want = p.len as usize;
        for b in &mut bufs {
            if want == 0 {
                break;
            }
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            let n = (b.len() - skip).min(want);
            res = self.read_full(&mut b[skip..skip + n], Wait::MidReply);
            if res.is_err() {
                break;
            }
            skip = 0;
            want -= n;
        }
        p.req.give_back(bufs);
        res
    }

    /// Reads and dispatches one reply.
    fn one(&mut self) -> Result<(), String> {
        self.scan();
        let mut h = [0u8; REPLY_LEN];
        self.read_full(&mut h, Wait::Idle)?;
        let r = proto::reply(&h)?;
        let sent = {
            let mut st = self.s.state.lock();
            let sent = st.inflight.remove(&r.cookie);
            if sent.as_ref().is_some_and(|x| !x.expired) {
                st.live -= 1;
            }
            sent
        };
        self.s.space.notify_one();
        let Some(Sent { piece, .. }) = sent else {
            return Err(format!("reply for unknown cookie {}", r.cookie));
        };
        if r.error != 0 {
            let kind = match proto::errno(r.error) {
                libc::ENOSPC => TargetErrorKind::NoSpace,
                e => TargetErrorKind::Os(e),
            };
            piece.req.piece_done(piece.offset, Err(kind));
            return Ok(());
        }
        if piece.cmd == Cmd::Read {
            if let Err(why) = self.read_payload(&piece) {
                piece.req.piece_done(
                    piece.offset,
                    Err(TargetErrorKind::Disconnected(why.clone())),
                );
                return Err(why);
            }
        }
        piece.req.piece_done(piece.offset, Ok(()));
        Ok(())
    }
}

fn reader(s: &Shared, sock: Stream) {
    let mut rx = Rx {
        s,
        sock,
        next_scan: Instant::now(),
    };
    loop {
        if let Err(why) = rx.one() {
            kill(s, why);
            return;
        }
    }
}

//! A recording NBD proxy for tests: it listens on a Unix socket, forwards every connection
//! to an upstream server's Unix socket, and parses both directions (written from the NBD
//! project's `doc/proto.md`, independently of the client under test) so that it can
//!
//! - log every request and reply it forwards ([`Wire`]), with the command flags as sent,
//!   so a test can check what the client put on the wire (`NBD_CMD_FLAG_FUA`, flush order);
//! - feed a [`Recorder`] with the server-side durability events, so a crash test can
//!   rebuild what a restarted server would hold at any point: a write or write-zeroes is
//!   logged when its successful reply passes (before the client can see it), as a FUA
//!   write when it carried `NBD_CMD_FLAG_FUA`; a flush is logged when its *request* passes,
//!   because the protocol makes a flush cover exactly the writes completed before it was
//!   sent. Trims are not logged (a server may leave trimmed blocks as they were);
//! - misbehave on demand ([`FlushMode::AckWithoutForwarding`]) so a test can prove that
//!   it notices a lost flush.
//!
//! Only what the client in `stripefs-target` negotiates is understood: the fixed newstyle
//! handshake ending in `NBD_OPT_GO` (or `NBD_OPT_EXPORT_NAME`), and simple replies.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stripefs_target::{Event, Recorder};

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISCONNECT: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Transmission flags: `NBD_FLAG_SEND_FLUSH`, `NBD_FLAG_SEND_FUA`.
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// One request or reply that passed the proxy, in the order the proxy saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Request {
        conn: usize,
        cookie: u64,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
    },
    Reply {
        conn: usize,
        cookie: u64,
        cmd: u16,
        error: u32,
    },
}

/// What the proxy does with a flush request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// Forward it (and log it as a durability event).
    Forward,
    /// Answer success itself and never tell the server: a broken server or client that
    /// loses flushes. Nothing is logged, so nothing becomes durable.
    AckWithoutForwarding,
}

#[derive(Debug)]
struct Shared {
    upstream: PathBuf,
    target: u32,
    recorder: Option<Arc<Recorder>>,
    wire: Mutex<Vec<Wire>>,
    drop_flushes: AtomicBool,
    flush_reply_delay: Mutex<Duration>,
    flush_errors: AtomicUsize,
    export_flags: AtomicU16,
    conns: AtomicUsize,
    stop: AtomicBool,
}

/// A running proxy; stops accepting connections when dropped.
pub struct Proxy {
    listen: PathBuf,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on `listen` and forwards to the server on `upstream`; durability events go
    /// to `recorder` under target number `target`.
    pub fn start(
        listen: &Path,
        upstream: &Path,
        target: u32,
        recorder: Option<Arc<Recorder>>,
    ) -> Self {
        let _ = std::fs::remove_file(listen);
        let l = UnixListener::bind(listen).expect("bind the proxy socket");
        let shared = Arc::new(Shared {
            upstream: upstream.to_path_buf(),
            target,
            recorder,
            wire: Mutex::new(Vec::new()),
            drop_flushes: AtomicBool::new(false),
            flush_reply_delay: Mutex::new(Duration::ZERO),
            flush_errors: AtomicUsize::new(0),
            export_flags: AtomicU16::new(0),
            conns: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        std::thread::spawn(move || accept_loop(&l, &s));
        Self {
            listen: listen.to_path_buf(),
            shared,
        }
    }

    /// The URI a client uses to reach the server through this proxy.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.listen.display())
    }

    pub fn set_flush_mode(&self, m: FlushMode) {
        self.shared
            .drop_flushes
            .store(m == FlushMode::AckWithoutForwarding, Ordering::SeqCst);
    }

    /// Holds every flush reply this long before forwarding it.
    pub fn set_flush_reply_delay(&self, d: Duration) {
        *self.shared.flush_reply_delay.lock().unwrap() = d;
    }

    /// Everything forwarded so far.
    pub fn wire(&self) -> Vec<Wire> {
        self.shared.wire.lock().unwrap().clone()
    }

    /// Flushes the server failed (the recorded durability model assumes none).
    pub fn flush_errors(&self) -> usize {
        self.shared.flush_errors.load(Ordering::SeqCst)
    }

    /// The transmission flags the server sent in its last handshake.
    pub fn export_flags(&self) -> u16 {
        self.shared.export_flags.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.listen); // wakes the accept loop
        let _ = std::fs::remove_file(&self.listen);
    }
}

fn accept_loop(l: &UnixListener, s: &Arc<Shared>) {
    for c in l.incoming() {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = c else { continue };
        let Ok(server) = UnixStream::connect(&s.upstream) else {
            continue; // the client sees the connection close, as with a dead server
        };
        let conn = s.conns.fetch_add(1, Ordering::SeqCst);
        let pending = Arc::new(Mutex::new(HashMap::new()));
        let to_client = Arc::new(Mutex::new(client.try_clone().expect("clone socket")));
        let c2s = Half {
            shared: Arc::clone(s),
            conn,
            pending: Arc::clone(&pending),
            to_client: Arc::clone(&to_client),
        };
        let s2c = Half {
            shared: Arc::clone(s),
            conn,
            pending,
            to_client,
        };
        let up = server.try_clone().expect("clone socket");
        std::thread::spawn(move || {
            let _ = c2s.client_to_server(client, up);
        });
        std::thread::spawn(move || {
            let _ = s2c.server_to_client(server);
        });
    }
}

/// A request waiting for its reply: its command, flags, offset, length and payload.
type Pending = Arc<Mutex<HashMap<u64, (u16, u16, u64, u32, Option<Arc<[u8]>>)>>>;

/// One direction of one proxied connection.
struct Half {
    shared: Arc<Shared>,
    conn: usize,
    pending: Pending,
    to_client: Arc<Mutex<UnixStream>>,
}

fn read_n(s: &mut impl Read, n: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

impl Half {
    fn client_to_server(&self, mut c: UnixStream, mut s: UnixStream) -> std::io::Result<()> {
        let r = self.client_to_server_inner(&mut c, &mut s);
        let _ = s.shutdown(std::net::Shutdown::Write);
        r
    }

    fn client_to_server_inner(
        &self,
        c: &mut UnixStream,
        s: &mut UnixStream,
    ) -> std::io::Result<()> {
        s.write_all(&read_n(c, 4)?)?; // client flags
        loop {
            let h = read_n(c, 16)?;
            assert_eq!(
                be64(&h),
                IHAVEOPT,
                "proxy: bad option magic from the client"
            );
            let (opt, len) = (be32(&h[8..]), be32(&h[12..]));
            let data = read_n(c, len as usize)?;
            s.write_all(&h)?;
            s.write_all(&data)?;
            if opt == OPT_GO || opt == OPT_EXPORT_NAME {
                break;
            }
        }
        loop {
            let h = read_n(c, 28)?;
            assert_eq!(be32(&h), REQUEST_MAGIC, "proxy: bad request magic");
            let (flags, cmd, cookie) = (be16(&h[4..]), be16(&h[6..]), be64(&h[8..]));
            let (offset, len) = (be64(&h[16..]), be32(&h[24..]));
            let payload = if cmd == CMD_WRITE {
                Some(Arc::from(read_n(c, len as usize)?))
            } else {
                None
            };
            self.shared.wire.lock().unwrap().push(Wire::Request {
                conn: self.conn,
                cookie,
                cmd,
                flags,
                offset,
                len,
            });
            if cmd == CMD_FLUSH && self.shared.drop_flushes.load(Ordering::SeqCst) {
                self.answer_flush_ourselves(cookie)?;
                continue;
            }
            if cmd == CMD_FLUSH {
                // Covers every write whose reply already passed: log it before it reaches
                // the server (the recorder's order is the proxy's order).
                self.record(Event::Flush {
                    target: self.shared.target,
                });
            }
            self.pending
                .lock()
                .unwrap()
                .insert(cookie, (cmd, flags, offset, len, payload.clone()));
            s.write_all(&h)?;
            if let Some(p) = payload {
                s.write_all(&p)?;
            }
            if cmd == CMD_DISCONNECT {
                return Ok(());
            }
        }
    }

    fn answer_flush_ourselves(&self, cookie: u64) -> std::io::Result<()> {
        let mut r = Vec::with_capacity(16);
        r.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        r.extend_from_slice(&0u32.to_be_bytes());
        r.extend_from_slice(&cookie.to_be_bytes());
        self.shared.wire.lock().unwrap().push(Wire::Reply {
            conn: self.conn,
            cookie,
            cmd: CMD_FLUSH,
            error: 0,
        });
        self.to_client.lock().unwrap().write_all(&r)
    }

    fn record(&self, e: Event) {
        if let Some(r) = &self.shared.recorder {
            r.push(e);
        }
    }

    fn server_to_client(&self, mut s: UnixStream) -> std::io::Result<()> {
        let r = self.server_to_client_inner(&mut s);
        let _ = self
            .to_client
            .lock()
            .unwrap()
            .shutdown(std::net::Shutdown::Both);
        r
    }

    fn server_to_client_inner(&self, s: &mut UnixStream) -> std::io::Result<()> {
        self.forward(&read_n(s, 18)?)?; // NBDMAGIC, IHAVEOPT, handshake flags
        loop {
            let h = read_n(s, 20)?;
            let (typ, len) = (be32(&h[12..]), be32(&h[16..]));
            let data = read_n(s, len as usize)?;
            if typ == REP_INFO && data.len() >= 12 && be16(&data) == 0 {
                self.shared
                    .export_flags
                    .store(be16(&data[10..]), Ordering::SeqCst);
            }
            let mut m = h.clone();
            m.extend_from_slice(&data);
            self.forward(&m)?;
            if typ == REP_ACK {
                break;
            }
            if typ & REP_FLAG_ERROR != 0 {
                return Ok(()); // the client gives up or falls back; not proxied further
            }
        }
        loop {
            let h = read_n(s, 16)?;
            assert_eq!(
                be32(&h),
                SIMPLE_REPLY_MAGIC,
                "proxy: unexpected reply magic"
            );
            let (error, cookie) = (be32(&h[4..]), be64(&h[8..]));
            let (cmd, flags, offset, len, payload) = self
                .pending
                .lock()
                .unwrap()
                .remove(&cookie)
                .expect("proxy: reply to a request never sent");
            let mut m = h;
            if cmd == CMD_READ && error == 0 {
                m.extend_from_slice(&read_n(s, len as usize)?);
            }
            self.on_reply(cmd, flags, offset, len, payload, error);
            self.shared.wire.lock().unwrap().push(Wire::Reply {
                conn: self.conn,
                cookie,
                cmd,
                error,
            });
            self.forward(&m)?;
        }
    }

    /// Logs a completed request's durability event, before the client can see the reply.
    fn on_reply(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<Arc<[u8]>>,
        error: u32,
    ) {
        if cmd == CMD_FLUSH {
            if error != 0 {
                self.shared.flush_errors.fetch_add(1, Ordering::SeqCst);
            }
            let d = *self.shared.flush_reply_delay.lock().unwrap();
            std::thread::sleep(d);
            return;
        }
        if error != 0 || !(cmd == CMD_WRITE || cmd == CMD_WRITE_ZEROES) {
            return;
        }
        let data = payload.unwrap_or_else(|| Arc::from(vec![0u8; len as usize]));
        let target = self.shared.target;
        self.record(if flags & CMD_FLAG_FUA != 0 {
            Event::FuaWrite {
                target,
                offset,
                data,
            }
        } else {
            Event::Write {
                target,
                offset,
                data,
            }
        });
    }

    fn forward(&self, b: &[u8]) -> std::io::Result<()> {
        self.to_client.lock().unwrap().write_all(b)
    }
}

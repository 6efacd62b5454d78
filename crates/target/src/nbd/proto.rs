//! The NBD wire protocol, written from the NBD project's `doc/proto.md`: the fixed newstyle
//! handshake with `NBD_OPT_GO` (falling back to `NBD_OPT_EXPORT_NAME` for servers that
//! predate it), the 28-byte request header and the 16-byte simple reply header. Structured
//! replies are never negotiated, so every reply is simple.

use std::io::{Read, Write};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const FLAG_C_NO_ZEROES: u32 = 1 << 1;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags (`NBD_FLAG_*` sent with the export's size).
pub(crate) const TF_HAS_FLAGS: u16 = 1 << 0;
pub(crate) const TF_READ_ONLY: u16 = 1 << 1;
pub(crate) const TF_SEND_FLUSH: u16 = 1 << 2;
pub(crate) const TF_SEND_FUA: u16 = 1 << 3;
pub(crate) const TF_SEND_TRIM: u16 = 1 << 5;
pub(crate) const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub(crate) const TF_CAN_MULTI_CONN: u16 = 1 << 8;
/// Command flag: the write is durable when acknowledged (`NBD_CMD_FLAG_FUA`).
pub(crate) const CMD_FLAG_FUA: u16 = 1 << 0;

/// Largest option reply payload we accept (the spec bounds strings at 4 KiB).
const MAX_OPT_REPLY: u32 = 64 << 10;
/// The payload limit the spec tells clients to respect when the server states none.
pub(crate) const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

pub(crate) const REQUEST_LEN: usize = 28;
pub(crate) const REPLY_LEN: usize = 16;

/// Request types (`NBD_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmd {
    Read = 0,
    Write = 1,
    Disconnect = 2,
    Flush = 3,
    Trim = 4,
    WriteZeroes = 6,
}

/// What `NBD_OPT_GO` (or `NBD_OPT_EXPORT_NAME`) told us about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Export {
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_block: u32,
}

impl Export {
    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags & TF_HAS_FLAGS != 0 && self.flags & flag != 0
    }
}

fn rd<const N: usize>(s: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Runs the fixed newstyle handshake on a fresh connection and enters transmission.
///
/// # Errors
/// A sentence saying which step failed (I/O, protocol, or the server's refusal).
pub(crate) fn handshake<S: Read + Write>(s: &mut S, export: &str) -> Result<Export, String> {
    let magic = u64::from_be_bytes(rd(s).map_err(io("reading the server greeting"))?);
    if magic != NBDMAGIC {
        return Err(format!("not an NBD server (greeting {magic:#018x})"));
    }
    let kind = u64::from_be_bytes(rd(s).map_err(io("reading the server greeting"))?);
    if kind == OLDSTYLE_MAGIC {
        return Err("server speaks the oldstyle protocol, which has no export names; only fixed newstyle is supported".into());
    }
    if kind != IHAVEOPT {
        return Err(format!("unknown handshake style {kind:#018x}"));
    }
    let hflags = u16::from_be_bytes(rd(s).map_err(io("reading handshake flags"))?);
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err("server does not speak the fixed newstyle handshake".into());
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let cflags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&cflags.to_be_bytes())
        .map_err(io("sending client flags"))?;
    send_go(s, export)?;
    match read_go_replies(s)? {
        GoOutcome::Ready(e) => Ok(e),
        GoOutcome::Unsupported => export_name(s, export, no_zeroes),
    }
}

fn send_go(s: &mut impl Write, export: &str) -> Result<(), String> {
    let name = export.as_bytes();
    let name_len = u32::try_from(name.len()).map_err(|_| "export name too long")?;
    let mut m = Vec::with_capacity(32 + name.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&(4 + name_len + 2 + 2).to_be_bytes());
    m.extend_from_slice(&name_len.to_be_bytes());
    m.extend_from_slice(name);
    m.extend_from_slice(&1u16.to_be_bytes());
    m.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    s.write_all(&m).map_err(io("sending NBD_OPT_GO"))?;
    s.flush().map_err(io("sending NBD_OPT_GO"))
}

enum GoOutcome {
    Ready(Export),
    Unsupported,
}

fn read_go_replies(s: &mut impl Read) -> Result<GoOutcome, String> {
    let mut size_flags = None;
    let mut blocks = None;
    loop {
        let hdr: [u8; 20] = rd(s).map_err(io("reading the reply to NBD_OPT_GO"))?;
        let magic = u64::from_be_bytes(hdr[0..8].try_into().expect("8 bytes"));
        let typ = u32::from_be_bytes(hdr[12..16].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(hdr[16..20].try_into().expect("4 bytes"));
        if magic != OPT_REPLY_MAGIC {
            return Err(format!("bad option reply magic {magic:#x}"));
        }
        if len > MAX_OPT_REPLY {
            return Err(format!("option reply of {len} bytes is implausibly long"));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)
            .map_err(io("reading the reply to NBD_OPT_GO"))?;
        match typ {
            REP_ACK => {
                let (size, flags) = size_flags
                    .ok_or("server acknowledged NBD_OPT_GO without export information")?;
                let (min_block, preferred_block, max_block) =
                    blocks.unwrap_or((1, 4096, DEFAULT_MAX_PAYLOAD));
                return Ok(GoOutcome::Ready(Export {
                    size,
                    flags,
                    min_block,
                    preferred_block,
                    max_block,
                }));
            }
            REP_INFO if data.len() >= 2 => {
                let info = u16::from_be_bytes([data[0], data[1]]);
                match info {
                    INFO_EXPORT if data.len() >= 12 => {
                        let size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                        size_flags = Some((size, u16::from_be_bytes([data[10], data[11]])));
                    }
                    INFO_BLOCK_SIZE if data.len() >= 14 => {
                        let w = |i: usize| {
                            u32::from_be_bytes(data[i..i + 4].try_into().expect("4 bytes"))
                        };
                        blocks = Some((w(2), w(6), w(10)));
                    }
                    INFO_EXPORT | INFO_BLOCK_SIZE => {
                        return Err(format!("short NBD_REP_INFO ({info}) of {len} bytes"))
                    }
                    _ => {} // Unknown information is ignored, as the spec requires.
                }
            }
            REP_ERR_UNSUP => return Ok(GoOutcome::Unsupported),
            t if t & REP_FLAG_ERROR != 0 => return Err(refusal(t, &data)),
            _ => {} // Unknown non-error replies are ignored.
        }
    }
}

fn refusal(typ: u32, data: &[u8]) -> String {
    let what = match typ {
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_POLICY => "refused by server policy",
        REP_ERR_TLS_REQD => "server requires TLS, which this client does not support",
        REP_ERR_SHUTDOWN => "server is shutting down",
        _ => "server refused the export",
    };
    let msg = String::from_utf8_lossy(data);
    if msg.is_empty() {
        format!("{what} (error {:#x})", typ & !REP_FLAG_ERROR)
    } else {
        format!("{what}: {msg}")
    }
}

/// `NBD_OPT_EXPORT_NAME`, for servers without `NBD_OPT_GO`; a server that does not know
/// the export just closes the connection.
fn export_name<S: Read + Write>(
    s: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<Export, String> {
    let name = export.as_bytes();
    let mut m = Vec::with_capacity(16 + name.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    m.extend_from_slice(
        &u32::try_from(name.len())
            .map_err(|_| "export name too long")?
            .to_be_bytes(),
    );
    m.extend_from_slice(name);
    s.write_all(&m).map_err(io("sending NBD_OPT_EXPORT_NAME"))?;
    let r: [u8; 10] = rd(s).map_err(|e| {
        format!("server closed the connection after NBD_OPT_EXPORT_NAME (no such export?): {e}")
    })?;
    if !no_zeroes {
        let _: [u8; 124] = rd(s).map_err(io("reading export padding"))?;
    }
    Ok(Export {
        size: u64::from_be_bytes(r[0..8].try_into().expect("8 bytes")),
        flags: u16::from_be_bytes([r[8], r[9]]),
        min_block: 1,
        preferred_block: 4096,
        max_block: DEFAULT_MAX_PAYLOAD,
    })
}

/// Encodes a request header.
pub(crate) fn request(
    cmd: Cmd,
    flags: u16,
    cookie: u64,
    offset: u64,
    len: u32,
) -> [u8; REQUEST_LEN] {
    let mut h = [0u8; REQUEST_LEN];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&(cmd as u16).to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
}

/// A decoded simple reply header: the server's error (0 for success) and the cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub error: u32,
    pub cookie: u64,
}

/// Decodes a simple reply header.
///
/// # Errors
/// The magic is not a simple reply's (a structured reply was never negotiated).
pub(crate) fn reply(h: &[u8; REPLY_LEN]) -> Result<Reply, String> {
    let magic = u32::from_be_bytes(h[0..4].try_into().expect("4 bytes"));
    if magic == STRUCTURED_REPLY_MAGIC {
        return Err("structured reply received although none was negotiated".into());
    }
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(format!("bad reply magic {magic:#010x}"));
    }
    Ok(Reply {
        error: u32::from_be_bytes(h[4..8].try_into().expect("4 bytes")),
        cookie: u64::from_be_bytes(h[8..16].try_into().expect("8 bytes")),
    })
}

/// The errno for an NBD error value (the protocol's values are Linux's for the errors it
/// defines; anything else is reported as `EIO`, as the spec says a client should).
pub(crate) fn errno(nbd_error: u32) -> i32 {
    match nbd_error {
        1 => libc::EPERM,
        5 => libc::EIO,
        12 => libc::ENOMEM,
        22 => libc::EINVAL,
        28 => libc::ENOSPC,
        75 => libc::EOVERFLOW,
        95 => libc::EOPNOTSUPP,
        108 => libc::ESHUTDOWN,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A scripted server side: what it says, and what the client wrote.
    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }
    impl Read for Duplex {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(b)
        }
    }
    impl Write for Duplex {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.output.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn opt_reply(typ: u32, data: &[u8]) -> Vec<u8> {
        let mut v = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&OPT_GO.to_be_bytes());
        v.extend_from_slice(&typ.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn greeting() -> Vec<u8> {
        let mut v = NBDMAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        v
    }

    #[test]
    fn go_with_block_sizes() {
        let mut srv = greeting();
        let mut info = INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&(1u64 << 30).to_be_bytes());
        info.extend_from_slice(&(TF_HAS_FLAGS | TF_SEND_FLUSH).to_be_bytes());
        srv.extend(opt_reply(REP_INFO, &info));
        let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [512u32, 4096, 1 << 20] {
            bs.extend_from_slice(&v.to_be_bytes());
        }
        srv.extend(opt_reply(REP_INFO, &bs));
        srv.extend(opt_reply(REP_ACK, &[]));
        let mut d = Duplex {
            input: Cursor::new(srv),
            output: Vec::new(),
        };
        let e = handshake(&mut d, "exp").unwrap();
        assert_eq!(e.size, 1 << 30);
        assert!(e.has(TF_SEND_FLUSH) && !e.has(TF_SEND_FUA));
        assert_eq!((e.min_block, e.max_block), (512, 1 << 20));
        // client flags, then IHAVEOPT, GO, len, name len, "exp", 1 info request, BLOCK_SIZE
        assert_eq!(
            &d.output[0..4],
            &(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()
        );
        assert_eq!(&d.output[4..12], &IHAVEOPT.to_be_bytes());
        assert_eq!(&d.output[12..16], &OPT_GO.to_be_bytes());
        assert_eq!(
            &d.output[16..20],
            &11u32.to_be_bytes(),
            "name length + name + count + one info"
        );
        assert_eq!(&d.output[24..27], b"exp");
        assert_eq!(&d.output[27..31], &[0, 1, 0, 3]);
    }

    #[test]
    fn refusal_and_oldstyle_are_errors() {
        let mut srv = greeting();
        srv.extend(opt_reply(REP_ERR_UNKNOWN, b"export 'x' not found"));
        let mut d = Duplex {
            input: Cursor::new(srv),
            output: Vec::new(),
        };
        let e = handshake(&mut d, "x").unwrap_err();
        assert!(
            e.contains("no such export") && e.contains("not found"),
            "{e}"
        );
        let mut old = NBDMAGIC.to_be_bytes().to_vec();
        old.extend_from_slice(&OLDSTYLE_MAGIC.to_be_bytes());
        let mut d = Duplex {
            input: Cursor::new(old),
            output: Vec::new(),
        };
        assert!(handshake(&mut d, "").unwrap_err().contains("oldstyle"));
    }

    #[test]
    fn request_and_reply_layout() {
        let h = request(Cmd::Write, 1, 7, 4096, 512);
        assert_eq!(&h[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&h[4..8], &[0, 1, 0, 1]);
        let mut r = [0u8; REPLY_LEN];
        r[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        r[4..8].copy_from_slice(&5u32.to_be_bytes());
        r[8..16].copy_from_slice(&7u64.to_be_bytes());
        assert_eq!(
            reply(&r).unwrap(),
            Reply {
                error: 5,
                cookie: 7
            }
        );
        assert_eq!(errno(5), libc::EIO);
        assert_eq!(errno(9999), libc::EIO);
        r[0] = 0;
        assert!(reply(&r).is_err());
    }
}

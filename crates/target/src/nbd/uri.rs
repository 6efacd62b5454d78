//! NBD URIs (the NBD project's `doc/uri.md` format):
//! `nbd://HOST[:PORT]/EXPORT` (TCP, default port 10809) and
//! `nbd+unix:///EXPORT?socket=PATH` (Unix domain socket). TLS schemes (`nbds`, `nbds+unix`)
//! and vsock are refused with a clear error: this client does not implement them.

use std::fmt;
use std::path::PathBuf;

/// The IANA-assigned NBD port.
pub const NBD_DEFAULT_PORT: u16 = 10809;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    /// TCP host (name or address, IPv6 without brackets) and port.
    Tcp { host: String, port: u16 },
    /// Unix domain socket path.
    Unix(PathBuf),
}

/// A parsed NBD URI: the server address and the export name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export: String,
    text: String,
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl NbdUri {
    /// True when `s` is written as an NBD URI (any `nbd*://` scheme), so that callers can
    /// route it here rather than treat it as a file path; [`NbdUri::parse`] then says what
    /// is wrong with it, if anything.
    #[must_use]
    pub fn looks_like_uri(s: &str) -> bool {
        s.split_once("://")
            .is_some_and(|(scheme, _)| scheme.starts_with("nbd"))
    }

    /// Parses an NBD URI.
    ///
    /// # Errors
    /// A sentence saying what is wrong (scheme, port, missing socket, bad escape).
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{s}: {why}");
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            bad("not an NBD URI (nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)")
        })?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).map_err(|e| bad(&e))?;
        let mut socket = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("socket", v)) => socket = Some(percent_decode(v).map_err(|e| bad(&e))?),
                _ => {
                    return Err(bad(&format!(
                        "unsupported query parameter {pair:?} (only socket=PATH is understood)"
                    )))
                }
            }
        }
        let addr = match scheme {
            "nbd" | "nbd+tcp" => {
                if socket.is_some() {
                    return Err(bad("socket= is only valid with nbd+unix://"));
                }
                tcp_addr(authority).map_err(|e| bad(&e))?
            }
            "nbd+unix" => {
                if !authority.is_empty() {
                    return Err(bad(
                        "nbd+unix:// takes no host (nbd+unix:///EXPORT?socket=PATH)",
                    ));
                }
                let p = socket.ok_or_else(|| bad("nbd+unix:// needs ?socket=PATH"))?;
                if p.is_empty() {
                    return Err(bad("empty socket path"));
                }
                NbdAddr::Unix(PathBuf::from(p))
            }
            "nbds" | "nbds+tcp" | "nbds+unix" | "nbds+vsock" => {
                return Err(bad("TLS NBD URIs are not supported by this client"))
            }
            "nbd+vsock" => return Err(bad("vsock NBD URIs are not supported by this client")),
            other => return Err(bad(&format!("unknown NBD URI scheme {other:?}"))),
        };
        Ok(Self {
            addr,
            export,
            text: s.to_string(),
        })
    }
}

fn tcp_addr(authority: &str) -> Result<NbdAddr, String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or("unterminated [IPv6] host")?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("nbd:// needs a host".into());
    }
    let port = match port {
        None | Some("") => NBD_DEFAULT_PORT,
        Some(p) => p
            .parse()
            .ok()
            .filter(|&n| n != 0)
            .ok_or_else(|| format!("bad port {p:?}"))?,
    };
    Ok(NbdAddr::Tcp {
        host: host.to_string(),
        port,
    })
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent escapes do not decode to UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_forms() {
        let u = NbdUri::parse("nbd://example.com/disk%201").unwrap();
        assert_eq!(
            u.addr,
            NbdAddr::Tcp {
                host: "example.com".into(),
                port: NBD_DEFAULT_PORT
            }
        );
        assert_eq!(u.export, "disk 1");
        let u = NbdUri::parse("nbd://[::1]:10810").unwrap();
        assert_eq!(
            u.addr,
            NbdAddr::Tcp {
                host: "::1".into(),
                port: 10810
            }
        );
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd+unix:///e?socket=/tmp/s.sock").unwrap();
        assert_eq!(u.addr, NbdAddr::Unix("/tmp/s.sock".into()));
        assert_eq!(u.export, "e");
        assert_eq!(u.to_string(), "nbd+unix:///e?socket=/tmp/s.sock");
    }

    #[test]
    fn bad_uris_say_why() {
        for (s, why) in [
            ("nbd+unix:///e", "needs ?socket"),
            ("nbds://h/e", "TLS"),
            ("nbd://h:99999/e", "bad port"),
            ("nbd:///e", "needs a host"),
            ("nbd://h/e?tls=on", "unsupported query"),
            ("nbd://h/%zz", "percent"),
        ] {
            let e = NbdUri::parse(s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
        assert!(NbdUri::looks_like_uri("nbd+unix:///x?socket=/s"));
        assert!(!NbdUri::looks_like_uri("/dev/sdb"));
        assert!(!NbdUri::looks_like_uri("nbd0"));
    }
}

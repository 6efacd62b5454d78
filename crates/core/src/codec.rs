//! Little-endian encoding helpers. Decoding is bounds-checked and returns typed errors:
//! bytes from disk never cause a panic.

use crate::CoreError;

/// Appends little-endian values to a byte vector.
#[derive(Debug, Default)]
pub struct Enc {
    pub buf: Vec<u8>,
}

impl Enc {
    /// An empty encoder.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty encoder with room for `bytes` (an item's known size: no regrowth while
    /// it is written).
    #[must_use]
    pub fn with_capacity(bytes: usize) -> Self {
        Enc {
            buf: Vec::with_capacity(bytes),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// A u32 length followed by the bytes.
    ///
    /// # Panics
    /// Panics if `v` is 4 GiB or longer (callers bound names and values far below).
    pub fn blob(&mut self, v: &[u8]) {
        self.u32(u32::try_from(v.len()).expect("blob below 4 GiB"));
        self.bytes(v);
    }
    /// Bytes written so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// True when nothing was written.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Reads little-endian values from a byte slice; every read is bounds-checked.
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    what: What<'a>,
}

/// What a decoder names in its errors: formatted only when an error is made, so that a
/// decoder on a hot path (the checkpointer decodes items for every record it applies)
/// does not format a name per decode.
#[derive(Clone, Copy)]
enum What<'a> {
    Str(&'a str),
    Shown(&'a dyn std::fmt::Display),
}

impl std::fmt::Display for What<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Str(s) => f.write_str(s),
            What::Shown(d) => d.fmt(f),
        }
    }
}

impl std::fmt::Debug for Dec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dec")
            .field("len", &self.buf.len())
            .field("pos", &self.pos)
            .field("what", &self.what.to_string())
            .finish()
    }
}

impl<'a> Dec<'a> {
    /// A decoder over `buf`; `what` names the structure in errors.
    #[must_use]
    pub fn new(buf: &'a [u8], what: &'a str) -> Self {
        Self {
            buf,
            pos: 0,
            what: What::Str(what),
        }
    }

    /// A decoder over `buf` whose errors name `what`, formatted only if one is made.
    #[must_use]
    pub fn shown(buf: &'a [u8], what: &'a dyn std::fmt::Display) -> Self {
        Self {
            buf,
            pos: 0,
            what: What::Shown(what),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CoreError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                CoreError::corrupted(
                    self.what.to_string(),
                    format!("truncated: need {n} bytes at offset {}", self.pos),
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, CoreError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, CoreError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, CoreError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, CoreError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub fn i64(&mut self) -> Result<i64, CoreError> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], CoreError> {
        self.take(n)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], CoreError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    /// A u32 length (at most `max`) followed by that many bytes.
    pub fn blob(&mut self, max: usize) -> Result<&'a [u8], CoreError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(CoreError::corrupted(
                self.what.to_string(),
                format!("length {n} exceeds limit {max}"),
            ));
        }
        self.take(n)
    }
    /// Bytes not yet read.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Current offset.
    #[must_use]
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// An error naming this structure.
    #[must_use]
    pub fn err(&self, detail: impl Into<String>) -> CoreError {
        CoreError::corrupted(self.what.to_string(), detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let mut e = Enc::new();
        e.u32(7);
        e.blob(b"abc");
        e.i64(-5);
        let mut d = Dec::new(&e.buf, "t");
        assert_eq!(d.u32().unwrap(), 7);
        assert_eq!(d.blob(10).unwrap(), b"abc");
        assert_eq!(d.i64().unwrap(), -5);
        assert!(d.u8().is_err());
        let mut d = Dec::new(&e.buf, "t");
        d.u32().unwrap();
        assert!(d.blob(2).is_err(), "over-limit length is corruption");
    }
}

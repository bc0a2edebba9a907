//! Little-endian primitives for the binary encodings, with a bounds check on
//! every read. Shared by the manifest and commit-record codecs.

use crate::error::{FormatError, Result};
use crate::ChunkId;

/// A cursor over untrusted bytes. Every read checks the remaining length
/// first, so a short or hostile input yields [`FormatError::Truncated`].
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(FormatError::Truncated {
                what,
                needed: n as u64,
                available: self.remaining() as u64,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N, what)?);
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A little-endian u16.
    pub fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A 32-byte chunk id.
    pub fn chunk_id(&mut self, what: &'static str) -> Result<ChunkId> {
        Ok(ChunkId::from_bytes(self.array(what)?))
    }

    /// Bytes prefixed by their u32 length, at most `limit` of them (a
    /// longer length is refused before anything is read).
    pub fn blob(&mut self, limit: usize, what: &'static str) -> Result<&'a [u8]> {
        let len = self.u32(what)? as usize;
        if len > limit {
            return Err(FormatError::TooLarge {
                what,
                value: len as u64,
                limit: limit as u64,
            });
        }
        self.bytes(len, what)
    }

    /// A UTF-8 string prefixed by its u32 length, at most `limit` bytes.
    pub fn string(&mut self, limit: usize, what: &'static str) -> Result<String> {
        let raw = self.blob(limit, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| FormatError::malformed(what, "not valid UTF-8"))
    }

    /// A u32 item count, checked against `limit` and against the bytes left
    /// (each item takes at least `min_item_len` bytes), so a hostile count
    /// can never make the caller allocate more than the input could fill.
    pub fn count(
        &mut self,
        limit: usize,
        min_item_len: usize,
        what: &'static str,
    ) -> Result<usize> {
        let n = self.u32(what)? as usize;
        if n > limit {
            return Err(FormatError::TooLarge {
                what,
                value: n as u64,
                limit: limit as u64,
            });
        }
        let need = n.saturating_mul(min_item_len.max(1));
        if need > self.remaining() {
            return Err(FormatError::Truncated {
                what,
                needed: need as u64,
                available: self.remaining() as u64,
            });
        }
        Ok(n)
    }

    /// Fails if any byte is left unread.
    pub fn finish(&self, what: &'static str) -> Result<()> {
        if self.remaining() != 0 {
            return Err(FormatError::malformed(
                what,
                format!("{} trailing bytes", self.remaining()),
            ));
        }
        Ok(())
    }
}

/// Appends little-endian primitives to a buffer.
#[derive(Default)]
pub struct Writer {
    /// What was written.
    pub buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer { buf: Vec::new() }
    }

    /// Raw bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }

    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// Lengths were validated by the caller against limits far below
    /// `u32::MAX`, so the conversion cannot truncate.
    pub fn len32(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// A u32 length, then the UTF-8 bytes.
    pub fn string(&mut self, s: &str) {
        self.len32(s.len());
        self.bytes(s.as_bytes());
    }
}

/// Appends the BLAKE3 checksum trailer over everything written so far.
pub(crate) fn seal(mut w: Writer) -> Vec<u8> {
    let sum = blake3::hash(&w.buf);
    w.bytes(sum.as_bytes());
    w.buf
}

/// Checks and strips a BLAKE3 checksum trailer.
pub(crate) fn unseal<'a>(buf: &'a [u8], what: &'static str) -> Result<&'a [u8]> {
    if buf.len() < 32 {
        return Err(FormatError::Truncated {
            what,
            needed: 32,
            available: buf.len() as u64,
        });
    }
    let (body, sum) = buf.split_at(buf.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(FormatError::Checksum { what });
    }
    Ok(body)
}

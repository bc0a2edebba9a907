//! [`ChunkData`]: one chunk's bytes, shared without copying.

use std::ops::Range;
use std::sync::Arc;

use crate::aligned::{AlignedBuf, ALIGN};
use crate::error::{Result, StoreError};

/// A chunk's raw bytes: a range of a shared, page-aligned buffer. A chunk
/// cut from a staging buffer is written to disk straight from there; cloning
/// is an `Arc` increment.
#[derive(Clone)]
pub struct ChunkData {
    buf: Arc<AlignedBuf>,
    start: usize,
    len: usize,
}

impl ChunkData {
    /// A range of `buf`.
    pub fn new(buf: Arc<AlignedBuf>, range: Range<usize>) -> Result<Self> {
        if range.start > range.end || range.end > buf.len() {
            return Err(StoreError::invalid(
                "chunk range",
                format!("{range:?} outside a buffer of {}", buf.len()),
            ));
        }
        Ok(ChunkData {
            start: range.start,
            len: range.end - range.start,
            buf,
        })
    }

    /// The whole of `buf`.
    pub fn whole(buf: AlignedBuf) -> Self {
        let len = buf.len();
        ChunkData {
            buf: Arc::new(buf),
            start: 0,
            len,
        }
    }

    /// The underlying buffer, if nothing else shares it (for reuse).
    pub fn into_buf(self) -> Option<AlignedBuf> {
        Arc::try_unwrap(self.buf).ok()
    }

    /// The underlying buffer if nothing else shares it, else these bytes
    /// back (to try again later: a sender may still hold a clone).
    pub fn try_into_buf(self) -> std::result::Result<AlignedBuf, ChunkData> {
        let ChunkData { buf, start, len } = self;
        Arc::try_unwrap(buf).map_err(|buf| ChunkData { buf, start, len })
    }

    /// A copy of `bytes` in a fresh aligned buffer.
    pub fn copy_from(bytes: &[u8]) -> Self {
        Self::whole(AlignedBuf::from_slice(bytes))
    }

    /// A sub-range of these bytes (relative to them), sharing the buffer.
    pub fn sub(&self, range: Range<usize>) -> Option<ChunkData> {
        (range.start <= range.end && range.end <= self.len).then(|| ChunkData {
            buf: self.buf.clone(),
            start: self.start + range.start,
            len: range.end - range.start,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes padded to a multiple of [`ALIGN`] with whatever follows in
    /// the buffer, if the start is aligned and the padding fits: what an
    /// O_DIRECT write can take without a bounce copy (the file is truncated
    /// to [`Self::len`] afterwards).
    pub fn padded_for_direct_io(&self) -> Option<&[u8]> {
        let padded = crate::aligned::align_up(self.len);
        let full = self.buf.full();
        (self.start % ALIGN == 0 && self.start + padded <= full.len())
            .then(|| &full[self.start..self.start + padded])
    }
}

/// So a chunk can be handed to byte-buffer owners (e.g. `bytes::Bytes::from_owner`)
/// without a copy.
impl AsRef<[u8]> for ChunkData {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for ChunkData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkData({} bytes at {})", self.len, self.start)
    }
}

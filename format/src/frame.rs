//! Chunk frames: a self-describing, verifiable container for one chunk.
//!
//! ```text
//! offset size field
//!      0    4 magic "STCK"
//!      4    1 format version (1)
//!      5    1 codec (0 raw, 1 zstd, 2 planes)
//!      6    1 element size (1, 2, 4, 8; planes codec only, else 1)
//!      7    1 reserved, 0
//!      8    4 raw length (u32 LE), at most MAX_CHUNK_LEN
//!     12    4 stored length (u32 LE) = payload length
//!     16   32 BLAKE3-256 of the raw bytes (the chunk id)
//!     48    . payload
//! ```
//!
//! Decoding bounds every length before allocating, decodes, and verifies the
//! hash of the decoded bytes; a frame from disk or a peer is untrusted.

use crate::codec::{Codec, ElemHint, EncodeOptions, PayloadDecoder, PayloadEncoder};
use crate::error::{FormatError, Result};
use crate::ChunkId;

/// The four magic bytes that open every chunk frame.
pub const FRAME_MAGIC: [u8; 4] = *b"STCK";
/// The frame format version this crate writes.
pub const FRAME_VERSION: u8 = 1;
/// Bytes before the payload.
pub const FRAME_HEADER_LEN: usize = 48;
/// The largest chunk any Strata version reads or writes (256 MiB).
pub const MAX_CHUNK_LEN: u32 = 256 << 20;

/// The decoded header of a chunk frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FrameHeader {
    /// Frame format version.
    pub version: u8,
    /// How the payload is encoded.
    pub codec: Codec,
    /// Element size used by the planes codec (1 otherwise).
    pub elem_size: u8,
    /// Length of the chunk's raw bytes.
    pub raw_len: u32,
    /// Length of the payload that follows the header.
    pub stored_len: u32,
    /// BLAKE3 of the raw bytes.
    pub id: ChunkId,
}

impl FrameHeader {
    /// The length of the whole frame this header starts: the header and
    /// its `stored_len` payload bytes (what a reader allocates before the
    /// payload arrives; [`FrameDecoder::header`] checks a whole frame
    /// against it).
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + self.stored_len as usize
    }

    /// The 48 header bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[0..4].copy_from_slice(&FRAME_MAGIC);
        h[4] = self.version;
        h[5] = self.codec.code();
        h[6] = self.elem_size;
        h[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        h[12..16].copy_from_slice(&self.stored_len.to_le_bytes());
        h[16..48].copy_from_slice(self.id.as_bytes());
        h
    }

    /// Parses and checks a header: magic, version, codec, element size, and
    /// raw length within `max_raw_len` (itself capped at [`MAX_CHUNK_LEN`]).
    pub fn decode(bytes: &[u8], max_raw_len: u32) -> Result<FrameHeader> {
        let what = "chunk frame";
        let mut r = crate::wire::Reader::new(bytes);
        let magic = r.bytes(4, what)?;
        if magic != FRAME_MAGIC {
            return Err(FormatError::BadMagic {
                what,
                found: magic.to_vec(),
            });
        }
        let version = r.u8(what)?;
        if version != FRAME_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what,
                version: u32::from(version),
            });
        }
        let codec = Codec::from_code(r.u8(what)?)?;
        let elem_size = r.u8(what)?;
        let reserved = r.u8(what)?;
        let raw_len = r.u32(what)?;
        let stored_len = r.u32(what)?;
        let id = r.chunk_id(what)?;
        if reserved != 0 {
            return Err(FormatError::malformed(what, "reserved byte is not zero"));
        }
        let elem_ok = match codec {
            Codec::Planes => matches!(elem_size, 2 | 4 | 8),
            Codec::Raw | Codec::Zstd => elem_size == 1,
        };
        if !elem_ok {
            return Err(FormatError::malformed(
                what,
                format!(
                    "element size {elem_size} invalid for codec {}",
                    codec.name()
                ),
            ));
        }
        let limit = max_raw_len.min(MAX_CHUNK_LEN);
        if raw_len > limit {
            return Err(FormatError::TooLarge {
                what: "chunk raw length",
                value: u64::from(raw_len),
                limit: u64::from(limit),
            });
        }
        if codec == Codec::Raw && stored_len != raw_len {
            return Err(FormatError::malformed(
                what,
                "raw chunk with stored length != raw length",
            ));
        }
        Ok(FrameHeader {
            version,
            codec,
            elem_size,
            raw_len,
            stored_len,
            id,
        })
    }
}

/// Encodes chunks into frames, reusing compression state between calls.
pub struct FrameEncoder {
    payload: PayloadEncoder,
    scratch: Vec<u8>,
}

impl FrameEncoder {
    /// A new encoder with the given codec options.
    pub fn new(opts: EncodeOptions) -> Result<Self> {
        Ok(FrameEncoder {
            payload: PayloadEncoder::new(opts)?,
            scratch: Vec::new(),
        })
    }

    /// Encodes `raw` into a complete frame. `id` is the chunk's id when the
    /// caller has already hashed it (it is not re-checked); otherwise it is
    /// computed here.
    pub fn encode(&mut self, raw: &[u8], hint: ElemHint, id: Option<ChunkId>) -> Result<Vec<u8>> {
        let raw_len = u32::try_from(raw.len())
            .ok()
            .filter(|&l| l <= MAX_CHUNK_LEN)
            .ok_or_else(|| {
                FormatError::invalid(
                    "chunk",
                    format!("{} bytes exceeds MAX_CHUNK_LEN", raw.len()),
                )
            })?;
        let id = id.unwrap_or_else(|| ChunkId::of(raw));
        let mut payload = std::mem::take(&mut self.scratch);
        let (codec, elem_size) = self.payload.encode(raw, hint, &mut payload)?;
        let header = FrameHeader {
            version: FRAME_VERSION,
            codec,
            elem_size,
            raw_len,
            // The payload never exceeds the raw length: larger payloads fall back to raw.
            stored_len: u32::try_from(payload.len()).unwrap_or(raw_len),
            id,
        };
        let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
        frame.extend_from_slice(&header.encode());
        frame.extend_from_slice(&payload);
        self.scratch = payload;
        Ok(frame)
    }
}

/// Decodes and verifies frames, reusing decompression state between calls.
pub struct FrameDecoder {
    payload: PayloadDecoder,
    max_raw_len: u32,
}

impl FrameDecoder {
    /// A decoder accepting chunks up to [`MAX_CHUNK_LEN`].
    pub fn new() -> Result<Self> {
        Self::with_limit(MAX_CHUNK_LEN)
    }

    /// A decoder refusing frames whose raw length exceeds `max_raw_len`
    /// (a tier sets it from its configured chunk size, so a hostile frame
    /// cannot make it allocate more than one real chunk).
    pub fn with_limit(max_raw_len: u32) -> Result<Self> {
        Ok(FrameDecoder {
            payload: PayloadDecoder::new()?,
            max_raw_len: max_raw_len.min(MAX_CHUNK_LEN),
        })
    }

    /// Parses the header and checks the payload length against it.
    pub fn header(&self, frame: &[u8]) -> Result<FrameHeader> {
        let h = FrameHeader::decode(frame, self.max_raw_len)?;
        let payload_len = frame.len().saturating_sub(FRAME_HEADER_LEN);
        let stored = h.stored_len as usize;
        if payload_len < stored {
            return Err(FormatError::Truncated {
                what: "chunk frame payload",
                needed: stored as u64,
                available: payload_len as u64,
            });
        }
        if payload_len > stored {
            return Err(FormatError::malformed(
                "chunk frame",
                format!(
                    "{} bytes after a {stored}-byte payload",
                    payload_len - stored
                ),
            ));
        }
        Ok(h)
    }

    /// Decodes `frame` into `dst` (whose length must equal the frame's raw
    /// length) and verifies the BLAKE3 of the result. With `expected`, the
    /// frame must also be the chunk the caller asked for.
    pub fn decode_into(
        &mut self,
        frame: &[u8],
        expected: Option<&ChunkId>,
        dst: &mut [u8],
    ) -> Result<FrameHeader> {
        let h = self.header(frame)?;
        if let Some(want) = expected {
            if *want != h.id {
                return Err(FormatError::HashMismatch {
                    expected: want.to_hex(),
                    actual: h.id.to_hex(),
                });
            }
        }
        if dst.len() != h.raw_len as usize {
            return Err(FormatError::invalid(
                "destination buffer",
                format!("{} bytes for a {}-byte chunk", dst.len(), h.raw_len),
            ));
        }
        self.payload
            .decode_into(h.codec, h.elem_size, &frame[FRAME_HEADER_LEN..], dst)?;
        let actual = ChunkId::of(dst);
        if actual != h.id {
            return Err(FormatError::HashMismatch {
                expected: h.id.to_hex(),
                actual: actual.to_hex(),
            });
        }
        Ok(h)
    }

    /// Checks that `frame` is well formed and holds chunk `expected` (when
    /// given) without keeping the decoded bytes: a raw payload is hashed
    /// where it lies; others are decoded into `scratch` (grown, never
    /// shrunk, so a caller verifying many frames allocates once).
    pub fn verify(
        &mut self,
        frame: &[u8],
        expected: Option<&ChunkId>,
        scratch: &mut Vec<u8>,
    ) -> Result<FrameHeader> {
        let h = self.header(frame)?;
        if h.codec != Codec::Raw {
            scratch.resize(h.raw_len as usize, 0);
            return self.decode_into(frame, expected, scratch);
        }
        if let Some(want) = expected {
            if *want != h.id {
                return Err(FormatError::HashMismatch {
                    expected: want.to_hex(),
                    actual: h.id.to_hex(),
                });
            }
        }
        let payload = &frame[FRAME_HEADER_LEN..];
        if payload.len() != h.raw_len as usize {
            return Err(FormatError::malformed(
                "raw payload",
                format!("{} bytes stored for {} raw", payload.len(), h.raw_len),
            ));
        }
        let actual = ChunkId::of(payload);
        if actual != h.id {
            return Err(FormatError::HashMismatch {
                expected: h.id.to_hex(),
                actual: actual.to_hex(),
            });
        }
        Ok(h)
    }

    /// Decodes and verifies `frame` into a new buffer.
    pub fn decode(
        &mut self,
        frame: &[u8],
        expected: Option<&ChunkId>,
    ) -> Result<(FrameHeader, Vec<u8>)> {
        let h = self.header(frame)?;
        let mut out = vec![0u8; h.raw_len as usize];
        let h = self.decode_into(frame, expected, &mut out)?;
        Ok((h, out))
    }
}

/// The header of a raw frame holding `raw_len` bytes of chunk `id`: a
/// sender that writes these 48 bytes and then the chunk's bytes has sent a
/// frame without copying the chunk.
pub fn raw_frame_header(id: ChunkId, raw_len: usize) -> Result<[u8; FRAME_HEADER_LEN]> {
    let raw_len = u32::try_from(raw_len)
        .ok()
        .filter(|&l| l <= MAX_CHUNK_LEN)
        .ok_or_else(|| {
            FormatError::invalid("chunk", format!("{raw_len} bytes exceeds MAX_CHUNK_LEN"))
        })?;
    Ok(FrameHeader {
        version: FRAME_VERSION,
        codec: Codec::Raw,
        elem_size: 1,
        raw_len,
        stored_len: raw_len,
        id,
    }
    .encode())
}

/// Encodes one chunk into a frame (convenience; allocates a fresh encoder).
pub fn encode_frame(raw: &[u8], hint: ElemHint, opts: EncodeOptions) -> Result<Vec<u8>> {
    FrameEncoder::new(opts)?.encode(raw, hint, None)
}

/// Decodes and verifies one frame (convenience; allocates a fresh decoder).
pub fn decode_frame(frame: &[u8]) -> Result<(FrameHeader, Vec<u8>)> {
    FrameDecoder::new()?.decode(frame, None)
}

//! Chunk codecs: how a chunk's raw bytes become a frame payload and back.
//!
//! * [`Codec::Raw`]: the bytes as they are.
//! * [`Codec::Zstd`]: one zstd frame.
//! * [`Codec::Planes`]: a byte-plane split (optionally after a one-bit
//!   rotation of each element), then each plane kept raw, Huffman-coded or
//!   zstd-compressed. The sampled order-0 entropy of a plane picks: near-random
//!   planes (float mantissas) are not even tried, redundant ones (runs, zero
//!   padding) go to zstd, and the rest (float exponents) to a fast Huffman
//!   coder that reaches the order-0 bound at several times zstd's speed.
//!
//! Planes payload layout (all integers little-endian):
//!
//! ```text
//! transform u8     0 = none, 1 = rotate each element left by one bit
//! planes    u8     number of planes = the frame's element size (2, 4 or 8)
//! per plane: mode u8 (0 = raw, 1 = zstd, 2 = huffman), stored length u32
//! plane payloads, in plane order
//! ```

pub(crate) mod huffman;
pub(crate) mod planes;

pub use planes::entropy_of;
use planes::Transform;

use crate::error::{FormatError, Result};

/// The codec of a stored chunk, as recorded in its frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// Raw bytes.
    Raw,
    /// A single zstd frame.
    Zstd,
    /// Byte planes, each raw or zstd.
    Planes,
}

impl Codec {
    /// The one-byte code stored in frame headers. Stable forever.
    pub const fn code(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Zstd => 1,
            Codec::Planes => 2,
        }
    }

    /// The codec with a frame-header code.
    pub fn from_code(code: u8) -> Result<Self> {
        match code {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Zstd),
            2 => Ok(Codec::Planes),
            c => Err(FormatError::malformed(
                "frame codec",
                format!("unknown codec {c}"),
            )),
        }
    }

    /// A short lower-case name (`raw`, `zstd`, `planes`).
    pub const fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::Planes => "planes",
        }
    }
}

/// What a chunk holds, as far as the codec cares: the element size (1 for
/// mixed or opaque bytes) and whether the elements are floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ElemHint {
    /// Bytes per element: 1, 2, 4 or 8.
    pub size: u8,
    /// True if the elements are floating point (sign bit on top).
    pub float: bool,
}

impl ElemHint {
    /// Opaque bytes.
    pub const BYTES: ElemHint = ElemHint {
        size: 1,
        float: false,
    };
}

/// Which planes the byte-plane codec compresses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PlaneSelect {
    /// Try zstd on every plane (keep it only if it shrinks).
    All,
    /// Try zstd only on planes whose sampled entropy is at most this many
    /// bits per byte (8.0 = random).
    MaxEntropy(f64),
}

/// Which entropy coder compresses a plane the selection keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PlaneCoder {
    /// Always zstd.
    Zstd,
    /// Always the Huffman coder.
    Huffman,
    /// zstd for very redundant planes (sampled entropy at most
    /// [`AUTO_ZSTD_MAX_ENTROPY`] bits per byte, where LZ matches pay off),
    /// Huffman for the rest.
    Auto,
}

/// Below this sampled entropy, [`PlaneCoder::Auto`] uses zstd.
pub const AUTO_ZSTD_MAX_ENTROPY: f64 = 1.5;

/// What a tier asks the encoder for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EncodeOptions {
    /// The codec to try. Whatever is asked, a chunk that does not shrink is
    /// stored [`Codec::Raw`]; [`Codec::Planes`] on 1-byte elements falls back
    /// to [`Codec::Zstd`].
    pub codec: Codec,
    /// zstd level (1 is the measured sweet spot for weights).
    pub level: i32,
    /// Rotate float elements left by one bit before splitting planes.
    pub rotate_floats: bool,
    /// Which planes to try to compress.
    pub select: PlaneSelect,
    /// How the planes that are tried get compressed.
    pub coder: PlaneCoder,
}

impl EncodeOptions {
    /// No compression: what L1 stores (the disk is faster than zstd).
    pub const RAW: EncodeOptions = EncodeOptions {
        codec: Codec::Raw,
        level: 1,
        rotate_floats: false,
        select: PlaneSelect::All,
        coder: PlaneCoder::Zstd,
    };

    /// The default for compressing tiers: byte planes, rotated floats,
    /// entropy-selected planes, Huffman (or zstd level 1 for redundant planes).
    pub const PLANES: EncodeOptions = EncodeOptions {
        codec: Codec::Planes,
        level: 1,
        rotate_floats: true,
        select: PlaneSelect::MaxEntropy(7.5),
        coder: PlaneCoder::Auto,
    };

    /// Plain zstd over the whole chunk at level 1.
    pub const ZSTD: EncodeOptions = EncodeOptions {
        codec: Codec::Zstd,
        level: 1,
        rotate_floats: false,
        select: PlaneSelect::All,
        coder: PlaneCoder::Zstd,
    };
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions::PLANES
    }
}

const PLANE_RAW: u8 = 0;
const PLANE_ZSTD: u8 = 1;
const PLANE_HUFFMAN: u8 = 2;

/// Reusable compression state: a zstd context and scratch buffers. One per
/// thread; reusing it avoids an allocation of several MiB per chunk.
pub struct PayloadEncoder {
    opts: EncodeOptions,
    cctx: zstd::bulk::Compressor<'static>,
    planes: Vec<u8>,
    tmp: Vec<u8>,
    huff: Vec<u8>,
}

impl PayloadEncoder {
    /// A new encoder.
    pub fn new(opts: EncodeOptions) -> Result<Self> {
        let cctx = zstd::bulk::Compressor::new(opts.level)
            .map_err(|e| FormatError::invalid("zstd level", e.to_string()))?;
        Ok(PayloadEncoder {
            opts,
            cctx,
            planes: Vec::new(),
            tmp: Vec::new(),
            huff: Vec::new(),
        })
    }

    /// The options this encoder was made with.
    pub fn options(&self) -> &EncodeOptions {
        &self.opts
    }

    /// Encodes `raw` into `out` (cleared first) and returns the codec used
    /// and the element size to record in the frame. Falls back to raw when
    /// the chosen codec does not shrink the bytes.
    pub fn encode(&mut self, raw: &[u8], hint: ElemHint, out: &mut Vec<u8>) -> Result<(Codec, u8)> {
        out.clear();
        let elem = usize::from(hint.size);
        let planes_ok = matches!(elem, 2 | 4 | 8) && raw.len() % elem == 0 && !raw.is_empty();
        let codec = match self.opts.codec {
            Codec::Raw => Codec::Raw,
            Codec::Planes if planes_ok => Codec::Planes,
            Codec::Planes | Codec::Zstd => Codec::Zstd,
        };
        match codec {
            Codec::Raw => {}
            Codec::Zstd => {
                out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
                self.cctx
                    .compress_to_buffer(raw, out)
                    .map_err(|e| FormatError::Compress(e.to_string()))?;
            }
            Codec::Planes => self.encode_planes(raw, hint, out)?,
        }
        if codec != Codec::Raw && out.len() < raw.len() {
            let size = if codec == Codec::Planes { hint.size } else { 1 };
            return Ok((codec, size));
        }
        out.clear();
        out.extend_from_slice(raw);
        Ok((Codec::Raw, 1))
    }

    fn encode_planes(&mut self, raw: &[u8], hint: ElemHint, out: &mut Vec<u8>) -> Result<()> {
        let elem = usize::from(hint.size);
        let n = raw.len() / elem;
        let transform = if hint.float && self.opts.rotate_floats {
            Transform::RotateLeft1
        } else {
            Transform::None
        };
        // Every byte is overwritten by the split: only grow, never re-zero.
        self.planes.resize(raw.len(), 0);
        planes::split(raw, elem, transform, &mut self.planes);

        out.reserve(raw.len() + 2 + 5 * elem);
        out.push(transform as u8);
        out.push(hint.size);
        let table = out.len();
        out.resize(table + 5 * elem, 0);
        for (k, plane) in self.planes.chunks_exact(n).enumerate() {
            // Entropy is only sampled when a decision needs it.
            let needs_entropy = matches!(self.opts.select, PlaneSelect::MaxEntropy(_))
                || self.opts.coder == PlaneCoder::Auto;
            let entropy = if needs_entropy {
                planes::sampled_entropy(plane)
            } else {
                0.0
            };
            let try_it = match self.opts.select {
                PlaneSelect::All => true,
                PlaneSelect::MaxEntropy(max) => entropy <= max,
            };
            let mut mode = PLANE_RAW;
            if try_it {
                let coder = match self.opts.coder {
                    PlaneCoder::Auto if entropy <= AUTO_ZSTD_MAX_ENTROPY => PLANE_ZSTD,
                    PlaneCoder::Auto | PlaneCoder::Huffman => PLANE_HUFFMAN,
                    PlaneCoder::Zstd => PLANE_ZSTD,
                };
                self.tmp.clear();
                if coder == PLANE_ZSTD {
                    self.tmp.reserve(zstd::zstd_safe::compress_bound(n));
                    self.cctx
                        .compress_to_buffer(plane, &mut self.tmp)
                        .map_err(|e| FormatError::Compress(e.to_string()))?;
                } else {
                    let len = huffman::encode(plane, &mut self.huff);
                    self.tmp.extend_from_slice(&self.huff[..len]);
                }
                if self.tmp.len() < n {
                    mode = coder;
                }
            }
            let start = out.len();
            if mode != PLANE_RAW {
                out.extend_from_slice(&self.tmp);
            } else {
                out.extend_from_slice(plane);
            }
            let len = u32::try_from(out.len() - start)
                .map_err(|_| FormatError::invalid("chunk", "plane longer than 4 GiB"))?;
            let slot = table + 5 * k;
            out[slot] = mode;
            out[slot + 1..slot + 5].copy_from_slice(&len.to_le_bytes());
        }
        Ok(())
    }
}

/// Reusable decompression state. One per thread.
pub struct PayloadDecoder {
    dctx: zstd::bulk::Decompressor<'static>,
    planes: Vec<u8>,
}

impl PayloadDecoder {
    /// A new decoder.
    pub fn new() -> Result<Self> {
        let dctx =
            zstd::bulk::Decompressor::new().map_err(|e| FormatError::Decompress(e.to_string()))?;
        Ok(PayloadDecoder {
            dctx,
            planes: Vec::new(),
        })
    }

    /// Decodes `payload` into `dst`, whose length is the raw length the
    /// frame declared (already bounded by the caller). Every length inside the
    /// payload is checked against `dst`; a payload that decodes to any other
    /// length is an error.
    pub fn decode_into(
        &mut self,
        codec: Codec,
        elem: u8,
        payload: &[u8],
        dst: &mut [u8],
    ) -> Result<()> {
        match codec {
            Codec::Raw => {
                if payload.len() != dst.len() {
                    return Err(FormatError::malformed(
                        "raw payload",
                        format!("{} bytes stored for {} raw", payload.len(), dst.len()),
                    ));
                }
                dst.copy_from_slice(payload);
                Ok(())
            }
            Codec::Zstd => self.zstd_exact(payload, dst, "zstd payload"),
            Codec::Planes => self.decode_planes(elem, payload, dst),
        }
    }

    fn zstd_exact(&mut self, src: &[u8], dst: &mut [u8], what: &'static str) -> Result<()> {
        let got = self
            .dctx
            .decompress_to_buffer(src, dst)
            .map_err(|e| FormatError::Decompress(format!("{what}: {e}")))?;
        if got != dst.len() {
            return Err(FormatError::malformed(
                what,
                format!("decompressed to {got} bytes, expected {}", dst.len()),
            ));
        }
        Ok(())
    }

    fn decode_planes(&mut self, elem: u8, payload: &[u8], dst: &mut [u8]) -> Result<()> {
        let what = "planes payload";
        let e = usize::from(elem);
        if !matches!(e, 2 | 4 | 8) || dst.len() % e != 0 {
            return Err(FormatError::malformed(
                what,
                format!("element size {elem} does not fit {} raw bytes", dst.len()),
            ));
        }
        let n = dst.len() / e;
        let mut r = crate::wire::Reader::new(payload);
        let transform = Transform::from_code(r.u8(what)?)
            .ok_or_else(|| FormatError::malformed(what, "unknown transform"))?;
        if usize::from(r.u8(what)?) != e {
            return Err(FormatError::malformed(
                what,
                "plane count differs from element size",
            ));
        }
        let mut table = [(0u8, 0usize); 8];
        for slot in table.iter_mut().take(e) {
            *slot = (r.u8(what)?, r.u32(what)? as usize);
        }
        // Compressed planes are decoded over these bytes; only grow, never re-zero.
        self.planes.resize(dst.len(), 0);
        let mut stored: [&[u8]; 8] = [&[]; 8];
        for (k, &(mode, len)) in table.iter().take(e).enumerate() {
            let bytes = r.bytes(len, what)?;
            match mode {
                PLANE_RAW if len == n => stored[k] = bytes,
                PLANE_ZSTD => {
                    let (dctx, planes) = (&mut self.dctx, &mut self.planes);
                    let out = &mut planes[k * n..(k + 1) * n];
                    let got = dctx
                        .decompress_to_buffer(bytes, out)
                        .map_err(|err| FormatError::Decompress(format!("plane {k}: {err}")))?;
                    if got != n {
                        return Err(FormatError::malformed(
                            what,
                            format!("plane {k} decoded to {got} bytes, expected {n}"),
                        ));
                    }
                }
                PLANE_HUFFMAN => huffman::decode(bytes, &mut self.planes[k * n..(k + 1) * n])?,
                PLANE_RAW => {
                    return Err(FormatError::malformed(
                        what,
                        format!("raw plane {k} holds {len} bytes, expected {n}"),
                    ))
                }
                m => {
                    return Err(FormatError::malformed(
                        what,
                        format!("unknown plane mode {m}"),
                    ))
                }
            }
        }
        r.finish(what)?;
        let mut views: [&[u8]; 8] = [&[]; 8];
        for (k, view) in views.iter_mut().take(e).enumerate() {
            let (mode, _) = table[k];
            *view = if mode != PLANE_RAW {
                &self.planes[k * n..(k + 1) * n]
            } else {
                stored[k]
            };
        }
        planes::join(&views[..e], transform, dst);
        Ok(())
    }
}

//! Shard layout: how a rank's ordered entries are cut into chunks.
//!
//! Rules, chosen for dedup:
//! * An entry at least one chunk long starts on a chunk boundary of its own
//!   and fills whole chunks, its tail in a chunk of its own. An entry of at
//!   least [`OWN_CHUNK_DIVISOR`]th of a chunk also gets a chunk of its own
//!   (a shorter one), so a medium tensor that changes does not drag the
//!   unchanged tensors packed beside it into a new chunk. So an unchanged
//!   tensor gives the same chunk ids at every step, whatever its neighbours
//!   did, and identical tensors on different ranks give the same ids.
//! * Smaller entries are packed, in order, into shared chunks of at most
//!   `chunk_size / OWN_CHUNK_DIVISOR` bytes, each entry starting at a
//!   multiple of [`PACK_ALIGN`] (the gap is zero bytes) and never split
//!   across two chunks. Thousands of small tensors do not become thousands of
//!   tiny objects, packed elements stay aligned for the planes codec, and a
//!   changed small tensor (a LoRA adapter among frozen weights, a norm)
//!   rewrites at most one pack of an eighth of a chunk, not a whole chunk.
//! * Each element class (element size and float-ness: bf16 with f16, f32
//!   alone, opaque bytes, ...) has its own open pack chunk, so a packed chunk
//!   holds one class and the byte-plane codec can split it.
//! * Empty entries take no bytes and have no segments.
//!
//! The layout is a pure function of the entries' names, kinds, lengths and
//! the chunk size: the same inputs always give the same plan.

use crate::codec::ElemHint;
use crate::error::{FormatError, Result};
use crate::frame::MAX_CHUNK_LEN;
use crate::names::validate_entry_name;
use crate::DType;

/// Entries of at least `chunk_size / OWN_CHUNK_DIVISOR` bytes are never
/// packed with others.
pub const OWN_CHUNK_DIVISOR: u64 = 8;

/// Alignment of an entry packed into a shared chunk.
pub const PACK_ALIGN: u64 = 64;
/// The default chunk size: 16 MiB.
pub const DEFAULT_CHUNK_SIZE: u32 = 16 << 20;
/// The smallest chunk size accepted (tests use small chunks).
pub const MIN_CHUNK_SIZE: u32 = 64;
/// Most dimensions a tensor may have.
pub const MAX_NDIM: usize = 32;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EntryKind {
    /// A tensor: dtype and shape; its length is the product of the shape
    /// times the element size.
    Tensor {
        /// Element type.
        dtype: DType,
        /// Dimensions, outermost first.
        shape: Vec<u64>,
    },
    /// Opaque bytes (optimizer or data-loader state, RNG state, ...).
    Blob,
}

impl EntryKind {
    /// The codec hint for chunks holding only this entry's bytes.
    pub fn elem_hint(&self) -> ElemHint {
        match self {
            EntryKind::Tensor { dtype, .. } => ElemHint {
                // Sizes are 1, 2, 4 or 8.
                size: dtype.size() as u8,
                float: dtype.is_float(),
            },
            EntryKind::Blob => ElemHint::BYTES,
        }
    }
}

/// The byte length of a tensor of `dtype` and `shape`, if it fits in a u64.
pub fn tensor_len(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
}

/// One entry of a shard, as the layout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntrySpec {
    /// Unique name within the shard.
    pub name: String,
    /// Tensor or blob.
    pub kind: EntryKind,
    /// Length in bytes.
    pub len: u64,
}

impl EntrySpec {
    /// A tensor entry; its length is derived from dtype and shape.
    pub fn tensor(name: impl Into<String>, dtype: DType, shape: Vec<u64>) -> Result<Self> {
        if shape.len() > MAX_NDIM {
            return Err(FormatError::invalid(
                "tensor shape",
                format!("{} dimensions (max {MAX_NDIM})", shape.len()),
            ));
        }
        let len = tensor_len(dtype, &shape)
            .ok_or_else(|| FormatError::invalid("tensor shape", "byte length overflows u64"))?;
        Ok(EntrySpec {
            name: name.into(),
            kind: EntryKind::Tensor { dtype, shape },
            len,
        })
    }

    /// A blob entry of `len` bytes.
    pub fn blob(name: impl Into<String>, len: u64) -> Self {
        EntrySpec {
            name: name.into(),
            kind: EntryKind::Blob,
            len,
        }
    }
}

/// A run of one entry's bytes inside one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index of the entry.
    pub entry: usize,
    /// Offset in the entry.
    pub entry_offset: u64,
    /// Offset in the chunk.
    pub chunk_offset: u32,
    /// Length.
    pub len: u32,
}

/// One chunk of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Length of the chunk.
    pub len: u32,
    /// Codec hint: the element class of its pieces.
    pub hint: ElemHint,
    /// The pieces, in chunk-offset order; gaps between them are zeros.
    pub pieces: Vec<Piece>,
}

impl ChunkPlan {
    /// The piece, if the chunk is exactly one contiguous run of one entry
    /// (then it can be hashed and written straight from the entry's bytes).
    pub fn single_piece(&self) -> Option<&Piece> {
        match self.pieces.as_slice() {
            [p] if p.chunk_offset == 0 && p.len == self.len => Some(p),
            _ => None,
        }
    }
}

/// Where a run of an entry's bytes lives: chunk index, offset, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedSegment {
    /// Index into [`Layout::chunks`].
    pub chunk: u32,
    /// Offset in that chunk.
    pub offset: u32,
    /// Length.
    pub len: u32,
}

/// The chunking of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The chunk size the plan was made with.
    pub chunk_size: u32,
    /// The chunks, in order.
    pub chunks: Vec<ChunkPlan>,
    /// Per entry (same order as the input), its segments in entry order.
    pub segments: Vec<Vec<PlannedSegment>>,
}

/// Checks a chunk size: a multiple of 64 between [`MIN_CHUNK_SIZE`] and
/// [`MAX_CHUNK_LEN`], so chunks of large tensors hold whole elements.
pub fn validate_chunk_size(chunk_size: u32) -> Result<()> {
    if !(MIN_CHUNK_SIZE..=MAX_CHUNK_LEN).contains(&chunk_size) || chunk_size % 64 != 0 {
        return Err(FormatError::invalid(
            "chunk size",
            format!("{chunk_size} is not a multiple of 64 in [{MIN_CHUNK_SIZE}, {MAX_CHUNK_LEN}]"),
        ));
    }
    Ok(())
}

impl Layout {
    /// Plans the chunks for `entries`. Fails on an invalid chunk size, an
    /// invalid or duplicate name, or a tensor whose length disagrees with
    /// its shape.
    pub fn plan(entries: &[EntrySpec], chunk_size: u32) -> Result<Layout> {
        validate_chunk_size(chunk_size)?;
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        for e in entries {
            validate_entry_name(&e.name)?;
            if !seen.insert(e.name.as_str()) {
                return Err(FormatError::invalid(
                    "entry name",
                    format!("{:?} appears twice", e.name),
                ));
            }
            if let EntryKind::Tensor { dtype, shape } = &e.kind {
                if shape.len() > MAX_NDIM || tensor_len(*dtype, shape) != Some(e.len) {
                    return Err(FormatError::invalid(
                        "tensor",
                        format!(
                            "{:?}: {} bytes do not match {dtype} {shape:?}",
                            e.name, e.len
                        ),
                    ));
                }
            }
        }

        let cs = u64::from(chunk_size);
        let mut chunks: Vec<ChunkPlan> = Vec::new();
        let mut segments = vec![Vec::new(); entries.len()];
        // The open pack chunk of each element class.
        let mut packs: Vec<(ElemHint, usize)> = Vec::new();

        for (i, e) in entries.iter().enumerate() {
            if e.len == 0 {
                continue;
            }
            let hint = e.kind.elem_hint();
            if e.len >= cs / OWN_CHUNK_DIVISOR {
                let mut off = 0u64;
                while off < e.len {
                    let len = (e.len - off).min(cs);
                    // len <= chunk_size <= u32::MAX
                    let len32 = len as u32;
                    segments[i].push(PlannedSegment {
                        chunk: chunk_index(chunks.len())?,
                        offset: 0,
                        len: len32,
                    });
                    chunks.push(ChunkPlan {
                        len: len32,
                        hint,
                        pieces: vec![Piece {
                            entry: i,
                            entry_offset: off,
                            chunk_offset: 0,
                            len: len32,
                        }],
                    });
                    off += len;
                }
                continue;
            }
            // A small entry: into the open pack chunk if it fits, else a new one.
            let open = packs.iter().position(|(h, _)| *h == hint);
            let start = open.and_then(|p| {
                let c = packs[p].1;
                let at = u64::from(chunks[c].len).div_ceil(PACK_ALIGN) * PACK_ALIGN;
                (at + e.len <= cs / OWN_CHUNK_DIVISOR).then_some((c, at))
            });
            let (c, at) = match start {
                Some(x) => x,
                None => {
                    chunks.push(ChunkPlan {
                        len: 0,
                        hint,
                        pieces: Vec::new(),
                    });
                    (chunks.len() - 1, 0)
                }
            };
            match open {
                Some(p) => packs[p].1 = c,
                None => packs.push((hint, c)),
            }
            let plan = &mut chunks[c];
            // at + len <= chunk_size, so both fit in u32.
            let (at32, len32) = (at as u32, e.len as u32);
            plan.pieces.push(Piece {
                entry: i,
                entry_offset: 0,
                chunk_offset: at32,
                len: len32,
            });
            plan.len = at32 + len32;
            segments[i].push(PlannedSegment {
                chunk: chunk_index(c)?,
                offset: at32,
                len: len32,
            });
        }
        Ok(Layout {
            chunk_size,
            chunks,
            segments,
        })
    }

    /// Total bytes of all chunks (entries plus alignment padding).
    pub fn stored_len(&self) -> u64 {
        self.chunks.iter().map(|c| u64::from(c.len)).sum()
    }

    /// Writes chunk `index` into `dst` (resized to the chunk's length) from
    /// the entries' bytes, `entries[i]` being entry `i` in full.
    pub fn fill_chunk(&self, index: usize, entries: &[&[u8]], dst: &mut Vec<u8>) -> Result<()> {
        let plan = self
            .chunks
            .get(index)
            .ok_or_else(|| FormatError::invalid("chunk index", format!("{index} out of range")))?;
        dst.clear();
        dst.resize(plan.len as usize, 0);
        for p in &plan.pieces {
            let src = entries
                .get(p.entry)
                .and_then(|b| {
                    let start = usize::try_from(p.entry_offset).ok()?;
                    b.get(start..start + p.len as usize)
                })
                .ok_or_else(|| {
                    FormatError::invalid(
                        "entry bytes",
                        format!("entry {} is shorter than planned", p.entry),
                    )
                })?;
            let at = p.chunk_offset as usize;
            dst[at..at + p.len as usize].copy_from_slice(src);
        }
        Ok(())
    }
}

fn chunk_index(i: usize) -> Result<u32> {
    u32::try_from(i).map_err(|_| FormatError::invalid("shard", "more than 2^32 chunks"))
}

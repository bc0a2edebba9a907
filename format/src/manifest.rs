//! Shard manifests: what one rank saved at one step, and where its bytes are.
//!
//! Binary layout v1 (little-endian; strings are a u32 byte length then UTF-8):
//!
//! ```text
//! magic "STMF" | version u16 = 1 | flags u16 = 0
//! job string | step u64 | rank u32 | world_size u32 | created_unix_ms u64 | chunk_size u32
//! chunk count u32, then per chunk:  id [32] | len u32 | elem_size u8 | flags u8 (bit 0: float)
//! entry count u32, then per entry:  name string | kind u8 (0 tensor, 1 blob)
//!     tensor only: dtype u8 | ndim u8 | dims u64 × ndim
//!     len u64 | segment count u32 | per segment: chunk index u32 | offset u32 | len u32
//! metadata count u32, then per item: key string | value string   (keys sorted, unique)
//! BLAKE3-256 of all the bytes above
//! ```

use std::collections::BTreeMap;

use crate::codec::ElemHint;
use crate::error::{FormatError, Result};
use crate::layout::{tensor_len, validate_chunk_size, EntryKind, EntrySpec, Layout, MAX_NDIM};
use crate::names::{
    validate_entry_name, validate_job_id, MAX_ENTRY_NAME_LEN, MAX_JOB_ID_LEN, MAX_META_KEY_LEN,
    MAX_META_VALUE_LEN,
};
use crate::wire::{seal, unseal, Reader, Writer};
use crate::ChunkId;

/// Magic bytes of a shard manifest.
pub const MANIFEST_MAGIC: [u8; 4] = *b"STMF";
/// The manifest version this crate writes.
pub const MANIFEST_VERSION: u16 = 1;
/// The largest encoded manifest a reader should accept (callers bound their
/// reads with it before calling [`ShardManifest::decode`]).
pub const MAX_MANIFEST_LEN: usize = 256 << 20;
/// Most entries in one shard.
pub const MAX_ENTRIES: usize = 1 << 22;
/// Most distinct chunks in one shard.
pub const MAX_CHUNKS: usize = 1 << 24;
/// Most metadata items.
pub const MAX_META_ITEMS: usize = 1 << 16;

/// Identity of a shard: which job, step and rank it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ShardInfo {
    /// Job namespace.
    pub job: String,
    /// Training step.
    pub step: u64,
    /// Rank that saved the shard.
    pub rank: u32,
    /// Number of ranks in the job at this step.
    pub world_size: u32,
    /// Creation time, milliseconds since the Unix epoch (injected by the caller).
    pub created_unix_ms: u64,
}

/// A distinct chunk of the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChunkRef {
    /// BLAKE3 of the raw bytes.
    pub id: ChunkId,
    /// Raw length.
    pub len: u32,
    /// Codec hint for tiers that compress.
    pub hint: ElemHint,
}

/// A run of an entry's bytes in one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index into [`ShardManifest::chunks`].
    pub chunk: u32,
    /// Offset in the chunk.
    pub offset: u32,
    /// Length.
    pub len: u32,
}

/// A tensor or blob of the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Unique name.
    pub name: String,
    /// Tensor (dtype, shape) or blob.
    pub kind: EntryKind,
    /// Length in bytes.
    pub len: u64,
    /// Where the bytes are, in entry order.
    pub segments: Vec<Segment>,
}

/// The manifest of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardManifest {
    /// Job, step, rank, world size, creation time.
    pub info: ShardInfo,
    /// The chunk size the shard was laid out with.
    pub chunk_size: u32,
    /// Distinct chunks, in first-use order.
    pub chunks: Vec<ChunkRef>,
    /// Entries in the order they were saved.
    pub entries: Vec<Entry>,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
}

impl ShardManifest {
    /// Builds the manifest from a layout and the ids of its chunks (in layout
    /// order). Identical chunks share one [`ChunkRef`].
    pub fn from_layout(
        info: ShardInfo,
        entries: &[EntrySpec],
        layout: &Layout,
        chunk_ids: &[ChunkId],
        metadata: BTreeMap<String, String>,
    ) -> Result<Self> {
        if chunk_ids.len() != layout.chunks.len() || entries.len() != layout.segments.len() {
            return Err(FormatError::invalid(
                "manifest",
                "chunk ids or entries do not match the layout",
            ));
        }
        let mut index: std::collections::HashMap<ChunkId, u32> = Default::default();
        let mut chunks = Vec::new();
        let mut remap = Vec::with_capacity(chunk_ids.len());
        for (plan, id) in layout.chunks.iter().zip(chunk_ids) {
            let i = *index.entry(*id).or_insert_with(|| {
                chunks.push(ChunkRef {
                    id: *id,
                    len: plan.len,
                    hint: plan.hint,
                });
                // MAX_CHUNKS < u32::MAX is checked in validate().
                (chunks.len() - 1) as u32
            });
            remap.push(i);
        }
        let entries = entries
            .iter()
            .zip(&layout.segments)
            .map(|(e, segs)| Entry {
                name: e.name.clone(),
                kind: e.kind.clone(),
                len: e.len,
                segments: segs
                    .iter()
                    .map(|s| Segment {
                        chunk: remap[s.chunk as usize],
                        offset: s.offset,
                        len: s.len,
                    })
                    .collect(),
            })
            .collect();
        let m = ShardManifest {
            info,
            chunk_size: layout.chunk_size,
            chunks,
            entries,
            metadata,
        };
        m.validate()?;
        Ok(m)
    }

    /// Sum of the entries' lengths.
    pub fn logical_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.len).sum()
    }

    /// Looks an entry up by name.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Checks every invariant a decoded manifest must hold: names, ranks,
    /// chunk references in range, segments covering each entry exactly.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| FormatError::malformed("shard manifest", reason);
        validate_job_id(&self.info.job)?;
        if self.info.world_size == 0 || self.info.rank >= self.info.world_size {
            return Err(bad(format!(
                "rank {} of world size {}",
                self.info.rank, self.info.world_size
            )));
        }
        validate_chunk_size(self.chunk_size).map_err(|e| bad(e.to_string()))?;
        if self.chunks.len() > MAX_CHUNKS
            || self.entries.len() > MAX_ENTRIES
            || self.metadata.len() > MAX_META_ITEMS
        {
            return Err(bad("too many chunks, entries or metadata items".into()));
        }
        for c in &self.chunks {
            if c.len == 0 || c.len > self.chunk_size || !matches!(c.hint.size, 1 | 2 | 4 | 8) {
                return Err(bad(format!(
                    "chunk {} has length {} or element size {}",
                    c.id, c.len, c.hint.size
                )));
            }
        }
        let mut names = std::collections::HashSet::with_capacity(self.entries.len());
        for e in &self.entries {
            validate_entry_name(&e.name).map_err(|err| bad(err.to_string()))?;
            if !names.insert(e.name.as_str()) {
                return Err(bad(format!("entry {:?} appears twice", e.name)));
            }
            if let EntryKind::Tensor { dtype, shape } = &e.kind {
                if shape.len() > MAX_NDIM || tensor_len(*dtype, shape) != Some(e.len) {
                    return Err(bad(format!(
                        "entry {:?}: {} bytes do not match {dtype} {shape:?}",
                        e.name, e.len
                    )));
                }
            }
            let mut covered = 0u64;
            for s in &e.segments {
                let chunk = self.chunks.get(s.chunk as usize).ok_or_else(|| {
                    bad(format!(
                        "entry {:?} refers to chunk {} of {}",
                        e.name,
                        s.chunk,
                        self.chunks.len()
                    ))
                })?;
                if s.len == 0 || u64::from(s.offset) + u64::from(s.len) > u64::from(chunk.len) {
                    return Err(bad(format!(
                        "entry {:?}: segment {}+{} outside chunk of {}",
                        e.name, s.offset, s.len, chunk.len
                    )));
                }
                covered += u64::from(s.len);
            }
            if covered != e.len {
                return Err(bad(format!(
                    "entry {:?}: segments cover {covered} of {} bytes",
                    e.name, e.len
                )));
            }
        }
        for (k, v) in &self.metadata {
            if k.len() > MAX_META_KEY_LEN || v.len() > MAX_META_VALUE_LEN {
                return Err(bad(format!("metadata item {k:?} too long")));
            }
        }
        Ok(())
    }

    /// The binary encoding (current version). Fails if the manifest is invalid.
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let mut w = Writer::new();
        w.bytes(&MANIFEST_MAGIC);
        w.u16(MANIFEST_VERSION);
        w.u16(0);
        w.string(&self.info.job);
        w.u64(self.info.step);
        w.u32(self.info.rank);
        w.u32(self.info.world_size);
        w.u64(self.info.created_unix_ms);
        w.u32(self.chunk_size);
        w.len32(self.chunks.len());
        for c in &self.chunks {
            w.bytes(c.id.as_bytes());
            w.u32(c.len);
            w.u8(c.hint.size);
            w.u8(u8::from(c.hint.float));
        }
        w.len32(self.entries.len());
        for e in &self.entries {
            w.string(&e.name);
            match &e.kind {
                EntryKind::Tensor { dtype, shape } => {
                    w.u8(0);
                    w.u8(dtype.code());
                    // validate() bounds ndim by MAX_NDIM.
                    w.u8(shape.len() as u8);
                    for &d in shape {
                        w.u64(d);
                    }
                }
                EntryKind::Blob => w.u8(1),
            }
            w.u64(e.len);
            w.len32(e.segments.len());
            for s in &e.segments {
                w.u32(s.chunk);
                w.u32(s.offset);
                w.u32(s.len);
            }
        }
        w.len32(self.metadata.len());
        for (k, v) in &self.metadata {
            w.string(k);
            w.string(v);
        }
        let out = seal(w);
        if out.len() > MAX_MANIFEST_LEN {
            return Err(FormatError::invalid(
                "manifest",
                format!("{} bytes exceeds {MAX_MANIFEST_LEN}", out.len()),
            ));
        }
        Ok(out)
    }

    /// The content id of the encoded manifest, as commit records name it.
    pub fn id_of(encoded: &[u8]) -> ChunkId {
        ChunkId::of(encoded)
    }

    /// Decodes and validates a manifest of any version this crate knows.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let what = "shard manifest";
        if bytes.len() > MAX_MANIFEST_LEN {
            return Err(FormatError::TooLarge {
                what,
                value: bytes.len() as u64,
                limit: MAX_MANIFEST_LEN as u64,
            });
        }
        let mut r = Reader::new(bytes);
        let magic = r.bytes(4, what)?;
        if magic != MANIFEST_MAGIC {
            return Err(FormatError::BadMagic {
                what,
                found: magic.to_vec(),
            });
        }
        match r.u16(what)? {
            1 => decode_v1(unseal(bytes, what)?),
            v => Err(FormatError::UnsupportedVersion {
                what,
                version: u32::from(v),
            }),
        }
    }
}

fn decode_v1(body: &[u8]) -> Result<ShardManifest> {
    let what = "shard manifest";
    let mut r = Reader::new(body);
    r.bytes(6, what)?; // magic and version, checked by the caller
    if r.u16("manifest flags")? != 0 {
        return Err(FormatError::malformed(what, "unknown flags"));
    }
    let info = ShardInfo {
        job: r.string(MAX_JOB_ID_LEN, "job id")?,
        step: r.u64("step")?,
        rank: r.u32("rank")?,
        world_size: r.u32("world size")?,
        created_unix_ms: r.u64("creation time")?,
    };
    let chunk_size = r.u32("chunk size")?;
    let n = r.count(MAX_CHUNKS, 38, "chunk count")?;
    let mut chunks = Vec::with_capacity(n);
    for _ in 0..n {
        let id = r.chunk_id("chunk id")?;
        let len = r.u32("chunk length")?;
        let size = r.u8("chunk element size")?;
        let flags = r.u8("chunk flags")?;
        if flags > 1 {
            return Err(FormatError::malformed(
                what,
                format!("unknown chunk flags {flags}"),
            ));
        }
        chunks.push(ChunkRef {
            id,
            len,
            hint: ElemHint {
                size,
                float: flags == 1,
            },
        });
    }
    // The smallest entry: empty name (rejected later), kind, len, no segments.
    let n = r.count(MAX_ENTRIES, 4 + 1 + 8 + 4, "entry count")?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.string(MAX_ENTRY_NAME_LEN, "entry name")?;
        let kind = match r.u8("entry kind")? {
            0 => {
                let dtype = crate::DType::from_code(r.u8("dtype")?)?;
                let ndim = usize::from(r.u8("ndim")?);
                if ndim > MAX_NDIM {
                    return Err(FormatError::TooLarge {
                        what: "tensor ndim",
                        value: ndim as u64,
                        limit: MAX_NDIM as u64,
                    });
                }
                let mut shape = Vec::with_capacity(ndim);
                for _ in 0..ndim {
                    shape.push(r.u64("tensor dimension")?);
                }
                EntryKind::Tensor { dtype, shape }
            }
            1 => EntryKind::Blob,
            k => {
                return Err(FormatError::malformed(
                    what,
                    format!("unknown entry kind {k}"),
                ))
            }
        };
        let len = r.u64("entry length")?;
        let ns = r.count(MAX_CHUNKS, 12, "segment count")?;
        let mut segments = Vec::with_capacity(ns);
        for _ in 0..ns {
            segments.push(Segment {
                chunk: r.u32("segment chunk")?,
                offset: r.u32("segment offset")?,
                len: r.u32("segment length")?,
            });
        }
        entries.push(Entry {
            name,
            kind,
            len,
            segments,
        });
    }
    let n = r.count(MAX_META_ITEMS, 8, "metadata count")?;
    let mut metadata = BTreeMap::new();
    for _ in 0..n {
        let k = r.string(MAX_META_KEY_LEN, "metadata key")?;
        let v = r.string(MAX_META_VALUE_LEN, "metadata value")?;
        if metadata.insert(k, v).is_some() {
            return Err(FormatError::malformed(what, "duplicate metadata key"));
        }
    }
    r.finish(what)?;
    let m = ShardManifest {
        info,
        chunk_size,
        chunks,
        entries,
        metadata,
    };
    m.validate()?;
    Ok(m)
}

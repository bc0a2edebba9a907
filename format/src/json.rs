//! JSON renderings of manifests and commit records, for humans and scripts.
//!
//! The schema is stable: fields are only ever added. Segments name their
//! chunk by id (not by table index) so a script needs no join.

use serde::Serialize;

use crate::commit::CommitRecord;
use crate::layout::EntryKind;
use crate::manifest::{ShardInfo, ShardManifest, MANIFEST_VERSION};
use crate::{ChunkId, DType};

#[derive(Serialize)]
struct ManifestView<'a> {
    format_version: u16,
    #[serde(flatten)]
    info: &'a ShardInfo,
    chunk_size: u32,
    logical_bytes: u64,
    metadata: &'a std::collections::BTreeMap<String, String>,
    chunks: Vec<ChunkView>,
    entries: Vec<EntryView<'a>>,
}

#[derive(Serialize)]
struct ChunkView {
    id: ChunkId,
    len: u32,
    elem_size: u8,
    float: bool,
}

#[derive(Serialize)]
struct EntryView<'a> {
    name: &'a str,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dtype: Option<DType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shape: Option<&'a [u64]>,
    len: u64,
    segments: Vec<SegmentView>,
}

#[derive(Serialize)]
struct SegmentView {
    chunk: Option<ChunkId>,
    offset: u32,
    len: u32,
}

impl ShardManifest {
    /// The manifest as a JSON value (see `docs/format.md` for the schema).
    pub fn to_json(&self) -> serde_json::Value {
        let view = ManifestView {
            format_version: MANIFEST_VERSION,
            info: &self.info,
            chunk_size: self.chunk_size,
            logical_bytes: self.logical_bytes(),
            metadata: &self.metadata,
            chunks: self
                .chunks
                .iter()
                .map(|c| ChunkView {
                    id: c.id,
                    len: c.len,
                    elem_size: c.hint.size,
                    float: c.hint.float,
                })
                .collect(),
            entries: self
                .entries
                .iter()
                .map(|e| {
                    let (kind, dtype, shape) = match &e.kind {
                        EntryKind::Tensor { dtype, shape } => {
                            ("tensor", Some(*dtype), Some(shape.as_slice()))
                        }
                        EntryKind::Blob => ("blob", None, None),
                    };
                    EntryView {
                        name: &e.name,
                        kind,
                        dtype,
                        shape,
                        len: e.len,
                        segments: e
                            .segments
                            .iter()
                            .map(|s| SegmentView {
                                chunk: self.chunks.get(s.chunk as usize).map(|c| c.id),
                                offset: s.offset,
                                len: s.len,
                            })
                            .collect(),
                    }
                })
                .collect(),
        };
        serde_json::to_value(view).unwrap_or(serde_json::Value::Null)
    }
}

impl CommitRecord {
    /// The record as a JSON value.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "format_version".into(),
                crate::commit::COMMIT_VERSION.into(),
            );
            obj.insert("complete".into(), self.is_complete().into());
        }
        v
    }
}

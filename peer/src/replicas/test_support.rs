//! What the replicas' unit tests share: a shard manifest over given chunks.

use std::collections::BTreeMap;

use strata_format::codec::ElemHint;
use strata_format::manifest::{ChunkRef, Entry, Segment};
use strata_format::{ChunkId, EntryKind, ShardInfo, ShardManifest};

/// The encoded manifest of `job`'s step `step`, rank `rank` of `world`:
/// one blob entry (`e0`, `e1`, ...) per chunk of `chunks`, whole.
pub(super) fn manifest_of(
    job: &str,
    step: u64,
    rank: u32,
    world: u32,
    chunks: &[Vec<u8>],
) -> Vec<u8> {
    ShardManifest {
        info: ShardInfo {
            job: job.into(),
            step,
            rank,
            world_size: world,
            created_unix_ms: 1,
        },
        chunk_size: 1 << 20,
        chunks: chunks
            .iter()
            .map(|c| ChunkRef {
                id: ChunkId::of(c),
                len: c.len() as u32,
                hint: ElemHint::BYTES,
            })
            .collect(),
        entries: chunks
            .iter()
            .enumerate()
            .map(|(i, c)| Entry {
                name: format!("e{i}"),
                kind: EntryKind::Blob,
                len: c.len() as u64,
                segments: vec![Segment {
                    chunk: i as u32,
                    offset: 0,
                    len: c.len() as u32,
                }],
            })
            .collect(),
        metadata: BTreeMap::new(),
    }
    .encode()
    .expect("a manifest of a few chunks encodes")
}

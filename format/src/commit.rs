//! Commit records: the small create-only file whose existence makes a step
//! (or a tier's part of it) visible to readers.
//!
//! Binary layout v1 (little-endian):
//!
//! ```text
//! magic "STCR" | version u16 = 1 | flags u16 = 0
//! job string (u32 length + UTF-8) | step u64 | world_size u32 | committed_unix_ms u64
//! shard count u32, then per shard (ranks strictly increasing):
//!     rank u32 | manifest id [32] (BLAKE3 of the encoded manifest) | logical bytes u64
//! BLAKE3-256 of all the bytes above
//! ```
//!
//! A record naming every rank of the world is a whole step (L3 writes one);
//! a node's L1 or a peer writes one naming the ranks it holds.

use crate::error::{FormatError, Result};
use crate::names::{validate_job_id, MAX_JOB_ID_LEN};
use crate::wire::{seal, unseal, Reader, Writer};
use crate::ChunkId;

/// Magic bytes of a commit record.
pub const COMMIT_MAGIC: [u8; 4] = *b"STCR";
/// The commit-record version this crate writes.
pub const COMMIT_VERSION: u16 = 1;
/// The largest world size a record may name.
pub const MAX_WORLD_SIZE: u32 = 1 << 22;

/// One shard named by a commit record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ShardRef {
    /// The rank.
    pub rank: u32,
    /// BLAKE3 of the rank's encoded shard manifest.
    pub manifest: ChunkId,
    /// Sum of the shard's entry lengths.
    pub logical_bytes: u64,
}

/// The commit record of a step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CommitRecord {
    /// Job namespace.
    pub job: String,
    /// Training step.
    pub step: u64,
    /// Ranks in the job at this step.
    pub world_size: u32,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_unix_ms: u64,
    /// The shards this record commits, by increasing rank.
    pub shards: Vec<ShardRef>,
}

impl CommitRecord {
    /// True when every rank of the world is named.
    pub fn is_complete(&self) -> bool {
        self.shards.len() == self.world_size as usize
    }

    /// Total logical bytes of the named shards.
    pub fn logical_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.logical_bytes).sum()
    }

    /// Checks the invariants: valid job id, world size in range, ranks
    /// strictly increasing and below the world size.
    pub fn validate(&self) -> Result<()> {
        validate_job_id(&self.job)?;
        let bad = |reason: String| FormatError::malformed("commit record", reason);
        if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            return Err(bad(format!("world size {}", self.world_size)));
        }
        let mut prev: Option<u32> = None;
        for s in &self.shards {
            if s.rank >= self.world_size || prev.is_some_and(|p| s.rank <= p) {
                return Err(bad(format!("rank {} out of order or range", s.rank)));
            }
            prev = Some(s.rank);
        }
        Ok(())
    }

    /// The binary encoding (current version).
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let mut w = Writer::new();
        w.bytes(&COMMIT_MAGIC);
        w.u16(COMMIT_VERSION);
        w.u16(0);
        w.string(&self.job);
        w.u64(self.step);
        w.u32(self.world_size);
        w.u64(self.committed_unix_ms);
        w.len32(self.shards.len());
        for s in &self.shards {
            w.u32(s.rank);
            w.bytes(s.manifest.as_bytes());
            w.u64(s.logical_bytes);
        }
        Ok(seal(w))
    }

    /// Decodes and validates a record of any version this crate knows.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let what = "commit record";
        let mut r = Reader::new(bytes);
        let magic = r.bytes(4, what)?;
        if magic != COMMIT_MAGIC {
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

fn decode_v1(body: &[u8]) -> Result<CommitRecord> {
    let what = "commit record";
    let mut r = Reader::new(body);
    r.bytes(6, what)?;
    if r.u16("commit flags")? != 0 {
        return Err(FormatError::malformed(what, "unknown flags"));
    }
    let job = r.string(MAX_JOB_ID_LEN, "job id")?;
    let step = r.u64("step")?;
    let world_size = r.u32("world size")?;
    let committed_unix_ms = r.u64("commit time")?;
    let n = r.count(MAX_WORLD_SIZE as usize, 44, "shard count")?;
    let mut shards = Vec::with_capacity(n);
    for _ in 0..n {
        shards.push(ShardRef {
            rank: r.u32("rank")?,
            manifest: r.chunk_id("manifest id")?,
            logical_bytes: r.u64("logical bytes")?,
        });
    }
    r.finish(what)?;
    let rec = CommitRecord {
        job,
        step,
        world_size,
        committed_unix_ms,
        shards,
    };
    rec.validate()?;
    Ok(rec)
}

//! [`Replicas`] as a [`ChunkStore`]: the service's own view of what it
//! holds for a job, so that its retention is `strata_gc::collect`, the same
//! code that collects L1 and L3.
//!
//! This is not what clients talk to (they go through the protocol and
//! [`crate::PeerStore`]); it is the store the service collects, and it
//! passes the tier conformance suite on its own. The tier's clock is the
//! service's: it stamps chunk ages with its monotonic clock, and
//! [`ChunkStore::now`] and [`ChunkStore::list_chunk_info`] express both on
//! one wall clock derived from it (a step of the host's clock changes
//! nothing), so no other node's clock enters a grace-period decision
//! (`keep_within` reads the commit records' times, which clients write).
//!
//! Chunk puts and reads here run on the calling task (they decode, and
//! may touch a spill file): collection uses neither, only listings and
//! deletes, as the service's retention did before; the service's request
//! path keeps using the blocking pool.

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use strata_format::codec::EncodeOptions;
use strata_format::frame::{encode_frame, FrameDecoder};
use strata_format::{ChunkId, CommitRecord};
use strata_tiered::{
    ChunkData, ChunkInfo, ChunkPut, ChunkStore, PutStats, Result, StepInfo, StoreError,
};

use super::Replicas;
use strata_tiered::PutOptions;

#[async_trait]
impl ChunkStore for Replicas {
    fn name(&self) -> &str {
        "peer replicas"
    }

    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        let _ = opts; // every put checks each id: nothing to skip.
        let (todo, mut stats) = strata_tiered::store::dedup_call(chunks)?;
        for c in todo {
            let len = c.data.len() as u64;
            let frame = encode_frame(c.data.as_slice(), c.hint, EncodeOptions::RAW)
                .map_err(|e| StoreError::invalid("chunk", e.to_string()))?;
            let stored = frame.len() as u64;
            if self.put_chunk(job, c.id, Bytes::from(frame))? {
                stats.written += 1;
                stats.bytes_written += len;
                stats.bytes_stored += stored;
            } else {
                stats.deduped += 1;
                stats.bytes_deduped += len;
            }
        }
        Ok(stats)
    }

    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let frame = self.get_frame(job, id)?;
        let corrupt = |source| StoreError::Corrupt {
            what: format!("chunk {id}"),
            source,
        };
        let mut dec = FrameDecoder::with_limit(self.limits().max_chunk).map_err(corrupt)?;
        let (_, raw) = dec.decode(&frame, Some(id)).map_err(corrupt)?;
        let whole = ChunkData::copy_from(&raw);
        match range {
            None => Ok(whole),
            Some(r) => whole
                .sub(r.start as usize..r.end as usize)
                .ok_or_else(|| StoreError::invalid("chunk range", format!("{r:?} of {id}"))),
        }
    }

    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.has(job, ids)
    }

    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        Replicas::list_chunks(self, job)
    }

    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        Replicas::delete_chunks(self, job, ids)
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        Replicas::put_manifest(self, job, step, rank, bytes).await
    }

    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        Replicas::get_manifest(self, job, step, rank).await
    }

    /// Writes the record only: retention is the caller's (the service
    /// collects after each commit it receives).
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.commit_record(record).await
    }

    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        Replicas::list_steps(self, job).await
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        Replicas::delete_step(self, job, step).await
    }

    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        Replicas::delete_shard(self, job, step, rank).await
    }

    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        Ok(self
            .chunk_ages(job)?
            .into_iter()
            .map(|(id, len, touched)| ChunkInfo {
                id,
                stored_len: Some(len),
                touched: Some(self.wall_of(touched)),
            })
            .collect())
    }

    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<(u64, u64)> {
        let Some(cutoff) = self.instant_of(cutoff) else {
            return Ok((0, 0)); // before anything this service has touched
        };
        self.delete_untouched_since(job, ids, cutoff)
    }

    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        Replicas::set_pin(self, job, step, pinned).await
    }

    async fn list_pins(&self, job: &str) -> Result<BTreeSet<u64>> {
        Replicas::list_pins(self, job).await
    }

    async fn now(&self, _job: &str) -> Result<SystemTime> {
        Ok(self.wall_now())
    }
}

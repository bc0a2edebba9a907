//! [`LimitStore`]: at most N calls in flight.

use std::ops::Range;

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};

/// Lets at most `limit` calls reach the inner store at once (as
/// `object_store`'s `LimitStore`); the others wait their turn, first come
/// first served. A batch call counts as one call: the tier decides its own
/// concurrency inside a batch.
#[derive(Debug)]
pub struct LimitStore<S> {
    inner: S,
    limit: usize,
    permits: Semaphore,
}

impl<S: ChunkStore> LimitStore<S> {
    /// Wraps `inner`, allowing `limit` calls in flight (0 is taken as 1:
    /// a store that admits no call would hang every caller).
    pub fn new(inner: S, limit: usize) -> Self {
        let limit = limit.max(1);
        LimitStore {
            inner,
            limit,
            permits: Semaphore::new(limit),
        }
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn permit(&self) -> Result<SemaphorePermit<'_>> {
        // The semaphore is never closed; the error arm is for completeness.
        self.permits
            .acquire()
            .await
            .map_err(|_| StoreError::Internal("limit semaphore closed".into()))
    }

    /// For the batch reads, which report errors per entry.
    async fn batch_permit(
        &self,
        n: usize,
    ) -> std::result::Result<SemaphorePermit<'_>, Vec<Result<ChunkData>>> {
        self.permits.acquire().await.map_err(|_| {
            (0..n)
                .map(|_| Err(StoreError::Internal("limit semaphore closed".into())))
                .collect()
        })
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ChunkStore> ChunkStore for LimitStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        let _p = self.permit().await?;
        self.inner.put_chunks_opts(job, chunks, opts).await
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        let _p = match self.batch_permit(ids.len()).await {
            Ok(p) => p,
            Err(errors) => return errors,
        };
        self.inner.get_chunks_opts(job, ids, opts).await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let _p = self.permit().await?;
        self.inner.get_chunk(job, id, range).await
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let _p = self.permit().await?;
        self.inner.has_chunks(job, ids).await
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        let _p = self.permit().await?;
        self.inner.list_chunks(job).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        let _p = self.permit().await?;
        self.inner.delete_chunks(job, ids).await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        let _p = self.permit().await?;
        self.inner.put_manifest(job, step, rank, bytes).await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        let _p = self.permit().await?;
        self.inner.get_manifest(job, step, rank).await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        let _p = self.permit().await?;
        self.inner.commit(record).await
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        let _p = self.permit().await?;
        self.inner.list_steps(job).await
    }
    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        let _p = self.permit().await?;
        self.inner.get_commit_record(job, step, first).await
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        let _p = self.permit().await?;
        self.inner.delete_step(job, step).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        let _p = self.permit().await?;
        self.inner.delete_shard(job, step, rank).await
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        let _p = self.permit().await?;
        self.inner.get_frame(job, id, buf).await
    }
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        let _p = self.permit().await?;
        self.inner.list_chunk_info(job).await
    }
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        let _p = self.permit().await?;
        self.inner
            .delete_chunks_untouched_since(job, ids, cutoff)
            .await
    }
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        let _p = self.permit().await?;
        self.inner.set_pin(job, step, pinned).await
    }
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        let _p = self.permit().await?;
        self.inner.list_pins(job).await
    }
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        let _p = self.permit().await?;
        self.inner.now(job).await
    }
    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        let _p = self.permit().await?;
        self.inner.abort_stale_uploads(job, cutoff).await
    }
    fn concurrency(&self) -> usize {
        self.inner.concurrency()
    }
    fn describe(&self) -> String {
        format!(
            "{} (at most {} calls in flight)",
            self.inner.describe(),
            self.limit
        )
    }
}

//! `Arc<T>` and `Box<T>` of a [`ChunkStore`] are stores: every method
//! forwarded (defaults included, so a tier's override is never lost behind
//! a pointer), enforced by `clippy::missing_trait_methods`.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord};

use crate::chunk_data::ChunkData;
use crate::error::Result;
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutOptions, PutStats, ReadOptions, StepInfo};

macro_rules! forward_chunk_store {
    ($ptr:ident) => {
        #[async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<T: ChunkStore + ?Sized> ChunkStore for $ptr<T> {
            fn name(&self) -> &str {
                (**self).name()
            }
            async fn put_chunks_opts(
                &self,
                job: &str,
                chunks: Vec<ChunkPut>,
                opts: PutOptions,
            ) -> Result<PutStats> {
                (**self).put_chunks_opts(job, chunks, opts).await
            }
            async fn get_chunks_opts(
                &self,
                job: &str,
                ids: &[ChunkId],
                opts: ReadOptions,
            ) -> Vec<Result<ChunkData>> {
                (**self).get_chunks_opts(job, ids, opts).await
            }
            async fn get_chunk(
                &self,
                job: &str,
                id: &ChunkId,
                range: Option<Range<u32>>,
            ) -> Result<ChunkData> {
                (**self).get_chunk(job, id, range).await
            }
            async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
                (**self).has_chunks(job, ids).await
            }
            async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
                (**self).list_chunks(job).await
            }
            async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
                (**self).delete_chunks(job, ids).await
            }
            async fn put_manifest(
                &self,
                job: &str,
                step: u64,
                rank: u32,
                bytes: &[u8],
            ) -> Result<()> {
                (**self).put_manifest(job, step, rank, bytes).await
            }
            async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
                (**self).get_manifest(job, step, rank).await
            }
            async fn commit(&self, record: &CommitRecord) -> Result<()> {
                (**self).commit(record).await
            }
            async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
                (**self).list_steps(job).await
            }
            async fn get_commit_record(
                &self,
                job: &str,
                step: u64,
                first: u32,
            ) -> Result<Option<CommitRecord>> {
                (**self).get_commit_record(job, step, first).await
            }
            async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
                (**self).delete_step(job, step).await
            }
            async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
                (**self).delete_shard(job, step, rank).await
            }
            async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
                (**self).get_frame(job, id, buf).await
            }
            async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
                (**self).list_chunk_info(job).await
            }
            async fn delete_chunks_untouched_since(
                &self,
                job: &str,
                ids: &[ChunkId],
                cutoff: std::time::SystemTime,
            ) -> Result<(u64, u64)> {
                (**self)
                    .delete_chunks_untouched_since(job, ids, cutoff)
                    .await
            }
            async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
                (**self).set_pin(job, step, pinned).await
            }
            async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
                (**self).list_pins(job).await
            }
            async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
                (**self).now(job).await
            }
            async fn abort_stale_uploads(
                &self,
                job: &str,
                cutoff: std::time::SystemTime,
            ) -> Result<u64> {
                (**self).abort_stale_uploads(job, cutoff).await
            }
            fn concurrency(&self) -> usize {
                (**self).concurrency()
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
        }
    };
}

forward_chunk_store!(Arc);
forward_chunk_store!(Box);

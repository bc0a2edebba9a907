//! [`SharedListing`]: one listing of a job's steps for every caller that
//! asks at once.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord};
use tokio::sync::OnceCell;

use crate::chunk_data::ChunkData;
use crate::error::Result;
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};

/// A listing in flight or done: the writes counted when it started, when
/// it started, and its outcome.
type Listing = (u64, Instant, Arc<OnceCell<Result<Vec<StepInfo>>>>);

/// Shares `list_steps` among the callers of one process: the ranks of a
/// node restoring at once list a tier once, not once each (against an
/// object store, a thousand LISTs of one prefix at once are answered with
/// throttling). A caller joins a listing that is in flight or done only if
/// no step was written through this store since it started (a rank's own
/// commit is always in the listing it gets) and it is younger than
/// `max_age`; otherwise it starts a new one. Everything else passes
/// through.
#[derive(Debug)]
pub struct SharedListing<S> {
    inner: S,
    max_age: Duration,
    /// Step writes (manifests, records, deletions, pins) so far.
    writes: AtomicU64,
    listings: Mutex<HashMap<String, Listing>>,
    /// Listings that reached the inner store.
    listed: AtomicU64,
}

impl<S: ChunkStore> SharedListing<S> {
    /// Wraps `inner`; a listing is shared for at most `max_age`.
    pub fn new(inner: S, max_age: Duration) -> Self {
        SharedListing {
            inner,
            max_age,
            writes: AtomicU64::new(0),
            listings: Mutex::new(HashMap::new()),
            listed: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Listings that reached the inner store (the rest were shared).
    pub fn listed(&self) -> u64 {
        self.listed.load(Ordering::Relaxed)
    }

    fn changed(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    async fn shared_list(&self, job: &str) -> Result<Vec<StepInfo>> {
        let writes = self.writes.load(Ordering::SeqCst);
        let cell = {
            let mut l = self
                .listings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match l.get(job) {
                Some((w, at, cell)) if *w == writes && at.elapsed() < self.max_age => cell.clone(),
                _ => {
                    let cell = Arc::new(OnceCell::new());
                    l.insert(job.to_string(), (writes, Instant::now(), cell.clone()));
                    cell
                }
            }
        };
        let got = cell
            .get_or_init(|| async {
                self.listed.fetch_add(1, Ordering::Relaxed);
                self.inner.list_steps(job).await
            })
            .await
            .clone();
        if got.is_err() {
            // A failed listing is not kept: the next caller tries again.
            let mut l = self
                .listings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if l.get(job).is_some_and(|(_, _, c)| Arc::ptr_eq(c, &cell)) {
                l.remove(job);
            }
        }
        got
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ChunkStore> ChunkStore for SharedListing<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        self.inner.put_chunks_opts(job, chunks, opts).await
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        self.inner.get_chunks_opts(job, ids, opts).await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        self.inner.get_chunk(job, id, range).await
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.inner.has_chunks(job, ids).await
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        self.inner.list_chunks(job).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.inner.delete_chunks(job, ids).await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.changed();
        let r = self.inner.put_manifest(job, step, rank, bytes).await;
        self.changed();
        r
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.inner.get_manifest(job, step, rank).await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.changed();
        let r = self.inner.commit(record).await;
        self.changed();
        r
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.shared_list(job).await
    }
    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        self.inner.get_commit_record(job, step, first).await
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.changed();
        let r = self.inner.delete_step(job, step).await;
        self.changed();
        r
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.changed();
        let r = self.inner.delete_shard(job, step, rank).await;
        self.changed();
        r
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        self.inner.get_frame(job, id, buf).await
    }
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        self.inner.list_chunk_info(job).await
    }
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        self.inner
            .delete_chunks_untouched_since(job, ids, cutoff)
            .await
    }
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        self.changed();
        let r = self.inner.set_pin(job, step, pinned).await;
        self.changed();
        r
    }
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        self.inner.list_pins(job).await
    }
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        self.inner.now(job).await
    }
    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        self.inner.abort_stale_uploads(job, cutoff).await
    }
    fn concurrency(&self) -> usize {
        self.inner.concurrency()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    fn record(step: u64, rank: u32) -> CommitRecord {
        CommitRecord {
            job: "j".into(),
            step,
            world_size: 2,
            committed_unix_ms: 1,
            shards: vec![strata_format::ShardRef {
                rank,
                manifest: ChunkId::of(b"m"),
                logical_bytes: 0,
            }],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_at_once_share_one_listing_and_a_write_is_always_seen() {
        let s = Arc::new(SharedListing::new(
            MemoryStore::new(),
            Duration::from_secs(60),
        ));
        s.put_manifest("j", 1, 0, b"m").await.unwrap();
        s.commit(&record(1, 0)).await.unwrap();
        let hs: Vec<_> = (0..16)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.list_steps("j").await.unwrap() })
            })
            .collect();
        for h in hs {
            assert_eq!(h.await.unwrap().len(), 1);
        }
        assert_eq!(s.listed(), 1, "sixteen callers, one listing");
        // A step written since: the next listing is a new one, with it.
        s.put_manifest("j", 2, 1, b"m").await.unwrap();
        s.commit(&record(2, 1)).await.unwrap();
        let steps = s.list_steps("j").await.unwrap();
        assert_eq!(
            steps.iter().map(|st| st.step).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(s.listed(), 2);
        // Too old: listed again.
        let quick = SharedListing::new(MemoryStore::new(), Duration::ZERO);
        quick.list_steps("j").await.unwrap();
        quick.list_steps("j").await.unwrap();
        assert_eq!(quick.listed(), 2);
    }
}

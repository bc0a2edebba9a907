//! [`RetryStore`]: retries what failed `Unavailable`, with backoff.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

// The runtime's clock: the one `tokio::time::sleep` waits on, so a paused
// test clock measures the deadline as it measures the backoff.
use tokio::time::Instant;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use strata_format::{ChunkId, CommitRecord};

use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreErrorKind};
use crate::l3::Frame;
use crate::rng::SplitMix64;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};

/// When and how often [`RetryStore`] tries again.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = never retry).
    pub max_attempts: u32,
    /// Backoff before the first retry; it doubles with every retry.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// No retry starts once this much time has passed since the first
    /// failure (nor if its backoff would end past it): the call then
    /// returns the last error. Counted from the first failure, not the
    /// call, so a long batch that fails late is still retried.
    pub deadline: Duration,
    /// Seed of the jitter, so a run replays.
    pub seed: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            deadline: Duration::from_secs(60),
            seed: 0x5EED_5EED,
        }
    }
}

/// Retries calls that fail with [`StoreErrorKind::Unavailable`] (and only
/// those: a `NotFound`, `Corrupt`, `Invalid`, `AlreadyExists` or `NoSpace`
/// will not change by asking again). Every trait method is idempotent by
/// the contract, so every one may be retried; batch reads retry only their
/// entries that failed `Unavailable`, a failed `has_chunks` of many chunks
/// asks of each chunk alone, and a failed put asks which of its
/// chunks landed and sends only the others again. A put attempt that
/// landed some chunks is progress: the attempts and the deadline start
/// over for the rest (a call of many chunks, each a request of its own,
/// then fails only when a stretch of attempts lands nothing).
///
/// Backoff is exponential with "equal jitter" (half the delay fixed, half
/// random), so a crowd of ranks that failed together does not retry
/// together, and a retry never comes instantly.
#[derive(Debug)]
pub struct RetryStore<S> {
    inner: S,
    policy: RetryPolicy,
    rng: Mutex<SplitMix64>,
    retries: AtomicU64,
}

impl<S: ChunkStore> RetryStore<S> {
    /// Wraps `inner` with the default policy.
    pub fn new(inner: S) -> Self {
        Self::with_policy(inner, RetryPolicy::default())
    }

    /// Wraps `inner` with `policy`.
    pub fn with_policy(inner: S, policy: RetryPolicy) -> Self {
        RetryStore {
            inner,
            rng: Mutex::new(SplitMix64::new(policy.seed)),
            policy,
            retries: AtomicU64::new(0),
        }
    }

    /// Retries made so far (a batch read's retry of its failed entries
    /// counts once).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The pause before retry number `attempt` (1 = the first retry), or
    /// `None` when the policy says give up.
    fn backoff(&self, attempt: u32, started: Instant) -> Option<Duration> {
        if attempt >= self.policy.max_attempts {
            return None;
        }
        let exp = self
            .policy
            .initial_backoff
            .saturating_mul(1u32 << (attempt - 1).min(20));
        let base = exp.min(self.policy.max_backoff);
        let half = base / 2;
        let r = self.rng.lock().map_or(0, |mut g| g.next_u64());
        // `half + r % half`: the random half, to the nanosecond.
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let delay = half + Duration::from_nanos(r % nanos.saturating_add(1));
        (started.elapsed() + delay <= self.policy.deadline).then_some(delay)
    }

    async fn run<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut failed_at = None;
        let mut attempt = 1;
        loop {
            match call().await {
                Err(e) if e.kind() == StoreErrorKind::Unavailable => {
                    let started = *failed_at.get_or_insert_with(Instant::now);
                    let Some(delay) = self.backoff(attempt, started) else {
                        return Err(e);
                    };
                    tracing::debug!(error = %e, attempt, ?delay, "store call failed; retrying");
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// A put (`check`: `put_chunks`, else `put_missing_chunks`), retried:
    /// after a failed attempt, `has_chunks` asked of each chunk tells what
    /// landed, and the same call sends only the rest again. An attempt that
    /// landed chunks restarts the attempts and the deadline. Chunks found
    /// there count as a whole-call retry would count them: deduped by
    /// `put_chunks` (the tier held them when asked), written by
    /// `put_missing_chunks` (once per id; their stored size is their raw
    /// size, the tier's answer was lost with the error). When nothing was
    /// found, the retry is the call again, with the tier's own counts.
    async fn put(&self, job: &str, mut todo: Vec<ChunkPut>, opts: PutOptions) -> Result<PutStats> {
        let check = !opts.known_missing;
        let mut landed = PutStats::default();
        let mut failed_at = None;
        let mut attempt = 1;
        loop {
            let sent = self.inner.put_chunks_opts(job, todo.clone(), opts).await;
            let e = match sent {
                Ok(mut st) => {
                    st += landed;
                    return Ok(st);
                }
                Err(e) if e.kind() == StoreErrorKind::Unavailable => e,
                Err(e) => return Err(e),
            };
            let started = *failed_at.get_or_insert_with(Instant::now);
            let Some(delay) = self.backoff(attempt, started) else {
                return Err(e);
            };
            tracing::debug!(error = %e, attempt, ?delay, "put failed; retrying what did not land");
            self.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            attempt += 1;
            // One question per chunk: a question about many chunks would
            // fail as a whole as easily as the put did. A chunk whose
            // answer was lost is sent again (the same bytes: harmless).
            let ids: Vec<ChunkId> = todo.iter().map(|c| c.id).collect();
            let probes: Vec<bool> = futures::stream::iter(ids)
                .map(|id| self.landed(job, id))
                .buffered(self.inner.concurrency().max(1))
                .collect()
                .await;
            if !probes.contains(&true) {
                continue;
            }
            let mut seen = std::collections::HashSet::new();
            let mut rest = Vec::with_capacity(todo.len());
            for (c, there) in todo.into_iter().zip(probes) {
                if there {
                    let n = c.data.len() as u64;
                    landed.count(n, n, !check && seen.insert(c.id));
                } else {
                    rest.push(c);
                }
            }
            todo = rest;
            if todo.is_empty() {
                return Ok(landed);
            }
            attempt = 1;
            failed_at = None;
        }
    }

    /// After a question about many chunks failed `Unavailable` (`e`): each
    /// asked again alone, with retries of its own. One question about many
    /// chunks (a request per chunk on an object store) fails as a whole as
    /// easily as one of its requests, so asking the whole again would rarely
    /// get further.
    async fn has_each(
        &self,
        job: &str,
        ids: &[ChunkId],
        e: crate::error::StoreError,
    ) -> Result<Vec<bool>> {
        let Some(delay) = self.backoff(1, Instant::now()) else {
            return Err(e);
        };
        tracing::debug!(error = %e, ?delay, "has_chunks failed; asking of each chunk");
        self.retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
        futures::stream::iter(ids.to_vec())
            .map(|id| self.has_one(job, id))
            .buffered(self.inner.concurrency().max(1))
            .try_collect()
            .await
    }

    async fn has_one(&self, job: &str, id: ChunkId) -> Result<bool> {
        let one = [id];
        let got = self.run(|| self.inner.has_chunks(job, &one)).await?;
        match got.as_slice() {
            [there] => Ok(*there),
            _ => Err(crate::error::StoreError::Internal(format!(
                "has_chunks answered {} entries for 1 chunk",
                got.len()
            ))),
        }
    }

    /// Whether the inner store is known to hold `id` (false if the
    /// question failed).
    async fn landed(&self, job: &str, id: ChunkId) -> bool {
        matches!(
            self.inner.has_chunks(job, &[id]).await.as_deref(),
            Ok([true])
        )
    }

    /// Retries the entries of a batch read that failed `Unavailable`,
    /// re-reading only those ids.
    async fn retry_entries(
        &self,
        job: &str,
        ids: &[ChunkId],
        mut results: Vec<Result<ChunkData>>,
        unverified: bool,
    ) -> Vec<Result<ChunkData>> {
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            let failed: Vec<usize> = results
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    r.as_ref()
                        .is_err_and(|e| e.kind() == StoreErrorKind::Unavailable)
                })
                .map(|(i, _)| i)
                .collect();
            // A short result vector breaks the contract: leave it as is.
            if failed.is_empty() || results.len() != ids.len() {
                return results;
            }
            let Some(delay) = self.backoff(attempt, started) else {
                return results;
            };
            self.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            attempt += 1;
            let again: Vec<ChunkId> = failed.iter().map(|&i| ids[i]).collect();
            let opts = ReadOptions {
                unverified,
                ..ReadOptions::default()
            };
            let got = self.inner.get_chunks_opts(job, &again, opts).await;
            if got.len() != again.len() {
                return results;
            }
            for (i, r) in failed.into_iter().zip(got) {
                results[i] = r;
            }
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ChunkStore> ChunkStore for RetryStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        // Cloning a ChunkPut shares its buffer: cheap per attempt.
        self.put(job, chunks, opts).await
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        // The spare buffers serve the first attempt; retries allocate.
        let unverified = opts.unverified;
        let first = self.inner.get_chunks_opts(job, ids, opts).await;
        self.retry_entries(job, ids, first, unverified).await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        self.run(|| self.inner.get_chunk(job, id, range.clone()))
            .await
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        if ids.len() <= 1 {
            return self.run(|| self.inner.has_chunks(job, ids)).await;
        }
        match self.inner.has_chunks(job, ids).await {
            Err(e) if e.kind() == StoreErrorKind::Unavailable => self.has_each(job, ids, e).await,
            other => other,
        }
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        self.run(|| self.inner.list_chunks(job)).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.run(|| self.inner.delete_chunks(job, ids)).await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.run(|| self.inner.put_manifest(job, step, rank, bytes))
            .await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.run(|| self.inner.get_manifest(job, step, rank)).await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        // Safe to repeat: the identical record again succeeds.
        self.run(|| self.inner.commit(record)).await
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.run(|| self.inner.list_steps(job)).await
    }
    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        self.run(|| self.inner.get_commit_record(job, step, first))
            .await
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.run(|| self.inner.delete_step(job, step)).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.run(|| self.inner.delete_shard(job, step, rank)).await
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        // The caller's buffer serves the first attempt; retries allocate.
        let mut buf = Some(buf);
        self.run(|| {
            self.inner
                .get_frame(job, id, buf.take().unwrap_or_default())
        })
        .await
    }
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        self.run(|| self.inner.list_chunk_info(job)).await
    }
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        self.run(|| self.inner.delete_chunks_untouched_since(job, ids, cutoff))
            .await
    }
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        self.run(|| self.inner.set_pin(job, step, pinned)).await
    }
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        self.run(|| self.inner.list_pins(job)).await
    }
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        self.run(|| self.inner.now(job)).await
    }
    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        self.run(|| self.inner.abort_stale_uploads(job, cutoff))
            .await
    }
    fn concurrency(&self) -> usize {
        self.inner.concurrency()
    }
    fn describe(&self) -> String {
        format!(
            "{} (retry: {} attempts)",
            self.inner.describe(),
            self.policy.max_attempts
        )
    }
}

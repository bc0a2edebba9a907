//! [`ThrottleStore`]: a bandwidth cap on chunk bytes.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord};
use tokio::time::Instant;

use crate::chunk_data::ChunkData;
use crate::error::Result;
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};

/// Caps of a [`ThrottleStore`], in bytes per second (0 = unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// Chunk bytes read per second.
    pub read_bytes_per_sec: u64,
    /// Chunk bytes written per second.
    pub write_bytes_per_sec: u64,
    /// Bytes that may pass at full speed after an idle spell (the token
    /// bucket's size); 0 paces from the first byte.
    pub burst_bytes: u64,
}

/// A token bucket whose debt is paid by sleeping: a transfer of `n` bytes
/// takes its turn after the ones before it and ends `n / rate` later. The
/// bucket is a point in time (`next`) rather than a token count, so one
/// lock and no background refill task serve every caller.
#[derive(Debug)]
struct Bucket {
    rate: u64,
    burst: Duration,
    next: Mutex<Option<Instant>>,
}

impl Bucket {
    fn new(rate: u64, burst_bytes: u64) -> Self {
        Bucket {
            rate,
            burst: duration_of(burst_bytes, rate),
            next: Mutex::new(None),
        }
    }

    /// Waits until `bytes` fit under the cap.
    async fn pay(&self, bytes: u64) {
        if self.rate == 0 || bytes == 0 {
            return;
        }
        let until = {
            let Ok(mut next) = self.next.lock() else {
                return; // a poisoned lock: let the bytes through, never fail
            };
            let now = Instant::now();
            // Idle time refills the bucket, up to the burst.
            let floor = now.checked_sub(self.burst).unwrap_or(now);
            let start = next.map_or(floor, |n| n.max(floor));
            let end = start + duration_of(bytes, self.rate);
            *next = Some(end);
            end
        };
        tokio::time::sleep_until(until).await;
    }
}

fn duration_of(bytes: u64, rate: u64) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(
        u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX),
    )
}

/// Caps the chunk bytes read and written per second (separate caps), as
/// `object_store`'s `ThrottledStore` does for its calls. Writes pay for the
/// bytes a `put` actually wrote (deduplicated chunks cost nothing) and
/// reads for the bytes returned, after the call: one large call may pass
/// at the tier's own speed, and the calls after it wait until the average
/// is back under the cap. Manifests, records and listings are not capped.
#[derive(Debug)]
pub struct ThrottleStore<S> {
    inner: S,
    config: ThrottleConfig,
    read: Bucket,
    write: Bucket,
}

impl<S: ChunkStore> ThrottleStore<S> {
    /// Wraps `inner` with `config`'s caps.
    pub fn new(inner: S, config: ThrottleConfig) -> Self {
        ThrottleStore {
            inner,
            read: Bucket::new(config.read_bytes_per_sec, config.burst_bytes),
            write: Bucket::new(config.write_bytes_per_sec, config.burst_bytes),
            config,
        }
    }

    /// The caps.
    pub fn config(&self) -> ThrottleConfig {
        self.config
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn pay_reads(&self, results: &[Result<ChunkData>]) {
        let n: usize = results.iter().flatten().map(ChunkData::len).sum();
        self.read.pay(n as u64).await;
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ChunkStore> ChunkStore for ThrottleStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        let stats = self.inner.put_chunks_opts(job, chunks, opts).await?;
        self.write.pay(stats.bytes_written).await;
        Ok(stats)
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        let out = self.inner.get_chunks_opts(job, ids, opts).await;
        self.pay_reads(&out).await;
        out
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let data = self.inner.get_chunk(job, id, range).await?;
        self.read.pay(data.len() as u64).await;
        Ok(data)
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
        self.inner.put_manifest(job, step, rank, bytes).await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.inner.get_manifest(job, step, rank).await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.inner.commit(record).await
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.inner.list_steps(job).await
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
        self.inner.delete_step(job, step).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.inner.delete_shard(job, step, rank).await
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        // A frame is what crossed the wire: pay for its stored size.
        let frame = self.inner.get_frame(job, id, buf).await?;
        self.read.pay(frame.stored_len() as u64).await;
        Ok(frame)
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
        self.inner.set_pin(job, step, pinned).await
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
        format!(
            "{} (capped: read {} B/s, write {} B/s; 0 = unlimited)",
            self.inner.describe(),
            self.config.read_bytes_per_sec,
            self.config.write_bytes_per_sec
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration_of(1_000, 1_000), Duration::from_secs(1));
        assert_eq!(duration_of(500, 1_000), Duration::from_millis(500));
        assert_eq!(duration_of(5, 0), Duration::ZERO);
    }
}

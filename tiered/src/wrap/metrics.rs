//! [`MetricsStore`]: counters per operation family, for one tier.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord};

use super::metrics_snapshot::{kind_index, ErrorCounts, FamilyStats, MetricsSnapshot, OpFamily};
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreErrorKind};
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};

#[derive(Debug, Default)]
struct Family {
    ops: AtomicU64,
    errors: [AtomicU64; 8],
    nanos_total: AtomicU64,
    nanos_max: AtomicU64,
}

#[derive(Debug, Default)]
struct Counters {
    families: [Family; 7],
    chunks_written: AtomicU64,
    bytes_written: AtomicU64,
    bytes_stored: AtomicU64,
    chunks_deduped: AtomicU64,
    bytes_deduped: AtomicU64,
    bytes_read: AtomicU64,
}

/// Counts what passes through to the inner store: calls, errors by kind,
/// bytes and latency per [`OpFamily`]. Lock-free (relaxed atomics: each
/// counter is exact, a snapshot taken during calls may mix moments).
#[derive(Debug)]
pub struct MetricsStore<S> {
    inner: S,
    c: Counters,
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl<S: ChunkStore> MetricsStore<S> {
    /// Wraps `inner` with zeroed counters.
    pub fn new(inner: S) -> Self {
        MetricsStore {
            inner,
            c: Counters::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The counters now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let families = OpFamily::ALL
            .iter()
            .map(|&f| {
                let c = &self.c.families[f as usize];
                let e = |k: StoreErrorKind| get(&c.errors[kind_index(k)]);
                let stats = FamilyStats {
                    ops: get(&c.ops),
                    errors: ErrorCounts {
                        not_found: e(StoreErrorKind::NotFound),
                        corrupt: e(StoreErrorKind::Corrupt),
                        already_exists: e(StoreErrorKind::AlreadyExists),
                        no_space: e(StoreErrorKind::NoSpace),
                        unavailable: e(StoreErrorKind::Unavailable),
                        invalid: e(StoreErrorKind::Invalid),
                        unauthorized: e(StoreErrorKind::Unauthorized),
                        internal: e(StoreErrorKind::Internal),
                    },
                    latency_total: Duration::from_nanos(get(&c.nanos_total)),
                    latency_max: Duration::from_nanos(get(&c.nanos_max)),
                };
                (f, stats)
            })
            .collect();
        MetricsSnapshot {
            store: self.inner.name().to_string(),
            families,
            chunks_written: get(&self.c.chunks_written),
            bytes_written: get(&self.c.bytes_written),
            bytes_stored: get(&self.c.bytes_stored),
            chunks_deduped: get(&self.c.chunks_deduped),
            bytes_deduped: get(&self.c.bytes_deduped),
            bytes_read: get(&self.c.bytes_read),
        }
    }

    /// Counts one call of family `f` that started at `t0`.
    fn op(&self, f: OpFamily, t0: Instant) {
        let c = &self.c.families[f as usize];
        let nanos = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        add(&c.ops, 1);
        add(&c.nanos_total, nanos);
        c.nanos_max.fetch_max(nanos, Ordering::Relaxed);
    }

    /// Counts a call's outcome (its error, if any) and passes it on.
    fn done<T>(&self, f: OpFamily, t0: Instant, r: Result<T>) -> Result<T> {
        self.op(f, t0);
        if let Err(e) = &r {
            add(&self.c.families[f as usize].errors[kind_index(e.kind())], 1);
        }
        r
    }

    fn put_done(&self, t0: Instant, r: Result<PutStats>) -> Result<PutStats> {
        if let Ok(s) = &r {
            add(&self.c.chunks_written, s.written);
            add(&self.c.bytes_written, s.bytes_written);
            add(&self.c.bytes_stored, s.bytes_stored);
            add(&self.c.chunks_deduped, s.deduped);
            add(&self.c.bytes_deduped, s.bytes_deduped);
        }
        self.done(OpFamily::Put, t0, r)
    }

    fn read_done(&self, t0: Instant, r: Result<ChunkData>) -> Result<ChunkData> {
        if let Ok(d) = &r {
            add(&self.c.bytes_read, d.len() as u64);
        }
        self.done(OpFamily::Get, t0, r)
    }

    fn batch_done(&self, t0: Instant, out: Vec<Result<ChunkData>>) -> Vec<Result<ChunkData>> {
        self.op(OpFamily::Get, t0);
        let errors = &self.c.families[OpFamily::Get as usize].errors;
        for r in &out {
            match r {
                Ok(d) => add(&self.c.bytes_read, d.len() as u64),
                Err(e) => add(&errors[kind_index(e.kind())], 1),
            }
        }
        out
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ChunkStore> ChunkStore for MetricsStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        let t0 = Instant::now();
        let r = self.inner.put_chunks_opts(job, chunks, opts).await;
        self.put_done(t0, r)
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        let t0 = Instant::now();
        let out = self.inner.get_chunks_opts(job, ids, opts).await;
        self.batch_done(t0, out)
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let t0 = Instant::now();
        let r = self.inner.get_chunk(job, id, range).await;
        self.read_done(t0, r)
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let t0 = Instant::now();
        let r = self.inner.has_chunks(job, ids).await;
        self.done(OpFamily::Has, t0, r)
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        let t0 = Instant::now();
        let r = self.inner.list_chunks(job).await;
        self.done(OpFamily::List, t0, r)
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.delete_chunks(job, ids).await;
        self.done(OpFamily::Delete, t0, r)
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.put_manifest(job, step, rank, bytes).await;
        self.done(OpFamily::Manifest, t0, r)
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        let t0 = Instant::now();
        let r = self.inner.get_manifest(job, step, rank).await;
        self.done(OpFamily::Manifest, t0, r)
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.commit(record).await;
        self.done(OpFamily::Commit, t0, r)
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        let t0 = Instant::now();
        let r = self.inner.list_steps(job).await;
        self.done(OpFamily::List, t0, r)
    }
    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        let t0 = Instant::now();
        let r = self.inner.get_commit_record(job, step, first).await;
        self.done(OpFamily::Manifest, t0, r)
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.delete_step(job, step).await;
        self.done(OpFamily::Delete, t0, r)
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.delete_shard(job, step, rank).await;
        self.done(OpFamily::Delete, t0, r)
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        let t0 = Instant::now();
        let r = self.inner.get_frame(job, id, buf).await;
        if let Ok(f) = &r {
            add(&self.c.bytes_read, f.stored_len() as u64);
        }
        self.done(OpFamily::Get, t0, r)
    }
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        let t0 = Instant::now();
        let r = self.inner.list_chunk_info(job).await;
        self.done(OpFamily::List, t0, r)
    }
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        let t0 = Instant::now();
        let r = self
            .inner
            .delete_chunks_untouched_since(job, ids, cutoff)
            .await;
        self.done(OpFamily::Delete, t0, r)
    }
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        let t0 = Instant::now();
        let r = self.inner.set_pin(job, step, pinned).await;
        self.done(OpFamily::Commit, t0, r)
    }
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        let t0 = Instant::now();
        let r = self.inner.list_pins(job).await;
        self.done(OpFamily::List, t0, r)
    }
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        let t0 = Instant::now();
        let r = self.inner.now(job).await;
        self.done(OpFamily::List, t0, r)
    }
    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        let t0 = Instant::now();
        let r = self.inner.abort_stale_uploads(job, cutoff).await;
        self.done(OpFamily::Delete, t0, r)
    }
    fn concurrency(&self) -> usize {
        self.inner.concurrency()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

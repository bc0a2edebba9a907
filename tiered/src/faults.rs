//! [`FaultyStore`]: an `ObjectStore` wrapper that injects the failures of a
//! real object store (added latency, 503-style errors, timeouts, dropped
//! connections, a server that stops accepting writes), seeded so that a
//! failing run can be replayed.
//!
//! Each call draws from a SplitMix64 stream seeded by [`FaultPlan::seed`]
//! and the call's sequence number, so the same seed and the same sequence of
//! calls give the same faults.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// What to inject.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Seed of the fault stream.
    pub seed: u64,
    /// Probability that a call fails with a transient server error (503).
    pub error_rate: f64,
    /// Probability that a call hangs for [`Self::timeout`] and then fails.
    pub timeout_rate: f64,
    /// How long a timed-out call hangs.
    pub timeout: Duration,
    /// Probability that a call's connection drops (fails after the server
    /// may or may not have applied a write).
    pub drop_rate: f64,
    /// Latency added to every call.
    pub latency: Duration,
    /// After this many successful writes, every write fails (a server that
    /// died, or a process killed mid-upload).
    pub writes_before_outage: Option<u64>,
    /// Refuse create-if-absent puts as not implemented (an S3 server or
    /// configuration without conditional writes).
    pub no_conditional_put: bool,
    /// Every part of a multipart upload fails (the upload itself starts,
    /// and can be completed or aborted): what must not leave an upload
    /// behind.
    pub fail_parts: bool,
}

/// Calls injected so far, by kind.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Transient errors.
    pub errors: AtomicU64,
    /// Timeouts.
    pub timeouts: AtomicU64,
    /// Dropped connections.
    pub drops: AtomicU64,
    /// Writes refused by the outage.
    pub outage: AtomicU64,
}

/// An object store that fails on purpose. See the module documentation.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    plan: FaultPlan,
    calls: AtomicU64,
    writes: AtomicU64,
    /// What was injected.
    pub counts: Arc<FaultCounts>,
}

impl FaultyStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, plan: FaultPlan) -> Self {
        FaultyStore {
            inner,
            plan,
            calls: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            counts: Arc::new(FaultCounts::default()),
        }
    }

    fn draw(&self) -> f64 {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let mut z = self.plan.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn err(what: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "faulty",
            source: what.to_string().into(),
        }
    }

    /// Latency, then maybe a fault before the call reaches the store.
    async fn before(&self, write: bool) -> object_store::Result<()> {
        if !self.plan.latency.is_zero() {
            tokio::time::sleep(self.plan.latency).await;
        }
        if write {
            if let Some(limit) = self.plan.writes_before_outage {
                if self.writes.load(Ordering::Relaxed) >= limit {
                    self.counts.outage.fetch_add(1, Ordering::Relaxed);
                    return Err(Self::err("503 Service Unavailable (outage)"));
                }
            }
        }
        let x = self.draw();
        let p = &self.plan;
        if x < p.error_rate {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            return Err(Self::err("503 Slow Down"));
        }
        if x < p.error_rate + p.timeout_rate {
            self.counts.timeouts.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(p.timeout).await;
            return Err(Self::err("operation timed out"));
        }
        Ok(())
    }

    /// Maybe drop the connection after the call (its effect may stand).
    fn after(&self) -> object_store::Result<()> {
        if self.draw() < self.plan.drop_rate {
            self.counts.drops.fetch_add(1, Ordering::Relaxed);
            return Err(Self::err("connection reset by peer"));
        }
        Ok(())
    }
}

/// A multipart upload whose parts all fail ([`FaultPlan::fail_parts`]).
#[derive(Debug)]
struct FailingParts(Box<dyn MultipartUpload>);

#[async_trait]
impl MultipartUpload for FailingParts {
    fn put_part(&mut self, _data: PutPayload) -> object_store::UploadPart {
        Box::pin(async { Err(FaultyStore::err("500 part upload failed")) })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.0.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.0.abort().await
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({:?}, {})", self.plan, self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.plan.no_conditional_put && matches!(opts.mode, object_store::PutMode::Create) {
            return Err(object_store::Error::NotImplemented {
                operation: "put with PutMode::Create".into(),
                implementer: "faulty store without conditional writes".into(),
            });
        }
        self.before(true).await?;
        let r = self.inner.put_opts(location, payload, opts).await?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.after()?;
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.before(true).await?;
        let up = self.inner.put_multipart_opts(location, opts).await?;
        if self.plan.fail_parts {
            return Ok(Box::new(FailingParts(up)));
        }
        Ok(up)
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.before(false).await?;
        let r = self.inner.get_opts(location, options).await?;
        self.after()?;
        Ok(r)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.before(false).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if self.draw() < self.plan.error_rate {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            return futures::stream::once(async { Err(Self::err("503 Slow Down")) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.before(false).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.before(true).await?;
        self.inner.copy_opts(from, to, options).await
    }
}

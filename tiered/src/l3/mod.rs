//! L3: object storage (S3, GCS, Azure, a local directory, memory) through
//! the `object_store` crate.
//!
//! Keys, under the URL's path:
//!
//! ```text
//! <job>/chunks/<2 hex>/<64 hex>            one chunk frame (docs/format.md), codec-encoded
//! <job>/steps/<step, 20 digits>/m-<rank>   shard manifest
//! <job>/steps/<step, 20 digits>/c-<rank>   commit record, written create-only
//! ```
//!
//! Chunks are stored as frames in the tier's codec (byte planes by default;
//! a chunk that does not shrink is stored raw), so every read is verified
//! against the frame's BLAKE3 and the id asked for. Frames above the
//! multipart threshold go up in parts. Requests run `concurrency` at a time;
//! the HTTP client retries throttling, 5xx and timeouts with backoff.
//!
//! The tier itself never retries: a call that still fails is `Unavailable`,
//! and retries of whole calls belong to the [`RetryStore`] wrapper, as they
//! do for every tier. Opened for real use, L3 is [`L3Store::into_tier`]:
//! `RetryStore(MetricsStore(L3Store))` ([`L3Tier`]), with the policy of
//! [`L3Options::retry_policy`]. Metrics sit inside the retries, so they
//! count every attempt the store saw; a retried put sends only the chunks
//! the failed attempt did not land; a retried commit whose first write
//! landed finds its own record and succeeds (an identical record is
//! success, see `steps.rs`). A bare `L3Store` is for tests and benchmarks
//! of the store itself.
//!
//! Commit records are written with `PutMode::Create`. A store that cannot
//! create-if-absent (S3 with conditional puts disabled, some S3-compatible
//! servers) makes `commit` fail with `Unavailable` unless
//! [`L3Options::non_atomic_commits`] is set: then a commit is a check
//! followed by a put, and two writers racing on one step can both "win".
//! Strata never claims atomic commits there.
//!
//! A chunk read through [`ChunkStore`] runs as a task of the runtime
//! ([`crate::task`]): read it within a multi-thread runtime, or one whose
//! own `Runtime::block_on` is running (a current-thread runtime polled
//! only through `Handle::block_on` never runs the task).
//!
//! This module owns the store and its chunk side; beside it, `frame.rs`
//! the ranged fetch of an object and the frame a read hands back
//! ([`Frame`], shared by every tier's `get_frame`), `options.rs` the settings ([`L3Options`]), `steps.rs`
//! manifests, commit records and step listings, `uploads.rs` the incomplete
//! multipart uploads a killed writer leaves.

mod frame;
mod options;
mod steps;
mod uploads;

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart};
use strata_format::frame::{FrameEncoder, FRAME_HEADER_LEN, MAX_CHUNK_LEN};
use strata_format::names::validate_job_id;
use strata_format::{ChunkId, CommitRecord};

use crate::aligned::AlignedBuf;
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::store::{dedup_call, slice_range, ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};
use crate::wrap::{MetricsStore, RetryStore};
use frame::get_ranged;
pub use frame::Frame;
pub use options::L3Options;
use uploads::{S3Uploads, Uploads};

/// Largest chunk object read back: the frame of the largest chunk.
const MAX_FRAME_LEN: usize = FRAME_HEADER_LEN + MAX_CHUNK_LEN as usize + 1024;
/// Largest commit record read back (they are a few hundred bytes).
const MAX_RECORD_LEN: usize = 1 << 20;

/// An L3 store as it is opened for real use ([`L3Store::into_tier`]):
/// retries over metrics over the store.
pub type L3Tier = RetryStore<MetricsStore<L3Store>>;

/// Object storage as a [`ChunkStore`]. See the module documentation.
pub struct L3Store {
    store: Arc<dyn ObjectStore>,
    root: ObjPath,
    url: String,
    opts: L3Options,
    encode_slots: Arc<tokio::sync::Semaphore>,
    /// How incomplete multipart uploads are found.
    uploads: Uploads,
}

impl std::fmt::Debug for L3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L3Store({})", self.url)
    }
}

/// Maps an object-store error to a tier error.
pub(crate) fn os_err(what: impl Into<String>, e: object_store::Error) -> StoreError {
    match e {
        object_store::Error::NotFound { .. } => StoreError::NotFound { what: what.into() },
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            StoreError::AlreadyExists { what: what.into() }
        }
        object_store::Error::InvalidPath { .. } => {
            StoreError::invalid("object path", e.to_string())
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            StoreError::Unauthorized(format!("{}: {e}", what.into()))
        }
        other => StoreError::Unavailable(format!("{}: {other}", what.into())),
    }
}

impl L3Store {
    /// Opens the store a URL names: `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`, `file:///abs/dir`, `memory://`. Credentials,
    /// region and endpoint come from the provider's usual environment
    /// variables (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`,
    /// `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...) and
    /// `options` (the same keys without the prefix, lower case:
    /// `endpoint`, `region`, `access_key_id`, `secret_access_key`,
    /// `allow_http`, ...), which win. Keys in [`L3Options::KEYS`] set
    /// Strata's own options instead (on top of `opts`).
    pub fn from_url(url: &str, options: &[(String, String)], mut opts: L3Options) -> Result<Self> {
        let mut provider = Vec::with_capacity(options.len());
        for (k, v) in options {
            if !opts.set(k, v)? {
                provider.push((k.clone(), v.clone()));
            }
        }
        let options = &provider;
        // Every message below shows the URL without its credentials.
        let shown = crate::redact::redact_url(url);
        let parsed = url::Url::parse(url)
            .map_err(|e| StoreError::invalid("L3 URL", format!("{shown:?}: {e}")))?;
        let retry = RetryConfig {
            max_retries: opts.max_retries,
            retry_timeout: opts.retry_timeout,
            ..RetryConfig::default()
        };
        let bad = |e: object_store::Error| {
            StoreError::invalid(
                "L3 store",
                crate::redact::scrub_url_secrets(&e.to_string(), url),
            )
        };
        let mut uploads = Uploads::None;
        let (store, root): (Arc<dyn ObjectStore>, ObjPath) = match parsed.scheme() {
            "s3" | "s3a" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
                let mut b = AmazonS3Builder::from_env().with_url(url).with_retry(retry);
                for (k, v) in options {
                    let key: AmazonS3ConfigKey = k.parse().map_err(bad)?;
                    b = b.with_config(key, v);
                }
                let s3 = Arc::new(b.clone().build().map_err(bad)?);
                uploads = Uploads::S3(S3Uploads::new(s3.clone(), &b, &parsed)?);
                (s3, url_prefix(&parsed)?)
            }
            "gs" => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                let mut b = GoogleCloudStorageBuilder::from_env()
                    .with_url(url)
                    .with_retry(retry);
                for (k, v) in options {
                    let key: GoogleConfigKey = k.parse().map_err(bad)?;
                    b = b.with_config(key, v);
                }
                (Arc::new(b.build().map_err(bad)?), url_prefix(&parsed)?)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                let mut b = MicrosoftAzureBuilder::from_env()
                    .with_url(url)
                    .with_retry(retry);
                for (k, v) in options {
                    let key: AzureConfigKey = k.parse().map_err(bad)?;
                    b = b.with_config(key, v);
                }
                (Arc::new(b.build().map_err(bad)?), url_prefix(&parsed)?)
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| {
                    StoreError::invalid("L3 URL", format!("{shown:?} is not an absolute file path"))
                })?;
                std::fs::create_dir_all(&dir)
                    .map_err(|e| StoreError::io("creating the L3 directory", &dir, e))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(bad)?
                    .with_automatic_cleanup(true)
                    // Durable like an object store's answer: a commit
                    // record must never outlive the chunks it names
                    // through a power loss.
                    .with_fsync(true);
                uploads = Uploads::File(dir);
                (Arc::new(fs), ObjPath::default())
            }
            "memory" => (
                Arc::new(object_store::memory::InMemory::new()),
                ObjPath::default(),
            ),
            other => {
                return Err(StoreError::invalid(
                    "L3 URL",
                    format!("unsupported scheme {other:?} (s3, gs, az, file, memory)"),
                ))
            }
        };
        Ok(L3Store {
            store,
            root,
            url: shown,
            encode_slots: Arc::new(tokio::sync::Semaphore::new(opts.encode_threads.max(1))),
            opts,
            uploads,
        })
    }

    /// An L3 tier over any `ObjectStore` (a wrapper that injects faults, a
    /// store built by hand), with keys under `root`.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        root: &str,
        label: &str,
        opts: L3Options,
    ) -> Self {
        L3Store {
            store,
            root: ObjPath::from(root),
            url: label.to_string(),
            encode_slots: Arc::new(tokio::sync::Semaphore::new(opts.encode_threads.max(1))),
            opts,
            uploads: Uploads::None,
        }
    }

    /// The tier as the client opens it: retries of calls that fail
    /// `Unavailable` (with [`L3Options::retry_policy`]) over counters of
    /// every attempt over the store. See the module documentation.
    pub fn into_tier(self) -> L3Tier {
        let policy = self.opts.retry_policy();
        RetryStore::with_policy(MetricsStore::new(self), policy)
    }

    /// The URL (credentials redacted) or label it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The options.
    pub fn options(&self) -> &L3Options {
        &self.opts
    }

    fn key(&self, parts: &[&str]) -> ObjPath {
        let mut p = self.root.clone();
        for part in parts {
            p = p.join(*part);
        }
        p
    }

    fn chunk_key(&self, job: &str, id: &ChunkId) -> ObjPath {
        let hex = id.to_hex();
        self.key(&[job, "chunks", &hex[..2], &hex])
    }

    fn step_key(&self, job: &str, step: u64) -> ObjPath {
        self.key(&[job, "steps", &format!("{step:020}")])
    }

    /// Reads a whole object of at most `max` bytes (a longer one is refused
    /// before its body is read).
    async fn get_bounded(&self, key: &ObjPath, max: usize, what: &str) -> Result<Bytes> {
        let r = self.store.get(key).await.map_err(|e| os_err(what, e))?;
        if r.meta.size > max as u64 {
            return Err(StoreError::Corrupt {
                what: what.to_string(),
                source: strata_format::FormatError::TooLarge {
                    what: "object",
                    value: r.meta.size,
                    limit: max as u64,
                },
            });
        }
        r.bytes().await.map_err(|e| os_err(what, e))
    }

    /// Uploads one encoded frame, in parts if it is large. An interrupted
    /// multipart upload is aborted, so no partial object is ever visible.
    async fn upload(&self, key: &ObjPath, frame: Bytes) -> Result<()> {
        let what = || format!("uploading {key}");
        if frame.len() <= self.opts.multipart_threshold {
            self.store
                .put(key, PutPayload::from(frame))
                .await
                .map_err(|e| os_err(what(), e))?;
            return Ok(());
        }
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(|e| os_err(what(), e))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, self.opts.part_size);
        w.put(frame);
        match w.finish().await {
            Ok(_) => Ok(()),
            Err(e) => Err(os_err(what(), e)),
        }
    }

    async fn has(&self, job: &str, id: &ChunkId) -> Result<bool> {
        Ok(self.modified(job, id).await?.is_some())
    }

    /// The chunk's last-modified time, or None if it is not there. An
    /// object too short or too long to be any frame (an empty object left
    /// by a crash of the store's host, say) is not there either: the next
    /// put rewrites it. A torn object of a plausible length still passes
    /// here; reads verify every frame and repair from another tier.
    async fn modified(&self, job: &str, id: &ChunkId) -> Result<Option<std::time::SystemTime>> {
        let key = self.chunk_key(job, id);
        match self.store.head(&key).await {
            Ok(meta) if !(FRAME_HEADER_LEN as u64..=MAX_FRAME_LEN as u64).contains(&meta.size) => {
                tracing::warn!(
                    "{key}: {} bytes cannot be a chunk frame; treated as missing",
                    meta.size
                );
                Ok(None)
            }
            Ok(meta) => Ok(Some(std::time::SystemTime::from(meta.last_modified))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(os_err(format!("chunk {id}"), e)),
        }
    }

    async fn put_one(&self, job: &str, c: ChunkPut, check: bool) -> Result<(bool, u64, u64)> {
        let raw_len = c.data.len() as u64;
        if check && self.has(job, &c.id).await? {
            return Ok((false, raw_len, 0));
        }
        let codec = self.opts.codec;
        // Encoding is CPU work: never on the runtime's threads, and at most
        // `encode_threads` at once.
        let slot = self
            .encode_slots
            .acquire()
            .await
            .map_err(|_| StoreError::Internal("encoder slots closed".into()))?;
        let frame = tokio::task::spawn_blocking(move || {
            FrameEncoder::new(codec)?.encode(c.data.as_slice(), c.hint, Some(c.id))
        })
        .await
        .map_err(|e| StoreError::Internal(format!("encoder task: {e}")))??;
        // Encoding done: the upload itself needs no core.
        drop(slot);
        let stored = frame.len() as u64;
        let key = self.chunk_key(job, &c.id);
        // Re-sending a chunk is idempotent (same id, same bytes): a
        // `RetryStore` over the tier may send it again.
        self.upload(&key, Bytes::from(frame)).await?;
        Ok((true, raw_len, stored))
    }

    /// Fetches a chunk's stored frame, not yet decoded or verified (see
    /// [`Frame::decode_into`]): ranged GETs of [`L3Options::range_size`]
    /// issued at once, failing as a whole (`Unavailable`) if one fails, at
    /// most the largest frame a chunk can have. `buf` is reused for the
    /// bytes (see [`Frame::into_buf`]).
    pub async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        validate_job_id(job)?;
        self.fetch_frame(job, id, buf).await
    }

    /// [`Self::get_frame`]'s fetch, owning what it needs (the store, the
    /// key), so that it can also run as a task ([`Self::get_one_into`]).
    fn fetch_frame(
        &self,
        job: &str,
        id: ChunkId,
        buf: Vec<u8>,
    ) -> impl std::future::Future<Output = Result<Frame>> + Send + 'static {
        let what = format!("chunk {id} in L3 ({})", self.url);
        let (store, key) = (self.store.clone(), self.chunk_key(job, &id));
        let rs = self.opts.range_size as u64;
        async move {
            let bytes = get_ranged(&*store, &key, rs, MAX_FRAME_LEN, &what, buf).await?;
            Ok(Frame { id, bytes, what })
        }
    }

    /// Fetches, verifies and decodes one chunk, into `spare` if it is large
    /// enough (a reused, already-faulted buffer), else a new buffer. The
    /// GETs and the decode run as a task of the runtime
    /// ([`crate::task`]): the bodies are taken in on the workers that
    /// receive them, not in a reader's lane.
    async fn get_one_into(
        &self,
        job: &str,
        id: ChunkId,
        spare: Option<AlignedBuf>,
    ) -> Result<ChunkData> {
        validate_job_id(job)?;
        let fetch = self.fetch_frame(job, id, Vec::new());
        let read = async move {
            let frame = fetch.await?;
            crate::task::blocking("decoder", move || {
                let len = frame.raw_len()?;
                let mut buf = match spare {
                    Some(mut b) if b.capacity() >= len => {
                        b.set_len(len);
                        b
                    }
                    _ => AlignedBuf::zeroed(len),
                };
                frame.decode_into(&mut buf)?;
                Ok(ChunkData::whole(buf))
            })
            .await
        };
        crate::task::read_as_task(format!("chunk {id} in L3 ({})", self.url), read).await
    }

    /// Every chunk object the job holds here, with its stored (encoded)
    /// size: one listing.
    async fn chunk_sizes(&self, job: &str) -> Result<std::collections::BTreeMap<ChunkId, u64>> {
        Ok(self
            .chunk_info(job)
            .await?
            .into_iter()
            .map(|c| (c.id, c.stored_len.unwrap_or(0)))
            .collect())
    }

    /// Every chunk object with its size and the store's modification time:
    /// one listing.
    async fn chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        validate_job_id(job)?;
        let prefix = self.key(&[job, "chunks"]);
        let listed: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| os_err("listing chunks", e))?;
        let mut out: Vec<ChunkInfo> = listed
            .iter()
            .filter_map(|m| {
                m.location
                    .filename()
                    .and_then(|n| ChunkId::from_hex(n).ok())
                    .map(|id| ChunkInfo {
                        id,
                        stored_len: Some(m.size),
                        touched: Some(std::time::SystemTime::from(m.last_modified)),
                    })
            })
            .collect();
        out.sort_unstable_by_key(|c| c.id);
        Ok(out)
    }

    async fn put(&self, job: &str, chunks: Vec<ChunkPut>, check: bool) -> Result<PutStats> {
        validate_job_id(job)?;
        let (todo, mut stats) = dedup_call(chunks)?;
        // The first failure starts no more uploads, but those in flight
        // finish (an upload cut off is bandwidth lost, and what lands is
        // progress): what landed stays (ids are idempotent), the rest is
        // sent by the next call (a `RetryStore` over the tier sends only
        // what it finds missing). The call fails with the first error.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let failed = &failed;
        let results: Vec<Result<Option<(bool, u64, u64)>>> = futures::stream::iter(todo)
            .map(|c| async move {
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(None);
                }
                let r = self.put_one(job, c, check).await;
                if r.is_err() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                r.map(Some)
            })
            .buffer_unordered(self.opts.concurrency.max(1))
            .collect()
            .await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(Some((written, raw, stored))) => stats.count(raw, stored, written),
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }
}

/// The key prefix a cloud URL names (the path after the bucket).
fn url_prefix(url: &url::Url) -> Result<ObjPath> {
    ObjPath::from_url_path(url.path())
        .map_err(|e| StoreError::invalid("L3 URL path", format!("{}: {e}", url.path())))
}

#[async_trait]
impl ChunkStore for L3Store {
    fn name(&self) -> &str {
        "l3"
    }
    /// With `known_missing`, chunks the caller just found missing (with
    /// [`ChunkStore::has_chunks`]) are uploaded without asking again for
    /// each one: one request per chunk less. A chunk that appeared
    /// meanwhile is rewritten with the same bytes (harmless).
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        self.put(job, chunks, !opts.known_missing).await
    }
    /// Always verified (an object's bytes are checked as they are
    /// decoded); the spare buffers receive the decoded chunks.
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        if let Err(e) = validate_job_id(job) {
            return ids.iter().map(|_| Err(e.clone().into())).collect();
        }
        crate::store::read_each(ids, opts.spare, self.opts.concurrency, |id, buf| {
            self.get_one_into(job, id, buf)
        })
        .await
    }

    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        validate_job_id(job)?;
        let data = self.get_one_into(job, *id, None).await?;
        slice_range(id, data, range)
    }

    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        validate_job_id(job)?;
        // Old chunks count as missing, so a reuse rewrites them (see
        // `L3Options::refresh_after`); ages by the store's own clock.
        let fresh_since = match self.opts.refresh_after {
            Some(age) if !ids.is_empty() => Some(
                self.now(job)
                    .await?
                    .checked_sub(age)
                    .unwrap_or(std::time::UNIX_EPOCH),
            ),
            _ => None,
        };
        futures::stream::iter(ids.iter().copied())
            .map(|id| async move {
                match fresh_since {
                    None => self.has(job, &id).await,
                    Some(edge) => Ok(self.modified(job, &id).await?.is_some_and(|t| t >= edge)),
                }
            })
            .buffered(self.opts.concurrency.max(1))
            .try_collect()
            .await
    }

    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        Ok(self.chunk_sizes(job).await?.into_keys().collect())
    }

    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        self.chunk_info(job).await
    }

    /// A pin is an empty object `<job>/pins/<step, 20 digits>`.
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        validate_job_id(job)?;
        let name = format!("{step:020}");
        let key = self.key(&[job, "pins", &name]);
        if pinned {
            self.store
                .put(&key, PutPayload::from_static(b""))
                .await
                .map(|_| ())
                .map_err(|e| os_err(format!("writing {key}"), e))
        } else {
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(os_err(format!("deleting {key}"), e)),
            }
        }
    }

    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        validate_job_id(job)?;
        let prefix = self.key(&[job, "pins"]);
        let listed: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| os_err("listing pins", e))?;
        Ok(listed
            .iter()
            .filter_map(|m| m.location.filename().and_then(|n| n.parse::<u64>().ok()))
            .collect())
    }

    /// The object store's time: a marker object written now and its
    /// last-modified time read back (every chunk object is stamped by the
    /// same server).
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        let key = self.key(&[job, "clock"]);
        self.store
            .put(&key, PutPayload::from_static(b""))
            .await
            .map_err(|e| os_err(format!("writing {key}"), e))?;
        let meta = self
            .store
            .head(&key)
            .await
            .map_err(|e| os_err(format!("reading {key}"), e))?;
        Ok(std::time::SystemTime::from(meta.last_modified))
    }

    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        validate_job_id(job)?;
        let prefix = self.key(&[job, "chunks"]);
        let dirs = [job, "chunks"];
        self.uploads.abort_before(&prefix, &dirs, cutoff).await
    }

    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        L3Store::get_frame(self, job, id, buf).await
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    fn concurrency(&self) -> usize {
        self.opts.concurrency
    }

    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        validate_job_id(job)?;
        let results: Vec<Result<()>> = futures::stream::iter(ids.iter().copied())
            .map(|id| async move {
                match self.store.delete(&self.chunk_key(job, &id)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(os_err(format!("deleting chunk {id}"), e)),
                }
            })
            .buffer_unordered(self.opts.concurrency.max(1))
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Each chunk's age is read (HEAD) just before it is deleted, not
    /// taken from an earlier listing: an upload that rewrote a reused chunk
    /// since (see `L3Options::refresh_after`) keeps it. Deletes run with
    /// bounded concurrency; a chunk already gone is not an error.
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        validate_job_id(job)?;
        let results: Vec<Result<Option<u64>>> = futures::stream::iter(ids.iter().copied())
            .map(|id| async move {
                let key = self.chunk_key(job, &id);
                let meta = match self.store.head(&key).await {
                    Ok(m) => m,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(os_err(format!("chunk {id}"), e)),
                };
                if std::time::SystemTime::from(meta.last_modified) >= cutoff {
                    return Ok(None);
                }
                match self.store.delete(&key).await {
                    Ok(()) => Ok(Some(meta.size)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(os_err(format!("deleting chunk {id}"), e)),
                }
            })
            .buffer_unordered(self.opts.concurrency.max(1))
            .collect()
            .await;
        let (mut n, mut bytes) = (0, 0);
        for r in results {
            if let Some(size) = r? {
                n += 1;
                bytes += size;
            }
        }
        Ok((n, bytes))
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.put_shard_manifest(job, step, rank, bytes).await
    }

    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.get_shard_manifest(job, step, rank).await
    }

    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.commit_record(record).await
    }

    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.steps(job).await
    }

    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        self.slot_record(job, step, first).await
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.remove_step(job, step).await
    }

    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.remove_shard(job, step, rank).await
    }
}

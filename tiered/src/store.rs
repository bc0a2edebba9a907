//! The [`ChunkStore`] trait: the one seam between Strata's engine and a tier.
//!
//! # Contract
//!
//! Every tier (L1 local disk, L2 peers, L3 object storage, the in-memory
//! store) implements this trait and passes the shared conformance suite
//! ([`crate::conformance`]).
//!
//! * **Namespaces.** Everything lives under a job id (validated by
//!   [`strata_format::names::validate_job_id`]); jobs never see each other's data.
//! * **Chunks are content-addressed and immutable.** `put_chunks_opts` is
//!   idempotent: a chunk id already present is skipped (and reported as
//!   deduplicated), and two writers racing on one id both succeed. A chunk
//!   is durable in the tier when `put_chunks_opts` returns `Ok`. Local callers
//!   pass ids they computed (hashing twice would double the save's CPU cost);
//!   a tier that receives chunks from another process (the L2 service)
//!   re-verifies them.
//! * **Reads are verified.** `get_chunk` returns the chunk's bytes only after
//!   checking they hash to the id; damaged bytes are a
//!   [`StoreErrorKind::Corrupt`](crate::StoreErrorKind::Corrupt) error naming
//!   the chunk, a missing chunk is `NotFound`. Never silently wrong bytes.
//! * **Order.** A caller writes a shard's chunks, then its manifest, then a
//!   commit record. A tier keeps that order durable: after a crash, a
//!   manifest never names chunks that were not durable, and a commit record
//!   never names a manifest that was not.
//! * **Commit records are create-only.** `commit` fails with `AlreadyExists`
//!   if a different record is there for the same step and first rank;
//!   writing the identical record again succeeds.
//! * **Visibility.** A step is listed as committed only through its commit
//!   records; manifests without a record are listed as partial (an
//!   interrupted save) so they can be cleaned up.
//! * **A committed shard is never replaced.** `put_manifest` for a rank
//!   whose commit record is already there succeeds only with the very
//!   manifest the record names (a repair rewriting a damaged copy);
//!   anything else is `AlreadyExists`, so a later save of the same step
//!   number can never damage a committed step.
//! * **Listing never hides a step.** A commit record that cannot be read or
//!   decoded (damage, a newer format during a rolling upgrade) is reported
//!   in [`StepInfo::unreadable`] and the rest of the listing goes on; any
//!   other listing error fails the call (a caller deciding what to delete
//!   must never see a partial listing as complete).
//! * **Deletion** of a step removes its commit records first, so a crash in
//!   the middle leaves a partial step, never a committed step with missing
//!   parts. [`ChunkStore::delete_shard`] retires one rank's shard: a
//!   retiring marker first, then the record, the manifest, the marker; a
//!   crash part-way leaves the marker ([`StepInfo::retiring`]), so readers
//!   tell a shard being retired from a damaged one. Chunk deletion is
//!   separate (garbage collection decides).
//!
//! # The trait and its conveniences
//!
//! The trait is what a tier implements: one batched read and one write,
//! each with an options struct ([`ReadOptions`], [`PutOptions`]), and
//! defaults for what a simple tier can leave out. The plain calls callers
//! make (`put_chunks`, `get_chunks`, ...) are [`ChunkStoreExt`], implemented
//! for every store.
//!
//! # Wrappers
//!
//! `Arc<T>` and `Box<T>` of a store are stores (every method forwarded,
//! checked by `clippy::missing_trait_methods`), so an engine holds a stack
//! of `Arc<dyn ChunkStore>` and a wrapper can wrap any of them.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use strata_format::codec::ElemHint;
use strata_format::{ChunkId, CommitRecord};

use crate::aligned::AlignedBuf;
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::l3::Frame;

/// One chunk to store.
#[derive(Clone, Debug)]
pub struct ChunkPut {
    /// BLAKE3 of `data`.
    pub id: ChunkId,
    /// Codec hint (compressing tiers use it).
    pub hint: ElemHint,
    /// The raw bytes.
    pub data: ChunkData,
}

/// What a `put_chunks` call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutStats {
    /// Chunks written.
    pub written: u64,
    /// Raw bytes of the chunks written.
    pub bytes_written: u64,
    /// Bytes the tier stored for them (after its codec; equal to
    /// `bytes_written` for tiers that store raw chunks).
    pub bytes_stored: u64,
    /// Chunks skipped because the tier already held them.
    pub deduped: u64,
    /// Raw bytes of the skipped chunks.
    pub bytes_deduped: u64,
}

impl std::ops::AddAssign for PutStats {
    fn add_assign(&mut self, o: PutStats) {
        self.written += o.written;
        self.bytes_written += o.bytes_written;
        self.bytes_stored += o.bytes_stored;
        self.deduped += o.deduped;
        self.bytes_deduped += o.bytes_deduped;
    }
}

/// What a tier holds of one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepInfo {
    /// The step.
    pub step: u64,
    /// Commit records found, keyed by their first rank.
    pub records: BTreeMap<u32, CommitRecord>,
    /// Ranks with a manifest in this tier (committed or not).
    pub manifests: BTreeSet<u32>,
    /// Commit records found but unreadable here (damaged, or written by a
    /// newer format version), by slot, with why. The step is listed; these
    /// ranks simply do not count as committed in this tier.
    pub unreadable: BTreeMap<u32, String>,
    /// Ranks whose shard is being retired (a retiring marker is there):
    /// what is left of them is on its way out, not damage.
    pub retiring: BTreeSet<u32>,
}

/// One chunk held by a tier, for `stat` and garbage collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    /// The chunk.
    pub id: ChunkId,
    /// Bytes the tier stores for it (after its codec), when it can tell.
    pub stored_len: Option<u64>,
    /// When it was last written or deduplicated against, by the tier's own
    /// clock, when it can tell. Unknown means "young": never collected.
    pub touched: Option<SystemTime>,
}

impl StepInfo {
    /// Ranks named by the step's commit records in this tier.
    pub fn committed_ranks(&self) -> BTreeSet<u32> {
        self.records
            .values()
            .flat_map(|r| r.shards.iter().map(|s| s.rank))
            .collect()
    }

    /// Every rank with anything of the step in this tier: a manifest, a
    /// commit record (readable or not), a retiring marker. What deleting
    /// the step retires.
    pub fn ranks_held(&self) -> BTreeSet<u32> {
        let mut ranks = self.manifests.clone();
        ranks.extend(self.committed_ranks());
        ranks.extend(self.retiring.iter().copied());
        ranks.extend(self.unreadable.keys().copied());
        ranks
    }

    /// The world size recorded by the commit records, if any.
    pub fn world_size(&self) -> Option<u32> {
        self.records.values().next().map(|r| r.world_size)
    }

    /// True when commit records name every rank of the world.
    pub fn is_complete(&self) -> bool {
        self.world_size()
            .is_some_and(|w| self.committed_ranks().len() == w as usize)
    }

    /// True when the ranks in `ranks` are all committed here.
    pub fn has_committed(&self, ranks: &BTreeSet<u32>) -> bool {
        ranks.is_subset(&self.committed_ranks())
    }
}

/// How [`ChunkStore::put_chunks_opts`] writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// The caller has just found these chunks missing with
    /// [`ChunkStore::has_chunks`]: tiers that check presence per chunk
    /// before a write (L3, peers) skip that second check. Tiers that check
    /// as they write ignore it.
    pub known_missing: bool,
}

/// How [`ChunkStore::get_chunks_opts`] reads.
#[derive(Debug, Default)]
pub struct ReadOptions {
    /// Whole chunks read without hashing them, for a caller that verifies
    /// them itself or hands them to a receiver that does (the peer
    /// service): the hash is paid once. Tiers that cannot skip
    /// verification return verified bytes.
    pub unverified: bool,
    /// Buffers to read into where the tier can (L1 reads straight into
    /// them with O_DIRECT; other tiers may ignore them): a restore reuses a
    /// few pre-faulted buffers instead of faulting in fresh memory for
    /// every chunk. Get them back with [`ChunkData::into_buf`].
    pub spare: Vec<AlignedBuf>,
}

/// Conveniences over [`ChunkStore`], for every store (as `object_store`'s
/// `ObjectStoreExt`): the plain forms of the calls that take options.
/// Implemented for every `ChunkStore`; a tier implements the trait only.
#[async_trait]
pub trait ChunkStoreExt: ChunkStore {
    /// Stores chunks durably, skipping ids already present.
    async fn put_chunks(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        self.put_chunks_opts(job, chunks, PutOptions::default())
            .await
    }

    /// Stores chunks the caller has just found missing with
    /// [`ChunkStore::has_chunks`] ([`PutOptions::known_missing`]).
    async fn put_missing_chunks(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        self.put_chunks_opts(
            job,
            chunks,
            PutOptions {
                known_missing: true,
            },
        )
        .await
    }

    /// Several whole chunks, verified; one result per id, in order.
    async fn get_chunks(&self, job: &str, ids: &[ChunkId]) -> Vec<Result<ChunkData>> {
        self.get_chunks_opts(job, ids, ReadOptions::default()).await
    }

    /// [`Self::get_chunks`] into the `spare` buffers where the tier can
    /// ([`ReadOptions::spare`]).
    async fn get_chunks_reusing(
        &self,
        job: &str,
        ids: &[ChunkId],
        spare: Vec<AlignedBuf>,
    ) -> Vec<Result<ChunkData>> {
        let opts = ReadOptions {
            spare,
            ..ReadOptions::default()
        };
        self.get_chunks_opts(job, ids, opts).await
    }

    /// Whole chunks read without hashing them where the tier can
    /// ([`ReadOptions::unverified`]).
    async fn get_chunks_unverified(&self, job: &str, ids: &[ChunkId]) -> Vec<Result<ChunkData>> {
        let opts = ReadOptions {
            unverified: true,
            ..ReadOptions::default()
        };
        self.get_chunks_opts(job, ids, opts).await
    }
}

impl<T: ChunkStore + ?Sized> ChunkStoreExt for T {}

/// A storage tier. See the module documentation for the contract.
#[async_trait]
pub trait ChunkStore: Send + Sync + std::fmt::Debug {
    /// A short name for logs and errors ("l1", "memory", "l3").
    fn name(&self) -> &str;

    /// Stores chunks durably, skipping ids already present (see
    /// [`PutOptions`]; [`ChunkStoreExt::put_chunks`] for the plain call).
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats>;

    /// A chunk's bytes (or the `range` of them), verified against its id.
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData>;

    /// Several whole chunks; one result per id, in order (see
    /// [`ReadOptions`]; [`ChunkStoreExt::get_chunks`] for the plain,
    /// verified call). Tiers override this to keep many reads in flight;
    /// the default reads one at a time, verified.
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        drop(opts);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(self.get_chunk(job, id, None).await);
        }
        out
    }

    /// For each id, whether the tier holds it.
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>>;

    /// Every chunk id held for the job (for garbage collection).
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>>;

    /// Deletes chunks (missing ones are not an error).
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()>;

    /// Stores a rank's encoded shard manifest for a step, durably. Replaces
    /// an uncommitted one left by an interrupted save.
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()>;

    /// A rank's encoded manifest for a step (callers decode it, which checks
    /// its checksum, and compare its id with the commit record's).
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>>;

    /// Writes a commit record, create-only (see the contract).
    async fn commit(&self, record: &CommitRecord) -> Result<()>;

    /// The steps the tier holds anything of, oldest first.
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>>;

    /// The commit record of `step` in the slot of rank `first` (a record is
    /// keyed by the first rank it names; each rank commits one of its own),
    /// read without listing the tier where it can: one request on an object
    /// store. `None` when the slot is empty; an unreadable record is
    /// [`StoreError::Corrupt`]. A restore reads its own record this way when
    /// another rank listed the tier for the job. This default lists.
    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        let steps = self.list_steps(job).await?;
        record_in_listing(&steps, step, first)
    }

    /// Deletes a step's commit records, then its manifests.
    async fn delete_step(&self, job: &str, step: u64) -> Result<()>;

    /// Retires one rank's shard of a step, leaving every other rank's files
    /// alone: a retiring marker, then the rank's commit record, its
    /// manifest, and the marker (see the contract). Missing parts are not
    /// an error.
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()>;

    /// A chunk's frame as the tier stores it (its codec), not yet decoded
    /// or verified: decode it where the bytes belong with
    /// [`Frame::decode_into`], which verifies. `buf` may be reused for the
    /// bytes. Tiers that store raw chunks frame a verified read.
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        drop(buf);
        let data = self.get_chunk(job, &id, None).await?;
        Frame::raw(
            id,
            data.as_slice(),
            format!("chunk {id} in {}", self.name()),
        )
    }

    /// Every chunk held for the job with its stored size and age, where the
    /// tier can tell (for `stat` and garbage collection).
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        Ok(self
            .list_chunks(job)
            .await?
            .into_iter()
            .map(|id| ChunkInfo {
                id,
                stored_len: None,
                touched: None,
            })
            .collect())
    }

    /// Deletes those of `ids` not written or deduplicated against since
    /// `cutoff` (by the tier's own clock, which stamps its chunks), each
    /// checked again as it is deleted. Returns the chunks and stored bytes
    /// deleted. Tiers whose puts can race a delete override this to close
    /// the window (L1 moves a chunk aside before its last check).
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<(u64, u64)> {
        let wanted: std::collections::HashSet<&ChunkId> = ids.iter().collect();
        let doomed: Vec<ChunkInfo> = self
            .list_chunk_info(job)
            .await?
            .into_iter()
            .filter(|c| wanted.contains(&c.id) && c.touched.is_some_and(|t| t < cutoff))
            .collect();
        let ids: Vec<ChunkId> = doomed.iter().map(|c| c.id).collect();
        self.delete_chunks(job, &ids).await?;
        Ok((
            ids.len() as u64,
            doomed.iter().map(|c| c.stored_len.unwrap_or(0)).sum(),
        ))
    }

    /// Pins `step` (`pinned`), so garbage collection never retires it
    /// until it is unpinned, or unpins it. The pin is stored in the tier,
    /// not in a process. The default: this tier cannot store pins.
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        let _ = (job, step, pinned);
        Err(crate::StoreError::invalid(
            "pin",
            format!("{} does not store pins", self.name()),
        ))
    }

    /// The steps pinned in this tier (none where pins cannot be stored).
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        let _ = job;
        Ok(std::collections::BTreeSet::new())
    }

    /// The tier's own time: the clock that stamps its chunks' `touched`
    /// times (a disk's or file server's, an object store's). Retention
    /// measures grace periods against it, never against the caller's own
    /// clock: a rank whose clock is minutes off must not see another
    /// writer's fresh chunks as old. The default is this host's clock.
    async fn now(&self, job: &str) -> Result<SystemTime> {
        let _ = job;
        Ok(SystemTime::now())
    }

    /// Aborts the job's incomplete multipart uploads begun before `cutoff`
    /// (on the tier's clock, [`Self::now`]): what a writer killed in the
    /// middle of a large upload leaves behind, invisible to listings yet
    /// billed. Returns how many were aborted. The default: the tier has
    /// no multipart uploads.
    async fn abort_stale_uploads(&self, job: &str, cutoff: SystemTime) -> Result<u64> {
        let _ = (job, cutoff);
        Ok(0)
    }

    /// How many requests the tier serves well at once (a hint for readers
    /// that fan out: an object store wants many, a disk a few).
    fn concurrency(&self) -> usize {
        4
    }

    /// A short description of how the tier does its I/O ("io_uring",
    /// "psync", an object store's URL), for logs and reports.
    fn describe(&self) -> String {
        self.name().to_string()
    }
}

/// Checks a manifest write against the step's readable commit records
/// (whatever slot they are in): `Ok` when none names `rank`, or those that
/// do name exactly these bytes (a repair); else `AlreadyExists` (a
/// committed shard is never replaced).
pub fn check_manifest_replace(
    step: u64,
    rank: u32,
    records: &[CommitRecord],
    bytes: &[u8],
) -> Result<()> {
    let id = strata_format::ShardManifest::id_of(bytes);
    let named: Vec<_> = records
        .iter()
        .flat_map(|r| r.shards.iter())
        .filter(|s| s.rank == rank)
        .collect();
    if named.iter().all(|s| s.manifest == id) {
        return Ok(());
    }
    Err(crate::error::StoreError::AlreadyExists {
        what: format!(
            "step {step} rank {rank} is committed (its manifest is never replaced; save under a new step number)"
        ),
    })
}

/// The record in slot `first` of `step` as a listing shows it (see
/// [`ChunkStore::get_commit_record`]).
pub fn record_in_listing(
    steps: &[StepInfo],
    step: u64,
    first: u32,
) -> Result<Option<CommitRecord>> {
    let Some(info) = steps.iter().find(|i| i.step == step) else {
        return Ok(None);
    };
    if let Some(why) = info.unreadable.get(&first) {
        return Err(StoreError::Corrupt {
            what: format!("commit record of step {step} rank {first}"),
            source: strata_format::FormatError::malformed("commit record", why.clone()),
        });
    }
    Ok(info.records.get(&first).cloned())
}

/// Where a commit record goes and what it holds: the rank that names it (its
/// first shard) and its encoding. Every tier keys records the same way.
pub fn commit_slot(record: &CommitRecord) -> Result<(u32, Vec<u8>)> {
    let bytes = record.encode()?;
    let first = record
        .shards
        .first()
        .map(|s| s.rank)
        .ok_or_else(|| crate::error::StoreError::invalid("commit record", "names no shard"))?;
    Ok((first, bytes))
}

/// A batch read for tiers that read each chunk with a request of its own
/// (L3, the peers): `read(id, buffer)` for every id, up to `concurrency`
/// at once, the `spare` buffers handed out in order; results in the order
/// of `ids`.
pub async fn read_each<'a, F, Fut>(
    ids: &[ChunkId],
    spare: Vec<AlignedBuf>,
    concurrency: usize,
    read: F,
) -> Vec<Result<ChunkData>>
where
    F: Fn(ChunkId, Option<AlignedBuf>) -> Fut,
    Fut: std::future::Future<Output = Result<ChunkData>> + 'a,
{
    use futures::StreamExt;
    let mut spare = spare.into_iter();
    let jobs: Vec<(ChunkId, Option<AlignedBuf>)> =
        ids.iter().map(|id| (*id, spare.next())).collect();
    futures::stream::iter(jobs)
        .map(|(id, buf)| read(id, buf))
        .buffered(concurrency.max(1))
        .collect()
        .await
}

/// The first step of a `put_chunks`: refuses a chunk above the frame
/// limit, and keeps one of each id (repeats in the call count as
/// deduplicated). Returns the chunks to store and the stats so far.
pub fn dedup_call(chunks: Vec<ChunkPut>) -> Result<(Vec<ChunkPut>, PutStats)> {
    let mut stats = PutStats::default();
    let mut seen = std::collections::HashSet::new();
    let mut todo = Vec::with_capacity(chunks.len());
    for c in chunks {
        let limit = strata_format::frame::MAX_CHUNK_LEN as usize;
        if c.data.len() > limit {
            return Err(crate::error::StoreError::invalid(
                "chunk",
                format!("{} bytes exceeds {limit}", c.data.len()),
            ));
        }
        if seen.insert(c.id) {
            todo.push(c);
        } else {
            stats.deduped += 1;
            stats.bytes_deduped += c.data.len() as u64;
        }
    }
    Ok((todo, stats))
}

impl PutStats {
    /// Counts one chunk of `raw` bytes: written (stored as `stored` bytes)
    /// if `new`, else found already there.
    pub fn count(&mut self, raw: u64, stored: u64, new: bool) {
        if new {
            self.written += 1;
            self.bytes_written += raw;
            self.bytes_stored += stored;
        } else {
            self.deduped += 1;
            self.bytes_deduped += raw;
        }
    }
}

/// The error for a create-only commit that found a different record.
pub(crate) fn commit_conflict(step: u64, first: u32) -> crate::error::StoreError {
    crate::error::StoreError::AlreadyExists {
        what: format!("commit record for step {step} rank {first}"),
    }
}

/// Verifies that `data` hashes to `id`.
pub(crate) fn verify(id: &ChunkId, data: &[u8], what: impl FnOnce() -> String) -> Result<()> {
    let actual = ChunkId::of(data);
    if actual != *id {
        return Err(crate::error::StoreError::Corrupt {
            what: what(),
            source: strata_format::FormatError::HashMismatch {
                expected: id.to_hex(),
                actual: actual.to_hex(),
            },
        });
    }
    Ok(())
}

/// Narrows a verified chunk to the requested range (no copy).
pub(crate) fn slice_range(
    id: &ChunkId,
    data: ChunkData,
    range: Option<Range<u32>>,
) -> Result<ChunkData> {
    match range {
        None => Ok(data),
        Some(r) => data.sub(r.start as usize..r.end as usize).ok_or_else(|| {
            crate::error::StoreError::invalid(
                "chunk range",
                format!("{r:?} outside chunk {id} of {} bytes", data.len()),
            )
        }),
    }
}

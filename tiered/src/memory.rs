//! An in-memory [`ChunkStore`]: the reference implementation of the
//! contract, for tests and for embedding (nothing survives the process).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use strata_format::names::validate_job_id;
use strata_format::{ChunkId, CommitRecord};

use crate::chunk_data::ChunkData;
use crate::clock::{Clock, SystemClock};
use crate::error::{Result, StoreError};
use crate::store::PutOptions;
use crate::store::{
    check_manifest_replace, commit_conflict, commit_slot, slice_range, verify, ChunkInfo, ChunkPut,
    ChunkStore, PutStats, StepInfo,
};

#[derive(Default)]
struct Job {
    chunks: HashMap<ChunkId, ChunkData>,
    /// When each chunk was last written or deduplicated against.
    touched: HashMap<ChunkId, SystemTime>,
    manifests: BTreeMap<(u64, u32), Vec<u8>>,
    records: BTreeMap<(u64, u32), Vec<u8>>,
    /// Shards being retired (see `ChunkStore::delete_shard`).
    retiring: BTreeSet<(u64, u32)>,
    /// Pinned steps.
    pins: BTreeSet<u64>,
}

/// A tier in memory.
pub struct MemoryStore {
    jobs: Mutex<HashMap<String, Job>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryStore")
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose chunk ages come from `clock` (tests of grace
    /// periods run without sleeping).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            jobs: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// Replaces a stored commit record's bytes (to test how readers handle
    /// damaged or unknown-version records).
    pub fn corrupt_record(&self, job: &str, step: u64, slot: u32, bytes: &[u8]) -> Result<()> {
        self.with(job, |j| {
            j.records.insert((step, slot), bytes.to_vec());
            Ok(())
        })
    }

    fn with<T>(&self, job: &str, f: impl FnOnce(&mut Job) -> Result<T>) -> Result<T> {
        validate_job_id(job)?;
        let mut jobs = self
            .jobs
            .lock()
            .map_err(|_| StoreError::Internal("memory store lock poisoned".into()))?;
        f(jobs.entry(job.to_string()).or_default())
    }

    /// Replaces a stored chunk's bytes (to test how readers handle damage).
    pub fn corrupt_chunk(&self, job: &str, id: &ChunkId, bytes: &[u8]) -> Result<()> {
        self.with(job, |j| {
            j.chunks.insert(*id, ChunkData::copy_from(bytes));
            Ok(())
        })
    }
}

#[async_trait]
impl ChunkStore for MemoryStore {
    fn name(&self) -> &str {
        "memory"
    }

    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        let _ = opts; // every put checks each id: nothing to skip.
        let now = self.clock.now();
        self.with(job, |j| {
            let mut s = PutStats::default();
            for c in chunks {
                let len = c.data.len() as u64;
                j.touched.insert(c.id, now);
                match j.chunks.entry(c.id) {
                    std::collections::hash_map::Entry::Occupied(_) => {
                        s.deduped += 1;
                        s.bytes_deduped += len;
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        // Own copy: the caller's buffer is reused after the put.
                        v.insert(ChunkData::copy_from(c.data.as_slice()));
                        s.written += 1;
                        s.bytes_written += len;
                        s.bytes_stored += len;
                    }
                }
            }
            Ok(s)
        })
    }

    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let data = self.with(job, |j| {
            j.chunks
                .get(id)
                .cloned()
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("chunk {id}"),
                })
        })?;
        verify(id, data.as_slice(), || format!("chunk {id} in memory"))?;
        slice_range(id, data, range)
    }

    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.with(job, |j| {
            Ok(ids.iter().map(|id| j.chunks.contains_key(id)).collect())
        })
    }

    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        self.with(job, |j| {
            let mut v: Vec<ChunkId> = j.chunks.keys().copied().collect();
            v.sort_unstable();
            Ok(v)
        })
    }

    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.with(job, |j| {
            for id in ids {
                j.chunks.remove(id);
                j.touched.remove(id);
            }
            Ok(())
        })
    }

    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        self.with(job, |j| {
            if pinned {
                j.pins.insert(step);
            } else {
                j.pins.remove(&step);
            }
            Ok(())
        })
    }

    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        self.with(job, |j| Ok(j.pins.clone()))
    }

    async fn now(&self, _job: &str) -> Result<std::time::SystemTime> {
        Ok(self.clock.now())
    }

    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        self.with(job, |j| {
            let mut v: Vec<ChunkInfo> = j
                .chunks
                .iter()
                .map(|(id, d)| ChunkInfo {
                    id: *id,
                    stored_len: Some(d.len() as u64),
                    touched: j.touched.get(id).copied(),
                })
                .collect();
            v.sort_unstable_by_key(|c| c.id);
            Ok(v)
        })
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.with(job, |j| {
            let records: Vec<CommitRecord> = j
                .records
                .range((step, 0)..=(step, u32::MAX))
                .filter_map(|(_, b)| CommitRecord::decode(b).ok())
                .collect();
            check_manifest_replace(step, rank, &records, bytes)?;
            j.manifests.insert((step, rank), bytes.to_vec());
            Ok(())
        })
    }

    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.with(job, |j| {
            j.manifests
                .get(&(step, rank))
                .cloned()
                .ok_or_else(|| StoreError::NotFound {
                    what: format!("manifest of rank {rank} at step {step}"),
                })
        })
    }

    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        let (first, bytes) = commit_slot(record)?;
        self.with(&record.job, |j| {
            match j.records.get(&(record.step, first)) {
                Some(existing) if *existing == bytes => Ok(()),
                Some(_) => Err(commit_conflict(record.step, first)),
                None => {
                    j.records.insert((record.step, first), bytes);
                    Ok(())
                }
            }
        })
    }

    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        self.with(job, |j| {
            let Some(bytes) = j.records.get(&(step, first)) else {
                return Ok(None);
            };
            let bad = |why: String| StoreError::Corrupt {
                what: format!("commit record of step {step} rank {first}"),
                source: strata_format::FormatError::malformed("commit record", why),
            };
            match CommitRecord::decode(bytes) {
                Ok(rec) if rec.step == step && rec.job == job => Ok(Some(rec)),
                Ok(_) => Err(bad("names another step or job".into())),
                Err(e) => Err(bad(e.to_string())),
            }
        })
    }

    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.with(job, |j| {
            let mut out: BTreeMap<u64, StepInfo> = BTreeMap::new();
            for (step, rank) in j.manifests.keys() {
                out.entry(*step)
                    .or_insert_with(|| StepInfo {
                        step: *step,
                        ..Default::default()
                    })
                    .manifests
                    .insert(*rank);
            }
            for ((step, rank), bytes) in &j.records {
                let info = out.entry(*step).or_insert_with(|| StepInfo {
                    step: *step,
                    ..Default::default()
                });
                match CommitRecord::decode(bytes) {
                    Ok(rec) if rec.step == *step && rec.job == job => {
                        info.records.insert(*rank, rec);
                    }
                    Ok(_) => {
                        info.unreadable
                            .insert(*rank, "names another step or job".into());
                    }
                    Err(e) => {
                        info.unreadable.insert(*rank, e.to_string());
                    }
                }
            }
            for (step, rank) in &j.retiring {
                out.entry(*step)
                    .or_insert_with(|| StepInfo {
                        step: *step,
                        ..Default::default()
                    })
                    .retiring
                    .insert(*rank);
            }
            Ok(out.into_values().collect())
        })
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.with(job, |j| {
            j.records.retain(|(s, _), _| *s != step);
            j.manifests.retain(|(s, _), _| *s != step);
            j.retiring.retain(|(s, _)| *s != step);
            Ok(())
        })
    }

    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        // One lock: the marker never shows (nothing can crash in between).
        self.with(job, |j| {
            j.records.remove(&(step, rank));
            j.manifests.remove(&(step, rank));
            j.retiring.remove(&(step, rank));
            Ok(())
        })
    }
}

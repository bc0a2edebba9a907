//! An in-memory [`ChunkStore`]: the reference implementation of the
//! contract, for tests and for embedding (nothing survives the process).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Mutex;

use async_trait::async_trait;
use strata_format::names::validate_job_id;
use strata_format::{ChunkId, CommitRecord};

use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::store::{
    commit_conflict, commit_slot, slice_range, verify, ChunkPut, ChunkStore, PutStats, StepInfo,
};

#[derive(Default)]
struct Job {
    chunks: HashMap<ChunkId, ChunkData>,
    manifests: BTreeMap<(u64, u32), Vec<u8>>,
    records: BTreeMap<(u64, u32), Vec<u8>>,
}

/// A tier in memory.
#[derive(Default)]
pub struct MemoryStore {
    jobs: Mutex<HashMap<String, Job>>,
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

    async fn put_chunks(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        self.with(job, |j| {
            let mut s = PutStats::default();
            for c in chunks {
                let len = c.data.len() as u64;
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
            }
            Ok(())
        })
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.with(job, |j| {
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
                let rec = CommitRecord::decode(bytes)?;
                out.entry(*step)
                    .or_insert_with(|| StepInfo {
                        step: *step,
                        ..Default::default()
                    })
                    .records
                    .insert(*rank, rec);
            }
            Ok(out.into_values().collect())
        })
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.with(job, |j| {
            j.records.retain(|(s, _), _| *s != step);
            j.manifests.retain(|(s, _), _| *s != step);
            Ok(())
        })
    }
}

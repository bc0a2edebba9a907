//! What a peer service holds: chunk frames in memory up to a byte budget,
//! then spilled to the service's own disk up to a second budget; shard
//! manifests and commit records per job; pins; retention through
//! `strata_gc` (children: `store.rs` the service's view of itself as a
//! store, `ledger.rs` what manifests and records cost, `reload.rs` the
//! spill directory's layout and what survives a restart, `retention.rs`
//! retention and pins, `expiry.rs` jobs no request named for a long time,
//! `tests.rs`).
//!
//! Frames are kept as the client sent them (any codec), after the service
//! decoded and verified each against its id, so a peer never holds or
//! serves a chunk whose bytes do not match its name. Spilled frames are
//! written to a temporary name and renamed, without fsync: replicas are
//! there to survive the loss of *another* node or of the training process.
//! Manifests, records and pins are written through to the spill disk; a
//! graceful stop keeps the frames in memory there too, and a restarted
//! service reloads and re-verifies everything (`reload.rs`), so a rolling
//! upgrade of the peer services keeps L2.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_format::frame::FrameDecoder;
use strata_format::names::validate_job_id;
use strata_format::{ChunkId, CommitRecord};
use strata_tiered::{ChunkStore, L1Store, Result, StepInfo, StoreError};

pub use expiry::{expiry_tick, Expired};
use ledger::{Kind, Ledger};
pub use reload::Reloaded;
mod expiry;
mod ledger;
mod reload;
mod retention;
mod store;
#[cfg(test)]
mod test_support;

/// Where a chunk's frame is.
enum Place {
    Memory(Bytes),
    /// In the spill file `<id>.<seq>` of this many bytes: each put writes
    /// a file of its own, so a delete (which unlinks outside the lock) and
    /// a put of the same id never touch one file.
    Disk {
        len: u64,
        seq: u64,
    },
}

struct Slot {
    place: Place,
    /// The chunk's raw length (what decoding it allocates).
    raw_len: u32,
    /// Last put or presence check: retention spares chunks touched within
    /// the grace period (a push in flight relies on them).
    touched: Instant,
}

/// Bytes and chunks held (or reserved) by one job, or by all.
#[derive(Clone, Copy, Default, Debug)]
struct Usage {
    memory: u64,
    disk: u64,
    chunks: u64,
}

#[derive(Default)]
struct Chunks {
    map: HashMap<(String, ChunkId), Slot>,
    /// Every job's together.
    all: Usage,
    /// Per job, kept as chunks come and go: no request or `/metrics`
    /// scrape walks the map.
    jobs: HashMap<String, Usage>,
}

impl Chunks {
    /// Reserves `len` bytes for `job`: in memory if the budget allows,
    /// else on disk; None if neither, or if the job's quota is spent.
    fn reserve(&mut self, job: &str, len: u64, limits: &Limits) -> Option<bool> {
        let mine = self.jobs.get(job).copied().unwrap_or_default();
        if mine.memory + mine.disk + len > limits.job_bytes {
            return None;
        }
        let to_memory = if self.all.memory + len <= limits.memory_bytes {
            true
        } else if self.all.disk + len <= limits.disk_bytes {
            false
        } else {
            return None;
        };
        self.add(job, len, to_memory, 0);
        Some(to_memory)
    }

    /// Adds (or, with `release`, takes back) `len` bytes and `chunks`.
    fn add(&mut self, job: &str, len: u64, memory: bool, chunks: u64) {
        let u = self.jobs.entry(job.to_string()).or_default();
        for x in [&mut self.all, u] {
            if memory {
                x.memory += len;
            } else {
                x.disk += len;
            }
            x.chunks += chunks;
        }
    }

    fn release(&mut self, job: &str, len: u64, memory: bool, chunks: u64) {
        for x in [Some(&mut self.all), self.jobs.get_mut(job)]
            .into_iter()
            .flatten()
        {
            if memory {
                x.memory = x.memory.saturating_sub(len);
            } else {
                x.disk = x.disk.saturating_sub(len);
            }
            x.chunks = x.chunks.saturating_sub(chunks);
        }
        if self
            .jobs
            .get(job)
            .is_some_and(|u| u.memory == 0 && u.disk == 0 && u.chunks == 0)
        {
            self.jobs.remove(job);
        }
    }
}

/// What a service holds for one job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobHeld {
    /// The job.
    pub job: String,
    /// Chunk bytes in memory.
    pub memory: u64,
    /// Chunk bytes on the spill disk.
    pub disk: u64,
    /// Chunks.
    pub chunks: u64,
    /// Manifest and commit record bytes (with their overhead).
    pub manifest_bytes: u64,
}

/// Budgets and retention of a service.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Chunk bytes kept in memory.
    pub memory_bytes: u64,
    /// Chunk bytes spilled to disk beyond that.
    pub disk_bytes: u64,
    /// Committed steps kept per job (older ones are retired on commit).
    pub keep_last: usize,
    /// Also keep every step divisible by this (0: none).
    pub keep_every: u64,
    /// Also keep steps committed within this long (by their records).
    pub keep_within: Option<Duration>,
    /// Chunks touched this recently are never swept.
    pub grace: Duration,
    /// Largest raw chunk a put may claim: a compressed frame is decoded to
    /// be verified, so this bounds what one put can make the service
    /// allocate (the service sets it from its largest request).
    pub max_chunk: u32,
    /// Manifest and commit record bytes held for all jobs (each counted
    /// with [`RECORD_OVERHEAD`] more, so empty ones are not free).
    pub manifest_bytes: u64,
    /// Chunk bytes (memory and disk) one job may hold: one job cannot
    /// take the budgets every job shares.
    pub job_bytes: u64,
    /// Manifest and record bytes one job may hold.
    pub job_manifest_bytes: u64,
    /// A job no request named for this long is expired: every step it
    /// has not pinned and every chunk only those steps name are dropped
    /// (`expiry.rs`). None (the default): never. Only where another tier
    /// (L3) holds every job's steps: a job whose node died keeps its
    /// newest steps only on the peers.
    pub job_idle: Option<Duration>,
}

/// What each manifest and record costs beyond its bytes (the service's
/// own bookkeeping of it): an empty one is not free.
pub const RECORD_OVERHEAD: u64 = 256;

impl Default for Limits {
    fn default() -> Self {
        // The peers' retention has one definition, shared with `strata gc`
        // and `strata peer serve`.
        let keep = strata_gc::Retention::l2();
        Limits {
            memory_bytes: 4 << 30,
            disk_bytes: 64 << 30,
            keep_last: keep.keep_last,
            keep_every: keep.keep_every,
            keep_within: keep.keep_within,
            grace: keep.grace,
            max_chunk: 64 << 20,
            manifest_bytes: 1 << 30,
            job_bytes: u64::MAX,
            job_manifest_bytes: u64::MAX,
            job_idle: None,
        }
    }
}

/// The replicas a service holds, for every job.
pub struct Replicas {
    /// The spill directory's lock, held while the replicas live.
    _lock: std::fs::File,
    /// Manifests, records and pins, on the spill disk (`<spill>/steps`).
    steps: L1Store,
    chunks: Mutex<Chunks>,
    manifests: Mutex<Ledger>,
    spill: PathBuf,
    limits: Limits,
    tmp_seq: AtomicU64,
    /// One pin change at a time (the count check and the insert).
    pin_lock: tokio::sync::Mutex<()>,
    /// The monotonic clock and the wall clock read together once: the
    /// service's wall time is derived from the monotonic clock, so a step
    /// of the host's clock never makes a fresh chunk look old.
    anchor: (Instant, std::time::SystemTime),
    /// Jobs whose retention is running, and whether another commit asked
    /// for it meanwhile (one retention per job at a time).
    retaining: Mutex<HashMap<String, bool>>,
    /// What the start found in the spill directory.
    reloaded: Reloaded,
    /// When a request last named each job, and the gate its requests
    /// hold while they run (`expiry.rs`).
    used: Mutex<HashMap<String, expiry::JobUse>>,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Replicas({})", self.spill.display())
    }
}

fn poisoned() -> StoreError {
    StoreError::Internal("replica lock poisoned".into())
}

impl Replicas {
    /// Replicas spilling to `spill`: what an earlier run of the service
    /// kept there is reloaded and verified ([`Self::reloaded`] says what
    /// was found); a directory in another layout is cleared.
    pub fn new(spill: &Path, limits: Limits) -> Result<Self> {
        let (lock, steps) = reload::open_layout(spill)?;
        let mut r = Replicas {
            _lock: lock,
            steps,
            chunks: Mutex::new(Chunks::default()),
            manifests: Mutex::new(Ledger::default()),
            spill: spill.to_path_buf(),
            limits,
            tmp_seq: AtomicU64::new(0),
            pin_lock: tokio::sync::Mutex::new(()),
            anchor: (Instant::now(), std::time::SystemTime::now()),
            retaining: Mutex::new(HashMap::new()),
            reloaded: Reloaded::default(),
            used: Mutex::new(HashMap::new()),
        };
        r.reloaded = r.reload()?;
        Ok(r)
    }

    /// What the start found in the spill directory.
    pub fn reloaded(&self) -> Reloaded {
        self.reloaded
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn file(&self, job: &str, id: &ChunkId, seq: u64) -> PathBuf {
        reload::chunk_root(&self.spill)
            .join(job)
            .join(format!("{}.{seq}", id.to_hex()))
    }

    /// Verifies `frame` is chunk `id`, then keeps it (idempotent). Returns
    /// whether it was new. Blocking (decodes; may write the spill file).
    pub fn put_chunk(&self, job: &str, id: ChunkId, frame: Bytes) -> Result<bool> {
        validate_job_id(job)?;
        let key = (job.to_string(), id);
        {
            let mut c = self.chunks.lock().map_err(|_| poisoned())?;
            if let Some(slot) = c.map.get_mut(&key) {
                slot.touched = Instant::now();
                return Ok(false);
            }
        }
        let raw_len = verify_frame(&id, &frame, self.limits.max_chunk)?;
        let len = frame.len() as u64;
        // Reserve the space first, so concurrent puts cannot overshoot.
        let to_memory = {
            let mut c = self.chunks.lock().map_err(|_| poisoned())?;
            if c.map.contains_key(&key) {
                return Ok(false);
            }
            c.reserve(job, len, &self.limits)
                .ok_or_else(|| StoreError::NoSpace {
                    op: "keeping a replica (the memory and disk budgets, or the job's quota, are full)",
                    path: self.spill.clone(),
                })?
        };
        let place = if to_memory {
            Place::Memory(frame)
        } else {
            match self.write_spill(job, &id, &frame) {
                Ok(seq) => Place::Disk { len, seq },
                Err(e) => {
                    if let Ok(mut c) = self.chunks.lock() {
                        c.release(job, len, false, 0);
                    }
                    return Err(e);
                }
            }
        };
        let mut c = self.chunks.lock().map_err(|_| poisoned())?;
        if c.map.contains_key(&key) {
            // Another put of the same chunk won; give the space back.
            match place {
                Place::Memory(_) => c.release(job, len, true, 0),
                Place::Disk { seq, .. } => {
                    c.release(job, len, false, 0);
                    drop(c);
                    let _ = std::fs::remove_file(self.file(job, &id, seq));
                }
            }
            return Ok(false);
        }
        c.add(job, 0, to_memory, 1);
        c.map.insert(
            key,
            Slot {
                place,
                raw_len,
                touched: Instant::now(),
            },
        );
        Ok(true)
    }

    /// Writes a spill file of its own for this put; returns its sequence.
    fn write_spill(&self, job: &str, id: &ChunkId, frame: &[u8]) -> Result<u64> {
        let dir = reload::chunk_root(&self.spill).join(job);
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("creating", &dir, e))?;
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".tmp-{n}"));
        std::fs::write(&tmp, frame).map_err(|e| StoreError::io("spilling", &tmp, e))?;
        let dst = self.file(job, id, n);
        std::fs::rename(&tmp, &dst).map_err(|e| StoreError::io("spilling", &dst, e))?;
        Ok(n)
    }

    /// The length of a chunk's spill file if it is spilled (reading it
    /// back allocates that much), else None.
    pub fn spilled_len(&self, job: &str, id: &ChunkId) -> Result<Option<u64>> {
        self.slot(job, id, |s| match s.place {
            Place::Disk { len, .. } => Some(len),
            Place::Memory(_) => None,
        })
    }

    /// The stored frame's length.
    pub fn stored_len(&self, job: &str, id: &ChunkId) -> Result<u64> {
        self.slot(job, id, |s| match &s.place {
            Place::Disk { len, .. } => *len,
            Place::Memory(b) => b.len() as u64,
        })
    }

    /// The chunk's raw length (what decoding it allocates).
    pub fn raw_len(&self, job: &str, id: &ChunkId) -> Result<u64> {
        self.slot(job, id, |s| u64::from(s.raw_len))
    }

    fn slot<T>(&self, job: &str, id: &ChunkId, f: impl FnOnce(&Slot) -> T) -> Result<T> {
        validate_job_id(job)?;
        let c = self.chunks.lock().map_err(|_| poisoned())?;
        c.map
            .get(&(job.to_string(), *id))
            .map(f)
            .ok_or_else(|| StoreError::NotFound {
                what: format!("chunk {id}"),
            })
    }

    /// The stored frame of a chunk. Blocking (may read the spill file).
    pub fn get_frame(&self, job: &str, id: &ChunkId) -> Result<Bytes> {
        validate_job_id(job)?;
        let disk_len = {
            let c = self.chunks.lock().map_err(|_| poisoned())?;
            match c.map.get(&(job.to_string(), *id)).map(|s| &s.place) {
                Some(Place::Memory(b)) => return Ok(b.clone()),
                Some(Place::Disk { len, seq }) => (*len, *seq),
                None => {
                    return Err(StoreError::NotFound {
                        what: format!("chunk {id}"),
                    })
                }
            }
        };
        let (disk_len, seq) = disk_len;
        let path = self.file(job, id, seq);
        let bytes = std::fs::read(&path).map_err(|e| StoreError::io("reading", &path, e))?;
        if bytes.len() as u64 != disk_len {
            return Err(StoreError::Corrupt {
                what: format!("spilled chunk {id}"),
                source: strata_format::FormatError::malformed(
                    "spill file",
                    format!("{} bytes, {disk_len} written", bytes.len()),
                ),
            });
        }
        Ok(Bytes::from(bytes))
    }

    /// Bytes `start..end` of a chunk, decoded and verified here.
    pub fn get_range(&self, job: &str, id: &ChunkId, start: u32, end: u32) -> Result<Vec<u8>> {
        let frame = self.get_frame(job, id)?;
        self.range_of_frame(id, &frame, start, end)
    }

    /// Bytes `start..end` of chunk `id` held as `frame`, decoded and
    /// verified. Blocking.
    pub fn range_of_frame(
        &self,
        id: &ChunkId,
        frame: &[u8],
        start: u32,
        end: u32,
    ) -> Result<Vec<u8>> {
        let what = || format!("chunk {id}");
        let mut dec = FrameDecoder::with_limit(self.limits.max_chunk).map_err(|source| {
            StoreError::Corrupt {
                what: what(),
                source,
            }
        })?;
        let (_, raw) = dec
            .decode(frame, Some(id))
            .map_err(|source| StoreError::Corrupt {
                what: what(),
                source,
            })?;
        raw.get(start as usize..end as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| {
                StoreError::invalid(
                    "chunk range",
                    format!("{start}..{end} outside chunk {id} of {} bytes", raw.len()),
                )
            })
    }

    /// Which ids are held (and marks them touched).
    pub fn has(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        validate_job_id(job)?;
        let mut c = self.chunks.lock().map_err(|_| poisoned())?;
        let now = Instant::now();
        Ok(ids
            .iter()
            .map(|id| match c.map.get_mut(&(job.to_string(), *id)) {
                Some(s) => {
                    s.touched = now;
                    true
                }
                None => false,
            })
            .collect())
    }

    /// Every chunk id held for `job`.
    pub fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        validate_job_id(job)?;
        let c = self.chunks.lock().map_err(|_| poisoned())?;
        Ok(c.map
            .keys()
            .filter(|(j, _)| j == job)
            .map(|(_, id)| *id)
            .collect())
    }

    /// The ids held for `job` after `after`, ascending, at most `limit`.
    pub fn list_chunks_page(
        &self,
        job: &str,
        after: Option<ChunkId>,
        limit: usize,
    ) -> Result<Vec<ChunkId>> {
        let mut ids = self.list_chunks(job)?;
        if let Some(a) = after {
            ids.retain(|id| *id > a);
        }
        ids.sort_unstable();
        ids.truncate(limit);
        Ok(ids)
    }

    /// Deletes chunks (absent ones are fine).
    pub fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.delete_where(job, ids, |_| true).map(|_| ())
    }

    /// Deletes the chunks of `ids` not touched (put or found present)
    /// after `cutoff`, re-checked under the lock at deletion time: a chunk
    /// a client deduplicated against after retention planned its sweep
    /// survives. Returns how many were deleted and their stored bytes.
    pub fn delete_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: Instant,
    ) -> Result<(u64, u64)> {
        self.delete_where(job, ids, |slot| slot.touched <= cutoff)
    }

    /// Deletes the chunks of `ids` whose slot passes `doomed`, then their
    /// spill files (outside the lock: every put writes a file of its own,
    /// so a put of the same id meanwhile keeps its file). Returns how many
    /// went and their stored bytes.
    fn delete_where(
        &self,
        job: &str,
        ids: &[ChunkId],
        doomed: impl Fn(&Slot) -> bool,
    ) -> Result<(u64, u64)> {
        validate_job_id(job)?;
        let (mut n, mut bytes) = (0, 0);
        let mut files = Vec::new();
        {
            let mut c = self.chunks.lock().map_err(|_| poisoned())?;
            for id in ids {
                let key = (job.to_string(), *id);
                if !c.map.get(&key).is_some_and(&doomed) {
                    continue;
                }
                if let Some(slot) = c.map.remove(&key) {
                    n += 1;
                    match slot.place {
                        Place::Memory(b) => {
                            c.release(job, b.len() as u64, true, 1);
                            bytes += b.len() as u64;
                        }
                        Place::Disk { len, seq } => {
                            c.release(job, len, false, 1);
                            bytes += len;
                            files.push(self.file(job, id, seq));
                        }
                    }
                }
            }
        }
        for f in files {
            let _ = std::fs::remove_file(f);
        }
        Ok((n, bytes))
    }

    /// Stores a manifest (opaque bytes, as for every `ChunkStore`) within
    /// the manifest budget and the job's quota.
    pub async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        validate_job_id(job)?;
        let key = (step, Kind::Manifest, rank);
        let old = self.charge(job, key, bytes.len() as u64)?;
        let put = self.steps.put_manifest(job, step, rank, bytes).await;
        if put.is_err() {
            // Not stored: the accounting goes back to what is held.
            self.manifests
                .lock()
                .map_err(|_| poisoned())?
                .restore(job, key, old);
        }
        put
    }

    fn charge(&self, job: &str, key: (u64, Kind, u32), len: u64) -> Result<Option<u64>> {
        self.manifests.lock().map_err(|_| poisoned())?.charge(
            job,
            key,
            len,
            self.limits.manifest_bytes,
            self.limits.job_manifest_bytes,
            &self.spill,
        )
    }

    /// What the manifest of `(step, rank)` costs (its bytes and the
    /// overhead; 0 if absent).
    pub fn held_len(&self, job: &str, step: u64, rank: u32) -> Result<u64> {
        Ok(self
            .manifests
            .lock()
            .map_err(|_| poisoned())?
            .cost(job, (step, Kind::Manifest, rank)))
    }

    /// What every manifest and record of `job` costs together.
    pub fn job_held_bytes(&self, job: &str) -> Result<u64> {
        Ok(self
            .manifests
            .lock()
            .map_err(|_| poisoned())?
            .job_total(job))
    }

    /// Manifest bytes held (all jobs).
    pub fn manifest_bytes(&self) -> Result<u64> {
        Ok(self.manifests.lock().map_err(|_| poisoned())?.total())
    }

    /// Reads a manifest.
    pub async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.steps.get_manifest(job, step, rank).await
    }

    /// Steps with their manifests and records.
    pub async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.steps.list_steps(job).await
    }

    /// Deletes a step's manifests and records.
    pub async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.steps.delete_step(job, step).await?;
        self.manifests
            .lock()
            .map_err(|_| poisoned())?
            .remove_where(job, |&(s, _, _)| s == step);
        Ok(())
    }

    /// Retires one rank's shard of a step (record, then manifest).
    pub async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.steps.delete_shard(job, step, rank).await?;
        self.manifests
            .lock()
            .map_err(|_| poisoned())?
            .remove_where(job, |&(s, _, r)| s == step && r == rank);
        Ok(())
    }

    /// The service's wall time: the anchor's, moved by the monotonic clock.
    pub(crate) fn wall_now(&self) -> std::time::SystemTime {
        self.wall_of(Instant::now())
    }

    /// Monotonic instant `t` on the service's wall clock.
    pub(crate) fn wall_of(&self, t: Instant) -> std::time::SystemTime {
        let (mono, wall) = self.anchor;
        match t.checked_duration_since(mono) {
            Some(d) => wall + d,
            None => wall - mono.duration_since(t),
        }
    }

    /// The monotonic instant of the service's wall time `w` (None: before
    /// the service started, older than anything it holds).
    pub(crate) fn instant_of(&self, w: std::time::SystemTime) -> Option<Instant> {
        let (mono, wall) = self.anchor;
        match w.duration_since(wall) {
            Ok(d) => mono.checked_add(d),
            Err(_) => None,
        }
    }

    /// Writes a commit record (create-only), nothing else.
    /// Within the manifest budget and the job's quota, like manifests.
    pub(crate) async fn commit_record(&self, record: &CommitRecord) -> Result<()> {
        let first = record.shards.first().map_or(0, |s| s.rank);
        let key = (record.step, Kind::Record, first);
        let len = record
            .encode()
            .map_err(|e| StoreError::invalid("commit record", e.to_string()))?
            .len() as u64;
        let old = self.charge(&record.job, key, len)?;
        let done = self.steps.commit(record).await;
        if done.is_err() {
            self.manifests
                .lock()
                .map_err(|_| poisoned())?
                .restore(&record.job, key, old);
        }
        done
    }

    /// Every chunk of `job` with its stored length and when it was last
    /// put or found present.
    pub(crate) fn chunk_ages(&self, job: &str) -> Result<Vec<(ChunkId, u64, Instant)>> {
        validate_job_id(job)?;
        let c = self.chunks.lock().map_err(|_| poisoned())?;
        Ok(c.map
            .iter()
            .filter(|((j, _), _)| j == job)
            .map(|((_, id), slot)| {
                let len = match &slot.place {
                    Place::Memory(b) => b.len() as u64,
                    Place::Disk { len, .. } => *len,
                };
                (*id, len, slot.touched)
            })
            .collect())
    }

    /// (bytes in memory, bytes on disk, chunks, jobs).
    /// O(1): the counters are kept as chunks come and go (reservations
    /// of puts in progress included).
    pub fn stats(&self) -> Result<(u64, u64, u64, u64)> {
        let c = self.chunks.lock().map_err(|_| poisoned())?;
        Ok((c.all.memory, c.all.disk, c.all.chunks, c.jobs.len() as u64))
    }

    /// Every job with chunks or manifests held, by job.
    pub fn jobs(&self) -> Result<Vec<JobHeld>> {
        let mut out: BTreeMap<String, JobHeld> = {
            let c = self.chunks.lock().map_err(|_| poisoned())?;
            c.jobs
                .iter()
                .map(|(j, u)| {
                    let held = JobHeld {
                        job: j.clone(),
                        memory: u.memory,
                        disk: u.disk,
                        chunks: u.chunks,
                        manifest_bytes: 0,
                    };
                    (j.clone(), held)
                })
                .collect()
        };
        let m = self.manifests.lock().map_err(|_| poisoned())?;
        for (job, bytes) in m.jobs() {
            out.entry(job.to_string())
                .or_insert_with(|| JobHeld {
                    job: job.to_string(),
                    ..JobHeld::default()
                })
                .manifest_bytes = bytes;
        }
        Ok(out.into_values().collect())
    }

    /// (bytes in memory, bytes on disk, chunks) held for one job. O(1).
    pub fn job_stats(&self, job: &str) -> Result<(u64, u64, u64)> {
        let c = self.chunks.lock().map_err(|_| poisoned())?;
        let u = c.jobs.get(job).copied().unwrap_or_default();
        Ok((u.memory, u.disk, u.chunks))
    }
}

/// Checks `frame` is chunk `id`: a raw frame (what clients send by
/// default) is hashed in place, others are decoded into a buffer freed on
/// return.
fn verify_frame(id: &ChunkId, frame: &[u8], max_chunk: u32) -> Result<u32> {
    let corrupt = |source| StoreError::Corrupt {
        what: format!("chunk {id} sent by a client"),
        source,
    };
    let mut dec = FrameDecoder::with_limit(max_chunk).map_err(corrupt)?;
    let h = dec
        .verify(frame, Some(id), &mut Vec::new())
        .map_err(corrupt)?;
    Ok(h.raw_len)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

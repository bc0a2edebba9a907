//! L1: a content-addressed chunk store on the node's local disk.
//!
//! ```text
//! <root>/<job>/chunks/<first byte, 2 hex>/<64 hex>     raw chunk bytes
//! <root>/<job>/steps/<step, 20 digits>/m-<rank>        encoded shard manifest
//! <root>/<job>/steps/<step, 20 digits>/c-<rank>        commit record (named by its first rank)
//! <root>/<job>/steps/<step, 20 digits>/r-<rank>        retiring marker (a shard being deleted)
//! <root>/<job>/tmp/                                    files being written
//! ```
//!
//! Chunks are written with the configured [`IoEngine`] (io_uring or
//! pread/pwrite, O_DIRECT, fdatasync) under a temporary name, then given
//! their final name with `renameat2(RENAME_NOREPLACE)`: a chunk that is
//! already there (from an earlier step, or another rank racing on the same
//! bytes) counts as deduplicated. The fan-out directories are created and
//! fsynced once per job; each batch fsyncs the directories it renamed into
//! before returning, so a chunk reported durable is durable by name too.
//! L1 stores chunks raw: the disk is faster than any codec.
//!
//! A dedup hit refreshes the chunk's modification time, so garbage collection
//! with a grace period never deletes a chunk that a save in flight relies on;
//! it then checks that the file it refreshed still bears the chunk's name
//! (same device and inode), since a sweep may have moved it aside before
//! the refresh, and writes the chunk again if not.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use strata_format::frame::MAX_CHUNK_LEN;
use strata_format::names::validate_job_id;
use strata_format::{ChunkId, CommitRecord};

use crate::aligned::AlignedBuf;
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::fsutil::{create_dir_durably, fsync_dir, process_token, rename_noreplace};
use crate::io::{open_engine, EngineChoice, IoEngine, ReadReq, WriteReq};
use crate::store::{PutOptions, ReadOptions};
#[cfg(test)]
mod race_tests;
mod steps;
use steps::read_dir_or_gone;
mod sweep;
use sweep::is_old;
#[cfg(test)]
use sweep::Pause;

use crate::store::{slice_range, verify, ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};

/// Temporary files older than this, found when a job is opened, are left
/// over from a crash and removed.
const STALE_TMP_SECS: u64 = 3600;
/// Largest commit record read back.
const MAX_RECORD_LEN: usize = 1 << 26;

/// L1 on a local directory.
#[derive(Clone)]
pub struct L1Store {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    engine: Arc<dyn IoEngine>,
    ready: Mutex<HashSet<String>>,
    /// Where a test stops a put or a sweep to drive one interleaving of
    /// the two (see [`race_tests`]).
    #[cfg(test)]
    pause: Mutex<Option<sweep::PauseHook>>,
}

impl std::fmt::Debug for L1Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "L1Store({}, {})",
            self.inner.root.display(),
            self.inner.engine.name()
        )
    }
}

fn step_dir_name(step: u64) -> String {
    format!("{step:020}")
}

impl L1Store {
    /// Opens (creating if needed) an L1 store under `root` with the chosen
    /// I/O engine.
    pub fn open(root: impl Into<PathBuf>, engine: EngineChoice) -> Result<Self> {
        let root = root.into();
        create_dir_durably(&root)?;
        let engine = open_engine(engine)
            .map_err(|e| StoreError::io("starting the I/O engine for", &root, e))?;
        Ok(Self::with_engine(root, engine))
    }

    /// An L1 store on an engine the caller built (shared between stores).
    pub fn with_engine(root: PathBuf, engine: Arc<dyn IoEngine>) -> Self {
        L1Store {
            inner: Arc::new(Inner {
                root,
                engine,
                ready: Mutex::new(HashSet::new()),
                #[cfg(test)]
                pause: Mutex::new(None),
            }),
        }
    }

    /// The I/O engine in use ("io_uring" or "psync").
    pub fn engine_name(&self) -> &'static str {
        self.inner.engine.name()
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Where chunk `id` of `job` lives (for tests and repair tools).
    pub fn chunk_path(&self, job: &str, id: &ChunkId) -> PathBuf {
        self.inner.chunk_path(job, id)
    }

    /// Where a rank's manifest for a step lives.
    pub fn manifest_path(&self, job: &str, step: u64, rank: u32) -> PathBuf {
        self.inner.step_dir(job, step).join(format!("m-{rank}"))
    }

    /// Deletes the job's chunk files that are not in `keep` and were not
    /// written or deduplicated against within `grace` (a save in flight
    /// refreshes the time of every chunk it relies on). Returns the number
    /// of chunks and bytes deleted.
    pub async fn sweep(
        &self,
        job: &str,
        keep: std::collections::HashSet<ChunkId>,
        grace: std::time::Duration,
    ) -> Result<(u64, u64)> {
        let cutoff = std::time::SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(std::time::UNIX_EPOCH);
        let job = job.to_string();
        self.run(move |i| {
            let candidates: Vec<ChunkId> = i
                .chunk_info(&job)?
                .into_iter()
                .filter(|c| !keep.contains(&c.id) && is_old(c.touched, cutoff))
                .map(|c| c.id)
                .collect();
            i.delete_untouched(&job, &candidates, cutoff)
        })
        .await
    }

    /// Reads `ids` on a blocking thread, hashing each when `hash`.
    async fn read_chunks(
        &self,
        job: &str,
        ids: &[ChunkId],
        spare: Vec<AlignedBuf>,
        hash: bool,
    ) -> Vec<Result<ChunkData>> {
        let (job, ids2) = (job.to_string(), ids.to_vec());
        let n = ids.len();
        match self
            .run(move |i| Ok(i.get_chunks(&job, &ids2, spare, hash)))
            .await
        {
            Ok(v) => v,
            Err(e) => {
                let msg = e.to_string();
                (0..n)
                    .map(|_| Err(StoreError::Internal(msg.clone())))
                    .collect()
            }
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| StoreError::Internal(format!("L1 task failed: {e}")))?
    }
}

impl Inner {
    fn job_dir(&self, job: &str) -> PathBuf {
        self.root.join(job)
    }

    fn chunk_path(&self, job: &str, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.job_dir(job).join("chunks").join(&hex[..2]).join(hex)
    }

    fn step_dir(&self, job: &str, step: u64) -> PathBuf {
        self.job_dir(job).join("steps").join(step_dir_name(step))
    }

    fn tmp_path(&self, job: &str, what: &str) -> PathBuf {
        // A random token per process plus a process-wide counter: several
        // stores on one directory (ranks on threads) never pick the same
        // name, nor do processes in separate PID namespaces sharing the
        // directory (two containers' pid 1). Temporary files are removed
        // only by their writer, or once older than `STALE_TMP_SECS`.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        self.job_dir(job)
            .join("tmp")
            .join(format!("{}-{n}-{what}", process_token()))
    }

    /// Creates the job's directories once (256 fan-out directories, steps,
    /// tmp), fsynced, and clears stale temporary files.
    fn ensure_job(&self, job: &str) -> Result<()> {
        validate_job_id(job)?;
        if self.ready.lock().map(|r| r.contains(job)).unwrap_or(false) {
            return Ok(());
        }
        let dir = self.job_dir(job);
        let chunks = dir.join("chunks");
        for sub in [&dir, &chunks, &dir.join("steps"), &dir.join("tmp")] {
            std::fs::create_dir_all(sub).map_err(|e| StoreError::io("creating", sub, e))?;
        }
        for b in 0..=255u8 {
            let d = chunks.join(format!("{b:02x}"));
            std::fs::create_dir_all(&d).map_err(|e| StoreError::io("creating", &d, e))?;
        }
        for d in [&chunks, &dir, &self.root] {
            fsync_dir(d)?;
        }
        self.clear_stale_tmp(job);
        if let Ok(mut r) = self.ready.lock() {
            r.insert(job.to_string());
        }
        Ok(())
    }

    fn clear_stale_tmp(&self, job: &str) {
        let Ok(entries) = std::fs::read_dir(self.job_dir(job).join("tmp")) else {
            return;
        };
        let now = std::time::SystemTime::now();
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age.as_secs() > STALE_TMP_SECS);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    fn put_chunks(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        self.ensure_job(job)?;
        let mut stats = PutStats::default();
        let mut seen = HashSet::new();
        let mut writes = Vec::new();
        let mut finals = Vec::new();
        let mut dirs = HashSet::new();
        for c in chunks {
            if c.data.len() > MAX_CHUNK_LEN as usize {
                return Err(StoreError::invalid(
                    "chunk",
                    format!("{} bytes exceeds {MAX_CHUNK_LEN}", c.data.len()),
                ));
            }
            let path = self.chunk_path(job, &c.id);
            if !seen.insert(c.id) {
                stats.deduped += 1;
                stats.bytes_deduped += c.data.len() as u64;
                continue;
            }
            if self.touch_if_whole(&path, c.data.len() as u64)? {
                stats.deduped += 1;
                stats.bytes_deduped += c.data.len() as u64;
                // Its name may not be durable yet (a writer killed between
                // its rename and its directory's fsync): this save relies
                // on it, so the batch fsyncs its directory too.
                if let Some(d) = path.parent() {
                    dirs.insert(d.to_path_buf());
                }
                continue;
            }
            let tmp = self.tmp_path(job, &c.id.to_hex());
            finals.push((tmp.clone(), path, c.data.len() as u64));
            writes.push(WriteReq {
                path: tmp,
                data: c.data,
            });
        }
        let results = self.engine.write_files(writes);
        let mut first_err = None;
        for ((tmp, path, len), res) in finals.into_iter().zip(results) {
            if let Err(e) = res {
                let _ = std::fs::remove_file(&tmp);
                first_err.get_or_insert(StoreError::io("writing chunk", &path, e));
                continue;
            }
            if first_err.is_some() {
                let _ = std::fs::remove_file(&tmp);
                continue;
            }
            if rename_noreplace(&tmp, &path)? {
                stats.written += 1;
                stats.bytes_written += len;
                stats.bytes_stored += len;
                if let Some(d) = path.parent() {
                    dirs.insert(d.to_path_buf());
                }
            } else if self.touch_if_whole(&path, len)? {
                // Another writer got there first with the same bytes.
                let _ = std::fs::remove_file(&tmp);
                stats.deduped += 1;
                stats.bytes_deduped += len;
                if let Some(d) = path.parent() {
                    dirs.insert(d.to_path_buf());
                }
            } else {
                // A short file under the name (a crash's leftover), or a
                // file a sweep moved away meanwhile: the whole chunk
                // takes the name.
                std::fs::rename(&tmp, &path).map_err(|e| StoreError::io("replacing", &path, e))?;
                stats.written += 1;
                stats.bytes_written += len;
                stats.bytes_stored += len;
                if let Some(d) = path.parent() {
                    dirs.insert(d.to_path_buf());
                }
            }
        }
        for d in &dirs {
            fsync_dir(d)?;
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }

    fn get_chunks(
        &self,
        job: &str,
        ids: &[ChunkId],
        spare: Vec<crate::AlignedBuf>,
        hash: bool,
    ) -> Vec<Result<ChunkData>> {
        if let Err(e) = validate_job_id(job) {
            return ids.iter().map(|_| Err(e.clone().into())).collect();
        }
        let mut spare = spare.into_iter();
        let reqs = ids
            .iter()
            .map(|id| ReadReq {
                path: self.chunk_path(job, id),
                max_len: MAX_CHUNK_LEN as usize,
                buf: spare.next(),
            })
            .collect();
        let mut got = self.engine.read_files(reqs);
        self.read_again_if_aside(job, ids, &mut got);
        let read: Vec<(std::io::Result<crate::AlignedBuf>, &ChunkId)> =
            got.into_iter().zip(ids).collect();
        // Verification (BLAKE3 of every byte) is the CPU-heavy part of a
        // restore: spread it over the cores.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(read.len().max(1));
        let per = read.len().div_ceil(threads);
        let mut slots: Vec<Option<(std::io::Result<crate::AlignedBuf>, &ChunkId)>> =
            read.into_iter().map(Some).collect();
        let mut out: Vec<Option<Result<ChunkData>>> = (0..slots.len()).map(|_| None).collect();
        std::thread::scope(|s| {
            for (ins, outs) in slots.chunks_mut(per.max(1)).zip(out.chunks_mut(per.max(1))) {
                s.spawn(move || {
                    for (slot, o) in ins.iter_mut().zip(outs.iter_mut()) {
                        if let Some((res, id)) = slot.take() {
                            *o = Some(self.check_read(job, id, res, hash));
                        }
                    }
                });
            }
        });
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Err(StoreError::Internal("verification thread failed".into())))
            })
            .collect()
    }

    /// Reads again the chunks found missing: a sweep (of this process or
    /// another rank's) moves a chunk aside for an instant to check its age
    /// and puts it back when it is young (`sweep.rs`), so a read in that
    /// window finds no file although the chunk stays. Each round lists the
    /// chunks held aside in this job (their ids are in the aside names),
    /// then reads the missing ones again: a chunk put back before the
    /// listing is found by the read after it, and one still aside is waited
    /// for (1 to 64 ms between rounds, about 130 ms at most). A chunk is
    /// missing once two rounds in a row found it neither at its name nor
    /// aside; with no sweep at work that costs two listings and two opens.
    fn read_again_if_aside(
        &self,
        job: &str,
        ids: &[ChunkId],
        got: &mut [std::io::Result<crate::AlignedBuf>],
    ) {
        const PAUSES_MS: [u64; 8] = [1, 1, 2, 4, 8, 16, 32, 64];
        let mut calm = 0;
        let mut waits = 0;
        loop {
            let missing: Vec<usize> = got
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    r.as_ref()
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                })
                .map(|(i, _)| i)
                .collect();
            if missing.is_empty() || calm == 2 {
                return;
            }
            let aside = self.held_aside(job);
            if missing.iter().any(|&i| aside.contains(&ids[i])) {
                calm = 0;
                let Some(ms) = PAUSES_MS.get(waits) else {
                    return;
                };
                waits += 1;
                self.pause(sweep::Pause::ReadAgain);
                std::thread::sleep(std::time::Duration::from_millis(*ms));
            } else {
                calm += 1;
            }
            let reqs = missing
                .iter()
                .map(|&i| ReadReq {
                    path: self.chunk_path(job, &ids[i]),
                    max_len: MAX_CHUNK_LEN as usize,
                    buf: None,
                })
                .collect();
            for (i, r) in missing.into_iter().zip(self.engine.read_files(reqs)) {
                got[i] = r;
            }
        }
    }

    /// The chunks of `job` a sweep holds aside now (the ids in their
    /// temporary `...-doomed-<id>` names).
    fn held_aside(&self, job: &str) -> std::collections::HashSet<ChunkId> {
        let Ok(dir) = std::fs::read_dir(self.job_dir(job).join("tmp")) else {
            return Default::default();
        };
        dir.flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                let (_, hex) = name.rsplit_once(sweep::ASIDE)?;
                ChunkId::from_hex(hex).ok()
            })
            .collect()
    }

    fn check_read(
        &self,
        job: &str,
        id: &ChunkId,
        res: std::io::Result<crate::AlignedBuf>,
        hash: bool,
    ) -> Result<ChunkData> {
        let path = self.chunk_path(job, id);
        let buf = res.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::NotFound {
                what: format!("chunk {id}"),
            },
            std::io::ErrorKind::InvalidData => StoreError::Corrupt {
                what: format!("chunk {id} ({})", path.display()),
                source: strata_format::FormatError::TooLarge {
                    what: "chunk file",
                    value: u64::MAX,
                    limit: u64::from(MAX_CHUNK_LEN),
                },
            },
            _ => StoreError::io("reading chunk", &path, e),
        })?;
        if hash {
            verify(id, &buf, || {
                format!("chunk {id} in L1 ({})", path.display())
            })?;
        }
        Ok(ChunkData::whole(buf))
    }

    fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        Ok(self
            .chunk_sizes(job)?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    }

    fn chunk_sizes(&self, job: &str) -> Result<Vec<(ChunkId, u64)>> {
        Ok(self
            .chunk_info(job)?
            .into_iter()
            .map(|c| (c.id, c.stored_len.unwrap_or(0)))
            .collect())
    }

    /// Every chunk file with its size and modification time. Any error but
    /// a file or directory vanishing meanwhile fails the listing: garbage
    /// collection must never take a partial listing for the whole.
    fn chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        validate_job_id(job)?;
        let chunks = self.job_dir(job).join("chunks");
        let mut out = Vec::new();
        let Some(fan) = read_dir_or_gone(&chunks)? else {
            return Ok(out);
        };
        for d in fan {
            let d = d.map_err(|e| StoreError::io("listing", &chunks, e))?;
            let dir = d.path();
            let Some(files) = read_dir_or_gone(&dir)? else {
                continue;
            };
            for f in files {
                let f = f.map_err(|e| StoreError::io("listing", &dir, e))?;
                let Some(id) = f
                    .file_name()
                    .to_str()
                    .and_then(|n| ChunkId::from_hex(n).ok())
                else {
                    continue;
                };
                let meta = match f.metadata() {
                    Ok(m) => m,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(StoreError::io("reading the size of", f.path(), e)),
                };
                out.push(ChunkInfo {
                    id,
                    stored_len: Some(meta.len()),
                    touched: meta.modified().ok(),
                });
            }
        }
        out.sort_unstable_by_key(|c| c.id);
        Ok(out)
    }

    fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        validate_job_id(job)?;
        let mut dirs = HashSet::new();
        for id in ids {
            let p = self.chunk_path(job, id);
            match std::fs::remove_file(&p) {
                Ok(()) => {
                    if let Some(d) = p.parent() {
                        dirs.insert(d.to_path_buf());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("deleting chunk", &p, e)),
            }
        }
        for d in &dirs {
            fsync_dir(d)?;
        }
        Ok(())
    }
}

#[async_trait]
impl ChunkStore for L1Store {
    fn name(&self) -> &str {
        "l1"
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        let _ = opts; // L1 checks each id as it writes: nothing to skip.
        let job = job.to_string();
        self.run(move |i| i.put_chunks(&job, chunks)).await
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        self.read_chunks(job, ids, opts.spare, !opts.unverified)
            .await
    }

    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let (job, id2) = (job.to_string(), *id);
        let data = self
            .run(move |i| {
                i.get_chunks(&job, &[id2], Vec::new(), true)
                    .pop()
                    .unwrap_or_else(|| Err(StoreError::Internal("no result".into())))
            })
            .await?;
        slice_range(id, data, range)
    }

    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let (job, ids) = (job.to_string(), ids.to_vec());
        self.run(move |i| {
            validate_job_id(&job)?;
            // A chunk file left empty by a crash (written, renamed, never
            // synced) is not the chunk: only the empty chunk may be empty.
            let empty = ChunkId::of(&[]);
            Ok(ids
                .iter()
                .map(|id| {
                    std::fs::metadata(i.chunk_path(&job, id))
                        .is_ok_and(|m| m.is_file() && (m.len() > 0 || *id == empty))
                })
                .collect())
        })
        .await
    }

    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        let job = job.to_string();
        self.run(move |i| i.list_chunks(&job)).await
    }

    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        let (job, ids) = (job.to_string(), ids.to_vec());
        self.run(move |i| i.delete_chunks(&job, &ids)).await
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        let (job, bytes) = (job.to_string(), bytes.to_vec());
        self.run(move |i| i.put_manifest(&job, step, rank, &bytes))
            .await
    }

    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        let job = job.to_string();
        self.run(move |i| i.get_manifest(&job, step, rank)).await
    }

    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        let record = record.clone();
        self.run(move |i| i.commit(&record)).await
    }

    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        let job = job.to_string();
        self.run(move |i| i.list_steps(&job)).await
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        let job = job.to_string();
        self.run(move |i| i.delete_step(&job, step)).await
    }

    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        let job = job.to_string();
        self.run(move |i| i.delete_shard(&job, step, rank)).await
    }

    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        let job = job.to_string();
        self.run(move |i| i.chunk_info(&job)).await
    }

    /// A pin is an empty file `<job>/pins/<step, 20 digits>`, synced.
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        validate_job_id(job)?;
        let job = job.to_string();
        self.run(move |i| {
            let dir = i.job_dir(&job).join("pins");
            let file = dir.join(format!("{step:020}"));
            if pinned {
                std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("creating", &dir, e))?;
                std::fs::File::create(&file)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| StoreError::io("writing", &file, e))?;
            } else {
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(StoreError::io("removing", &file, e)),
                }
            }
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| StoreError::io("syncing", &dir, e))
        })
        .await
    }

    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        validate_job_id(job)?;
        let job = job.to_string();
        self.run(move |i| {
            let dir = i.job_dir(&job).join("pins");
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(std::collections::BTreeSet::new())
                }
                Err(e) => return Err(StoreError::io("listing", &dir, e)),
            };
            let mut out = std::collections::BTreeSet::new();
            for e in entries {
                let e = e.map_err(|e| StoreError::io("listing", &dir, e))?;
                // Names that are not steps are not pins (nothing else is
                // written there).
                if let Some(step) = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
                    out.insert(step);
                }
            }
            Ok(out)
        })
        .await
    }

    /// The file system's time: a marker file rewritten now and its
    /// modification time read back (on a shared file system, the server's
    /// clock, which stamps every chunk file).
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        validate_job_id(job)?;
        let job = job.to_string();
        self.run(move |i| {
            let dir = i.job_dir(&job).join("tmp");
            std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("creating", &dir, e))?;
            let marker = dir.join("clock");
            std::fs::write(&marker, b"").map_err(|e| StoreError::io("writing", &marker, e))?;
            std::fs::metadata(&marker)
                .and_then(|m| m.modified())
                .map_err(|e| StoreError::io("reading the time of", &marker, e))
        })
        .await
    }

    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        let (job, ids) = (job.to_string(), ids.to_vec());
        self.run(move |i| i.delete_untouched(&job, &ids, cutoff))
            .await
    }

    fn describe(&self) -> String {
        format!("{} ({})", self.inner.root.display(), self.engine_name())
    }
}

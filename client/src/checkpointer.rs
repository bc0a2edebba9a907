//! [`Checkpointer`]: async save to L1 and verified restore.
//!
//! `save` copies the state into a pre-faulted staging buffer, laid out chunk
//! by chunk at aligned offsets, and returns a [`SaveHandle`] at once: the
//! caller may overwrite its tensors right away. A persist worker thread then
//! hashes the chunks on a bounded pool of CPU threads, writes the new ones to
//! L1 straight from the staging buffer (O_DIRECT, no copy), writes the shard
//! manifest, waits for every rank at a barrier, writes the commit record,
//! and applies retention. The async runtime only drives tier calls; CPU work
//! never runs on its threads.

use std::collections::{BTreeMap, HashSet};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use strata_format::layout::Layout;
use strata_format::{ChunkId, CommitRecord, EntrySpec, ShardInfo, ShardManifest, ShardRef};
use strata_tiered::aligned::align_up;
use strata_tiered::{AlignedBuf, ChunkData, ChunkPut, ChunkStore, L1Store};

use crate::config::{BusyPolicy, Config};
use crate::coordinator::{Coordinator, SoloCoordinator};
use crate::error::{Error, Result};
use crate::gpu::{DeviceBytes, Gpu};
use crate::par::par_map;
use crate::staging::StagingPool;
use crate::state::Entry;
use crate::stats::SaveStats;

/// The outcome slot shared by a save's handle and the worker.
struct Completion {
    slot: Mutex<(bool, Option<Result<SaveStats>>)>,
    cv: Condvar,
    /// Wakes async waiters (any executor: it only uses wakers).
    notify: tokio::sync::Notify,
}

impl Completion {
    fn new() -> Arc<Self> {
        Arc::new(Completion {
            slot: Mutex::new((false, None)),
            cv: Condvar::new(),
            notify: tokio::sync::Notify::new(),
        })
    }

    fn finish(&self, r: Result<SaveStats>) {
        if let Ok(mut s) = self.slot.lock() {
            *s = (true, Some(r));
        }
        self.cv.notify_all();
        self.notify.notify_waiters();
    }

    fn wait_done(&self) {
        if let Ok(mut s) = self.slot.lock() {
            while !s.0 {
                match self.cv.wait(s) {
                    Ok(g) => s = g,
                    Err(_) => return,
                }
            }
        }
    }

    fn is_done(&self) -> bool {
        self.slot.lock().map(|s| s.0).unwrap_or(true)
    }
}

/// A save in progress. Dropping it does not cancel the save.
pub struct SaveHandle {
    step: u64,
    stall: Duration,
    done: Arc<Completion>,
}

impl SaveHandle {
    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// How long `save` blocked the caller.
    pub fn stall(&self) -> Duration {
        self.stall
    }

    /// True once the step is durable (or failed).
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }

    /// Resolves when the step is durable and committed on L1, like
    /// [`Self::wait`] without blocking a thread: for async training loops.
    /// Works on any executor.
    pub async fn durable(&self) -> Result<SaveStats> {
        loop {
            let notified = self.done.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Register before checking, so a finish in between is not missed.
            notified.as_mut().enable();
            if self.done.is_done() {
                return self.wait();
            }
            notified.await;
        }
    }

    /// Blocks until the step is durable and committed on L1, and returns its
    /// counters. The first call gets the typed error of a failed save; later
    /// calls get [`Error::Pipeline`].
    pub fn wait(&self) -> Result<SaveStats> {
        self.done.wait_done();
        let mut s = self
            .done
            .slot
            .lock()
            .map_err(|_| Error::Pipeline("poisoned".into()))?;
        match s.1.take() {
            Some(Ok(stats)) => {
                s.1 = Some(Ok(stats.clone()));
                Ok(stats)
            }
            Some(Err(e)) => {
                s.1 = Some(Err(Error::Pipeline(e.to_string())));
                Err(e)
            }
            None => Err(Error::Pipeline("no result".into())),
        }
    }
}

struct PersistJob {
    step: u64,
    started: Instant,
    stall: Duration,
    specs: Vec<EntrySpec>,
    layout: Layout,
    offsets: Vec<usize>,
    staging: Arc<AlignedBuf>,
    metadata: BTreeMap<String, String>,
    done: Arc<Completion>,
}

/// The checkpointer's private runtime, which drives tier calls. Shut down
/// without blocking when dropped, so a checkpointer can be dropped inside an
/// async context (a plain runtime's drop panics there).
pub(crate) struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for OwnRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        // Some until drop.
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("runtime used after drop"))
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) rt: OwnRuntime,
    pub(crate) l1: L1Store,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) pool: StagingPool,
    pub(crate) restores: std::sync::atomic::AtomicU64,
    gpu: Mutex<Option<Arc<Gpu>>>,
}

impl Shared {
    /// The GPU engine for these device buffers (opened on first use), or
    /// None when there are none. All must live on one device.
    pub(crate) fn gpu_for(
        &self,
        devices: impl Iterator<Item = DeviceBytes>,
    ) -> Result<Option<Arc<Gpu>>> {
        let mut ordinal = None;
        for d in devices {
            match ordinal {
                None => ordinal = Some(d.device()),
                Some(o) if o != d.device() => {
                    return Err(Error::Gpu(format!(
                        "tensors on devices {o} and {}: one checkpointer serves one device",
                        d.device()
                    )))
                }
                Some(_) => {}
            }
        }
        let Some(ordinal) = ordinal else {
            return Ok(None);
        };
        let mut slot = self
            .gpu
            .lock()
            .map_err(|_| Error::Pipeline("poisoned".into()))?;
        if let Some(g) = slot.as_ref() {
            if g.device() != ordinal {
                return Err(Error::Gpu(format!(
                    "this checkpointer serves device {}, not {ordinal}",
                    g.device()
                )));
            }
            return Ok(Some(g.clone()));
        }
        let g = Arc::new(Gpu::open(ordinal)?);
        *slot = Some(g.clone());
        Ok(Some(g))
    }
}

/// Saves and restores one rank's state. See the module documentation.
pub struct Checkpointer {
    pub(crate) shared: Arc<Shared>,
    tx: Option<mpsc::Sender<PersistJob>>,
    worker: Option<std::thread::JoinHandle<()>>,
    inflight: Mutex<Option<(u64, Arc<Completion>)>>,
    skipped: std::sync::atomic::AtomicU64,
}

impl Checkpointer {
    /// A checkpointer for a world of one.
    pub fn new(cfg: Config) -> Result<Self> {
        Self::with_coordinator(cfg, Arc::new(SoloCoordinator))
    }

    /// A checkpointer whose ranks agree through `coord`.
    pub fn with_coordinator(cfg: Config, coord: Arc<dyn Coordinator>) -> Result<Self> {
        cfg.validate()?;
        if coord.world_size() != cfg.world_size {
            return Err(Error::Config(format!(
                "coordinator has {} ranks, config {}",
                coord.world_size(),
                cfg.world_size
            )));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("strata-rt")
            .enable_time()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the runtime: {e}")))?;
        let l1 = L1Store::open(&cfg.l1_dir, cfg.engine()?)?;
        tracing::info!(engine = l1.engine_name(), dir = %cfg.l1_dir.display(), rank = cfg.rank, "strata checkpointer ready");
        let shared = Arc::new(Shared {
            cfg,
            rt: OwnRuntime(Some(rt)),
            l1,
            coord,
            pool: StagingPool::default(),
            restores: std::sync::atomic::AtomicU64::new(0),
            gpu: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel::<PersistJob>();
        let s2 = shared.clone();
        let worker = std::thread::Builder::new()
            .name("strata-persist".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let done = job.done.clone();
                    let staging = job.staging.clone();
                    let r = persist(&s2, job);
                    s2.pool.give_back(staging);
                    done.finish(r);
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the persist worker: {e}")))?;
        Ok(Checkpointer {
            shared,
            tx: Some(tx),
            worker: Some(worker),
            inflight: Mutex::new(None),
            skipped: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// The L1 I/O engine running ("io_uring" or "psync").
    pub fn engine_name(&self) -> &'static str {
        self.shared.l1.engine_name()
    }

    /// Steps skipped by the busy policy so far.
    pub fn skipped_saves(&self) -> u64 {
        self.skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The L1 store (for inspection tools).
    pub fn l1(&self) -> &L1Store {
        &self.shared.l1
    }

    /// Snapshots `state` for `step` and returns as soon as the snapshot is
    /// taken; the step becomes durable in the background (see [`SaveHandle`]).
    pub fn save(&self, step: u64, state: &[Entry<'_>]) -> Result<SaveHandle> {
        self.save_with_metadata(step, state, BTreeMap::new())
    }

    /// [`Self::save`] with user metadata stored in the manifest.
    pub fn save_with_metadata(
        &self,
        step: u64,
        state: &[Entry<'_>],
        metadata: BTreeMap<String, String>,
    ) -> Result<SaveHandle> {
        let started = Instant::now();
        let _span = tracing::info_span!("save", step).entered();
        // The busy policy.
        let busy = self.inflight.lock().ok().and_then(|g| {
            g.as_ref()
                .filter(|(_, c)| !c.is_done())
                .map(|(s, c)| (*s, c.clone()))
        });
        if let Some((busy_with, done)) = busy {
            match self.shared.cfg.busy_policy {
                BusyPolicy::Wait => done.wait_done(),
                BusyPolicy::Error => return Err(Error::Busy { step, busy_with }),
                BusyPolicy::Skip => {
                    self.skipped
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        step,
                        busy_with,
                        "save skipped: previous save still persisting"
                    );
                    let done = Completion::new();
                    done.finish(Ok(SaveStats {
                        step,
                        skipped: true,
                        ..SaveStats::default()
                    }));
                    return Ok(SaveHandle {
                        step,
                        stall: started.elapsed(),
                        done,
                    });
                }
            }
        }

        let specs: Vec<EntrySpec> = state
            .iter()
            .map(Entry::spec)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::InvalidState(e.to_string()))?;
        let layout = Layout::plan(&specs, self.shared.cfg.chunk_size)
            .map_err(|e| Error::InvalidState(e.to_string()))?;
        // Each chunk at an aligned offset, so it can be written with O_DIRECT
        // straight from the staging buffer.
        let mut offsets = Vec::with_capacity(layout.chunks.len());
        let mut total = 0usize;
        for c in &layout.chunks {
            offsets.push(total);
            total += align_up(c.len as usize);
        }
        let gpu = self.shared.gpu_for(state.iter().filter_map(|e| e.device))?;
        let mut staging = self.shared.pool.take(total, gpu.as_deref());
        if let Some(g) = &gpu {
            // Device tensors first: queue every device-to-host copy on
            // Strata's stream, wait, then copy the host entries.
            if let Err(e) = snapshot_device(g, &layout, &offsets, state, &mut staging) {
                self.shared.pool.give_back_owned(staging);
                return Err(e);
            }
        }
        snapshot(
            &layout,
            &offsets,
            state,
            &mut staging,
            self.shared.cfg.hash_threads,
        );
        let stall = started.elapsed();

        let done = Completion::new();
        let job = PersistJob {
            step,
            started,
            stall,
            specs,
            layout,
            offsets,
            staging: Arc::new(staging),
            metadata,
            done: done.clone(),
        };
        self.tx
            .as_ref()
            .ok_or_else(|| Error::Pipeline("checkpointer closed".into()))?
            .send(job)
            .map_err(|_| Error::Pipeline("persist worker stopped".into()))?;
        if let Ok(mut g) = self.inflight.lock() {
            *g = Some((step, done.clone()));
        }
        Ok(SaveHandle { step, stall, done })
    }

    /// Waits for the save in flight, if any.
    pub fn flush(&self) {
        let c = self
            .inflight
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|(_, c)| c.clone()));
        if let Some(c) = c {
            c.wait_done();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Finish what was started: a training loop that exits right after a
        // save expects that step on disk.
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Copies every device entry's bytes to its chunks' places in the (pinned)
/// staging buffer on the GPU's own stream, and waits for the copies.
fn snapshot_device(
    gpu: &Gpu,
    layout: &Layout,
    offsets: &[usize],
    state: &[Entry<'_>],
    staging: &mut AlignedBuf,
) -> Result<()> {
    let _span = tracing::info_span!("snapshot_device").entered();
    for (plan, &off) in layout.chunks.iter().zip(offsets) {
        for p in &plan.pieces {
            if let Some(dev) = state[p.entry].device {
                let at = off + p.chunk_offset as usize;
                let dst = staging
                    .get_mut(at..at + p.len as usize)
                    .ok_or_else(|| Error::Pipeline("staging too small".into()))?;
                gpu.enqueue_dtoh(dst, dev.ptr() + p.entry_offset)?;
            }
        }
    }
    gpu.synchronize()
}

/// Copies every host entry into its chunk's place in the staging buffer
/// (zeroing the padding of packed chunks), on `threads` threads. Device
/// entries were copied by [`snapshot_device`].
fn snapshot(
    layout: &Layout,
    offsets: &[usize],
    state: &[Entry<'_>],
    staging: &mut AlignedBuf,
    threads: usize,
) {
    // Split the buffer into one disjoint slice per chunk so threads can fill
    // chunks in parallel without sharing.
    let mut regions: Vec<&mut [u8]> = Vec::with_capacity(layout.chunks.len());
    let mut rest: &mut [u8] = staging;
    let mut at = 0;
    for (c, &off) in layout.chunks.iter().zip(offsets) {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(off - at);
        let (region, tail) = tail.split_at_mut(c.len as usize);
        regions.push(region);
        rest = tail;
        at = off + c.len as usize;
    }
    let regions: Vec<Mutex<&mut [u8]>> = regions.into_iter().map(Mutex::new).collect();
    par_map(
        layout.chunks.len(),
        threads,
        || (),
        |_, i| {
            let plan = &layout.chunks[i];
            if let Ok(mut region) = regions[i].lock() {
                // Zero only the alignment gaps between packed pieces: every
                // other byte is overwritten below.
                let mut end = 0usize;
                for p in &plan.pieces {
                    region[end..p.chunk_offset as usize].fill(0);
                    end = (p.chunk_offset + p.len) as usize;
                }
                for p in plan
                    .pieces
                    .iter()
                    .filter(|p| state[p.entry].device.is_none())
                {
                    let src = &state[p.entry].bytes
                        [p.entry_offset as usize..p.entry_offset as usize + p.len as usize];
                    region[p.chunk_offset as usize..p.chunk_offset as usize + p.len as usize]
                        .copy_from_slice(src);
                }
            }
        },
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Hash → write chunks → manifest → barrier → commit record → retention.
fn persist(s: &Shared, job: PersistJob) -> Result<SaveStats> {
    let _span = tracing::info_span!("persist", step = job.step).entered();
    let cfg = &s.cfg;
    let mut stats = SaveStats {
        step: job.step,
        stall: job.stall,
        logical_bytes: job.specs.iter().map(|e| e.len).sum(),
        chunks: job.layout.chunks.len() as u64,
        ..SaveStats::default()
    };
    let local = (|| -> Result<(Vec<u8>, ShardManifest)> {
        let t = Instant::now();
        let ids = hash_and_write(s, &job, &mut stats)?;
        let t_manifest = Instant::now();
        let info = ShardInfo {
            job: cfg.job.clone(),
            step: job.step,
            rank: cfg.rank,
            world_size: cfg.world_size,
            created_unix_ms: now_ms(),
        };
        let manifest =
            ShardManifest::from_layout(info, &job.specs, &job.layout, &ids, job.metadata.clone())?;
        let bytes = manifest.encode()?;
        tracing::info_span!("put_manifest").in_scope(|| {
            s.rt.block_on(s.l1.put_manifest(&cfg.job, job.step, cfg.rank, &bytes))
        })?;
        stats.manifest_time = t_manifest.elapsed();
        stats.write_time = t.elapsed();
        Ok((bytes, manifest))
    })();

    // Every rank reports, failed or not, so nobody waits for a rank that gave up.
    let ok = local.is_ok();
    let timeout = Duration::from_secs(cfg.coordination_timeout_secs);
    let t = Instant::now();
    let votes = tracing::info_span!("barrier").in_scope(|| {
        s.coord.all_gather(
            cfg.rank,
            &format!("commit/{}/{}", cfg.job, job.step),
            vec![u8::from(ok)],
            timeout,
        )
    });
    stats.barrier_time = t.elapsed();
    let (bytes, manifest) = local?;
    let votes = votes?;
    if let Some(bad) = votes.iter().position(|v| v.first() != Some(&1)) {
        return Err(Error::Coordination(format!(
            "step {}: rank {bad} failed to persist its shard; step not committed",
            job.step
        )));
    }
    let record = CommitRecord {
        job: cfg.job.clone(),
        step: job.step,
        world_size: cfg.world_size,
        committed_unix_ms: now_ms(),
        shards: vec![ShardRef {
            rank: cfg.rank,
            manifest: ShardManifest::id_of(&bytes),
            logical_bytes: manifest.logical_bytes(),
        }],
    };
    let t = Instant::now();
    tracing::info_span!("commit").in_scope(|| s.rt.block_on(s.l1.commit(&record)))?;
    stats.commit_time = t.elapsed();
    stats.to_durable = job.started.elapsed();

    match tracing::info_span!("retention").in_scope(|| retention(s)) {
        Ok((steps, bytes)) => {
            stats.retired_steps = steps;
            stats.retired_bytes = bytes;
        }
        // A failed cleanup does not fail a committed save.
        Err(e) => tracing::warn!(error = %e, "retention failed"),
    }
    tracing::info!(
        step = job.step,
        stall_ms = stats.stall.as_millis() as u64,
        durable_ms = stats.to_durable.as_millis() as u64,
        written = stats.bytes_written,
        deduped = stats.bytes_deduped,
        "step durable on L1"
    );
    Ok(stats)
}

/// Chunk bytes in the first write batch, and the most in any batch. The
/// hash of batch k+1 runs while batch k is written, so a save costs about
/// max(hash, write), not their sum. Batches start small (writes begin after
/// hashing only a little) and double, because each batch ends in a drain
/// (last writes, fdatasyncs, renames, directory fsyncs) that idles the disk.
const FIRST_BATCH_BYTES: u64 = 32 << 20;
const MAX_BATCH_BYTES: u64 = 512 << 20;

/// Hashes the staged chunks batch by batch on the hash pool and writes each
/// batch's new chunks to L1 while the next one hashes. Returns every chunk's
/// id in layout order.
fn hash_and_write(s: &Shared, job: &PersistJob, stats: &mut SaveStats) -> Result<Vec<ChunkId>> {
    let cfg = &s.cfg;
    let n = job.layout.chunks.len();
    let mut batches: Vec<std::ops::Range<usize>> = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    let mut limit = FIRST_BATCH_BYTES;
    for (i, c) in job.layout.chunks.iter().enumerate() {
        if i > start && bytes + u64::from(c.len) > limit {
            batches.push(start..i);
            start = i;
            bytes = 0;
            limit = (limit * 2).min(MAX_BATCH_BYTES);
        }
        bytes += u64::from(c.len);
    }
    if start < n {
        batches.push(start..n);
    }
    let chunk = |i: usize| {
        let off = job.offsets[i];
        &job.staging[off..off + job.layout.chunks[i].len as usize]
    };
    let mut ids: Vec<ChunkId> = Vec::with_capacity(n);
    let hash_time = std::thread::scope(|sc| -> Result<Duration> {
        // One batch of look-ahead: hashing never runs more than a batch
        // ahead of the writes.
        let (tx, rx) = mpsc::sync_channel::<(std::ops::Range<usize>, Vec<ChunkId>)>(1);
        let batches = &batches;
        let hasher = sc.spawn(move || {
            let mut spent = Duration::ZERO;
            for r in batches {
                let t = Instant::now();
                let got = tracing::debug_span!("hash", chunks = r.len()).in_scope(|| {
                    par_map(
                        r.len(),
                        cfg.hash_threads,
                        || (),
                        |_, i| ChunkId::of(chunk(r.start + i)),
                    )
                });
                spent += t.elapsed();
                if tx.send((r.clone(), got)).is_err() {
                    break; // the writer failed and stopped listening
                }
            }
            spent
        });
        for (r, got) in rx {
            let puts = r
                .clone()
                .zip(&got)
                .map(|(i, id)| {
                    let off = job.offsets[i];
                    Ok(ChunkPut {
                        id: *id,
                        hint: job.layout.chunks[i].hint,
                        data: ChunkData::new(
                            job.staging.clone(),
                            off..off + job.layout.chunks[i].len as usize,
                        )?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let put = tracing::debug_span!("write_chunks", chunks = puts.len())
                .in_scope(|| s.rt.block_on(s.l1.put_chunks(&cfg.job, puts)))?;
            stats.bytes_written += put.bytes_written;
            stats.bytes_deduped += put.bytes_deduped;
            stats.chunks_written += put.written;
            stats.chunks_deduped += put.deduped;
            ids.extend(got);
        }
        hasher
            .join()
            .map_err(|_| Error::Pipeline("the hash pool panicked".into()))
    })?;
    stats.hash_time = hash_time;
    Ok(ids)
}

/// Keeps the newest `keep_last` steps this rank committed; deletes older
/// steps (and partial steps older than the newest commit), then chunks no
/// remaining manifest references.
fn retention(s: &Shared) -> Result<(u64, u64)> {
    let cfg = &s.cfg;
    let steps = s.rt.block_on(s.l1.list_steps(&cfg.job))?;
    let mine: Vec<u64> = steps
        .iter()
        .filter(|st| st.committed_ranks().contains(&cfg.rank))
        .map(|st| st.step)
        .collect();
    let Some(&newest) = mine.last() else {
        return Ok((0, 0));
    };
    let keep: HashSet<u64> = mine.iter().rev().take(cfg.keep_last).copied().collect();
    let oldest_kept = keep.iter().min().copied().unwrap_or(newest);
    let mut retired = 0;
    for st in &steps {
        let committed_here = st.committed_ranks().contains(&cfg.rank);
        let doomed = (committed_here && !keep.contains(&st.step))
            || (!committed_here && st.step < oldest_kept);
        if doomed {
            s.rt.block_on(s.l1.delete_step(&cfg.job, st.step))?;
            retired += 1;
        }
    }
    if retired == 0 {
        return Ok((0, 0));
    }
    // Mark: every chunk named by a manifest that is still there (any rank).
    let mut referenced = HashSet::new();
    for st in s.rt.block_on(s.l1.list_steps(&cfg.job))? {
        for rank in &st.manifests {
            let bytes = s.rt.block_on(s.l1.get_manifest(&cfg.job, st.step, *rank))?;
            match ShardManifest::decode(&bytes) {
                Ok(m) => referenced.extend(m.chunks.iter().map(|c| c.id)),
                // An unreadable manifest: keep everything rather than guess.
                Err(_) => return Ok((retired, 0)),
            }
        }
    }
    let grace = Duration::from_secs(cfg.gc_grace_secs);
    let (_, bytes) = s.rt.block_on(s.l1.sweep(&cfg.job, referenced, grace))?;
    Ok((retired, bytes))
}

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

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use strata_format::layout::Layout;
use strata_format::EntrySpec;
use strata_tiered::{L1Store, L3Options, L3Store};

use crate::config::{BusyPolicy, Config};
use crate::coordinator::{Coordinator, SoloCoordinator};
use crate::error::{Error, Result};
use crate::gpu::{DeviceBytes, Gpu};
use crate::persist::{persist, PersistJob, Snap};
use crate::snapshot::{fill_segment, Plan};
use crate::staging::StagingPool;
use crate::state::Entry;
use crate::stats::SaveStats;
use crate::tiering::{self, UploadJob, Uploads};

/// The outcome slot shared by a save's handle and the worker.
pub(crate) struct Completion {
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
    /// L3, when configured.
    pub(crate) l3: Option<Arc<L3Store>>,
    /// Upload progress.
    pub(crate) uploads: Uploads,
    /// The uploader's queue (taken on drop so the uploader finishes).
    pub(crate) upload_tx: Mutex<Option<mpsc::Sender<UploadJob>>>,
    /// L2 peers in ring order (empty: no replication).
    pub(crate) l2: Vec<crate::replication::Peer>,
    /// Replication progress.
    pub(crate) replication: crate::replication::Replication,
    /// The replication worker's queue.
    pub(crate) repl_tx: Mutex<Option<mpsc::Sender<u64>>>,
    /// Eager pushes by step, until the replication worker takes them.
    pub(crate) eager: Mutex<
        std::collections::HashMap<u64, tokio::sync::oneshot::Receiver<crate::eager_push::Outcome>>,
    >,
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
    uploader: Option<std::thread::JoinHandle<()>>,
    replicator: Option<std::thread::JoinHandle<()>>,
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
        let l3 = match &cfg.l3_url {
            Some(url) => {
                let opts: Vec<(String, String)> = cfg
                    .l3_options
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let store = L3Store::from_url(url, &opts, L3Options::default())
                    .map_err(|e| Error::Config(format!("l3_url {url:?}: {e}")))?;
                Some(store)
            }
            None => None,
        };
        Self::with_tiers(cfg, coord, l3)
    }

    /// A checkpointer with an L3 store built by the caller (custom
    /// `object_store` settings, a wrapper): `cfg.l3_url` is ignored; the
    /// upload policy settings apply to `l3`.
    pub fn with_tiers(
        cfg: Config,
        coord: Arc<dyn Coordinator>,
        l3: Option<L3Store>,
    ) -> Result<Self> {
        cfg.validate()?;
        let l3 = l3.map(Arc::new);
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
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the runtime: {e}")))?;
        let l1 = L1Store::open(&cfg.l1_dir, cfg.engine()?)?;
        let l2 = crate::replication::open_peers(&cfg, &rt)?;
        let (upload_tx, upload_rx) = mpsc::channel::<UploadJob>();
        let (repl_tx, repl_rx) = mpsc::channel::<u64>();
        tracing::info!(engine = l1.engine_name(), dir = %cfg.l1_dir.display(), rank = cfg.rank, "strata checkpointer ready");
        let shared = Arc::new(Shared {
            cfg,
            rt: OwnRuntime(Some(rt)),
            l1,
            coord,
            pool: StagingPool::default(),
            restores: std::sync::atomic::AtomicU64::new(0),
            gpu: Mutex::new(None),
            l3,
            uploads: Uploads::default(),
            upload_tx: Mutex::new(Some(upload_tx)),
            l2,
            replication: Default::default(),
            repl_tx: Mutex::new(Some(repl_tx)),
            eager: Mutex::default(),
        });
        let replicator = if shared.l2.is_empty() {
            None
        } else {
            let s2 = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("strata-replicate".into())
                    .spawn(move || crate::replication::run(&s2, &repl_rx))
                    .map_err(|e| Error::Config(format!("cannot start replication: {e}")))?,
            )
        };
        let uploader = match shared.l3.clone() {
            Some(l3) => {
                let s3 = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("strata-upload".into())
                        .spawn(move || tiering::run(&s3, &l3, &upload_rx))
                        .map_err(|e| Error::Config(format!("cannot start the uploader: {e}")))?,
                )
            }
            None => None,
        };
        let (tx, rx) = mpsc::channel::<PersistJob>();
        let s2 = shared.clone();
        let worker = std::thread::Builder::new()
            .name("strata-persist".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let done = job.done.clone();
                    let mut segments = Vec::new();
                    let r = persist(&s2, job, &mut segments);
                    for seg in segments {
                        s2.pool.give_back(seg);
                    }
                    done.finish(r);
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the persist worker: {e}")))?;
        Ok(Checkpointer {
            shared,
            tx: Some(tx),
            worker: Some(worker),
            uploader,
            replicator,
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

    /// The entries' specs and where their chunks go in staging memory.
    fn plan(&self, state: &[Entry<'_>]) -> Result<(Vec<EntrySpec>, Plan)> {
        let specs: Vec<EntrySpec> = state
            .iter()
            .map(Entry::spec)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::InvalidState(e.to_string()))?;
        let layout = Layout::plan(&specs, self.shared.cfg.chunk_size)
            .map_err(|e| Error::InvalidState(e.to_string()))?;
        Ok((specs, Plan::new(layout)))
    }

    /// Allocates and pre-faults the staging memory a save of `state` needs
    /// (pinned for GPU tensors), so that even the first save stalls only
    /// for the copy: call it once before training starts. Optional: without
    /// it the first save pays for fresh memory (on these VMs 2–5× its copy).
    pub fn prepare(&self, state: &[Entry<'_>]) -> Result<()> {
        let (_, plan) = self.plan(state)?;
        let gpu = self.shared.gpu_for(state.iter().filter_map(|e| e.device))?;
        let segments: Vec<_> = plan
            .segment_lens
            .iter()
            .map(|&len| self.shared.pool.take(len, gpu.as_deref()))
            .collect();
        for seg in segments {
            self.shared.pool.give_back_owned(seg);
        }
        Ok(())
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

        let (specs, plan) = self.plan(state)?;
        let plan = Arc::new(plan);
        let gpu = self.shared.gpu_for(state.iter().filter_map(|e| e.device))?;

        // The worker starts on the first segment while later ones are copied.
        let (snap_tx, snaps) = mpsc::channel();
        let done = Completion::new();
        let job = PersistJob {
            step,
            started,
            specs,
            plan: plan.clone(),
            snaps,
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
        let _snap = tracing::info_span!("snapshot").entered();
        for (k, &len) in plan.segment_lens.iter().enumerate() {
            let mut seg = self.shared.pool.take(len, gpu.as_deref());
            let filled = fill_segment(
                &plan,
                k,
                state,
                &mut seg,
                self.shared.cfg.hash_threads,
                gpu.as_deref(),
            );
            if let Err(e) = filled {
                self.shared.pool.give_back_owned(seg);
                let _ = snap_tx.send(Snap::Abandoned(e.to_string()));
                return Err(e);
            }
            if snap_tx.send(Snap::Segment(Arc::new(seg))).is_err() {
                // The worker already failed this save: stop copying; the
                // handle reports why.
                break;
            }
        }
        let stall = started.elapsed();
        let _ = snap_tx.send(Snap::Taken(stall));
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
        // Then the uploads queued so far (closing the queue ends the
        // uploader once it is empty).
        if let Ok(mut tx) = self.shared.upload_tx.lock() {
            tx.take();
        }
        if let Some(u) = self.uploader.take() {
            let _ = u.join();
        }
        if let Ok(mut tx) = self.shared.repl_tx.lock() {
            tx.take();
        }
        if let Some(r) = self.replicator.take() {
            let _ = r.join();
        }
    }
}

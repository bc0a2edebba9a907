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
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::BTreeSet;
use strata_format::layout::Layout;
use strata_format::EntrySpec;

use strata_tiered::{ChunkStore, Clock, L1Store, L3Store};

use crate::commit::{CommitEvents, KnownCommitted};
use crate::config::{BusyPolicy, Config};
use crate::coordinator::Coordinator;
use crate::error::{Error, Result};
use crate::gpu::{DeviceBytes, Gpu};
pub(crate) use crate::handle::Completion;
use crate::handle::SaveHandle;
use crate::persist::{persist, PersistJob, Snap};
use crate::policy::UploadPolicy;
use crate::snapshot::{fill_segment, Plan};
use crate::stack::{open_l3, CheckpointerBuilder};
use crate::staging::StagingPool;
use crate::state::Entry;
use crate::stats::SaveStats;
use crate::tiering::{self, UploadJob, Uploads};

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
    /// The local tier (L1): every save is written here first.
    pub(crate) l1: Arc<dyn ChunkStore>,
    /// The same, typed, when it is the default L1 on `l1_dir`.
    l1_disk: Option<L1Store>,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) pool: StagingPool,
    pub(crate) restores: std::sync::atomic::AtomicU64,
    gpu: Mutex<Option<Arc<Gpu>>>,
    /// The remote tier (L3), when configured.
    pub(crate) l3: Option<Arc<dyn ChunkStore>>,
    /// Upload progress.
    pub(crate) uploads: Arc<Uploads>,
    /// The uploader's queue for steps asked for by [`Checkpointer::upload`]
    /// (taken on drop so the uploader finishes).
    pub(crate) upload_tx: Mutex<Option<mpsc::Sender<UploadJob>>>,
    /// Peer tiers (L2) in ring order (empty: no replication).
    pub(crate) l2: Vec<crate::replication::Peer>,
    /// Replication progress.
    pub(crate) replication: Arc<crate::replication::Replication>,
    /// Eager pushes by step, until the replication worker takes them.
    pub(crate) eager: Mutex<
        std::collections::HashMap<u64, tokio::sync::oneshot::Receiver<crate::eager_push::Outcome>>,
    >,
    /// The clock of every time-based decision.
    pub(crate) clock: Arc<dyn Clock>,
    /// Which committed steps go to L3 (rank 0's answer is everyone's).
    pub(crate) upload_policy: UploadPolicy,
    /// "Step committed" events (the uploader and replicator subscribe).
    pub(crate) commits: CommitEvents,
    /// Steps this rank knows committed in some tier: a save of one of
    /// them is refused.
    pub(crate) committed: KnownCommitted,
}

impl Shared {
    /// Refuses a save of a step this rank already committed in some tier
    /// (saving it again would replace a committed shard's manifest):
    /// checked before anything is written. A restore's own listing of the
    /// tiers fills the set (a resuming job restores first, so its saves
    /// list nothing); otherwise the first save lists the tiers once. An
    /// unreachable tier is skipped (its own guard still refuses to replace
    /// a committed manifest).
    fn refuse_committed(&self, step: u64) -> Result<()> {
        let known = match self.committed.contains(step) {
            Some(k) => k,
            None => {
                // On a thread of its own: `save` may be called from inside
                // an async runtime, where blocking on ours would panic.
                let listed = std::thread::scope(|sc| {
                    sc.spawn(|| self.list_committed())
                        .join()
                        .unwrap_or_default()
                });
                self.committed.fill(listed);
                self.committed.contains(step).unwrap_or(false)
            }
        };
        if known {
            return Err(Error::AlreadyCommitted {
                step,
                tier: "by this rank".into(),
            });
        }
        Ok(())
    }

    /// The steps this rank committed in any tier it can list.
    pub(crate) fn list_committed(&self) -> BTreeSet<u64> {
        let mut known = BTreeSet::new();
        let tiers = std::iter::once(("L1".to_string(), &self.l1))
            .chain(self.l2.iter().map(|p| (format!("L2 {}", p.name), &p.store)))
            .chain(self.l3.iter().map(|l3| ("L3".to_string(), l3)));
        for (name, t) in tiers {
            match self.rt.block_on(t.list_steps(&self.cfg.job)) {
                Ok(steps) => known.extend(crate::commit::restorable(&self.cfg, &steps)),
                Err(e) => {
                    tracing::warn!(tier = %name, error = %e, "cannot list a tier to check for committed steps")
                }
            }
        }
        known
    }

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
    /// A checkpointer for a world of one, on the tiers `cfg` describes.
    pub fn new(cfg: Config) -> Result<Self> {
        Self::builder(cfg).build()
    }

    /// A builder: settings from `cfg`, components (coordinator, tier
    /// stack, clock) from its methods.
    pub fn builder(cfg: Config) -> CheckpointerBuilder {
        CheckpointerBuilder::new(cfg)
    }

    /// A checkpointer whose ranks agree through `coord`.
    pub fn with_coordinator(cfg: Config, coord: Arc<dyn Coordinator>) -> Result<Self> {
        Self::builder(cfg).coordinator(coord).build()
    }

    /// A checkpointer with an L3 store built by the caller (custom
    /// `object_store` settings, a wrapper): `cfg.l3_url` is ignored; the
    /// upload policy settings apply to `l3`. The same as
    /// `builder(cfg).coordinator(coord).remote(l3)`.
    pub fn with_tiers(
        cfg: Config,
        coord: Arc<dyn Coordinator>,
        l3: Option<L3Store>,
    ) -> Result<Self> {
        Self::builder(cfg)
            .coordinator(coord)
            .remote(l3.map(|s| Arc::new(s) as Arc<dyn ChunkStore>))
            .build()
    }

    pub(crate) fn from_builder(b: CheckpointerBuilder) -> Result<Self> {
        let cfg = b.cfg;
        let coord = b.coord;
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
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the runtime: {e}")))?;
        let (l1, l1_disk) = match b.local {
            Some(l) => (l, None),
            None => {
                let disk = L1Store::open(&cfg.l1_dir, cfg.engine()?)?;
                (Arc::new(disk.clone()) as Arc<dyn ChunkStore>, Some(disk))
            }
        };
        let l2 = match b.peers {
            Some(p) => p,
            None => {
                let _guard = rt.enter();
                crate::replication::open_peers(&cfg)?
            }
        };
        let l3 = match b.remote {
            Some(r) => r,
            None => match &cfg.l3_url {
                Some(url) => Some(Arc::new(open_l3(&cfg, url)?) as Arc<dyn ChunkStore>),
                None => None,
            },
        };
        let upload_policy = UploadPolicy::new(
            l3.is_some(),
            cfg.upload_every,
            Duration::from_secs(cfg.upload_min_interval_secs),
            b.clock.clone(),
        );
        let (upload_tx, upload_rx) = mpsc::channel::<UploadJob>();
        let (repl_tx, repl_rx) = mpsc::channel::<u64>();
        tracing::info!(local = %l1.describe(), rank = cfg.rank, peers = l2.len(), remote = l3.is_some(), "strata checkpointer ready");
        let shared = Arc::new(Shared {
            rt: OwnRuntime(Some(rt)),
            l1,
            l1_disk,
            coord,
            pool: StagingPool::default(),
            restores: std::sync::atomic::AtomicU64::new(0),
            gpu: Mutex::new(None),
            l3,
            uploads: Arc::default(),
            upload_tx: Mutex::new(Some(upload_tx.clone())),
            l2,
            replication: Arc::default(),
            eager: Mutex::default(),
            clock: b.clock,
            upload_policy,
            commits: CommitEvents::default(),
            committed: KnownCommitted::default(),
            cfg,
        });
        // The workers hear of committed steps as subscribers; the save
        // path never calls them.
        shared.commits.subscribe(Box::new(tiering::subscriber(
            shared.uploads.clone(),
            upload_tx,
        )));
        let replicator = if shared.l2.is_empty() {
            None
        } else {
            shared
                .commits
                .subscribe(Box::new(crate::replication::subscriber(
                    shared.replication.clone(),
                    repl_tx,
                    shared.cfg.replicas,
                )));
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
                        .spawn(move || tiering::run(&s3, l3, &upload_rx))
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

    /// How the local tier does its I/O: the L1 engine running
    /// ("io_uring" or "psync"), or a custom store's description.
    pub fn engine_name(&self) -> String {
        match self.l1() {
            Some(l1) => l1.engine_name().to_string(),
            None => self.shared.l1.describe(),
        }
    }

    /// Steps skipped by the busy policy so far.
    pub fn skipped_saves(&self) -> u64 {
        self.skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The local tier (for inspection tools).
    pub fn local(&self) -> &Arc<dyn ChunkStore> {
        &self.shared.l1
    }

    /// The local tier as an [`L1Store`], when it is the default L1 on
    /// `l1_dir` (paths of chunk files and manifests, for repair tools and
    /// tests).
    pub fn l1(&self) -> Option<&L1Store> {
        self.shared.l1_disk.as_ref()
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
                        shared: self.shared.clone(),
                    });
                }
            }
        }

        // A committed step is never saved again (it would replace a
        // committed shard): refused before anything is written.
        self.shared.refuse_committed(step)?;
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
        Ok(SaveHandle {
            step,
            stall,
            done,
            shared: self.shared.clone(),
        })
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
        // Then the uploads queued so far (closing the queues, held by the
        // subscribers and `upload`, ends the workers once they are empty).
        self.shared.commits.close();
        if let Ok(mut tx) = self.shared.upload_tx.lock() {
            tx.take();
        }
        if let Some(u) = self.uploader.take() {
            let _ = u.join();
        }
        if let Some(r) = self.replicator.take() {
            let _ = r.join();
        }
    }
}

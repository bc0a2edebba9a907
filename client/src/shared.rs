//! The state the [`Checkpointer`](crate::Checkpointer)'s API and its
//! background workers (persist, eager push, replication, upload, restore)
//! share. Every pipeline module imports this one and none of them imports
//! the checkpointer: the module graph points one way, from the API down.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};

use strata_tiered::{ChunkStore, Clock, L1Store};

use crate::config::Config;
use crate::coord::commit::L3_LISTER as LISTER;
use crate::coord::commit::{CommitEvents, KnownCommitted};
use crate::coord::coordinator::Coordinator;
use crate::error::{Error, Result};
use crate::gpu::{DeviceBytes, Gpu};
use crate::policy::UploadPolicy;
use crate::push_claims::PushClaims;
use crate::staging::StagingPool;
use crate::tier_states::{Replication, UploadJob, Uploads};
use crate::tiers::{Catalog, Tier, TierKind, TierStack};

/// What an eager push sent, by peer name (chunk bytes).
pub(crate) type EagerOutcome = HashMap<String, u64>;

/// The runtime that drives the checkpointer's tier calls: its own, or one
/// the caller shares between several checkpointers
/// ([`crate::CheckpointerBuilder::runtime`]). Its own is shut down without
/// blocking when dropped, so a checkpointer with its own runtime can be
/// dropped inside an async context (a plain runtime's drop panics there);
/// a shared one is left running for its owner.
pub(crate) struct OwnRuntime {
    own: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl OwnRuntime {
    /// The checkpointer's own runtime.
    pub(crate) fn own(rt: tokio::runtime::Runtime) -> Self {
        OwnRuntime {
            handle: rt.handle().clone(),
            own: Some(rt),
        }
    }

    /// A runtime someone else owns.
    pub(crate) fn shared(handle: tokio::runtime::Handle) -> Self {
        OwnRuntime { own: None, handle }
    }
}

impl std::ops::Deref for OwnRuntime {
    type Target = tokio::runtime::Handle;
    fn deref(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.own.take() {
            rt.shutdown_background();
        }
    }
}

/// What the checkpointer's API and its workers share: the settings, the
/// runtime, the tier stack, the coordinator and the pipelines' states.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) rt: OwnRuntime,
    /// Every tier, fastest first: L1, the peers in ring order, L3.
    pub(crate) tiers: TierStack,
    /// The stack's peers as one group: the R-copy policy of replication
    /// and the eager push's targets (restore and the catalog read each
    /// member as a tier of its own, to say which peer served).
    pub(crate) group: strata_peer::PeerGroup,
    /// The stack's L1 (a checkpointer always has one): every save is
    /// written here first.
    pub(crate) l1: Arc<dyn ChunkStore>,
    /// The same, typed, when it is the default L1 on `l1_dir`.
    pub(crate) l1_disk: Option<L1Store>,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) pool: StagingPool,
    pub(crate) restores: std::sync::atomic::AtomicU64,
    pub(crate) gpu: Mutex<Option<Arc<Gpu>>>,
    /// Upload progress.
    pub(crate) uploads: Arc<Uploads>,
    /// The uploader's queue for steps asked for by [`Checkpointer::upload`]
    /// (taken on drop so the uploader finishes).
    pub(crate) upload_tx: Mutex<Option<mpsc::Sender<UploadJob>>>,
    /// Replication progress.
    pub(crate) replication: Arc<Replication>,
    /// Eager pushes by step, until the replication worker takes them.
    pub(crate) eager: Mutex<HashMap<u64, tokio::sync::oneshot::Receiver<EagerOutcome>>>,
    /// The clock of every time-based decision.
    pub(crate) clock: Arc<dyn Clock>,
    /// Which committed steps go to L3 (rank 0's answer is everyone's).
    pub(crate) upload_policy: UploadPolicy,
    /// Threads hashing (and copying) a save: the configuration's, resolved
    /// once ([`Config::effective_hash_threads`]).
    pub(crate) hash_threads: usize,
    /// Saves, restores and errors, for Prometheus.
    pub(crate) metrics: crate::metrics::Metrics,
    /// "Step committed" events (the uploader and replicator subscribe).
    pub(crate) commits: CommitEvents,
    /// Steps this rank knows committed in some tier: a save of one of
    /// them is refused.
    pub(crate) committed: KnownCommitted,
    /// After a restore that left L3 to the lister: the oldest step from
    /// which its view showed every L3 step (0: none). A save of an older
    /// step that `committed` does not know reads this rank's record on L3
    /// first (`refuse_committed`).
    pub(crate) l3_unlisted_below: std::sync::atomic::AtomicU64,
    /// The L3 lister (rank 0 of a job of several ranks) could not list L3
    /// for its first save: which steps L3 holds is unknown, so it votes
    /// for no upload (its vote decides for every rank) until a listing
    /// succeeds ([`Self::relist_l3_in_background`], or a restore). An
    /// upload could otherwise complete on L3 a step it holds from an
    /// earlier start with shards of this one.
    pub(crate) l3_unlisted: std::sync::atomic::AtomicBool,
    /// A background listing of L3 runs ([`Self::relist_l3_in_background`]).
    pub(crate) l3_relisting: std::sync::atomic::AtomicBool,
    /// Which rank of this node sends a chunk its ranks share (on the
    /// default L1 only: the claims live in its directory).
    pub(crate) claims: Option<PushClaims>,
    /// Snapshots and restores running now: the background copies hold
    /// back at their batch boundaries meanwhile.
    pub(crate) foreground: crate::foreground::Foreground,
    /// Chunk bytes the eager pushes copied out of staging, for the
    /// metrics.
    pub(crate) eager_copied: Arc<std::sync::atomic::AtomicU64>,
    /// The chunk ids of the last shard this process wrote to L1: the
    /// eager push of the next save is offered only the others. None
    /// before the first, and after a save that failed before its chunks
    /// were all written (that save offers what L1 lacks). Taken by the
    /// persist worker for a save, put back when it has written them.
    pub(crate) last_written: Mutex<Option<HashSet<strata_format::ChunkId>>>,
}

impl Shared {
    /// Refuses a save of a step this rank already committed in some tier
    /// (saving it again would replace a committed shard's manifest):
    /// checked before anything is written. A restore's own listing of the
    /// tiers fills the set (a resuming job restores first, so its saves
    /// list nothing); otherwise the first save lists the tiers once (L3
    /// on one rank of the job, [`Self::list_committed`]). An unreachable
    /// tier is skipped (its own guard still refuses to replace a committed
    /// manifest).
    pub(crate) fn refuse_committed(&self, step: u64) -> Result<()> {
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
        let known = known || self.committed_on_unlisted_l3(step);
        if known {
            self.vote_already(step);
            return Err(Error::AlreadyCommitted {
                step,
                tier: "by this rank".into(),
            });
        }
        Ok(())
    }

    /// Whether this rank's commit record of `step` is on L3, read directly
    /// (one request), for a step older than what a restore that left L3 to
    /// the lister was shown (its view carries the newest steps only). An
    /// unreachable L3 says no: its own guard still refuses to replace a
    /// committed manifest.
    fn committed_on_unlisted_l3(&self, step: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if step >= self.l3_unlisted_below.load(Relaxed) {
            return false;
        }
        let Some(l3) = self.tiers.remote() else {
            return false;
        };
        // On a thread of its own, as the listing above.
        std::thread::scope(|sc| {
            sc.spawn(|| {
                self.rt.block_on(
                    l3.store
                        .get_commit_record(&self.cfg.job, step, self.cfg.rank),
                )
            })
            .join()
        })
        .is_ok_and(|r| matches!(r, Ok(Some(_))))
    }

    /// Takes part in the barrier of a step this rank refused to save again
    /// because it holds it committed, on a thread of its own (the refusal
    /// returns at once): a rank that did save it (it lacks its record, as
    /// after a split) learns the step was decided before, keeps the shard
    /// it voted for then, and fails like this one instead of waiting at
    /// the barrier until the timeout. Where every rank refuses, the round
    /// completes at once.
    fn vote_already(&self, step: u64) {
        let (coord, cfg) = (self.coord.clone(), self.cfg.clone());
        let vote = crate::coord::commit::Vote {
            ok: true,
            upload: false,
            already: true,
        };
        let spawned = std::thread::Builder::new()
            .name("strata-refused-vote".into())
            .spawn(move || {
                if let Err(e) = crate::coord::commit::barrier(&*coord, &cfg, step, vote) {
                    tracing::debug!(step, error = %e, "the barrier of a refused save did not complete");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(step, error = %e, "cannot start the refused save's vote");
        }
    }

    /// The peers (L2), in ring order (empty: no replication).
    pub(crate) fn l2(&self) -> &[Tier] {
        self.tiers.peers()
    }

    /// Object storage (L3), when configured.
    pub(crate) fn l3(&self) -> Option<&Arc<dyn ChunkStore>> {
        self.tiers.remote().map(|t| &t.store)
    }

    /// Every tier's listing of the job's steps (the catalog).
    pub(crate) fn catalog(&self) -> Catalog {
        self.rt
            .block_on(Catalog::list(&self.cfg.job, self.tiers.tiers().to_vec()))
    }

    /// This process's metrics in Prometheus' text format, the copiers'
    /// state read now.
    pub(crate) fn metrics_text(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = self.metrics.render(
            &self.uploads.snapshot(),
            &self.replication.snapshot(),
            (
                self.uploads.dropped.load(Relaxed),
                self.replication.dropped.load(Relaxed),
            ),
        );
        self.metrics.seconds_counter(
            &mut out,
            "strata_background_held_seconds_total",
            "Time the background copies (push to the peers, upload to L3) held back for this process's snapshots and restores, summed over the copies (it can pass wall time).",
            self.foreground.held().as_secs_f64(),
        );
        self.metrics.bytes_counter(
            &mut out,
            "strata_restore_lent_buffer_bytes_total",
            "Read buffers a restore read into that the held background copies lent it, instead of new memory it would have faulted in.",
            self.foreground.spares_used(),
        );
        self.metrics.bytes_counter(
            &mut out,
            "strata_eager_copied_bytes_total",
            "Chunk bytes the eager push copied out of the staging memory to send them to the peers beside the L1 write (chunks new since the last save).",
            self.eager_copied.load(Relaxed),
        );
        out
    }

    /// The steps this rank must not save again, from every tier it can
    /// list: those it committed itself. In a job of several ranks with L3,
    /// only rank [`LISTER`] lists L3, as a restore does (one listing per
    /// job, not one per rank), and it refuses every step of this world
    /// that any rank committed there: its refusal decides the step for
    /// every rank at the barrier (`vote_already`), so a rank that saved it
    /// again discards its new shard and nothing reaches L3. A lister that
    /// cannot list L3 sets [`Self::l3_unlisted`].
    pub(crate) fn list_committed(&self) -> BTreeSet<u64> {
        let cfg = &self.cfg;
        let shared = self.lists_l3_for_the_job().is_some();
        let (catalog, _) = self.catalog_leaving_l3_to_the_lister();
        let mut committed = BTreeSet::new();
        for l in catalog.listings() {
            let l3 = shared && l.tier.kind == TierKind::L3;
            match &l.steps {
                Ok(steps) if l3 => {
                    committed.extend(committed_by_any_rank(cfg, steps));
                    self.l3_unlisted.store(false, Ordering::Release);
                }
                Ok(steps) => committed.extend(crate::coord::commit::restorable(cfg, steps)),
                Err(e) => {
                    tracing::warn!(tier = %l.tier.name, error = %e, "cannot list a tier to check for committed steps");
                    if l3 {
                        self.l3_unlisted.store(true, Ordering::Release);
                    }
                }
            }
        }
        committed
    }

    /// Every tier's listing, except L3 on a rank that leaves it to
    /// [`LISTER`] (a job of several ranks with L3: one listing for the
    /// job, not one per rank); and whether this rank left it.
    pub(crate) fn catalog_leaving_l3_to_the_lister(&self) -> (Catalog, bool) {
        let cfg = &self.cfg;
        let defer = cfg.world_size > 1 && self.tiers.remote().is_some() && cfg.rank != LISTER;
        if !defer {
            return (self.catalog(), false);
        }
        let catalog = self.rt.block_on(Catalog::list_some(
            &cfg.job,
            self.tiers.tiers().to_vec(),
            |t| t.kind != TierKind::L3,
        ));
        (catalog, true)
    }

    /// L3, when this rank lists it for every rank of the job (rank
    /// [`LISTER`] of a job of several ranks).
    fn lists_l3_for_the_job(&self) -> Option<&Tier> {
        let cfg = &self.cfg;
        self.tiers
            .remote()
            .filter(|_| cfg.world_size > 1 && cfg.rank == LISTER)
    }

    /// Where the lister could not list L3 ([`Self::l3_unlisted`]), lists
    /// it again on a thread of its own (one at a time; the save does not
    /// wait): once it answers, its steps are refused and uploads resume.
    pub(crate) fn relist_l3_in_background(self: &Arc<Self>) {
        if !self.l3_unlisted.load(Ordering::Acquire)
            || self.l3_relisting.swap(true, Ordering::AcqRel)
        {
            return;
        }
        /// Lets the next save start a listing, however this one ends (a
        /// panic included).
        struct Done(Arc<Shared>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.l3_relisting.store(false, Ordering::Release);
            }
        }
        let done = Done(self.clone());
        let spawned = std::thread::Builder::new()
            .name("strata-l3-relist".into())
            .spawn(move || {
                let s = &done.0;
                let Some(l3) = s.lists_l3_for_the_job() else {
                    return;
                };
                let since = s.committed.forgotten();
                match s.rt.block_on(l3.store.list_steps(&s.cfg.job)) {
                    // A deletion meanwhile: the next save lists again.
                    Ok(steps) => {
                        let mine = committed_by_any_rank(&s.cfg, &steps);
                        if s.committed.fill_unless_forgotten_since(since, mine) {
                            s.l3_unlisted.store(false, Ordering::Release);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "L3 still cannot be listed: steps are not uploaded");
                    }
                }
            });
        // A thread that could not start dropped `done` with its closure.
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start listing L3 again");
        }
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

/// The steps of this world that any rank committed in a tier's listing:
/// what the L3 lister refuses for every rank.
fn committed_by_any_rank(cfg: &Config, steps: &[strata_tiered::StepInfo]) -> BTreeSet<u64> {
    steps
        .iter()
        .filter(|st| st.world_size() == Some(cfg.world_size) && !st.committed_ranks().is_empty())
        .map(|st| st.step)
        .collect()
}

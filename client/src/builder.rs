//! Assembling a [`Checkpointer`]: settings from a [`Config`], components
//! (the coordinator, the tier stack, the clock) from builder methods; then
//! the shared state and the background workers, each subscribed to the
//! commit protocol's "step committed" events. The top of the module graph:
//! nothing imports it but the crate root.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use strata_tiered::{ChunkStore, Clock, L1Store, L3Store, SystemClock};

use crate::checkpointer::Checkpointer;
use crate::config::Config;
use crate::coord::commit::{CommitEvents, KnownCommitted};
use crate::coord::coordinator::{Coordinator, SoloCoordinator};
use crate::coord::etcd::{EtcdCoordinator, EtcdOptions, NodePlace};
use crate::error::{Error, Result};
use crate::health::Background;
use crate::mirror;
use crate::policy::UploadPolicy;
use crate::save::persist::PersistJob;
use crate::shared::{OwnRuntime, Shared};
use crate::staging::StagingPool;
use crate::tier_states::UploadJob;
use crate::tiers::open::{open_l3, open_peers};
use crate::tiers::{Tier, TierStack};

/// Assembles a [`Checkpointer`]: settings from a [`Config`], components
/// (the coordinator, the tiers, the clock) from builder methods; whatever
/// is not given comes from the config.
#[must_use]
pub struct CheckpointerBuilder {
    pub(crate) cfg: Config,
    pub(crate) coord: Option<Arc<dyn Coordinator>>,
    pub(crate) local: Option<Arc<dyn ChunkStore>>,
    pub(crate) peers: Option<Vec<Tier>>,
    pub(crate) remote: Option<Option<Arc<dyn ChunkStore>>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

impl CheckpointerBuilder {
    pub(crate) fn new(cfg: Config) -> Self {
        CheckpointerBuilder {
            cfg,
            coord: None,
            local: None,
            peers: None,
            remote: None,
            clock: Arc::new(SystemClock),
            runtime: None,
        }
    }

    /// How ranks agree (default: etcd when `etcd_endpoints` is set, else a
    /// world of one).
    pub fn coordinator(mut self, coord: Arc<dyn Coordinator>) -> Self {
        self.coord = Some(coord);
        self
    }

    /// Every tier at once (the config's `l1_dir`, `peers` and `l3_url` are
    /// then ignored). A stack without L1 keeps L1 on `l1_dir`.
    pub fn tiers(mut self, stack: TierStack) -> Self {
        if let Some(l1) = stack.l1() {
            self.local = Some(l1.store.clone());
        }
        self.peers = Some(stack.peers().to_vec());
        self.remote = Some(stack.remote().map(|t| t.store.clone()));
        self
    }

    /// The local store instead of L1 on `l1_dir`.
    pub fn local(mut self, store: Arc<dyn ChunkStore>) -> Self {
        self.local = Some(store);
        self
    }

    /// The peers ([`Tier::peer`]), in ring order, instead of the config's
    /// `peers`.
    pub fn peers(mut self, peers: Vec<Tier>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// The remote store (or none) instead of the config's `l3_url`; the
    /// upload policy settings apply to it.
    pub fn remote(mut self, store: Option<Arc<dyn ChunkStore>>) -> Self {
        self.remote = Some(store);
        self
    }

    /// The clock every time-based decision asks (default: the system's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Drive the tier calls on `handle`, a multi-thread runtime the caller
    /// owns, instead of a runtime of the checkpointer's own. For a process
    /// that runs many checkpointers (a test bed of simulated ranks, a
    /// process that hosts several ranks): each own runtime costs a worker
    /// thread and four file descriptors. The runtime must have I/O and
    /// time enabled, keep a worker free for the checkpointer's calls, and
    /// outlive the checkpointer; never drop or close the checkpointer, nor
    /// call its blocking methods, from a task of that runtime (its threads
    /// wait on the runtime, which that task would be holding). Threads the
    /// checkpointer's calls start in the runtime's blocking pool may run at
    /// `background_nice` (a thread inherits its starter's priority); an
    /// own runtime runs at it throughout. Tasks the checkpointer spawned
    /// may outlive it by the time they take to finish. A current-thread
    /// runtime is refused at build: calls from the checkpointer's threads
    /// would never be driven.
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Builds the checkpointer (starts its workers).
    pub fn build(self) -> Result<Checkpointer> {
        Checkpointer::from_builder(self)
    }
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
    /// upload policy settings apply to `l3`, which is composed as the
    /// configured one is ([`L3Store::into_tier`]: retries over metrics).
    /// The same as `builder(cfg).coordinator(coord).remote(l3.into_tier())`.
    pub fn with_tiers(
        cfg: Config,
        coord: Arc<dyn Coordinator>,
        l3: Option<L3Store>,
    ) -> Result<Self> {
        Self::builder(cfg)
            .coordinator(coord)
            .remote(l3.map(|s| Arc::new(s.into_tier()) as Arc<dyn ChunkStore>))
            .build()
    }

    pub(crate) fn from_builder(b: CheckpointerBuilder) -> Result<Self> {
        let cfg = b.cfg;
        cfg.validate()?;
        // Bound before anything starts: an address in use fails here,
        // with no thread, claim or runtime left behind.
        let metrics_bound = cfg
            .metrics_listen
            .as_deref()
            .map(crate::metrics::serve::bind)
            .transpose()?;
        let coord: Arc<dyn Coordinator> = match b.coord {
            Some(c) => c,
            None if !cfg.etcd_endpoints.is_empty() => match NodePlace::from_config(&cfg) {
                Some(place) => {
                    let opts = EtcdOptions::from_config(&cfg)?;
                    // A member waits for its leader as long as the leader
                    // may wait for a dead predecessor's lease, and more.
                    let wait = Duration::from_secs(cfg.coordination_timeout_secs)
                        .max(
                            opts.lease_ttl
                                .saturating_mul(3)
                                .saturating_add(Duration::from_secs(10)),
                        );
                    Arc::new(EtcdCoordinator::join_node(
                        opts,
                        &cfg.job,
                        cfg.rank,
                        cfg.world_size,
                        &place,
                        wait,
                    )?)
                }
                None => Arc::new(EtcdCoordinator::connect(
                    EtcdOptions::from_config(&cfg)?,
                    &cfg.job,
                    cfg.rank,
                    cfg.world_size,
                )?),
            },
            None if cfg.world_size == 1 => Arc::new(SoloCoordinator),
            None => {
                return Err(Error::Config(format!(
                    "a world of {} ranks needs a coordinator: set etcd_endpoints (STRATA_ETCD_ENDPOINTS) or give one to the builder",
                    cfg.world_size
                )))
            }
        };
        if coord.world_size() != cfg.world_size {
            return Err(Error::Config(format!(
                "coordinator has {} ranks, config {}",
                coord.world_size(),
                cfg.world_size
            )));
        }
        let rt = match b.runtime {
            Some(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread => {
                return Err(Error::Config(
                    "the checkpointer's runtime must be a multi-thread one: a current-thread runtime is driven only by its own thread".into(),
                ))
            }
            Some(h) => OwnRuntime::shared(h),
            // Its threads move the background copies' bytes (and the L1
            // writes'): at the background priority.
            None => {
                let nice = cfg.background_nice;
                OwnRuntime::own(
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .thread_name("strata-rt")
                        .on_thread_start(move || crate::priority::lower_this_thread(nice))
                        .enable_all()
                        .build()
                        .map_err(|e| Error::Config(format!("cannot start the runtime: {e}")))?,
                )
            }
        };
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
                open_peers(&cfg)?
            }
        };
        let l3 = match b.remote {
            Some(r) => r,
            None => match &cfg.l3_url {
                Some(url) => Some(open_l3(&cfg, url)?),
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
        let claims = l1_disk
            .as_ref()
            .map(|_| crate::push_claims::PushClaims::new(&cfg.l1_dir, &cfg.job));
        let group = strata_peer::PeerGroup::new(
            l2.iter()
                .map(|t| strata_peer::Member {
                    node: t.node().to_string(),
                    store: t.store.clone(),
                })
                .collect(),
            cfg.replicas,
        );
        let tiers = TierStack::local(l1.clone()).with_peers(l2).with_remote(l3);
        let shared = Arc::new(Shared {
            rt,
            tiers,
            group,
            l1,
            l1_disk,
            coord,
            pool: StagingPool::default(),
            restores: std::sync::atomic::AtomicU64::new(0),
            gpu: Mutex::new(None),
            uploads: Arc::default(),
            upload_tx: Mutex::new(Some(upload_tx.clone())),
            replication: Arc::default(),
            eager: Mutex::default(),
            clock: b.clock,
            upload_policy,
            hash_threads: cfg.effective_hash_threads(),
            metrics: crate::metrics::Metrics::new(&cfg.job, cfg.rank, &cfg.node),
            commits: CommitEvents::default(),
            committed: KnownCommitted::default(),
            l3_unlisted_below: Default::default(),
            l3_unlisted: Default::default(),
            l3_relisting: Default::default(),
            claims,
            foreground: crate::foreground::Foreground::default(),
            eager_copied: Arc::default(),
            last_written: Mutex::default(),
            cfg,
        });
        // The workers hear of committed steps as subscribers; the save
        // path never calls them.
        let wait_limit = Duration::from_secs(shared.cfg.coordination_timeout_secs);
        shared.commits.subscribe(Box::new(mirror::subscriber(
            Arc::new(mirror::L3Lane {
                uploads: shared.uploads.clone(),
                tx: Mutex::new(upload_tx),
            }),
            mirror::Backlog {
                max: shared.cfg.max_pending_uploads,
                policy: shared.cfg.upload_backlog,
                wait_limit,
            },
        )));
        let replicator = if shared.l2().is_empty() {
            None
        } else {
            shared.commits.subscribe(Box::new(mirror::subscriber(
                Arc::new(mirror::PeersLane {
                    repl: shared.replication.clone(),
                    tx: Mutex::new(repl_tx),
                    wanted: shared.cfg.replicas,
                }),
                mirror::Backlog {
                    max: shared.cfg.max_pending_pushes,
                    policy: shared.cfg.upload_backlog,
                    wait_limit,
                },
            )));
            let s2 = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("strata-replicate".into())
                    .spawn(move || {
                        crate::priority::lower_this_thread(s2.cfg.background_nice);
                        mirror::run_replication(&s2, &repl_rx)
                    })
                    .map_err(|e| Error::Config(format!("cannot start replication: {e}")))?,
            )
        };
        let uploader = match shared.l3().cloned() {
            Some(l3) => {
                let s3 = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("strata-upload".into())
                        .spawn(move || {
                            crate::priority::lower_this_thread(s3.cfg.background_nice);
                            mirror::run_uploads(&s3, l3, &upload_rx)
                        })
                        .map_err(|e| Error::Config(format!("cannot start the uploader: {e}")))?,
                )
            }
            None => None,
        };
        let (tx, rx) = mpsc::channel::<PersistJob>();
        let s2 = shared.clone();
        let background = Arc::new(Background::new(shared.cfg.on_background_error));
        let worker = crate::save::persist::start_worker(s2, rx, background.clone())?;
        let metrics = match metrics_bound {
            Some(bound) => {
                let weak = Arc::downgrade(&shared);
                Some(crate::metrics::serve::MetricsServer::start(
                    bound,
                    Box::new(move || weak.upgrade().map(|s| s.metrics_text())),
                )?)
            }
            None => None,
        };
        Ok(Checkpointer {
            shared,
            tx: Some(tx),
            worker: Some(worker),
            uploader,
            replicator,
            inflight: Mutex::new(None),
            skipped: std::sync::atomic::AtomicU64::new(0),
            background,
            metrics,
        })
    }
}

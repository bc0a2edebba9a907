//! The tier stack a [`Checkpointer`](crate::Checkpointer) works over, and
//! the builder that assembles a checkpointer from settings and components.
//!
//! The engine knows tiers only as `Arc<dyn ChunkStore>` in three roles,
//! fastest first: the node's local store (every save is written there
//! first), the peers in ring order (replicas), and the remote store (lazy
//! uploads). [`TierStack::from_config`] builds the default stack (L1 on
//! `l1_dir`, peer services, L3 from `l3_url`); a caller may hand in any
//! stack instead, its own `ChunkStore` or a wrapper included.

use std::sync::Arc;

use strata_tiered::{ChunkStore, Clock, L1Store, L3Options, L3Store, SystemClock};

use crate::checkpointer::Checkpointer;
use crate::config::Config;
use crate::coordinator::{Coordinator, SoloCoordinator};
use crate::error::{Error, Result};

/// A tier of the stack with the name reports use.
#[derive(Clone, Debug)]
pub struct NamedTier {
    /// The peer's node name, or "l1" / "l3".
    pub name: String,
    /// The store.
    pub store: Arc<dyn ChunkStore>,
}

/// The ordered tiers of a checkpointer: local, then peers, then remote.
#[derive(Clone, Debug)]
pub struct TierStack {
    /// This node's store (L1): written by every save, read first.
    pub local: Arc<dyn ChunkStore>,
    /// Peer stores in ring order (L2): every committed step is pushed to
    /// the first `replicas` that answer. Empty: no replication.
    pub peers: Vec<NamedTier>,
    /// Object storage (L3): steps the upload policy picks. None: no L3.
    pub remote: Option<Arc<dyn ChunkStore>>,
}

impl TierStack {
    /// A stack of one local store.
    pub fn local(store: Arc<dyn ChunkStore>) -> Self {
        TierStack {
            local: store,
            peers: Vec::new(),
            remote: None,
        }
    }

    /// The default stack `cfg` describes: L1 on `l1_dir` with the chosen
    /// I/O engine, the peer services of `peers` (ring order for this
    /// node and rank), L3 from `l3_url`. Must be called inside a tokio
    /// runtime context when peers are configured (their endpoints bind to
    /// it).
    pub fn from_config(cfg: &Config) -> Result<Self> {
        let l1 = L1Store::open(&cfg.l1_dir, cfg.engine()?)?;
        let remote = match &cfg.l3_url {
            Some(url) => Some(Arc::new(open_l3(cfg, url)?) as Arc<dyn ChunkStore>),
            None => None,
        };
        Ok(TierStack {
            local: Arc::new(l1),
            peers: crate::replication::open_peers(cfg)?,
            remote,
        })
    }

    /// Every tier, fastest first.
    pub fn ordered(&self) -> Vec<&Arc<dyn ChunkStore>> {
        std::iter::once(&self.local)
            .chain(self.peers.iter().map(|p| &p.store))
            .chain(self.remote.as_ref())
            .collect()
    }
}

/// Opens the L3 store `cfg.l3_url` names, with `cfg.l3_options`.
pub(crate) fn open_l3(cfg: &Config, url: &str) -> Result<L3Store> {
    let opts: Vec<(String, String)> = cfg
        .l3_options
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    L3Store::from_url(url, &opts, L3Options::default())
        .map_err(|e| Error::Config(format!("l3_url {url:?}: {e}")))
}

/// Assembles a [`Checkpointer`]: settings from a [`Config`], components
/// (the coordinator, the tiers, the clock) from builder methods; whatever
/// is not given comes from the config.
#[must_use]
pub struct CheckpointerBuilder {
    pub(crate) cfg: Config,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) local: Option<Arc<dyn ChunkStore>>,
    pub(crate) peers: Option<Vec<NamedTier>>,
    pub(crate) remote: Option<Option<Arc<dyn ChunkStore>>>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl CheckpointerBuilder {
    pub(crate) fn new(cfg: Config) -> Self {
        CheckpointerBuilder {
            cfg,
            coord: Arc::new(SoloCoordinator),
            local: None,
            peers: None,
            remote: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// How ranks agree (default: a world of one).
    pub fn coordinator(mut self, coord: Arc<dyn Coordinator>) -> Self {
        self.coord = coord;
        self
    }

    /// Every tier at once (the config's `l1_dir`, `peers` and `l3_url` are
    /// then ignored).
    pub fn tiers(mut self, stack: TierStack) -> Self {
        self.local = Some(stack.local);
        self.peers = Some(stack.peers);
        self.remote = Some(stack.remote);
        self
    }

    /// The local store instead of L1 on `l1_dir`.
    pub fn local(mut self, store: Arc<dyn ChunkStore>) -> Self {
        self.local = Some(store);
        self
    }

    /// The peers, in ring order, instead of the config's `peers`.
    pub fn peers(mut self, peers: Vec<NamedTier>) -> Self {
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

    /// Builds the checkpointer (starts its workers).
    pub fn build(self) -> Result<Checkpointer> {
        Checkpointer::from_builder(self)
    }
}

//! The tier stack a [`Checkpointer`](crate::Checkpointer) works over, and
//! the opening of its tiers from a [`Config`] (the checkpointer and the
//! inspection tools open them the same way).
//!
//! The engine knows tiers only as `Arc<dyn ChunkStore>` in three roles,
//! fastest first: the node's local store (every save is written there
//! first), the peers in ring order (replicas), and the remote store (lazy
//! uploads). [`TierStack::from_config`] builds the default stack (L1 on
//! `l1_dir`, peer services, L3 from `l3_url`); a caller may hand in any
//! stack instead, its own `ChunkStore` or a wrapper included.

use std::sync::Arc;

use strata_tiered::{ChunkStore, L1Store, L3Options, L3Store};

use strata_peer::PeerStore;

use crate::config::Config;
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
            peers: open_peers(cfg)?,
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
    let l3 = L3Options {
        // With L3 collected, an upload rewrites the old chunks it reuses
        // (see `Config::l3_gc_grace_secs`).
        refresh_after: cfg.l3_refresh_after(),
        ..L3Options::default()
    };
    L3Store::from_url(url, &opts, l3).map_err(|e| {
        Error::Config(format!(
            "l3_url {:?}: {}",
            strata_tiered::redact_url(url),
            strata_tiered::scrub_url_secrets(&e.to_string(), url)
        ))
    })
}

/// Opens the peers of `cfg` in ring order (none without `peers`). Must run
/// inside a tokio runtime context (the endpoints bind to it).
pub(crate) fn open_peers(cfg: &Config) -> Result<Vec<NamedTier>> {
    let list = cfg.peer_list()?;
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let Some(dir) = &cfg.peer_certs else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
    // By node unless asked to spread: the ranks of a node then share their
    // peers, and identical chunks of data-parallel ranks are stored once.
    let rotate = if cfg.spread_replicas { cfg.rank } else { 0 };
    let order = strata_peer::ring::placement(&names, &cfg.node, rotate);
    order
        .into_iter()
        .filter_map(|name| list.iter().find(|(n, _)| *n == name).cloned())
        .map(|(name, addr)| {
            Ok(NamedTier {
                store: open_peer(cfg, dir, &name, addr)?,
                name,
            })
        })
        .collect()
}

/// Opens the peer service `name` at `addr` with the job's client
/// certificate from `certs` (the CA and `client-<job>`). Must run inside a
/// tokio runtime context (the endpoint binds to it); connects on first use.
pub(crate) fn open_peer(
    cfg: &Config,
    certs: &std::path::Path,
    name: &str,
    addr: std::net::SocketAddr,
) -> Result<Arc<dyn ChunkStore>> {
    let files = strata_peer::tls::CertFiles::in_dir(certs, &format!("client-{}", cfg.job));
    let store = PeerStore::new(addr, name, &files, strata_peer::PeerOptions::default())
        .map_err(|e| Error::Config(format!("peer {name}: {e}")))?;
    Ok(Arc::new(store))
}

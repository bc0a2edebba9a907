//! Opening a job's tiers from a [`Config`]: the stack a checkpointer
//! works over ([`TierStack::from_config`]) and the same tiers opened
//! read-only for tools ([`Tiers`]: the CLI's commands and the Python
//! package's catalog), with a runtime to drive them.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_format::ChunkId;
use strata_peer::PeerStore;
use strata_tiered::{ChunkStore, L1Store, L3Options, L3Store, StepInfo};

use super::catalog::{load_shard, Catalog, LoadedShard};
use super::reader::ShardReader;
use super::{Tier, TierStack};
use crate::config::Config;
use crate::error::{Error, Result};

impl TierStack {
    /// The default stack `cfg` describes: L1 on `l1_dir` with the chosen
    /// I/O engine, the peer services of `peers` (ring order for this
    /// node and rank), L3 from `l3_url`. Must be called inside a tokio
    /// runtime context when peers are configured (their endpoints bind to
    /// it).
    pub fn from_config(cfg: &Config) -> Result<Self> {
        let l1 = L1Store::open(&cfg.l1_dir, cfg.engine()?)?;
        let remote = match &cfg.l3_url {
            Some(url) => Some(open_l3(cfg, url)?),
            None => None,
        };
        Ok(TierStack::local(Arc::new(l1))
            .with_peers(open_peers(cfg)?)
            .with_remote(remote))
    }
}

/// Opens the L3 tier `cfg.l3_url` names, with `cfg.l3_options`, as
/// [`L3Store::into_tier`] composes it: retries over metrics over the store.
pub(crate) fn open_l3(cfg: &Config, url: &str) -> Result<Arc<dyn ChunkStore>> {
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
    let store = L3Store::from_url(url, &opts, l3).map_err(|e| {
        Error::Config(format!(
            "l3_url {:?}: {}",
            strata_tiered::redact_url(url),
            strata_tiered::scrub_url_secrets(&e.to_string(), url)
        ))
    })?;
    Ok(Arc::new(store.into_tier()))
}

/// Opens the peers of `cfg` in ring order (none without `peers`). Must run
/// inside a tokio runtime context (the endpoints bind to it).
pub(crate) fn open_peers(cfg: &Config) -> Result<Vec<Tier>> {
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
        .map(|(name, addr)| Ok(Tier::peer(&name, open_peer(cfg, dir, &name, addr)?)))
        .collect()
}

/// Opens the peer service `name` at `addr` with the job's client
/// certificate from `certs` (the CA and `client-<job>`). Must run inside a
/// tokio runtime context (the endpoint binds to it); connects on first use.
fn open_peer(
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

/// The tiers of one job, opened read-only, with a runtime to drive them:
/// what tools read a job's checkpoints through. Opening writes nothing: a
/// missing L1 directory is an error (or skipped), never created.
pub struct Tiers {
    rt: tokio::runtime::Runtime,
    cfg: Config,
    stack: TierStack,
}

impl Tiers {
    /// Opens every tier `cfg` names: L1 if its directory exists (an error
    /// if `require_l1` and it does not), each peer in `peers` (in config
    /// order; connections are made on first use), L3 if `l3_url` is set.
    pub fn open(cfg: Config, require_l1: bool) -> Result<Self> {
        strata_format::names::validate_job_id(&cfg.job)
            .map_err(|e| Error::Config(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Pipeline(format!("starting a runtime: {e}")))?;
        let mut tiers = Vec::new();
        if cfg.l1_dir.is_dir() {
            let l1 = L1Store::open(&cfg.l1_dir, cfg.engine()?)?;
            tiers.push(Tier::l1(Arc::new(l1)));
        } else if require_l1 {
            return Err(Error::Config(format!(
                "no L1 store at {} (set --l1, l1_dir or STRATA_L1_DIR)",
                cfg.l1_dir.display()
            )));
        }
        if let Some(url) = &cfg.l3_url {
            // A local-directory store would be created by opening it: a
            // reader must not create one (a typo would show an empty tier).
            if let Some(path) = url.strip_prefix("file://") {
                if !std::path::Path::new(path).is_dir() {
                    return Err(Error::Config(format!(
                        "no L3 directory at {} (l3_url {:?})",
                        strata_tiered::redact_url(path),
                        strata_tiered::redact_url(url)
                    )));
                }
            }
            let l3 = {
                let _enter = rt.enter();
                open_l3(&cfg, url)?
            };
            tiers.push(Tier::l3(l3));
        }
        let peers = cfg.peer_list()?;
        if !peers.is_empty() {
            let certs = cfg.peer_certs.clone().ok_or_else(|| {
                Error::Config("peers need peer_certs (the CA and the job's certificate)".into())
            })?;
            for (name, addr) in peers {
                let store = {
                    let _enter = rt.enter();
                    open_peer(&cfg, &certs, &name, addr)?
                };
                tiers.push(Tier::peer(&name, store));
            }
        }
        let stack = TierStack::new(tiers)?;
        Ok(Tiers { rt, cfg, stack })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The job.
    pub fn job(&self) -> &str {
        &self.cfg.job
    }

    /// The tiers, fastest first (L1, peers in config order, then L3).
    pub fn tiers(&self) -> &[Tier] {
        self.stack.tiers()
    }

    /// The tier stack.
    pub fn stack(&self) -> &TierStack {
        &self.stack
    }

    /// The runtime the tiers run on, to spawn work beside the callers of
    /// [`Tiers::block_on`] (readahead, for one).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }

    /// Runs a future on the tiers' runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Lists `tiers` (a tier that cannot be listed is kept with its error).
    pub fn catalog(&self, tiers: &[&Tier]) -> Catalog {
        let owned: Vec<Tier> = tiers.iter().map(|&t| t.clone()).collect();
        self.rt.block_on(Catalog::list(&self.cfg.job, owned))
    }

    /// The job's steps in `tier`, oldest first.
    pub fn steps(&self, tier: &Tier) -> Result<Vec<StepInfo>> {
        Ok(self.rt.block_on(tier.store.list_steps(&self.cfg.job))?)
    }

    /// Loads rank `rank`'s manifest of `step` from `tier`, checked against
    /// the commit record in `steps` (that tier's listing) that names it.
    pub fn load_shard(
        &self,
        tier: &Tier,
        steps: &[StepInfo],
        step: u64,
        rank: u32,
    ) -> Result<LoadedShard> {
        self.rt.block_on(load_shard(
            tier.store.as_ref(),
            &self.cfg.job,
            steps,
            step,
            rank,
        ))
    }

    /// The stored size of every chunk `tier` holds for the job (file sizes
    /// on L1, object sizes on L3: one listing, through the tier's
    /// `list_chunk_info`). `None` for a tier that does not report sizes.
    pub fn chunk_sizes(&self, tier: &Tier) -> Result<Option<BTreeMap<ChunkId, u64>>> {
        let info = self
            .rt
            .block_on(tier.store.list_chunk_info(&self.cfg.job))?;
        Ok(info
            .into_iter()
            .map(|c| c.stored_len.map(|n| (c.id, n)))
            .collect())
    }

    /// A reader of rank `rank`'s shard of `step`: the manifest from the
    /// fastest tier of `cat` with a good copy, each chunk from that tier,
    /// else from the next tier of `cat` that could be listed (fastest
    /// first) with a good one. With `repair`, a tier that holds the shard
    /// committed and was found missing or holding a damaged chunk gets the
    /// good copy written back (and read back verified).
    pub fn shard_reader(
        &self,
        cat: &Catalog,
        step: u64,
        rank: u32,
        repair: bool,
        cache_bytes: usize,
    ) -> Result<ShardReader> {
        let found = self.rt.block_on(cat.shard(step, rank, |_, _| true))?;
        // The tier that served the manifest first (it holds the shard
        // committed), then the others that could be listed, fastest first
        // (a dead tier would only cost its timeout on every fallback).
        let tiers = std::iter::once(found.tier.clone())
            .chain(
                cat.listings()
                    .iter()
                    .filter(|l| l.tier.name != found.tier.name && l.steps.is_ok())
                    .map(|l| l.tier.clone()),
            )
            .collect();
        // Only tiers that hold the shard committed are repaired: a tier
        // that never held it (another node's L1, a peer outside its
        // replicas) gets nothing written.
        let holds = |t: &Tier| {
            cat.info(t, step)
                .is_some_and(|i| i.committed_ranks().contains(&rank))
        };
        Ok(
            ShardReader::new(&self.cfg.job, found.shard.manifest, tiers, cache_bytes)
                .repair(|t| repair && holds(t)),
        )
    }
}

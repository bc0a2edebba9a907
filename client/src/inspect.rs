//! Read-only access to a job's checkpoints in every tier a [`Config`]
//! names, for tools (the `strata` CLI's `ls`, `show`, `verify`, `diff`,
//! `stat`, `export`): listing steps, loading a shard's manifest checked
//! against its commit record, reading chunks verified. Opening [`Tiers`]
//! writes nothing: a missing L1 directory is an error, not created.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_format::{ChunkId, CommitRecord, ShardManifest};
use strata_tiered::{ChunkStore, L1Store, StepInfo};

use crate::error::{Error, Result};
use crate::Config;

/// Which kind of tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    /// The node's local disk.
    L1,
    /// A peer service.
    L2,
    /// Object storage.
    L3,
}

/// One tier holding the job's checkpoints.
pub struct Tier {
    /// `L1`, `L3`, or `L2:<peer name>`.
    pub name: String,
    /// The kind.
    pub kind: TierKind,
    /// The store.
    pub store: Arc<dyn ChunkStore>,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tier({})", self.name)
    }
}

/// A shard's manifest, loaded from one tier and checked.
#[derive(Clone, Debug)]
pub struct LoadedShard {
    /// The manifest.
    pub manifest: ShardManifest,
    /// Its encoded bytes (their BLAKE3 is the id in the commit record).
    pub bytes: Vec<u8>,
    /// The commit record naming it.
    pub record: CommitRecord,
}

/// The tiers of one job, opened read-only, with a runtime to drive them.
pub struct Tiers {
    rt: tokio::runtime::Runtime,
    cfg: Config,
    tiers: Vec<Tier>,
}

impl Tiers {
    /// Opens every tier `cfg` names: L1 if its directory exists (an error
    /// if `require_l1` and it does not), L3 if `l3_url` is set, each peer in
    /// `peers` (connections are made on first use).
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
            tiers.push(Tier {
                name: "L1".into(),
                kind: TierKind::L1,
                store: Arc::new(l1),
            });
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
                Arc::new(crate::stack::open_l3(&cfg, url)?)
            };
            tiers.push(Tier {
                name: "L3".into(),
                kind: TierKind::L3,
                store: l3,
            });
        }
        let peers = cfg.peer_list()?;
        if !peers.is_empty() {
            let certs = cfg.peer_certs.clone().ok_or_else(|| {
                Error::Config("peers need peer_certs (the CA and the job's certificate)".into())
            })?;
            for (name, addr) in peers {
                let store = {
                    let _enter = rt.enter();
                    crate::stack::open_peer(&cfg, &certs, &name, addr)?
                };
                tiers.push(Tier {
                    name: format!("L2:{name}"),
                    kind: TierKind::L2,
                    store,
                });
            }
        }
        Ok(Tiers { rt, cfg, tiers })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The job.
    pub fn job(&self) -> &str {
        &self.cfg.job
    }

    /// The tiers, fastest first (L1, L3, then peers in config order).
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Runs a future on the tiers' runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
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
}

/// Loads rank `rank`'s manifest of `step` from `tier` and checks it: its
/// BLAKE3 must be the id a commit record in `steps` gives it, and it must
/// name this job, step and rank.
pub async fn load_shard(
    tier: &dyn ChunkStore,
    job: &str,
    steps: &[StepInfo],
    step: u64,
    rank: u32,
) -> Result<LoadedShard> {
    let (record, expected) = steps
        .iter()
        .find(|st| st.step == step)
        .and_then(|info| {
            info.records.values().find_map(|r| {
                r.shards
                    .iter()
                    .find(|sh| sh.rank == rank)
                    .map(|sh| (r.clone(), sh.manifest))
            })
        })
        .ok_or_else(|| {
            Error::NothingToRestore(Some(format!(
                "no commit record for step {step} rank {rank} in {}",
                tier.name()
            )))
        })?;
    let bad = |reason: String| Error::Manifest {
        step,
        rank,
        reason: format!("{} ({})", reason, tier.name()),
    };
    let bytes = tier
        .get_manifest(job, step, rank)
        .await
        .map_err(|e| bad(e.to_string()))?;
    if ShardManifest::id_of(&bytes) != expected {
        return Err(bad("manifest does not match its commit record".into()));
    }
    let manifest = ShardManifest::decode(&bytes).map_err(|e| bad(e.to_string()))?;
    if manifest.info.step != step || manifest.info.rank != rank || manifest.info.job != job {
        return Err(bad("manifest names another job, step or rank".into()));
    }
    Ok(LoadedShard {
        manifest,
        bytes,
        record,
    })
}

//! What every tier holds for the job, listed once: the steps each lists,
//! how far each holds a step, and the manifest of a (step, rank) from the
//! fastest tier that holds a good copy, checked against its commit record.
//! A restore, the CLI and the Python package ask this and nothing else.

use std::collections::{BTreeMap, BTreeSet};

use strata_format::{CommitRecord, ShardManifest};
use strata_tiered::{ChunkStore, StepInfo, StoreError};

use super::Tier;
use crate::error::{Error, Result};

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

/// One tier and its listing of the job's steps (or why it could not be
/// listed).
#[derive(Clone, Debug)]
pub struct Listing {
    /// The tier.
    pub tier: Tier,
    /// Its steps, oldest first, or the error listing them.
    pub steps: std::result::Result<Vec<StepInfo>, StoreError>,
}

/// How far one tier holds a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Commit records name every rank it holds a manifest of.
    Committed,
    /// Some manifests or some ranks' records, not all.
    Partial,
    /// Nothing of the step.
    Absent,
}

/// A shard's manifest found by [`Catalog::shard`].
#[derive(Debug)]
pub struct ShardFound<'c> {
    /// The tier it was read from.
    pub tier: &'c Tier,
    /// That tier's index in the catalog.
    pub index: usize,
    /// The manifest, checked against its record.
    pub shard: LoadedShard,
    /// The tiers tried before it, with why their copy was not used.
    pub errors: Vec<(String, Error)>,
}

/// Every tier's listing of one job's steps, fastest tier first.
#[derive(Clone, Debug)]
pub struct Catalog {
    job: String,
    tiers: Vec<Listing>,
}

impl Catalog {
    /// Lists the job's steps in every tier of `tiers` (all at once; a tier
    /// that cannot be listed is kept with its error: the others answer).
    pub async fn list(job: &str, tiers: Vec<Tier>) -> Self {
        Self::list_some(job, tiers, |_| true).await
    }

    /// [`Catalog::list`] of the tiers `list` picks; the others are kept
    /// with an empty listing, to be filled by [`Catalog::set_listing`]
    /// (a restore leaves L3 to one rank, `restore::shared_l3`).
    pub(crate) async fn list_some(
        job: &str,
        tiers: Vec<Tier>,
        list: impl Fn(&Tier) -> bool,
    ) -> Self {
        let listed = futures::future::join_all(tiers.iter().map(|t| async {
            if list(t) {
                t.store.list_steps(job).await
            } else {
                Ok(Vec::new())
            }
        }))
        .await;
        Catalog {
            job: job.to_string(),
            tiers: tiers
                .into_iter()
                .zip(listed)
                .map(|(tier, steps)| Listing { tier, steps })
                .collect(),
        }
    }

    /// Replaces the listing of the tier named `name` (what a restore learnt
    /// of it without listing it).
    pub(crate) fn set_listing(&mut self, name: &str, steps: Vec<StepInfo>) {
        if let Some(l) = self.tiers.iter_mut().find(|l| l.tier.name == name) {
            l.steps = Ok(steps);
        }
    }

    /// The job.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The tiers with their listings, fastest first.
    pub fn listings(&self) -> &[Listing] {
        &self.tiers
    }

    /// The listing of the tier named `name`.
    pub fn listing(&self, name: &str) -> Option<&Listing> {
        self.tiers.iter().find(|l| l.tier.name == name)
    }

    /// The tiers that could not be listed, with why.
    pub fn unreadable(&self) -> impl Iterator<Item = (&Tier, &StoreError)> {
        self.tiers
            .iter()
            .filter_map(|l| l.steps.as_ref().err().map(|e| (&l.tier, e)))
    }

    fn readable(&self) -> impl Iterator<Item = (&Tier, &[StepInfo])> {
        self.tiers
            .iter()
            .filter_map(|l| l.steps.as_ref().ok().map(|s| (&l.tier, s.as_slice())))
    }

    /// Every step any tier lists.
    pub fn all_steps(&self) -> BTreeSet<u64> {
        self.readable()
            .flat_map(|(_, s)| s.iter().map(|i| i.step))
            .collect()
    }

    /// Steps committed in at least one tier.
    pub fn committed_steps(&self) -> BTreeSet<u64> {
        self.all_steps()
            .into_iter()
            .filter(|&s| {
                self.tiers
                    .iter()
                    .any(|l| self.held(&l.tier, s) == Held::Committed)
            })
            .collect()
    }

    /// Steps some tier holds a readable commit record of: decided steps
    /// (every rank voted them durable), committed in full or not yet.
    pub fn decided_steps(&self) -> BTreeSet<u64> {
        self.readable()
            .flat_map(|(_, s)| s.iter())
            .filter(|i| !i.records.is_empty())
            .map(|i| i.step)
            .collect()
    }

    /// The world size that saved `step`, as the first readable commit
    /// record of it says (None: no tier holds a record of it).
    pub fn world_size(&self, step: u64) -> Option<u32> {
        self.readable()
            .flat_map(|(_, s)| s.iter())
            .filter(|i| i.step == step)
            .find_map(|i| i.world_size())
    }

    /// `tier`'s listing of `step`.
    pub fn info(&self, tier: &Tier, step: u64) -> Option<&StepInfo> {
        self.steps_of(tier).iter().find(|i| i.step == step)
    }

    /// `tier`'s whole listing, empty if it could not be listed.
    pub fn steps_of(&self, tier: &Tier) -> &[StepInfo] {
        self.listing(&tier.name)
            .and_then(|l| l.steps.as_ref().ok())
            .map_or(&[], |v| v.as_slice())
    }

    /// How far `tier` holds `step`. A node's L1 and a peer hold only the
    /// ranks that ran or replicated there: the step is committed in the
    /// tier when every rank it holds a manifest of is committed.
    pub fn held(&self, tier: &Tier, step: u64) -> Held {
        let Some(info) = self.info(tier, step) else {
            return Held::Absent;
        };
        let ranks = info.committed_ranks();
        if !ranks.is_empty() && info.manifests.iter().all(|r| ranks.contains(r)) {
            Held::Committed
        } else if !ranks.is_empty() || !info.manifests.is_empty() {
            Held::Partial
        } else {
            Held::Absent
        }
    }

    /// The step's logical bytes: each rank's shard counted once, from the
    /// commit records of every tier (each rank commits a record of its own).
    pub fn logical_bytes(&self, step: u64) -> u64 {
        self.sum_ranks(self.tiers.iter().map(|l| &l.tier), step)
    }

    /// The step's logical bytes as `tier`'s own records give them.
    pub fn logical_bytes_in(&self, tier: &Tier, step: u64) -> u64 {
        self.sum_ranks(std::iter::once(tier), step)
    }

    fn sum_ranks<'t>(&self, tiers: impl Iterator<Item = &'t Tier>, step: u64) -> u64 {
        let mut per_rank: BTreeMap<u32, u64> = BTreeMap::new();
        for t in tiers {
            for r in self
                .info(t, step)
                .into_iter()
                .flat_map(|i| i.records.values())
            {
                for sh in &r.shards {
                    per_rank.insert(sh.rank, sh.logical_bytes);
                }
            }
        }
        per_rank.values().sum()
    }

    /// A commit record of `step` from any tier (the fastest first).
    pub fn record(&self, step: u64) -> Option<&CommitRecord> {
        self.tiers
            .iter()
            .filter_map(|l| self.info(&l.tier, step))
            .find_map(|i| i.records.values().next())
    }

    /// The ranks of `step` committed in some tier.
    pub fn ranks(&self, step: u64) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for l in &self.tiers {
            if let Some(i) = self.info(&l.tier, step) {
                out.extend(i.committed_ranks());
            }
        }
        out
    }

    /// The newest step committed in any tier, or the step given (which
    /// must be in some tier).
    pub fn pick(&self, step: Option<u64>) -> Result<u64> {
        match step {
            Some(s) if self.all_steps().contains(&s) => Ok(s),
            Some(s) => Err(Error::NothingToRestore(Some(format!(
                "step {s} is in no tier"
            )))),
            None => self.committed_steps().last().copied().ok_or_else(|| {
                Error::NothingToRestore(Some("no committed step in any tier".into()))
            }),
        }
    }

    /// Rank `rank`'s manifest of `step` from the fastest tier that holds a
    /// good one (read, checked against the record that tier lists), trying
    /// only tiers where `usable` says the step may be read (a restore asks
    /// for steps of its own world). Fails with
    /// [`Error::NothingToRestore`] when no usable tier lists the rank
    /// committed (naming the tiers that could not be listed), else with
    /// [`Error::Manifest`] naming every tier's reason (the kind of a bad
    /// manifest, whichever tier said it).
    pub async fn shard(
        &self,
        step: u64,
        rank: u32,
        usable: impl Fn(&Tier, &[StepInfo]) -> bool,
    ) -> Result<ShardFound<'_>> {
        let mut errors: Vec<(String, Error)> = Vec::new();
        let mut seen = false;
        for (index, l) in self.tiers.iter().enumerate() {
            let Ok(steps) = &l.steps else { continue };
            let has = steps
                .iter()
                .any(|i| i.step == step && i.committed_ranks().contains(&rank));
            if !has || !usable(&l.tier, steps) {
                continue;
            }
            seen = true;
            match load_shard(&*l.tier.store, &self.job, steps, step, rank).await {
                Ok(shard) => {
                    return Ok(ShardFound {
                        tier: &l.tier,
                        index,
                        shard,
                        errors,
                    })
                }
                Err(e) => errors.push((l.tier.name.clone(), e)),
            }
        }
        if !seen {
            let unreadable: Vec<String> = self
                .unreadable()
                .map(|(t, e)| format!("{}: {e}", t.name))
                .collect();
            let mut msg = format!("step {step} rank {rank} is not committed in any tier");
            if !unreadable.is_empty() {
                msg.push_str(&format!(" (unreadable: {})", unreadable.join("; ")));
            }
            return Err(Error::NothingToRestore(Some(msg)));
        }
        let reasons: Vec<String> = errors.iter().map(|(t, e)| format!("{t}: {e}")).collect();
        Err(Error::Manifest {
            step,
            rank,
            reason: format!("no good manifest: {}", reasons.join("; ")),
        })
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

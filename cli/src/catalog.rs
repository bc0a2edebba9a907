//! What every tier holds for the job: the steps each lists, the manifest of
//! a shard from the fastest tier that has a good one, and chunks read with
//! per-chunk fallback to the next tier. Shared by the inspection commands.

use std::collections::{BTreeMap, BTreeSet};

use strata::inspect::{LoadedShard, Tier, Tiers};
use strata::reader::{ReadTier, TieredReader};
use strata::tiered::{ChunkData, StepInfo, StoreError};
use strata_format::manifest::ChunkRef;
use strata_format::CommitRecord;

use crate::CliError;

/// Each tier's listing of the job's steps (in the tiers' order).
pub(crate) struct Catalog<'a> {
    /// The tiers with their steps, or the error listing them.
    pub(crate) tiers: Vec<(&'a Tier, Result<Vec<StepInfo>, String>)>,
}

/// How far one tier holds a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// Commit records name every rank of the world.
    Committed,
    /// Some manifests or some ranks' records, not all.
    Partial,
    /// Nothing of the step.
    Absent,
}

impl<'a> Catalog<'a> {
    /// Lists the steps of every tier in `tiers` (a tier that cannot be
    /// listed is kept with its error: the others still answer).
    pub(crate) fn load(t: &Tiers, tiers: Vec<&'a Tier>) -> Self {
        // Listing an object store or a distant peer can take a while: a
        // spinner on a terminal after the first second (on stderr only).
        let spinner = crate::progress::Spinner::start("listing", false);
        let tiers = tiers
            .into_iter()
            .map(|tier| {
                spinner.set(&format!("listing {}", tier.name));
                (tier, t.steps(tier).map_err(|e| e.to_string()))
            })
            .collect();
        Catalog { tiers }
    }

    /// Every step any tier lists.
    pub(crate) fn all_steps(&self) -> BTreeSet<u64> {
        self.tiers
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .flat_map(|s| s.iter().map(|i| i.step))
            .collect()
    }

    /// Steps committed in at least one tier.
    pub(crate) fn committed_steps(&self) -> BTreeSet<u64> {
        self.all_steps()
            .into_iter()
            .filter(|&s| {
                self.tiers
                    .iter()
                    .any(|(t, _)| self.held(t, s) == Held::Committed)
            })
            .collect()
    }

    /// Steps some tier holds a readable commit record of: decided steps
    /// (every rank voted them durable), committed in full or not yet.
    pub(crate) fn decided_steps(&self) -> BTreeSet<u64> {
        self.tiers
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .flatten()
            .filter(|i| !i.records.is_empty())
            .map(|i| i.step)
            .collect()
    }

    /// `tier`'s listing of `step`.
    pub(crate) fn info(&self, tier: &Tier, step: u64) -> Option<&StepInfo> {
        self.tiers
            .iter()
            .find(|(t, _)| t.name == tier.name)
            .and_then(|(_, s)| s.as_ref().ok())
            .and_then(|s| s.iter().find(|i| i.step == step))
    }

    /// `tier`'s whole listing, empty if it could not be listed.
    pub(crate) fn steps_of(&self, tier: &Tier) -> &[StepInfo] {
        self.tiers
            .iter()
            .find(|(t, _)| t.name == tier.name)
            .and_then(|(_, s)| s.as_ref().ok())
            .map_or(&[], |v| v.as_slice())
    }

    /// How far `tier` holds `step`. A node's L1 and a peer hold only the
    /// ranks that ran or replicated there: the step is committed in the
    /// tier when every rank it holds a manifest of is committed.
    pub(crate) fn held(&self, tier: &Tier, step: u64) -> Held {
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
    pub(crate) fn logical_bytes(&self, step: u64) -> u64 {
        self.sum_ranks(self.tiers.iter().map(|(t, _)| *t), step)
    }

    /// The step's logical bytes as `tier`'s own records give them.
    pub(crate) fn logical_bytes_in(&self, tier: &Tier, step: u64) -> u64 {
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
    pub(crate) fn record(&self, step: u64) -> Option<&CommitRecord> {
        self.tiers
            .iter()
            .filter_map(|(t, _)| self.info(t, step))
            .find_map(|i| i.records.values().next())
    }

    /// The ranks of `step` (from its commit records, else its manifests).
    pub(crate) fn ranks(&self, step: u64) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for (t, _) in &self.tiers {
            if let Some(i) = self.info(t, step) {
                out.extend(i.committed_ranks());
            }
        }
        out
    }

    /// Rank `rank`'s manifest of `step` from the first tier that holds a
    /// good one; the errors of the tiers tried before it are returned too.
    pub(crate) fn shard(
        &self,
        t: &Tiers,
        step: u64,
        rank: u32,
    ) -> Result<(&'a Tier, LoadedShard, Vec<String>), CliError> {
        let mut errors = Vec::new();
        let mut seen = false;
        for (tier, steps) in &self.tiers {
            let Ok(steps) = steps else { continue };
            let has = steps
                .iter()
                .any(|i| i.step == step && i.committed_ranks().contains(&rank));
            if !has {
                continue;
            }
            seen = true;
            match t.load_shard(tier, steps, step, rank) {
                Ok(s) => return Ok((tier, s, errors)),
                Err(e) => errors.push(format!("{}: {e}", tier.name)),
            }
        }
        if !seen {
            let listing_errors: Vec<String> = self
                .tiers
                .iter()
                .filter_map(|(t, s)| s.as_ref().err().map(|e| format!("{}: {e}", t.name)))
                .collect();
            let mut msg = format!("step {step} rank {rank} is not committed in any tier");
            if !listing_errors.is_empty() {
                msg.push_str(&format!(" (unreadable: {})", listing_errors.join("; ")));
            }
            return Err(CliError::NotFound(msg));
        }
        Err(CliError::Store(format!(
            "no good manifest for step {step} rank {rank}: {}",
            errors.join("; ")
        )))
    }

    /// The newest step committed in any tier, or the step given.
    pub(crate) fn pick(&self, step: Option<u64>) -> Result<u64, CliError> {
        match step {
            Some(s) if self.all_steps().contains(&s) => Ok(s),
            Some(s) => Err(CliError::NotFound(format!("step {s} is in no tier"))),
            None => self
                .committed_steps()
                .last()
                .copied()
                .ok_or_else(|| CliError::NotFound("no committed step in any tier".into())),
        }
    }
}

/// Reads `chunks` through the tiered reader over `order`: from the first
/// tier, each failure retried on the next; every chunk verified by the
/// tier that serves it. Returns each chunk's bytes (or the first tier's
/// error) and where it came from.
pub(crate) fn read_with_fallback(
    t: &Tiers,
    order: &[&Tier],
    chunks: &[ChunkRef],
) -> Vec<Result<(ChunkData, String), StoreError>> {
    let tiers = order
        .iter()
        .map(|x| ReadTier {
            store: &*x.store,
            repair: false,
        })
        .collect();
    let reader = TieredReader::new(t.job(), tiers);
    t.block_on(reader.read(chunks, Vec::new()))
        .chunks
        .into_iter()
        .map(|c| {
            let from = c.from.map(|i| order[i].name.clone()).unwrap_or_default();
            c.result.map(|d| (d, from))
        })
        .collect()
}

/// Names of the entries of a manifest that use each chunk index.
pub(crate) fn entries_by_chunk(m: &strata_format::ShardManifest) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for e in &m.entries {
        for s in &e.segments {
            let v = out.entry(s.chunk).or_default();
            if v.last() != Some(&e.name) {
                v.push(e.name.clone());
            }
        }
    }
    out
}

/// An entry's bytes, read from the tiers in `order` (verified).
pub(crate) fn entry_bytes(
    t: &Tiers,
    order: &[&Tier],
    m: &strata_format::ShardManifest,
    name: &str,
) -> Option<Vec<u8>> {
    let e = m.entry(name)?;
    let refs: Vec<ChunkRef> = e
        .segments
        .iter()
        .map(|s| m.chunks.get(s.chunk as usize).copied())
        .collect::<Option<_>>()?;
    let got = read_with_fallback(t, order, &refs);
    let mut out = Vec::with_capacity(usize::try_from(e.len).ok()?);
    for (s, r) in e.segments.iter().zip(got) {
        let (d, _) = r.ok()?;
        let (a, b) = (s.offset as usize, s.offset as usize + s.len as usize);
        out.extend_from_slice(d.as_slice().get(a..b)?);
    }
    Some(out)
}

/// Whether an entry whose chunk ids differ between `a` and `b` still has
/// the same bytes: true only for an entry packed into chunks shared with
/// other entries (a small tensor beside one that changed), whose bytes are
/// then read and compared. Entries that own whole chunks differ when their
/// chunk ids do.
pub(crate) fn packed_and_same(
    t: &Tiers,
    order: &[&Tier],
    a: &strata_format::ShardManifest,
    b: &strata_format::ShardManifest,
    name: &str,
) -> bool {
    let packed = |m: &strata_format::ShardManifest| {
        m.entry(name).is_some_and(|e| {
            e.segments.iter().all(|s| {
                m.chunks
                    .get(s.chunk as usize)
                    .is_some_and(|c| s.len < c.len)
            })
        })
    };
    if !(packed(a) && packed(b)) {
        return false;
    }
    match (
        entry_bytes(t, order, a, name),
        entry_bytes(t, order, b, name),
    ) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

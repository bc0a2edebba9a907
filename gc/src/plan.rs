//! The planner: a pure function from what a tier holds to what to delete.

use std::collections::{BTreeSet, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use strata_format::ChunkId;
use strata_tiered::StepInfo;

use crate::inventory::{Inventory, ManifestRefs};
use crate::policy::Retention;

/// Whose shards a collection may delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One rank's (ranks sharing a directory each collect their own): the
    /// steps this rank committed are the ones the policy counts.
    Rank(u32),
    /// Every rank's (one collector for the whole tier, such as L3 or an
    /// operator's `strata gc`): the steps with a commit record count.
    All,
}

/// What a commit record in the tier proves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Evidence {
    /// A record is written only after every rank voted its shard durable
    /// (L1, peers): one record proves the step committed by every rank.
    #[default]
    AnyRecord,
    /// Each rank copies its own record when its upload ends (L3): only
    /// records from every rank of the world prove the step restorable
    /// there.
    EveryRank,
}

impl Scope {
    fn covers(self, rank: u32) -> bool {
        match self {
            Scope::Rank(r) => r == rank,
            Scope::All => true,
        }
    }

    /// True when the step counts as committed for this scope. A commit
    /// record is written only after every rank voted its shard durable, so
    /// one record proves the step committed by every rank.
    fn committed(self, st: &StepInfo) -> bool {
        match self {
            Scope::Rank(r) => st.committed_ranks().contains(&r),
            Scope::All => !st.records.is_empty(),
        }
    }
}

/// What a collection deletes, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Committed steps kept (in this scope).
    pub keep: BTreeSet<u64>,
    /// Shards to retire (record, then manifest): of committed steps no rule
    /// keeps, and shards a killed sweep left half-retired.
    pub retire: Vec<(u64, u32)>,
    /// Shards without a commit record (an interrupted save) of steps older
    /// than the oldest kept step: their save is over.
    pub partial: Vec<(u64, u32)>,
    /// Chunks no remaining manifest references, untouched since `cutoff`.
    pub chunks: Vec<ChunkId>,
    /// Their stored bytes, where the tier tells.
    pub chunk_bytes: u64,
    /// The grace period's edge, by the tier's clock.
    pub cutoff: Option<SystemTime>,
    /// Why no chunk is deleted although some are unreferenced (a kept
    /// manifest that cannot be read: what it references is unknown).
    pub held_back: Option<String>,
}

/// Plans a collection. `hold` are steps the caller still needs (a pending
/// upload or push): kept like pinned ones. Pure: the same inputs give the
/// same plan.
pub fn plan(inv: &Inventory, policy: &Retention, scope: Scope, hold: &BTreeSet<u64>) -> Plan {
    plan_with(inv, policy, scope, Evidence::AnyRecord, hold)
}

/// [`plan`] for a tier whose records prove what `evidence` says. With
/// [`Evidence::EveryRank`], only steps every rank committed count and are
/// kept; a step not yet complete there (an upload of another rank still
/// running, or dropped) is left alone unless it is older than the oldest
/// kept complete step.
pub fn plan_with(
    inv: &Inventory,
    policy: &Retention,
    scope: Scope,
    evidence: Evidence,
    hold: &BTreeSet<u64>,
) -> Plan {
    plan_bounded(inv, policy, scope, evidence, hold, &BTreeSet::new())
}

/// [`plan_with`], and with [`Evidence::EveryRank`] a bound on the steps
/// left incomplete: of those `aged` (the caller's word that no upload of
/// them still runs, as [`crate::Abandoned`] tells [`crate::collect`]),
/// only the newest `keep_last` incomplete steps with a commit record
/// stay, even where no newer step is complete. Without it, one rank whose uploads always fail leaves every
/// step incomplete, and L3 grows by every other rank's shard of every
/// upload, for good.
pub fn plan_bounded(
    inv: &Inventory,
    policy: &Retention,
    scope: Scope,
    evidence: Evidence,
    hold: &BTreeSet<u64>,
    aged: &BTreeSet<u64>,
) -> Plan {
    let counts = |st: &StepInfo| match evidence {
        Evidence::AnyRecord => scope.committed(st),
        Evidence::EveryRank => st.is_complete(),
    };
    let committed: Vec<&StepInfo> = inv.steps.iter().filter(|st| counts(st)).collect();
    let cutoff = inv.now.checked_sub(policy.grace).unwrap_or(UNIX_EPOCH);
    let within = policy
        .keep_within
        .and_then(|t| inv.now.checked_sub(t))
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis());
    let mut keep: BTreeSet<u64> = committed
        .iter()
        .rev()
        .take(policy.keep_last.max(1))
        .map(|st| st.step)
        .collect();
    for st in &committed {
        let every = policy.keep_every > 0 && st.step % policy.keep_every == 0;
        let recent = within.is_some_and(|edge| {
            st.records
                .values()
                .any(|r| u128::from(r.committed_unix_ms) >= edge)
        });
        let asked = inv.pins.contains(&st.step) || hold.contains(&st.step);
        if every || recent || asked {
            keep.insert(st.step);
        }
    }
    let protected =
        |step: u64| keep.contains(&step) || inv.pins.contains(&step) || hold.contains(&step);
    let oldest_kept = keep.first().copied();
    // The newest incomplete steps: kept, aged or not (see `plan_bounded`).
    // Only steps with a record count: a manifest without one (an upload
    // cut off before its record) restores nothing, and would hold a slot.
    let newest_incomplete: BTreeSet<u64> = inv
        .steps
        .iter()
        .rev()
        .filter(|st| !counts(st) && !st.records.is_empty())
        .take(policy.keep_last.max(1))
        .map(|st| st.step)
        .collect();

    let mut out = Plan {
        cutoff: Some(cutoff),
        ..Plan::default()
    };
    out.keep = keep.clone();
    for st in &inv.steps {
        let committed_ranks = st.committed_ranks();
        let ranks: BTreeSet<u32> = st
            .manifests
            .iter()
            .chain(committed_ranks.iter())
            .chain(st.retiring.iter())
            .copied()
            .filter(|&r| scope.covers(r))
            .collect();
        for rank in ranks {
            if st.unreadable.contains_key(&rank) {
                // A record that cannot be read is left for a person.
                continue;
            }
            let older_than_kept = oldest_kept.is_some_and(|o| st.step < o);
            if st.retiring.contains(&rank) {
                // A retirement a killed sweep began: finish it.
                out.retire.push((st.step, rank));
            } else if evidence == Evidence::EveryRank && !counts(st) {
                // Not complete in this tier: another rank may still be
                // uploading it. Only once a newer complete step is kept,
                // or once aged beyond the newest incomplete ones.
                let beyond_bound = aged.contains(&st.step) && !newest_incomplete.contains(&st.step);
                if !protected(st.step) && (older_than_kept || beyond_bound) {
                    if committed_ranks.contains(&rank) {
                        out.retire.push((st.step, rank));
                    } else {
                        out.partial.push((st.step, rank));
                    }
                }
            } else if committed_ranks.contains(&rank) || counts(st) {
                if !protected(st.step) {
                    out.retire.push((st.step, rank));
                }
            } else if !protected(st.step) && older_than_kept {
                out.partial.push((st.step, rank));
            }
        }
    }

    // Mark: every chunk a remaining manifest references (any rank's: chunks
    // are shared), then sweep what is left and old enough.
    let going: HashSet<(u64, u32)> = out.retire.iter().chain(&out.partial).copied().collect();
    let mut referenced: HashSet<ChunkId> = HashSet::new();
    for (key, refs) in &inv.manifests {
        if going.contains(key) {
            continue;
        }
        match refs {
            ManifestRefs::Chunks(ids) => referenced.extend(ids.iter().copied()),
            ManifestRefs::Unreadable(why) => {
                out.held_back = Some(format!(
                    "the manifest of step {} rank {} cannot be read ({why})",
                    key.0, key.1
                ));
            }
        }
    }
    if out.held_back.is_none() {
        for c in &inv.chunks {
            if !referenced.contains(&c.id) && c.touched.is_some_and(|t| t < cutoff) {
                out.chunks.push(c.id);
                out.chunk_bytes += c.stored_len.unwrap_or(0);
            }
        }
    }
    out
}

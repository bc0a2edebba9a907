//! Deleting steps, and rolling back: after a loss spike a job restores an
//! older step and discards the newer ones, so that "latest" and retention
//! follow the branch being trained again.
//!
//! Every rank retires its own shards of the steps, in every tier it uses
//! (L3 and the peers first, L1 last), through each tier's retirement of a
//! shard ([`ChunkStore::delete_shard`]: a retiring marker, the commit
//! record, the manifest): a shard interrupted part-way says it is being
//! retired and is never rolled forward, so a step is never half-usable.
//! All ranks call together: one round agrees that every rank is ready
//! (its background copies of the steps finished, no step pinned, every
//! tier listed) before any rank deletes anything, and a second that every
//! rank's deletion succeeded, so every rank returns the same outcome. A
//! failure leaves the step where it was not yet deleted; calling again
//! finishes it. The steps' chunks are freed by the next collection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use strata_tiered::ChunkStore;

use crate::checkpointer::Checkpointer;
use crate::error::{Error, Result};
use crate::restore::StepSelector;
use crate::state::RestoredState;

impl Checkpointer {
    /// Deletes `steps` from every tier (this rank's shards: L1, the peers,
    /// L3), as a retirement (see the module's doc). All ranks call it
    /// together. Waits for this process's save in flight and background
    /// copies first (a copy finishing after the deletion would bring a
    /// step back). Refuses, on every rank and before deleting anything, a
    /// step pinned in some tier, or a tier it cannot list. Returns the
    /// steps this rank held in some tier (the others are no error).
    pub fn delete(&self, steps: &[u64]) -> Result<Vec<u64>> {
        let wanted: BTreeSet<u64> = steps.iter().copied().collect();
        self.retire(&|st| wanted.contains(&st), true)
    }

    /// Deletes every step newer than `step` that this rank holds in some
    /// tier (committed or not), as [`Self::delete`] does. All ranks call it
    /// together. Returns the steps deleted.
    pub fn discard_newer(&self, step: u64) -> Result<Vec<u64>> {
        self.discard_newer_if(step, true)
    }

    /// Rolls back to `step`: restores it (as [`Self::restore`]), then
    /// discards every newer step ([`Self::discard_newer`]), so the next
    /// restore of the latest step and retention follow the branch trained
    /// from here. All ranks call it together.
    pub fn rollback(&self, step: u64) -> Result<RestoredState> {
        let restored = self.restore(StepSelector::Step(step));
        let discarded = self.discard_newer_if(step, restored.is_ok());
        let state = restored?;
        discarded?;
        Ok(state)
    }

    /// [`Self::discard_newer`] after this rank's restore of `step`, which
    /// went well or not (`restored`): a rank whose restore failed still
    /// takes part in the rounds, voting no, so no rank deletes anything and
    /// none waits for it. All ranks call it together.
    pub fn discard_newer_if(&self, step: u64, restored: bool) -> Result<Vec<u64>> {
        self.retire(&|st| st > step, restored)
    }

    /// Retires this rank's shards of the steps `doomed` selects in every
    /// tier; the two rounds of the module's doc. `willing` false: vote no
    /// (this rank cannot take part) and delete nothing.
    fn retire(&self, doomed: &dyn Fn(u64) -> bool, willing: bool) -> Result<Vec<u64>> {
        let s = &self.shared;
        let cfg = &s.cfg;
        // One counter for restores and deletions: every rank calls them in
        // the same order, so the rounds' keys match across ranks (a rank
        // whose restore failed still calls the deletion's rounds).
        let n = s.restores.fetch_add(1, Ordering::Relaxed);
        let key = format!("delete/{}/{n}", cfg.job);
        let plan = if willing {
            self.plan_retirement(doomed)
        } else {
            Err(Error::NotDeleted {
                reason: "this rank's restore failed: nothing was deleted".into(),
                retry: true,
            })
        };
        let ready =
            crate::coord::commit::all_ready(&*s.coord, cfg, &format!("{key}/ready"), plan.is_ok())?;
        let plan = plan?;
        if !ready {
            return Err(Error::NotDeleted {
                reason: "another rank cannot delete these steps (a step pinned, a tier it cannot list, or its restore failed): nothing was deleted".into(),
                retry: true,
            });
        }
        let mut failed = Vec::new();
        // L3 and the peers first: a failure there leaves L1 (the copy a
        // restore prefers) as it was, and the call can be repeated.
        for tier in s.tiers.tiers().iter().rev() {
            let Some(held) = plan.get(&tier.name) else {
                continue;
            };
            if tier.kind == crate::tiers::TierKind::L1 && !failed.is_empty() {
                break;
            }
            for &step in held {
                if let Err(e) =
                    s.rt.block_on(tier.store.delete_shard(&cfg.job, step, cfg.rank))
                {
                    failed.push(format!("step {step} in {}: {e}", tier.name));
                }
            }
        }
        let all: BTreeSet<u64> = plan.values().flatten().copied().collect();
        if failed.is_empty() {
            // Gone everywhere: they may be saved again, and this process's
            // states of their copies no longer describe them.
            s.committed.forget(&all);
            for &step in &all {
                s.uploads.states.update(|m| m.remove(&step));
                s.replication.states.update(|m| m.remove(&step));
            }
        }
        let done = crate::coord::commit::all_ready(
            &*s.coord,
            cfg,
            &format!("{key}/done"),
            failed.is_empty(),
        )?;
        if !failed.is_empty() {
            return Err(Error::NotDeleted {
                reason: format!("{} (call again to finish)", failed.join("; ")),
                retry: true,
            });
        }
        if !done {
            return Err(Error::NotDeleted {
                reason: "another rank could not delete every shard of these steps (call again to finish)".into(),
                retry: true,
            });
        }
        // Every rank deleted its shards: also the steps this rank held
        // nothing of but knew committed by others (the L3 lister refuses
        // those for every rank, `Shared::list_committed`).
        s.committed.forget_where(doomed);
        tracing::info!(steps = ?all, "steps deleted");
        Ok(all.into_iter().collect())
    }

    /// Waits for this process's copies, then lists every tier: the steps
    /// `doomed` selects that this rank holds there, by tier name. Fails
    /// on a tier that cannot be listed or a selected step pinned.
    fn plan_retirement(
        &self,
        doomed: &dyn Fn(u64) -> bool,
    ) -> Result<BTreeMap<String, BTreeSet<u64>>> {
        let s = &self.shared;
        let (job, rank) = (&s.cfg.job, s.cfg.rank);
        self.wait_inflight();
        self.wait_replication();
        self.wait_uploads();
        let catalog = s.catalog();
        if let Some((tier, e)) = catalog.unreadable().next() {
            return Err(Error::NotDeleted {
                reason: format!("{} cannot be listed: {e} (nothing was deleted)", tier.name),
                retry: true,
            });
        }
        let mut plan = BTreeMap::new();
        for l in catalog.listings() {
            let Ok(steps) = &l.steps else { continue };
            let held: BTreeSet<u64> = steps
                .iter()
                .filter(|st| doomed(st.step))
                .filter(|st| st.ranks_held().contains(&rank))
                .map(|st| st.step)
                .collect();
            if held.is_empty() {
                continue;
            }
            let pins = s.rt.block_on(l.tier.store.list_pins(job))?;
            if let Some(p) = held.iter().find(|st| pins.contains(st)) {
                return Err(Error::NotDeleted {
                    reason: format!(
                        "step {p} is pinned in {} (strata unpin {p} first): nothing was deleted",
                        l.tier.name
                    ),
                    retry: false,
                });
            }
            plan.insert(l.tier.name.clone(), held);
        }
        Ok(plan)
    }
}

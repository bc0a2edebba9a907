//! Roll-forward: a rank that voted a step durable and then failed to write
//! its commit record (the write failed, the process died, it lost the
//! coordinator before reading the round) writes it later, once it learns
//! the step was decided (`docs/commit-protocol.md`, "Roll-forward").
//!
//! The proof is another rank's record: no rank writes one before every
//! rank voted yes, and a rank votes yes only once its chunks and manifest
//! are durable on its L1. So the manifest this rank holds without a record
//! is the one it voted for, and committing it completes the step.

use strata_format::ShardManifest;
use strata_tiered::ChunkStore;

use crate::coord::commit::{self, Committed, Decision};
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::tiers::{Catalog, LoadedShard, Tiers};

/// Commits rank `rank`'s shard of a decided `step` in `tier`, where the
/// tier holds its manifest without a record: checks the manifest (decodes,
/// names this job, step, rank and world size `world`) and that the tier
/// holds every chunk it names, then writes the record, create-only (an
/// identical record already there is fine). The caller has the proof the
/// step was decided: another rank's record of it, of the same world size.
/// Used by the checkpointer (at restore, and at a save of the step) and by
/// `strata verify --repair`.
pub async fn commit_decided(
    tier: &dyn ChunkStore,
    job: &str,
    step: u64,
    rank: u32,
    world: u32,
    now_unix_ms: u64,
) -> Result<LoadedShard> {
    let bad = |reason: String| Error::Manifest {
        step,
        rank,
        reason: format!("cannot roll the decided step forward: {reason}"),
    };
    let bytes = tier
        .get_manifest(job, step, rank)
        .await
        .map_err(|e| bad(e.to_string()))?;
    let manifest = ShardManifest::decode(&bytes).map_err(|e| bad(e.to_string()))?;
    let i = &manifest.info;
    if i.job != job || i.step != step || i.rank != rank || i.world_size != world {
        return Err(bad(format!(
            "the manifest is job {:?} step {} rank {} of {}",
            i.job, i.step, i.rank, i.world_size
        )));
    }
    let ids: Vec<_> = manifest.chunks.iter().map(|c| c.id).collect();
    let have = tier.has_chunks(job, &ids).await?;
    if let Some(k) = have.iter().position(|h| !h) {
        return Err(bad(format!("chunk {} is not in {}", ids[k], tier.name())));
    }
    let record = commit::record_of(job, world, rank, step, &bytes, &manifest, now_unix_ms);
    let record = match tier.commit(&record).await {
        Ok(()) => record,
        Err(e) => {
            // Another writer (this rank's own save, or a repair) committed
            // the shard meanwhile: fine if its record names this manifest.
            let id = ShardManifest::id_of(&bytes);
            let listed = tier.list_steps(job).await?;
            let same = listed
                .iter()
                .filter(|st| st.step == step)
                .flat_map(|st| st.records.values())
                .find(|r| {
                    r.shards
                        .iter()
                        .any(|sh| sh.rank == rank && sh.manifest == id)
                });
            same.cloned().ok_or(e)?
        }
    };
    Ok(LoadedShard {
        manifest,
        bytes,
        record,
    })
}

/// [`commit_decided`] for this checkpointer's rank on L1, then the step is
/// known committed and announced (`upload`: whether L3 holds the step of
/// other ranks, so it gets this rank's shard too).
pub(crate) fn roll_forward(s: &Shared, step: u64, upload: bool) -> Result<LoadedShard> {
    let cfg = &s.cfg;
    let shard = s.rt.block_on(commit_decided(
        &*s.l1,
        &cfg.job,
        step,
        cfg.rank,
        cfg.world_size,
        strata_tiered::clock::unix_ms(&*s.clock),
    ))?;
    s.committed.note(step);
    tracing::warn!(
        step,
        rank = cfg.rank,
        "rolled a decided step forward: this rank's commit record was missing"
    );
    s.commits.publish(Committed {
        step,
        decision: Decision {
            upload,
            decided_before: None,
        },
    });
    Ok(shard)
}

/// After a save of a step another rank already held committed (the barrier
/// said [`Decision::decided_before`]): this rank's new shard is not part of
/// the decided step. Puts back the manifest it held before the save (the
/// one it voted for when the step was decided) and commits it; without one
/// (its disk lost it), retires the new shard so it is never rolled forward.
/// Returns the error the save reports.
pub(crate) fn settle_decided_before(
    s: &Shared,
    step: u64,
    by: u32,
    previous: Option<Vec<u8>>,
    written: Option<&[u8]>,
) -> Error {
    let cfg = &s.cfg;
    let outcome = match &previous {
        Some(old) => {
            let restored = match written {
                Some(new) if new == old.as_slice() => Ok(()),
                _ => {
                    s.rt.block_on(s.l1.put_manifest(&cfg.job, step, cfg.rank, old))
                        .map_err(Error::from)
                }
            };
            restored.and_then(|()| roll_forward(s, step, false).map(drop))
        }
        None => {
            s.rt.block_on(s.l1.delete_shard(&cfg.job, step, cfg.rank))
                .map_err(Error::from)
        }
    };
    match (outcome, previous.is_some()) {
        (Ok(()), true) => Error::AlreadyCommitted {
            step,
            tier: format!(
                "by rank {by}; this rank's shard of the decided step was committed again, the new one discarded"
            ),
        },
        (Ok(()), false) => Error::AlreadyCommitted {
            step,
            tier: format!(
                "by rank {by}; this rank no longer holds its shard of the decided step, the new one discarded"
            ),
        },
        (Err(e), _) => Error::AlreadyCommitted {
            step,
            tier: format!("by rank {by}; settling this rank's shard failed: {e}"),
        },
    }
}

/// Rolls rank `rank`'s shard of the decided `step` forward in every tier of
/// `cat` that holds its manifest without a commit record (the rank died
/// after its vote): [`commit_decided`] there, with the world size another
/// rank's record gives. Returns, per tier tried, the outcome; nothing when
/// the step is not decided. Used by readers that find a rank missing from
/// a step every other rank committed (the DCP reader).
pub fn roll_forward_rank(
    tiers: &Tiers,
    cat: &Catalog,
    step: u64,
    rank: u32,
) -> Vec<(String, Result<()>)> {
    let Some(world) = cat.world_size(step).filter(|&w| rank < w) else {
        return Vec::new();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut out = Vec::new();
    for l in cat.listings() {
        let Some(info) = cat.info(&l.tier, step) else {
            continue;
        };
        if !info.manifests.contains(&rank)
            || info.committed_ranks().contains(&rank)
            || info.retiring.contains(&rank)
        {
            continue;
        }
        let r = tiers.block_on(commit_decided(
            l.tier.store.as_ref(),
            tiers.job(),
            step,
            rank,
            world,
            now,
        ));
        out.push((l.tier.name.clone(), r.map(|_| ())));
    }
    out
}

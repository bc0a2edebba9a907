//! [`collect`]: inventory, plan, sweep.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use strata_tiered::{ChunkStore, StepInfo};

use crate::error::{GcError, Result};
use crate::inventory::{read_manifests, take_inventory, Inventory, ManifestRefs};
use crate::plan::{plan_bounded, Evidence, Plan, Scope};
use crate::policy::Retention;

/// What a collection did (or, in a dry run, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Nothing was deleted.
    pub dry_run: bool,
    /// Committed steps kept.
    pub kept: Vec<u64>,
    /// Shards of committed steps retired (or to retire).
    pub shards_retired: u64,
    /// Partial shards removed (or to remove).
    pub partial_removed: u64,
    /// Chunks deleted (or planned, in a dry run).
    pub chunks_deleted: u64,
    /// Their stored bytes.
    pub bytes_freed: u64,
    /// Incomplete multipart uploads begun before the grace period and
    /// aborted (not counted in a dry run).
    pub uploads_aborted: u64,
    /// Why stale uploads could not be listed or aborted (a policy without
    /// the right to list them, say): reported, and the chunks are swept
    /// all the same.
    pub uploads_error: Option<String>,
    /// Why unreferenced chunks were left (see [`Plan::held_back`]).
    pub held_back: Option<String>,
}

/// How to collect.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Whose shards may go.
    pub scope: Option<Scope>,
    /// Steps never retired in this run, besides those pinned in the tier.
    pub pins: BTreeSet<u64>,
    /// Steps the caller still needs (a pending upload or push).
    pub hold: BTreeSet<u64>,
    /// Plan only; delete nothing.
    pub dry_run: bool,
    /// What the tier's commit records prove (L3: `EveryRank`).
    pub evidence: Evidence,
    /// Sweep unreferenced chunks (off: only shards are retired; another
    /// collector sweeps, so that many ranks do not each list every chunk).
    pub skip_chunks: bool,
    /// Look at manifests and chunks only when some shard is retired: after
    /// each save, a tier whose retention has nothing to do is not listed
    /// chunk by chunk (orphaned chunks wait for the next retirement).
    pub lazy: bool,
    /// With [`Evidence::EveryRank`]: how the steps left incomplete are
    /// known to be abandoned, so that they can be bounded
    /// ([`crate::plan_bounded`]: only the newest `keep_last` of them stay,
    /// even where no step is complete). Default: never known.
    pub abandoned: Abandoned,
}

/// How a collector knows that no upload of an incomplete step still runs
/// ([`Options::abandoned`]).
#[derive(Clone, Debug, Default)]
pub enum Abandoned {
    /// Never known: an incomplete step goes only once it is older than the
    /// oldest kept complete step.
    #[default]
    Unknown,
    /// Watched by the one collector of every rank (L3: the job's rank 0),
    /// across its runs.
    Watched {
        /// When each step was first seen incomplete, kept by the caller.
        /// Another rank may still be uploading it (an upload asked for
        /// again, a roll-forward's), which the collector cannot see: such a
        /// step is held for `grace`; past it, its uploads are over.
        seen: IncompleteSeen,
        /// How long a step first seen incomplete is held.
        grace: Duration,
        /// Each rank's progress on the tier as the collector saw it, kept
        /// by the caller. An incomplete step past its grace is bounded
        /// only where every rank missing from it has stalled: none of its
        /// records appeared on the tier for a grace period, as the
        /// collections saw (a rank that never had one has stalled once a
        /// step has lacked it for the grace). A rank uploads in step
        /// order: one that completes an upload within each grace period
        /// may yet reach the step. None: incomplete steps are held for
        /// their grace, never bounded.
        progress: Option<RankProgress>,
    },
    /// An operator's word (`strata gc --abandoned-after`): an incomplete
    /// step whose every commit record was committed at least this long
    /// ago has no upload still running. A record's time is when its step
    /// committed on L1, by the saving node's clock (an upload copies it
    /// unchanged): a step uploaded late looks as old as its save. A step
    /// without a readable record, or with one that cannot be read, is
    /// never abandoned. One run cannot watch ranks progress: this is for a
    /// job that is over, or whose missing ranks are known to have stopped.
    CommittedBefore(Duration),
}

/// Per rank: the steps of its commit records on the tier, and when the
/// collector last saw one appear ([`Abandoned::Watched`]).
pub type RankProgress = Arc<Mutex<BTreeMap<u32, (BTreeSet<u64>, SystemTime)>>>;

/// Beyond this many ranks with records, progress is not tracked (nor any
/// incomplete step bounded): a damaged or hostile record naming millions
/// of ranks must not grow the collector's memory.
const MAX_TRACKED_RANKS: usize = 1 << 18;

/// When each step was first seen incomplete ([`Abandoned::Watched`]).
pub type IncompleteSeen = Arc<Mutex<BTreeMap<u64, SystemTime>>>;

/// The steps listed incomplete, split into those held (first seen so
/// less than the grace ago: an upload of theirs may still run) and those
/// abandoned (bounded by `plan_bounded`), as [`Options::abandoned`] tells.
fn incomplete_steps(opts: &Options, steps: &[StepInfo]) -> (BTreeSet<u64>, BTreeSet<u64>) {
    match &opts.abandoned {
        Abandoned::Unknown => (BTreeSet::new(), BTreeSet::new()),
        Abandoned::Watched {
            seen,
            grace,
            progress,
        } => watched(seen, *grace, progress.as_ref(), steps),
        Abandoned::CommittedBefore(age) => {
            let edge = SystemTime::now()
                .checked_sub(*age)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis());
            // A step without a readable record names no world nor time,
            // and one with a record that cannot be read is left for a
            // person: never abandoned.
            let aged = steps
                .iter()
                .filter(|st| {
                    !st.is_complete() && !st.records.is_empty() && st.unreadable.is_empty()
                })
                .filter(|st| {
                    st.records
                        .values()
                        .all(|r| u128::from(r.committed_unix_ms) <= edge)
                })
                .map(|st| st.step)
                .collect();
            (BTreeSet::new(), aged)
        }
    }
}

/// [`Abandoned::Watched`]: noting the steps seen incomplete for the first
/// time and each rank's progress, forgetting steps no longer incomplete.
/// Without `progress`, none is abandoned.
fn watched(
    seen: &IncompleteSeen,
    grace: Duration,
    progress: Option<&RankProgress>,
    steps: &[StepInfo],
) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let incomplete: Vec<&StepInfo> = steps.iter().filter(|st| !st.is_complete()).collect();
    let Ok(mut seen) = seen.lock() else {
        // A poisoned map: hold every incomplete step (safe, only late).
        return (
            incomplete.iter().map(|st| st.step).collect(),
            BTreeSet::new(),
        );
    };
    let now = SystemTime::now();
    let old = |t: SystemTime| now.duration_since(t).unwrap_or_default() >= grace;
    let steps_incomplete: BTreeSet<u64> = incomplete.iter().map(|st| st.step).collect();
    seen.retain(|s, _| steps_incomplete.contains(s));
    let progress = progress.and_then(|p| rank_progress(p, steps, now));
    let (mut young, mut aged) = (BTreeSet::new(), BTreeSet::new());
    for st in incomplete {
        let first = *seen.entry(st.step).or_insert(now);
        if !old(first) {
            young.insert(st.step);
            continue;
        }
        // Every rank the step lacks has stalled: its records have not
        // changed for a grace period, or it never had one (and the step has
        // lacked it for as long). A step without a record names no world:
        // never aged.
        let have = st.committed_ranks();
        let all_stalled = progress.as_ref().is_some_and(|p| {
            st.world_size()
                .is_some_and(|w| p.range(..w).all(|(r, &t)| have.contains(r) || old(t)))
        });
        if all_stalled {
            aged.insert(st.step);
        }
    }
    (young, aged)
}

/// When a commit record of each rank last appeared on the tier (of any
/// step, lower ones too: a rollback's uploads after it count; records
/// going, as retention removes them, do not), as the collections saw
/// them, noting it in `progress`. None where it is poisoned, or past
/// [`MAX_TRACKED_RANKS`].
fn rank_progress(
    progress: &RankProgress,
    steps: &[StepInfo],
    now: SystemTime,
) -> Option<BTreeMap<u32, SystemTime>> {
    let mut progress = progress.lock().ok()?;
    let mut records: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    for st in steps {
        for r in st.committed_ranks() {
            records.entry(r).or_default().insert(st.step);
            if records.len() > MAX_TRACKED_RANKS {
                return None;
            }
        }
    }
    if progress.len() > MAX_TRACKED_RANKS {
        // Ranks seen once and gone since (another world): forgotten.
        progress.retain(|r, _| records.contains_key(r));
    }
    for (r, held) in records {
        match progress.get_mut(&r) {
            Some(e) => {
                if !held.is_subset(&e.0) {
                    e.1 = now;
                }
                e.0 = held;
            }
            None => {
                progress.insert(r, (held, now));
            }
        }
    }
    Some(progress.iter().map(|(&r, (_, t))| (r, *t)).collect())
}

/// Collects `job` in `store`: takes the inventory (strictly: any listing
/// error aborts before anything is deleted), plans with `policy` for the
/// scope (`pins` are never retired, nor `hold`, the steps the caller still
/// needs; the default scope is every rank), and unless `dry_run` sweeps:
/// each planned shard's commit
/// record, then its manifest (through `delete_shard`, which leaves a
/// retiring marker until it is done, so a sweep killed half-way is
/// finished by the next run); then it marks again (a save or upload that
/// wrote a manifest meanwhile protects its chunks) and deletes the chunks
/// still unreferenced, each checked once more against the grace period as
/// it goes. The collector that sweeps chunks also aborts incomplete
/// multipart uploads begun before the grace period.
pub async fn collect(
    store: &dyn ChunkStore,
    job: &str,
    policy: &Retention,
    opts: &Options,
) -> Result<(Plan, Report)> {
    policy.validate()?;
    let scope = opts.scope.unwrap_or(Scope::All);
    let dry_run = opts.dry_run;
    if opts.lazy {
        let steps = store.list_steps(job).await.map_err(GcError::store(format!(
            "listing the steps of {}",
            store.name()
        )))?;
        let mut pins = store.list_pins(job).await.map_err(GcError::store(format!(
            "listing the pins of {}",
            store.name()
        )))?;
        pins.extend(opts.pins.iter().copied());
        let mut hold = opts.hold.clone();
        let (young, aged) = incomplete_steps(opts, &steps);
        hold.extend(young);
        let shallow = Inventory {
            steps,
            manifests: Default::default(),
            chunks: Vec::new(),
            pins,
            now: std::time::UNIX_EPOCH,
        };
        let p = plan_bounded(&shallow, policy, scope, opts.evidence, &hold, &aged);
        if p.retire.is_empty() && p.partial.is_empty() {
            let report = Report {
                dry_run,
                kept: p.keep.iter().copied().collect(),
                ..Report::default()
            };
            return Ok((p, report));
        }
    }
    let mut inv = take_inventory(store, job, !opts.skip_chunks).await?;
    inv.pins.extend(opts.pins.iter().copied());
    let mut hold = opts.hold.clone();
    let (young, aged) = incomplete_steps(opts, &inv.steps);
    hold.extend(young);
    let p = plan_bounded(&inv, policy, scope, opts.evidence, &hold, &aged);
    let mut report = Report {
        dry_run,
        kept: p.keep.iter().copied().collect(),
        shards_retired: p.retire.len() as u64,
        partial_removed: p.partial.len() as u64,
        chunks_deleted: p.chunks.len() as u64,
        bytes_freed: p.chunk_bytes,
        uploads_aborted: 0,
        uploads_error: None,
        held_back: p.held_back.clone(),
    };
    if dry_run {
        return Ok((p, report));
    }
    // Concurrently (the store's own concurrency): one collector of a large
    // job retires thousands of shards per step. Each retirement is ordered
    // in itself (marker, record, manifest); the first failure stops it.
    {
        use futures::StreamExt;
        let mut retiring = futures::stream::iter(p.retire.iter().chain(&p.partial))
            .map(|&(step, rank)| async move {
                store
                    .delete_shard(job, step, rank)
                    .await
                    .map_err(GcError::store(format!("retiring step {step} rank {rank}")))
            })
            .buffer_unordered(store.concurrency().max(1));
        while let Some(done) = retiring.next().await {
            done?;
        }
    }
    report.chunks_deleted = 0;
    report.bytes_freed = 0;
    if let Some(cutoff) = p.cutoff.filter(|_| !opts.skip_chunks) {
        // Not fatal: a policy without the right to list uploads must not
        // stop the chunks from being swept.
        match store.abort_stale_uploads(job, cutoff).await {
            Ok(n) => report.uploads_aborted = n,
            Err(e) => report.uploads_error = Some(e.to_string()),
        }
    }
    let Some(cutoff) = p.cutoff.filter(|_| !p.chunks.is_empty()) else {
        return Ok((p, report));
    };
    // Mark again: what was written since the inventory is protected too.
    let steps = store.list_steps(job).await.map_err(GcError::store(format!(
        "listing the steps of {}",
        store.name()
    )))?;
    let mut referenced = HashSet::new();
    for ((step, rank), refs) in read_manifests(store, job, &steps).await? {
        match refs {
            ManifestRefs::Chunks(ids) => referenced.extend(ids),
            ManifestRefs::Unreadable(why) => {
                report.held_back = Some(format!(
                    "the manifest of step {step} rank {rank} cannot be read ({why})"
                ));
                return Ok((p, report));
            }
        }
    }
    let doomed: Vec<_> = p
        .chunks
        .iter()
        .filter(|id| !referenced.contains(*id))
        .copied()
        .collect();
    let (n, bytes) = store
        .delete_chunks_untouched_since(job, &doomed, cutoff)
        .await
        .map_err(GcError::store(format!(
            "deleting chunks of {}",
            store.name()
        )))?;
    report.chunks_deleted = n;
    report.bytes_freed = bytes;
    Ok((p, report))
}

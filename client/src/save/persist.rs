//! The persist worker's job: hash → write chunks → manifest → barrier →
//! commit record → retention, for one save, starting on the first staging
//! segment while `save` still fills the next ones. The barrier, the vote
//! check and the record are the commit protocol's ([`crate::coord::commit`]); a
//! committed step is announced to subscribers (uploader, replicator), which
//! this module does not know.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use strata_format::{ChunkId, EntrySpec, ShardInfo, ShardManifest};
use strata_tiered::{AlignedBuf, ChunkData, ChunkPut, ChunkStore};

use crate::coord::commit::{self, Committed, Decision, Vote};
use crate::error::{Error, Result};
use crate::handle::Completion;
use crate::par::par_map;
use crate::save::snapshot::Plan;
use crate::shared::Shared;
use crate::stats::SaveStats;
use strata_tiered::ChunkStoreExt;

/// What `save` tells the worker as the snapshot proceeds.
pub(crate) enum Snap {
    /// The next batch's segment, filled.
    Segment(Arc<AlignedBuf>),
    /// Every segment was sent; `save` blocked the caller this long.
    Taken(Duration),
    /// The snapshot failed (the caller got this error from `save`).
    Abandoned(String),
}

/// One save, handed to the persist worker before its snapshot is complete.
pub(crate) struct PersistJob {
    pub(crate) step: u64,
    pub(crate) started: Instant,
    pub(crate) specs: Vec<EntrySpec>,
    pub(crate) plan: Arc<Plan>,
    pub(crate) snaps: mpsc::Receiver<Snap>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) done: Arc<Completion>,
    /// L3's steps were known when the save began (`Shared::l3_unlisted`
    /// was not set): rank 0 may vote to upload it.
    pub(crate) l3_known: bool,
}

/// Starts the persist worker: it takes the queued saves one at a time,
/// persists each ([`persist`]), gives its staging segments back to the
/// pool, records a failure with `background` before the handle completes
/// (whoever the completion wakes finds it), and completes the handle. It
/// ends when the checkpointer drops its sender.
pub(crate) fn start_worker(
    s: Arc<Shared>,
    rx: mpsc::Receiver<PersistJob>,
    background: Arc<crate::health::Background>,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("strata-persist".into())
        .spawn(move || {
            // Hashing and writing at the background priority (its hashing
            // threads inherit it); the snapshot runs on the caller's.
            crate::priority::lower_this_thread(s.cfg.background_nice);
            while let Ok(job) = rx.recv() {
                let (step, done) = (job.step, job.done.clone());
                let mut segments = Vec::new();
                let r = persist(&s, job, &mut segments);
                for seg in segments {
                    s.pool.give_back(seg);
                }
                s.metrics.save_done(r.as_ref());
                if let Err(e) = &r {
                    background.save_failed(step, e, &done);
                }
                done.finish(r);
            }
        })
        .map_err(|e| Error::Config(format!("cannot start the persist worker: {e}")))
}

/// Hash → write chunks → manifest → barrier → commit record → retention.
pub(crate) fn persist(
    s: &Shared,
    job: PersistJob,
    segments: &mut Vec<Arc<AlignedBuf>>,
) -> Result<SaveStats> {
    let _span = tracing::info_span!("persist", step = job.step).entered();
    let cfg = &s.cfg;
    let mut stats = SaveStats {
        step: job.step,
        logical_bytes: job.specs.iter().map(|e| e.len).sum(),
        chunks: job.plan.layout.chunks.len() as u64,
        ..SaveStats::default()
    };
    // A manifest of this step already on L1 without a record: a save of
    // this step voted and then failed before its record, or an attempt the
    // barrier refused. Kept, in case another rank committed the step then
    // (the barrier says so): it is the shard that rank's record counts.
    let previous =
        s.rt.block_on(s.l1.get_manifest(&cfg.job, job.step, cfg.rank))
            .ok();
    let local = (|| -> Result<(Vec<u8>, ShardManifest)> {
        let t = Instant::now();
        let ids = hash_and_write(s, job.step, &job.plan, job.snaps, &mut stats, segments)?;
        let t_manifest = Instant::now();
        let info = ShardInfo {
            job: cfg.job.clone(),
            step: job.step,
            rank: cfg.rank,
            world_size: cfg.world_size,
            created_unix_ms: strata_tiered::clock::unix_ms(&*s.clock),
        };
        let manifest =
            ShardManifest::from_layout(info, &job.specs, &job.plan.layout, &ids, job.metadata)?;
        let bytes = manifest.encode()?;
        tracing::info_span!("put_manifest").in_scope(|| {
            s.rt.block_on(s.l1.put_manifest(&cfg.job, job.step, cfg.rank, &bytes))
        })?;
        stats.manifest_time = t_manifest.elapsed();
        stats.write_time = t.elapsed();
        Ok((bytes, manifest))
    })();

    // Every rank votes, failed or not, so nobody waits for a rank that
    // gave up; rank 0's upload policy decides for all.
    // Not a step saved while the L3 lister could not tell which steps L3
    // holds (`Shared::l3_unlisted`): L3 may hold it from an earlier start.
    let upload = cfg.rank == 0 && s.upload_policy.wants(job.step);
    if upload && !job.l3_known {
        tracing::warn!(
            step = job.step,
            "step not uploaded: L3 could not be listed to check it does not hold this step already"
        );
    }
    let upload = upload && job.l3_known;
    let vote = Vote {
        ok: local.is_ok(),
        upload,
        already: false,
    };
    let t = Instant::now();
    let decision =
        tracing::info_span!("barrier").in_scope(|| commit::barrier(&*s.coord, cfg, job.step, vote));
    stats.barrier_time = t.elapsed();
    if let Ok(Decision {
        decided_before: Some(by),
        ..
    }) = decision
    {
        // Another rank holds this step committed: it was decided before,
        // and this save's shard is not part of it.
        let written = local.as_ref().ok().map(|(b, _)| b.as_slice());
        return Err(crate::roll_forward::settle_decided_before(
            s, job.step, by, previous, written,
        ));
    }
    let (bytes, manifest) = local?;
    let decision = decision?;
    let record = commit::record(
        cfg,
        job.step,
        &bytes,
        &manifest,
        strata_tiered::clock::unix_ms(&*s.clock),
    );
    let t = Instant::now();
    tracing::info_span!("commit").in_scope(|| s.rt.block_on(s.l1.commit(&record)))?;
    stats.commit_time = t.elapsed();
    stats.to_durable = job.started.elapsed();
    s.committed.note(job.step);

    s.commits.publish(Committed {
        step: job.step,
        decision,
    });
    match tracing::info_span!("retention").in_scope(|| retention(s)) {
        Ok((steps, bytes)) => {
            stats.retired_steps = steps;
            stats.retired_bytes = bytes;
        }
        // A failed cleanup does not fail a committed save.
        Err(e) => tracing::warn!(error = %e, "retention failed"),
    }
    tracing::info!(
        step = job.step,
        stall_ms = stats.stall.as_millis() as u64,
        durable_ms = stats.to_durable.as_millis() as u64,
        written = stats.bytes_written,
        deduped = stats.bytes_deduped,
        "step durable on L1"
    );
    Ok(stats)
}

/// Hashes each staging segment as it arrives (on the hash pool) and writes
/// its batch's new chunks to L1 while the next segment is filled and
/// hashed. Returns every chunk's id in layout order; the segments received
/// go to `segments` (to return them to the pool).
fn hash_and_write(
    s: &Shared,
    step: u64,
    plan: &Plan,
    snaps: mpsc::Receiver<Snap>,
    stats: &mut SaveStats,
    segments: &mut Vec<Arc<AlignedBuf>>,
) -> Result<Vec<ChunkId>> {
    let cfg = &s.cfg;
    let mut ids: Vec<ChunkId> = Vec::with_capacity(plan.layout.chunks.len());
    // New chunks go to the peers beside the L1 write (ends when dropped).
    let eager = crate::mirror::eager::EagerPush::start(s, step);
    let last_written = s.last_written.lock().ok().and_then(|mut g| g.take());
    type Hashed = (usize, Vec<ChunkId>, Arc<AlignedBuf>);
    let (hash_time, stall) = std::thread::scope(|sc| -> Result<(Duration, Duration)> {
        // One batch of look-ahead: hashing runs at most a batch ahead of
        // the writes.
        let (tx, rx) = mpsc::sync_channel::<Hashed>(1);
        let hasher = sc.spawn(move || -> Result<(Duration, Duration)> {
            let mut spent = Duration::ZERO;
            // Unless persisting may overlap the snapshot, take every segment
            // first: the copy then has the cores to itself.
            let mut early = std::collections::VecDeque::new();
            let mut taken = None;
            if !cfg.persist_during_snapshot {
                loop {
                    match snaps.recv() {
                        Ok(Snap::Segment(seg)) => early.push_back(seg),
                        Ok(Snap::Taken(stall)) => {
                            taken = Some(stall);
                            break;
                        }
                        Ok(Snap::Abandoned(why)) => {
                            return Err(Error::Pipeline(format!("snapshot failed: {why}")))
                        }
                        Err(_) => return Err(Error::Pipeline("the snapshot ended early".into())),
                    }
                }
            }
            for (k, batch) in plan.batches.iter().enumerate() {
                let next = match early.pop_front() {
                    Some(seg) => Ok(Snap::Segment(seg)),
                    None if taken.is_some() => {
                        return Err(Error::Pipeline("the snapshot ended early".into()))
                    }
                    None => snaps.recv(),
                };
                let seg = match next {
                    Ok(Snap::Segment(seg)) => seg,
                    Ok(Snap::Abandoned(why)) => {
                        return Err(Error::Pipeline(format!("snapshot failed: {why}")))
                    }
                    Ok(Snap::Taken(_)) | Err(_) => {
                        return Err(Error::Pipeline("the snapshot ended early".into()))
                    }
                };
                let t = Instant::now();
                let got = tracing::debug_span!("hash", batch = k).in_scope(|| {
                    par_map(
                        batch.len(),
                        s.hash_threads,
                        || (),
                        |_, j| ChunkId::of(&seg[plan.range(batch.start + j)]),
                    )
                });
                spent += t.elapsed();
                if tx.send((k, got, seg)).is_err() {
                    // The writer failed; its error is the one reported.
                    return Ok((spent, Duration::ZERO));
                }
            }
            if let Some(stall) = taken {
                return Ok((spent, stall));
            }
            match snaps.recv() {
                Ok(Snap::Taken(stall)) => Ok((spent, stall)),
                Ok(Snap::Abandoned(why)) => Err(Error::Pipeline(format!("snapshot failed: {why}"))),
                _ => Err(Error::Pipeline("the snapshot did not finish".into())),
            }
        });
        for (k, got, seg) in rx {
            let batch = plan.batches[k].clone();
            let puts = batch
                .clone()
                .zip(&got)
                .map(|(i, id)| {
                    Ok(ChunkPut {
                        id: *id,
                        hint: plan.layout.chunks[i].hint,
                        data: ChunkData::new(seg.clone(), plan.range(i))?,
                    })
                })
                .collect::<Result<Vec<_>>>();
            segments.push(seg.clone());
            let puts = puts?;
            // The eager push's copy of the batch (`EagerPush::offer`) is
            // made on a thread of its own while this one waits for the L1
            // write; a push still busy with an earlier batch takes none.
            // Only the chunks new since this process's last save (on its
            // first, those L1 lacks, asked before the write makes them): an
            // unchanged chunk went with an earlier step, and the push after
            // the commit sends whatever a peer still lacks. Offering every
            // chunk made an incremental step's L1 write wait for a copy of
            // each batch, nearly all of it chunks the peers already held.
            // (Not "what L1 lacks" on every save: data-parallel ranks of a
            // node write the same new chunks, and the one that writes
            // second must still offer them, for the claims to decide who
            // sends them.)
            let offering = eager.as_ref().filter(|e| e.is_idle()).and_then(|e| {
                let old: Vec<bool> = match &last_written {
                    Some(ids) => got.iter().map(|id| ids.contains(id)).collect(),
                    None => s
                        .rt
                        .block_on(s.l1.has_chunks(&cfg.job, &got))
                        .unwrap_or_default(),
                };
                let pieces: Vec<_> = batch
                    .zip(&got)
                    .enumerate()
                    .filter(|(j, _)| old.get(*j) != Some(&true))
                    .map(|(_, (i, id))| (*id, plan.layout.chunks[i].hint, plan.range(i)))
                    .collect();
                if pieces.is_empty() {
                    return None;
                }
                std::thread::Builder::new()
                    .name("strata-eager-copy".into())
                    .spawn_scoped(sc, move || e.offer(&seg, pieces))
                    .map_err(|err| {
                        tracing::debug!(error = %err, "cannot start the eager push's copy: batch left for the push after the commit");
                    })
                    .ok()
            });
            let put = tracing::debug_span!("write_chunks", batch = k)
                .in_scope(|| s.rt.block_on(s.l1.put_chunks(&cfg.job, puts)));
            // Joined before any error returns: a copy that panicked is
            // logged here, not re-raised by the scope on this thread.
            if let Some(h) = offering {
                if h.join().is_err() {
                    tracing::warn!(
                        "the eager push's copy panicked: batch left for the push after the commit"
                    );
                }
            }
            let put = put?;
            stats.bytes_written += put.bytes_written;
            stats.bytes_deduped += put.bytes_deduped;
            stats.chunks_written += put.written;
            stats.chunks_deduped += put.deduped;
            ids.extend(got);
        }
        hasher
            .join()
            .map_err(|_| Error::Pipeline("the hash pool panicked".into()))?
    })?;
    stats.hash_time = hash_time;
    stats.stall = stall;
    if let Ok(mut last) = s.last_written.lock() {
        *last = Some(ids.iter().copied().collect());
    }
    Ok(ids)
}

/// Keeps the newest `keep_last` steps this rank committed on L1, and the
/// steps still waiting for (or in) an upload or a push; retires this rank's
/// shard of older ones, of its partial steps older than the oldest kept,
/// and of shards left half-retired by a crash; then sweeps the chunks no
/// remaining manifest (of any rank) references and the tier has not
/// touched for the grace period (`strata_gc::collect`, the same code every
/// tier uses).
///
/// Only this rank's files are deleted (ranks of a node share its L1), and
/// only steps this rank committed count: its own record proves every rank
/// voted the step durable. A listing error aborts it all before anything
/// is deleted.
fn retention(s: &Shared) -> Result<(u64, u64)> {
    let cfg = &s.cfg;
    let Some(policy) = cfg.retention_for(crate::tiers::TierKind::L1) else {
        return Ok((0, 0));
    };
    let hold = crate::mirror::held_on_l1(s);
    let opts = strata_gc::Options {
        scope: Some(strata_gc::Scope::Rank(cfg.rank)),
        hold: hold.into_iter().collect(),
        lazy: true,
        ..Default::default()
    };
    let (_, report) =
        s.rt.block_on(strata_gc::collect(&*s.l1, &cfg.job, &policy, &opts))
            .map_err(|e| match e {
                strata_gc::GcError::Store { source, .. } => Error::Store(source),
                other => Error::Config(other.to_string()),
            })?;
    Ok((
        report.shards_retired + report.partial_removed,
        report.bytes_freed,
    ))
}

//! Lazy tiering to L3: committed steps chosen by the policy
//! ([`crate::policy`], decided by rank 0 at the commit barrier, so every
//! rank uploads the same steps) or asked for through
//! [`Checkpointer::upload`] are uploaded in the background from L1, never
//! stalling `save`. The uploader hears of committed steps as a subscriber
//! of the commit protocol's events.
//!
//! An upload sends only the chunk ids L3 does not hold yet (across steps
//! and ranks), in bounded batches read back (verified) from L1, under the
//! configured bandwidth cap; then the shard manifest; then this rank's
//! commit record, create-only. A crash mid-upload leaves no commit record,
//! and the next upload of that step re-sends only what is missing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use strata_tiered::{ChunkStore, ThrottleConfig, ThrottleStore};

use super::Lane;
use crate::coord::commit::Committed;
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::step_states::StepStates;
use crate::tier_states::{L3State, UploadJob, Uploads};
use crate::tiers::copy::{copy_step, CopyOptions, CopyProgress, Verify};

/// Chunk bytes read from L1 and uploaded per batch (bounds upload memory).
const UPLOAD_BATCH_BYTES: u64 = 64 << 20;

/// Tiering as a [`Lane`] of the shared subscription: the steps the
/// barrier decided to upload are queued (marked queued at once, so L1
/// retention keeps them).
pub(crate) struct L3Lane {
    pub(crate) uploads: Arc<Uploads>,
    pub(crate) tx: Mutex<mpsc::Sender<UploadJob>>,
}

impl Lane for L3Lane {
    type State = L3State;
    const TO: &'static str = "L3";
    const LIMIT: &'static str = "max_pending_uploads";

    fn states(&self) -> &StepStates<L3State> {
        &self.uploads.states
    }

    fn wants(&self, ev: &Committed) -> bool {
        ev.decision.upload
    }

    /// Queued, not being uploaded yet.
    fn waiting(&self, _: u64, st: &L3State) -> bool {
        matches!(st, L3State::Queued)
    }

    fn queue(&self, step: u64) {
        let queued = self
            .tx
            .lock()
            .map_err(|_| Error::Pipeline("poisoned".into()))
            .and_then(|tx| enqueue(&self.uploads, &tx, step));
        if let Err(e) = queued {
            tracing::warn!(step, error = %e, "could not queue the upload");
        }
    }

    /// Failed, saying why: the uploader skips it.
    fn dropped(&self, why: String) -> L3State {
        L3State::Failed(why)
    }

    fn count_dropped(&self) {
        self.uploads.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Queues `step` for upload.
pub(crate) fn enqueue(uploads: &Uploads, tx: &mpsc::Sender<UploadJob>, step: u64) -> Result<()> {
    uploads.set(step, L3State::Queued);
    uploads.queued.fetch_add(1, Ordering::SeqCst);
    tx.send(step).map_err(|_| {
        uploads.queued.fetch_sub(1, Ordering::SeqCst);
        // Not left queued: nothing would ever take it (and a backlog
        // waiting for it would wait forever).
        uploads.set(step, L3State::Failed("the uploader stopped".into()));
        Error::Pipeline("the uploader stopped".into())
    })
}

/// The uploader thread's loop. Uploads go to L3 through a throttle of
/// `upload_bytes_per_sec` (restores from L3 are not capped).
pub(crate) fn run(s: &Shared, l3: Arc<dyn ChunkStore>, rx: &mpsc::Receiver<UploadJob>) {
    let dst: Arc<dyn ChunkStore> = match s.cfg.upload_bytes_per_sec {
        0 => l3,
        cap => Arc::new(ThrottleStore::new(
            l3,
            ThrottleConfig {
                write_bytes_per_sec: cap,
                ..ThrottleConfig::default()
            },
        )),
    };
    while let Ok(step) = rx.recv() {
        let _span = tracing::info_span!("upload", step).entered();
        // Taken off the backlog: from now on it is being uploaded (so it
        // is never dropped, and L1 retention holds it) unless it was
        // dropped while it waited.
        let skip = s
            .uploads
            .states
            .update(|m| {
                if matches!(m.get(&step), Some(L3State::Failed(_))) {
                    return true;
                }
                m.insert(step, L3State::Uploading { done: 0, total: 0 });
                false
            })
            .unwrap_or(false);
        if skip {
            // Dropped from the backlog while it waited.
            s.uploads.queued.fetch_sub(1, Ordering::SeqCst);
            s.uploads.states.update(|_| ());
            continue;
        }
        // A panic in an upload must not leave waiters hanging on the queue.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| upload_step(s, &*dst, step)))
                .unwrap_or_else(|_| Err(Error::Pipeline("the upload panicked".into())));
        match outcome {
            Ok((sent, deduped)) => {
                tracing::info!(step, sent, deduped, "step committed on L3");
                s.uploads.set(step, L3State::Committed { sent, deduped });
                collect_after(s, &*dst, step);
            }
            Err(e) => {
                tracing::warn!(step, error = %e, "upload to L3 failed");
                s.uploads.set(step, L3State::Failed(e.to_string()));
                if let Ok(mut due) = s.uploads.sweep_due.lock() {
                    let now = std::time::Instant::now();
                    *due = Some((due.map_or(now, |(first, _)| first), now));
                }
                // The collector runs on rank 0 alone: not after its own
                // successful uploads only, or L3 would grow while they fail.
                collect_after(s, &*dst, step);
            }
        }
        s.uploads.queued.fetch_sub(1, Ordering::SeqCst);
        // Wakes `wait_uploads`, which watches the count.
        s.uploads.states.update(|_| ());
    }
}

/// Added to the grace period before a full collection after a failed
/// upload: L3 stamps objects to the second (S3's `Last-Modified`), and its
/// clock's offset from this node's cancels out (the upload's chunks were
/// stamped before it failed, by the clock the collection reads).
const L3_CLOCK_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// [`collect_l3`] after the upload of `step`; a panic in it is logged.
fn collect_after(s: &Shared, l3: &dyn ChunkStore, step: u64) {
    let collected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collect_l3(s, l3)));
    if collected.is_err() {
        tracing::warn!(step, "L3 retention panicked; the uploader goes on");
    }
}

/// L3 retention after an upload, by rank 0 alone for the whole job: every
/// rank's shards of the steps the policy no longer keeps, then the chunks
/// no manifest references and L3 has not written for `l3_gc_grace_secs`
/// (`strata_gc::collect`). Steps still queued or uploading here are held.
/// A failure is logged, not fatal.
///
/// One collector, not one per rank: each collection lists L3 (every
/// rank's commit record of every step), so a collector per rank cost
/// O(world²) requests per upload. The policy retires complete steps it no
/// longer keeps and incomplete ones older than the oldest complete step it
/// keeps; each rank uploads in step order, so a rank whose record of a
/// kept step is on L3 has finished (or dropped) every older upload of its
/// queue. Uploads out of that order (one asked for again with
/// `upload(step)`, a restore's roll-forward) may still be running on
/// another rank: an incomplete step is held for `l3_gc_grace_secs` from
/// when rank 0 first saw it so (`strata_gc::Abandoned::Watched`). Newer
/// incomplete steps are bounded to the newest `l3_keep_last` once past
/// that grace and every rank they lack has stalled (its newest record on
/// L3 unchanged for the grace), so a rank
/// whose uploads never get through does not make L3 keep every other
/// rank's shards for good.
fn collect_l3(s: &Shared, l3: &dyn ChunkStore) {
    let cfg = &s.cfg;
    // `l3_keep_last = 0`: L3 is never collected.
    let Some(policy) = cfg.retention_for(crate::tiers::TierKind::L3) else {
        return;
    };
    if cfg.rank != 0 {
        return;
    }
    let mut hold: std::collections::BTreeSet<u64> = s.uploads.pinned().into_iter().collect();
    // Steps uploaded on request (`upload(step)`) stay for this process.
    if let Ok(asked) = s.uploads.requested.lock() {
        hold.extend(asked.iter().copied());
    }
    let grace = std::time::Duration::from_secs(cfg.l3_gc_grace_secs);
    let started = std::time::Instant::now();
    // A failed upload's chunks can go once a grace period has passed
    // since it: the first collection after that lists every chunk.
    let wait = grace.saturating_add(L3_CLOCK_MARGIN);
    let due = s.uploads.sweep_due.lock().ok().and_then(|d| *d);
    let full = due.is_some_and(|(first, _)| started.saturating_duration_since(first) >= wait);
    let opts = strata_gc::Options {
        scope: Some(strata_gc::Scope::All),
        // Each rank copies its own record to L3: a step counts once every
        // rank's is there.
        evidence: strata_gc::Evidence::EveryRank,
        abandoned: strata_gc::Abandoned::Watched {
            seen: s.uploads.incomplete.clone(),
            grace,
            progress: Some(s.uploads.progress.clone()),
        },
        hold,
        // Shards and chunks are looked at only when a shard retires, or
        // when a failed upload's chunks are due (`Uploads::sweep_due`).
        lazy: !full,
        ..Default::default()
    };
    let outcome =
        s.rt.block_on(strata_gc::collect(l3, &cfg.job, &policy, &opts));
    if let (true, Some((_, last))) = (full, due) {
        if let Ok(mut d) = s.uploads.sweep_due.lock() {
            *d = match &outcome {
                // Every failure a grace period old is covered; those since
                // (this thread's own uploads: none during the collection)
                // are due a grace period after the last of them.
                Ok((_, r)) if r.held_back.is_none() => {
                    (started.saturating_duration_since(last) < wait).then_some((last, last))
                }
                // L3 refused, or held every chunk back (a kept manifest it
                // cannot read): again a grace period later, not at every
                // upload until then.
                _ => Some((started, last)),
            };
        }
    }
    match outcome {
        Ok((_, r))
            if r.shards_retired + r.partial_removed + r.chunks_deleted + r.uploads_aborted > 0
                || r.uploads_error.is_some() =>
        {
            if let Some(e) = &r.uploads_error {
                tracing::warn!(error = %e, "L3 retention: stale multipart uploads not aborted");
            }
            tracing::info!(
                retired = r.shards_retired,
                partial = r.partial_removed,
                chunks = r.chunks_deleted,
                bytes = r.bytes_freed,
                uploads_aborted = r.uploads_aborted,
                "L3 retention"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "L3 retention failed"),
    }
}

/// Uploads this rank's shard of `step` from L1 to L3 and commits it there
/// ([`copy_step`]: only the chunks L3 lacks, read back verified from L1,
/// then the manifest and L1's own commit record, byte for byte, so an
/// upload asked for twice finds the identical record and succeeds).
/// Returns (chunk bytes sent, chunk bytes L3 already held).
fn upload_step(s: &Shared, l3: &dyn ChunkStore, step: u64) -> Result<(u64, u64)> {
    let opts = CopyOptions {
        batch_bytes: UPLOAD_BATCH_BYTES,
        verify: Verify::Here,
        siblings: None,
        pause: Some(&s.foreground),
    };
    let total = AtomicU64::new(0);
    let progress = |p: CopyProgress| match p {
        CopyProgress::Planned { total: t } => {
            total.store(t, Ordering::Relaxed);
            s.uploads
                .set(step, L3State::Uploading { done: 0, total: t });
        }
        CopyProgress::Sent { bytes } => {
            s.uploads
                .add_done(step, bytes, total.load(Ordering::Relaxed));
        }
    };
    let st = s.rt.block_on(copy_step(
        &s.l1, l3, &s.cfg.job, step, s.cfg.rank, opts, &progress,
    ))?;
    Ok((st.bytes_sent, st.bytes_present))
}

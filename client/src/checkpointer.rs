//! [`Checkpointer`]: async save to L1 and verified restore.
//!
//! `save` copies the state into a pre-faulted staging buffer, laid out chunk
//! by chunk at aligned offsets, and returns a [`SaveHandle`] at once: the
//! caller may overwrite its tensors right away. A persist worker thread then
//! hashes the chunks on a bounded pool of CPU threads, writes the new ones to
//! L1 straight from the staging buffer (O_DIRECT, no copy), writes the shard
//! manifest, waits for every rank at a barrier, writes the commit record,
//! and applies retention. The async runtime only drives tier calls; CPU work
//! never runs on its threads.
//!
//! This module is the save side of the API; construction is in
//! `builder.rs`, restore in `restore/`, uploads to L3 and
//! replication in `mirror/` (their states in `tier_states.rs`).

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use strata_format::layout::Layout;
use strata_format::EntrySpec;
use strata_tiered::{ChunkStore, L1Store};

use crate::config::{BusyPolicy, Config};
use crate::error::{Error, Result};
use crate::handle::{Completion, SaveHandle};
use crate::health::Background;
use crate::save::persist::{PersistJob, Snap};
use crate::save::snapshot::{fill_segment, Plan};
use crate::shared::Shared;
use crate::state::Entry;
use crate::stats::{Health, SaveStats};

/// Saves and restores one rank's state. See the module documentation.
pub struct Checkpointer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) tx: Option<mpsc::Sender<PersistJob>>,
    pub(crate) worker: Option<std::thread::JoinHandle<()>>,
    pub(crate) uploader: Option<std::thread::JoinHandle<()>>,
    pub(crate) replicator: Option<std::thread::JoinHandle<()>>,
    pub(crate) inflight: Mutex<Option<(u64, Arc<Completion>)>>,
    pub(crate) skipped: std::sync::atomic::AtomicU64,
    /// Saves that failed in the background, until reported.
    pub(crate) background: Arc<Background>,
    /// The `/metrics` endpoint, where `metrics_listen` is set.
    pub(crate) metrics: Option<crate::metrics::serve::MetricsServer>,
}

impl Checkpointer {
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// This process's metrics in Prometheus' text format (what
    /// `metrics_listen` serves): saves, their stall, time to durable and
    /// barrier wait, bytes written and deduplicated, restores and the
    /// bytes each tier served, errors by kind, uploads and replicas
    /// waiting, failed or dropped. Every series is labelled with the job,
    /// rank and node.
    pub fn metrics_text(&self) -> String {
        self.shared.metrics_text()
    }

    /// The value of the series of [`Self::metrics_text`] named `name`
    /// that carries no label beyond the process's own (job, rank, node):
    /// a counter such as `strata_background_held_seconds_total`. None
    /// where there is no such series (a name it does not have, or one
    /// whose every series has labels of its own).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let prefix = self.shared.metrics.series_prefix(name);
        self.metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Saves `data` as step `step`'s one tensor `w` (bytes) and waits until
    /// it is durable (the crate's unit tests).
    #[cfg(test)]
    pub(crate) fn save_bytes(&self, step: u64, data: &[u8]) {
        let shape = [data.len() as u64];
        let entries = [crate::Entry::tensor(
            "w",
            strata_format::DType::U8,
            &shape,
            data,
        )];
        self.save(step, &entries)
            .expect("save")
            .wait()
            .expect("durable");
    }

    /// Where `/metrics` is served (`metrics_listen`, with the port chosen
    /// where it named 0); None where it is not.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr())
    }

    /// How the local tier does its I/O: the L1 engine running
    /// ("io_uring" or "psync"), or a custom store's description.
    pub fn engine_name(&self) -> String {
        match self.l1() {
            Some(l1) => l1.engine_name().to_string(),
            None => self.shared.l1.describe(),
        }
    }

    /// Steps skipped by the busy policy so far.
    pub fn skipped_saves(&self) -> u64 {
        self.skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Saves that failed in the background so far.
    pub fn failed_saves(&self) -> u64 {
        self.background.failed_saves()
    }

    /// The newest save that failed in the background, as
    /// [`Error::Background`] (kept after it was reported), or None.
    pub fn last_error(&self) -> Option<Error> {
        self.background.last_error()
    }

    /// The background's counters (failed and skipped saves, dropped
    /// uploads and pushes) and the newest failure.
    pub fn health(&self) -> Health {
        Health {
            failed_saves: self.failed_saves(),
            skipped_saves: self.skipped_saves(),
            dropped_uploads: self.dropped_uploads(),
            dropped_pushes: self.dropped_pushes(),
            last_error: self.last_error(),
        }
    }

    /// Returns, once, an earlier save's background failure that no handle
    /// reported ([`Error::Background`]); `Ok` if there is none, or with
    /// `on_background_error = "log"`. `save`, `flush` and `close` call it.
    pub fn check_background(&self) -> Result<()> {
        self.background.check()
    }

    /// The local tier (for inspection tools).
    pub fn local(&self) -> &Arc<dyn ChunkStore> {
        &self.shared.l1
    }

    /// The local tier as an [`L1Store`], when it is the default L1 on
    /// `l1_dir` (paths of chunk files and manifests, for repair tools and
    /// tests).
    pub fn l1(&self) -> Option<&L1Store> {
        self.shared.l1_disk.as_ref()
    }

    /// The entries' specs and where their chunks go in staging memory.
    fn plan(&self, state: &[Entry<'_>]) -> Result<(Vec<EntrySpec>, Plan)> {
        let specs: Vec<EntrySpec> = state
            .iter()
            .map(Entry::spec)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::InvalidState(e.to_string()))?;
        let layout = Layout::plan(&specs, self.shared.cfg.chunk_size)
            .map_err(|e| Error::InvalidState(e.to_string()))?;
        Ok((specs, Plan::new(layout)))
    }

    /// Allocates and pre-faults the staging memory a save of `state` needs
    /// (pinned for GPU tensors), so that even the first save stalls only
    /// for the copy: call it once before training starts. Optional: without
    /// it the first save pays for fresh memory (on these VMs 2–5× its copy).
    pub fn prepare(&self, state: &[Entry<'_>]) -> Result<()> {
        let (_, plan) = self.plan(state)?;
        let gpu = self.shared.gpu_for(state.iter().filter_map(|e| e.device))?;
        let segments: Vec<_> = plan
            .segment_lens
            .iter()
            .map(|&len| self.shared.pool.take(len, gpu.as_deref()))
            .collect();
        for seg in segments {
            self.shared.pool.give_back_owned(seg);
        }
        Ok(())
    }

    /// Snapshots `state` for `step` and returns as soon as the snapshot is
    /// taken; the step becomes durable in the background (see [`SaveHandle`]).
    ///
    /// An earlier save that failed in the background, unreported by its
    /// handle, is returned first as [`Error::Background`] (with
    /// `busy_policy = "wait"`, after waiting for the save in flight), and
    /// this save does nothing: call it again to save (see
    /// [`Self::check_background`]).
    pub fn save(&self, step: u64, state: &[Entry<'_>]) -> Result<SaveHandle> {
        self.save_with_metadata(step, state, BTreeMap::new())
    }

    /// [`Self::save`] with user metadata stored in the manifest.
    pub fn save_with_metadata(
        &self,
        step: u64,
        state: &[Entry<'_>],
        metadata: BTreeMap<String, String>,
    ) -> Result<SaveHandle> {
        let started = Instant::now();
        let _span = tracing::info_span!("save", step).entered();
        self.check_background()?;
        // The busy policy.
        let busy = self.inflight.lock().ok().and_then(|g| {
            g.as_ref()
                .filter(|(_, c)| !c.is_done())
                .map(|(s, c)| (*s, c.clone()))
        });
        if let Some((busy_with, done)) = busy {
            match self.shared.cfg.busy_policy {
                BusyPolicy::Wait => {
                    done.wait_done();
                    // The save waited for may have failed.
                    self.check_background()?;
                }
                BusyPolicy::Error => return Err(Error::Busy { step, busy_with }),
                BusyPolicy::Skip => {
                    self.skipped
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        step,
                        busy_with,
                        "save skipped: previous save still persisting"
                    );
                    let done = Completion::new();
                    let skipped = SaveStats {
                        step,
                        skipped: true,
                        ..SaveStats::default()
                    };
                    self.shared.metrics.save_done(Ok(&skipped));
                    done.finish(Ok(skipped));
                    return Ok(SaveHandle {
                        step,
                        stall: started.elapsed(),
                        done,
                        shared: self.shared.clone(),
                    });
                }
            }
        }

        // A committed step is never saved again (it would replace a
        // committed shard): refused before anything is written.
        // Whether the L3 lister knew what L3 holds when it checked this
        // step: read before the check (a listing in the background may
        // clear it meanwhile, after the check let the step through) and
        // after it (a first save's own listing may set it).
        let unlisted = || {
            self.shared
                .l3_unlisted
                .load(std::sync::atomic::Ordering::Acquire)
        };
        let unlisted_before = unlisted();
        self.shared.refuse_committed(step)?;
        let l3_known = !unlisted_before && !unlisted();
        self.shared.relist_l3_in_background();
        let (specs, plan) = self.plan(state)?;
        let plan = Arc::new(plan);
        let gpu = self.shared.gpu_for(state.iter().filter_map(|e| e.device))?;

        // The worker starts on the first segment while later ones are copied.
        let (snap_tx, snaps) = mpsc::channel();
        let done = Completion::new();
        let job = PersistJob {
            step,
            started,
            specs,
            plan: plan.clone(),
            snaps,
            metadata,
            done: done.clone(),
            l3_known,
        };
        self.tx
            .as_ref()
            .ok_or_else(|| Error::Pipeline("checkpointer closed".into()))?
            .send(job)
            .map_err(|_| Error::Pipeline("persist worker stopped".into()))?;
        if let Ok(mut g) = self.inflight.lock() {
            *g = Some((step, done.clone()));
        }
        let _snap = tracing::info_span!("snapshot").entered();
        // The background copies hold back while the state is copied.
        let _foreground = self.shared.foreground.enter();
        for (k, &len) in plan.segment_lens.iter().enumerate() {
            let mut seg = self.shared.pool.take(len, gpu.as_deref());
            let filled = fill_segment(
                &plan,
                k,
                state,
                &mut seg,
                self.shared.hash_threads,
                gpu.as_deref(),
            );
            if let Err(e) = filled {
                // Copies queued before the error may still be running.
                let drained = gpu.as_deref().is_none_or(|g| g.synchronize().is_ok());
                crate::gpu::release_after_error(drained, seg, |s| {
                    self.shared.pool.give_back_owned(s);
                });
                let _ = snap_tx.send(Snap::Abandoned(e.to_string()));
                return Err(e);
            }
            if snap_tx.send(Snap::Segment(Arc::new(seg))).is_err() {
                // The worker already failed this save: stop copying; the
                // handle reports why.
                break;
            }
        }
        let stall = started.elapsed();
        let _ = snap_tx.send(Snap::Taken(stall));
        Ok(SaveHandle {
            step,
            stall,
            done,
            shared: self.shared.clone(),
        })
    }

    /// Waits for the save in flight, if any; then returns an earlier
    /// save's unreported background failure, if any (see
    /// [`Self::check_background`]).
    pub fn flush(&self) -> Result<()> {
        self.wait_inflight();
        self.check_background()
    }

    /// Waits for this process's save in flight, if any (its handle
    /// reports its outcome).
    pub(crate) fn wait_inflight(&self) {
        let c = self
            .inflight
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|(_, c)| c.clone()));
        if let Some(c) = c {
            c.wait_done();
        }
    }

    /// Finishes what was started (the save in flight, queued pushes and
    /// uploads, as dropping does) and returns an earlier save's unreported
    /// background failure, if any.
    pub fn close(mut self) -> Result<()> {
        self.finish();
        self.check_background()
    }

    /// Joins the workers once their queues are done. Idempotent.
    fn finish(&mut self) {
        // Finish what was started: a training loop that exits right after a
        // save expects that step on disk.
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        // Then the uploads queued so far (closing the queues, held by the
        // subscribers and `upload`, ends the workers once they are empty).
        self.shared.commits.close();
        if let Ok(mut tx) = self.shared.upload_tx.lock() {
            tx.take();
        }
        if let Some(u) = self.uploader.take() {
            let _ = u.join();
        }
        if let Some(r) = self.replicator.take() {
            let _ = r.join();
        }
        self.metrics.take();
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.finish();
    }
}

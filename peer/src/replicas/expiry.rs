//! Jobs no request named for [`super::Limits::job_idle`] (off by
//! default): a finished job's newest steps would otherwise stay on the
//! peers for good (retention runs on a job's commits, which a finished job
//! never sends), holding the budgets every other job shares. Such a job is
//! expired: every step it did not pin is dropped (records, then manifests,
//! as retention does), then every chunk that no pinned step names. Turn it
//! on only where another tier (L3) holds every job's steps: a job whose
//! node died may have its newest steps only on the peers.
//!
//! Every request holds its job's gate (read) until it is answered, and an
//! expiry holds it (write) for the whole job, taken only when no request
//! of the job runs: a job that resumes never has a request run against a
//! half-expired job; its requests wait for the expiry, then find the job
//! empty and push again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_format::manifest::ShardManifest;
use strata_format::names::validate_job_id;
use strata_format::ChunkId;
use strata_tiered::{Result, StoreError};
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use super::{poisoned, Replicas};

/// When a request last named a job, and its gate.
pub(super) struct JobUse {
    last: Instant,
    gate: Arc<RwLock<()>>,
}

/// What expiring one job dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// The job.
    pub job: String,
    /// Steps dropped (pinned ones stay).
    pub steps: u64,
    /// Chunks dropped.
    pub chunks: u64,
    /// Their stored bytes.
    pub bytes: u64,
}

impl Replicas {
    /// Notes that a request named `job` now, and returns its gate.
    /// (A known job, every request but its first: no allocation.)
    fn touch(&self, job: &str, at: Instant) -> Option<Arc<RwLock<()>>> {
        let mut used = self.used.lock().ok()?;
        if let Some(u) = used.get_mut(job) {
            u.last = u.last.max(at);
            return Some(u.gate.clone());
        }
        let gate = Arc::new(RwLock::new(()));
        used.insert(
            job.to_string(),
            JobUse {
                last: at,
                gate: gate.clone(),
            },
        );
        Some(gate)
    }

    /// Notes that a request named `job` now (the service does it through
    /// [`Self::enter_job`]).
    #[cfg(test)]
    pub(crate) fn touch_job(&self, job: &str) {
        self.touch(job, Instant::now());
    }

    /// A request of `job` starts: noted, and held off while the job
    /// expires. Keep the guard until the request is answered.
    pub async fn enter_job(&self, job: &str) -> Option<OwnedRwLockReadGuard<()>> {
        let gate = self.touch(job, Instant::now())?;
        Some(gate.read_owned().await)
    }

    /// When a request last named `job` (the service's start if none has).
    fn last_used(&self, job: &str) -> Result<Instant> {
        let used = self.used.lock().map_err(|_| poisoned())?;
        Ok(used.get(job).map_or(self.anchor.0, |u| u.last))
    }

    /// Every job the service holds chunks or steps of.
    fn held_jobs(&self) -> Result<Vec<String>> {
        let mut jobs: Vec<String> = self
            .chunks
            .lock()
            .map_err(|_| poisoned())?
            .jobs
            .keys()
            .cloned()
            .collect();
        let root = self.steps.root();
        match std::fs::read_dir(root) {
            Ok(rd) => {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if validate_job_id(&name).is_ok() {
                        jobs.push(name);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io("listing", root, e)),
        }
        jobs.sort();
        jobs.dedup();
        Ok(jobs)
    }

    /// Expires every job that no request named for the limits' `job_idle`
    /// (none without it) and that no request runs for now. A job whose
    /// expiry fails part-way (a pinned step's manifest unreadable, a disk
    /// error) keeps what was not dropped yet; it is logged, and tried again
    /// an idle period later. Returns what was dropped, per job.
    pub async fn expire_idle(&self) -> Result<Vec<Expired>> {
        let Some(idle) = self.limits.job_idle else {
            return Ok(Vec::new());
        };
        let held = self.held_jobs()?;
        self.forget_jobs_not_held(&held, idle)?;
        let mut out = Vec::new();
        for job in held {
            let started = Instant::now();
            if started.saturating_duration_since(self.last_used(&job)?) < idle {
                continue;
            }
            // Not a use: the gate, as last seen.
            let Some(gate) = self.touch(&job, self.anchor.0) else {
                continue;
            };
            // Not while a request of the job runs (it would see the job
            // half gone); requests that come meanwhile wait for this.
            let Ok(_alone) = gate.try_write_owned() else {
                continue;
            };
            if self.last_used(&job)? > started {
                continue; // named since it was found idle
            }
            let got = self.expire(&job, started).await;
            // Looked at again a whole idle period from now.
            self.touch(&job, started);
            match got {
                Ok(e) if e.steps + e.chunks > 0 => {
                    tracing::info!(
                        job,
                        steps = e.steps,
                        chunks = e.chunks,
                        bytes = e.bytes,
                        idle_secs = idle.as_secs(),
                        "an idle job's replicas expired"
                    );
                    out.push(e);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(job, error = %e, "expiring an idle job failed"),
            }
        }
        Ok(out)
    }

    /// Forgets when jobs that hold nothing any more were last named
    /// (unless a request of theirs runs now, or one came within `idle`:
    /// a new job's first data may have landed since `held` was read).
    fn forget_jobs_not_held(&self, held: &[String], idle: Duration) -> Result<()> {
        let now = Instant::now();
        let mut used = self.used.lock().map_err(|_| poisoned())?;
        used.retain(|job, u| {
            held.binary_search(job).is_ok()
                || Arc::strong_count(&u.gate) > 1
                || now.saturating_duration_since(u.last) < idle
        });
        Ok(())
    }

    async fn expire(&self, job: &str, started: Instant) -> Result<Expired> {
        let mut out = Expired {
            job: job.to_string(),
            ..Expired::default()
        };
        let pins = self.list_pins(job).await?;
        let mut keep: HashSet<ChunkId> = HashSet::new();
        for st in self.list_steps(job).await? {
            if !pins.contains(&st.step) {
                self.delete_step(job, st.step).await?;
                out.steps += 1;
                continue;
            }
            for &rank in &st.manifests {
                let bytes = self.get_manifest(job, st.step, rank).await?;
                let m = ShardManifest::decode(&bytes).map_err(|e| {
                    StoreError::invalid(
                        "manifest",
                        format!("pinned step {} rank {rank} of {job}: {e}", st.step),
                    )
                })?;
                keep.extend(m.chunks.iter().map(|c| c.id));
            }
        }
        let doomed: Vec<ChunkId> = self
            .list_chunks(job)?
            .into_iter()
            .filter(|id| !keep.contains(id))
            .collect();
        let (chunks, bytes) = self.delete_untouched_since(job, &doomed, started)?;
        out.chunks = chunks;
        out.bytes = bytes;
        if pins.is_empty() {
            // Nothing of the job is left: its directory goes too, so the
            // job is no longer listed (nor looked at again each period).
            let dir = self.steps.root().join(job);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(job, error = %e, "removing an expired job's directory");
                }
            }
        }
        Ok(out)
    }
}

/// How often a service looks for idle jobs: a quarter of the idle time,
/// between 50 ms and a minute.
pub fn expiry_tick(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(60))
}

#[cfg(test)]
mod tests;

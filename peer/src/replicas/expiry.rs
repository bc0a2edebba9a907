//! Jobs no request named for [`super::Limits::job_idle`]: a finished
//! job's newest steps would otherwise stay on the peers for good (retention
//! runs on a job's commits, which a finished job never sends), holding the
//! budgets every other job shares. Such a job is expired: every step it
//! did not pin is dropped (records, then manifests, as retention does),
//! then every chunk that no pinned step names. Its steps stay in L1 and
//! L3; a job that comes back pushes again.
//!
//! A request naming the job while it is expired stops the expiry before
//! its chunks go, and a chunk put or found present since the expiry began
//! is kept (as retention re-checks its sweep), so a job that resumes never
//! has a push deduplicate against a chunk then deleted.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use strata_format::manifest::ShardManifest;
use strata_format::names::validate_job_id;
use strata_format::ChunkId;
use strata_tiered::{Result, StoreError};

use super::{poisoned, Replicas};

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
    /// Notes that a request named `job` now.
    pub fn touch_job(&self, job: &str) {
        let now = Instant::now();
        if let Ok(mut used) = self.used.lock() {
            match used.get_mut(job) {
                Some(t) => *t = now,
                None => {
                    used.insert(job.to_string(), now);
                }
            }
        }
    }

    /// When a request last named `job` (the service's start if none has).
    fn last_used(&self, job: &str) -> Result<Instant> {
        let used = self.used.lock().map_err(|_| poisoned())?;
        Ok(used.get(job).copied().unwrap_or(self.anchor.0))
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
    /// (none without it). A job that cannot be expired (a pinned step's
    /// manifest unreadable, a disk error) is logged and left whole for the
    /// next round. Returns what was dropped, per job.
    pub async fn expire_idle(&self) -> Result<Vec<Expired>> {
        let Some(idle) = self.limits.job_idle else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for job in self.held_jobs()? {
            let started = Instant::now();
            if started.saturating_duration_since(self.last_used(&job)?) < idle {
                continue;
            }
            match self.expire(&job, started).await {
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
            // Checked again a whole idle period later (a job with pinned
            // steps keeps them, and is not re-read every round).
            self.touch_job_at(&job, started);
        }
        Ok(out)
    }

    /// Marks `job` used at `at` unless a request named it since.
    fn touch_job_at(&self, job: &str, at: Instant) {
        if let Ok(mut used) = self.used.lock() {
            let t = used.entry(job.to_string()).or_insert(at);
            if *t < at {
                *t = at;
            }
        }
    }

    /// Whether a request named `job` after `t`.
    fn named_since(&self, job: &str, t: Instant) -> Result<bool> {
        Ok(self.last_used(job)? > t)
    }

    async fn expire(&self, job: &str, started: Instant) -> Result<Expired> {
        let mut out = Expired {
            job: job.to_string(),
            ..Expired::default()
        };
        let pins = self.list_pins(job).await?;
        let mut keep: HashSet<ChunkId> = HashSet::new();
        for st in self.list_steps(job).await? {
            if self.named_since(job, started)? {
                return Ok(out);
            }
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
        if self.named_since(job, started)? {
            return Ok(out);
        }
        let doomed: Vec<ChunkId> = self
            .list_chunks(job)?
            .into_iter()
            .filter(|id| !keep.contains(id))
            .collect();
        let (chunks, bytes) = self.delete_untouched_since(job, &doomed, started)?;
        out.chunks = chunks;
        out.bytes = bytes;
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

//! Retention of a service's replicas, after each commit it receives,
//! through `strata_gc` (the code every tier is collected with), and the
//! pins that exempt a step from it.

use std::collections::BTreeSet;

use strata_format::names::validate_job_id;
use strata_format::CommitRecord;
use strata_tiered::{ChunkStore, Result, StoreError};

use super::{poisoned, Replicas};

impl Replicas {
    /// Writes a commit record (create-only), then applies retention
    /// ([`Self::retain`]) unless it is running for the job already: then
    /// the running one goes round once more. Returns the chunk bytes freed
    /// here.
    pub async fn commit(&self, record: &CommitRecord) -> Result<u64> {
        self.commit_record(record).await?;
        let job = record.job.as_str();
        {
            let mut r = self.retaining.lock().map_err(|_| poisoned())?;
            if let Some(again) = r.get_mut(job) {
                *again = true;
                return Ok(0);
            }
            r.insert(job.to_string(), false);
        }
        let mut freed = 0;
        loop {
            freed += self.retain(job).await;
            let mut r = self.retaining.lock().map_err(|_| poisoned())?;
            match r.get_mut(job) {
                Some(again) if *again => *again = false,
                _ => {
                    r.remove(job);
                    return Ok(freed);
                }
            }
        }
    }

    /// The retention policy the limits set.
    pub fn retention(&self) -> strata_gc::Retention {
        strata_gc::Retention {
            keep_last: self.limits.keep_last.max(1),
            keep_every: self.limits.keep_every,
            keep_within: self.limits.keep_within,
            grace: self.limits.grace,
        }
    }

    /// Retention for `job` through `strata_gc::collect`, the code every
    /// tier uses: the newest `keep_last` committed steps stay, and every
    /// `keep_every`-th, those within `keep_within`, and pinned ones; the
    /// others are retired (records, then manifests); then every chunk no
    /// remaining manifest names and not touched within the grace period
    /// goes, re-checked as it is deleted (a push deduplicating against it
    /// meanwhile keeps it). A record is written here only once every rank
    /// voted, so one record proves the step. Returns the chunk bytes
    /// freed; a failure is logged and frees nothing more (the commit
    /// itself stands).
    pub async fn retain(&self, job: &str) -> u64 {
        let opts = strata_gc::Options {
            scope: Some(strata_gc::Scope::All),
            evidence: strata_gc::Evidence::AnyRecord,
            ..Default::default()
        };
        match strata_gc::collect(self, job, &self.retention(), &opts).await {
            Ok((_, r)) => {
                if r.shards_retired + r.partial_removed > 0 {
                    tracing::debug!(
                        job,
                        retired = r.shards_retired,
                        partial = r.partial_removed,
                        chunks = r.chunks_deleted,
                        bytes = r.bytes_freed,
                        "peer retention"
                    );
                }
                r.bytes_freed
            }
            Err(e) => {
                tracing::warn!(job, error = %e, "peer retention failed");
                0
            }
        }
    }

    /// Pins (or unpins) a step of `job`: retention never retires it.
    /// At most [`crate::proto::MAX_PINS`] per job.
    pub async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        validate_job_id(job)?;
        let _one = self.pin_lock.lock().await;
        if pinned {
            let pins = self.steps.list_pins(job).await?;
            if !pins.contains(&step) && pins.len() >= crate::proto::MAX_PINS {
                return Err(StoreError::invalid(
                    "pin",
                    format!(
                        "job {job} has {} pinned steps already (the most a peer keeps)",
                        pins.len()
                    ),
                ));
            }
        }
        self.steps.set_pin(job, step, pinned).await
    }

    /// The pinned steps of `job`.
    pub async fn list_pins(&self, job: &str) -> Result<BTreeSet<u64>> {
        validate_job_id(job)?;
        self.steps.list_pins(job).await
    }
}

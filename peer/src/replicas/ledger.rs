//! What manifests and commit records cost a service: their bytes plus
//! [`RECORD_OVERHEAD`] each (so an empty one is not free), against a
//! service-wide budget and a per-job quota.

use std::collections::{BTreeMap, HashMap};

use strata_tiered::{Result, StoreError};

use super::RECORD_OVERHEAD;

/// A manifest or a commit record (named by its first rank) of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Manifest,
    Record,
}

type Key = (u64, Kind, u32);

/// Costs held, per job and in all.
#[derive(Default)]
pub(crate) struct Ledger {
    jobs: HashMap<String, (BTreeMap<Key, u64>, u64)>,
    total: u64,
}

impl Ledger {
    /// Charges `len` bytes for `(step, kind, rank)` of `job`, replacing
    /// what it cost before; refused (nothing changed) past `budget` or
    /// `quota`. Returns the previous cost, to give back with
    /// [`Self::restore`] if the write then fails.
    pub(crate) fn charge(
        &mut self,
        job: &str,
        key: (u64, Kind, u32),
        len: u64,
        budget: u64,
        quota: u64,
        spill: &std::path::Path,
    ) -> Result<Option<u64>> {
        let cost = len.saturating_add(RECORD_OVERHEAD);
        let (entries, mine) = self.jobs.entry(job.to_string()).or_default();
        let old = entries.get(&key).copied();
        let back = old.unwrap_or(0);
        let total = self.total - back + cost;
        let job_total = *mine - back + cost;
        if total > budget || job_total > quota {
            if entries.is_empty() {
                self.jobs.remove(job);
            }
            return Err(StoreError::NoSpace {
                op: "keeping a manifest or commit record (the manifest budget, or the job's quota, is full)",
                path: spill.to_path_buf(),
            });
        }
        entries.insert(key, cost);
        *mine = job_total;
        self.total = total;
        Ok(old)
    }

    /// Puts back the cost `old` returned by [`Self::charge`] (none: the
    /// entry goes).
    pub(crate) fn restore(&mut self, job: &str, key: (u64, Kind, u32), old: Option<u64>) {
        self.remove_where(job, |k| *k == key);
        if let Some(cost) = old {
            let (entries, mine) = self.jobs.entry(job.to_string()).or_default();
            entries.insert(key, cost);
            *mine += cost;
            self.total += cost;
        }
    }

    /// Removes the entries of `job` that `gone` selects.
    pub(crate) fn remove_where(&mut self, job: &str, gone: impl Fn(&Key) -> bool) {
        let Some((entries, mine)) = self.jobs.get_mut(job) else {
            return;
        };
        let doomed: Vec<Key> = entries.keys().filter(|k| gone(k)).copied().collect();
        for k in doomed {
            if let Some(c) = entries.remove(&k) {
                *mine -= c;
                self.total -= c;
            }
        }
        if entries.is_empty() {
            self.jobs.remove(job);
        }
    }

    /// Bytes charged, all jobs.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Every job with its bytes charged.
    pub(crate) fn jobs(&self) -> impl Iterator<Item = (&str, u64)> {
        self.jobs.iter().map(|(j, (_, t))| (j.as_str(), *t))
    }

    /// Bytes charged to `job`.
    pub(crate) fn job_total(&self, job: &str) -> u64 {
        self.jobs.get(job).map_or(0, |(_, t)| *t)
    }

    /// What one entry costs (0 if absent).
    pub(crate) fn cost(&self, job: &str, key: (u64, Kind, u32)) -> u64 {
        self.jobs
            .get(job)
            .and_then(|(e, _)| e.get(&key).copied())
            .unwrap_or(0)
    }
}

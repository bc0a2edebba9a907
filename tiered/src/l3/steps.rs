//! L3's steps: manifests (never replacing a committed one), create-only
//! commit records, listings that report an unreadable record instead of
//! failing, and the retirement of a rank's shard. The chunk side is in
//! `mod.rs`.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use strata_format::manifest::MAX_MANIFEST_LEN;
use strata_format::names::validate_job_id;
use strata_format::CommitRecord;

use super::{os_err, L3Store, MAX_RECORD_LEN};
use crate::error::{Result, StoreError};
use crate::store::{check_manifest_replace, commit_conflict, commit_slot, StepInfo};

/// What one commit record slot of a step holds.
enum Slot {
    /// A readable record of this job and step.
    Record(CommitRecord),
    /// Nothing.
    Empty,
    /// Something that is not a usable record, with why.
    Unreadable(String),
}

impl L3Store {
    pub(super) async fn put_shard_manifest(
        &self,
        job: &str,
        step: u64,
        rank: u32,
        bytes: &[u8],
    ) -> Result<()> {
        validate_job_id(job)?;
        // A committed shard's manifest is never replaced (see the contract).
        let records = self.step_records(job, step).await?;
        check_manifest_replace(step, rank, &records, bytes)?;
        let key = self.step_key(job, step).join(format!("m-{rank}"));
        self.store
            .put(&key, PutPayload::from(bytes.to_vec()))
            .await
            .map_err(|e| os_err(format!("manifest of step {step} rank {rank}"), e))?;
        Ok(())
    }

    pub(super) async fn get_shard_manifest(
        &self,
        job: &str,
        step: u64,
        rank: u32,
    ) -> Result<Vec<u8>> {
        validate_job_id(job)?;
        let key = self.step_key(job, step).join(format!("m-{rank}"));
        let what = format!("manifest of step {step} rank {rank} in L3");
        Ok(self
            .get_bounded(&key, MAX_MANIFEST_LEN, &what)
            .await?
            .to_vec())
    }

    pub(super) async fn commit_record(&self, record: &CommitRecord) -> Result<()> {
        validate_job_id(&record.job)?;
        let (first, bytes) = commit_slot(record)?;
        let key = self
            .step_key(&record.job, record.step)
            .join(format!("c-{first}"));
        let what = format!("commit record of step {} rank {first}", record.step);
        let same_is_there = |existing: Bytes| {
            if existing.as_ref() == bytes.as_slice() {
                Ok(())
            } else {
                Err(commit_conflict(record.step, first))
            }
        };
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        // A transient failure fails the call (`Unavailable`); a retry of it
        // (a `RetryStore` over the tier) whose first write had landed
        // behind a dropped connection finds the same record there: success.
        match self
            .store
            .put_opts(&key, PutPayload::from(bytes.clone()), create)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                same_is_there(self.get_bounded(&key, MAX_RECORD_LEN, &what).await?)
            }
            Err(object_store::Error::NotImplemented { .. }) if self.opts.non_atomic_commits => {
                tracing::warn!(url = %self.url, "L3 store cannot create-if-absent: committing with check-then-put (not atomic)");
                match self.get_bounded(&key, MAX_RECORD_LEN, &what).await {
                    Ok(existing) => same_is_there(existing),
                    Err(StoreError::NotFound { .. }) => {
                        self.store
                            .put(&key, PutPayload::from(bytes.clone()))
                            .await
                            .map_err(|e| os_err(what.clone(), e))?;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Err(object_store::Error::NotImplemented { .. }) => {
                Err(StoreError::Unavailable(format!(
                    "{}: the store cannot create-if-absent, so commits would not be atomic; \
                 enable conditional puts, or accept it with non_atomic_commits",
                    self.url
                )))
            }
            Err(e) => Err(os_err(what, e)),
        }
    }

    pub(super) async fn steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        validate_job_id(job)?;
        let prefix = self.key(&[job, "steps"]);
        let listed = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| os_err("listing steps", e))?;
        let mut steps: BTreeMap<u64, StepInfo> = BTreeMap::new();
        for dir in listed.common_prefixes {
            let Some(step) = dir.filename().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            let mut info = StepInfo {
                step,
                ..StepInfo::default()
            };
            let mut slots = Vec::new();
            for name in self.step_objects(job, step).await? {
                if let Some(rank) = name.strip_prefix("m-").and_then(|r| r.parse::<u32>().ok()) {
                    info.manifests.insert(rank);
                } else if let Some(first) =
                    name.strip_prefix("c-").and_then(|r| r.parse::<u32>().ok())
                {
                    slots.push(first);
                } else if let Some(rank) =
                    name.strip_prefix("r-").and_then(|r| r.parse::<u32>().ok())
                {
                    info.retiring.insert(rank);
                }
            }
            // A step of a large world has a record per rank: read them
            // concurrently (one after another, 16,384 reads at 10 ms each
            // would take minutes).
            let mut reads = futures::stream::iter(slots)
                .map(|first| async move { (first, self.read_slot(job, step, first).await) })
                .buffer_unordered(self.opts.concurrency.max(1));
            // The first failure ends the listing (the reads in flight are
            // dropped), not the last of thousands.
            while let Some((first, read)) = reads.next().await {
                match read? {
                    Slot::Record(r) => {
                        info.records.insert(first, r);
                    }
                    Slot::Empty => {}
                    Slot::Unreadable(why) => {
                        info.unreadable.insert(first, why);
                    }
                }
            }
            steps.insert(step, info);
        }
        Ok(steps.into_values().collect())
    }

    /// `ChunkStore::get_commit_record`: [`L3Store::read_slot`], an
    /// unreadable record as an error.
    pub(super) async fn slot_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        match self.read_slot(job, step, first).await? {
            Slot::Record(r) => Ok(Some(r)),
            Slot::Empty => Ok(None),
            Slot::Unreadable(why) => Err(StoreError::Corrupt {
                what: format!("commit record of step {step} rank {first} in {}", self.url),
                source: strata_format::FormatError::malformed("commit record", why),
            }),
        }
    }

    /// The commit record in slot `first` of `step`: one read, no listing.
    /// One bad record (damage, a newer format during a rolling upgrade)
    /// hides only its own shard: it is reported, not an error.
    async fn read_slot(&self, job: &str, step: u64, first: u32) -> Result<Slot> {
        validate_job_id(job)?;
        let key = self.step_key(job, step).join(format!("c-{first}"));
        let what = format!("commit record of step {step} rank {first}");
        let bytes = match self.get_bounded(&key, MAX_RECORD_LEN, &what).await {
            Ok(b) => b,
            // Absent, or deleted between a listing and the read.
            Err(StoreError::NotFound { .. }) => return Ok(Slot::Empty),
            // Too large to be a record: damage, reported.
            Err(e @ StoreError::Corrupt { .. }) => return Ok(Slot::Unreadable(e.to_string())),
            Err(e) => return Err(e),
        };
        Ok(match CommitRecord::decode(&bytes) {
            Ok(r) if r.step == step && r.job == job => Slot::Record(r),
            Ok(_) => Slot::Unreadable("names another step or job".into()),
            Err(e) => {
                tracing::warn!(step, rank = first, error = %e, "unreadable commit record on L3; this rank treated as uncommitted there");
                Slot::Unreadable(format!("{what}: {e}"))
            }
        })
    }

    pub(super) async fn remove_step(&self, job: &str, step: u64) -> Result<()> {
        validate_job_id(job)?;
        let names = self.step_objects(job, step).await?;
        // Commit records first: a crash in between leaves a partial step.
        let (records, rest): (Vec<&String>, Vec<&String>) =
            names.iter().partition(|n| n.starts_with("c-"));
        for group in [records, rest] {
            for name in group {
                let key = self.step_key(job, step).join(name.as_str());
                match self.store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(os_err(format!("deleting {key}"), e)),
                }
            }
        }
        Ok(())
    }

    pub(super) async fn remove_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        validate_job_id(job)?;
        let dir = self.step_key(job, step);
        let marker = dir.clone().join(format!("r-{rank}"));
        // The marker first: a crash part-way leaves a shard that says it
        // is being retired, never one that looks damaged.
        self.store
            .put(&marker, PutPayload::from(Bytes::new()))
            .await
            .map_err(|e| os_err(format!("retiring marker of step {step} rank {rank}"), e))?;
        for name in [
            format!("c-{rank}"),
            format!("m-{rank}"),
            format!("r-{rank}"),
        ] {
            let key = dir.clone().join(name.as_str());
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(os_err(format!("deleting {key}"), e)),
            }
        }
        Ok(())
    }

    /// Names of the objects directly under a step.
    pub(super) async fn step_objects(&self, job: &str, step: u64) -> Result<Vec<String>> {
        let prefix = self.step_key(job, step);
        let listed: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| os_err(format!("listing step {step}"), e))?;
        Ok(listed
            .into_iter()
            .filter_map(|m| m.location.filename().map(str::to_string))
            .collect())
    }

    /// The step's readable commit records, whatever their slot (a
    /// damaged one is no record: a repair may replace it): one listing and
    /// a read per record.
    pub(super) async fn step_records(&self, job: &str, step: u64) -> Result<Vec<CommitRecord>> {
        let mut out = Vec::new();
        for name in self.step_objects(job, step).await? {
            if !name.starts_with("c-") {
                continue;
            }
            let key = self.step_key(job, step).join(name.as_str());
            let what = format!("commit record {name} of step {step}");
            match self.get_bounded(&key, MAX_RECORD_LEN, &what).await {
                Ok(b) => out.extend(CommitRecord::decode(&b).ok()),
                Err(StoreError::NotFound { .. } | StoreError::Corrupt { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

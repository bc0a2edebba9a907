//! L1's steps: manifests, create-only commit records, listings and the
//! retirement of a rank's shard (the chunk side is in `mod.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use strata_format::manifest::MAX_MANIFEST_LEN;
use strata_format::names::validate_job_id;
use strata_format::CommitRecord;

use super::{Inner, MAX_RECORD_LEN};
use crate::error::{Result, StoreError};
use crate::fsutil::{fsync_dir, read_bounded, write_durable};
use crate::store::{check_manifest_replace, commit_conflict, commit_slot, StepInfo};

impl Inner {
    pub(super) fn ensure_step_dir(&self, job: &str, step: u64) -> Result<PathBuf> {
        self.ensure_job(job)?;
        let dir = self.step_dir(job, step);
        if !dir.exists() {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StoreError::io("creating", &dir, e)),
            }
            fsync_dir(&self.job_dir(job).join("steps"))?;
        }
        Ok(dir)
    }

    pub(super) fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        validate_job_id(job)?;
        let records = self.step_records(job, step)?;
        check_manifest_replace(step, rank, &records, bytes)?;
        let dir = self.ensure_step_dir(job, step)?;
        let tmp = self.tmp_path(job, "manifest");
        write_durable(&tmp, &dir.join(format!("m-{rank}")), bytes, true)?;
        fsync_dir(&dir)
    }

    pub(super) fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        validate_job_id(job)?;
        let path = self.step_dir(job, step).join(format!("m-{rank}"));
        read_bounded(
            &path,
            MAX_MANIFEST_LEN,
            &format!("manifest of rank {rank} at step {step}"),
        )
    }

    pub(super) fn commit(&self, record: &CommitRecord) -> Result<()> {
        let (first, bytes) = commit_slot(record)?;
        let dir = self.ensure_step_dir(&record.job, record.step)?;
        let path = dir.join(format!("c-{first}"));
        let tmp = self.tmp_path(&record.job, "commit");
        if !write_durable(&tmp, &path, &bytes, false)? {
            let existing = read_bounded(&path, MAX_RECORD_LEN, "commit record")?;
            if existing != bytes {
                let valid = CommitRecord::decode(&existing)
                    .is_ok_and(|r| r.step == record.step && r.job == record.job);
                if valid {
                    return Err(commit_conflict(record.step, first));
                }
                // A damaged record is no winner of the create-only commit
                // (readers ignore it): it is replaced, which is how a
                // repair restores it.
                tracing::warn!(path = %path.display(), "replacing a damaged commit record");
                let tmp = self.tmp_path(&record.job, "commit");
                write_durable(&tmp, &path, &bytes, true)?;
            }
        }
        fsync_dir(&dir)
    }

    pub(super) fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        validate_job_id(job)?;
        let steps = self.job_dir(job).join("steps");
        let mut out = BTreeMap::new();
        // Errors other than a directory vanishing fail the listing: a
        // caller deciding what to delete must not see a partial one.
        let Some(entries) = read_dir_or_gone(&steps)? else {
            return Ok(Vec::new());
        };
        for e in entries {
            let e = e.map_err(|err| StoreError::io("listing", &steps, err))?;
            let Some(step) = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            let mut info = StepInfo {
                step,
                ..StepInfo::default()
            };
            let dir = e.path();
            let Some(files) = read_dir_or_gone(&dir)? else {
                continue;
            };
            for f in files {
                let f = f.map_err(|err| StoreError::io("listing", &dir, err))?;
                let name = f.file_name();
                let Some(name) = name.to_str() else { continue };
                if let Some(rank) = name.strip_prefix("m-").and_then(|r| r.parse::<u32>().ok()) {
                    info.manifests.insert(rank);
                } else if let Some(rank) =
                    name.strip_prefix("r-").and_then(|r| r.parse::<u32>().ok())
                {
                    info.retiring.insert(rank);
                } else if let Some(rank) =
                    name.strip_prefix("c-").and_then(|r| r.parse::<u32>().ok())
                {
                    let bytes = match read_bounded(&f.path(), MAX_RECORD_LEN, "commit record") {
                        Ok(b) => b,
                        // Retired between the listing and the read.
                        Err(StoreError::NotFound { .. }) => continue,
                        // Too large to be a record: damage, reported.
                        Err(err @ StoreError::Corrupt { .. }) => {
                            info.unreadable.insert(rank, err.to_string());
                            continue;
                        }
                        Err(err) => return Err(err),
                    };
                    match CommitRecord::decode(&bytes) {
                        Ok(rec) if rec.step == step && rec.job == job => {
                            info.records.insert(rank, rec);
                        }
                        Ok(_) => {
                            tracing::warn!(path = %f.path().display(), "commit record names another step or job; ignored");
                            info.unreadable
                                .insert(rank, "names another step or job".into());
                        }
                        Err(err) => {
                            tracing::warn!(path = %f.path().display(), error = %err, "unreadable commit record; this rank treated as uncommitted here");
                            info.unreadable.insert(rank, err.to_string());
                        }
                    }
                }
            }
            out.insert(step, info);
        }
        Ok(out.into_values().collect())
    }

    pub(super) fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        validate_job_id(job)?;
        let dir = self.step_dir(job, step);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        let is_commit = |p: &PathBuf| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("c-"))
        };
        // Commit records first, durably: a crash after this leaves a partial step.
        for p in names.iter().filter(|p| is_commit(p)) {
            std::fs::remove_file(p).map_err(|e| StoreError::io("deleting", p, e))?;
        }
        fsync_dir(&dir)?;
        for p in names.iter().filter(|p| !is_commit(p)) {
            std::fs::remove_file(p).map_err(|e| StoreError::io("deleting", p, e))?;
        }
        std::fs::remove_dir(&dir).map_err(|e| StoreError::io("deleting", &dir, e))?;
        fsync_dir(&self.job_dir(job).join("steps"))
    }

    /// The step's readable commit records, whatever their slot (a damaged
    /// one is no record: a repair may replace it).
    pub(super) fn step_records(&self, job: &str, step: u64) -> Result<Vec<CommitRecord>> {
        let dir = self.step_dir(job, step);
        let mut out = Vec::new();
        let Some(files) = read_dir_or_gone(&dir)? else {
            return Ok(out);
        };
        for f in files {
            let f = f.map_err(|e| StoreError::io("listing", &dir, e))?;
            if !f.file_name().to_str().is_some_and(|n| n.starts_with("c-")) {
                continue;
            }
            match read_bounded(&f.path(), MAX_RECORD_LEN, "commit record") {
                Ok(b) => out.extend(CommitRecord::decode(&b).ok()),
                Err(StoreError::NotFound { .. } | StoreError::Corrupt { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    pub(super) fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        validate_job_id(job)?;
        let dir = self.step_dir(job, step);
        if !dir.exists() {
            return Ok(());
        }
        let marker = dir.join(format!("r-{rank}"));
        let remove = |p: &Path| match std::fs::remove_file(p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("deleting", p, e)),
        };
        // The marker first, durably: from here a crash leaves a shard that
        // says it is being retired, never one that looks damaged.
        write_durable(&self.tmp_path(job, "retiring"), &marker, b"", true)?;
        fsync_dir(&dir)?;
        remove(&dir.join(format!("c-{rank}")))?;
        fsync_dir(&dir)?;
        remove(&dir.join(format!("m-{rank}")))?;
        fsync_dir(&dir)?;
        remove(&marker)?;
        // The step directory goes with its last shard; another rank
        // writing into it meanwhile keeps it (ENOTEMPTY). Another rank of
        // this node retiring its own shard of the step at the same time may
        // remove the directory between the two calls: gone is done.
        match std::fs::remove_dir(&dir) {
            Ok(()) => fsync_dir(&self.job_dir(job).join("steps")),
            Err(_) => match fsync_dir(&dir) {
                Err(StoreError::NotFound { .. }) if !dir.exists() => Ok(()),
                r => r,
            },
        }
    }
}

/// `read_dir`, or `None` when the directory is not there (anything else is
/// an error).
pub(super) fn read_dir_or_gone(dir: &Path) -> Result<Option<std::fs::ReadDir>> {
    match std::fs::read_dir(dir) {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("listing", dir, e)),
    }
}

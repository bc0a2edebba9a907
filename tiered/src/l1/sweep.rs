//! The chunk-age protocol between L1's dedup hits and its sweep: a save
//! that finds a chunk refreshes its time and then checks the file still
//! bears the chunk's name; a sweep moves a chunk aside before its last
//! check of that time. Together no save relies on a chunk a sweep deletes
//! (`docs/commit-protocol.md`, Retention), whatever the order of the
//! steps, which the pause points let a test choose.

use std::path::Path;
#[cfg(test)]
use std::sync::Arc;

use strata_format::names::validate_job_id;
use strata_format::ChunkId;

use super::Inner;
use crate::error::{Result, StoreError};
use crate::fsutil::{fsync_dir, rename_noreplace, still_named};

/// What names a chunk a sweep holds aside: its temporary file is
/// `<token>-<n>-doomed-<chunk id>`, so a reader that finds the chunk
/// missing can tell it will be back.
pub(super) const ASIDE: &str = "-doomed-";

/// A test's hook, called at each [`Pause`] point.
#[cfg(test)]
pub(super) type PauseHook = Arc<dyn Fn(Pause) + Send + Sync>;

/// The points of a dedup hit and of a sweep's delete where a test can
/// pause them, to interleave the two deterministically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pause {
    /// A put opened the chunk file it deduplicates against.
    DedupOpened,
    /// It set that file's time.
    DedupTouched,
    /// A sweep moved a chunk aside and found it old.
    SweepChecked,
    /// A sweep moved a chunk aside (before its age check).
    SweepMovedAside,
    /// A read found a missing chunk held aside by a sweep, and waits
    /// before reading it again.
    ReadAgain,
}

impl Inner {
    /// Runs the test's pause hook at `at` (nothing outside tests).
    pub(super) fn pause(&self, at: Pause) {
        #[cfg(test)]
        {
            let hook = self.pause.lock().ok().and_then(|h| h.clone());
            if let Some(hook) = hook {
                hook(at);
            }
        }
        let _ = at;
    }

    /// Deletes a chunk file unless it was touched within `grace`, checked
    /// after it is moved aside: a save that deduplicates against it either
    /// touched it before the move (the check sees it, and it is put back)
    /// or finds it gone and writes it again. Returns its size if deleted.
    pub(super) fn delete_untouched(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        validate_job_id(job)?;
        let (mut n, mut bytes) = (0, 0);
        for id in ids {
            if let Some(len) = self.delete_if_old(job, id, cutoff)? {
                n += 1;
                bytes += len;
            }
        }
        Ok((n, bytes))
    }

    pub(super) fn delete_if_old(
        &self,
        job: &str,
        id: &ChunkId,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>> {
        let path = self.chunk_path(job, id);
        let aside = self.tmp_path(job, &format!("{}{}", &ASIDE[1..], id.to_hex()));
        match std::fs::rename(&path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("moving aside", &path, e)),
        }
        self.pause(Pause::SweepMovedAside);
        let meta = std::fs::metadata(&aside).map_err(|e| StoreError::io("checking", &aside, e))?;
        if !is_old(meta.modified().ok(), cutoff) {
            // Touched meanwhile: back where it was (or a new copy is
            // there already, which is the same bytes).
            if !rename_noreplace(&aside, &path)? {
                let _ = std::fs::remove_file(&aside);
            }
            return Ok(None);
        }
        self.pause(Pause::SweepChecked);
        std::fs::remove_file(&aside).map_err(|e| StoreError::io("deleting", &aside, e))?;
        if let Some(d) = path.parent() {
            fsync_dir(d)?;
        }
        Ok(Some(meta.len()))
    }

    /// True if the chunk file at `path` holds `len` bytes and still bears
    /// that name once refreshed for the grace period; false if it is
    /// missing, of another length (left short by a crash), or was moved
    /// away meanwhile (a sweep deleting it): the put writes it again.
    ///
    /// The name is checked after the touch, not before: a sweep checks a
    /// chunk's time only after moving it aside, so a file still at its
    /// name after the touch is either never moved or moved and then found
    /// fresh (and put back); a file no longer there may be deleted
    /// whatever its time says.
    pub(super) fn touch_if_whole(&self, path: &Path, len: u64) -> Result<bool> {
        match std::fs::File::open(path) {
            Ok(f) => {
                self.pause(Pause::DedupOpened);
                let whole = f
                    .metadata()
                    .map_err(|e| StoreError::io("checking", path, e))?
                    .len()
                    == len;
                if !whole {
                    return Ok(false);
                }
                let _ = f.set_modified(std::time::SystemTime::now());
                self.pause(Pause::DedupTouched);
                still_named(&f, path)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::io("checking", path, e)),
        }
    }
}

/// True when a chunk last touched at `touched` was touched before
/// `cutoff` (an unknown time counts as young: never deleted).
pub(super) fn is_old(
    touched: Option<std::time::SystemTime>,
    cutoff: std::time::SystemTime,
) -> bool {
    touched.is_some_and(|t| t <= cutoff)
}

//! What a save did, and what went wrong in the background ([`Health`],
//! [`OnBackgroundError`]), for logs, dashboards and the demo.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Counters of one save.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SaveStats {
    /// The step.
    pub step: u64,
    /// True if the busy policy skipped this step (nothing was saved).
    pub skipped: bool,
    /// Time `save` blocked the caller (the snapshot into staging memory).
    pub stall: Duration,
    /// Time from the `save` call until the step was durable and committed.
    pub to_durable: Duration,
    /// Sum of the entries' lengths.
    pub logical_bytes: u64,
    /// Chunks in the shard.
    pub chunks: u64,
    /// Chunk bytes written to L1 (new chunk ids).
    pub bytes_written: u64,
    /// Chunk bytes L1 already held (unchanged tensors).
    pub bytes_deduped: u64,
    /// Chunks written.
    pub chunks_written: u64,
    /// Chunks L1 already held.
    pub chunks_deduped: u64,
    /// Time spent hashing (on the background pool, overlapped with writes).
    pub hash_time: Duration,
    /// Time from the start of persisting until chunks and manifest were
    /// durable (hashing and chunk writes overlap within it).
    pub write_time: Duration,
    /// Part of `write_time` spent writing the shard manifest.
    pub manifest_time: Duration,
    /// Time waiting at the barrier for every rank to persist its shard.
    pub barrier_time: Duration,
    /// Time writing the commit record.
    pub commit_time: Duration,
    /// Steps and chunk bytes removed by retention after this save.
    pub retired_steps: u64,
    /// Chunk bytes deleted by retention.
    pub retired_bytes: u64,
}

/// Counters of one restore (or `restore_into`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreStats {
    /// The step restored.
    pub step: u64,
    /// Chunks read and verified.
    pub chunks: u64,
    /// Chunk bytes read and verified.
    pub bytes_read: u64,
    /// Of those, bytes read from L3 (the step is not on L1, or L1's copy
    /// of a chunk was missing or damaged).
    pub bytes_from_l3: u64,
    /// Of those, bytes read from peers (the step is not on L1, or L1's
    /// copy of a chunk was missing or damaged).
    pub bytes_from_l2: u64,
    /// Chunks whose missing or damaged L1 copy was rewritten from another
    /// tier.
    pub chunks_repaired: u64,
    /// A step restored from L3 was written back to L1 and committed there
    /// (`restore` does this; `restore_into`, which may read a subset, not).
    pub rehydrated: bool,
    /// A priority restore ([`Checkpointer::restore_first`]): the time
    /// until the entries asked for first were read, verified and placed
    /// (after agreeing on the step, as `duration`). None for any other
    /// restore.
    ///
    /// [`Checkpointer::restore_first`]: crate::Checkpointer::restore_first
    pub first_usable: Option<Duration>,
    /// Time to read, verify and place every chunk (after agreeing on the
    /// step and loading the manifest).
    pub duration: Duration,
}

/// What went wrong in the background so far, for a training loop and its
/// dashboards ([`Checkpointer::health`](crate::Checkpointer::health)):
/// counters since the checkpointer opened, and the newest failure.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Health {
    /// Saves that failed after `save` returned (their steps are not
    /// committed).
    pub failed_saves: u64,
    /// Saves skipped by `busy_policy = "skip"` (nothing was saved).
    pub skipped_saves: u64,
    /// Uploads to L3 dropped from a backlog past `max_pending_uploads`.
    pub dropped_uploads: u64,
    /// Pushes to the peers dropped from a backlog past
    /// `max_pending_pushes` (the step is degraded).
    pub dropped_pushes: u64,
    /// The newest background save failure, as [`Error::Background`]
    /// (kept after it was reported).
    ///
    /// [`Error::Background`]: crate::Error::Background
    pub last_error: Option<crate::Error>,
}

/// What happens to a save that fails in the background (after `save`
/// returned: its L1 write, the commit round, the commit record), beyond its
/// own handle reporting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBackgroundError {
    /// The next `save`, `flush` or `close` returns the failure
    /// ([`Error::Background`](crate::Error::Background)) unless the save's handle already reported
    /// it; once. It is also logged and counted.
    #[default]
    Raise,
    /// Only logged (at error level) and counted
    /// ([`Checkpointer::health`](crate::Checkpointer::health)).
    Log,
}

impl std::str::FromStr for OnBackgroundError {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "raise" => Ok(OnBackgroundError::Raise),
            "log" => Ok(OnBackgroundError::Log),
            o => Err(format!("unknown on_background_error {o:?} (raise, log)")),
        }
    }
}

//! The public error of the `strata` library.

use strata_format::{ChunkId, FormatError};
use strata_tiered::{StoreError, StoreErrorKind};

/// An error from saving or restoring.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid or could not be read.
    #[error("configuration: {0}")]
    Config(String),
    /// The state passed to `save` is invalid (bad name, size mismatch).
    #[error("invalid state: {0}")]
    InvalidState(String),
    /// A previous save is still persisting and the busy policy is `error`.
    #[error("step {step}: the save of step {busy_with} is still persisting")]
    Busy {
        /// The step asked for.
        step: u64,
        /// The step still persisting.
        busy_with: u64,
    },
    /// No step that every rank can restore.
    #[error("no restorable step{}", .0.as_ref().map(|s| format!(" ({s})")).unwrap_or_default())]
    NothingToRestore(Option<String>),
    /// A chunk is missing or damaged; names the chunk and the entries using it.
    #[error("chunk {chunk} (used by {}) unreadable: {source}", entries.join(", "))]
    Chunk {
        /// The chunk.
        chunk: ChunkId,
        /// Entries whose bytes live in it.
        entries: Vec<String>,
        /// What the tier said.
        #[source]
        source: Box<StoreError>,
    },
    /// A manifest or commit record is missing, damaged, or inconsistent.
    #[error("step {step} rank {rank}: {reason}")]
    Manifest {
        /// Step.
        step: u64,
        /// Rank.
        rank: u32,
        /// What is wrong.
        reason: String,
    },
    /// The ranks did not all report in time, or disagreed.
    #[error("coordination: {0}")]
    Coordination(String),
    /// A tier failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Encoding failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A GPU tensor could not be saved or restored: built without the
    /// `cuda` feature, no driver, no such device, or a CUDA call failed.
    #[error("GPU: {0}")]
    Gpu(String),
    /// The background persist worker stopped.
    #[error("the save pipeline stopped: {0}")]
    Pipeline(String),
}

impl Error {
    /// True when the error is a full device (retention or a bigger disk helps).
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Store(e) if e.kind() == StoreErrorKind::NoSpace)
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

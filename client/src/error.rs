//! The public error of the `strata` library, and its [`ErrorKind`]: what the
//! caller should do about it. The Python exception hierarchy mirrors the
//! kinds.

use strata_format::{ChunkId, FormatError};
use strata_tiered::{StoreError, StoreErrorKind};

/// What the caller should do about an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Nothing to restore, or the thing asked for is in no tier: save
    /// first, or ask for something else.
    NotFound,
    /// Stored bytes are damaged in every tier that was tried: restore an
    /// older step; `strata verify --repair` fixes what a good copy exists for.
    Corrupt,
    /// A tier, a peer or a rank is unreachable, or the pipeline is busy:
    /// retry later (the same call may succeed).
    Unavailable,
    /// The caller passed something invalid (configuration, state, a buffer
    /// of the wrong size): fix the input; retrying does not help.
    Invalid,
    /// The operation conflicts with what is already there (a committed step
    /// saved again, a different commit record in place): use a new step
    /// number or remove the old one first.
    Conflict,
    /// A tier refused the credentials: fix them.
    Unauthorized,
    /// A device or budget is full: free space (retention) or grow it.
    NoSpace,
    /// A bug or an unexpected condition: report it.
    Internal,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::NoSpace => "no space",
            ErrorKind::Internal => "internal",
        })
    }
}

/// An error from saving or restoring. [`Error::kind`] says what to do.
/// Errors are `Clone`: a failed save reports the same error, with its whole
/// cause chain, to every waiter.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// The step is already committed by this rank: saving it again would
    /// replace a committed shard. Nothing was written.
    #[error("step {step} is already committed ({tier}); save under a new step number")]
    AlreadyCommitted {
        /// The step.
        step: u64,
        /// Where it was found committed.
        tier: String,
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
    /// Another process holds (or took) this rank of the job: two processes
    /// claimed one rank. Fix the launcher's rank assignment.
    #[error("rank {rank} of job {job} is claimed twice: {other}")]
    RankClaimed {
        /// The job.
        job: String,
        /// The rank.
        rank: u32,
        /// Who else claims it (host, pid, when).
        other: String,
    },
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
    /// An earlier save failed in the background and nothing had reported
    /// it yet (its handle was dropped or never waited on): returned once,
    /// by the next `save` (which did nothing), `flush` or `close`. The kind
    /// is the failure's own: that step is not committed; save again.
    #[error("step {step} failed in the background{}: {source}", if *.more > 0 { format!(" (and {} later saves)", .more) } else { String::new() })]
    Background {
        /// The step that failed (the oldest one not reported).
        step: u64,
        /// Later failed saves reported with it.
        more: u64,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },
    /// A tier that could hold a newer step than the others show could not
    /// be listed (after its retries): restoring without it could silently
    /// go back to an older step, or to none. Retry when the tier is back,
    /// or set `skip_unreadable_tiers` to go on without it.
    #[error("{tier} cannot be listed, and it may hold a newer step than the readable tiers ({reason}); retry when it is back, or set skip_unreadable_tiers = true to restore without it")]
    TierUnavailable {
        /// Which tier (and which rank found it unreadable).
        tier: String,
        /// What the tier said.
        reason: String,
    },
    /// The store holds steps saved by a job of another world size, newer
    /// than any this world can restore: restoring with this world size
    /// would silently go back to an older step (or start over).
    #[error("step {step} was saved by a world of {saved_world} ranks and this job runs {world}: restart with {saved_world} ranks (or restore an explicit older step of this world size)")]
    WorldSizeMismatch {
        /// The newest step of the other world size.
        step: u64,
        /// The world size that saved it.
        saved_world: u32,
        /// This job's world size.
        world: u32,
    },
    /// Steps were not deleted (`Checkpointer::delete`, a rollback). With
    /// `retry` (kind `Unavailable`), a tier or another rank failed part-way:
    /// the steps are never half-usable, call again to finish; without
    /// (kind `Invalid`), nothing was deleted (a step is pinned: unpin it).
    #[error("deleting steps: {reason}")]
    NotDeleted {
        /// What stopped it.
        reason: String,
        /// Calling again may finish it.
        retry: bool,
    },
    /// A wait for a save's target ran out of time (the save goes on).
    #[error("step {step}: not {target} within {waited:?}")]
    Timeout {
        /// The step.
        step: u64,
        /// The target waited for.
        target: String,
        /// How long it waited.
        waited: std::time::Duration,
    },
}

impl Error {
    /// What the caller should do about it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config(_)
            | Error::InvalidState(_)
            | Error::Gpu(_)
            | Error::WorldSizeMismatch { .. } => ErrorKind::Invalid,
            Error::Busy { .. }
            | Error::Coordination(_)
            | Error::Timeout { .. }
            | Error::TierUnavailable { .. } => ErrorKind::Unavailable,
            Error::AlreadyCommitted { .. } | Error::RankClaimed { .. } => ErrorKind::Conflict,
            Error::NothingToRestore(_) => ErrorKind::NotFound,
            Error::Chunk { source, .. } => store_kind(source.kind()),
            Error::Manifest { .. } => ErrorKind::Corrupt,
            Error::Store(e) => store_kind(e.kind()),
            Error::Format(e) => match e.kind() {
                strata_format::ErrorKind::Invalid => ErrorKind::Invalid,
                _ => ErrorKind::Corrupt,
            },
            Error::Pipeline(_) => ErrorKind::Internal,
            Error::NotDeleted { retry: true, .. } => ErrorKind::Unavailable,
            Error::NotDeleted { retry: false, .. } => ErrorKind::Invalid,
            Error::Background { source, .. } => source.kind(),
        }
    }

    /// True when the error is a full device (retention or a bigger disk helps).
    pub fn is_no_space(&self) -> bool {
        self.kind() == ErrorKind::NoSpace
    }

    /// True when retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }
}

/// The public kind of a tier's error kind (one place).
fn store_kind(k: StoreErrorKind) -> ErrorKind {
    match k {
        StoreErrorKind::NotFound => ErrorKind::NotFound,
        StoreErrorKind::Corrupt => ErrorKind::Corrupt,
        StoreErrorKind::AlreadyExists => ErrorKind::Conflict,
        StoreErrorKind::NoSpace => ErrorKind::NoSpace,
        StoreErrorKind::Unavailable => ErrorKind::Unavailable,
        StoreErrorKind::Invalid => ErrorKind::Invalid,
        StoreErrorKind::Unauthorized => ErrorKind::Unauthorized,
        _ => ErrorKind::Internal,
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `e`'s message followed by each of its causes, each once (a cause often
/// repeats its wrapper's words): what an error says in one line, where
/// only its text travels (a log, an exception, a message).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        next = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_cause_and_survive_a_clone() {
        let io = StoreError::io(
            "reading",
            "/x",
            std::io::Error::from_raw_os_error(libc_eio()),
        );
        let e = Error::Chunk {
            chunk: ChunkId::of(b"c"),
            entries: vec!["w".into()],
            source: Box::new(io),
        };
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let again = e.clone();
        assert_eq!(again.kind(), ErrorKind::Unavailable);
        assert_eq!(again.to_string(), e.to_string());
        let chain = |e: &Error| {
            let mut v = Vec::new();
            let mut s: Option<&dyn std::error::Error> = Some(e);
            while let Some(x) = s {
                v.push(x.to_string());
                s = x.source();
            }
            v
        };
        assert_eq!(chain(&again), chain(&e), "the cause chain is kept");
        assert_eq!(
            Error::from(StoreError::AlreadyExists { what: "x".into() }).kind(),
            ErrorKind::Conflict
        );
        assert_eq!(
            Error::from(StoreError::Unauthorized("403".into())).kind(),
            ErrorKind::Unauthorized
        );
        assert_eq!(Error::NothingToRestore(None).kind(), ErrorKind::NotFound);
        assert_eq!(Error::Config("x".into()).kind(), ErrorKind::Invalid);
    }

    fn libc_eio() -> i32 {
        5
    }
}

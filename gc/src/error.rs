//! The error of a collection: a tier's error (listing, reading, deleting)
//! or an invalid policy. Either way nothing more is deleted.

use strata_tiered::{StoreError, StoreErrorKind};

/// Why a collection stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcError {
    /// The tier failed: the listing or a read (before anything was
    /// deleted), or a delete (the next run finishes the job).
    #[error("{what}: {source}")]
    Store {
        /// What was being done.
        what: String,
        /// The tier's error.
        #[source]
        source: StoreError,
    },
    /// The policy is invalid.
    #[error("retention policy: {0}")]
    Policy(String),
}

impl GcError {
    /// The tier error's kind, or `Invalid` for a bad policy.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            GcError::Store { source, .. } => source.kind(),
            GcError::Policy(_) => StoreErrorKind::Invalid,
        }
    }

    pub(crate) fn store(what: impl Into<String>) -> impl FnOnce(StoreError) -> GcError {
        let what = what.into();
        move |source| GcError::Store { what, source }
    }
}

/// A collection's result.
pub type Result<T, E = GcError> = std::result::Result<T, E>;

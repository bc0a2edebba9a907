//! Errors of every tier, with a kind that tells the caller what to do.

use std::path::PathBuf;

use strata_format::FormatError;

/// What the caller should do about a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The thing is not in this tier: try the next tier.
    NotFound,
    /// The tier holds damaged bytes: fetch another copy, then repair.
    Corrupt,
    /// A create-only write found the object already there.
    AlreadyExists,
    /// The device is full: free space (retention) or fail the save.
    NoSpace,
    /// The tier cannot be reached or failed transiently: retry or fall back.
    Unavailable,
    /// The caller passed something invalid: fix the input.
    Invalid,
    /// A bug or an unexpected condition.
    Internal,
}

/// An error from a tier.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The object is not in this tier.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for (a chunk id, a step, a manifest).
        what: String,
    },
    /// The tier holds bytes that fail verification.
    #[error("corrupt {what}: {source}")]
    Corrupt {
        /// The object (chunk id and path, manifest path).
        what: String,
        /// The decoder's or verifier's error.
        #[source]
        source: FormatError,
    },
    /// A create-only write found something there already.
    #[error("{what} already exists")]
    AlreadyExists {
        /// The object.
        what: String,
    },
    /// The device is full.
    #[error("no space left on device while {op} {}", path.display())]
    NoSpace {
        /// The operation.
        op: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("I/O error while {op} {}: {source}", path.display())]
    Io {
        /// The operation.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An invalid argument.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The tier is unreachable or failed transiently.
    #[error("tier unavailable: {0}")]
    Unavailable(String),
    /// Unexpected internal failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl StoreError {
    /// What to do about it.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::NotFound { .. } => StoreErrorKind::NotFound,
            StoreError::Corrupt { .. } => StoreErrorKind::Corrupt,
            StoreError::AlreadyExists { .. } => StoreErrorKind::AlreadyExists,
            StoreError::NoSpace { .. } => StoreErrorKind::NoSpace,
            StoreError::Io { .. } | StoreError::Unavailable(_) => StoreErrorKind::Unavailable,
            StoreError::Invalid { .. } => StoreErrorKind::Invalid,
            StoreError::Internal(_) => StoreErrorKind::Internal,
        }
    }

    /// An I/O error with context; ENOSPC and EDQUOT become [`StoreError::NoSpace`],
    /// ENOENT becomes [`StoreError::NotFound`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => StoreError::NoSpace { op, path },
            _ if source.kind() == std::io::ErrorKind::NotFound => StoreError::NotFound {
                what: path.display().to_string(),
            },
            _ => StoreError::Io { op, path, source },
        }
    }

    /// An invalid argument.
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        StoreError::Invalid {
            what,
            reason: reason.into(),
        }
    }
}

impl From<FormatError> for StoreError {
    fn from(e: FormatError) -> Self {
        match e.kind() {
            strata_format::ErrorKind::Invalid => StoreError::Invalid {
                what: "argument",
                reason: e.to_string(),
            },
            _ => StoreError::Corrupt {
                what: "data".into(),
                source: e,
            },
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

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
    /// The tier refused the credentials: fix them (retrying does not help).
    Unauthorized,
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
    /// The tier refused the credentials.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
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
            StoreError::Unauthorized(_) => StoreErrorKind::Unauthorized,
            StoreError::Internal(_) => StoreErrorKind::Internal,
        }
    }

    /// True when the same call may succeed if retried (a transient failure).
    pub fn is_transient(&self) -> bool {
        self.kind() == StoreErrorKind::Unavailable
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

/// A copy with the same variant, kind and message; an OS error keeps its
/// code. Lets one failure be reported to several waiters without flattening
/// it into a string.
impl Clone for StoreError {
    fn clone(&self) -> Self {
        match self {
            StoreError::NotFound { what } => StoreError::NotFound { what: what.clone() },
            StoreError::Corrupt { what, source } => StoreError::Corrupt {
                what: what.clone(),
                source: source.clone(),
            },
            StoreError::AlreadyExists { what } => StoreError::AlreadyExists { what: what.clone() },
            StoreError::NoSpace { op, path } => StoreError::NoSpace {
                op,
                path: path.clone(),
            },
            StoreError::Io { op, path, source } => StoreError::Io {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            StoreError::Invalid { what, reason } => StoreError::Invalid {
                what,
                reason: reason.clone(),
            },
            StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
            StoreError::Unauthorized(m) => StoreError::Unauthorized(m.clone()),
            StoreError::Internal(m) => StoreError::Internal(m.clone()),
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

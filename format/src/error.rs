//! The one error type of the format crate.
//!
//! Every decoder in this crate takes untrusted bytes (from disk or a peer), so
//! every way those bytes can be wrong has a variant here; nothing panics.

use std::fmt;

/// What the caller should do about a [`FormatError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The bytes are damaged or hostile: fetch another copy (another tier).
    Corrupt,
    /// The bytes were written by a newer Strata: upgrade the reader.
    Unsupported,
    /// The caller passed an invalid value (bad name, bad shape, bad option).
    Invalid,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Invalid => "invalid",
        })
    }
}

/// An error from encoding or decoding a Strata structure.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    /// The input does not start with the expected magic bytes.
    #[error("{what}: bad magic {found:02x?}")]
    BadMagic {
        /// Which structure was being decoded.
        what: &'static str,
        /// The bytes found where the magic should be.
        found: Vec<u8>,
    },
    /// The structure carries a format version this reader does not know.
    #[error("{what}: unsupported format version {version}")]
    UnsupportedVersion {
        /// Which structure was being decoded.
        what: &'static str,
        /// The version found.
        version: u32,
    },
    /// The input ends before the structure does.
    #[error("{what}: truncated: needed {needed} more bytes, {available} available")]
    Truncated {
        /// Which field was being read.
        what: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes left in the input.
        available: u64,
    },
    /// A length or count read from input exceeds its bound.
    #[error("{what}: {value} exceeds the limit of {limit}")]
    TooLarge {
        /// Which length or count.
        what: &'static str,
        /// The value read.
        value: u64,
        /// The bound it broke.
        limit: u64,
    },
    /// The structure's checksum does not match its bytes.
    #[error("{what}: checksum mismatch")]
    Checksum {
        /// Which structure.
        what: &'static str,
    },
    /// Decoded chunk bytes do not hash to the id they claim.
    #[error("chunk hash mismatch: expected {expected}, bytes hash to {actual}")]
    HashMismatch {
        /// The id the frame (or the caller) expected.
        expected: String,
        /// What the bytes actually hash to.
        actual: String,
    },
    /// A compressed payload could not be decompressed.
    #[error("chunk payload does not decompress: {0}")]
    Decompress(String),
    /// A compressor failed (only on resource exhaustion).
    #[error("chunk payload does not compress: {0}")]
    Compress(String),
    /// A field holds a value that cannot be valid (an unknown code, an
    /// inconsistent length, a reference out of range).
    #[error("{what}: {reason}")]
    Malformed {
        /// Which field.
        what: &'static str,
        /// Why it is wrong.
        reason: String,
    },
    /// The caller passed an invalid value.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why it is wrong.
        reason: String,
    },
}

impl FormatError {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            FormatError::UnsupportedVersion { .. } => ErrorKind::Unsupported,
            FormatError::Invalid { .. } | FormatError::Compress(_) => ErrorKind::Invalid,
            _ => ErrorKind::Corrupt,
        }
    }

    /// A structurally invalid input.
    pub fn malformed(what: &'static str, reason: impl Into<String>) -> Self {
        FormatError::Malformed {
            what,
            reason: reason.into(),
        }
    }

    /// An invalid argument.
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        FormatError::Invalid {
            what,
            reason: reason.into(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

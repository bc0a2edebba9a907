//! What a [`MetricsStore`](super::MetricsStore) counts: per [`OpFamily`],
//! calls, errors by kind and latency, in a plain [`MetricsSnapshot`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::StoreErrorKind;

/// A family of trait methods, counted together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpFamily {
    /// `put_chunks`, `put_missing_chunks`.
    Put,
    /// The chunk reads: `get_chunk`, `get_chunks*`, `get_frame`.
    Get,
    /// `has_chunks`.
    Has,
    /// `list_chunks`, `list_chunk_info`, `list_steps`.
    List,
    /// `put_manifest`, `get_manifest`, `get_commit_record`.
    Manifest,
    /// `commit`.
    Commit,
    /// `delete_chunks`, `delete_step`, `delete_shard`,
    /// `abort_stale_uploads`.
    Delete,
}

impl OpFamily {
    /// Every family, in order.
    pub const ALL: [OpFamily; 7] = [
        OpFamily::Put,
        OpFamily::Get,
        OpFamily::Has,
        OpFamily::List,
        OpFamily::Manifest,
        OpFamily::Commit,
        OpFamily::Delete,
    ];
}

/// Errors counted by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// `NotFound`.
    pub not_found: u64,
    /// `Corrupt`.
    pub corrupt: u64,
    /// `AlreadyExists`.
    pub already_exists: u64,
    /// `NoSpace`.
    pub no_space: u64,
    /// `Unavailable`.
    pub unavailable: u64,
    /// `Invalid`.
    pub invalid: u64,
    /// `Unauthorized`.
    pub unauthorized: u64,
    /// `Internal`.
    pub internal: u64,
}

impl ErrorCounts {
    /// Errors of every kind.
    pub fn total(&self) -> u64 {
        self.not_found
            + self.corrupt
            + self.already_exists
            + self.no_space
            + self.unavailable
            + self.invalid
            + self.unauthorized
            + self.internal
    }

    /// The count for one kind.
    pub fn of(&self, kind: StoreErrorKind) -> u64 {
        match kind {
            StoreErrorKind::NotFound => self.not_found,
            StoreErrorKind::Corrupt => self.corrupt,
            StoreErrorKind::AlreadyExists => self.already_exists,
            StoreErrorKind::NoSpace => self.no_space,
            StoreErrorKind::Unavailable => self.unavailable,
            StoreErrorKind::Invalid => self.invalid,
            StoreErrorKind::Unauthorized => self.unauthorized,
            StoreErrorKind::Internal => self.internal,
        }
    }
}

pub(super) fn kind_index(kind: StoreErrorKind) -> usize {
    match kind {
        StoreErrorKind::NotFound => 0,
        StoreErrorKind::Corrupt => 1,
        StoreErrorKind::AlreadyExists => 2,
        StoreErrorKind::NoSpace => 3,
        StoreErrorKind::Unavailable => 4,
        StoreErrorKind::Invalid => 5,
        StoreErrorKind::Internal => 6,
        StoreErrorKind::Unauthorized => 7,
    }
}

/// One family's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyStats {
    /// Calls.
    pub ops: u64,
    /// Errors by kind (a batch read counts each failed entry).
    pub errors: ErrorCounts,
    /// Total time spent in the calls.
    pub latency_total: Duration,
    /// The slowest call.
    pub latency_max: Duration,
}

impl FamilyStats {
    /// The mean time of a call (zero before any).
    pub fn latency_mean(&self) -> Duration {
        u32::try_from(self.ops)
            .ok()
            .filter(|&n| n > 0)
            .map_or(Duration::ZERO, |n| self.latency_total / n)
    }
}

/// What a [`MetricsStore`](super::MetricsStore) has counted, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// The inner store's `name()`.
    pub store: String,
    /// Counters per family (every family present).
    pub families: BTreeMap<OpFamily, FamilyStats>,
    /// Chunks written by puts.
    pub chunks_written: u64,
    /// Raw bytes of the chunks written.
    pub bytes_written: u64,
    /// Bytes the tier stored for them (after its codec).
    pub bytes_stored: u64,
    /// Chunks skipped by puts because the tier held them.
    pub chunks_deduped: u64,
    /// Raw bytes of the chunks skipped.
    pub bytes_deduped: u64,
    /// Chunk bytes returned by reads (frames count their stored size).
    pub bytes_read: u64,
}

impl MetricsSnapshot {
    /// One family's counters.
    pub fn family(&self, f: OpFamily) -> FamilyStats {
        self.families.get(&f).copied().unwrap_or_default()
    }
}

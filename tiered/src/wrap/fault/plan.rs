//! What a [`FaultStore`](super::FaultStore) injects ([`FaultPlan`]), where
//! ([`FaultTargets`]), and what it has injected so far ([`FaultCounts`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which operations a [`FaultPlan`]'s rates and latency apply to (an
/// outage stops every call: the tier is down).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultTargets {
    /// Chunk reads, `has_chunks`, `get_manifest`; object gets.
    pub reads: bool,
    /// Puts of chunks and manifests, deletions; object puts and copies.
    pub writes: bool,
    /// `list_chunks`, `list_chunk_info`, `list_steps`; object listings.
    pub listing: bool,
    /// `commit` (a [`ChunkStore`](crate::ChunkStore) call only: under L3 a
    /// commit record is an object put, a write).
    pub commit: bool,
}

impl Default for FaultTargets {
    fn default() -> Self {
        FaultTargets {
            reads: true,
            writes: true,
            listing: true,
            commit: true,
        }
    }
}

/// The faults a [`FaultStore`](super::FaultStore) injects. The default
/// injects nothing.
///
/// Most faults apply to both layers a `FaultStore` wraps, a
/// [`ChunkStore`](crate::ChunkStore) or an `ObjectStore`; the two marked
/// "object store" only exist there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Seed of every decision: the same seed and calls replay the same faults.
    pub seed: u64,
    /// Probability that a call (or one entry of a batch read) fails
    /// `Unavailable` (a 503 under an object store) before it reaches the
    /// tier.
    pub error_rate: f64,
    /// Probability that a call (or one entry of a batch read) hangs for
    /// [`Self::timeout`] and then fails, before it reaches the tier.
    pub timeout_rate: f64,
    /// How long a timed-out call hangs.
    pub timeout: Duration,
    /// Probability that a call's connection drops after the tier served it:
    /// the call fails, yet a write it made stands. Chunk store: every call
    /// but batch reads; object store: puts and gets.
    pub drop_rate: f64,
    /// Added to every targeted call.
    pub latency: Duration,
    /// A random extra latency, up to this much.
    pub latency_jitter: Duration,
    /// Probability that a chunk read comes back damaged: `Corrupt` from
    /// verified reads (as a tier reports damaged bytes), a flipped byte
    /// from `get_chunks_unverified`, `get_frame` and object gets (so the
    /// verifying caller sees the damage).
    pub corrupt_rate: f64,
    /// Probability that a chunk read comes back short: `Corrupt` from
    /// verified reads, missing bytes from the unverified ones and from
    /// object gets.
    pub truncate_rate: f64,
    /// After this many calls, every call fails `Unavailable` until
    /// [`FaultStore::heal`](super::FaultStore::heal).
    pub outage_after: Option<u64>,
    /// After this many successful writes, every write fails (a server that
    /// died, or a process killed mid-upload) until
    /// [`FaultStore::heal`](super::FaultStore::heal).
    pub writes_before_outage: Option<u64>,
    /// Object store: refuse create-if-absent puts as not implemented (an S3
    /// server or configuration without conditional writes).
    pub no_conditional_put: bool,
    /// Object store: every part of a multipart upload fails (the upload
    /// itself starts, and can be completed or aborted): what must not
    /// leave an upload behind.
    pub fail_parts: bool,
    /// Which operations the rates and latency apply to.
    pub targets: FaultTargets,
}

/// What a [`FaultStore`](super::FaultStore) has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Calls seen.
    pub ops: u64,
    /// Errors injected by `error_rate` (per call or entry).
    pub errors: u64,
    /// Calls (or entries) timed out by `timeout_rate`.
    pub timeouts: u64,
    /// Connections dropped by `drop_rate`.
    pub drops: u64,
    /// Calls delayed.
    pub delays: u64,
    /// Chunk reads damaged by `corrupt_rate`.
    pub corruptions: u64,
    /// Chunk reads shortened by `truncate_rate`.
    pub truncations: u64,
    /// Calls failed by an outage (`outage_after`, `writes_before_outage`).
    pub outage_failures: u64,
}

/// The live counters behind [`FaultCounts`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) ops: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) drops: AtomicU64,
    pub(super) delays: AtomicU64,
    pub(super) corruptions: AtomicU64,
    pub(super) truncations: AtomicU64,
    pub(super) outage_failures: AtomicU64,
    /// Successful writes, for `writes_before_outage`.
    pub(super) writes: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> FaultCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultCounts {
            ops: g(&self.ops),
            errors: g(&self.errors),
            timeouts: g(&self.timeouts),
            drops: g(&self.drops),
            delays: g(&self.delays),
            corruptions: g(&self.corruptions),
            truncations: g(&self.truncations),
            outage_failures: g(&self.outage_failures),
        }
    }
}

pub(super) fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

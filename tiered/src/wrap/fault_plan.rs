//! What a [`FaultStore`](super::FaultStore) injects ([`FaultPlan`]), where
//! ([`FaultTargets`]), and what it has injected so far ([`FaultCounts`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which operations a [`FaultPlan`]'s rates and latency apply to (an
/// outage stops every call: the tier is down).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultTargets {
    /// Chunk reads, `has_chunks`, `get_manifest`.
    pub reads: bool,
    /// Puts of chunks and manifests, deletions.
    pub writes: bool,
    /// `list_chunks`, `list_chunk_info`, `list_steps`.
    pub listing: bool,
    /// `commit`.
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

/// The faults a [`FaultStore`](super::FaultStore) injects. The default injects nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Seed of every decision: the same seed and calls replay the same faults.
    pub seed: u64,
    /// Probability that a call (or one entry of a batch read) fails
    /// `Unavailable` before it reaches the tier.
    pub error_rate: f64,
    /// Added to every targeted call.
    pub latency: Duration,
    /// A random extra latency, up to this much.
    pub latency_jitter: Duration,
    /// Probability that a chunk read comes back damaged: `Corrupt` from
    /// verified reads (as a tier reports damaged bytes), a flipped byte
    /// from `get_chunks_unverified` and `get_frame` (so the verifying
    /// caller sees the damage).
    pub corrupt_rate: f64,
    /// Probability that a chunk read comes back short: `Corrupt` from
    /// verified reads, missing bytes from the unverified ones.
    pub truncate_rate: f64,
    /// After this many calls, every call fails `Unavailable` until
    /// [`FaultStore::heal`](super::FaultStore::heal).
    pub outage_after: Option<u64>,
    /// Which operations the rates and latency apply to.
    pub targets: FaultTargets,
}

/// What a [`FaultStore`](super::FaultStore) has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Calls seen.
    pub ops: u64,
    /// `Unavailable` errors injected by `error_rate` (per call or entry).
    pub errors: u64,
    /// Calls delayed.
    pub delays: u64,
    /// Chunk reads damaged by `corrupt_rate`.
    pub corruptions: u64,
    /// Chunk reads shortened by `truncate_rate`.
    pub truncations: u64,
    /// Calls failed by the outage.
    pub outage_failures: u64,
}

/// The live counters behind [`FaultCounts`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) ops: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) delays: AtomicU64,
    pub(super) corruptions: AtomicU64,
    pub(super) truncations: AtomicU64,
    pub(super) outage_failures: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> FaultCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultCounts {
            ops: g(&self.ops),
            errors: g(&self.errors),
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

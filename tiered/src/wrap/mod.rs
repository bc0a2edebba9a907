//! Wrappers over [`ChunkStore`]: behaviour that every tier may want but no
//! tier should carry as a flag inside it (as `object_store`'s `LimitStore`
//! and `ThrottledStore` wrap any `ObjectStore`).
//!
//! * [`RetryStore`]: retries calls that failed `Unavailable`, with
//!   exponential backoff and seeded jitter, up to a number of attempts and a
//!   deadline;
//! * [`LimitStore`]: at most N calls in flight;
//! * [`ThrottleStore`]: a bandwidth cap on chunk bytes read and written;
//! * [`MetricsStore`]: counters of operations, errors by kind, bytes and
//!   latency per operation family;
//! * [`FaultStore`]: seeded, replayable fault injection (errors, timeouts,
//!   dropped connections, latency, damaged reads, outages) at the trait
//!   level, so any tier can be tested under faults, and over the
//!   `ObjectStore` under L3 for the faults only a real object store has.
//!
//! Each wrapper forwards every trait method, defaults included (a tier's
//! override must never be lost behind a wrapper), which
//! `#[deny(clippy::missing_trait_methods)]` on each impl enforces, and each
//! passes the conformance suite (`tests/conformance_wrappers.rs`).
//! Wrappers stack: `RetryStore::new(MetricsStore::new(l3))` retries and
//! counts every attempt.
//!
//! [`ChunkStore`]: crate::ChunkStore

mod fault;
mod limit;
mod metrics;
mod metrics_snapshot;
mod retry;
mod throttle;

pub use fault::{FaultCounts, FaultPlan, FaultStore, FaultTargets};
pub use limit::LimitStore;
pub use metrics::MetricsStore;
pub use metrics_snapshot::{ErrorCounts, FamilyStats, MetricsSnapshot, OpFamily};
pub use retry::{RetryPolicy, RetryStore};
pub use throttle::{ThrottleConfig, ThrottleStore};

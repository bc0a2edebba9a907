//! # strata-tiered
//!
//! The seam between Strata's engine and its storage tiers:
//!
//! * [`ChunkStore`]: the one trait every tier implements, with its contract
//!   written in [`store`], and [`conformance`]: the suite every tier passes;
//! * [`L1Store`]: content-addressed chunks on the node's local disk, written
//!   and read by an [`io::IoEngine`] (io_uring on a dedicated thread, or
//!   pread/pwrite where io_uring is refused), O_DIRECT, create-only commits;
//! * [`MemoryStore`]: the reference implementation, in memory;
//! * [`AlignedBuf`] and [`ChunkData`]: owned, page-aligned buffers shared
//!   without copies between the staging pool, the engine and the tiers;
//! * [`L3Store`]: object storage (S3, GCS, Azure, a local directory, memory)
//!   through `object_store`, with compressed frames and create-only commits,
//!   opened for real use as [`L3Tier`] (retries over metrics over the store);
//! * [`wrap`]: wrappers over any store (retries, a concurrency limit,
//!   bandwidth caps, metrics, fault injection), each passing the suite;
//!   [`FaultStore`] also wraps the `ObjectStore` under L3;
//! * [`Clock`]: injected time, so grace periods and policies are tested
//!   without sleeping; [`SplitMix64`]: injected randomness, so a failing
//!   seed replays.
//!
//! `Arc<T>` and `Box<T>` of a store are stores. Depends only on
//! `strata-format`.

pub mod aligned;
mod chunk_data;
pub mod clock;
pub mod conformance;
mod error;
mod fsutil;
pub mod io;
mod l1;
mod l3;
mod memory;
mod redact;
pub mod rng;
pub mod store;
mod store_forward;
pub mod task;
pub mod wrap;

pub use aligned::AlignedBuf;
pub use chunk_data::ChunkData;
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Result, StoreError, StoreErrorKind};
pub use io::EngineChoice;
pub use l1::L1Store;
pub use l3::{Frame, L3Options, L3Store, L3Tier};
pub use memory::MemoryStore;
pub use redact::{percent_decode, redact_url, scrub_url_secrets, REDACTED};
pub use rng::SplitMix64;
pub use store::{
    ChunkInfo, ChunkPut, ChunkStore, ChunkStoreExt, PutOptions, PutStats, ReadOptions, StepInfo,
};
pub use wrap::{
    FaultPlan, FaultStore, LimitStore, MetricsSnapshot, MetricsStore, RetryPolicy, RetryStore,
    ThrottleConfig, ThrottleStore,
};

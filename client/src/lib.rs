//! # strata
//!
//! The library a training loop links. A [`Checkpointer`] built from a
//! [`Config`] saves a rank's state (named tensors and blobs) asynchronously:
//! `save` snapshots into pre-faulted staging memory and returns; hashing,
//! layout and L1 writes (io_uring, O_DIRECT, only new chunk ids) run in the
//! background, then a barrier across ranks and a create-only commit record
//! make the step visible. `restore` agrees with every rank on the newest step
//! they all committed and returns it with every chunk verified, or fills
//! caller-provided buffers.
//!
//! ```no_run
//! use strata::{Checkpointer, Config, Entry, StepSelector};
//! use strata::format::DType;
//!
//! let ckpt = Checkpointer::new(Config::builder().job("my-run").l1_dir("/nvme/strata"))?;
//! let weights = vec![0u8; 4 * 1024];
//! let handle = ckpt.save(100, &[Entry::tensor("w", DType::F32, &[1024], &weights)])?;
//! // ... keep training; overwrite `weights` freely ...
//! let stats = handle.wait()?; // durable on L1
//! let state = ckpt.restore(StepSelector::Latest)?;
//! assert_eq!(state.get("w").map(|e| e.bytes.len()), Some(4096));
//! # Ok::<(), strata::Error>(())
//! ```
//!
//! The engine works over a stack of tiers, each an `Arc<dyn ChunkStore>`
//! ([`TierStack`]: the node's L1, peer services (L2) that receive every
//! step, object storage (L3) that receives the steps the upload policy
//! picks), built from the [`Config`] or handed in through
//! [`Checkpointer::builder`]. [`tiers`] lists them once ([`Catalog`]) and
//! reads any rank's shard from the fastest good copy
//! ([`tiers::ShardReader`]); tools open them read-only as [`Tiers`]. Ranks agree through a [`Coordinator`] (on
//! threads: [`InProcessCoordinator`]); the commit protocol is described in
//! `docs/commit-protocol.md`. Errors carry an [`ErrorKind`] that says what
//! to do about them.

mod builder;
mod checkpointer;
pub mod config;
mod coord;
mod error;
mod foreground;
pub mod gpu;
mod handle;
mod health;
mod metrics;
mod mirror;
pub mod par;
mod policy;
pub mod priority;
mod push_claims;
mod redact;
mod restore;
mod retention;
pub mod roll_forward;
mod rollback;
mod save;
mod shared;
mod staging;
mod state;
pub mod stats;
mod step_states;
pub mod synthetic;
mod tier_states;
mod tier_status;
pub mod tiers;

pub use builder::CheckpointerBuilder;
pub use checkpointer::Checkpointer;
pub use config::{BusyPolicy, Config, UploadBacklog};
pub use coord::{coordinator, etcd};
pub use coordinator::{Coordinator, InProcessCoordinator, SoloCoordinator};
pub use error::{with_causes, Error, ErrorKind, Result};
pub use etcd::{EtcdCoordinator, EtcdOptions, NodeCoordinator, NodePlace};
pub use gpu::DeviceBytes;
pub use handle::{SaveHandle, Target};
pub use redact::{is_secret_option, REDACTED};
pub use restore::priority::{entry_under, PriorityRestore};
pub use restore::{RestorePlan, StepSelector};
pub use state::{Entry, RestoredEntry, RestoredState};
pub use stats::{Health, OnBackgroundError, RestoreStats, SaveStats};
pub use strata_format as format;
pub use strata_peer as peer;
pub use strata_tiered as tiered;
pub use tier_states::{L2State, L3State};
pub use tier_status::StepTiers;
pub use tiers::{Catalog, Tier, TierKind, TierStack, Tiers};

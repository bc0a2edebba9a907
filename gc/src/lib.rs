//! # strata-gc
//!
//! Retention and garbage collection for every tier, through the
//! [`ChunkStore`](strata_tiered::ChunkStore) trait: the same code for L1,
//! the peers and L3.
//!
//! * [`Retention`]: what a tier keeps (the newest N committed steps, every
//!   K-th, those committed within T, pinned steps, steps the caller still
//!   needs such as pending uploads) and how long an unreferenced chunk is
//!   left alone (the grace period).
//! * [`plan()`]: a pure function from an [`Inventory`] (steps, manifests,
//!   chunks with their ages, the tier's own time) to a [`Plan`]: the shards
//!   to retire, the partial shards to remove, the chunks to delete. It is
//!   property-tested: no chunk a kept manifest references is ever in a plan.
//! * [`collect`]: takes the inventory with a strict listing (any error but
//!   "not found" aborts before anything is deleted), plans, and sweeps:
//!   each shard's commit record, then its manifest (`delete_shard`, which
//!   leaves a retiring marker so a sweep killed half-way is finished by the
//!   next one); then it marks again and deletes the chunks still
//!   unreferenced and still older than the grace period, each checked once
//!   more as it goes (a save that reuses a chunk meanwhile keeps it).
//!
//! Only the ranks in the [`Scope`] are touched: a rank collecting its
//! node's L1 retires only its own shards (ranks share the directory), while
//! chunks are shared, so every manifest of every rank protects them. No
//! decision reads this host's clock: ages come from the tier's clock
//! (`ChunkStore::now`), which stamped the chunks.

mod collect;
mod error;
mod inventory;
mod plan;
mod policy;

pub use collect::{collect, Abandoned, IncompleteSeen, Options, RankProgress, Report};
pub use error::{GcError, Result};
pub use inventory::{take_inventory, Inventory, ManifestRefs};
pub use plan::{plan, plan_bounded, plan_with, Evidence, Plan, Scope};
pub use policy::Retention;

//! # strata-gc
//!
//! Retention and garbage collection for every tier. This crate will hold:
//!
//! * retention policies per tier: keep the last N steps, keep every K-th, keep
//!   steps newer than T, pin a step;
//! * mark-and-sweep over any `ChunkStore`: chunks referenced by no retained
//!   manifest are deleted, except those younger than a grace period, so a save
//!   in flight never loses a chunk; a dry run prints what would go.
//!
//! Nothing here is written yet (see the retention work in the L1 issue).

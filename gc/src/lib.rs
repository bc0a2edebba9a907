//! # strata-gc
//!
//! Retention and garbage collection for every tier, through the
//! `ChunkStore` trait (the same code for every tier). Planned:
//!
//! * retention policies per tier: keep the last N steps, keep every K-th, keep
//!   steps newer than T, pin a step;
//! * a pure planner (manifests, records, chunk listing with ages, pins,
//!   policy, now → what to delete) and a sweep that deletes records, then
//!   manifests, then chunks still unreferenced and older than the grace
//!   period at deletion time; a dry run prints what would go.
//!
//! Not written yet. Today retention runs in the `strata` library (L1: keep
//! the newest N steps this rank committed, only this rank's shards, a
//! listing error aborts it) and in the peer service (L2: keep the newest
//! steps); L3 is not cleaned. The trait already carries what this crate
//! needs: `list_chunk_info` (sizes and ages), `delete_shard` (a retiring
//! marker first) and `delete_chunks_untouched_since` (re-checked at
//! deletion).

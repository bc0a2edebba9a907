//! # strata
//!
//! The library a training loop links. Today it holds what the demo and the
//! benchmarks share — a deterministic synthetic training state ([`synthetic`])
//! and a small parallel map over chunks ([`par`]) — and re-exports the format
//! crate. The `Checkpointer` (async save to L1, verified restore, ranks and
//! coordinators, the GPU path) arrives with the L1 issue; see
//! `ARCHITECTURE.md` for where this is going.

pub mod par;
pub mod synthetic;

pub use strata_format as format;

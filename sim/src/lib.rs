//! # strata-sim
//!
//! Thousands of ranks in one process, each a real [`strata::Checkpointer`]
//! on a thread of its own with its own in-memory disk, agreeing through a
//! real coordinator: the in-process one, or etcd with the ranks of each
//! simulated node sharing one [`strata::EtcdCoordinator`] (as a process
//! that runs a node's ranks would). Seeded faults ([`faults`]) kill a
//! node's process at each point of the protocol, make a node slow, or
//! restart etcd; the job restarts after a death and every rank restores.
//! Every step must commit or fail on all ranks alike, and every restore
//! must pick the same step everywhere, the newest one decided, with every
//! rank's bytes intact. A run is replayable from its seed.

pub mod faults;
mod job;
pub mod report;

pub use job::{run, state, Coord, Plan};
pub use report::Report;

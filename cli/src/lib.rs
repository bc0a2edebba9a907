//! What the `strata` binary shares with its tests: the multi-node test
//! bed ([`cluster`]) that `strata demo --nodes` and the cluster tests run.

pub mod cluster;

//! # strata-peer
//!
//! L2: replicas of a node's checkpoints on its peers. This crate will hold:
//!
//! * the versioned peer protocol — a pure, bounded, fuzzed message codec;
//! * the peer service behind `strata peer serve`: QUIC (quinn) with mutual TLS
//!   from a cluster CA, replicas in memory with spill to disk under a byte
//!   budget, per-job namespaces, retention, Prometheus metrics;
//! * the client side: a `ChunkStore` over a set of peers, and the deterministic
//!   ring that places each rank's replicas on other nodes.
//!
//! Nothing here is written yet (see the L2 issue).

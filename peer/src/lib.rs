//! # strata-peer
//!
//! L2: replicas of a node's checkpoints on its peers.
//!
//! * [`proto`]: the versioned peer protocol, a pure, bounded message codec
//!   (fuzzed: `fuzz/fuzz_targets/peer_message.rs`);
//! * [`tls`]: the cluster CA, node and job certificates (rcgen), and the
//!   mutual-TLS configurations of services and clients;
//! * [`service`]: the peer service behind `strata peer serve`;
//! * [`client`]: [`PeerStore`], a `ChunkStore` over one peer service.

pub mod client;
pub mod metrics;
pub mod proto;
pub mod replicas;
pub mod service;
pub mod tls;
pub use client::{PeerOptions, PeerStore};

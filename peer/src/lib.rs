//! # strata-peer
//!
//! L2: replicas of a node's checkpoints on its peers.
//!
//! * [`proto`]: the versioned peer protocol, a pure, bounded message codec
//!   (fuzzed: `fuzz/fuzz_targets/peer_message.rs`; built alone without the
//!   default `net` feature);
//! * `tls`: the cluster CA, node and job certificates (rcgen), and the
//!   mutual-TLS configurations of services and clients;
//! * `replicas` and `service`: the peer service behind `strata peer serve`,
//!   and `metrics` for Prometheus (with `prom`, the text format and HTTP
//!   answer it shares with the training process's endpoint);
//! * `client`: `PeerStore`, a `ChunkStore` over one peer service;
//! * `group`: `PeerGroup`, L2 as one tier: the peers of a rank over the
//!   ring as one `ChunkStore`, and the policy that keeps `R` copies.

#[cfg(feature = "net")]
pub mod client;
#[cfg(feature = "fuzzing")]
pub mod fuzz_session;
#[cfg(feature = "net")]
pub mod group;
#[cfg(feature = "net")]
pub mod metrics;
#[cfg(feature = "net")]
pub mod prom;
pub mod proto;
#[cfg(feature = "net")]
pub mod replicas;
pub mod ring;
#[cfg(feature = "net")]
pub mod service;
#[cfg(feature = "net")]
pub mod tls;

#[cfg(feature = "net")]
pub use client::{PeerOptions, PeerStore};
#[cfg(feature = "net")]
pub use group::{Member, PeerGroup, Spread};

//! # strata-testkit
//!
//! What the integration tests of several crates share, so no test includes
//! another crate's files by path: [`servers`], real S3-compatible servers
//! for the L3 tests (`tiered`'s conformance and server tests, `client`'s
//! tiering tests), and [`etcd`], a real etcd server for the coordination
//! tests and the scale simulation. A dev-dependency only (and of the
//! benchmarks).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod etcd;
pub mod servers;

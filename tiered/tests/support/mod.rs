//! What this crate's integration tests share (each test is a crate of its
//! own and takes the module with `mod support;`): the S3-compatible test
//! servers (`servers.rs`). `client/tests/l3_tiering.rs` includes
//! `servers.rs` too, by path, being in another crate.

pub(crate) mod servers;

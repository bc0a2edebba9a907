//! Helpers shared by the benchmark commands.

pub mod cpu;
pub mod quic;
pub mod s3;
pub mod state;

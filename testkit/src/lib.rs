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

/// Every file under `dir`, recursively (an unreadable directory is
/// skipped): for tests that look for a chunk file on disk.
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                out.extend(files_under(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

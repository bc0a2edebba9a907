//! Helpers shared by the CLI integration tests.

use std::path::{Path, PathBuf};

pub(crate) mod store;

/// The first file named `name` under `dir` (depth first).
pub(crate) fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find(&p, name) {
                return Some(f);
            }
        } else if p.file_name().and_then(|n| n.to_str()) == Some(name) {
            return Some(p);
        }
    }
    None
}

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

/// A peer's spill file of chunk `hex` under `dir` (named `<hex>.<seq>`:
/// each put writes a file of its own).
#[allow(dead_code)] // used by some of the test binaries that include this module
pub(crate) fn find_spilled(dir: &Path, hex: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_spilled(&p, hex) {
                return Some(f);
            }
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(hex))
            .is_some_and(|rest| rest.starts_with('.'))
        {
            return Some(p);
        }
    }
    None
}

//! Replays every input kept under `fuzz/regressions/<target>/` through the
//! same entry points the fuzz targets use. Inputs that once crashed a
//! decoder (and the hand-made hostile seeds beside them) stay here forever.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

fn replay(target: &str, f: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let mut n = 0;
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            f(&bytes);
            n += 1;
        }
    }
    n
}

#[test]
fn frame_regressions() {
    assert!(replay("frame", strata_format::fuzzing::frame) > 0);
}

#[test]
fn manifest_regressions() {
    assert!(replay("manifest", strata_format::fuzzing::manifest) > 0);
}

#[test]
fn commit_regressions() {
    assert!(replay("commit", strata_format::fuzzing::commit) > 0);
}

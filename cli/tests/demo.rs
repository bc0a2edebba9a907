//! Runs the real `strata` binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

#[test]
fn demo_runs_end_to_end_and_reports() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["demo", "--state-size", "24MiB", "--chunk-size", "1MiB"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "hash (BLAKE3)",
        "encode (planes codec)",
        "decode + verify",
        "every chunk byte-identical",
        "ratio",
        "BF16",
        "ok:",
    ] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["demo", "--chunk-size", "100"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("strata: error:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["demo", "--state-size", "lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
}

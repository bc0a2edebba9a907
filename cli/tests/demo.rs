//! Runs the real `strata` binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

#[test]
fn demo_saves_restores_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let run = |steps: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args([
                "demo",
                "--state-size",
                "24MiB",
                "--chunk-size",
                "1MiB",
                "--steps",
                steps,
                "--dir",
            ])
            .arg(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "stdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let first = run("2");
    for needle in [
        "step    1: stall",
        "step    2: stall",
        "deduped",
        "restored step 2:",
        "verified byte-identical",
        "codec report",
        "hash (BLAKE3)",
        "encode (planes codec)",
        "every chunk byte-identical",
        "BF16",
        "step    2: L1 committed, L3 committed, uploaded",
        "L2 1/1 on node-b",
        "restored step 2 from its peer onto an empty L1",
        "simulated the loss of this node's disk",
        "restored step 2 from L3 onto an empty L1",
        "ok: steps 1..=2",
    ] {
        assert!(first.contains(needle), "missing {needle:?} in:\n{first}");
    }
    // L1 was wiped at the end of the first run and refilled by the restore
    // from L3: the second run recovers from L1 and deduplicates against it.
    let second = run("1");
    assert!(second.contains("recovered step 2 from L1"), "{second}");
    assert!(second.contains("step    3: stall"), "{second}");
    assert!(!second.contains("deduped 0%"), "{second}");
    assert!(second.contains("ok: steps 3..=3"), "{second}");
    // Without L3: the second run's simulated loss left step 2 (restored
    // from L3) on L1, so the next runs resume from L1.
    let no_l3 = || {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["demo", "--state-size", "24MiB", "--chunk-size", "1MiB"])
            .args(["--steps", "1", "--no-l3", "--no-codecs", "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        // The temporary directory's random name could itself hold "L3".
        String::from_utf8_lossy(&out.stdout).replace(&dir.path().display().to_string(), "DIR")
    };
    let third = no_l3();
    assert!(third.contains("recovered step 2 from L1"), "{third}");
    assert!(third.contains("ok: steps 3..=3"), "{third}");
    assert!(!third.contains("L3"), "{third}");
    let fourth = no_l3();
    assert!(fourth.contains("recovered step 3 from L1"), "{fourth}");
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["demo", "--chunk-size", "100"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("strata: error:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Refused before anything was written: no demo directory, no keys.
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "bad arguments left files behind: {left:?}");

    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["demo", "--state-size", "lots"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
}

/// The README's first command on a small state: the whole demo runs (saves
/// beside the push and the upload, the restores, the priority restore, the
/// loss of the node's disk restored from its peer and then from L3) and
/// says so.
#[test]
fn the_demo_saves_restores_first_the_weights_and_recovers_from_peers_and_l3() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "demo",
            "--state-size",
            "48MiB",
            "--chunk-size",
            "1MiB",
            "--no-codecs",
            "--steps",
            "2",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "restored step 2: ",
        "priority restore of step 2: the model's weights (",
        "restored step 2 from its peer onto an empty L1",
        "restored step 2 from L3 onto an empty L1",
        "ok: steps 1..=2 saved",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

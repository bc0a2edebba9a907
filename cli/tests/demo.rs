//! The README's first command on a small state: the whole demo runs (saves
//! beside the push and the upload, the restores, the priority restore, the
//! loss of the node's disk restored from its peer and then from L3) and
//! says so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

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
    // The weights come back before everything: their time is the smaller.
    let prio = stdout
        .lines()
        .find(|l| l.starts_with("priority restore"))
        .unwrap();
    let secs: Vec<f64> = prio
        .split_whitespace()
        .filter_map(|w| w.parse::<f64>().ok())
        .collect();
    assert!(secs.len() >= 2, "{prio}");
    assert!(secs[secs.len() - 2] <= secs[secs.len() - 1], "{prio}");
}

//! `strata rm`: steps deleted from L1 and L3 as retirements of every
//! rank's shard; the job's latest step becomes the newest one left (a
//! rollback done offline); a pinned step is refused with nothing deleted;
//! a step no tier holds is "not found" (exit 4).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use strata::format::DType;
use strata::{Checkpointer, Config, Entry, InProcessCoordinator, StepSelector};

fn state(rank: u32, step: u64) -> Vec<u8> {
    (0..(1u32 << 16))
        .map(|i| (i as u8).wrapping_mul(step as u8 | 1) ^ (i >> 8) as u8 ^ rank as u8)
        .collect()
}

fn cfg(dir: &Path, rank: u32) -> Config {
    Config::builder()
        .job("rm-job")
        .l1_dir(dir.join("l1"))
        .chunk_size(1 << 14)
        .io_engine("psync")
        .keep_last(100)
        .l3_url(format!("file://{}", dir.join("l3").display()))
        .upload_every(1)
        .rank(rank, 2)
}

/// Two ranks save steps 1..=5 to L1 and L3.
fn job(dir: &Path) {
    std::fs::create_dir_all(dir.join("l3")).unwrap();
    let coord = InProcessCoordinator::new(2);
    std::thread::scope(|sc| {
        for rank in 0..2 {
            let coord = coord.clone();
            let cfg = cfg(dir, rank);
            sc.spawn(move || {
                let ck = Checkpointer::with_coordinator(cfg, Arc::new(coord)).unwrap();
                for step in 1..=5 {
                    let b = state(rank, step);
                    let shape = [b.len() as u64];
                    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &b)])
                        .unwrap()
                        .wait()
                        .unwrap();
                }
                ck.wait_uploads();
            });
        }
    });
}

fn strata(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .arg("--l1")
        .arg(dir.join("l1"))
        .arg("--l3")
        .arg(format!("file://{}", dir.join("l3").display()))
        .args(["--job", "rm-job"])
        .output()
        .unwrap()
}

/// Restores the latest step on both ranks; returns it.
fn latest(dir: &Path) -> u64 {
    let coord = InProcessCoordinator::new(2);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let coord = coord.clone();
                let cfg = cfg(dir, rank);
                sc.spawn(move || {
                    let ck = Checkpointer::with_coordinator(cfg, Arc::new(coord)).unwrap();
                    let got = ck.restore(StepSelector::Latest).unwrap();
                    assert_eq!(got.get("w").unwrap().bytes, state(rank, got.step));
                    got.step
                })
            })
            .collect();
        let steps: Vec<u64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(steps[0], steps[1]);
        steps[0]
    })
}

#[test]
fn rm_retires_steps_in_every_tier_and_the_newest_left_is_latest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    job(d);
    assert_eq!(latest(d), 5);

    // Pinned on L3: refused (exit 2), nothing deleted anywhere.
    assert!(strata(d, &["pin", "5", "--tier", "l3"]).status.success());
    let out = strata(d, &["rm", "4", "5"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pinned"), "{err}");
    assert_eq!(latest(d), 5);

    assert!(strata(d, &["unpin", "5", "--tier", "l3"]).status.success());
    let out = strata(d, &["rm", "4", "5", "77"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not held by any tier: 77"), "{text}");
    // Both ranks' shards, in both tiers.
    assert_eq!(
        text.lines().filter(|l| l.contains(" 2")).count(),
        4,
        "{text}"
    );
    assert_eq!(latest(d), 3);
    // Nothing of steps 4 and 5 is listed by either tier.
    let ls = strata(d, &["ls", "--json"]);
    assert!(ls.status.success(), "{ls:?}");
    let listed: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let mut steps = Vec::new();
    steps_in(&listed, &mut steps);
    assert!(steps.contains(&3), "{listed}");
    assert!(!steps.contains(&4) && !steps.contains(&5), "{listed}");

    let out = strata(d, &["rm", "5"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}

/// Every `"step"` number anywhere in `v`.
fn steps_in(v: &serde_json::Value, out: &mut Vec<u64>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x.as_u64()) {
                    ("step", Some(s)) => out.push(s),
                    _ => steps_in(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| steps_in(x, out)),
        _ => {}
    }
}

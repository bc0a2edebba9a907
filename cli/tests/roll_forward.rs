//! The CLI on a step committed on some ranks only, and on a store that
//! cannot be read: `verify --repair` rolls a decided step forward, and
//! `ls` never calls a store it could not read empty (text, JSON, exit code).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use strata::format::DType;
use strata::tiered::wrap::FaultTargets;
use strata::tiered::{ChunkStore, EngineChoice, FaultPlan, FaultStore, L1Store};
use strata::{Checkpointer, Config, Entry, InProcessCoordinator};
use support::store::run;

const JOB: &str = "split";

fn cfg(l1: &std::path::Path, rank: u32) -> Config {
    Config::builder()
        .job(JOB)
        .l1_dir(l1)
        .rank(rank, 2)
        .chunk_size(1 << 16)
        .io_engine("psync")
        .keep_last(4)
        .coordination_timeout_secs(20)
}

/// Two ranks on one node (one L1) save step 1, then step 2, where rank
/// 1's record fails to write (a full disk) after both voted.
fn split_store(l1: &std::path::Path) {
    for step in [1u64, 2] {
        let coord = InProcessCoordinator::new(2);
        std::thread::scope(|s| {
            for rank in 0..2u32 {
                let coord = coord.clone();
                s.spawn(move || {
                    let mut b = Checkpointer::builder(cfg(l1, rank)).coordinator(Arc::new(coord));
                    let fails = rank == 1 && step == 2;
                    if fails {
                        let failing: Arc<dyn ChunkStore> = Arc::new(FaultStore::new(
                            L1Store::open(l1, EngineChoice::Psync).unwrap(),
                            FaultPlan {
                                error_rate: 1.0,
                                targets: FaultTargets {
                                    reads: false,
                                    writes: false,
                                    listing: false,
                                    commit: true,
                                },
                                ..FaultPlan::default()
                            },
                        ));
                        b = b.local(failing);
                    }
                    let ck = b.build().unwrap();
                    let w: Vec<u8> = (0..200_000u32).map(|i| (i as u8) ^ rank as u8).collect();
                    let shape = [w.len() as u64];
                    let r = ck
                        .save(step, &[Entry::tensor("w", DType::U8, &shape, &w)])
                        .unwrap()
                        .wait();
                    assert_eq!(r.is_ok(), !fails, "rank {rank} step {step}: {r:?}");
                });
            }
        });
    }
}

fn args(l1: &std::path::Path, cmd: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    a.extend([
        "--job".into(),
        JOB.into(),
        "--l1".into(),
        l1.display().to_string(),
    ]);
    a
}

#[test]
fn verify_repair_rolls_a_decided_step_forward() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    split_store(&l1);
    let v = run(&args(&l1, &["verify", "--all", "--json"]));
    assert_eq!(v.code, 1, "{}\n{}", v.stdout, v.stderr);
    let report = v.json();
    let missing: Vec<&str> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["object"] == "commit record")
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(missing, vec!["2/1"], "{report}");
    let fixed = run(&args(&l1, &["verify", "--all", "--repair"]));
    assert_eq!(fixed.code, 5, "{}\n{}", fixed.stdout, fixed.stderr);
    assert!(fixed.stdout.contains("REPAIRED"), "{}", fixed.stdout);
    assert_eq!(run(&args(&l1, &["verify", "--all"])).code, 0);
    // Both ranks' records are there: the step is committed on the node.
    let ls = run(&args(&l1, &["ls", "--json"])).json();
    assert_eq!(ls["steps"][0]["step"], 2, "{ls}");
    assert_eq!(ls["steps"][0]["tiers"][0]["state"], "committed", "{ls}");
}

#[test]
fn ls_tells_an_empty_store_from_one_it_could_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    std::fs::create_dir_all(&l1).unwrap();
    let empty = run(&args(&l1, &["ls"]));
    assert_eq!(empty.code, 0, "{}", empty.stderr);
    assert!(
        empty.stdout.contains("the store is empty"),
        "{}",
        empty.stdout
    );
    let j = run(&args(&l1, &["ls", "--json"])).json();
    assert_eq!(j["complete"], true, "{j}");
    // The same empty L1, with an object store that cannot be reached.
    let dead = |cmd: &[&str]| {
        let mut a = args(&l1, cmd);
        a.extend(
            [
                "--l3",
                "s3://bucket/ckpt",
                "--l3-option",
                "endpoint=http://127.0.0.1:9",
                "--l3-option",
                "allow_http=true",
                "--l3-option",
                "region=us-east-1",
                "--l3-option",
                "max_retries=0",
            ]
            .map(String::from),
        );
        run(&a)
    };
    let text = dead(&["ls"]);
    assert_eq!(text.code, 3, "{}\n{}", text.stdout, text.stderr);
    assert!(
        text.stdout.contains("not known to be empty"),
        "{}",
        text.stdout
    );
    assert!(text.stderr.contains("L3"), "{}", text.stderr);
    let json = dead(&["ls", "--json"]);
    assert_eq!(json.code, 3, "{}", json.stderr);
    let j = json.json();
    assert_eq!(j["complete"], false, "{j}");
    assert_eq!(j["steps"].as_array().unwrap().len(), 0);
    assert!(j["errors"][0].as_str().unwrap().contains("L3"), "{j}");
}

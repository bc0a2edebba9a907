//! `strata gc` killed with SIGKILL at random moments of its sweep, on L1
//! and on L3 (object_store's local file system): every step the policy
//! keeps stays whole, and the next run completes the collection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry};

const STEPS: u64 = 24;

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

fn state(step: u64) -> Vec<u8> {
    let mut v = vec![9u8; 1 << 16];
    for i in 0..6u64 {
        v.extend(std::iter::repeat_n((step * 7 + i) as u8, 1 << 16));
    }
    v
}

/// Saves STEPS steps on L1, each uploaded to L3, nothing collected.
fn fill(l1: &std::path::Path, l3: &str) {
    let mut cfg = Config::builder()
        .job("k")
        .l1_dir(l1)
        .chunk_size(1 << 16)
        .keep_last(1000)
        .l3_url(l3)
        .upload_every(1);
    cfg.l3_keep_last = 0;
    cfg.max_pending_uploads = 0;
    let ck = Checkpointer::new(cfg).unwrap();
    for step in 1..=STEPS {
        let b = state(step);
        let shape = [b.len() as u64];
        ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &b)])
            .unwrap()
            .wait()
            .unwrap();
    }
    ck.wait_uploads();
}

fn gc_args(tier: &str, l1: &std::path::Path, l3: &str) -> Vec<String> {
    let mut a: Vec<String> = ["gc", "--job", "k", "--tier", tier, "--keep-last", "3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend([
        "--keep-every".into(),
        "10".into(),
        "--grace".into(),
        "0".into(),
    ]);
    a.extend([
        "--l1".into(),
        l1.display().to_string(),
        "--l3".into(),
        l3.into(),
    ]);
    a
}

fn gc_json(args: &[String], dry: bool) -> Value {
    let mut c = strata();
    c.args(args).arg("--json");
    if dry {
        c.arg("--dry-run");
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn verify(tier: &str, l1: &std::path::Path, l3: &str) {
    let out = strata()
        .args(["verify", "--all", "--job", "k", "--tier", tier, "--l1"])
        .arg(l1)
        .args(["--l3", l3])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "verify {tier}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn retired(v: &Value) -> u64 {
    let t = &v["tiers"][0];
    t["shards_retired"].as_u64().unwrap() + t["chunks_deleted"].as_u64().unwrap()
}

/// Kills `strata gc` after growing delays, each time on a fresh copy of
/// the same store, until two runs finish on their own; every kill is
/// followed by checks that every kept step is whole and that the next run
/// completes the collection.
fn killed_at_random_moments(tier: &str) {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template");
    std::fs::create_dir_all(template.join("l3")).unwrap();
    let l3_of = |root: &std::path::Path| format!("file://{}", root.join("l3").display());
    fill(&template.join("l1"), &l3_of(&template));
    let planned = gc_json(
        &gc_args(tier, &template.join("l1"), &l3_of(&template)),
        true,
    );
    let kept: Vec<u64> = planned["tiers"][0]["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(kept, [10, 20, 22, 23, 24], "{planned}");
    let total = retired(&planned);
    assert!(total > 0);
    let (mut mid, mut finished) = (0, 0);
    let mut jitter = std::process::id() as u64;
    for attempt in 0..60u64 {
        let root = dir.path().join(format!("run{attempt}"));
        let status = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(&root)
            .status()
            .unwrap();
        assert!(status.success());
        let (l1, l3) = (root.join("l1"), l3_of(&root));
        let args = gc_args(tier, &l1, &l3);
        jitter = jitter
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = Duration::from_micros(1000 * attempt + (jitter >> 33) % 1000);
        let mut child = strata()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        child.wait().unwrap();
        // Whatever was interrupted, every kept step is whole.
        verify(tier, &l1, &l3);
        let left = retired(&gc_json(&args, true));
        if left == 0 {
            finished += 1;
        } else if left < total {
            mid += 1;
        }
        // The next run completes the collection.
        gc_json(&args, false);
        let after = gc_json(&args, true);
        assert_eq!(retired(&after), 0, "{after}");
        assert_eq!(after["tiers"][0]["kept"], planned["tiers"][0]["kept"]);
        verify(tier, &l1, &l3);
        std::fs::remove_dir_all(&root).unwrap();
        if finished >= 2 {
            break;
        }
    }
    eprintln!("{tier}: {mid} runs killed in the middle of their sweep, {finished} finished before the kill");
    assert!(mid > 0, "no kill landed in the middle of a sweep");
}

#[test]
fn a_gc_killed_mid_sweep_on_l1_loses_nothing_kept_and_the_next_run_finishes() {
    killed_at_random_moments("l1");
}

#[test]
fn a_gc_killed_mid_sweep_on_l3_loses_nothing_kept_and_the_next_run_finishes() {
    killed_at_random_moments("l3");
}

#[test]
fn strata_pin_keeps_a_step_through_gc_and_ls_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    std::fs::create_dir_all(dir.path().join("l3")).unwrap();
    let l3 = format!("file://{}", dir.path().join("l3").display());
    fill(&l1, &l3);
    let run = |args: &[&str]| {
        let out = strata()
            .args(args)
            .args(["--job", "k", "--l1"])
            .arg(&l1)
            .args(["--l3", &l3])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let said = run(&["pin", "7"]);
    assert!(said.contains("step 7 pinned in L1, L3"), "{said}");
    let ls = run(&["ls"]);
    let line = ls
        .lines()
        .find(|l| l.trim_start().starts_with("7 "))
        .unwrap();
    assert!(line.contains("L1,L3"), "{ls}");
    let ls_json: Value = serde_json::from_str(&run(&["ls", "--json"])).unwrap();
    let row = ls_json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == 7)
        .unwrap();
    assert_eq!(row["pinned"], serde_json::json!(["L1", "L3"]));
    let args = gc_args("l1", &l1, &l3);
    let v = gc_json(&args, false);
    assert_eq!(
        v["tiers"][0]["kept"],
        serde_json::json!([7, 10, 20, 22, 23, 24]),
        "{v}"
    );
    let v = gc_json(&gc_args("l3", &l1, &l3), false);
    assert_eq!(
        v["tiers"][0]["kept"],
        serde_json::json!([7, 10, 20, 22, 23, 24]),
        "{v}"
    );
    verify("l1", &l1, &l3);
    run(&["unpin", "7"]);
    let v = gc_json(&args, false);
    assert_eq!(
        v["tiers"][0]["kept"],
        serde_json::json!([10, 20, 22, 23, 24]),
        "{v}"
    );
    assert!(!run(&["ls"]).contains("PINNED"));
}

//! `strata gc` keeps on each tier what the job itself keeps there: the
//! policy comes from the job's configuration through the one definition
//! the library collects by (`Config::retention_for`). A documented
//! setting read differently by the CLI deletes steps the job meant to
//! keep (`l3_keep_last = 0`, "never collect L3", once read as "keep 2 and
//! every 1000th").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry};

const STEPS: u64 = 8;

fn state(step: u64) -> Vec<u8> {
    (0..(1u32 << 16))
        .map(|i| (i as u8).wrapping_mul(step as u8 | 1) ^ (i >> 8) as u8)
        .collect()
}

/// Job `p`'s settings for saving into `l1`: every step kept there, each
/// uploaded where an L3 is given, which the job never collects.
fn saving(l1: &Path) -> Config {
    let mut cfg = Config::builder()
        .job("p")
        .l1_dir(l1)
        .chunk_size(1 << 14)
        .io_engine("psync")
        .keep_last(1000)
        .upload_every(1);
    cfg.l3_keep_last = 0;
    cfg.max_pending_uploads = 0;
    cfg
}

/// Saves `bytes` as step `step` and waits until it is durable.
fn save(ck: &Checkpointer, step: u64, bytes: &[u8]) {
    let shape = [bytes.len() as u64];
    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, bytes)])
        .unwrap()
        .wait()
        .unwrap();
}

/// Saves steps 1..=STEPS on L1 (all kept), each uploaded to L3 (never
/// collected by the job), and writes the job's configuration with `extra`
/// settings appended: what `strata gc --config` reads.
fn job_with(dir: &Path, extra: &str) -> std::path::PathBuf {
    let l1 = dir.join("l1");
    let l3 = format!("file://{}", dir.join("l3").display());
    std::fs::create_dir_all(dir.join("l3")).unwrap();
    let ck = Checkpointer::new(saving(&l1).l3_url(&l3)).unwrap();
    for step in 1..=STEPS {
        save(&ck, step, &state(step));
    }
    ck.wait_uploads();
    drop(ck);
    let toml = format!(
        "job = \"p\"\nl1_dir = \"{}\"\nl3_url = \"{l3}\"\nio_engine = \"psync\"\n{extra}\n",
        l1.display()
    );
    let path = dir.join("strata.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `strata gc --config <file> --tier <tier> --json [more]`, which must succeed.
fn gc(config: &Path, tier: &str, more: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("gc")
        .arg("--config")
        .arg(config)
        .args(["--tier", tier, "--json"])
        .args(more)
        .env_remove("STRATA_L3_KEEP_LAST")
        .env_remove("STRATA_KEEP_LAST")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "strata gc: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The steps committed on `tier` ("l1" or "l3") of the job in `config`'s
/// directory, read with the library.
fn steps_on(config: &Path, tier: &str) -> Vec<u64> {
    use strata::tiered::{ChunkStore, EngineChoice, L1Store, L3Options, L3Store};
    let dir = config.parent().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store: Box<dyn ChunkStore> = match tier {
        "l1" => Box::new(L1Store::open(dir.join("l1"), EngineChoice::Psync).unwrap()),
        _ => Box::new(
            L3Store::from_url(
                &format!("file://{}", dir.join("l3").display()),
                &[],
                L3Options::default(),
            )
            .unwrap(),
        ),
    };
    let steps = rt.block_on(store.list_steps("p")).unwrap();
    steps
        .iter()
        .filter(|s| s.is_complete())
        .map(|s| s.step)
        .collect()
}

fn retired(v: &Value) -> u64 {
    v["tiers"][0]["shards_retired"].as_u64().unwrap()
}

#[test]
fn l3_keep_last_0_means_strata_gc_never_collects_l3() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = job_with(dir.path(), "l3_keep_last = 0\nl3_gc_grace_secs = 0");
    let before = steps_on(&cfg, "l3");
    assert_eq!(before, (1..=STEPS).collect::<Vec<_>>());
    let v = gc(&cfg, "l3", &[]);
    assert_eq!(
        retired(&v),
        0,
        "strata gc retired L3 steps the job keeps: {v}"
    );
    assert_eq!(v["tiers"][0]["chunks_deleted"].as_u64(), Some(0), "{v}");
    assert!(
        v["tiers"][0]["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("l3_keep_last = 0")),
        "the report says why L3 was left alone: {v}"
    );
    assert_eq!(steps_on(&cfg, "l3"), before);
    // An explicit --keep-last is the operator's own decision: it collects.
    let v = gc(&cfg, "l3", &["--keep-last", "2", "--keep-every", "0"]);
    assert_eq!(retired(&v), STEPS - 2, "{v}");
    assert_eq!(steps_on(&cfg, "l3"), [STEPS - 1, STEPS]);
}

#[test]
fn l3_keep_last_and_l3_keep_every_are_what_strata_gc_keeps_on_l3() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = job_with(
        dir.path(),
        "l3_keep_last = 3\nl3_keep_every = 4\nl3_gc_grace_secs = 0",
    );
    gc(&cfg, "l3", &[]);
    assert_eq!(steps_on(&cfg, "l3"), [4, 6, 7, 8]);
}

#[test]
fn keep_last_is_what_strata_gc_keeps_on_l1() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = job_with(dir.path(), "keep_last = 5\ngc_grace_secs = 0");
    gc(&cfg, "l1", &[]);
    assert_eq!(steps_on(&cfg, "l1"), [4, 5, 6, 7, 8]);
}

/// Steps 1..=6 of a 2-rank job whose rank 1 never uploads: on L3 every
/// step is incomplete (rank 0's shard alone), which the job never collects
/// (`l3_keep_last = 0`). Returns the configuration `strata gc` reads.
fn job_with_incomplete_l3(dir: &Path) -> std::path::PathBuf {
    use std::sync::Arc;
    use strata::tiered::{ChunkStore, L3Options, L3Store};
    use strata::InProcessCoordinator;
    let l3_dir = dir.join("l3");
    std::fs::create_dir_all(&l3_dir).unwrap();
    let l3_url = format!("file://{}", l3_dir.display());
    let l3: Arc<dyn ChunkStore> =
        Arc::new(L3Store::from_url(&l3_url, &[], L3Options::default()).unwrap());
    let coord = InProcessCoordinator::new(2);
    std::thread::scope(|sc| {
        for rank in 0..2u32 {
            let (coord, l3) = (coord.clone(), l3.clone());
            let l1 = dir.join(format!("l1-{rank}"));
            sc.spawn(move || {
                let ck = Checkpointer::builder(saving(&l1).rank(rank, 2))
                    .coordinator(Arc::new(coord))
                    .remote((rank == 0).then_some(l3))
                    .build()
                    .unwrap();
                for step in 1..=6u64 {
                    save(&ck, step, &state(step * 2 + u64::from(rank)));
                }
                ck.wait_uploads();
            });
        }
    });
    let path = dir.join("strata.toml");
    let toml = format!(
        "job = \"p\"\nl1_dir = \"{}\"\nl3_url = \"{l3_url}\"\nio_engine = \"psync\"\nl3_keep_last = 2\nl3_keep_every = 0\n",
        dir.join("l1-0").display()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// Every step listed on the job's L3 (complete or not), and its chunks.
fn l3_held(config: &Path) -> (Vec<u64>, usize) {
    use strata::tiered::{ChunkStore, L3Options, L3Store};
    let dir = config.parent().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("file://{}", dir.join("l3").display());
    let l3 = L3Store::from_url(&url, &[], L3Options::default()).unwrap();
    let steps = rt.block_on(l3.list_steps("p")).unwrap();
    let chunks = rt.block_on(l3.list_chunks("p")).unwrap();
    (steps.iter().map(|s| s.step).collect(), chunks.len())
}

#[test]
fn strata_gc_bounds_incomplete_l3_steps_only_when_told_they_are_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = job_with_incomplete_l3(dir.path());
    let (steps, chunks) = l3_held(&cfg);
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "rank 0's shards are on L3");
    // No complete step: without the operator's word nothing goes (another
    // rank's upload may still be running).
    let v = gc(&cfg, "l3", &["--grace", "0"]);
    assert_eq!(v["tiers"][0]["partial_removed"].as_u64(), Some(0), "{v}");
    assert_eq!(retired(&v), 0, "{v}");
    assert_eq!(l3_held(&cfg), (steps.clone(), chunks));
    // Told that incomplete steps committed over an hour ago are abandoned:
    // these were committed just now, so nothing goes either.
    let v = gc(&cfg, "l3", &["--grace", "0", "--abandoned-after", "3600"]);
    assert_eq!(retired(&v), 0, "{v}");
    assert_eq!(l3_held(&cfg), (steps, chunks));
    // Told that any incomplete step is abandoned: the newest l3_keep_last
    // (2) stay, the others go with the chunks no kept step names.
    let v = gc(&cfg, "l3", &["--grace", "0", "--abandoned-after", "0"]);
    assert_eq!(retired(&v), 4, "{v}");
    let (left, left_chunks) = l3_held(&cfg);
    assert_eq!(left, [5, 6], "{v}");
    assert!(left_chunks < chunks, "no chunk was swept: {v}");
    // The flag is for L3: with no L3 tier selected it is refused.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["gc", "--config"])
        .arg(&cfg)
        .args(["--tier", "l1", "--abandoned-after", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // What stays still verifies: every chunk its manifests name is there.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["verify", "--config"])
        .arg(&cfg)
        .args(["6", "--tier", "l3", "--rank", "0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "strata verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

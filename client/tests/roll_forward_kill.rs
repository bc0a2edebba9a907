//! Roll-forward with real process kills: ranks as separate processes, each
//! with a disk of its own, agreeing through a real etcd. One rank's process
//! aborts at a point of step 3's commit (before its vote, after its vote,
//! after its record); then every rank starts again (a new incarnation of
//! the job), restores the same step with the bytes it saved, and goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_testkit::etcd;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use strata::format::DType;
use strata::{
    Checkpointer, Config, Coordinator, Entry, EtcdCoordinator, EtcdOptions, StepSelector,
};

const KIB: usize = 1 << 10;
const SHAPE: [u64; 1] = [64 * KIB as u64];

fn state(rank: u32, step: u64) -> Vec<u8> {
    (0..64 * KIB)
        .map(|j| (j as u8).wrapping_mul(29) ^ (rank as u8 * 5) ^ (step as u8))
        .collect()
}

/// Where a rank's process aborts during step 3's commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KillAt {
    BeforeVote,
    AfterVote,
    AfterRecord,
}

impl KillAt {
    fn name(self) -> &'static str {
        match self {
            KillAt::BeforeVote => "before-vote",
            KillAt::AfterVote => "after-vote",
            KillAt::AfterRecord => "after-record",
        }
    }

    fn parse(s: &str) -> Option<KillAt> {
        [KillAt::BeforeVote, KillAt::AfterVote, KillAt::AfterRecord]
            .into_iter()
            .find(|k| k.name() == s)
    }
}

/// etcd, with the process aborting around its commit round of step 3.
struct Aborting {
    inner: EtcdCoordinator,
    job: String,
    at: Option<KillAt>,
}

impl Coordinator for Aborting {
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn all_gather(
        &self,
        rank: u32,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> strata::Result<Vec<Vec<u8>>> {
        let round = key == format!("commit/{}/3", self.job);
        if round && self.at == Some(KillAt::BeforeVote) {
            std::process::abort();
        }
        let got = self.inner.all_gather(rank, key, value, timeout);
        if round && self.at == Some(KillAt::AfterVote) {
            std::process::abort();
        }
        got
    }
}

struct Rank<'a> {
    url: &'a str,
    job: &'a str,
    dir: &'a Path,
    rank: u32,
    world: u32,
    keep: usize,
}

fn open(r: &Rank<'_>, start: &str, at: Option<KillAt>) -> Checkpointer {
    let Rank {
        url,
        job,
        dir,
        rank,
        world,
        keep,
    } = *r;
    let opts = EtcdOptions {
        endpoints: vec![url.to_string()],
        lease_ttl: Duration::from_secs(2),
        incarnation: Some(start.to_string()),
        ..EtcdOptions::default()
    };
    let coord = EtcdCoordinator::connect(opts, job, rank, world).unwrap();
    let cfg = Config::builder()
        .job(job)
        .l1_dir(dir)
        .rank(rank, world)
        .chunk_size(16 * KIB as u32)
        .io_engine("psync")
        .keep_last(keep)
        .gc_grace_secs(0)
        .coordination_timeout_secs(30);
    Checkpointer::builder(cfg)
        .coordinator(Arc::new(Aborting {
            inner: coord,
            job: job.to_string(),
            at,
        }))
        .build()
        .unwrap()
}

fn save(ck: &Checkpointer, rank: u32, step: u64) -> strata::Result<()> {
    let d = state(rank, step);
    ck.save(step, &[Entry::tensor("w", DType::U8, &SHAPE, &d)])?
        .wait()
        .map(|_| ())
}

/// The child: one rank's process, in the phase the environment names.
#[test]
fn child_rank_of_the_roll_forward_kill_test() {
    let Ok(url) = std::env::var("STRATA_RF_ETCD") else {
        return; // only runs as a child of the tests below
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let (rank, world): (u32, u32) = (
        var("STRATA_RF_RANK").parse().unwrap(),
        var("STRATA_RF_WORLD").parse().unwrap(),
    );
    let keep: usize = var("STRATA_RF_KEEP").parse().unwrap();
    let dir = std::path::PathBuf::from(var("STRATA_RF_DIR"));
    let job = var("STRATA_RF_JOB");
    let at = std::env::var("STRATA_RF_KILL")
        .ok()
        .and_then(|k| KillAt::parse(&k));
    let me = Rank {
        url: &url,
        job: &job,
        dir: &dir,
        rank,
        world,
        keep,
    };
    match var("STRATA_RF_PHASE").as_str() {
        "save" => {
            let ck = open(&me, "0", at);
            save(&ck, rank, 1).unwrap();
            save(&ck, rank, 2).unwrap();
            let r = save(&ck, rank, 3);
            if at == Some(KillAt::AfterRecord) {
                r.as_ref().unwrap();
                std::process::abort();
            }
            println!("SAVED3 {}", r.is_ok());
        }
        _ => {
            let ck = open(&me, "1", None);
            let r = ck.restore(StepSelector::Latest).unwrap();
            assert_eq!(
                r.get("w").unwrap().bytes,
                state(rank, r.step),
                "rank {rank}"
            );
            save(&ck, rank, r.step + 1).unwrap();
            let again = ck.restore(StepSelector::Latest).unwrap();
            println!("RESTORED {} THEN {}", r.step, again.step);
        }
    }
}

fn run_phase(
    url: &str,
    job: &str,
    root: &Path,
    world: u32,
    keep: usize,
    phase: &str,
    kill: Option<(u32, KillAt)>,
) -> Vec<(bool, String)> {
    let children: Vec<_> = (0..world)
        .map(|rank| {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.args([
                "--exact",
                "child_rank_of_the_roll_forward_kill_test",
                "--nocapture",
            ])
            .env("STRATA_RF_ETCD", url)
            .env("STRATA_RF_JOB", job)
            .env("STRATA_RF_RANK", rank.to_string())
            .env("STRATA_RF_WORLD", world.to_string())
            .env("STRATA_RF_KEEP", keep.to_string())
            .env("STRATA_RF_DIR", root.join(format!("node-{rank}")))
            .env("STRATA_RF_PHASE", phase)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            if let Some((_, at)) = kill.filter(|(r, _)| *r == rank) {
                c.env("STRATA_RF_KILL", at.name());
            }
            c.spawn().unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let tail = &err[err.len().saturating_sub(3000)..];
            (
                out.status.success(),
                format!("{}\n{tail}", String::from_utf8_lossy(&out.stdout)),
            )
        })
        .collect()
}

fn scenario(url: &str, world: u32, keep: usize, victim: u32, at: KillAt) {
    let root = tempfile::tempdir().unwrap();
    let job = format!("rf-w{world}-k{keep}-{}", at.name());
    let saved = run_phase(
        url,
        &job,
        root.path(),
        world,
        keep,
        "save",
        Some((victim, at)),
    );
    for (rank, (ok, out)) in saved.iter().enumerate() {
        if rank as u32 == victim {
            assert!(!ok, "{at:?}: the victim was killed: {out}");
        } else {
            assert!(ok, "{at:?}: rank {rank}: {out}");
            let committed = at != KillAt::BeforeVote;
            assert!(
                out.contains(&format!("SAVED3 {committed}")),
                "{at:?} rank {rank}: {out}"
            );
        }
    }
    let want = if at == KillAt::BeforeVote { 2 } else { 3 };
    let resumed = run_phase(url, &job, root.path(), world, keep, "resume", None);
    let failed: Vec<String> = resumed
        .iter()
        .enumerate()
        .filter(|(_, (ok, _))| !ok)
        .map(|(rank, (_, out))| format!("rank {rank}: {out}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{at:?} keep {keep}: ranks failed to resume:\n{}",
        failed.join("\n")
    );
    for (rank, (_, out)) in resumed.iter().enumerate() {
        assert!(
            out.contains(&format!("RESTORED {want} THEN {}", want + 1)),
            "{at:?} keep {keep} world {world}: rank {rank}: {out}"
        );
    }
}

#[test]
fn a_rank_killed_at_each_point_of_the_commit_loses_no_step() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    for (world, victim) in [(2, 1), (4, 2)] {
        for keep in [1, 2] {
            for at in [KillAt::BeforeVote, KillAt::AfterVote, KillAt::AfterRecord] {
                scenario(&etcd.url, world, keep, victim, at);
            }
        }
    }
}

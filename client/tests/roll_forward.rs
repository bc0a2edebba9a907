//! A decided step commits on every rank, and a store that cannot be read is
//! never an empty one (`docs/commit-protocol.md`, "Roll-forward").
//!
//! Each rank has a disk of its own (ranks on separate nodes), so no rank
//! sees another's records on L1. A fault is injected into one rank's save
//! of step 3 at each point of the protocol: before its vote (its disk
//! fails the write), after its vote (the rank dies, or its coordinator
//! client sees an error for a vote that got through), its record write
//! failing, and after its record. Every checkpointer is then dropped (the
//! processes die) and new ones restore: every rank restores the same step,
//! no committed step is lost, and the loop goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::format::DType;
use strata::tiered::wrap::FaultTargets;
use strata::tiered::{ChunkStore, EngineChoice, FaultPlan, FaultStore, L1Store};
use strata::{
    Checkpointer, Config, Coordinator, Entry, Error, ErrorKind, InProcessCoordinator, StepSelector,
};

const KIB: usize = 1 << 10;
const SHAPE: [u64; 1] = [96 * KIB as u64];
const TIMEOUT: u64 = 20;

fn cfg(dir: &Path, rank: u32, world: u32, keep_last: usize) -> Config {
    Config::builder()
        .job("rf")
        .l1_dir(dir)
        .rank(rank, world)
        .chunk_size(32 * KIB as u32)
        .io_engine("psync")
        .keep_last(keep_last)
        .gc_grace_secs(0)
        .coordination_timeout_secs(TIMEOUT)
}

/// Rank `rank`'s state at `step` (`seed` varies a second run of a step).
fn state(rank: u32, step: u64, seed: u8) -> Vec<Vec<u8>> {
    (0..2u8)
        .map(|i| {
            (0..96 * KIB)
                .map(|j| (j as u8).wrapping_mul(13) ^ (rank as u8 * 7) ^ (step as u8) ^ i ^ seed)
                .collect()
        })
        .collect()
}

fn entries(d: &[Vec<u8>]) -> Vec<Entry<'_>> {
    vec![
        Entry::tensor("w0", DType::U8, &SHAPE, &d[0]),
        Entry::tensor("w1", DType::U8, &SHAPE, &d[1]),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The rank's disk fails the write: it votes no.
    BeforeVote,
    /// The rank's vote got through, then the rank failed (died, or its
    /// coordinator client reported an error for the vote).
    AfterVote,
    /// The rank's commit record write fails (a full disk, EIO).
    RecordFails,
    /// The rank dies right after its record.
    AfterRecord,
}

/// The coordinator as one rank sees it: its commit round of `step` fails
/// after the vote went through (the rank learns nothing of the result).
struct DiesAfterVote {
    inner: InProcessCoordinator,
    key: String,
}

impl Coordinator for DiesAfterVote {
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
        let got = self.inner.all_gather(rank, key, value, timeout);
        if key == self.key {
            return Err(Error::Coordination(
                "injected: the rank failed after its vote reached the coordinator".into(),
            ));
        }
        got
    }
}

fn faulty_l1(dir: &Path, targets: FaultTargets) -> Arc<dyn ChunkStore> {
    Arc::new(FaultStore::new(
        L1Store::open(dir, EngineChoice::Psync).unwrap(),
        FaultPlan {
            seed: 1,
            error_rate: 1.0,
            targets,
            ..FaultPlan::default()
        },
    ))
}

/// One rank's checkpointer as its process would build it, with the fault
/// on the faulty rank.
fn open(
    dir: &Path,
    rank: u32,
    world: u32,
    keep_last: usize,
    coord: &InProcessCoordinator,
    fault: Option<Fault>,
) -> Checkpointer {
    let mut b = Checkpointer::builder(cfg(dir, rank, world, keep_last));
    let no = FaultTargets {
        reads: false,
        writes: false,
        listing: false,
        commit: false,
    };
    b = match fault {
        Some(Fault::AfterVote) => b.coordinator(Arc::new(DiesAfterVote {
            inner: coord.clone(),
            key: "commit/rf/3".into(),
        })),
        _ => b.coordinator(Arc::new(coord.clone())),
    };
    b = match fault {
        Some(Fault::BeforeVote) => b.local(faulty_l1(dir, FaultTargets { writes: true, ..no })),
        Some(Fault::RecordFails) => b.local(faulty_l1(dir, FaultTargets { commit: true, ..no })),
        _ => b,
    };
    b.build().unwrap()
}

fn dirs(world: u32) -> (tempfile::TempDir, Vec<PathBuf>) {
    let root = tempfile::tempdir().unwrap();
    let dirs = (0..world)
        .map(|r| root.path().join(format!("node-{r}")))
        .collect();
    (root, dirs)
}

/// Every rank, on a thread, runs `f` with its checkpointer.
fn ranks<T: Send>(
    dirs: &[PathBuf],
    keep_last: usize,
    fault: Option<(u32, Fault)>,
    f: impl Fn(u32, &Checkpointer) -> T + Sync,
) -> Vec<T> {
    let world = dirs.len() as u32;
    let coord = InProcessCoordinator::new(world);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let (coord, f) = (&coord, &f);
                let fault = fault.filter(|(r, _)| *r == rank).map(|(_, p)| p);
                s.spawn(move || {
                    let ck = open(&dirs[rank as usize], rank, world, keep_last, coord, fault);
                    f(rank, &ck)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn save(ck: &Checkpointer, rank: u32, step: u64, seed: u8) -> strata::Result<()> {
    let d = state(rank, step, seed);
    ck.save(step, &entries(&d))?.wait().map(|_| ())
}

/// Saves steps 1 and 2 on every rank, then step 3 with `fault` on rank
/// `victim`; returns what each rank's save of step 3 said.
fn split(dirs: &[PathBuf], keep_last: usize, victim: u32, fault: Fault) -> Vec<bool> {
    ranks(dirs, keep_last, None, |rank, ck| {
        for step in [1, 2] {
            save(ck, rank, step, 0).unwrap();
        }
    });
    ranks(dirs, keep_last, Some((victim, fault)), |rank, ck| {
        save(ck, rank, 3, 0).is_ok()
    })
}

/// After the faulty save, new processes restore: every rank the same step,
/// with the bytes it saved; then the loop goes on.
fn restart_and_go_on(dirs: &[PathBuf], keep_last: usize, want: u64) {
    let got = ranks(dirs, keep_last, None, |rank, ck| {
        let latest = ck.plan_restore(StepSelector::Latest).unwrap().step();
        let r = ck.restore(StepSelector::Latest).unwrap();
        assert_eq!(r.step, latest);
        let d = state(rank, r.step, 0);
        assert_eq!(r.get("w0").unwrap().bytes, d[0], "rank {rank}");
        assert_eq!(r.get("w1").unwrap().bytes, d[1], "rank {rank}");
        // The loop goes on from the restored step.
        save(ck, rank, r.step + 1, 0).unwrap();
        let again = ck.restore(StepSelector::Latest).unwrap();
        (r.step, again.step)
    });
    for (rank, (step, next)) in got.iter().enumerate() {
        assert_eq!(
            *step, want,
            "rank {rank} restored step {step}, expected {want}"
        );
        assert_eq!(*next, want + 1, "rank {rank}");
    }
}

fn scenario(world: u32, keep_last: usize, victim: u32, fault: Fault) {
    let (_root, dirs) = dirs(world);
    let ok = split(&dirs, keep_last, victim, fault);
    for (rank, ok) in ok.iter().enumerate() {
        let expect = match fault {
            // Nobody commits a step a rank voted no on.
            Fault::BeforeVote => false,
            Fault::AfterVote | Fault::RecordFails => rank as u32 != victim,
            Fault::AfterRecord => true,
        };
        assert_eq!(*ok, expect, "{fault:?}: rank {rank}'s save of step 3");
    }
    let want = if fault == Fault::BeforeVote { 2 } else { 3 };
    restart_and_go_on(&dirs, keep_last, want);
}

#[test]
fn a_fault_at_each_point_of_the_protocol_loses_no_step_with_two_ranks() {
    for keep_last in [1, 2] {
        for fault in [
            Fault::BeforeVote,
            Fault::AfterVote,
            Fault::RecordFails,
            Fault::AfterRecord,
        ] {
            for victim in [0, 1] {
                scenario(2, keep_last, victim, fault);
            }
        }
    }
}

#[test]
fn a_fault_at_each_point_of_the_protocol_loses_no_step_with_four_ranks() {
    for keep_last in [1, 2] {
        for fault in [
            Fault::BeforeVote,
            Fault::AfterVote,
            Fault::RecordFails,
            Fault::AfterRecord,
        ] {
            scenario(4, keep_last, 2, fault);
        }
    }
}

#[test]
fn a_resumed_save_of_a_split_step_converges_on_every_rank() {
    let (_root, dirs) = dirs(2);
    let ok = split(&dirs, 2, 1, Fault::RecordFails);
    assert_eq!(ok, vec![true, false]);
    // The job restarts and saves step 3 again (other bytes: a loop that
    // resumed from step 2) without restoring first. Every rank refuses,
    // none waits at the barrier for the timeout.
    let t = Instant::now();
    let got = ranks(&dirs, 2, None, |rank, ck| save(ck, rank, 3, 99));
    assert!(
        t.elapsed() < Duration::from_secs(TIMEOUT / 2),
        "a rank waited at the barrier: {:?}",
        t.elapsed()
    );
    for (rank, r) in got.iter().enumerate() {
        let e = r.as_ref().expect_err("step 3 was decided before");
        assert!(
            matches!(e, Error::AlreadyCommitted { step: 3, .. }),
            "rank {rank}: {e}"
        );
        assert_eq!(e.kind(), ErrorKind::Conflict);
    }
    // Step 3 is committed on every rank with the bytes decided the first
    // time (never a mix of two runs of the step), and the loop goes on.
    restart_and_go_on(&dirs, 2, 3);
}

#[test]
fn a_rank_that_voted_and_lost_its_record_restores_the_step_the_others_kept() {
    // keep_last = 1: the ranks that committed step 3 deleted step 2, so
    // without roll-forward no step is common and the job starts over.
    let (_root, dirs) = dirs(2);
    split(&dirs, 1, 0, Fault::AfterVote);
    let l1 = L1Store::open(&dirs[1], EngineChoice::Psync).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let on_1: Vec<u64> = rt
        .block_on(l1.list_steps("rf"))
        .unwrap()
        .iter()
        .filter(|s| s.committed_ranks().contains(&1))
        .map(|s| s.step)
        .collect();
    assert_eq!(on_1, vec![3], "rank 1 kept only its newest step");
    restart_and_go_on(&dirs, 1, 3);
}

/// An L3 that holds the newest step and cannot be listed.
#[test]
fn an_unreadable_l3_is_an_error_naming_it_not_an_empty_store() {
    let root = tempfile::tempdir().unwrap();
    let (l1, l3) = (root.path().join("l1"), root.path().join("l3"));
    {
        let remote: Arc<dyn ChunkStore> =
            Arc::new(L1Store::open(&l3, EngineChoice::Psync).unwrap());
        let ck = Checkpointer::builder(cfg(&l1, 0, 1, 1).upload_every(1))
            .remote(Some(remote))
            .build()
            .unwrap();
        for step in 1..=3 {
            let d = state(0, step, 0);
            ck.save(step, &entries(&d))
                .unwrap()
                .wait_for(strata::Target::L3, Some(Duration::from_secs(30)))
                .unwrap();
        }
    }
    // The node's disk is lost; the object store is down.
    std::fs::remove_dir_all(&l1).unwrap();
    let down = Arc::new(FaultStore::new(
        L1Store::open(&l3, EngineChoice::Psync).unwrap(),
        FaultPlan {
            outage_after: Some(0),
            ..FaultPlan::default()
        },
    ));
    let remote: Arc<dyn ChunkStore> = down.clone();
    let ck = Checkpointer::builder(cfg(&l1, 0, 1, 1))
        .remote(Some(remote.clone()))
        .build()
        .unwrap();
    let e = ck.plan_restore(StepSelector::Latest).unwrap_err();
    assert!(matches!(e, Error::TierUnavailable { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("L3"), "{e}");
    let e = ck.restore(StepSelector::Latest).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    drop(ck);
    // Going on without it is the user's explicit choice.
    let ck = Checkpointer::builder(cfg(&l1, 0, 1, 1).skip_unreadable_tiers(true))
        .remote(Some(remote.clone()))
        .build()
        .unwrap();
    let e = ck.plan_restore(StepSelector::Latest).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    // Back up: the newest step is there.
    down.heal();
    let r = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(r.step, 3);
    assert_eq!(r.get("w0").unwrap().bytes, state(0, 3, 0)[0]);
}

#[test]
fn steps_of_another_world_size_are_an_error_naming_both_sizes() {
    let (_root, dirs) = dirs(2);
    ranks(&dirs, 2, None, |rank, ck| save(ck, rank, 1, 0).unwrap());
    // The job comes back with one rank, on rank 0's node.
    let ck = Checkpointer::new(cfg(&dirs[0], 0, 1, 2)).unwrap();
    let e = ck.plan_restore(StepSelector::Latest).unwrap_err();
    assert!(matches!(e, Error::WorldSizeMismatch { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("world of 2") && text.contains("runs 1"),
        "{text}"
    );
    assert_eq!(e.kind(), ErrorKind::Invalid);
}

//! Deleting steps and rolling back across every tier: two ranks on one
//! node save steps to L1, a peer each (QUIC, in this process) and L3; a
//! rollback restores an older step and retires every newer one in all
//! three tiers, so the latest step and retention follow the branch being
//! trained; the discarded step numbers can be saved again, and a lost
//! disk restores the new branch; a pinned step is refused on every rank
//! before anything is deleted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use strata::format::DType;
use strata::tiers::Tiers;
use strata::{Checkpointer, Config, Entry, ErrorKind, InProcessCoordinator, StepSelector};
use strata_peer::replicas::Limits;
use strata_peer::service::{Service, ServiceConfig};
use strata_peer::tls::{make_certs, CertFiles};

const JOB: &str = "rollback";

struct Peers {
    _rt: tokio::runtime::Runtime,
    list: Vec<String>,
    dir: tempfile::TempDir,
}

fn peers() -> Peers {
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<String> = ["node-a", "node-b"].map(String::from).to_vec();
    make_certs(dir.path(), &nodes, &[], &[JOB.into()]).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = ServiceConfig {
        node: "node-b".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        certs: CertFiles::in_dir(dir.path(), "node-b"),
        spill: dir.path().join("spill-node-b"),
        limits: Limits::default(),
        max_streams: 32,
        inflight_bytes: 256 << 20,
        max_request: ServiceConfig::DEFAULT_MAX_REQUEST,
        work_bytes: ServiceConfig::DEFAULT_WORK_BYTES,
        max_connections: ServiceConfig::DEFAULT_MAX_CONNECTIONS,
    };
    let svc = rt.block_on(async { Service::bind(&cfg).unwrap() });
    rt.spawn(svc.clone().run());
    let list = vec![format!("node-b={}", svc.local_addr().unwrap())];
    Peers { _rt: rt, list, dir }
}

fn cfg(l1: &Path, l3: &Path, p: &Peers, rank: u32) -> Config {
    Config::builder()
        .job(JOB)
        .l1_dir(l1)
        .chunk_size(1 << 16)
        .keep_last(3)
        .l3_url(format!("file://{}", l3.display()))
        .upload_every(1)
        .peers("node-a", p.list.clone(), p.dir.path())
        .replicas(1)
        .rank(rank, 2)
}

/// Rank `rank`'s state at `step` on branch `branch`.
fn state(rank: u32, step: u64, branch: u8) -> Vec<u8> {
    (0..100_000u32)
        .map(|i| (i as u64 ^ step.wrapping_mul(31) ^ u64::from(rank) << 3) as u8 ^ branch)
        .collect()
}

fn save(ck: &Checkpointer, rank: u32, step: u64, branch: u8) {
    let bytes = state(rank, step, branch);
    let shape = [bytes.len() as u64];
    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &bytes)])
        .unwrap()
        .wait()
        .unwrap();
    ck.wait_replication();
    ck.wait_uploads();
}

/// Runs `f` on both ranks at once (they agree through one coordinator).
fn both<T: Send>(
    l1: &Path,
    l3: &Path,
    p: &Peers,
    f: impl Fn(&Checkpointer, u32) -> T + Sync,
) -> Vec<T> {
    let coord = InProcessCoordinator::new(2);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..2u32)
            .map(|rank| {
                let (coord, f) = (coord.clone(), &f);
                let cfg = cfg(l1, l3, p, rank);
                sc.spawn(move || {
                    let ck = Checkpointer::with_coordinator(cfg, Arc::new(coord)).unwrap();
                    f(&ck, rank)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The steps each tier holds any file of (manifest, record, marker), for
/// either rank.
fn held(l1: &Path, l3: &Path, p: &Peers) -> Vec<(String, BTreeSet<u64>)> {
    let t = Tiers::open(cfg(l1, l3, p, 0), true).unwrap();
    let catalog = t.catalog(&t.tiers().iter().collect::<Vec<_>>());
    catalog
        .listings()
        .iter()
        .map(|l| {
            let steps = l.steps.as_ref().unwrap();
            (
                l.tier.name.clone(),
                steps
                    .iter()
                    .filter(|st| !st.manifests.is_empty() || !st.records.is_empty())
                    .map(|st| st.step)
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn a_rollback_retires_the_newer_steps_in_every_tier_and_training_goes_on_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let (l1, l3) = (dir.path().join("l1"), dir.path().join("l3"));
    let p = peers();
    both(&l1, &l3, &p, |ck, rank| {
        for step in 1..=5 {
            save(ck, rank, step, 0);
        }
    });
    // (The peer keeps the newest two.)
    for (tier, steps) in held(&l1, &l3, &p) {
        assert!(
            steps.is_superset(&BTreeSet::from([4, 5])),
            "{tier}: {steps:?}"
        );
    }
    // A loss spike after step 3: roll back to it.
    let restored = both(&l1, &l3, &p, |ck, rank| {
        let got = ck.rollback(3).unwrap();
        assert_eq!(got.step, 3);
        assert_eq!(got.get("w").unwrap().bytes, state(rank, 3, 0));
        ck.steps().unwrap().iter().map(|s| s.step).max()
    });
    assert_eq!(restored, [Some(3), Some(3)]);
    for (tier, steps) in held(&l1, &l3, &p) {
        assert!(
            steps.iter().all(|&s| s <= 3),
            "{tier} still holds {steps:?}"
        );
        assert!(
            steps.contains(&3) || tier.starts_with("L2"),
            "{tier}: {steps:?}"
        );
    }
    // Training goes on from step 3 on a new branch: steps 4 and 5 are
    // saved again (not refused as committed), and they are the latest.
    both(&l1, &l3, &p, |ck, rank| {
        for step in 4..=5 {
            save(ck, rank, step, 1);
        }
    });
    both(&l1, &l3, &p, |ck, rank| {
        let got = ck.restore(StepSelector::Latest).unwrap();
        assert_eq!(got.step, 5);
        assert_eq!(got.get("w").unwrap().bytes, state(rank, 5, 1));
    });
    // And a lost disk restores the new branch from the peer and L3.
    std::fs::remove_dir_all(&l1).unwrap();
    both(&l1, &l3, &p, |ck, rank| {
        let got = ck.restore(StepSelector::Latest).unwrap();
        assert_eq!(got.step, 5);
        assert_eq!(got.get("w").unwrap().bytes, state(rank, 5, 1));
    });
}

#[test]
fn a_pinned_step_is_refused_on_every_rank_before_anything_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (l1, l3) = (dir.path().join("l1"), dir.path().join("l3"));
    let p = peers();
    both(&l1, &l3, &p, |ck, rank| {
        for step in 1..=3 {
            save(ck, rank, step, 0);
        }
    });
    // Step 3 pinned on L3 only.
    let t = Tiers::open(cfg(&l1, &l3, &p, 0), true).unwrap();
    let l3_tier = t.tiers().iter().find(|t| t.name == "L3").unwrap().clone();
    t.block_on(l3_tier.store.set_pin(JOB, 3, true)).unwrap();
    let errs = both(&l1, &l3, &p, |ck, _| ck.delete(&[2, 3]).unwrap_err());
    assert!(
        errs.iter().all(|e| e.kind() == ErrorKind::Invalid),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|e| e.to_string().contains("pinned")),
        "{errs:?}"
    );
    for (tier, steps) in held(&l1, &l3, &p) {
        assert!(steps.contains(&3), "{tier}: {steps:?}");
        assert!(
            steps.contains(&2) || tier.starts_with("L2"),
            "{tier}: {steps:?}"
        );
    }
    // Unpinned, the deletion goes through; step 1 is the latest.
    t.block_on(l3_tier.store.set_pin(JOB, 3, false)).unwrap();
    let deleted = both(&l1, &l3, &p, |ck, _| ck.delete(&[2, 3, 99]).unwrap());
    assert_eq!(deleted, [vec![2, 3], vec![2, 3]]);
    both(&l1, &l3, &p, |ck, _| {
        assert_eq!(ck.restore(StepSelector::Latest).unwrap().step, 1);
    });
}

/// A rollback where one rank's restore fails after the ranks agreed on the
/// step (its chunk of it is damaged and no other tier holds one): that rank
/// still takes part in the deletion's rounds, voting no, so no rank
/// deletes anything and none waits for it until the timeout.
#[test]
fn a_rank_whose_restore_fails_makes_every_rank_keep_the_newer_steps_at_once() {
    use strata::tiered::{EngineChoice, L1Store};
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    let local = |rank: u32| {
        let mut c = Config::builder()
            .job(JOB)
            .l1_dir(&l1)
            .chunk_size(1 << 16)
            .keep_last(5)
            .rank(rank, 2);
        c.coordination_timeout_secs = 30;
        c
    };
    let coord = InProcessCoordinator::new(2);
    let run = |f: &(dyn Fn(&Checkpointer, u32) + Sync)| {
        std::thread::scope(|sc| {
            for rank in 0..2u32 {
                let (coord, cfg) = (coord.clone(), local(rank));
                sc.spawn(move || {
                    let ck = Checkpointer::with_coordinator(cfg, Arc::new(coord)).unwrap();
                    f(&ck, rank)
                });
            }
        })
    };
    run(&|ck, rank| {
        for step in 1..=3 {
            let bytes = state(rank, step, 0);
            let shape = [bytes.len() as u64];
            ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &bytes)])
                .unwrap()
                .wait()
                .unwrap();
        }
    });
    // Rank 1's chunks of step 2, damaged.
    let store = L1Store::open(&l1, EngineChoice::Psync).unwrap();
    let m = std::fs::read(store.manifest_path(JOB, 2, 1)).unwrap();
    let m = strata::format::ShardManifest::decode(&m).unwrap();
    for c in &m.chunks {
        let p = store.chunk_path(JOB, &c.id);
        let mut b = std::fs::read(&p).unwrap();
        b[0] ^= 1;
        std::fs::write(&p, b).unwrap();
    }
    let started = std::time::Instant::now();
    run(&|ck, rank| {
        let e = ck.rollback(2).unwrap_err();
        if rank == 0 {
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
            assert!(e.to_string().contains("nothing was deleted"), "{e}");
        }
        assert!(ck.steps().unwrap().iter().any(|s| s.step == 3), "{e}");
    });
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "a rank waited for the other: {:?}",
        started.elapsed()
    );
}

//! The commit protocol and the tier stack, end to end: a committed step is
//! never saved again, restore falls back past an unusable step, retention
//! touches only its own rank's files, the upload decision is the same on
//! every rank, one bad commit record hides only its shard, errors keep
//! their kind, and a save's handle waits for a target.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use strata::format::DType;
use strata::tiered::{ChunkStore, MemoryStore};
use strata::{
    Checkpointer, Config, Entry, Error, ErrorKind, InProcessCoordinator, L3State, StepSelector,
    Target, TierStack,
};
use strata_tiered::ChunkStoreExt;

const KIB: usize = 1 << 10;
const SHAPE: [u64; 1] = [200 * KIB as u64];

fn cfg(dir: &std::path::Path) -> Config {
    Config::builder()
        .job("p")
        .l1_dir(dir)
        .chunk_size(64 * KIB as u32)
        .io_engine("psync")
        .gc_grace_secs(0)
}

/// Two tensors and a blob whose bytes depend on `seed`.
fn state(seed: u8) -> Vec<Vec<u8>> {
    (0..2)
        .map(|i| {
            (0..200 * KIB)
                .map(|j| (j as u8).wrapping_mul(31) ^ seed ^ (i as u8) ^ (j >> 9) as u8)
                .collect()
        })
        .chain(std::iter::once(vec![seed; 100]))
        .collect()
}

fn entries(d: &[Vec<u8>]) -> Vec<Entry<'_>> {
    vec![
        Entry::tensor("w0", DType::U8, &SHAPE, &d[0]),
        Entry::tensor("w1", DType::U8, &SHAPE, &d[1]),
        Entry::blob("rng", &d[2]),
    ]
}

#[test]
fn a_committed_step_is_never_saved_again_and_stays_intact() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (state(1), state(2));
    {
        let ck = Checkpointer::new(cfg(dir.path())).unwrap();
        ck.save(5, &entries(&a)).unwrap().wait().unwrap();
        let m = std::fs::read(ck.l1().unwrap().manifest_path("p", 5, 0)).unwrap();
        // The same process saving step 5 again (a loop that resumed at 5).
        let e = ck.save(5, &entries(&b)).err().expect("refused");
        assert!(matches!(e, Error::AlreadyCommitted { step: 5, .. }), "{e}");
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert_eq!(
            std::fs::read(ck.l1().unwrap().manifest_path("p", 5, 0)).unwrap(),
            m,
            "nothing was written"
        );
    }
    // A new process on the same disk (a job restarted and rolled back).
    let ck = Checkpointer::new(cfg(dir.path())).unwrap();
    assert_eq!(
        ck.save(5, &entries(&b)).err().map(|e| e.kind()),
        Some(ErrorKind::Conflict)
    );
    ck.save(6, &entries(&b)).unwrap().wait().unwrap();
    let got = ck.restore(StepSelector::Step(5)).unwrap();
    assert_eq!(got.get("w0").unwrap().bytes, a[0], "step 5 is still step 5");
    // The tier itself refuses to replace a committed shard's manifest.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt
        .block_on(ck.local().put_manifest("p", 5, 0, b"other bytes"))
        .unwrap_err();
    assert_eq!(e.kind(), strata::tiered::StoreErrorKind::AlreadyExists);
}

#[test]
fn ranks_sharing_one_disk_retire_only_their_own_shards() {
    // Two ranks of one node share its L1; rank 0 keeps one step, rank 1
    // keeps three. Rank 0's retention must not take rank 1's steps.
    let dir = tempfile::tempdir().unwrap();
    let coord = InProcessCoordinator::new(2);
    let data: Vec<Vec<Vec<u8>>> = (0..2).map(|r| state(10 + r)).collect();
    std::thread::scope(|sc| {
        for rank in 0..2u32 {
            let coord = coord.clone();
            let data = &data;
            let dir = dir.path();
            sc.spawn(move || {
                // A grace period, as in production: the other rank's new
                // chunks are unreferenced until its manifest lands.
                let c = cfg(dir)
                    .rank(rank, 2)
                    .gc_grace_secs(3600)
                    .keep_last(if rank == 0 { 1 } else { 3 });
                let ck = Checkpointer::with_coordinator(c, Arc::new(coord)).unwrap();
                for step in 1..=4u64 {
                    let mut d = data[rank as usize].clone();
                    d[0][0] = step as u8;
                    ck.save(step, &entries(&d)).unwrap().wait().unwrap();
                }
            });
        }
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l1 =
        strata::tiered::L1Store::open(dir.path(), strata::tiered::EngineChoice::Psync).unwrap();
    let steps = rt.block_on(l1.list_steps("p")).unwrap();
    for st in &steps {
        let r1 = st.committed_ranks().contains(&1);
        let r0 = st.committed_ranks().contains(&0);
        assert_eq!(r0, st.step == 4, "rank 0 keeps only step 4: {st:?}");
        assert_eq!(r1, st.step >= 2, "rank 1 keeps steps 2..=4: {st:?}");
        assert!(st.retiring.is_empty(), "{st:?}");
    }
    // Rank 1's kept steps are whole: every chunk its manifests name
    // survived rank 0's sweeps and reads back verified.
    for step in 2..=4u64 {
        let m = strata::format::ShardManifest::decode(
            &rt.block_on(l1.get_manifest("p", step, 1)).unwrap(),
        )
        .unwrap();
        let ids: Vec<_> = m.chunks.iter().map(|c| c.id).collect();
        for r in rt.block_on(l1.get_chunks("p", &ids)) {
            r.unwrap();
        }
    }
}

#[test]
fn the_upload_decision_is_rank_zeros_so_l3_gets_whole_steps() {
    // Rank 0 uploads at most once an hour, rank 1 every step: before, the
    // ranks' own timers drifted apart and L3 held no complete step after
    // the first. Now rank 1 follows rank 0.
    let l3: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let coord = InProcessCoordinator::new(2);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let uploads: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2u32)
            .map(|rank| {
                let (coord, l3) = (coord.clone(), l3.clone());
                let dir = dirs[rank as usize].path();
                sc.spawn(move || {
                    let mut c = cfg(dir).rank(rank, 2).upload_every(1);
                    c.upload_min_interval_secs = if rank == 0 { 3600 } else { 0 };
                    let ck = Checkpointer::builder(c)
                        .coordinator(Arc::new(coord))
                        .remote(Some(l3))
                        .build()
                        .unwrap();
                    for step in 1..=3u64 {
                        ck.save(step, &entries(&state(step as u8)))
                            .unwrap()
                            .wait()
                            .unwrap();
                    }
                    ck.wait_uploads();
                    ck.uploads()
                        .into_iter()
                        .filter(|(_, st)| matches!(st, L3State::Committed { .. }))
                        .map(|(s, _)| s)
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(uploads[0], vec![1]);
    assert_eq!(uploads[1], uploads[0], "rank 1 follows rank 0");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let steps = rt.block_on(l3.list_steps("p")).unwrap();
    assert!(steps.iter().all(|s| s.is_complete()), "{steps:?}");
}

#[test]
fn one_unreadable_commit_record_on_l3_hides_only_its_step() {
    let l3 = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    {
        let ck = Checkpointer::builder(cfg(dir.path()).upload_every(1))
            .remote(Some(l3.clone() as Arc<dyn ChunkStore>))
            .build()
            .unwrap();
        for step in 1..=3u64 {
            ck.save(step, &entries(&state(step as u8)))
                .unwrap()
                .wait()
                .unwrap();
        }
        ck.wait_uploads();
    }
    // Step 3's record is damaged; step 2's is a record from a newer format.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let good = rt.block_on(l3.list_steps("p")).unwrap();
    let rec2 = good[1].records[&0].encode().unwrap();
    let mut future = rec2.clone();
    future[4] = 200; // the version byte after the magic
    l3.corrupt_record("p", 2, 0, &future).unwrap();
    l3.corrupt_record("p", 3, 0, b"garbage").unwrap();
    let listed = rt.block_on(l3.list_steps("p")).unwrap();
    assert_eq!(listed.len(), 3, "every step is still listed");
    assert!(listed[1].unreadable.contains_key(&0) && listed[1].records.is_empty());
    assert!(listed[2].unreadable.contains_key(&0));
    // The node lost its disk: restore comes from L3, newest readable step.
    std::fs::remove_dir_all(dir.path()).unwrap();
    let ck = Checkpointer::builder(cfg(dir.path()).upload_every(1))
        .remote(Some(l3.clone() as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 1);
    assert_eq!(got.get("w1").unwrap().bytes, state(1)[1]);
}

#[test]
fn a_users_own_store_is_a_tier_and_errors_keep_their_kind() {
    // The whole stack from the caller: a memory store as the local tier.
    let local: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpointer::builder(cfg(&dir.path().join("unused")))
        .tiers(TierStack::local(local.clone()))
        .build()
        .unwrap();
    assert!(ck.l1().is_none());
    assert_eq!(ck.engine_name(), "memory");
    let a = state(3);
    let h = ck.save(1, &entries(&a)).unwrap();
    h.wait_for(Target::L1, Some(Duration::from_secs(30)))
        .unwrap();
    assert!(
        !dir.path().join("unused").exists(),
        "L1 on disk was never opened"
    );
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.get("w0").unwrap().bytes, a[0]);
    // No peers, no L3: waiting for them says so.
    assert_eq!(
        h.wait_for(Target::Peers, None).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    assert_eq!(
        h.wait_for(Target::L3, None).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    // Two buffers for one entry are refused.
    let (mut x, mut y) = (vec![0u8; a[0].len()], vec![0u8; a[0].len()]);
    let e = ck
        .restore_into(StepSelector::Latest, &mut [("w0", &mut x), ("w0", &mut y)])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[test]
fn a_failed_save_reports_the_same_error_to_every_wait() {
    // Two ranks, one of which never comes: the barrier times out.
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path()).rank(0, 2).coordination_timeout_secs(1);
    let ck = Checkpointer::with_coordinator(c, Arc::new(InProcessCoordinator::new(2))).unwrap();
    let h = ck.save(1, &entries(&state(1))).unwrap();
    let first = h.wait().unwrap_err();
    let second = h.wait().unwrap_err();
    assert_eq!(first.kind(), ErrorKind::Unavailable);
    assert_eq!(second.kind(), first.kind());
    assert_eq!(second.to_string(), first.to_string());
    assert!(matches!(second, Error::Coordination(_)), "{second:?}");
    let third = h
        .wait_for(Target::L1, Some(Duration::from_millis(10)))
        .unwrap_err();
    assert_eq!(third.kind(), ErrorKind::Unavailable);
}

#[test]
fn wait_for_l3_is_woken_when_the_upload_commits() {
    let l3: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpointer::builder(cfg(dir.path()).upload_every(2))
        .remote(Some(l3.clone()))
        .build()
        .unwrap();
    let h1 = ck.save(1, &entries(&state(1))).unwrap();
    let h2 = ck.save(2, &entries(&state(2))).unwrap();
    h2.wait_for(Target::L3, Some(Duration::from_secs(60)))
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let on_l3 = rt.block_on(l3.list_steps("p")).unwrap();
    assert!(on_l3.iter().any(|s| s.step == 2 && s.is_complete()));
    // Step 1 was not picked by the policy: waiting for it says how.
    let e = h1
        .wait_for(Target::L3, Some(Duration::from_secs(5)))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("upload(1)"), "{e}");
}

#[test]
fn a_rank_whose_clock_runs_ten_minutes_ahead_deletes_nothing_early() {
    // Two ranks share one local tier (a node's L1 on a shared file
    // system); the tier's clock stands at T, rank 1's at T + 10 min. A
    // chunk another writer put a moment ago (a save in flight, its
    // manifest not yet written) is unreferenced but fresh: the 5-minute
    // grace period, measured by the tier's clock, keeps it.
    use std::time::SystemTime;
    use strata::tiered::ManualClock;
    let t = SystemTime::now();
    let tier_clock = ManualClock::new(t);
    let shared = Arc::new(MemoryStore::with_clock(Arc::new(tier_clock)));
    let in_flight = vec![9u8; 1000];
    let id = strata::format::ChunkId::of(&in_flight);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(shared.put_chunks(
        "p",
        vec![strata::tiered::ChunkPut {
            id,
            hint: strata::format::codec::ElemHint {
                size: 1,
                float: false,
            },
            data: strata::tiered::ChunkData::copy_from(&in_flight),
        }],
    ))
    .unwrap();
    let coord = InProcessCoordinator::new(2);
    let dir = tempfile::tempdir().unwrap();
    std::thread::scope(|sc| {
        for rank in 0..2u32 {
            let (coord, shared) = (coord.clone(), shared.clone());
            let dir = dir.path();
            sc.spawn(move || {
                let skew = if rank == 1 {
                    Duration::from_secs(600)
                } else {
                    Duration::ZERO
                };
                let c = cfg(dir).rank(rank, 2).gc_grace_secs(300).keep_last(1);
                let ck = Checkpointer::builder(c)
                    .coordinator(Arc::new(coord))
                    .tiers(TierStack::local(shared))
                    .clock(Arc::new(ManualClock::new(t + skew)))
                    .build()
                    .unwrap();
                for step in 1..=3u64 {
                    ck.save(step, &entries(&state(step as u8 + rank as u8 * 50)))
                        .unwrap()
                        .wait()
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(
        rt.block_on(shared.has_chunks("p", &[id])).unwrap(),
        [true],
        "the fresh chunk survived both ranks' retention"
    );
}

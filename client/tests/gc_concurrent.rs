//! Saves, uploads, replication and garbage collection at once, for many
//! steps: three ranks on threads sharing one L1 directory, a peer, and an
//! L3 that fails one call in ten (behind retries). At the end every step a
//! tier holds committed restores byte-identical from that tier; and once
//! one more collection has run (what the next save, upload or `strata gc`
//! does), no tier holds a chunk no manifest references (that collection's
//! grace period is zero). L1, shared by the three ranks, collects with a
//! grace period as in production (with zero, one rank's retention may
//! delete the chunks another rank wrote before its manifest); L3, with three ranks uploading, with the shortest one its
//! contract allows (1 s, and reused chunks older than half of it written
//! again: docs/gc.md; zero is safe with one uploader only, and here lost a
//! chunk of a committed L3 step about one run in twenty under load). Two
//! ranks collecting at the same moment can each still see
//! the other's last manifest of a chunk they both retire, so such a chunk
//! waits for the next collection: it is never leaked for good.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use strata::format::{DType, ShardManifest};
use strata::tiered::{
    ChunkStore, FaultPlan, FaultStore, L1Store, L3Options, L3Store, MemoryStore, RetryPolicy,
    RetryStore,
};
use strata::{Checkpointer, Config, Entry, InProcessCoordinator, UploadBacklog};
use strata_tiered::ChunkStoreExt;

const RANKS: u32 = 3;
const STEPS: u64 = 30;
const JOB: &str = "conc";

/// Rank `rank`'s state at `step`: a block every rank and step shares, a
/// block every rank shares at this step (data-parallel weights), one of its
/// own.
fn state(rank: u32, step: u64) -> Vec<u8> {
    let mut v = vec![1u8; 1 << 16];
    v.extend((0..1u32 << 16).map(|i| (i as u64 * 31 + step) as u8));
    v.extend((0..1u32 << 16).map(|i| (i as u64 * 17 + step * 7 + u64::from(rank)) as u8));
    v
}

fn chunk_ids(bytes: &[u8]) -> Vec<strata::format::ChunkId> {
    bytes
        .chunks(1 << 16)
        .map(strata::format::ChunkId::of)
        .collect()
}

/// Every committed shard of `store` matches `state` byte for byte and every
/// chunk it names reads back verified; no chunk is unreferenced.
fn check_tier(rt: &tokio::runtime::Runtime, name: &str, store: &dyn ChunkStore) -> usize {
    let steps = rt.block_on(store.list_steps(JOB)).unwrap();
    let mut referenced = HashSet::new();
    let mut shards = 0;
    for st in &steps {
        for &rank in &st.manifests {
            let m = ShardManifest::decode(
                &rt.block_on(store.get_manifest(JOB, st.step, rank)).unwrap(),
            )
            .unwrap();
            let ids: Vec<_> = m.chunks.iter().map(|c| c.id).collect();
            referenced.extend(ids.iter().copied());
            if !st.committed_ranks().contains(&rank) {
                continue;
            }
            // The manifest names the state's own chunks, in order.
            assert_eq!(
                ids,
                chunk_ids(&state(rank, st.step)),
                "{name}: step {} rank {rank}",
                st.step
            );
            // The shard's bytes, rebuilt from its chunks (each verified).
            let chunks = rt.block_on(store.get_chunks(JOB, &ids));
            let mut bytes = Vec::new();
            for e in &m.entries {
                for seg in &e.segments {
                    let c = chunks[seg.chunk as usize].as_ref().unwrap_or_else(|err| {
                        panic!("{name}: step {} rank {rank}: {err}", st.step)
                    });
                    let at = seg.offset as usize;
                    bytes.extend_from_slice(&c.as_slice()[at..at + seg.len as usize]);
                }
            }
            assert_eq!(
                bytes,
                state(rank, st.step),
                "{name}: step {} rank {rank}",
                st.step
            );
            shards += 1;
        }
    }
    let held: HashSet<_> = rt
        .block_on(store.list_chunks(JOB))
        .unwrap()
        .into_iter()
        .collect();
    let stray: Vec<_> = held.difference(&referenced).collect();
    assert!(
        stray.is_empty(),
        "{name}: {} unreferenced chunks left",
        stray.len()
    );
    shards
}

#[test]
fn saves_uploads_replication_and_gc_at_once_keep_every_retained_step_whole() {
    let dir = tempfile::tempdir().unwrap();
    let flaky: Arc<dyn ChunkStore> = Arc::new(RetryStore::with_policy(
        FaultStore::new(
            L3Store::with_store(
                Arc::new(object_store::memory::InMemory::new()),
                "root",
                "memory://l3",
                L3Options {
                    refresh_after: Some(Duration::from_millis(500)),
                    ..L3Options::default()
                },
            ),
            FaultPlan {
                seed: 7,
                error_rate: 0.1,
                ..FaultPlan::default()
            },
        ),
        RetryPolicy {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(20),
            deadline: Duration::from_secs(30),
            seed: 3,
        },
    ));
    let peer: Arc<dyn ChunkStore> = Arc::new(MemoryStore::new());
    let coord = InProcessCoordinator::new(RANKS);
    std::thread::scope(|sc| {
        for rank in 0..RANKS {
            let (coord, flaky, peer) = (coord.clone(), flaky.clone(), peer.clone());
            let dir = dir.path();
            sc.spawn(move || {
                let mut c = Config::builder()
                    .job(JOB)
                    .l1_dir(dir)
                    .chunk_size(1 << 16)
                    .rank(rank, RANKS)
                    .keep_last(2)
                    .gc_grace_secs(3600)
                    .upload_every(2);
                c.l3_keep_last = 3;
                c.l3_gc_grace_secs = 1;
                c.upload_backlog = UploadBacklog::Wait;
                let ck = Checkpointer::builder(c)
                    .coordinator(Arc::new(coord))
                    .peers(vec![strata::Tier::peer("peer", peer)])
                    .remote(Some(flaky))
                    .build()
                    .unwrap();
                for step in 1..=STEPS {
                    let b = state(rank, step);
                    let shape = [b.len() as u64];
                    // Not waited for: the next save overlaps this one's
                    // persist, push, upload and collections.
                    ck.save(step, &[Entry::tensor("w", DType::U8, &shape, &b)])
                        .unwrap();
                }
                ck.flush().unwrap();
                ck.wait_replication();
                ck.wait_uploads();
                let states = ck.uploads();
                assert!(
                    states
                        .values()
                        .all(|s| matches!(s, strata::L3State::Committed { .. })),
                    "rank {rank}: {states:?}"
                );
            });
        }
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l1 = L1Store::open(dir.path(), strata::tiered::EngineChoice::Psync).unwrap();
    // Every kept step is whole right away.
    assert!(check_tier_whole(&rt, &l1) >= 2 * RANKS as usize);
    assert!(check_tier_whole(&rt, &*flaky) >= 3 * RANKS as usize);
    // One more collection of each tier, as the next one would run.
    for (store, keep, evidence) in [
        (&l1 as &dyn ChunkStore, 2, strata_gc::Evidence::AnyRecord),
        (&*flaky, 3, strata_gc::Evidence::EveryRank),
    ] {
        let policy = strata_gc::Retention {
            keep_last: keep,
            keep_every: 0,
            keep_within: None,
            grace: Duration::ZERO,
        };
        let opts = strata_gc::Options {
            evidence,
            ..Default::default()
        };
        // (On L3 a rank that finished first collected while the others'
        // last uploads were still running, so it may still hold one more
        // step of its own: this run retires it, as its next upload would.)
        let (_, r) = rt
            .block_on(strata_gc::collect(store, JOB, &policy, &opts))
            .unwrap();
        let newest: Vec<u64> = (1..=STEPS)
            .rev()
            .filter(|s| s % if keep == 3 { 2 } else { 1 } == 0)
            .take(keep)
            .collect();
        assert_eq!(
            r.kept.iter().rev().copied().collect::<Vec<_>>(),
            newest,
            "{r:?}"
        );
    }
    let on_l1 = check_tier(&rt, "L1", &l1);
    assert_eq!(on_l1, 2 * RANKS as usize, "L1 keeps 2 steps of every rank");
    let on_l3 = check_tier(&rt, "L3", &*flaky);
    assert_eq!(on_l3, 3 * RANKS as usize, "L3 keeps 3 steps of every rank");
    // The peer here is a bare memory store: no peer service collected it,
    // so it holds every step pushed, each whole. One collection as the
    // service runs after a commit (its default retention, the newest 2
    // steps, any rank's record as evidence), and it holds those two steps
    // of every rank and no chunk that no manifest references.
    assert_eq!(
        check_tier_whole(&rt, &*peer),
        STEPS as usize * RANKS as usize
    );
    let (_, r) = rt
        .block_on(strata_gc::collect(
            &*peer,
            JOB,
            &strata_gc::Retention {
                grace: Duration::ZERO,
                ..strata_gc::Retention::l2()
            },
            &strata_gc::Options {
                evidence: strata_gc::Evidence::AnyRecord,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(r.kept, vec![STEPS - 1, STEPS], "{r:?}");
    let on_peer = check_tier(&rt, "peer", &*peer);
    assert_eq!(
        on_peer,
        2 * RANKS as usize,
        "the peer keeps 2 steps of every rank"
    );
    // The newest step restores on every rank from L1.
    let coord = InProcessCoordinator::new(RANKS);
    std::thread::scope(|sc| {
        for rank in 0..RANKS {
            let coord = coord.clone();
            let dir = dir.path();
            sc.spawn(move || {
                let c = Config::builder()
                    .job(JOB)
                    .l1_dir(dir)
                    .chunk_size(1 << 16)
                    .rank(rank, RANKS);
                let ck = Checkpointer::with_coordinator(c, Arc::new(coord)).unwrap();
                let got = ck.restore(strata::StepSelector::Latest).unwrap();
                assert_eq!(got.step, STEPS);
                assert_eq!(got.get("w").unwrap().bytes, state(rank, STEPS));
            });
        }
    });
}

/// Like `check_tier`, without the stray-chunk check.
fn check_tier_whole(rt: &tokio::runtime::Runtime, store: &dyn ChunkStore) -> usize {
    let steps = rt.block_on(store.list_steps(JOB)).unwrap();
    let mut n = 0;
    for st in &steps {
        for rank in st.committed_ranks() {
            let m = ShardManifest::decode(
                &rt.block_on(store.get_manifest(JOB, st.step, rank)).unwrap(),
            )
            .unwrap();
            let ids: Vec<_> = m.chunks.iter().map(|c| c.id).collect();
            for c in rt.block_on(store.get_chunks(JOB, &ids)) {
                c.unwrap();
            }
            n += 1;
        }
    }
    n
}

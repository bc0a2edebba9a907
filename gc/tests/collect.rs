//! `collect` over real tiers (memory, L1 on disk, L3 over an object
//! store): kept steps stay whole, retired ones and their chunks go; a tier
//! failing at any call of a collection loses nothing kept, deletes nothing
//! if the failure came before the sweep, and the next run finishes the
//! job exactly as an undisturbed run would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use strata_format::codec::ElemHint;
use strata_format::manifest::{ChunkRef, Entry, Segment};
use strata_format::{ChunkId, CommitRecord, EntryKind, ShardInfo, ShardManifest, ShardRef};
use strata_gc::{collect, Options, Retention, Scope};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{
    ChunkData, ChunkPut, ChunkStore, EngineChoice, FaultPlan, FaultStore, L1Store, L3Options,
    L3Store, ManualClock, MemoryStore,
};

const JOB: &str = "gc";
const WORLD: u32 = 2;

fn bytes(seed: u32) -> Vec<u8> {
    (0..4096u32)
        .map(|i| (i.wrapping_mul(7) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

/// Step `step`'s shard of `rank`: a chunk shared by every step and rank,
/// one per step (shared by the ranks), one of its own.
fn chunks_of(step: u64, rank: u32) -> Vec<Vec<u8>> {
    vec![
        bytes(1),
        bytes(1000 + step as u32),
        bytes(100_000 + step as u32 * 10 + rank),
    ]
}

fn manifest(step: u64, rank: u32) -> Vec<u8> {
    let cs = chunks_of(step, rank);
    let m = ShardManifest {
        info: ShardInfo {
            job: JOB.into(),
            step,
            rank,
            world_size: WORLD,
            created_unix_ms: 1,
        },
        chunk_size: 1 << 20,
        chunks: cs
            .iter()
            .map(|c| ChunkRef {
                id: ChunkId::of(c),
                len: c.len() as u32,
                hint: ElemHint::BYTES,
            })
            .collect(),
        entries: (0..cs.len())
            .map(|i| Entry {
                name: format!("e{i}"),
                kind: EntryKind::Blob,
                len: cs[i].len() as u64,
                segments: vec![Segment {
                    chunk: i as u32,
                    offset: 0,
                    len: cs[i].len() as u32,
                }],
            })
            .collect(),
        metadata: BTreeMap::new(),
    };
    m.encode().unwrap()
}

/// Saves `step` on every rank and commits it (one record per rank, as L1
/// and the peers keep them).
async fn save(s: &dyn ChunkStore, step: u64) {
    for rank in 0..WORLD {
        put_chunks_of(s, step, rank).await;
        commit_shard(s, step, rank).await;
    }
}

/// Puts the chunks of `rank`'s shard of `step`.
async fn put_chunks_of(s: &dyn ChunkStore, step: u64, rank: u32) {
    let puts = chunks_of(step, rank)
        .into_iter()
        .map(|c| ChunkPut {
            id: ChunkId::of(&c),
            hint: ElemHint::BYTES,
            data: ChunkData::copy_from(&c),
        })
        .collect();
    s.put_chunks(JOB, puts).await.unwrap();
}

/// Writes `rank`'s manifest of `step`, then its commit record (as the
/// rank's upload to L3 ends).
async fn commit_shard(s: &dyn ChunkStore, step: u64, rank: u32) {
    commit_shard_at(s, step, rank, 1).await;
}

/// [`commit_shard`], the record committed at `unix_ms`.
async fn commit_shard_at(s: &dyn ChunkStore, step: u64, rank: u32, unix_ms: u64) {
    let m = manifest(step, rank);
    s.put_manifest(JOB, step, rank, &m).await.unwrap();
    s.commit(&CommitRecord {
        job: JOB.into(),
        step,
        world_size: WORLD,
        committed_unix_ms: unix_ms,
        shards: vec![ShardRef {
            rank,
            manifest: ChunkId::of(&m),
            logical_bytes: 3 * 4096,
        }],
    })
    .await
    .unwrap();
}

/// Steps committed (by every rank) and the chunks held.
async fn state(s: &dyn ChunkStore) -> (BTreeSet<u64>, BTreeSet<ChunkId>) {
    let steps = s
        .list_steps(JOB)
        .await
        .unwrap()
        .into_iter()
        .filter(|st| st.committed_ranks().len() == WORLD as usize)
        .map(|st| st.step)
        .collect();
    let chunks = s.list_chunks(JOB).await.unwrap().into_iter().collect();
    (steps, chunks)
}

/// Every step listed (complete or not).
async fn listed(s: &dyn ChunkStore) -> BTreeSet<u64> {
    s.list_steps(JOB)
        .await
        .unwrap()
        .iter()
        .map(|st| st.step)
        .collect()
}

/// Every chunk of every manifest still listed is there.
async fn whole(s: &dyn ChunkStore) {
    for st in s.list_steps(JOB).await.unwrap() {
        for &rank in &st.manifests {
            let m =
                ShardManifest::decode(&s.get_manifest(JOB, st.step, rank).await.unwrap()).unwrap();
            let ids: Vec<ChunkId> = m.chunks.iter().map(|c| c.id).collect();
            let have = s.has_chunks(JOB, &ids).await.unwrap();
            assert!(
                have.iter().all(|&h| h),
                "step {} rank {rank} lost a chunk",
                st.step
            );
        }
    }
}

fn policy() -> Retention {
    Retention {
        keep_last: 2,
        keep_every: 4,
        keep_within: None,
        grace: Duration::ZERO,
    }
}

fn expected_chunks(kept: &BTreeSet<u64>) -> BTreeSet<ChunkId> {
    kept.iter()
        .flat_map(|&s| (0..WORLD).flat_map(move |r| chunks_of(s, r)))
        .map(|c| ChunkId::of(&c))
        .collect()
}

/// A memory tier on a clock the test moves, and that clock.
fn memory() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
    (MemoryStore::with_clock(Arc::new(clock.clone())), clock)
}

/// Until every chunk `s` holds is older than the tier's own time (what a
/// grace period of zero needs to collect it): the tier's clock moved on
/// where the test holds it, else waited for, with a deadline. Returns the
/// tier's time then.
async fn aged(s: &dyn ChunkStore, clock: Option<&ManualClock>) -> SystemTime {
    if let Some(c) = clock {
        c.advance(Duration::from_secs(3600));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = s.now(JOB).await.unwrap();
        let chunks = s.list_chunk_info(JOB).await.unwrap();
        if chunks.iter().all(|c| c.touched.is_some_and(|t| t < now)) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{}: chunks still as new as the tier's clock",
            s.name()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The tiers, each with its clock where the test holds it.
async fn tiers(
    dir: &std::path::Path,
) -> Vec<(&'static str, Arc<dyn ChunkStore>, Option<ManualClock>)> {
    let (mem, clock) = memory();
    vec![
        ("memory", Arc::new(mem), Some(clock)),
        (
            "l1",
            Arc::new(L1Store::open(dir.join("l1"), EngineChoice::Psync).unwrap()),
            None,
        ),
        (
            "l3",
            Arc::new(L3Store::with_store(
                Arc::new(object_store::memory::InMemory::new()),
                "root",
                "memory://l3",
                L3Options::default(),
            )),
            None,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tier_keeps_what_the_policy_keeps_and_loses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s, clock) in tiers(dir.path()).await {
        for step in 1..=10 {
            save(&*s, step).await;
        }
        // Chunks dated by the tier's clock must be older than the cutoff.
        aged(&*s, clock.as_ref()).await;
        let opts = Options {
            scope: Some(Scope::All),
            ..Default::default()
        };
        let dry = Options {
            dry_run: true,
            ..opts.clone()
        };
        let before = state(&*s).await;
        let (_, r) = collect(&*s, JOB, &policy(), &dry).await.unwrap();
        assert_eq!(
            state(&*s).await,
            before,
            "{name}: a dry run deletes nothing"
        );
        assert_eq!(r.kept, vec![4, 8, 9, 10], "{name}");
        let (_, r) = collect(&*s, JOB, &policy(), &opts).await.unwrap();
        assert_eq!(r.shards_retired, 6 * u64::from(WORLD), "{name}");
        let kept = BTreeSet::from([4, 8, 9, 10]);
        let (steps, chunks) = state(&*s).await;
        assert_eq!(steps, kept, "{name}");
        assert_eq!(
            chunks,
            expected_chunks(&kept),
            "{name}: no unreferenced chunk is left"
        );
        whole(&*s).await;
        // Nothing more to do.
        let (_, r) = collect(&*s, JOB, &policy(), &opts).await.unwrap();
        assert_eq!((r.shards_retired, r.chunks_deleted), (0, 0), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_collects_only_its_own_shards_and_keeps_shared_chunks() {
    let (s, clock) = memory();
    for step in 1..=5 {
        save(&s, step).await;
    }
    aged(&s, Some(&clock)).await;
    let p = Retention {
        keep_every: 0,
        ..policy()
    };
    let opts = Options {
        scope: Some(Scope::Rank(0)),
        ..Default::default()
    };
    collect(&s, JOB, &p, &opts).await.unwrap();
    let steps = s.list_steps(JOB).await.unwrap();
    for st in &steps {
        let want: BTreeSet<u32> = if st.step >= 4 {
            BTreeSet::from([0, 1])
        } else {
            BTreeSet::from([1])
        };
        assert_eq!(st.manifests, want, "step {}", st.step);
    }
    // Rank 1's old shards still reference their chunks: all still there.
    whole(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_failing_at_any_call_loses_nothing_and_the_next_run_finishes() {
    // The undisturbed outcome.
    let (reference, clock) = memory();
    for step in 1..=10 {
        save(&reference, step).await;
    }
    aged(&reference, Some(&clock)).await;
    let opts = Options {
        scope: Some(Scope::All),
        ..Default::default()
    };
    collect(&reference, JOB, &policy(), &opts).await.unwrap();
    let want = state(&reference).await;

    let (mut failed_before_sweep, mut failed_in_sweep) = (0, 0);
    let mut undisturbed = None;
    for n in 0..80 {
        let (s, clock) = memory();
        for step in 1..=10 {
            save(&s, step).await;
        }
        aged(&s, Some(&clock)).await;
        let before = state(&s).await;
        // The tier goes down after the n-th call of the collection (as if
        // the collector were killed there).
        let down = FaultStore::new(
            s,
            FaultPlan {
                outage_after: Some(n),
                ..FaultPlan::default()
            },
        );
        let r = collect(&down, JOB, &policy(), &opts).await;
        let inner = down.inner();
        whole(inner).await;
        let (steps, _) = state(inner).await;
        assert!(steps.is_superset(&want.0), "call {n}: a kept step was lost");
        if let Err(e) = &r {
            if state(inner).await == before {
                failed_before_sweep += 1;
            } else {
                failed_in_sweep += 1;
            }
            assert_eq!(e.kind(), strata_tiered::StoreErrorKind::Unavailable, "{e}");
        }
        // The tier is back: the next run finishes the job.
        down.heal();
        collect(down.inner(), JOB, &policy(), &opts).await.unwrap();
        assert_eq!(state(inner).await, want, "call {n}: the next run finished");
        if r.is_ok() {
            undisturbed = Some(n);
            break;
        }
    }
    // The outage came after the last call of a whole collection at least
    // once: every call of a collection was failed once.
    let calls = undisturbed.expect("80 calls never covered one whole collection");
    eprintln!("a whole collection: {calls} calls");
    assert!(
        failed_before_sweep > 0,
        "some failures hit the inventory, deleting nothing"
    );
    assert!(failed_in_sweep > 0, "some failures hit the sweep half-way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_stored_in_the_tier_keeps_its_step_until_it_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = tiers(dir.path()).await;
    // Through a wrapper too: pins are forwarded.
    let (mem, clock) = memory();
    all.push((
        "fault wrapper",
        Arc::new(FaultStore::new(mem, FaultPlan::default())),
        Some(clock),
    ));
    for (name, s, clock) in all {
        for step in 1..=6 {
            save(&*s, step).await;
        }
        s.set_pin(JOB, 2, true).await.unwrap();
        s.set_pin(JOB, 2, true).await.unwrap(); // idempotent
        assert_eq!(
            s.list_pins(JOB).await.unwrap(),
            BTreeSet::from([2]),
            "{name}"
        );
        aged(&*s, clock.as_ref()).await;
        let opts = Options {
            scope: Some(Scope::All),
            ..Default::default()
        };
        let p = Retention {
            keep_every: 0,
            ..policy()
        };
        let (_, r) = collect(&*s, JOB, &p, &opts).await.unwrap();
        assert_eq!(r.kept, vec![2, 5, 6], "{name}");
        whole(&*s).await;
        s.set_pin(JOB, 2, false).await.unwrap();
        s.set_pin(JOB, 2, false).await.unwrap();
        assert!(s.list_pins(JOB).await.unwrap().is_empty(), "{name}");
        let (_, r) = collect(&*s, JOB, &p, &opts).await.unwrap();
        assert_eq!(r.kept, vec![5, 6], "{name}");
        assert_eq!(state(&*s).await.0, BTreeSet::from([5, 6]), "{name}");
    }
}

/// The collector that sweeps chunks also aborts incomplete multipart
/// uploads begun before the grace period (here: object_store's staging
/// file on a `file://` L3, left by a writer killed mid-upload); a dry run
/// and a collector that leaves chunks to another do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chunk_sweep_aborts_stale_multipart_uploads() {
    use object_store::ObjectStoreExt;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let s = L3Store::from_url(&url, &[], L3Options::default()).unwrap();
    for step in 1..=3 {
        save(&s, step).await;
    }
    let raw = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let hex = ChunkId::of(b"a large chunk").to_hex();
    let key = format!("{JOB}/chunks/{}/{hex}", &hex[..2]);
    let mut up = raw
        .put_multipart(&object_store::path::Path::from(key.as_str()))
        .await
        .unwrap();
    up.put_part(vec![1u8; 1 << 20].into()).await.unwrap();
    // Killed: no abort, and no cleanup on drop.
    std::mem::forget(up);
    let staged = || {
        std::fs::read_dir(dir.path().join(&key).parent().unwrap())
            .unwrap()
            .count()
    };
    assert_eq!(staged(), 1);
    // The staging file older than the tier's time (a grace period of zero).
    let staging = std::fs::read_dir(dir.path().join(&key).parent().unwrap())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    older_than_the_tier(&s, &staging).await;
    let opts = Options {
        scope: Some(Scope::All),
        ..Default::default()
    };
    for o in [
        Options {
            dry_run: true,
            ..opts.clone()
        },
        Options {
            skip_chunks: true,
            ..opts.clone()
        },
    ] {
        let (_, r) = collect(&s, JOB, &policy(), &o).await.unwrap();
        assert_eq!(r.uploads_aborted, 0);
        assert_eq!(staged(), 1);
    }
    // Within the grace period: kept.
    let patient = Retention {
        grace: Duration::from_secs(3600),
        ..policy()
    };
    let (_, r) = collect(&s, JOB, &patient, &opts).await.unwrap();
    assert_eq!((r.uploads_aborted, staged()), (0, 1));
    let (_, r) = collect(&s, JOB, &policy(), &opts).await.unwrap();
    assert_eq!((r.uploads_aborted, staged()), (1, 0));
    whole(&s).await;
}

/// Stale uploads that cannot be aborted (here a directory where a staging
/// file would be, which cannot be unlinked as one) are reported, and the
/// chunks are swept all the same: a policy without the right to list
/// uploads must not stop collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_that_cannot_be_aborted_do_not_stop_the_chunk_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let s = L3Store::from_url(&url, &[], L3Options::default()).unwrap();
    for step in 1..=10 {
        save(&s, step).await;
    }
    let hex = ChunkId::of(b"stuck").to_hex();
    std::fs::create_dir_all(
        dir.path()
            .join(JOB)
            .join("chunks")
            .join(&hex[..2])
            .join(format!("{hex}#7")),
    )
    .unwrap();
    aged(&s, None).await;
    older_than_the_tier(
        &s,
        &dir.path()
            .join(JOB)
            .join("chunks")
            .join(&hex[..2])
            .join(format!("{hex}#7")),
    )
    .await;
    let opts = Options {
        scope: Some(Scope::All),
        ..Default::default()
    };
    let (_, r) = collect(&s, JOB, &policy(), &opts).await.unwrap();
    assert!(r.uploads_error.is_some(), "{r:?}");
    assert!(r.chunks_deleted > 0, "{r:?}");
    let kept = BTreeSet::from([4, 8, 9, 10]);
    assert_eq!(state(&s).await, (kept.clone(), expected_chunks(&kept)));
}

/// Until the file at `path` (an upload's staging file, beside a `file://`
/// L3's chunks) is older than the tier's time, with a deadline.
async fn older_than_the_tier(s: &dyn ChunkStore, path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let made = std::fs::metadata(path).unwrap().modified().unwrap();
    while s.now(JOB).await.unwrap() <= made {
        assert!(
            Instant::now() < deadline,
            "{}: as new as the tier",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One collector for every rank's shards (L3's): an incomplete step older
/// than the kept ones may still be uploading on another rank (an upload
/// asked for again), so it is held for the grace from when the collector
/// first saw it incomplete; past that it goes.
#[tokio::test]
async fn one_collector_holds_a_young_incomplete_step_for_its_grace() {
    let s = MemoryStore::new();
    for step in 2..=5 {
        save(&s, step).await;
    }
    // Step 1: rank 0 uploaded it again, rank 1 is still on its way.
    commit_shard(&s, 1, 0).await;
    let seen = strata_gc::IncompleteSeen::default();
    let opts = |seen: &strata_gc::IncompleteSeen| Options {
        scope: Some(Scope::All),
        evidence: strata_gc::Evidence::EveryRank,
        abandoned: strata_gc::Abandoned::Watched {
            seen: seen.clone(),
            grace: Duration::from_secs(3600),
            progress: None,
        },
        ..Options::default()
    };
    let (_, report) = collect(&s, JOB, &policy(), &opts(&seen)).await.unwrap();
    let listed = |steps: Vec<strata_tiered::StepInfo>| -> BTreeSet<u64> {
        steps.iter().map(|st| st.step).collect()
    };
    assert!(
        listed(s.list_steps(JOB).await.unwrap()).contains(&1),
        "a young incomplete step is held: {report:?}"
    );
    assert!(seen.lock().unwrap().contains_key(&1));
    // Seen incomplete two hours ago: its uploads are over; it goes.
    seen.lock()
        .unwrap()
        .insert(1, SystemTime::now() - Duration::from_secs(7200));
    collect(&s, JOB, &policy(), &opts(&seen)).await.unwrap();
    assert!(!listed(s.list_steps(JOB).await.unwrap()).contains(&1));
    collect(&s, JOB, &policy(), &opts(&seen)).await.unwrap();
    assert!(seen.lock().unwrap().is_empty(), "forgotten once gone");
}

/// Rank 1 never gets an upload through (its chunks land, its manifest and
/// record never do): no step is ever complete. The one collector, lazy as
/// the uploader runs it, holds each step for its grace from when it first
/// saw it incomplete, then keeps only the newest `keep_last` incomplete
/// ones: L3 stops growing, and the chunks of the steps gone go with them.
#[tokio::test]
async fn incomplete_steps_past_their_grace_are_bounded_when_none_is_complete() {
    let s = MemoryStore::new();
    // Both ranks' chunks land; only rank 0's manifest and record do.
    let rank0_only = |step: u64| {
        let s = &s;
        async move {
            for rank in 0..WORLD {
                put_chunks_of(s, step, rank).await;
            }
            commit_shard(s, step, 0).await;
        }
    };
    let seen = strata_gc::IncompleteSeen::default();
    let opts = Options {
        scope: Some(Scope::All),
        evidence: strata_gc::Evidence::EveryRank,
        abandoned: strata_gc::Abandoned::Watched {
            seen: seen.clone(),
            grace: Duration::from_secs(3600),
            // Rank 1 never had a record: stalled once a step lacked it for
            // the grace.
            progress: Some(strata_gc::RankProgress::default()),
        },
        lazy: true,
        ..Options::default()
    };
    let policy = Retention {
        keep_every: 0,
        ..policy()
    };
    for step in 1..=6 {
        rank0_only(step).await;
        collect(&s, JOB, &policy, &opts).await.unwrap();
    }
    // Every step is young: all held.
    assert_eq!(listed(&s).await, (1..=6).collect());
    // Steps 1..=4 were first seen two hours ago: their uploads are over.
    for step in 1..=4 {
        seen.lock()
            .unwrap()
            .insert(step, SystemTime::now() - Duration::from_secs(7200));
    }
    rank0_only(7).await;
    let (_, report) = collect(&s, JOB, &policy, &opts).await.unwrap();
    // The newest two incomplete (6, 7) stay, 5 is young: 1..=4 go.
    assert_eq!(listed(&s).await, BTreeSet::from([5, 6, 7]), "{report:?}");
    assert_eq!(report.shards_retired, 4, "{report:?}");
    // Their chunks went with them (those the steps left share stay).
    let left: BTreeSet<ChunkId> = s.list_chunks(JOB).await.unwrap().into_iter().collect();
    for step in 1..=4 {
        for rank in 0..WORLD {
            for c in chunks_of(step, rank).iter().skip(1) {
                assert!(!left.contains(&ChunkId::of(c)), "step {step} rank {rank}");
            }
        }
    }
}

/// Rank 1 uploads in step order but lags: L3 holds its records of steps 1
/// and 2 only, rank 0's of 1..=6. Steps 3..=6 were first seen incomplete
/// two hours ago, yet while rank 1's records keep changing it may still
/// reach them: nothing newer than the kept complete steps goes. Once its
/// records have not changed for the grace period it has stalled, and the
/// newest `keep_last` incomplete steps alone stay.
#[tokio::test]
async fn a_lagging_rank_still_uploading_in_order_keeps_its_steps_until_it_stalls() {
    let s = MemoryStore::new();
    for step in 1..=6 {
        commit_shard(&s, step, 0).await;
        if step <= 2 {
            commit_shard(&s, step, 1).await;
        }
    }
    let seen = strata_gc::IncompleteSeen::default();
    let progress = strata_gc::RankProgress::default();
    let opts = Options {
        scope: Some(Scope::All),
        evidence: strata_gc::Evidence::EveryRank,
        abandoned: strata_gc::Abandoned::Watched {
            seen: seen.clone(),
            grace: Duration::from_secs(3600),
            progress: Some(progress.clone()),
        },
        lazy: true,
        ..Options::default()
    };
    let policy = Retention {
        keep_every: 0,
        ..policy()
    };
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    let rank1_unchanged_since = |t: SystemTime| progress.lock().unwrap().get_mut(&1).unwrap().1 = t;
    collect(&s, JOB, &policy, &opts).await.unwrap();
    for step in 3..=6 {
        seen.lock().unwrap().insert(step, two_hours_ago);
    }
    let (_, report) = collect(&s, JOB, &policy, &opts).await.unwrap();
    assert_eq!(listed(&s).await, (1..=6).collect(), "{report:?}");
    // Rank 1's records stood still for two hours, then its upload of step 3
    // landed: it is progressing. Step 3 is complete, 1 is no longer kept.
    rank1_unchanged_since(two_hours_ago);
    commit_shard(&s, 3, 1).await;
    let (_, report) = collect(&s, JOB, &policy, &opts).await.unwrap();
    assert_eq!(listed(&s).await, (2..=6).collect(), "{report:?}");
    // Now nothing of it changes for two hours: of the incomplete steps,
    // the newest two stay.
    rank1_unchanged_since(two_hours_ago);
    let (_, report) = collect(&s, JOB, &policy, &opts).await.unwrap();
    assert_eq!(listed(&s).await, BTreeSet::from([2, 3, 5, 6]), "{report:?}");
}

/// An operator's word (`strata gc --abandoned-after`): incomplete steps
/// whose every record was committed before the age go, but for the newest
/// `keep_last` incomplete ones with a record; a step committed since
/// stays, as does one without a record, and the steps of a collection
/// told nothing.
#[tokio::test]
async fn incomplete_steps_committed_before_the_operators_age_are_bounded() {
    let s = MemoryStore::new();
    let now_ms = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for step in 1..=7u64 {
        for rank in 0..WORLD {
            put_chunks_of(&s, step, rank).await;
        }
        // Rank 1's uploads never landed. Step 5 committed just now, the
        // others two hours ago; step 7's upload was cut off before its
        // record (a manifest alone: it restores nothing).
        if step == 7 {
            s.put_manifest(JOB, step, 0, &manifest(step, 0))
                .await
                .unwrap();
            continue;
        }
        let at = if step == 5 {
            now_ms
        } else {
            now_ms - 7_200_000
        };
        commit_shard_at(&s, step, 0, at).await;
    }
    let policy = Retention {
        keep_last: 1,
        keep_every: 0,
        ..policy()
    };
    let opts = |abandoned| Options {
        scope: Some(Scope::All),
        evidence: strata_gc::Evidence::EveryRank,
        abandoned,
        ..Options::default()
    };
    collect(&s, JOB, &policy, &opts(strata_gc::Abandoned::Unknown))
        .await
        .unwrap();
    assert_eq!(
        listed(&s).await,
        (1..=7).collect(),
        "nothing is known abandoned"
    );
    let hour = strata_gc::Abandoned::CommittedBefore(Duration::from_secs(3600));
    let (_, report) = collect(&s, JOB, &policy, &opts(hour)).await.unwrap();
    // 1..=4 are an hour old and not the newest incomplete step with a
    // record: gone; 5 is too young, 6 the newest with a record (the
    // manifest of 7 does not take its place), 7 has no record to age.
    assert_eq!(listed(&s).await, BTreeSet::from([5, 6, 7]), "{report:?}");
    assert_eq!(report.shards_retired, 4, "{report:?}");
    whole(&s).await;
}

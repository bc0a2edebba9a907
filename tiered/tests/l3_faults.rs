//! L3 under injected faults (seeded; set STRATA_FAULT_SEED to replay a
//! failing seed): uploads complete or resume, reads retry, nothing partial is
//! committed, nothing is lost. The faults are injected under the store; the
//! retries are those of the tier as the client opens it
//! ([`L3Store::into_tier`]: retries over metrics over the store).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use strata_format::codec::ElemHint;
use strata_format::{ChunkId, CommitRecord, ShardRef};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, L3Options, L3Store, L3Tier, StoreErrorKind};
use strata_tiered::{FaultPlan, FaultStore};

const JOB: &str = "faults";

/// The fault injector over the object store under L3.
type FaultyStore = FaultStore<Arc<dyn object_store::ObjectStore>>;

fn seed() -> u64 {
    let s = std::env::var("STRATA_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_F00D);
    eprintln!("fault seed {s} (STRATA_FAULT_SEED={s} replays it)");
    s
}

fn chunks(n: usize, len: usize, salt: u8) -> Vec<ChunkPut> {
    (0..n)
        .map(|i| {
            let b: Vec<u8> = (0..len)
                .map(|j| ((j * 31 + i * 7) as u8).wrapping_add(salt) ^ (j >> 9) as u8)
                .collect();
            ChunkPut {
                id: ChunkId::of(&b),
                hint: ElemHint::BYTES,
                data: ChunkData::copy_from(&b),
            }
        })
        .collect()
}

fn l3(inner: Arc<dyn object_store::ObjectStore>, plan: FaultPlan) -> (L3Tier, Arc<FaultyStore>) {
    l3_retrying(inner, plan, 4)
}

fn l3_retrying(
    inner: Arc<dyn object_store::ObjectStore>,
    plan: FaultPlan,
    max_retries: usize,
) -> (L3Tier, Arc<FaultyStore>) {
    let faulty = Arc::new(FaultyStore::new(inner, plan));
    let opts = L3Options {
        concurrency: 8,
        max_retries,
        ..L3Options::default()
    };
    (
        L3Store::with_store(faulty.clone(), "root", "faulty-memory", opts).into_tier(),
        faulty,
    )
}

/// 503s, timeouts, dropped connections and latency on every kind of call:
/// every chunk still goes up once and comes back verified; the commit
/// lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_faults_are_retried_and_nothing_is_lost() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let plan = FaultPlan {
        seed: seed(),
        error_rate: 0.1,
        timeout_rate: 0.03,
        timeout: Duration::from_millis(30),
        drop_rate: 0.05,
        latency: Duration::from_millis(1),
        ..FaultPlan::default()
    };
    // About 1 call in 6 fails; 8 attempts make a lost call a 1e-6 event.
    let (store, faulty) = l3_retrying(inner, plan, 8);
    let puts = chunks(40, 50_000, 1);
    let st = store.put_chunks(JOB, puts.clone()).await.unwrap();
    assert_eq!(st.written + st.deduped, 40);
    let ids: Vec<ChunkId> = puts.iter().map(|p| p.id).collect();
    for (p, got) in puts.iter().zip(store.get_chunks(JOB, &ids).await) {
        assert_eq!(got.unwrap().as_slice(), p.data.as_slice());
    }
    store.put_manifest(JOB, 7, 0, b"manifest").await.unwrap();
    let record = CommitRecord {
        job: JOB.into(),
        step: 7,
        world_size: 1,
        committed_unix_ms: 1,
        shards: vec![ShardRef {
            rank: 0,
            manifest: ChunkId::of(b"manifest"),
            logical_bytes: 8,
        }],
    };
    store.commit(&record).await.unwrap();
    let steps = store.list_steps(JOB).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert!(steps[0].is_complete());
    let c = faulty.counts();
    let injected = c.errors + c.timeouts + c.drops;
    assert!(
        injected > 10,
        "the plan must actually inject faults ({injected})"
    );
}

/// The server stops taking writes mid-upload: the upload fails with
/// Unavailable, no commit record exists, and a later upload (server back)
/// sends only the chunks that had not landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_mid_upload_resumes_without_resending() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let plan = FaultPlan {
        seed: seed(),
        writes_before_outage: Some(12),
        ..FaultPlan::default()
    };
    let (down, _) = l3(inner.clone(), plan);
    let puts = chunks(30, 20_000, 2);
    let e = down.put_chunks(JOB, puts.clone()).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    assert!(down.list_steps(JOB).await.unwrap().is_empty());

    let (up, _) = l3(inner, FaultPlan::default());
    let landed = up
        .has_chunks(JOB, &puts.iter().map(|p| p.id).collect::<Vec<_>>())
        .await
        .unwrap()
        .iter()
        .filter(|&&h| h)
        .count() as u64;
    assert!((12..30).contains(&landed), "{landed} chunks landed");
    let st = up.put_chunks(JOB, puts.clone()).await.unwrap();
    assert_eq!((st.written, st.deduped), (30 - landed, landed));
    for p in &puts {
        let got = up.get_chunk(JOB, &p.id, None).await.unwrap();
        assert_eq!(got.as_slice(), p.data.as_slice());
    }
}

/// Reads against a store that always fails give a typed error after the
/// retries, never a hang or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_store_is_a_typed_error() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let (store, _) = l3(
        inner,
        FaultPlan {
            seed: seed(),
            error_rate: 1.0,
            ..FaultPlan::default()
        },
    );
    let id = ChunkId::of(b"x");
    let e = store.get_chunk(JOB, &id, None).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    let e = store.list_steps(JOB).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
}

/// A store without create-if-absent: commits are refused as Unavailable
/// (never silently non-atomic), unless `non_atomic_commits` accepts
/// check-then-put, which still refuses a different record over an existing
/// one and accepts the identical record again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_without_conditional_puts_refuse_to_claim_atomic_commits() {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let plan = FaultPlan {
        no_conditional_put: true,
        ..FaultPlan::default()
    };
    let record = |writer: u8| CommitRecord {
        job: JOB.into(),
        step: 3,
        world_size: 1,
        committed_unix_ms: u64::from(writer),
        shards: vec![ShardRef {
            rank: 0,
            manifest: ChunkId::of(&[writer]),
            logical_bytes: 1,
        }],
    };
    let (strict, _) = l3(inner.clone(), plan.clone());
    let e = strict.commit(&record(1)).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("not be atomic"), "{e}");
    assert!(strict.list_steps(JOB).await.unwrap().is_empty());

    let lax = L3Store::with_store(
        Arc::new(FaultyStore::new(inner, plan)),
        "root",
        "no-conditional-puts",
        L3Options {
            non_atomic_commits: true,
            ..L3Options::default()
        },
    )
    .into_tier();
    lax.commit(&record(1)).await.unwrap();
    lax.commit(&record(1)).await.unwrap();
    let e = lax.commit(&record(2)).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::AlreadyExists, "{e}");
    let steps = lax.list_steps(JOB).await.unwrap();
    assert_eq!(steps[0].records[&0], record(1));
}

/// Every write lands and then loses its connection: the bare store fails
/// `Unavailable` (it never retries itself), while the tier retries. A
/// retried commit finds its own record and succeeds (never a conflict with
/// itself); a different record is still refused. A retried put sends only
/// what did not land, and every attempt lands something, so it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_that_had_landed_is_success() {
    use strata_tiered::wrap::{FaultTargets, OpFamily};
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let plan = FaultPlan {
        seed: seed(),
        drop_rate: 1.0,
        targets: FaultTargets {
            reads: false,
            writes: true,
            listing: false,
            commit: false,
        },
        ..FaultPlan::default()
    };
    let record = |ms: u64| CommitRecord {
        job: JOB.into(),
        step: 5,
        world_size: 1,
        committed_unix_ms: ms,
        shards: vec![ShardRef {
            rank: 0,
            manifest: ChunkId::of(b"manifest"),
            logical_bytes: 8,
        }],
    };
    let bare = L3Store::with_store(
        Arc::new(FaultyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            plan.clone(),
        )),
        "root",
        "dropping",
        L3Options::default(),
    );
    let e = bare.commit(&record(1)).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");

    let (tier, faulty) = l3(inner, plan);
    tier.commit(&record(1)).await.unwrap();
    assert_eq!(tier.retries(), 1, "the landed write was retried once");
    assert!(faulty.counts().drops >= 1);
    let e = tier.commit(&record(2)).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::AlreadyExists, "{e}");
    let steps = tier.list_steps(JOB).await.unwrap();
    assert_eq!(steps[0].records[&0], record(1));

    let puts = chunks(12, 10_000, 3);
    let st = tier.put_chunks(JOB, puts.clone()).await.unwrap();
    assert_eq!(st.written + st.deduped, 12);
    for p in &puts {
        let got = tier.get_chunk(JOB, &p.id, None).await.unwrap();
        assert_eq!(got.as_slice(), p.data.as_slice());
    }
    // The metrics inside the retries saw every attempt: the commit that
    // failed, the one that found its record, the one refused.
    let commits = tier.inner().snapshot().family(OpFamily::Commit);
    assert_eq!(commits.ops, 3, "{commits:?}");
    assert_eq!(commits.errors.unavailable, 1, "{commits:?}");
    assert_eq!(commits.errors.already_exists, 1, "{commits:?}");
}

/// A listing of a step of a large world reads its commit records a few at
/// a time; the first read that fails ends it with an error: never a
/// listing that lacks the record (the step would look uncommitted for that
/// rank), and not after reading every other record of thousands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_ends_at_its_first_failed_record_read_with_an_error() {
    const RANKS: u32 = 200;
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let (clean, _) = l3(inner.clone(), FaultPlan::default());
    for rank in 0..RANKS {
        let manifest = format!("manifest of rank {rank}").into_bytes();
        clean.put_manifest(JOB, 5, rank, &manifest).await.unwrap();
        let record = CommitRecord {
            job: JOB.into(),
            step: 5,
            world_size: RANKS,
            committed_unix_ms: 1,
            shards: vec![ShardRef {
                rank,
                manifest: ChunkId::of(&manifest),
                logical_bytes: 8,
            }],
        };
        clean.commit(&record).await.unwrap();
    }
    let listed = clean.list_steps(JOB).await.unwrap();
    assert_eq!(listed[0].committed_ranks().len(), RANKS as usize);

    // Every read fails (listings answer): no retries, 8 reads at a time.
    let (broken, faulty) = l3_retrying(
        inner,
        FaultPlan {
            seed: seed(),
            error_rate: 1.0,
            targets: strata_tiered::wrap::FaultTargets {
                reads: true,
                writes: false,
                listing: false,
                commit: false,
            },
            ..FaultPlan::default()
        },
        0,
    );
    let e = broken.list_steps(JOB).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    let failed = faulty.counts().errors;
    assert!(
        (1..=16).contains(&failed),
        "{failed} record reads before the listing ended (of {RANKS})"
    );
}

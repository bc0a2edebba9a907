//! Focused tests of each wrapper's own behaviour (the conformance suite,
//! in `conformance_wrappers.rs`, checks they keep the contract).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord};
use strata_tiered::conformance::chunk;
use strata_tiered::wrap::{FaultTargets, OpFamily};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{
    ChunkData, ChunkPut, ChunkStore, FaultPlan, FaultStore, LimitStore, MemoryStore, MetricsStore,
    PutStats, Result, RetryPolicy, RetryStore, StepInfo, StoreErrorKind, ThrottleConfig,
    ThrottleStore,
};

const JOB: &str = "job-a";

fn quick(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
        deadline: Duration::from_secs(30),
        seed: 3,
    }
}

fn always_failing() -> FaultStore<MemoryStore> {
    let plan = FaultPlan {
        seed: 1,
        error_rate: 1.0,
        ..Default::default()
    };
    FaultStore::new(MemoryStore::new(), plan)
}

#[tokio::test]
async fn retry_gives_up_after_the_policy_attempts_with_the_last_error() {
    let s = RetryStore::with_policy(always_failing(), quick(4));
    let e = s.list_chunks(JOB).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    assert_eq!(s.retries(), 3);
    assert_eq!(
        s.inner().counts().errors,
        4,
        "four attempts reached the store"
    );
    // A batch read: every entry failed, every entry given up on.
    let ids = [ChunkId::of(b"a"), ChunkId::of(b"b")];
    let got = s.get_chunks(JOB, &ids).await;
    assert!(got.iter().all(|r| r
        .as_ref()
        .is_err_and(|e| e.kind() == StoreErrorKind::Unavailable)));
    assert_eq!(s.retries(), 6);
}

#[tokio::test(start_paused = true)]
async fn retry_stops_at_the_deadline() {
    // On the runtime's paused clock: the backoff and the deadline are
    // measured on it, exactly, whatever the machine's load.
    let policy = RetryPolicy {
        max_attempts: 1000,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(20),
        deadline: Duration::from_millis(100),
        seed: 1,
    };
    let s = RetryStore::with_policy(always_failing(), policy);
    let t0 = tokio::time::Instant::now();
    assert!(s.list_steps(JOB).await.is_err());
    let spent = t0.elapsed();
    // Every pause is 10 to 20 ms: it gives up once the next one would pass
    // 100 ms, so after more than 80 ms and never past the deadline.
    assert!(
        spent > Duration::from_millis(80) && spent <= Duration::from_millis(100),
        "{spent:?}"
    );
    assert!((5..=10).contains(&s.retries()), "{}", s.retries());
}

#[tokio::test]
async fn retry_never_retries_not_found_corrupt_or_already_exists() {
    let m = Arc::new(MemoryStore::new());
    let s = RetryStore::with_policy(m.clone(), quick(5));
    let e = s
        .get_chunk(JOB, &ChunkId::of(b"x"), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::NotFound);
    let c = chunk(1000, 1);
    s.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    m.corrupt_chunk(JOB, &c.id, b"other bytes").unwrap();
    let e = s.get_chunk(JOB, &c.id, None).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt);
    let got = s.get_chunks(JOB, &[c.id]).await;
    assert_eq!(got[0].as_ref().unwrap_err().kind(), StoreErrorKind::Corrupt);
    let e = s.put_chunks("../bad", vec![c]).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Invalid);
    let mut rec = CommitRecord {
        job: JOB.into(),
        step: 1,
        world_size: 1,
        committed_unix_ms: 1,
        shards: vec![strata_format::ShardRef {
            rank: 0,
            manifest: ChunkId::of(b"m"),
            logical_bytes: 1,
        }],
    };
    s.commit(&rec).await.unwrap();
    rec.committed_unix_ms = 2;
    let e = s.commit(&rec).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::AlreadyExists);
    assert_eq!(s.retries(), 0);
}

#[tokio::test]
async fn retry_rereads_only_the_failed_entries_of_a_batch() {
    let plan = FaultPlan {
        seed: 5,
        error_rate: 0.5,
        ..Default::default()
    };
    let s = RetryStore::with_policy(FaultStore::new(MemoryStore::new(), plan), quick(40));
    let chunks: Vec<ChunkPut> = (0..20).map(|i| chunk(100 + i, i as u8)).collect();
    s.put_chunks(JOB, chunks.clone()).await.unwrap();
    let ids: Vec<ChunkId> = chunks.iter().map(|c| c.id).collect();
    let got = s.get_chunks_unverified(JOB, &ids).await;
    for (c, g) in chunks.iter().zip(got) {
        assert_eq!(g.unwrap().as_slice(), c.data.as_slice());
    }
    assert!(s.retries() > 0);
    assert!(s.inner().counts().errors > 0);
}

/// Counts calls in flight (and the most at once) around a memory store.
#[derive(Debug, Default)]
struct Probe {
    inner: MemoryStore,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Probe {
    async fn track<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let out = f.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

#[async_trait]
impl ChunkStore for Probe {
    fn name(&self) -> &str {
        "probe"
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: strata_tiered::PutOptions,
    ) -> Result<PutStats> {
        self.track(self.inner.put_chunks_opts(job, chunks, opts))
            .await
    }
    async fn get_chunk(&self, job: &str, id: &ChunkId, r: Option<Range<u32>>) -> Result<ChunkData> {
        self.track(self.inner.get_chunk(job, id, r)).await
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.track(self.inner.has_chunks(job, ids)).await
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        self.track(self.inner.list_chunks(job)).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.track(self.inner.delete_chunks(job, ids)).await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, b: &[u8]) -> Result<()> {
        self.track(self.inner.put_manifest(job, step, rank, b))
            .await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.track(self.inner.get_manifest(job, step, rank)).await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.track(self.inner.commit(record)).await
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.track(self.inner.list_steps(job)).await
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.track(self.inner.delete_step(job, step)).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.track(self.inner.delete_shard(job, step, rank)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_never_exceeds_its_calls_in_flight() {
    let probe = Arc::new(Probe::default());
    let s = Arc::new(LimitStore::new(probe.clone(), 3));
    let tasks: Vec<_> = (0..24u8)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let c = chunk(100, i);
                s.put_chunks(JOB, vec![c.clone()]).await.unwrap();
                s.get_chunk(JOB, &c.id, None).await.unwrap();
                s.has_chunks(JOB, &[c.id]).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        probe.most.load(Ordering::SeqCst),
        3,
        "the limit was reached, never passed"
    );
    // Without the limit, the same load goes wider (the probe measures).
    let wide = Arc::new(Probe::default());
    let calls = (0..8u8).map(|i| {
        let w = wide.clone();
        tokio::spawn(async move { w.has_chunks(JOB, &[ChunkId::of(&[i])]).await })
    });
    for t in calls.collect::<Vec<_>>() {
        t.await.unwrap().unwrap();
    }
    assert!(wide.most.load(Ordering::SeqCst) > 3);
}

/// On tokio's paused clock: the throttle sleeps on tokio's time, which
/// moves only when every task waits, so the times are exact, whatever the
/// machine's load.
#[tokio::test(start_paused = true)]
async fn throttle_takes_bytes_over_cap_seconds() {
    use tokio::time::Instant;
    let caps = ThrottleConfig {
        read_bytes_per_sec: 2_000_000,
        write_bytes_per_sec: 1_000_000,
        burst_bytes: 0,
    };
    let s = ThrottleStore::new(MemoryStore::new(), caps);
    let chunks: Vec<ChunkPut> = (0..10).map(|i| chunk(20_000, i)).collect();
    let t0 = Instant::now();
    for c in &chunks {
        s.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    }
    let w = t0.elapsed();
    // 200 kB at 1 MB/s: 0.2 s.
    assert_eq!(w, Duration::from_millis(200), "{w:?}");
    // Deduplicated chunks cost nothing.
    let t0 = Instant::now();
    s.put_chunks(JOB, chunks.clone()).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO);
    let ids: Vec<ChunkId> = chunks.iter().map(|c| c.id).collect();
    let t0 = Instant::now();
    for r in s.get_chunks(JOB, &ids).await {
        r.unwrap();
    }
    s.get_chunk(JOB, &ids[0], None).await.unwrap();
    let r = t0.elapsed();
    // 220 kB at 2 MB/s: 0.11 s (the second call waits for the first's debt).
    assert_eq!(r, Duration::from_millis(110), "{r:?}");
    let open = ThrottleStore::new(MemoryStore::new(), ThrottleConfig::default());
    let t0 = Instant::now();
    open.put_chunks(JOB, chunks).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO, "0 = unlimited");
}

#[tokio::test]
async fn metrics_count_ops_bytes_and_errors() {
    let s = MetricsStore::new(MemoryStore::new());
    let (a, b) = (chunk(1000, 1), chunk(3000, 2));
    let st = s
        .put_chunks(JOB, vec![a.clone(), b.clone(), a.clone()])
        .await
        .unwrap();
    assert_eq!((st.written, st.deduped), (2, 1));
    s.put_chunks(JOB, vec![b.clone()]).await.unwrap();
    s.get_chunk(JOB, &a.id, None).await.unwrap();
    s.get_chunk(JOB, &b.id, Some(0..10)).await.unwrap();
    let missing = ChunkId::of(b"missing");
    assert!(s.get_chunk(JOB, &missing, None).await.is_err());
    let got = s.get_chunks(JOB, &[a.id, missing, b.id]).await;
    assert_eq!(got.iter().filter(|r| r.is_err()).count(), 1);
    s.has_chunks(JOB, &[a.id]).await.unwrap();
    s.list_steps(JOB).await.unwrap();
    s.list_chunks(JOB).await.unwrap();
    assert!(s.get_manifest(JOB, 1, 0).await.is_err());
    s.delete_step(JOB, 9).await.unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.store, "memory");
    assert_eq!(snap.chunks_written, 2);
    assert_eq!(snap.bytes_written, 4000);
    assert_eq!(snap.chunks_deduped, 2);
    assert_eq!(snap.bytes_deduped, 4000);
    assert_eq!(snap.bytes_read, 1000 + 10 + 4000);
    let put = snap.family(OpFamily::Put);
    assert_eq!((put.ops, put.errors.total()), (2, 0));
    let get = snap.family(OpFamily::Get);
    assert_eq!(get.ops, 4);
    assert_eq!(get.errors.not_found, 2);
    assert_eq!(get.errors.of(StoreErrorKind::NotFound), 2);
    assert!(get.latency_max > Duration::ZERO && get.latency_total >= get.latency_max);
    assert_eq!(snap.family(OpFamily::Has).ops, 1);
    assert_eq!(snap.family(OpFamily::List).ops, 2);
    assert_eq!(snap.family(OpFamily::Manifest).errors.not_found, 1);
    assert_eq!(snap.family(OpFamily::Delete).ops, 1);
    assert_eq!(snap.family(OpFamily::Commit), Default::default());
}

/// What a run of calls saw: one line per outcome.
async fn run_faults(seed: u64) -> (Vec<String>, strata_tiered::wrap::FaultCounts) {
    let plan = FaultPlan {
        seed,
        error_rate: 0.3,
        corrupt_rate: 0.2,
        truncate_rate: 0.1,
        ..Default::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    let chunks: Vec<ChunkPut> = (0..8).map(|i| chunk(500, i)).collect();
    s.inner().put_chunks(JOB, chunks.clone()).await.unwrap();
    let ids: Vec<ChunkId> = chunks.iter().map(|c| c.id).collect();
    let mut seen = Vec::new();
    let show = |r: &Result<ChunkData>, c: &ChunkPut| match r {
        Ok(d) if d.as_slice() == c.data.as_slice() => "ok".to_string(),
        Ok(d) => format!("damaged {}", d.len()),
        Err(e) => format!("{:?}", e.kind()),
    };
    for round in 0..30 {
        seen.push(format!(
            "{:?}",
            s.has_chunks(JOB, &ids).await.map_err(|e| e.kind())
        ));
        let c = &chunks[round % 8];
        seen.push(show(&s.get_chunk(JOB, &c.id, None).await, c));
        for (r, c) in s.get_chunks_unverified(JOB, &ids).await.iter().zip(&chunks) {
            seen.push(show(r, c));
        }
    }
    (seen, s.counts())
}

#[tokio::test]
async fn faults_replay_for_a_seed_and_differ_for_another() {
    let (a, ca) = run_faults(42).await;
    let (b, cb) = run_faults(42).await;
    let (c, _) = run_faults(43).await;
    assert_eq!(a, b);
    assert_eq!(ca, cb);
    assert_ne!(a, c);
    assert!(
        ca.errors > 0 && ca.corruptions > 0 && ca.truncations > 0,
        "{ca:?}"
    );
    assert!(a.iter().any(|s| s == "Corrupt"));
    assert!(
        a.iter().any(|s| s.starts_with("damaged 500")),
        "a flipped byte"
    );
    assert!(
        a.iter().any(|s| s.starts_with("damaged 4")),
        "a shortened chunk"
    );
}

#[tokio::test]
async fn outage_fails_from_the_next_op_until_healed() {
    let plan = FaultPlan {
        outage_after: Some(5),
        ..Default::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    for _ in 0..5 {
        s.list_chunks(JOB).await.unwrap();
    }
    for _ in 0..3 {
        let e = s.list_chunks(JOB).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    }
    let got = s.get_chunks(JOB, &[ChunkId::of(b"a")]).await;
    assert_eq!(
        got[0].as_ref().unwrap_err().kind(),
        StoreErrorKind::Unavailable
    );
    s.heal();
    s.list_chunks(JOB).await.unwrap();
    let n = s.counts();
    assert_eq!((n.ops, n.outage_failures), (10, 4));
}

#[tokio::test]
async fn faults_damage_reads_where_the_caller_sees_it_and_respect_targets() {
    let plan = FaultPlan {
        seed: 9,
        corrupt_rate: 1.0,
        ..Default::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    let c = chunk(5000, 3);
    s.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    let e = s.get_chunk(JOB, &c.id, None).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt);
    let raw = s
        .get_chunks_unverified(JOB, &[c.id])
        .await
        .remove(0)
        .unwrap();
    assert_eq!(raw.len(), c.data.len());
    assert_ne!(
        ChunkId::of(raw.as_slice()),
        c.id,
        "the caller's check sees it"
    );
    let frame = s.get_frame(JOB, c.id, Vec::new()).await.unwrap();
    let mut dst = vec![0u8; c.data.len()];
    let e = frame.decode_into(&mut dst).unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt);

    let plan = FaultPlan {
        seed: 9,
        truncate_rate: 1.0,
        ..Default::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    s.put_chunks(JOB, vec![c.clone()]).await.unwrap();
    let raw = s
        .get_chunks_unverified(JOB, &[c.id])
        .await
        .remove(0)
        .unwrap();
    assert!(raw.len() < c.data.len());
    let e = s.get_chunk(JOB, &c.id, None).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt);

    // Only writes targeted: reads and listings pass.
    let plan = FaultPlan {
        seed: 9,
        error_rate: 1.0,
        targets: FaultTargets {
            reads: false,
            listing: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let s = FaultStore::new(MemoryStore::new(), plan);
    assert!(s.put_chunks(JOB, vec![c.clone()]).await.is_err());
    assert!(s.put_manifest(JOB, 1, 0, b"m").await.is_err());
    assert!(s.has_chunks(JOB, &[c.id]).await.is_ok());
    assert!(s.list_steps(JOB).await.is_ok());
    assert_eq!(s.counts().errors, 2);
}

//! A slow L3 must not fill the node's disk: steps held on L1 for their
//! upload are bounded by `max_pending_uploads`; past it the oldest waiting
//! upload is dropped and reported (`drop`), or saves slow to L3's pace
//! (`wait`). Before this bound, `keep_last = 2` held 16 steps on L1 while
//! uploads lagged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use strata::format::DType;
use strata::tiered::{ChunkStore, FaultPlan, FaultStore, MemoryStore};
use strata::{Checkpointer, Config, Entry, L3State, UploadBacklog};

fn slow_l3() -> Arc<dyn ChunkStore> {
    Arc::new(FaultStore::new(
        MemoryStore::new(),
        FaultPlan {
            latency: Duration::from_millis(150),
            ..FaultPlan::default()
        },
    ))
}

fn cfg(dir: &std::path::Path, backlog: UploadBacklog) -> Config {
    let mut c = Config::builder()
        .job("backlog")
        .l1_dir(dir)
        .chunk_size(1 << 16)
        .keep_last(2)
        .gc_grace_secs(0)
        .upload_every(1);
    c.max_pending_uploads = 2;
    c.upload_backlog = backlog;
    c
}

fn l1_steps(ck: &Checkpointer) -> usize {
    ck.committed_steps().unwrap().len()
}

fn save_all(ck: &Checkpointer, n: u64) -> usize {
    let mut most = 0;
    for step in 1..=n {
        let bytes = vec![step as u8; 1 << 16];
        let shape = [1u64 << 14];
        ck.save(step, &[Entry::tensor("w", DType::F32, &shape, &bytes)])
            .unwrap()
            .wait()
            .unwrap();
        most = most.max(l1_steps(ck));
    }
    most
}

#[test]
fn past_the_bound_the_oldest_waiting_upload_is_dropped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpointer::builder(cfg(dir.path(), UploadBacklog::Drop))
        .remote(Some(slow_l3()))
        .build()
        .unwrap();
    let most = save_all(&ck, 16);
    // keep_last (2) + waiting (2) + the one being uploaded (1).
    assert!(most <= 5, "L1 held {most} steps");
    assert!(ck.dropped_uploads() > 0);
    ck.wait_uploads();
    let states = ck.uploads();
    let dropped: Vec<u64> = states
        .iter()
        .filter(|(_, st)| matches!(st, L3State::Failed(why) if why.contains("dropped")))
        .map(|(&s, _)| s)
        .collect();
    assert_eq!(dropped.len() as u64, ck.dropped_uploads(), "{states:?}");
    assert!(
        states.contains_key(&16) && matches!(states[&16], L3State::Committed { .. }),
        "the newest step still reaches L3: {states:?}"
    );
    assert!(l1_steps(&ck) <= 5);
}

#[test]
fn with_wait_saves_slow_to_l3s_pace_and_every_step_is_uploaded() {
    let dir = tempfile::tempdir().unwrap();
    let ck = Checkpointer::builder(cfg(dir.path(), UploadBacklog::Wait))
        .remote(Some(slow_l3()))
        .build()
        .unwrap();
    let most = save_all(&ck, 10);
    assert!(most <= 5, "L1 held {most} steps");
    ck.wait_uploads();
    assert_eq!(ck.dropped_uploads(), 0);
    let states = ck.uploads();
    assert_eq!(states.len(), 10);
    assert!(
        states
            .values()
            .all(|st| matches!(st, L3State::Committed { .. })),
        "{states:?}"
    );
}

#[test]
fn a_slow_peer_does_not_fill_the_disk_either() {
    let dir = tempfile::tempdir().unwrap();
    let slow_peer: Arc<dyn ChunkStore> = Arc::new(FaultStore::new(
        MemoryStore::new(),
        FaultPlan {
            latency: Duration::from_millis(150),
            ..FaultPlan::default()
        },
    ));
    let mut c = cfg(dir.path(), UploadBacklog::Drop).upload_every(0);
    c.max_pending_pushes = 2;
    c.eager_push = false;
    let ck = Checkpointer::builder(c)
        .peers(vec![strata::Tier::peer("slow", slow_peer)])
        .build()
        .unwrap();
    let most = save_all(&ck, 16);
    assert!(most <= 5, "L1 held {most} steps");
    assert!(ck.dropped_pushes() > 0);
    ck.wait_replication();
    let states = ck.replication();
    let dropped = states
        .values()
        .filter(|st| {
            matches!(st, strata::L2State::Degraded { errors, .. } if errors.iter().any(|e| e.contains("dropped")))
        })
        .count();
    assert!(dropped > 0, "{states:?}");
    assert!(
        matches!(states.get(&16), Some(strata::L2State::Replicated { .. })),
        "the newest step still reaches the peer: {states:?}"
    );
}

/// L3 that takes no chunk (presence checks and puts wait for the test to
/// open its gate): an uploader stopped dead.
#[derive(Debug)]
struct Gated {
    inner: MemoryStore,
    open: tokio::sync::Semaphore,
}

impl Gated {
    async fn pass(&self) -> strata::tiered::Result<()> {
        let _p = self.open.acquire().await.unwrap();
        Ok(())
    }
}

#[async_trait::async_trait]
impl ChunkStore for Gated {
    fn name(&self) -> &str {
        "gated"
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<strata::tiered::ChunkPut>,
        opts: strata::tiered::PutOptions,
    ) -> strata::tiered::Result<strata::tiered::PutStats> {
        self.pass().await?;
        self.inner.put_chunks_opts(job, chunks, opts).await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &strata::format::ChunkId,
        range: Option<std::ops::Range<u32>>,
    ) -> strata::tiered::Result<strata::tiered::ChunkData> {
        self.inner.get_chunk(job, id, range).await
    }
    async fn has_chunks(
        &self,
        job: &str,
        ids: &[strata::format::ChunkId],
    ) -> strata::tiered::Result<Vec<bool>> {
        self.pass().await?;
        self.inner.has_chunks(job, ids).await
    }
    async fn list_chunks(&self, job: &str) -> strata::tiered::Result<Vec<strata::format::ChunkId>> {
        self.inner.list_chunks(job).await
    }
    async fn delete_chunks(
        &self,
        job: &str,
        ids: &[strata::format::ChunkId],
    ) -> strata::tiered::Result<()> {
        self.inner.delete_chunks(job, ids).await
    }
    async fn put_manifest(
        &self,
        job: &str,
        step: u64,
        rank: u32,
        bytes: &[u8],
    ) -> strata::tiered::Result<()> {
        self.inner.put_manifest(job, step, rank, bytes).await
    }
    async fn get_manifest(
        &self,
        job: &str,
        step: u64,
        rank: u32,
    ) -> strata::tiered::Result<Vec<u8>> {
        self.inner.get_manifest(job, step, rank).await
    }
    async fn commit(&self, record: &strata::format::CommitRecord) -> strata::tiered::Result<()> {
        self.inner.commit(record).await
    }
    async fn list_steps(&self, job: &str) -> strata::tiered::Result<Vec<strata::tiered::StepInfo>> {
        self.inner.list_steps(job).await
    }
    async fn delete_step(&self, job: &str, step: u64) -> strata::tiered::Result<()> {
        self.inner.delete_step(job, step).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> strata::tiered::Result<()> {
        self.inner.delete_shard(job, step, rank).await
    }
}

/// With `wait`, a dead uploader slows each commit by at most
/// `coordination_timeout_secs`, never hangs it; the steps queued meanwhile
/// all reach L3 once it answers again.
#[test]
fn with_wait_a_dead_uploader_delays_each_commit_by_the_deadline_only() {
    let dir = tempfile::tempdir().unwrap();
    let gated = Arc::new(Gated {
        inner: MemoryStore::new(),
        open: tokio::sync::Semaphore::new(0),
    });
    let mut c = cfg(dir.path(), UploadBacklog::Wait);
    c.max_pending_uploads = 1;
    c.coordination_timeout_secs = 1;
    let ck = Checkpointer::builder(c)
        .remote(Some(gated.clone() as Arc<dyn ChunkStore>))
        .build()
        .unwrap();
    let t0 = std::time::Instant::now();
    // Step 1 is taken by the stuck uploader, step 2 waits: from step 3 on,
    // each commit waits out the deadline, then queues anyway.
    save_all(&ck, 5);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(2500),
        "the backlog bound did not hold commits back: {took:?}"
    );
    assert!(took < Duration::from_secs(15), "commits hung: {took:?}");
    assert_eq!(ck.uploads().len(), 5);
    assert!(ck
        .uploads()
        .values()
        .all(|st| !matches!(st, L3State::Committed { .. })));
    gated.open.add_permits(1 << 20);
    ck.wait_uploads();
    let states = ck.uploads();
    assert!(
        states
            .values()
            .all(|st| matches!(st, L3State::Committed { .. })),
        "{states:?}"
    );
    assert_eq!(ck.dropped_uploads(), 0);
}

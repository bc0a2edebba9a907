//! A copy (the L3 upload, a push) never commits a manifest naming a chunk
//! the destination lost while the copy ran: the chunks it found present
//! are checked again before the manifest is written, and the destination
//! counts a chunk it would soon collect (on L3, one older than half the
//! grace period) as missing, so the copy sends it again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use strata::format::{ChunkId, CommitRecord, DType};
use strata::tiered::{
    ChunkData, ChunkPut, ChunkStore, L3Options, L3Store, MemoryStore, PutStats, StepInfo,
};
use strata::tiers::copy::{copy_step, CopyOptions};
use strata::{Checkpointer, Config, Entry, TierStack};
use strata_tiered::ChunkStoreExt;

type StoreResult<T> = strata::tiered::Result<T>;

const KIB: usize = 1 << 10;

/// A checkpointer whose only tier is `store`, with step 7 saved on it
/// (256 KiB in four 64 KiB chunks).
fn saved_on(store: Arc<MemoryStore>, dir: &std::path::Path) -> Checkpointer {
    let cfg = Config::builder()
        .job("c")
        .l1_dir(dir)
        .chunk_size(64 * KIB as u32)
        .io_engine("psync");
    let ck = Checkpointer::builder(cfg)
        .tiers(TierStack::local(store))
        .build()
        .unwrap();
    // Four different chunks (no repeats inside the tensor).
    let data: Vec<u8> = (0..256 * KIB)
        .map(|j| (j.wrapping_mul(2_654_435_761) >> 11) as u8 ^ (j >> 16) as u8)
        .collect();
    let shape = [data.len() as u64];
    ck.save(7, &[Entry::tensor("w", DType::U8, &shape, &data)])
        .unwrap()
        .wait()
        .unwrap();
    ck
}

/// A destination where something happens during the copy's first chunk
/// write: `sweep` (a garbage collection deleting the chunk) or a slow
/// write (`delay`, an upload that takes a while).
#[derive(Debug)]
struct During<S> {
    inner: S,
    sweep: Option<ChunkId>,
    delay: Duration,
    fired: AtomicBool,
}

impl<S: ChunkStore> During<S> {
    /// What happens at the first chunk write, once.
    async fn during(&self) -> StoreResult<()> {
        if !self.fired.swap(true, Ordering::SeqCst) {
            if let Some(id) = self.sweep {
                self.inner.delete_chunks("c", &[id]).await?;
            }
            tokio::time::sleep(self.delay).await;
        }
        Ok(())
    }
}

#[async_trait]
impl<S: ChunkStore> ChunkStore for During<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: strata::tiered::PutOptions,
    ) -> StoreResult<PutStats> {
        // Forwarded as such: with `known_missing` L3 writes without asking
        // again, which is what rewrites (and so refreshes) a chunk it
        // counted as missing.
        self.during().await?;
        self.inner.put_chunks_opts(job, chunks, opts).await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> StoreResult<ChunkData> {
        self.inner.get_chunk(job, id, range).await
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> StoreResult<Vec<bool>> {
        self.inner.has_chunks(job, ids).await
    }
    async fn list_chunks(&self, job: &str) -> StoreResult<Vec<ChunkId>> {
        self.inner.list_chunks(job).await
    }
    async fn list_chunk_info(&self, job: &str) -> StoreResult<Vec<strata::tiered::ChunkInfo>> {
        self.inner.list_chunk_info(job).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> StoreResult<()> {
        self.inner.delete_chunks(job, ids).await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put_manifest(job, step, rank, bytes).await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> StoreResult<Vec<u8>> {
        self.inner.get_manifest(job, step, rank).await
    }
    async fn commit(&self, record: &CommitRecord) -> StoreResult<()> {
        self.inner.commit(record).await
    }
    async fn list_steps(&self, job: &str) -> StoreResult<Vec<StepInfo>> {
        self.inner.list_steps(job).await
    }
    async fn delete_step(&self, job: &str, step: u64) -> StoreResult<()> {
        self.inner.delete_step(job, step).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> StoreResult<()> {
        self.inner.delete_shard(job, step, rank).await
    }
}

/// Puts `id` (read from `src`) into `dst`: the chunk a copy will find
/// present.
async fn preplace(src: &MemoryStore, dst: &dyn ChunkStore, id: ChunkId) {
    let data = src.get_chunk("c", &id, None).await.unwrap();
    let hint = strata::format::codec::ElemHint {
        size: 1,
        float: false,
    };
    dst.put_chunks("c", vec![ChunkPut { id, hint, data }])
        .await
        .unwrap();
}

#[test]
fn a_present_chunk_swept_during_the_copy_is_sent_before_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let src = Arc::new(MemoryStore::new());
    let _ck = saved_on(src.clone(), dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = rt.block_on(src.list_chunks("c")).unwrap();
    assert_eq!(ids.len(), 4);
    let dst = During {
        inner: MemoryStore::new(),
        sweep: Some(ids[0]),
        delay: Duration::ZERO,
        fired: AtomicBool::new(false),
    };
    rt.block_on(preplace(&src, &dst.inner, ids[0]));
    let src_dyn: Arc<dyn ChunkStore> = src.clone();
    let st = rt
        .block_on(copy_step(
            &src_dyn,
            &dst,
            "c",
            7,
            0,
            CopyOptions::default(),
            &|_| {},
        ))
        .unwrap();
    assert!(dst.fired.load(Ordering::SeqCst), "the sweep ran mid-copy");
    let there = rt.block_on(dst.has_chunks("c", &ids)).unwrap();
    assert_eq!(
        there, [true; 4],
        "the committed step names a chunk the destination lost"
    );
    assert_eq!(st.chunks_sent, 4, "the lost chunk was sent too: {st:?}");
    assert_eq!(st.bytes_present, 0, "{st:?}");
}

#[test]
fn on_l3_a_reused_chunk_older_than_half_the_grace_by_the_manifest_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let src = Arc::new(MemoryStore::new());
    let _ck = saved_on(src.clone(), dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = rt.block_on(src.list_chunks("c")).unwrap();
    // Half the grace period is 1 s here; the upload takes 1.5 s.
    let l3 = {
        let _in = rt.enter();
        L3Store::from_url(
            "memory://",
            &[],
            L3Options {
                refresh_after: Some(Duration::from_secs(1)),
                ..L3Options::default()
            },
        )
        .unwrap()
    };
    let dst = During {
        inner: l3,
        sweep: None,
        delay: Duration::from_millis(1500),
        fired: AtomicBool::new(false),
    };
    // Present and fresh when the copy checks.
    rt.block_on(preplace(&src, &dst.inner, ids[0]));
    let began = SystemTime::now();
    let src_dyn: Arc<dyn ChunkStore> = src.clone();
    rt.block_on(copy_step(
        &src_dyn,
        &dst,
        "c",
        7,
        0,
        CopyOptions::default(),
        &|_| {},
    ))
    .unwrap();
    let info = rt.block_on(dst.list_chunk_info("c")).unwrap();
    let reused = info.iter().find(|c| c.id == ids[0]).unwrap();
    let touched = reused.touched.unwrap();
    assert!(
        touched > began + Duration::from_secs(1),
        "the reused chunk was not rewritten before the manifest: last written {} the copy began",
        match touched.duration_since(began) {
            Ok(d) => format!("{d:?} after"),
            Err(e) => format!("{:?} before", e.duration()),
        }
    );
}

//! [`FaultStore`] over a [`ChunkStore`]: every trait method gated by the
//! plan, chunk reads damaged where the caller's check sees it.

use std::future::Future;
use std::ops::Range;

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord, FormatError};

use super::plan::bump;
use super::{Class, Damage, Fault, FaultStore};
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};
use crate::store::{PutOptions, ReadOptions};

fn unavailable(f: Fault) -> StoreError {
    let why = match f {
        Fault::Outage => "outage",
        Fault::Error => "transient error",
        Fault::Timeout => "timed out",
        Fault::Drop => "connection dropped",
    };
    StoreError::Unavailable(format!("{why} (injected by FaultStore)"))
}

impl<S: ChunkStore> FaultStore<S> {
    /// One call through the plan: the gate, the tier, then the drop.
    async fn call<T>(&self, class: Class, inner: impl Future<Output = Result<T>>) -> Result<T> {
        let mut call = self.gate(class).await.map_err(unavailable)?;
        let r = inner.await;
        self.close(&mut call, r.is_ok()).map_err(unavailable)?;
        r
    }

    /// A verified read's damage: the `Corrupt` error a tier would report.
    fn verified(&self, id: &ChunkId, d: Damage, r: Result<ChunkData>) -> Result<ChunkData> {
        let data = r?;
        let why = match d {
            Damage::None => return Ok(data),
            Damage::Flip(_) => {
                bump(&self.counts.corruptions);
                "damaged"
            }
            Damage::Cut(_) => {
                bump(&self.counts.truncations);
                "truncated"
            }
        };
        Err(StoreError::Corrupt {
            what: format!("chunk {id} in {}", self.inner.name()),
            source: FormatError::HashMismatch {
                expected: id.to_hex(),
                actual: format!("bytes {why} by FaultStore"),
            },
        })
    }

    /// A batch read: entries fail or time out one by one, the rest go to the
    /// tier in one call, then reads are damaged (`verify` says how).
    async fn batch<'a, F, Fut>(
        &'a self,
        ids: &'a [ChunkId],
        verify: bool,
        read: F,
    ) -> Vec<Result<ChunkData>>
    where
        F: FnOnce(Vec<ChunkId>) -> Fut,
        Fut: Future<Output = Vec<Result<ChunkData>>>,
    {
        let failed = |f: Fault| -> Vec<Result<ChunkData>> {
            ids.iter().map(|_| Err(unavailable(f))).collect()
        };
        let mut call = match self.open(Class::Read) {
            Ok(c) => c,
            Err(f) => return failed(f),
        };
        if !call.delay.is_zero() {
            tokio::time::sleep(call.delay).await;
        }
        let plan: Vec<(Option<Fault>, Damage)> = ids
            .iter()
            .map(|_| (self.draw_failure(&mut call), self.draw_damage(&mut call)))
            .collect();
        if plan.iter().any(|(f, _)| matches!(f, Some(Fault::Timeout))) {
            tokio::time::sleep(self.plan.timeout).await;
        }
        let pass: Vec<ChunkId> = ids
            .iter()
            .zip(&plan)
            .filter(|(_, (fail, _))| fail.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut got = read(pass).await.into_iter();
        if let Err(f) = self.close(&mut call, true) {
            return failed(f);
        }
        let mut out = Vec::with_capacity(ids.len());
        for (id, (fail, damage)) in ids.iter().zip(plan) {
            if let Some(f) = fail {
                out.push(Err(unavailable(f)));
                continue;
            }
            let r = got.next().unwrap_or_else(|| {
                Err(StoreError::Internal(
                    "the tier returned too few results".into(),
                ))
            });
            out.push(match (verify, r) {
                (true, r) => self.verified(id, damage, r),
                (false, Ok(data)) if !matches!(damage, Damage::None) => {
                    let mut bytes = data.as_slice().to_vec();
                    self.damage_bytes(&damage, &mut bytes);
                    Ok(ChunkData::copy_from(&bytes))
                }
                (false, r) => r,
            });
        }
        out
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ChunkStore> ChunkStore for FaultStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        self.call(Class::Write, self.inner.put_chunks_opts(job, chunks, opts))
            .await
    }
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        let verified = !opts.unverified;
        self.batch(ids, verified, |pass| async move {
            self.inner.get_chunks_opts(job, &pass, opts).await
        })
        .await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let mut call = self.gate(Class::Read).await.map_err(unavailable)?;
        let damage = self.draw_damage(&mut call);
        let r = self.inner.get_chunk(job, id, range).await;
        self.close(&mut call, r.is_ok()).map_err(unavailable)?;
        self.verified(id, damage, r)
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.call(Class::Read, self.inner.has_chunks(job, ids))
            .await
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        self.call(Class::List, self.inner.list_chunks(job)).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.call(Class::Write, self.inner.delete_chunks(job, ids))
            .await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.call(
            Class::Write,
            self.inner.put_manifest(job, step, rank, bytes),
        )
        .await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.call(Class::Read, self.inner.get_manifest(job, step, rank))
            .await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.call(Class::Commit, self.inner.commit(record)).await
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.call(Class::List, self.inner.list_steps(job)).await
    }
    async fn get_commit_record(
        &self,
        job: &str,
        step: u64,
        first: u32,
    ) -> Result<Option<CommitRecord>> {
        self.call(Class::Read, self.inner.get_commit_record(job, step, first))
            .await
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.call(Class::Write, self.inner.delete_step(job, step))
            .await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.call(Class::Write, self.inner.delete_shard(job, step, rank))
            .await
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        let mut call = self.gate(Class::Read).await.map_err(unavailable)?;
        let damage = self.draw_damage(&mut call);
        let r = self.inner.get_frame(job, id, buf).await;
        self.close(&mut call, r.is_ok()).map_err(unavailable)?;
        let mut frame = r?;
        // The frame is checked when decoded: damage its stored bytes.
        self.damage_bytes(&damage, &mut frame.bytes);
        Ok(frame)
    }
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        self.call(Class::List, self.inner.list_chunk_info(job))
            .await
    }
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        self.call(
            Class::Write,
            self.inner.delete_chunks_untouched_since(job, ids, cutoff),
        )
        .await
    }
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        self.call(Class::Write, self.inner.set_pin(job, step, pinned))
            .await
    }
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        self.call(Class::List, self.inner.list_pins(job)).await
    }
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        self.call(Class::List, self.inner.now(job)).await
    }
    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        self.call(Class::List, self.inner.abort_stale_uploads(job, cutoff))
            .await
    }
    fn concurrency(&self) -> usize {
        self.inner.concurrency()
    }
    fn describe(&self) -> String {
        format!(
            "{} (faults injected, seed {})",
            self.inner.describe(),
            self.plan.seed
        )
    }
}

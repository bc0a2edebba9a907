//! [`FaultStore`]: seeded, replayable fault injection over any tier.
//!
//! Unlike [`crate::faults::FaultyStore`] (which wraps an `ObjectStore`
//! under L3), this wraps the trait itself, so L1, peers and user stores
//! can be tested under the same faults. Every call advances one seeded
//! generator under a mutex and takes its own sub-generator from it, so the
//! same seed and the same sequence of calls give the same faults.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use strata_format::{ChunkId, CommitRecord, FormatError};

use super::fault_plan::{bump, Counters, FaultCounts, FaultPlan};
use super::rng::SplitMix64;
use crate::aligned::AlignedBuf;
use crate::chunk_data::ChunkData;
use crate::error::{Result, StoreError};
use crate::l3::Frame;
use crate::store::{ChunkInfo, ChunkPut, ChunkStore, PutStats, StepInfo};

#[derive(Clone, Copy)]
enum Class {
    Read,
    Write,
    List,
    Commit,
}

#[derive(Debug)]
struct State {
    rng: SplitMix64,
    ops: u64,
    healed: bool,
}

/// One call's own generator, and whether the plan targets it.
struct Call {
    rng: SplitMix64,
    hit: bool,
}

/// What to do to one chunk read.
enum Damage {
    None,
    Flip(u64),
    Cut(u64),
}

/// Injects the faults of a [`FaultPlan`] into calls to the inner store.
/// Errors are injected before the call reaches the tier (so nothing
/// happened, and a retry sees the same state).
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    plan: FaultPlan,
    state: Mutex<State>,
    counts: Counters,
}

fn unavailable(why: &str) -> StoreError {
    StoreError::Unavailable(format!("{why} (injected by FaultStore)"))
}

impl<S: ChunkStore> FaultStore<S> {
    /// Wraps `inner` with `plan`.
    pub fn new(inner: S, plan: FaultPlan) -> Self {
        FaultStore {
            inner,
            state: Mutex::new(State {
                rng: SplitMix64::new(plan.seed),
                ops: 0,
                healed: false,
            }),
            plan,
            counts: Counters::default(),
        }
    }

    /// Ends the outage of [`FaultPlan::outage_after`] for good.
    pub fn heal(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.healed = true;
        }
    }

    /// The faults injected so far.
    pub fn counts(&self) -> FaultCounts {
        self.counts.snapshot()
    }

    /// The plan.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Counts a call, applies the outage and the latency.
    async fn enter(&self, class: Class) -> Result<Call> {
        let (seed, down) = {
            let mut st = self
                .state
                .lock()
                .map_err(|_| StoreError::Internal("fault store lock poisoned".into()))?;
            st.ops += 1;
            let down = self.plan.outage_after.is_some_and(|n| st.ops > n) && !st.healed;
            (st.rng.next_u64(), down)
        };
        bump(&self.counts.ops);
        if down {
            bump(&self.counts.outage_failures);
            return Err(unavailable("outage"));
        }
        let t = self.plan.targets;
        let hit = match class {
            Class::Read => t.reads,
            Class::Write => t.writes,
            Class::List => t.listing,
            Class::Commit => t.commit,
        };
        let mut call = Call {
            rng: SplitMix64::new(seed),
            hit,
        };
        let jitter = u64::try_from(self.plan.latency_jitter.as_nanos()).unwrap_or(u64::MAX);
        let delay = self.plan.latency + Duration::from_nanos(call.rng.up_to(jitter));
        if hit && !delay.is_zero() {
            bump(&self.counts.delays);
            tokio::time::sleep(delay).await;
        }
        Ok(call)
    }

    /// [`Self::enter`], then the error draw of a single call.
    async fn gate(&self, class: Class) -> Result<Call> {
        let mut call = self.enter(class).await?;
        if call.rng.chance(self.plan.error_rate) && call.hit {
            bump(&self.counts.errors);
            return Err(unavailable("transient error"));
        }
        Ok(call)
    }

    /// Draws what happens to one chunk read (always the same draws, so the
    /// sequence does not depend on the data).
    fn draw_damage(&self, call: &mut Call) -> Damage {
        let corrupt = call.rng.chance(self.plan.corrupt_rate);
        let cut = call.rng.chance(self.plan.truncate_rate);
        let at = call.rng.next_u64();
        match (call.hit, corrupt, cut) {
            (true, true, _) => Damage::Flip(at),
            (true, false, true) => Damage::Cut(at),
            _ => Damage::None,
        }
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

    /// Damages bytes in place: a flipped bit, or a shorter length.
    fn damage_bytes(&self, d: &Damage, bytes: &mut Vec<u8>) {
        let n = bytes.len() as u64;
        if n == 0 {
            return;
        }
        match *d {
            Damage::None => {}
            Damage::Flip(at) => {
                bump(&self.counts.corruptions);
                if let Some(b) = bytes.get_mut((at % n) as usize) {
                    *b ^= 1 << (at >> 61);
                }
            }
            Damage::Cut(at) => {
                bump(&self.counts.truncations);
                let cut = 1 + at % n.min(64);
                bytes.truncate((n - cut) as usize);
            }
        }
    }

    /// A batch read: entries fail one by one, the rest go to the tier in
    /// one call, then reads are damaged (`verify` says how).
    async fn batch<'a, F, Fut>(
        &'a self,
        ids: &'a [ChunkId],
        verify: bool,
        read: F,
    ) -> Vec<Result<ChunkData>>
    where
        F: FnOnce(Vec<ChunkId>) -> Fut,
        Fut: std::future::Future<Output = Vec<Result<ChunkData>>>,
    {
        let mut call = match self.enter(Class::Read).await {
            Ok(c) => c,
            Err(e) => {
                let why = e.to_string();
                return ids
                    .iter()
                    .map(|_| Err(StoreError::Unavailable(why.clone())))
                    .collect();
            }
        };
        let plan: Vec<(bool, Damage)> = ids
            .iter()
            .map(|_| {
                let fail = call.rng.chance(self.plan.error_rate) && call.hit;
                (fail, self.draw_damage(&mut call))
            })
            .collect();
        let pass: Vec<ChunkId> = ids
            .iter()
            .zip(&plan)
            .filter(|(_, (fail, _))| !fail)
            .map(|(id, _)| *id)
            .collect();
        let mut got = read(pass).await.into_iter();
        let mut out = Vec::with_capacity(ids.len());
        for (id, (fail, damage)) in ids.iter().zip(plan) {
            if fail {
                bump(&self.counts.errors);
                out.push(Err(unavailable("transient error")));
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
    async fn put_chunks(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        self.gate(Class::Write).await?;
        self.inner.put_chunks(job, chunks).await
    }
    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        let mut call = self.gate(Class::Read).await?;
        let damage = self.draw_damage(&mut call);
        let r = self.inner.get_chunk(job, id, range).await;
        self.verified(id, damage, r)
    }
    async fn get_chunks(&self, job: &str, ids: &[ChunkId]) -> Vec<Result<ChunkData>> {
        self.batch(ids, true, |pass| async move {
            self.inner.get_chunks(job, &pass).await
        })
        .await
    }
    async fn get_chunks_reusing(
        &self,
        job: &str,
        ids: &[ChunkId],
        spare: Vec<AlignedBuf>,
    ) -> Vec<Result<ChunkData>> {
        self.batch(ids, true, |pass| async move {
            self.inner.get_chunks_reusing(job, &pass, spare).await
        })
        .await
    }
    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.gate(Class::Read).await?;
        self.inner.has_chunks(job, ids).await
    }
    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        self.gate(Class::List).await?;
        self.inner.list_chunks(job).await
    }
    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.gate(Class::Write).await?;
        self.inner.delete_chunks(job, ids).await
    }
    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.gate(Class::Write).await?;
        self.inner.put_manifest(job, step, rank, bytes).await
    }
    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.gate(Class::Read).await?;
        self.inner.get_manifest(job, step, rank).await
    }
    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        self.gate(Class::Commit).await?;
        self.inner.commit(record).await
    }
    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        self.gate(Class::List).await?;
        self.inner.list_steps(job).await
    }
    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.gate(Class::Write).await?;
        self.inner.delete_step(job, step).await
    }
    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.gate(Class::Write).await?;
        self.inner.delete_shard(job, step, rank).await
    }
    async fn put_missing_chunks(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        self.gate(Class::Write).await?;
        self.inner.put_missing_chunks(job, chunks).await
    }
    async fn get_chunks_unverified(&self, job: &str, ids: &[ChunkId]) -> Vec<Result<ChunkData>> {
        self.batch(ids, false, |pass| async move {
            self.inner.get_chunks_unverified(job, &pass).await
        })
        .await
    }
    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        let mut call = self.gate(Class::Read).await?;
        let damage = self.draw_damage(&mut call);
        let mut frame = self.inner.get_frame(job, id, buf).await?;
        // The frame is checked when decoded: damage its stored bytes.
        self.damage_bytes(&damage, &mut frame.bytes);
        Ok(frame)
    }
    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        self.gate(Class::List).await?;
        self.inner.list_chunk_info(job).await
    }
    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: std::time::SystemTime,
    ) -> Result<(u64, u64)> {
        self.gate(Class::Write).await?;
        self.inner
            .delete_chunks_untouched_since(job, ids, cutoff)
            .await
    }
    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        self.gate(Class::Write).await?;
        self.inner.set_pin(job, step, pinned).await
    }
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        self.gate(Class::List).await?;
        self.inner.list_pins(job).await
    }
    async fn now(&self, job: &str) -> Result<std::time::SystemTime> {
        self.gate(Class::List).await?;
        self.inner.now(job).await
    }
    async fn abort_stale_uploads(&self, job: &str, cutoff: std::time::SystemTime) -> Result<u64> {
        self.gate(Class::List).await?;
        self.inner.abort_stale_uploads(job, cutoff).await
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

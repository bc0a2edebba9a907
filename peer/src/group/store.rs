//! [`PeerGroup`] as a [`ChunkStore`]: one tier over the ring.
//!
//! * **Writes** (chunks, manifests) go to the first `R` members that take
//!   them, a round at a time; they succeed once one member holds them (R
//!   copies are the goal, not the condition: a step's push reports how many
//!   it reached through [`PeerGroup::spread`]). A member's "already there"
//!   (a committed manifest) ends the write at once; any other failure,
//!   including a member refusing the request (another version), moves on to
//!   the next member.
//! * **Commit records** go to the members in order until `R` hold them; a
//!   member holding a different record for the slot makes the commit
//!   `AlreadyExists`, whichever member it is (a member that came back empty
//!   never lets a second record win), and a listing in which members hold
//!   different records for one slot reports the slot unreadable.
//! * **Reads** go to the members in ring order, chunk by chunk: a copy that
//!   is missing, damaged or unreachable is read from the next member
//!   (verified reads; the unverified ones are checked by their caller).
//!   When none has a good copy the error is the most telling one: damaged,
//!   then missing from every member that answered, then unreachable (only
//!   when no member could be asked). Missing with a member down is reported
//!   as missing, as every tier reports what it does not hold: the caller
//!   falls back to the next tier either way.
//! * **Presence** is what the first `R` reachable members all hold: a chunk
//!   only a fallback member has is sent again, so a step's chunks end on
//!   the members that hold its manifest.
//! * **Listings, deletes and pins** need every member: one that cannot be
//!   reached makes them `Unavailable`, so a listing is never partial (a
//!   caller deciding what to delete must never take it for complete) and a
//!   delete never leaves a copy that comes back later.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use futures::future::join_all;
use strata_format::{ChunkId, CommitRecord};
use strata_tiered::{
    ChunkData, ChunkInfo, ChunkPut, ChunkStore, Frame, PutOptions, PutStats, ReadOptions, Result,
    StepInfo, StoreError, StoreErrorKind,
};

use super::{Member, PeerGroup};

/// An answer about what the group holds rather than about the member: no
/// other member may answer differently. A member's `Invalid` is not one:
/// a peer of another version refuses requests the others take.
fn is_verdict(e: &StoreError) -> bool {
    e.kind() == StoreErrorKind::AlreadyExists
}

/// How much an error tells a caller when no member had a good copy.
fn weight(e: &StoreError) -> u8 {
    match e.kind() {
        StoreErrorKind::Corrupt => 4,
        StoreErrorKind::Invalid => 3,
        StoreErrorKind::NotFound => 2,
        _ => 1,
    }
}

/// Keeps the more telling of two errors (the earlier on a tie).
fn keep(best: &mut Option<StoreError>, e: StoreError) {
    if best.as_ref().is_none_or(|b| weight(&e) > weight(b)) {
        *best = Some(e);
    }
}

fn no_members(what: &str) -> StoreError {
    StoreError::Unavailable(format!("{what}: the peer group has no members"))
}

impl PeerGroup {
    /// Runs a write on the first `R` members that take it.
    async fn write_r<'a, T, F, Fut>(&'a self, what: &str, op: F) -> Result<T>
    where
        F: Fn(&'a Member) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let want = self.replicas.max(1);
        let mut first: Option<T> = None;
        let mut took = 0;
        let mut errors: Vec<(String, StoreError)> = Vec::new();
        let mut next = 0;
        while took < want && next < self.members.len() {
            let round = &self.members[next..(next + want - took).min(self.members.len())];
            next += round.len();
            for (m, r) in round.iter().zip(join_all(round.iter().map(&op)).await) {
                match r {
                    Ok(v) => {
                        took += 1;
                        first.get_or_insert(v);
                    }
                    Err(e) if is_verdict(&e) => return Err(e),
                    Err(e) => errors.push((m.node.clone(), e)),
                }
            }
        }
        if let Some(v) = first {
            if took < want {
                tracing::debug!(what, took, want, "written to fewer peers than wanted");
            }
            return Ok(v);
        }
        Err(failed_everywhere(what, errors))
    }

    /// Runs a read on the members in order until one answers.
    async fn read_first<'a, T, F, Fut>(&'a self, what: &str, op: F) -> Result<T>
    where
        F: Fn(&'a Member) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let mut best = None;
        for m in &self.members {
            match op(m).await {
                Ok(v) => return Ok(v),
                Err(e) => keep(&mut best, e),
            }
        }
        Err(best.unwrap_or_else(|| no_members(what)))
    }

    /// Runs an operation on every member at once: every answer, or the
    /// first member's error (one that cannot be reached makes the whole
    /// operation `Unavailable`: nothing partial passes for complete).
    async fn on_all<'a, T, F, Fut>(&'a self, what: &str, op: F) -> Result<Vec<T>>
    where
        F: Fn(&'a Member) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        if self.members.is_empty() {
            return Err(no_members(what));
        }
        let mut ok = Vec::with_capacity(self.members.len());
        for (m, r) in self
            .members
            .iter()
            .zip(join_all(self.members.iter().map(&op)).await)
        {
            match r {
                Ok(v) => ok.push(v),
                Err(e) if e.kind() == StoreErrorKind::Unavailable => {
                    return Err(StoreError::Unavailable(format!(
                        "{what}: peer {} cannot be reached, so the group cannot answer whole: {e}",
                        m.node
                    )))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(ok)
    }

    /// Batch reads with per-chunk fallback to the next member.
    async fn read_chunks(
        &self,
        job: &str,
        ids: &[ChunkId],
        verified: bool,
    ) -> Vec<Result<ChunkData>> {
        let mut out: Vec<Option<Result<ChunkData>>> = ids.iter().map(|_| None).collect();
        let mut best: Vec<Option<StoreError>> = ids.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..ids.len()).collect();
        for m in &self.members {
            if pending.is_empty() {
                break;
            }
            let want: Vec<ChunkId> = pending.iter().map(|&i| ids[i]).collect();
            let opts = ReadOptions {
                unverified: !verified,
                ..ReadOptions::default()
            };
            let got = m.store.get_chunks_opts(job, &want, opts).await;
            let mut still = Vec::new();
            let answered = got.len();
            for &i in pending.iter().skip(answered) {
                // A member that answered fewer ids than asked: the rest
                // stay pending, with a reason.
                keep(
                    &mut best[i],
                    StoreError::Internal(format!("peer {} left a read unanswered", m.node)),
                );
                still.push(i);
            }
            for (i, r) in pending.iter().copied().zip(got) {
                match r {
                    Ok(d) => out[i] = Some(Ok(d)),
                    Err(e) => {
                        keep(&mut best[i], e);
                        still.push(i);
                    }
                }
            }
            pending = still;
        }
        out.into_iter()
            .zip(best)
            .map(|(o, b)| match o {
                Some(r) => r,
                None => Err(b.unwrap_or_else(|| no_members("chunk read"))),
            })
            .collect()
    }
}

/// The error of an operation no member could do: the member's own when
/// one was tried or all failed alike (all full, all missing it), else
/// `Unavailable` naming each.
fn failed_everywhere(what: &str, errors: Vec<(String, StoreError)>) -> StoreError {
    let same = errors.windows(2).all(|w| w[0].1.kind() == w[1].1.kind());
    let why: Vec<String> = errors.iter().map(|(n, e)| format!("{n}: {e}")).collect();
    let mut errors = errors.into_iter().map(|(_, e)| e);
    match errors.next() {
        None => no_members(what),
        Some(e) if why.len() == 1 || (same && e.kind() != StoreErrorKind::Unavailable) => e,
        Some(_) => {
            StoreError::Unavailable(format!("{what}: no peer could do it ({})", why.join("; ")))
        }
    }
}

/// Merges the members' listings of one job: every step any holds, each
/// record from the first member (ring order) that holds it readable.
fn merge_steps(lists: Vec<Vec<StepInfo>>) -> Vec<StepInfo> {
    let mut by_step: BTreeMap<u64, StepInfo> = BTreeMap::new();
    for list in lists {
        for info in list {
            let st = by_step.entry(info.step).or_insert_with(|| StepInfo {
                step: info.step,
                ..StepInfo::default()
            });
            for (slot, rec) in info.records {
                match st.records.get(&slot) {
                    None => {
                        st.records.insert(slot, rec);
                    }
                    Some(held) if *held == rec => {}
                    Some(_) => {
                        // Never one of two records picked silently.
                        st.unreadable.insert(
                            slot,
                            "the peers hold different commit records for this slot".into(),
                        );
                    }
                }
            }
            st.manifests.extend(info.manifests);
            for (slot, why) in info.unreadable {
                st.unreadable.entry(slot).or_insert(why);
            }
            st.retiring.extend(info.retiring);
        }
    }
    let mut out: Vec<StepInfo> = by_step.into_values().collect();
    for st in &mut out {
        // Members disagreeing on a slot: it is unreadable, not committed.
        let split: Vec<u32> = st
            .unreadable
            .iter()
            .filter(|(_, why)| why.starts_with("the peers hold different"))
            .map(|(slot, _)| *slot)
            .collect();
        for slot in split {
            st.records.remove(&slot);
        }
        // A record damaged on one member and good on another is readable.
        let good: BTreeSet<u32> = st.records.keys().copied().collect();
        st.unreadable.retain(|slot, _| !good.contains(slot));
    }
    out
}

#[async_trait]
impl ChunkStore for PeerGroup {
    fn name(&self) -> &str {
        &self.name
    }

    /// `known_missing` was asked of the group (the first R members): each
    /// member checks for itself.
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        _opts: PutOptions,
    ) -> Result<PutStats> {
        self.write_r("put chunks", |m| {
            m.store
                .put_chunks_opts(job, chunks.clone(), PutOptions::default())
        })
        .await
    }

    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        self.read_first("chunk read", |m| m.store.get_chunk(job, id, range.clone()))
            .await
    }

    /// The spare buffers are not used: which member serves which chunk is
    /// known only as the reads go.
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        self.read_chunks(job, ids, !opts.unverified).await
    }

    async fn get_frame(&self, job: &str, id: ChunkId, buf: Vec<u8>) -> Result<Frame> {
        let buf = std::sync::Mutex::new(Some(buf));
        self.read_first("frame read", |m| {
            let b = buf
                .lock()
                .ok()
                .and_then(|mut g| g.take())
                .unwrap_or_default();
            m.store.get_frame(job, id, b)
        })
        .await
    }

    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let want = self.replicas.max(1);
        let mut out: Option<Vec<bool>> = None;
        let mut answered = 0;
        let mut best = None;
        for m in &self.members {
            if answered == want {
                break;
            }
            match m.store.has_chunks(job, ids).await {
                Ok(a) if a.len() == ids.len() => {
                    answered += 1;
                    match &mut out {
                        None => out = Some(a),
                        Some(o) => o.iter_mut().zip(a).for_each(|(o, h)| *o &= h),
                    }
                }
                Ok(_) => keep(
                    &mut best,
                    StoreError::Internal(format!(
                        "peer {} answered a presence check short",
                        m.node
                    )),
                ),
                Err(e) => keep(&mut best, e),
            }
        }
        out.ok_or_else(|| best.unwrap_or_else(|| no_members("presence check")))
    }

    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        let lists = self
            .on_all("chunk listing", |m| m.store.list_chunks(job))
            .await?;
        let mut seen = HashSet::new();
        Ok(lists
            .into_iter()
            .flatten()
            .filter(|id| seen.insert(*id))
            .collect())
    }

    async fn list_chunk_info(&self, job: &str) -> Result<Vec<ChunkInfo>> {
        let lists = self
            .on_all("chunk listing", |m| m.store.list_chunk_info(job))
            .await?;
        // The youngest copy dates a chunk: retention never takes a chunk
        // one member touched recently for an old one.
        let mut by_id: HashMap<ChunkId, ChunkInfo> = HashMap::new();
        for c in lists.into_iter().flatten() {
            by_id
                .entry(c.id)
                .and_modify(|k| {
                    k.touched = match (k.touched, c.touched) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    k.stored_len = k.stored_len.or(c.stored_len);
                })
                .or_insert(c);
        }
        Ok(by_id.into_values().collect())
    }

    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        self.on_all("chunk delete", |m| m.store.delete_chunks(job, ids))
            .await
            .map(drop)
    }

    async fn delete_chunks_untouched_since(
        &self,
        job: &str,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<(u64, u64)> {
        let done = self
            .on_all("chunk delete", |m| {
                m.store.delete_chunks_untouched_since(job, ids, cutoff)
            })
            .await?;
        Ok(done
            .into_iter()
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d)))
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        self.write_r("put manifest", |m| {
            m.store.put_manifest(job, step, rank, bytes)
        })
        .await
    }

    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        self.read_first("manifest read", |m| m.store.get_manifest(job, step, rank))
            .await
    }

    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        let want = self.replicas.max(1);
        let mut errors = Vec::new();
        let mut took = 0;
        for m in &self.members {
            if took == want {
                break;
            }
            match m.store.commit(record).await {
                Ok(()) => took += 1,
                // Another record holds the slot on this member: it was
                // committed first, wherever the members that took this one
                // stand (a member that came back empty, say).
                Err(e) if is_verdict(&e) => {
                    if took > 0 {
                        tracing::warn!(
                            node = %m.node,
                            step = record.step,
                            "a peer holds another commit record for the slot; the group refuses this one"
                        );
                    }
                    return Err(e);
                }
                Err(e) => errors.push((m.node.clone(), e)),
            }
        }
        if took > 0 {
            Ok(())
        } else {
            Err(failed_everywhere("commit", errors))
        }
    }

    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        let lists = self
            .on_all("step listing", |m| m.store.list_steps(job))
            .await?;
        Ok(merge_steps(lists))
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        self.on_all("step delete", |m| m.store.delete_step(job, step))
            .await
            .map(drop)
    }

    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        self.on_all("shard delete", |m| m.store.delete_shard(job, step, rank))
            .await
            .map(drop)
    }

    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        self.on_all("pin", |m| m.store.set_pin(job, step, pinned))
            .await
            .map(drop)
    }

    async fn list_pins(&self, job: &str) -> Result<BTreeSet<u64>> {
        let sets = self
            .on_all("pin listing", |m| m.store.list_pins(job))
            .await?;
        Ok(sets.into_iter().flatten().collect())
    }

    async fn now(&self, job: &str) -> Result<SystemTime> {
        self.read_first("clock", |m| m.store.now(job)).await
    }

    async fn abort_stale_uploads(&self, job: &str, cutoff: SystemTime) -> Result<u64> {
        let n = self
            .on_all("abort uploads", |m| {
                m.store.abort_stale_uploads(job, cutoff)
            })
            .await?;
        Ok(n.into_iter().sum())
    }

    fn concurrency(&self) -> usize {
        self.members
            .iter()
            .map(|m| m.store.concurrency())
            .max()
            .unwrap_or(1)
    }

    fn describe(&self) -> String {
        let nodes: Vec<&str> = self.members.iter().map(|m| m.node.as_str()).collect();
        format!(
            "peer group: {} copies over [{}]",
            self.replicas,
            nodes.join(", ")
        )
    }
}

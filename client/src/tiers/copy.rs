//! Copying a committed shard from one tier to another: the one primitive
//! behind the L3 upload, the push to a peer, the CLI's repair of a tier
//! that lost a shard, and (its last half, [`commit_copy`]) the write-back
//! of a restore read from another tier.
//!
//! The order is the commit protocol's: chunks first (only the ids the
//! destination lacks, one presence check for the shard), then the
//! manifest, then the source's commit record byte for byte, create-only.
//! A crash part-way leaves no record in the destination (the step is not
//! committed there), and the next copy sends only what is still missing.
//! Copying a shard the destination already holds committed finds every
//! chunk present and the identical record, and succeeds. Chunks found
//! present are checked again just before the manifest (when the copy took
//! any time): a destination that collected one meanwhile, or would soon
//! (an L3 chunk older than half the grace period), gets it again, so the
//! manifest never names a chunk garbage collection took under the copy.

use std::sync::Arc;

use strata_format::{ChunkId, ShardManifest};
use strata_tiered::{AlignedBuf, ChunkData, ChunkPut, ChunkStore, ReadOptions, StepInfo};

use super::catalog::{load_shard, LoadedShard};
use super::recycle::Recycler;
use crate::error::{Error, Result};
use strata_tiered::ChunkStoreExt;

/// How processes that copy from sources holding the same chunks (ranks of
/// one node, whose data-parallel tensors are identical) share the work of
/// sending them to one destination: each chunk is sent by the process that
/// claims it; the others wait until the destination holds it.
pub trait PushCoordination: Send + Sync {
    /// Claims `id`: a guard (the claim ends when it is dropped) if this
    /// process is to send it, None if another process is sending it.
    fn claim(&self, id: &ChunkId) -> Option<Box<dyn Send>>;
    /// Whether another process's claim of `id` is still live.
    fn sibling_sending(&self, id: &ChunkId) -> bool;
}

/// What a background copy yields to: awaited before each batch is read
/// and sent (the process's foreground work, a snapshot or a restore,
/// holds it back for a bounded time).
pub trait Pause: Send + Sync {
    /// Resolves when the copy may read and send its next batch.
    fn before_batch(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;

    /// Offered the copy's free read buffers before it holds back: `Ok`
    /// when taken (the work it yields to may read into them), and then
    /// [`Pause::take_back`] is called once it goes on; `Err` hands them
    /// back. By default nothing is taken.
    fn lend_spares(&self, spares: Vec<AlignedBuf>) -> std::result::Result<(), Vec<AlignedBuf>> {
        Err(spares)
    }

    /// The buffers a copy whose spares were taken gets back as it goes
    /// on, up to `limit` bytes (what the work it yielded to did not keep).
    fn take_back(&self, limit: usize) -> Vec<AlignedBuf> {
        let _ = limit;
        Vec::new()
    }
}

/// Holds a copy back before a batch ([`Pause::before_batch`]), its free
/// read buffers lent meanwhile and what is left of them taken back after.
pub(crate) async fn hold(pause: Option<&dyn Pause>, recycler: &mut Recycler) {
    let Some(p) = pause else { return };
    let lent = match p.lend_spares(recycler.take_free()) {
        Ok(()) => Lent(Some(p)),
        Err(kept) => {
            recycler.keep_free(kept);
            Lent(None)
        }
    };
    p.before_batch().await;
    recycler.keep_free(lent.end(recycler.limit()));
}

/// A copy's loan of its spare buffers: ended on drop too (a copy dropped
/// while held still counts as gone on).
struct Lent<'a>(Option<&'a dyn Pause>);

impl Lent<'_> {
    fn end(mut self, limit: usize) -> Vec<AlignedBuf> {
        self.0
            .take()
            .map(|p| p.take_back(limit))
            .unwrap_or_default()
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            drop(p.take_back(0));
        }
    }
}

/// How long a copy waits for chunks another process claimed to reach the
/// destination before it sends them itself.
const SIBLING_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Who hashes the chunks read from the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Here, as they are read (for a destination that stores what it gets).
    Here,
    /// The destination, which verifies every chunk against its id itself
    /// (a peer service): the hash is paid once, there, and a damaged source
    /// chunk is refused by it.
    Receiver,
}

/// How a copy runs.
#[derive(Clone, Copy)]
pub struct CopyOptions<'a> {
    /// Most chunk bytes read and sent per batch. Up to about four batches
    /// are in memory at once: the next one is read while the current one
    /// is sent, and up to two batches of sent buffers are kept for the
    /// next reads (`recycle.rs`).
    pub batch_bytes: u64,
    /// Who verifies the chunks read from the source.
    pub verify: Verify,
    /// Other processes sending the same chunks to the same destination
    /// (the ranks of a node): chunks they claimed are left to them.
    pub siblings: Option<&'a dyn PushCoordination>,
    /// Held back before each batch by this (a background copy yields to
    /// the process's snapshots and restores); None: never held.
    pub pause: Option<&'a dyn Pause>,
}

impl std::fmt::Debug for CopyOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyOptions")
            .field("batch_bytes", &self.batch_bytes)
            .field("verify", &self.verify)
            .field("siblings", &self.siblings.is_some())
            .field("pause", &self.pause.is_some())
            .finish()
    }
}

impl Default for CopyOptions<'_> {
    fn default() -> Self {
        CopyOptions {
            batch_bytes: 64 << 20,
            verify: Verify::Here,
            siblings: None,
            pause: None,
        }
    }
}

/// What a copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Distinct chunks of the shard.
    pub chunks: u64,
    /// Of those, the chunks the destination lacked (read and sent).
    pub chunks_sent: u64,
    /// Chunk bytes sent (raw lengths).
    pub bytes_sent: u64,
    /// Bytes the destination says it wrote for them (its own encoding; a
    /// chunk another writer put meanwhile is not counted).
    pub bytes_written: u64,
    /// Chunk bytes the destination already held.
    pub bytes_present: u64,
}

/// A copy's progress, reported to the caller as it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyProgress {
    /// The presence check is done: `total` chunk bytes are to be sent.
    Planned {
        /// Bytes to send.
        total: u64,
    },
    /// A batch of `bytes` chunk bytes was sent. The sum may pass the
    /// planned total by the chunks the destination lost while the copy
    /// ran (sent again before the manifest).
    Sent {
        /// Bytes in the batch.
        bytes: u64,
    },
}

/// Copies rank `rank`'s shard of `step` from `src` to `dst` and commits it
/// there: the shard's manifest is read from `src` and checked against the
/// commit record `src` lists for it, then [`copy_shard`] runs. Must run on
/// a tokio runtime (the reads are tasks of their own).
pub async fn copy_step(
    src: &Arc<dyn ChunkStore>,
    dst: &dyn ChunkStore,
    job: &str,
    step: u64,
    rank: u32,
    opts: CopyOptions<'_>,
    progress: &(dyn Fn(CopyProgress) + Send + Sync),
) -> Result<CopyStats> {
    let steps: Vec<StepInfo> = src.list_steps(job).await?;
    let shard = load_shard(&**src, job, &steps, step, rank).await?;
    copy_shard(src, dst, job, &shard, opts, progress).await
}

/// Copies a shard already loaded (and checked) from `src` to `dst`: the
/// chunks `dst` lacks, in batches read from `src` (the next batch read
/// while the current one is sent), then the chunks it had that it lost
/// (or would soon collect) meanwhile, then [`commit_copy`]. With
/// `opts.siblings`, chunks another process claimed are left to it and
/// waited for (sent here after all if its claim ends first, or after
/// `SIBLING_WAIT`).
pub async fn copy_shard(
    src: &Arc<dyn ChunkStore>,
    dst: &dyn ChunkStore,
    job: &str,
    shard: &LoadedShard,
    opts: CopyOptions<'_>,
    progress: &(dyn Fn(CopyProgress) + Send + Sync),
) -> Result<CopyStats> {
    let siblings = opts.siblings;
    let m = &shard.manifest;
    let ids: Vec<_> = m.chunks.iter().map(|c| c.id).collect();
    let present = dst.has_chunks(job, &ids).await?;
    let missing: Vec<usize> = (0..ids.len())
        .filter(|&i| present.get(i) != Some(&true))
        .collect();
    let total: u64 = missing.iter().map(|&i| u64::from(m.chunks[i].len)).sum();
    let all: u64 = m.chunks.iter().map(|c| u64::from(c.len)).sum();
    progress(CopyProgress::Planned { total });
    // Chunks another process claimed are left to it.
    let (mut mine, mut theirs, mut claims) = (Vec::new(), Vec::new(), Vec::new());
    for &i in &missing {
        match siblings.map(|s| s.claim(&ids[i])) {
            Some(None) => theirs.push(i),
            Some(Some(c)) => {
                claims.push(c);
                mine.push(i);
            }
            None => mine.push(i),
        }
    }
    let (mut sent, mut written) = send_chunks(src, dst, job, m, &mine, opts, progress).await?;
    drop(claims);
    let waited = !theirs.is_empty();
    if let (Some(s), false) = (siblings, theirs.is_empty()) {
        let deadline = tokio::time::Instant::now() + SIBLING_WAIT;
        loop {
            let want: Vec<ChunkId> = theirs.iter().map(|&i| ids[i]).collect();
            let there = dst.has_chunks(job, &want).await?;
            let mut k = 0;
            theirs.retain(|_| {
                let keep = there.get(k) != Some(&true);
                k += 1;
                keep
            });
            let waiting = theirs.iter().any(|&i| s.sibling_sending(&ids[i]));
            if theirs.is_empty() || !waiting || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // What the others did not deliver is sent here.
        let (s2, w2) = send_chunks(src, dst, job, m, &theirs, opts, progress).await?;
        sent += s2;
        written += w2;
    }
    // The chunks found present are asked for again before the manifest
    // names them, unless no time passed (nothing sent, nobody waited for).
    // A tier may have collected one meanwhile: its presence did not
    // refresh its age (L3), and the tier counts one it would soon collect
    // (on L3, older than half the grace period) as missing, so it is sent
    // again and its age refreshed.
    let present: Vec<usize> = (0..ids.len())
        .filter(|&i| present.get(i) == Some(&true))
        .collect();
    let mut lost = Vec::new();
    if !present.is_empty() && (!missing.is_empty() || waited) {
        let want: Vec<ChunkId> = present.iter().map(|&i| ids[i]).collect();
        let again = dst.has_chunks(job, &want).await?;
        lost = present
            .iter()
            .zip(&again)
            .filter(|(_, there)| !**there)
            .map(|(&i, _)| i)
            .collect();
        if !lost.is_empty() {
            let (s3, w3) = send_chunks(src, dst, job, m, &lost, opts, progress).await?;
            sent += s3;
            written += w3;
        }
    }
    let lost_bytes: u64 = lost.iter().map(|&i| u64::from(m.chunks[i].len)).sum();
    commit_copy(dst, job, shard).await?;
    Ok(CopyStats {
        chunks: ids.len() as u64,
        chunks_sent: (missing.len() + lost.len()) as u64,
        bytes_sent: sent,
        bytes_written: written,
        bytes_present: all - total - lost_bytes,
    })
}

/// The last half of a copy, once every chunk of the shard is in `dst`:
/// the manifest, then the commit record (create-only; an identical record
/// already there is success). Also ends a restore's write-back, whose
/// chunks were written as they were read.
pub async fn commit_copy(dst: &dyn ChunkStore, job: &str, shard: &LoadedShard) -> Result<()> {
    let info = &shard.manifest.info;
    dst.put_manifest(job, info.step, info.rank, &shard.bytes)
        .await?;
    dst.commit(&shard.record).await?;
    Ok(())
}

/// Reads the chunks at indices `wanted` of `m` from `src` in batches of at
/// most `opts.batch_bytes` and puts each batch to `dst` (as ids found
/// missing: no second presence check), reading the next batch meanwhile.
/// Stops at the first error (a damaged source chunk is an
/// [`Error::Chunk`]). Returns the bytes sent and the bytes `dst` wrote.
async fn send_chunks(
    src: &Arc<dyn ChunkStore>,
    dst: &dyn ChunkStore,
    job: &str,
    m: &ShardManifest,
    wanted: &[usize],
    opts: CopyOptions<'_>,
    progress: &(dyn Fn(CopyProgress) + Send + Sync),
) -> Result<(u64, u64)> {
    let batches = batches(m, wanted, opts.batch_bytes);
    if batches.is_empty() {
        return Ok((0, 0)); // nothing to send: nothing to hold back for
    }
    // Reads run as tasks of their own, so the next batch's reads (and
    // their hashing) proceed on other threads while this one is sent; into
    // the buffers of batches already sent where they came back.
    let mut recycler = Recycler::new(usize::try_from(2 * opts.batch_bytes).unwrap_or(usize::MAX));
    let read = |batch: &Vec<usize>, recycler: &mut Recycler| {
        let (src, job) = (src.clone(), job.to_string());
        let want: Vec<_> = batch.iter().map(|&i| m.chunks[i].id).collect();
        let lens: Vec<usize> = batch.iter().map(|&i| m.chunks[i].len as usize).collect();
        let read_opts = ReadOptions {
            unverified: opts.verify == Verify::Receiver,
            spare: recycler.spares(&lens),
        };
        tokio::spawn(async move { src.get_chunks_opts(&job, &want, read_opts).await })
    };
    hold(opts.pause, &mut recycler).await;
    let mut next = batches.first().map(|b| read(b, &mut recycler));
    let (mut sent, mut written) = (0u64, 0u64);
    let mut result = Ok(());
    for (k, batch) in batches.iter().enumerate() {
        let Some(pending) = next.take() else { break };
        let got = match pending.await {
            Ok(got) => got,
            Err(e) => {
                result = Err(Error::Pipeline(format!("chunk read task: {e}")));
                break;
            }
        };
        // Held here (once per batch: the first one was held before its
        // read), nothing is read nor sent: a snapshot or a restore of this
        // process runs.
        if k > 0 {
            hold(opts.pause, &mut recycler).await;
        }
        next = batches.get(k + 1).map(|b| read(b, &mut recycler));
        if got.len() != batch.len() {
            result = Err(Error::Pipeline(format!(
                "{} answered {} chunks of {}",
                src.name(),
                got.len(),
                batch.len()
            )));
            break;
        }
        let puts = batch
            .iter()
            .zip(got)
            .map(|(&i, data)| {
                let c = &m.chunks[i];
                data.map(|data| ChunkPut {
                    id: c.id,
                    hint: c.hint,
                    data,
                })
                .map_err(|source| Error::Chunk {
                    chunk: c.id,
                    entries: Vec::new(),
                    source: Box::new(source),
                })
            })
            .collect::<Result<Vec<_>>>();
        let done = match puts {
            Ok(puts) => {
                let n: u64 = puts.iter().map(|p| p.data.len() as u64).sum();
                let lent: Vec<ChunkData> = puts.iter().map(|p| p.data.clone()).collect();
                let r = dst
                    .put_missing_chunks(job, puts)
                    .await
                    .map(|st| (n, st.bytes_written));
                recycler.lend(lent);
                r
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        match done {
            Ok((n, w)) => {
                sent += n;
                written += w;
                progress(CopyProgress::Sent { bytes: n });
            }
            Err(e) => {
                result = Err(e.into());
                break;
            }
        }
    }
    if let Some(n) = next.take() {
        n.abort();
    }
    result.map(|()| (sent, written))
}

/// Consecutive runs of `wanted`, each at most `batch_bytes` (a chunk larger
/// than that is a batch of its own).
fn batches(m: &ShardManifest, wanted: &[usize], batch_bytes: u64) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0u64;
    for &i in wanted {
        let len = u64::from(m.chunks[i].len);
        match out.last_mut() {
            Some(b) if bytes + len <= batch_bytes => b.push(i),
            _ => {
                out.push(vec![i]);
                bytes = 0;
            }
        }
        bytes += len;
    }
    out
}

//! The eager L2 push: a save's new chunks go to its first `replicas` peers
//! while the same chunks are written to L1 (the design's `L1 write ‖ L2
//! push`), straight from the staging segments, so replication is mostly
//! done when the step commits on L1.
//!
//! It never slows the L1 write nor holds staging memory for long: the
//! persist loop *offers* each hashed batch and moves on (a batch the push
//! is too busy for is skipped; none waits in a queue); the push asks each peer which of the
//! batch's chunks it lacks (at most [`PRESENCE_WAIT`], else the batch is
//! skipped), copies those out of the segment into a buffer of its own
//! (reused from batch to batch), lets the segment go, and sends them. A
//! peer that fails is left out for the rest of the step. What it skipped or
//! could not send is sent after the L1 commit by the replication worker,
//! from L1, which first waits for this push to end and then sends only what
//! each peer still lacks (a presence check), then the manifest and the
//! commit record: the eager push is an acceleration, the after-commit push
//! is what makes a step replicated.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use strata_format::codec::ElemHint;
use strata_format::ChunkId;

use strata_tiered::{AlignedBuf, ChunkData, ChunkPut, ChunkStore};

use crate::shared::Shared;
use strata_tiered::ChunkStoreExt;

/// Longest wait for the peers' presence answers while a staging segment is
/// held: past it the batch is skipped (it goes after the commit, from L1).
pub(crate) const PRESENCE_WAIT: Duration = Duration::from_millis(500);

/// Most chunk bytes taken from one offered segment (segments reach
/// 512 MiB): the copy stays short and its buffer small, and the push is
/// idle again by the time the L1 write offers the next segment. The rest
/// goes after the commit, from L1.
pub(crate) const MAX_COPY: usize = 64 << 20;

/// Copy buffers kept for reuse (one may still be referenced by the
/// transport until the peer acknowledges its bytes).
const SPARES: usize = 3;

/// A chunk: its id, hint and byte range in a buffer.
type Piece = (ChunkId, ElemHint, Range<usize>);

/// Chunks of one staging segment.
type Offered = (Arc<AlignedBuf>, Vec<Piece>);

/// A peer by name.
type NamedPeer = (String, Arc<dyn strata_tiered::ChunkStore>);

/// Chunk bytes each peer received from the eager push of a step (a peer
/// that failed is absent).
pub(crate) type Outcome = crate::shared::EagerOutcome;

/// The eager push of one save, fed by the persist loop.
pub(crate) struct EagerPush {
    tx: tokio::sync::mpsc::Sender<Offered>,
    /// Set by the push while it waits for a batch: only then is one
    /// handed over, so no batch ever waits in a queue holding a segment.
    idle: Arc<std::sync::atomic::AtomicBool>,
}

impl EagerPush {
    /// Starts the push of `step` to the ring's first `replicas` peers; its
    /// outcome is left in `s.eager` for the replication worker. None when
    /// there are no peers or `eager_push` is off.
    pub(crate) fn start(s: &Shared, step: u64) -> Option<EagerPush> {
        if s.group.is_empty() || s.cfg.replicas == 0 || !s.cfg.eager_push {
            return None;
        }
        // The group's targets: where the after-commit push goes first.
        let peers: Vec<NamedPeer> = s
            .group
            .targets()
            .iter()
            .map(|p| (p.node.clone(), p.store.clone()))
            .collect();
        let (tx, rx) = tokio::sync::mpsc::channel::<Offered>(1);
        let idle = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let job = s.cfg.job.clone();
        let flag = idle.clone();
        let claims = s.claims.clone();
        s.rt.spawn(async move {
            let outcome = run(job, peers, rx, flag, claims).await;
            let _ = done_tx.send(outcome);
        });
        if let Ok(mut m) = s.eager.lock() {
            m.insert(step, done_rx);
        }
        Some(EagerPush { tx, idle })
    }

    /// Offers the chunks `chunks` of `seg`; returns at once (a busy push
    /// skips them).
    pub(crate) fn offer(&self, seg: &Arc<AlignedBuf>, chunks: Vec<Piece>) {
        // A push still busy with an earlier batch skips this one.
        let took = self.idle.swap(false, std::sync::atomic::Ordering::AcqRel)
            && self.tx.try_send((seg.clone(), chunks)).is_ok();
        if !took {
            tracing::debug!("eager push busy: batch left for the push after the commit");
        }
    }
}

/// Waits for the eager push of `step`, if one ran, and returns what it sent.
pub(crate) fn finished(s: &Shared, step: u64) -> Outcome {
    let rx = s.eager.lock().ok().and_then(|mut m| {
        // Steps that never committed leave theirs behind: dropped here.
        m.retain(|&k, _| k >= step);
        m.remove(&step)
    });
    match rx {
        Some(rx) => s.rt.block_on(rx).unwrap_or_default(),
        None => Outcome::new(),
    }
}

async fn run(
    job: String,
    peers: Vec<NamedPeer>,
    mut rx: tokio::sync::mpsc::Receiver<Offered>,
    idle: Arc<std::sync::atomic::AtomicBool>,
    claims: Option<crate::push_claims::PushClaims>,
) -> Outcome {
    let mut sent: HashMap<String, u64> = peers.iter().map(|(n, _)| (n.clone(), 0)).collect();
    let mut spares: Vec<Arc<AlignedBuf>> = Vec::new();
    loop {
        idle.store(true, std::sync::atomic::Ordering::Release);
        let Some((seg, chunks)) = rx.recv().await else {
            break;
        };
        let live: Vec<&NamedPeer> = peers.iter().filter(|(n, _)| sent.contains_key(n)).collect();
        if live.is_empty() {
            // Every peer failed: later offers are refused at once.
            break;
        }
        let ids: Vec<ChunkId> = chunks.iter().map(|c| c.0).collect();
        let asked = futures::future::join_all(live.iter().map(|(_, p)| p.has_chunks(&job, &ids)));
        let answers = match tokio::time::timeout(PRESENCE_WAIT, asked).await {
            Ok(a) => a,
            // Slow peers: skip this batch rather than hold the segment.
            Err(_) => continue,
        };
        // Which chunks each live peer lacks; a peer that failed is dropped.
        let mut lacks: Vec<(&NamedPeer, Vec<usize>)> = Vec::new();
        for (p, a) in live.into_iter().zip(answers) {
            match a {
                Ok(present) => lacks.push((
                    p,
                    (0..ids.len())
                        .filter(|&i| present.get(i) != Some(&true))
                        .collect(),
                )),
                Err(e) => {
                    tracing::debug!(peer = %p.0, error = %e, "eager push: peer left out for this step");
                    sent.remove(&p.0);
                }
            }
        }
        // A chunk a sibling rank of this node is sending to that peer is
        // left to it (the push after the commit waits for it). The claims
        // are files: made off the async workers.
        let mut held = Vec::new();
        if let Some(c) = &claims {
            let asks: Vec<(String, ChunkId)> = lacks
                .iter()
                .flat_map(|((name, _), missing)| missing.iter().map(|&i| (name.clone(), ids[i])))
                .collect();
            let c = c.clone();
            let got = tokio::task::spawn_blocking(move || {
                asks.iter()
                    .map(|(name, id)| c.claim(name, id))
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            let mut got = got.into_iter();
            for (_, missing) in &mut lacks {
                missing.retain(|_| match got.next().flatten() {
                    Some(guard) => {
                        held.push(guard);
                        true
                    }
                    None => false,
                });
            }
        }
        let mut wanted: Vec<usize> = lacks.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        // At most MAX_COPY bytes from this segment (always one chunk).
        let mut bytes = 0;
        wanted.retain(|&i| {
            let n = chunks[i].2.len();
            let take = bytes == 0 || bytes + n <= MAX_COPY;
            bytes += n;
            take
        });
        for (_, missing) in &mut lacks {
            missing.retain(|i| wanted.binary_search(i).is_ok());
        }
        if wanted.is_empty() {
            continue;
        }
        // Copy out of the segment (off the async workers), then let it go.
        // A spare nothing refers to any more, if any.
        let buf = spares
            .iter()
            .position(|b| Arc::strong_count(b) == 1)
            .and_then(|i| Arc::try_unwrap(spares.swap_remove(i)).ok());
        let copied = tokio::task::spawn_blocking(move || {
            let (buf, at) = copy_out(&seg, &chunks, &wanted, buf);
            (buf, at, wanted)
        })
        .await
        .ok();
        let Some((buf, at, wanted)) = copied else {
            continue;
        };
        let buf = Arc::new(buf);
        let sends = lacks.iter().map(|((name, p), missing)| {
            let puts: Vec<ChunkPut> = missing
                .iter()
                .filter_map(|i| {
                    let (id, hint, range) = &at[wanted.binary_search(i).ok()?];
                    Some(ChunkPut {
                        id: *id,
                        hint: *hint,
                        data: ChunkData::new(buf.clone(), range.clone()).ok()?,
                    })
                })
                .collect();
            let job = &job;
            async move { (name.clone(), p.put_missing_chunks(job, puts).await) }
        });
        for (name, r) in futures::future::join_all(sends).await {
            match r {
                Ok(st) => {
                    if let Some(n) = sent.get_mut(&name) {
                        *n += st.bytes_written;
                    }
                }
                Err(e) => {
                    tracing::debug!(peer = %name, error = %e, "eager push: peer left out for this step");
                    sent.remove(&name);
                }
            }
        }
        // Releasing the claims removes their files: off the workers too.
        if !held.is_empty() {
            tokio::task::spawn_blocking(move || drop(held));
        }
        // Reused for a later batch once nothing refers to it any more.
        if spares.len() < SPARES {
            spares.push(buf);
        }
    }
    sent
}

/// Copies the chunks at `wanted` (indices into `chunks`) out of `seg`, one
/// after another, into `buf` (replaced if too small). Returns the buffer
/// and, in `wanted`'s order, each chunk's id, hint and range in it.
fn copy_out(
    seg: &AlignedBuf,
    chunks: &[Piece],
    wanted: &[usize],
    buf: Option<AlignedBuf>,
) -> (AlignedBuf, Vec<Piece>) {
    let total: usize = wanted.iter().map(|&i| chunks[i].2.len()).sum();
    let mut buf = match buf {
        Some(b) if b.capacity() >= total => b,
        _ => AlignedBuf::zeroed(total),
    };
    buf.set_len(total);
    let mut at = Vec::with_capacity(wanted.len());
    let mut off = 0;
    for &i in wanted {
        let (id, hint, r) = &chunks[i];
        let n = r.len();
        buf[off..off + n].copy_from_slice(&seg[r.clone()]);
        at.push((*id, *hint, off..off + n));
        off += n;
    }
    (buf, at)
}

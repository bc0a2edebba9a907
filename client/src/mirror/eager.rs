//! The eager L2 push: a save's new chunks go to its first `replicas` peers
//! while the same chunks are written to L1 (the design's `L1 write ‖ L2
//! push`), from copies of the staging segments' chunks made as each batch
//! is written, so replication is mostly done when the step commits on L1.
//!
//! It never holds staging memory: the persist loop *offers* each hashed
//! batch's chunks new since the process's last save (on its first save,
//! those L1 lacks) while that batch's L1 write runs (a batch the push is
//! too busy for is skipped; none waits in a queue; a batch with no new
//! chunk is not offered). The offer
//! copies those chunks (at most [`MAX_COPY`] bytes) out of the segment
//! into a buffer of the push's (reused from batch to batch) on a thread of
//! the persist loop's, beside the write, which waits for it: so no segment
//! is lent to the push, and a copy slower than its batch's write delays
//! the next batch by the difference; the push then asks each peer which of
//! them it lacks (at most [`PRESENCE_WAIT`], else the batch is skipped) and
//! sends those. (Until 2026-11-29 every chunk of a batch was offered: on an
//! incremental step the L1 write, which had little to write, waited for a
//! copy of each batch the peers already held.)
//! The cost of copying first: the cap applies to the first chunks offered,
//! not to the first the peers lack (a batch whose leading new chunks the
//! peers hold sends less early), and a batch is copied even where the
//! peers lack nothing of it (a chunk new to L1 that a peer holds). A
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

/// Longest wait for the peers' presence answers: past it the batch is
/// skipped (it goes after the commit, from L1).
pub(crate) const PRESENCE_WAIT: Duration = Duration::from_millis(500);

/// Most chunk bytes taken from one offered segment (segments reach
/// 512 MiB): the copy stays short and its buffer small, and the push is
/// idle again by the time the persist loop offers the next batch. The rest
/// goes after the commit, from L1.
pub(crate) const MAX_COPY: usize = 64 << 20;

/// Copy buffers kept for reuse (one may still be referenced by the
/// transport until the peer acknowledges its bytes).
const SPARES: usize = 3;

/// A chunk: its id, hint and byte range in a buffer.
type Piece = (ChunkId, ElemHint, Range<usize>);

/// Chunks copied out of a staging segment: the copy and where each
/// chunk lies in it.
type Offered = (AlignedBuf, Vec<Piece>);

/// The push's copy buffers, shared with the offering thread: one is taken
/// for a copy once nothing else refers to it (the transport keeps a sent
/// buffer until the peer acknowledges its bytes).
type Spares = Arc<std::sync::Mutex<Vec<Arc<AlignedBuf>>>>;

/// A peer by name.
type NamedPeer = (String, Arc<dyn strata_tiered::ChunkStore>);

/// Chunk bytes each peer received from the eager push of a step (a peer
/// that failed is absent).
pub(crate) type Outcome = crate::shared::EagerOutcome;

/// The eager push of one save, fed by the persist loop.
pub(crate) struct EagerPush {
    tx: tokio::sync::mpsc::Sender<Offered>,
    /// Set by the push while it waits for a batch: only then is one
    /// copied and handed over, so no batch ever waits in a queue.
    idle: Arc<std::sync::atomic::AtomicBool>,
    spares: Spares,
    /// Bytes copied out of staging (the process's metric).
    copied: Arc<std::sync::atomic::AtomicU64>,
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
        let spares = Spares::default();
        let kept = spares.clone();
        s.rt.spawn(async move {
            let outcome = run(job, peers, rx, flag, claims, kept).await;
            let _ = done_tx.send(outcome);
        });
        if let Ok(mut m) = s.eager.lock() {
            m.insert(step, done_rx);
        }
        Some(EagerPush {
            tx,
            idle,
            spares,
            copied: s.eager_copied.clone(),
        })
    }

    /// Whether the push waits for a batch (an offer now would be taken).
    pub(crate) fn is_idle(&self) -> bool {
        self.idle.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Offers the chunks `chunks` of `seg`. A push still busy with an
    /// earlier batch skips them; an idle one gets a copy of the first
    /// [`MAX_COPY`] bytes of them, made here, on the caller's thread:
    /// nothing refers to `seg` once this returns.
    ///
    /// Why here: a segment the push held when the next save took its
    /// staging was one that save could not reuse (it waited up to 250 ms
    /// for it, then faulted in a fresh one on the training thread: up to
    /// 1.3 s in the demo), and the push's own copy, at the background
    /// priority, could wait longer than the gap between two saves for a
    /// core beside the training loop's threads. The persist loop offers
    /// from a thread of its own while it waits for that batch's L1 write.
    pub(crate) fn offer(&self, seg: &AlignedBuf, chunks: Vec<Piece>) {
        if !self.idle.swap(false, std::sync::atomic::Ordering::AcqRel) {
            tracing::debug!("eager push busy: batch left for the push after the commit");
            return;
        }
        let first = first_chunks(&chunks);
        let spare = self.spares.lock().ok().and_then(|mut g| {
            let i = g.iter().position(|b| Arc::strong_count(b) == 1)?;
            Arc::try_unwrap(g.swap_remove(i)).ok()
        });
        let copied = copy_out(seg, &chunks, &first, spare);
        self.copied
            .fetch_add(copied.0.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if self.tx.try_send(copied).is_err() {
            tracing::debug!("eager push ended: batch left for the push after the commit");
        }
    }
}

/// The leading chunks of `chunks` that fit in [`MAX_COPY`] bytes (at least
/// one), by index.
fn first_chunks(chunks: &[Piece]) -> Vec<usize> {
    let mut bytes = 0;
    (0..chunks.len())
        .take_while(|&i| {
            let n = chunks[i].2.len();
            let take = bytes == 0 || bytes + n <= MAX_COPY;
            bytes += n;
            take
        })
        .collect()
}

/// Keeps `buf` for a later copy, up to [`SPARES`] buffers.
fn keep_spare(spares: &Spares, buf: Arc<AlignedBuf>) {
    if let Ok(mut g) = spares.lock() {
        if g.len() < SPARES {
            g.push(buf);
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
    spares: Spares,
) -> Outcome {
    let mut sent: HashMap<String, u64> = peers.iter().map(|(n, _)| (n.clone(), 0)).collect();
    // Every peer failed: no later offer is taken (nor copied).
    while !sent.is_empty() {
        idle.store(true, std::sync::atomic::Ordering::Release);
        let Some((buf, at)) = rx.recv().await else {
            break;
        };
        let live: Vec<&NamedPeer> = peers.iter().filter(|(n, _)| sent.contains_key(n)).collect();
        let ids: Vec<ChunkId> = at.iter().map(|c| c.0).collect();
        let asked = futures::future::join_all(live.iter().map(|(_, p)| p.has_chunks(&job, &ids)));
        let answers = match tokio::time::timeout(PRESENCE_WAIT, asked).await {
            Ok(a) => a,
            // Slow peers: skip this batch (it goes after the commit).
            Err(_) => {
                keep_spare(&spares, Arc::new(buf));
                continue;
            }
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
        // left to it (the push after the commit waits for it). A claim is
        // a lock request on a file already open: made here, at once.
        let mut held = Vec::new();
        if let Some(c) = &claims {
            for ((name, _), missing) in &mut lacks {
                missing.retain(|&i| match c.claim(name, &ids[i]) {
                    Some(guard) => {
                        held.push(guard);
                        true
                    }
                    None => false,
                });
            }
        }
        if lacks.iter().all(|(_, missing)| missing.is_empty()) {
            keep_spare(&spares, Arc::new(buf));
            continue;
        }
        let buf = Arc::new(buf);
        let sends = lacks.iter().map(|((name, p), missing)| {
            let puts: Vec<ChunkPut> = missing
                .iter()
                .filter_map(|&i| {
                    let (id, hint, range) = at.get(i)?;
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
        drop(held);
        // Reused for a later batch once nothing refers to it any more.
        keep_spare(&spares, buf);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::Instant;
    use strata_tiered::{FaultPlan, FaultStore, MemoryStore};

    /// An offer copies what the push takes on the offering thread: once
    /// `offer` returns nothing refers to the segment, however slow the
    /// peers (every call 400 ms) or the push's threads; a second offer
    /// while the push is busy is skipped, copying nothing.
    #[test]
    fn an_offer_leaves_no_hold_on_the_segment() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let peer: Arc<dyn ChunkStore> = Arc::new(FaultStore::new(
            MemoryStore::new(),
            FaultPlan {
                latency: Duration::from_millis(400),
                ..FaultPlan::default()
            },
        ));
        let (tx, rx) = tokio::sync::mpsc::channel::<Offered>(1);
        let idle = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spares = Spares::default();
        let done = rt.spawn(run(
            "eager".into(),
            vec![("node-b".into(), peer.clone())],
            rx,
            idle.clone(),
            None,
            spares.clone(),
        ));
        let push = EagerPush {
            tx,
            idle,
            spares,
            copied: Arc::default(),
        };
        let waiting = Instant::now();
        while !push.idle.load(std::sync::atomic::Ordering::Acquire) {
            assert!(
                waiting.elapsed() < Duration::from_secs(10),
                "the push never waited for a batch"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let seg = Arc::new(AlignedBuf::from_slice(&data));
        let piece = (ChunkId::of(&data), ElemHint::BYTES, 0..data.len());
        push.offer(&seg, vec![piece]);
        assert_eq!(
            Arc::strong_count(&seg),
            1,
            "the push kept a hold on the segment"
        );
        // Busy asking the slow peer: a second offer is skipped.
        let other: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
        let seg2 = Arc::new(AlignedBuf::from_slice(&other));
        push.offer(
            &seg2,
            vec![(ChunkId::of(&other), ElemHint::BYTES, 0..other.len())],
        );
        assert_eq!(Arc::strong_count(&seg2), 1);
        // The first chunk still reaches the peer, from the push's own copy;
        // the skipped one does not (the push after the commit sends it).
        drop(push);
        let sent = rt.block_on(done).unwrap();
        assert_eq!(sent.get("node-b"), Some(&(data.len() as u64)));
        let got = rt.block_on(peer.get_chunk("eager", &ChunkId::of(&data), None));
        assert_eq!(got.unwrap().as_slice(), &data[..]);
        let skipped = rt.block_on(peer.has_chunks("eager", &[ChunkId::of(&other)]));
        assert_eq!(skipped.unwrap(), vec![false]);
    }

    /// A save with the eager push on, to a peer slow to answer (every call
    /// 300 ms): once the save is durable every staging segment is back in
    /// the pool, none still lent, and the push still delivers.
    #[test]
    fn a_durable_save_leaves_no_segment_lent_to_the_push() {
        use crate::tiers::Tier;
        use crate::{Checkpointer, Config};
        let dir = tempfile::tempdir().expect("tempdir");
        let peer: Arc<dyn ChunkStore> = Arc::new(FaultStore::new(
            MemoryStore::new(),
            FaultPlan {
                latency: Duration::from_millis(300),
                ..FaultPlan::default()
            },
        ));
        let cfg = Config::builder()
            .job("eager")
            .l1_dir(dir.path().join("l1"))
            .io_engine("psync")
            .chunk_size(1 << 20)
            .replicas(1)
            .eager_push(true);
        let ck = Checkpointer::builder(cfg)
            .peers(vec![Tier::peer("node-b", peer.clone())])
            .build()
            .expect("checkpointer");
        let data: Vec<u8> = (0..(16u32 << 20)).map(|i| (i % 251) as u8).collect();
        ck.save_bytes(1, &data);
        assert_eq!(
            ck.shared.pool.lent(),
            0,
            "a segment is still lent after the save"
        );
        ck.wait_replication();
        // Sent by the eager push (beside the L1 write), not only after.
        match ck.replication().get(&1) {
            Some(crate::L2State::Replicated { early, .. }) => {
                assert!(*early > 0, "nothing went beside the L1 write")
            }
            other => panic!("step 1 not replicated: {other:?}"),
        }
        let first = ChunkId::of(&data[..1 << 20]);
        let held = rt_block_on(peer.has_chunks("eager", &[first]));
        assert_eq!(held.expect("has_chunks"), vec![true]);
    }

    fn rt_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }
}

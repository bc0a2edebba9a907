//! Restore of a step only L3 holds: ranged fetches, decoding straight into
//! the destination buffers, and the write-back to L1 on its own thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use strata_format::ShardManifest;
use strata_tiered::{AlignedBuf, ChunkPut, ChunkStore};

use crate::error::{Error, Result};
use crate::restore::place::{chunk_error, place, run_lanes, take, Counters, Loaded, Stop, Targets};
use crate::shared::Shared;
use strata_tiered::ChunkStoreExt;

/// Chunks queued for the L1 write-back of a restore from L3.
const WRITE_BACK_QUEUE: usize = 8;
/// Most bytes the write-back puts to L1 in one call.
const WRITE_BACK_BATCH: usize = 64 << 20;

/// A step only L3 holds. Each lane keeps two chunk fetches in flight (the
/// next one is requested before the current one is decoded), each fetch
/// being ranged GETs issued at once; a chunk that lands whole in one entry
/// is decoded straight into the destination, verified there. With the
/// write-back to L1, chunks are decoded into reused aligned buffers, copied
/// out, and handed to a writer thread (a bounded queue) that puts them to
/// L1 while the lanes go on. Memory: lanes × (2 frames + 1 chunk) + the
/// queue.
pub(crate) fn l3_restore(
    s: &Shared,
    l3: &std::sync::Arc<dyn strata_tiered::ChunkStore>,
    loaded: &Loaded,
    wanted: &[usize],
    slots: &[Mutex<Option<Targets<'_>>>],
    failed: &Stop<'_>,
    counters: &Counters,
) -> Vec<(usize, Error)> {
    let m = &loaded.shard.manifest;
    // Largest chunks first: the last ones to finish are then small, so no
    // lane decodes a big chunk alone while the others sit idle.
    let mut order = wanted.to_vec();
    order.sort_by_key(|&c| std::cmp::Reverse(m.chunks[c].len));
    let wanted = &order[..];
    let next = AtomicUsize::new(0);
    let lanes = (l3.concurrency() / 2).clamp(1, wanted.len().max(1));
    let write_back = counters.l1_copy.load(Ordering::Relaxed);
    let pool: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
    let (tx, rx) = std::sync::mpsc::sync_channel::<ChunkPut>(WRITE_BACK_QUEUE);
    std::thread::scope(|sc| {
        let writer = write_back.then(|| sc.spawn(|| write_back_to_l1(s, rx, &pool, counters)));
        let tx = write_back.then_some(tx);
        let fetch = |buf: Vec<u8>| {
            let k = next.fetch_add(1, Ordering::Relaxed);
            let &c = wanted.get(k)?;
            let (l3, job, id) = (l3.clone(), s.cfg.job.clone(), m.chunks[c].id);
            Some((
                c,
                s.rt.spawn(async move { l3.get_frame(&job, id, buf).await }),
            ))
        };
        let errors = run_lanes(lanes, |errors| {
            let mut spare: Option<AlignedBuf> = None;
            // Two frame buffers per lane, reused chunk after chunk.
            let mut frame_buf = Vec::new();
            let mut pending = fetch(Vec::new());
            while let Some((c, handle)) = pending.take() {
                if failed.now() {
                    handle.abort();
                    break;
                }
                pending = fetch(std::mem::take(&mut frame_buf));
                let frame = s.rt.block_on(handle).unwrap_or_else(|e| {
                    Err(strata_tiered::StoreError::Internal(format!(
                        "L3 fetch task: {e}"
                    )))
                });
                let done = frame
                    .map_err(|source| chunk_error(m, c, source))
                    .and_then(|frame| {
                        let placed = decode_and_place(
                            m,
                            c,
                            &frame,
                            take(slots, c),
                            &mut spare,
                            tx.as_ref(),
                            &pool,
                        );
                        frame_buf = frame.into_buf();
                        placed
                    });
                match done {
                    Ok(n) => {
                        counters.bytes.fetch_add(n, Ordering::Relaxed);
                        counters.from_l3.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed.fail();
                        errors.push((c, e));
                    }
                }
            }
            if let Some((_, handle)) = pending {
                handle.abort();
            }
        });
        // The lanes are done: closing the queue lets the writer finish.
        drop(tx);
        if let Some(w) = writer {
            if w.join().is_err() {
                counters.l1_copy.store(false, Ordering::Relaxed);
            }
        }
        errors
    })
}

/// Decodes one chunk from its L3 frame into its destinations (and, with
/// `write_back`, queues a copy for L1). Returns the chunk's length.
fn decode_and_place(
    m: &ShardManifest,
    c: usize,
    frame: &strata_tiered::Frame,
    mut targets: Targets<'_>,
    spare: &mut Option<AlignedBuf>,
    write_back: Option<&std::sync::mpsc::SyncSender<ChunkPut>>,
    pool: &Mutex<Vec<AlignedBuf>>,
) -> Result<u64> {
    let meta = &m.chunks[c];
    let len = frame.raw_len().map_err(|e| chunk_error(m, c, e))?;
    if len != meta.len as usize {
        return Err(Error::Manifest {
            step: m.info.step,
            rank: m.info.rank,
            reason: format!(
                "chunk {} is {len} bytes, the manifest says {}",
                meta.id, meta.len
            ),
        });
    }
    let whole = targets.len() == 1 && targets[0].0 == 0 && targets[0].1.len() == len;
    match write_back {
        None if whole => {
            // The common case: a chunk of one large tensor, decoded and
            // verified where it belongs, no copy.
            frame
                .decode_into(targets[0].1)
                .map_err(|e| chunk_error(m, c, e))?;
        }
        _ => {
            let reused = match write_back {
                Some(_) => pool.lock().ok().and_then(|mut p| p.pop()),
                None => spare.take(),
            };
            let mut buf = match reused {
                Some(mut b) if b.capacity() >= len => {
                    b.set_len(len);
                    b
                }
                _ => AlignedBuf::zeroed(len),
            };
            frame
                .decode_into(&mut buf)
                .map_err(|e| chunk_error(m, c, e))?;
            place(m, c, &buf, std::mem::take(&mut targets))?;
            match write_back {
                Some(tx) => {
                    // A closed queue means the write-back gave up (logged).
                    let _ = tx.send(ChunkPut {
                        id: meta.id,
                        hint: meta.hint,
                        data: strata_tiered::ChunkData::whole(buf),
                    });
                }
                None => *spare = Some(buf),
            }
        }
    }
    Ok(len as u64)
}

/// The write-back of a restore from L3: puts queued chunks to L1 in
/// batches and returns their buffers to the lanes. On a failure it logs,
/// clears `l1_copy` and stops (the queue closes; the restore goes on).
fn write_back_to_l1(
    s: &Shared,
    rx: std::sync::mpsc::Receiver<ChunkPut>,
    pool: &Mutex<Vec<AlignedBuf>>,
    counters: &Counters,
) {
    let _span = tracing::debug_span!("write_back").entered();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let mut bytes = batch[0].data.len();
        while bytes < WRITE_BACK_BATCH {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.data.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let bufs: Vec<strata_tiered::ChunkData> = batch.iter().map(|p| p.data.clone()).collect();
        if let Err(e) = s.rt.block_on(s.l1.put_chunks(&s.cfg.job, batch)) {
            tracing::warn!(error = %e, "cannot copy the step back to L1; restoring from L3 only");
            counters.l1_copy.store(false, Ordering::Relaxed);
            return;
        }
        if let Ok(mut p) = pool.lock() {
            p.extend(
                bufs.into_iter()
                    .filter_map(strata_tiered::ChunkData::into_buf),
            );
            p.truncate(WRITE_BACK_QUEUE);
        }
    }
}

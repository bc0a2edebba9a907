//! Spare read buffers, process-wide: a buffer a [`ShardReader`] read a
//! chunk into goes back here once the chunk was copied out, and the next
//! read reuses it instead of faulting in and zeroing fresh memory (which
//! cost as much CPU as hashing the chunk). Readers reading at the same
//! time share one budget of chunks in flight, so a load that reads many
//! ranges on many threads holds, and faults in, about as much memory as
//! one reader.
//!
//! [`ShardReader`]: super::reader::ShardReader

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use strata_tiered::{AlignedBuf, ChunkData};

/// Chunk bytes a [`super::reader::ShardReader`] reads from the tiers at
/// once, shared among the readers reading now.
pub(super) const READ_BATCH_BYTES: u64 = 64 << 20;

/// Bytes of spare read buffers kept for reuse, process-wide, while no
/// reader reads (four default chunks: what one reader's next batch needs,
/// not a second cache).
const SPARE_BYTES: usize = 64 << 20;

/// Read buffers no longer used, kept for the next reads: a buffer that is
/// reused is not faulted in and zeroed again (a fresh one cost as much CPU
/// as hashing the chunk read into it). Bounded by [`SPARE_BYTES`], or
/// while readers read, by what they have in flight ([`spare_bound`]).
static SPARE: Mutex<(Vec<AlignedBuf>, usize)> = Mutex::new((Vec::new(), 0));

/// [`ShardReader`]s reading now, in this process. They share
/// [`READ_BATCH_BYTES`] of chunks in flight (each at least one chunk): a
/// load that reads many ranges on many threads (PyTorch DCP's reader)
/// holds about as much memory, and faults in about as little, as one
/// reader does.
static READING: AtomicUsize = AtomicUsize::new(0);

/// How long the spare buffers of a load outlive it (then they are trimmed
/// back to [`SPARE_BYTES`]): a load that follows at once (the next ranges
/// of a restore, a second load) finds its buffers faulted in already.
const SPARE_LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Counts the times the number of readers fell to zero: a trim scheduled
/// then runs only if no reader came and went since.
static IDLE_SINCE: AtomicUsize = AtomicUsize::new(0);

/// One reader counted in [`READING`] while it lives; the last one out
/// trims the spare buffers back to [`SPARE_BYTES`] after [`SPARE_LINGER`]
/// (at once outside a runtime).
pub(super) struct Reading;

impl Reading {
    pub(super) fn start() -> Reading {
        READING.fetch_add(1, Ordering::AcqRel);
        Reading
    }

    /// The chunk bytes this reader reads at once now.
    pub(super) fn batch_bytes(&self) -> u64 {
        READ_BATCH_BYTES / READING.load(Ordering::Acquire).max(1) as u64
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        if READING.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let idle = IDLE_SINCE.fetch_add(1, Ordering::AcqRel) + 1;
        let trim = move || {
            if READING.load(Ordering::Acquire) == 0 && IDLE_SINCE.load(Ordering::Acquire) == idle {
                trim_spare(SPARE_BYTES);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep(SPARE_LINGER).await;
                    trim();
                });
            }
            Err(_) => trim(),
        }
    }
}

/// Drops spare buffers until at most `bytes` are kept.
fn trim_spare(bytes: usize) {
    if let Ok(mut p) = SPARE.lock() {
        while p.1 > bytes {
            let Some(b) = p.0.pop() else { break };
            p.1 -= b.capacity();
        }
    }
}

/// The bytes of spare buffers kept now: while readers read, two chunks of
/// `cap` each per reader (one in flight, one returned), else
/// [`SPARE_BYTES`] (more until the trim after [`SPARE_LINGER`]).
fn spare_bound(cap: usize) -> usize {
    SPARE_BYTES.max(
        READING
            .load(Ordering::Acquire)
            .saturating_mul(cap.saturating_mul(2)),
    )
}

/// Spare buffers for chunks of `lens` bytes: for each, the smallest spare
/// that holds it, taken out of the pool. Returns the order to read the
/// chunks in (those given a buffer first: a tier hands its spare buffers
/// out in order, and drops one too small for its chunk) and the buffers.
pub(super) fn fit_spare(lens: &[usize]) -> (Vec<usize>, Vec<AlignedBuf>) {
    let mut order: Vec<usize> = Vec::with_capacity(lens.len());
    let mut fresh = Vec::new();
    let mut bufs = Vec::new();
    if let Ok(mut p) = SPARE.lock() {
        p.0.sort_by_key(AlignedBuf::capacity);
        for (k, &len) in lens.iter().enumerate() {
            let need = strata_tiered::aligned::align_up(len);
            match p.0.iter().position(|b| b.capacity() >= need) {
                Some(i) => {
                    let b = p.0.remove(i);
                    p.1 -= b.capacity();
                    bufs.push(b);
                    order.push(k);
                }
                None => fresh.push(k),
            }
        }
    } else {
        fresh.extend(0..lens.len());
    }
    order.extend(fresh);
    (order, bufs)
}

/// Keeps `data`'s buffer for reuse when nothing else holds it.
pub(super) fn give_back(data: ChunkData) {
    let Some(b) = data.into_buf() else { return };
    // Foreign memory (pinned, a caller's) is never pooled.
    if b.is_foreign() {
        return;
    }
    if let Ok(mut p) = SPARE.lock() {
        if p.1 + b.capacity() <= spare_bound(b.capacity()) {
            p.1 += b.capacity();
            p.0.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool_caps() -> Vec<usize> {
        let p = SPARE.lock().unwrap();
        let mut caps: Vec<usize> = p.0.iter().map(AlignedBuf::capacity).collect();
        caps.sort_unstable();
        caps
    }

    // One test: the pool is process-wide.
    #[test]
    fn readers_share_the_batch_and_spares_fit_their_chunks_and_outlive_a_load_briefly() {
        const M: usize = 1 << 20;
        // Readers at once share the batch.
        let a = Reading::start();
        assert_eq!(a.batch_bytes(), READ_BATCH_BYTES);
        let (b, c) = (Reading::start(), Reading::start());
        assert_eq!(c.batch_bytes(), READ_BATCH_BYTES / 3);

        // While three read, up to two chunks each are kept: 96 MiB of
        // 16 MiB chunks (the idle bound is 64 MiB).
        give_back(ChunkData::whole(AlignedBuf::zeroed(M)));
        for _ in 0..8 {
            give_back(ChunkData::whole(AlignedBuf::zeroed(16 * M)));
        }
        assert_eq!(pool_caps(), [M, 16 * M, 16 * M, 16 * M, 16 * M, 16 * M]);
        // A buffer another holder shares is not kept.
        let shared = ChunkData::whole(AlignedBuf::zeroed(M));
        let _keep = shared.clone();
        give_back(shared);
        assert_eq!(pool_caps().len(), 6);

        // Outside a runtime the last reader out trims at once.
        drop((a, b));
        assert_eq!(pool_caps().len(), 6);
        drop(c);
        assert_eq!(pool_caps(), [M, 16 * M, 16 * M, 16 * M]);

        // Each chunk gets the smallest spare that holds it; those without
        // one are read last (into fresh memory).
        let (order, bufs) = fit_spare(&[20 * M, 100, 16 * M, 5 * M]);
        let caps: Vec<usize> = bufs.iter().map(AlignedBuf::capacity).collect();
        assert_eq!(caps, [M, 16 * M, 16 * M]);
        assert_eq!(order, [1, 2, 3, 0]);
        assert_eq!(pool_caps(), [16 * M]);

        // Inside one, the spares outlive the load for SPARE_LINGER (2 s).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let ms = std::time::Duration::from_millis;
        rt.block_on(async {
            let r = [Reading::start(), Reading::start(), Reading::start()];
            for _ in 0..5 {
                give_back(ChunkData::whole(AlignedBuf::zeroed(16 * M)));
            }
            drop(r);
            assert_eq!(pool_caps().len(), 6, "kept right after the load");
            tokio::time::sleep(ms(1500)).await;
            // A load that starts and ends meanwhile postpones the trim
            // (to 3.5 s from the start).
            drop(Reading::start());
            tokio::time::sleep(ms(700)).await;
            assert_eq!(pool_caps().len(), 6, "postponed by the second load");
            tokio::time::sleep(ms(2300)).await;
            assert_eq!(pool_caps(), [16 * M; 4]);
        });
    }
}

//! Fetching a step's chunks into the destination buffers: lanes of
//! batches read through the [`TieredReader`] from L1 or a peer (per-chunk
//! fallback, repair, write-back), or the L3 path (`l3.rs`) for a
//! step only L3 holds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use strata_tiered::AlignedBuf;

use crate::error::{Error, Result};
use crate::restore::place::{
    chunk_error, place, run_lanes, split_targets, take, Counters, Loaded, Source, Stop, Targets,
};
use crate::shared::Shared;
use crate::stats::RestoreStats;
use crate::tiers::reader::{ReadTier, TieredReader};
use crate::tiers::recycle::Recycler;

/// What the error of a read its caller stopped says (see [`is_stopped`]).
const STOPPED: &str = "stopped by its caller before its end";

/// Whether `e` is the error of a read its caller stopped (not a failure).
pub(crate) fn is_stopped(e: &Error) -> bool {
    matches!(e, Error::Pipeline(m) if m.ends_with(STOPPED))
}

/// Most chunks one restore lane reads at once.
const FETCH_BATCH: usize = 16;
/// Most bytes one restore lane reads at once.
const BATCH_BYTES: u64 = 64 << 20;
/// Restore lanes: one reads while the others verify and copy.
const RESTORE_LANES: usize = 3;
/// Read buffers one restore lane holds, its batch's and those kept free
/// for the next (two batches: a batch of small chunks does not cost the
/// buffers the next batch of large ones needs).
const LANE_SPARE_BYTES: usize = 2 * BATCH_BYTES as usize;

/// The chunks holding a segment of an entry marked in `which` (by index
/// in the manifest's entries), marked by chunk index.
pub(crate) fn chunks_of(m: &strata_format::ShardManifest, which: &[bool]) -> Vec<bool> {
    let mut out = vec![false; m.chunks.len()];
    for (e, _) in m.entries.iter().zip(which).filter(|(_, &w)| w) {
        for seg in &e.segments {
            if let Some(c) = out.get_mut(seg.chunk as usize) {
                *c = true;
            }
        }
    }
    out
}

/// Fetches the chunks the wanted entries need, verified, and puts each
/// segment into its entry's buffer.
///
/// From L1, [`RESTORE_LANES`] lanes each take the next batch of chunks (at
/// most [`BATCH_BYTES`]), read it into the lane's reused buffers and copy it
/// out: while one lane verifies and copies, another's reads keep the disk
/// busy. From L3 (a step L1 does not hold), see `l3.rs`. Memory in
/// flight is bounded by the lanes, whatever the shard's size.
///
/// `read`, when given, limits the chunks read to those it marks (by
/// index in the manifest): the destinations' segments in other chunks are
/// left as they are, for a part of a priority restore that another part
/// reads ([`chunks_of`]).
///
/// `stop` ends the read at the next batch when set from outside (a
/// dropped [`crate::PriorityRestore`]): the result is then an error, as
/// when a lane fails (which sets it too, to stop the others).
pub(crate) fn fetch_into(
    s: &Shared,
    loaded: &Loaded,
    dests: &mut [Option<&mut [u8]>],
    read: Option<&[bool]>,
    rehydrate: bool,
    stop: &AtomicBool,
) -> Result<RestoreStats> {
    let m = &loaded.shard.manifest;
    let started = Instant::now();
    // The background copies hold back while this restore reads.
    let _foreground = s.foreground.enter();
    let slots = split_targets(m, dests)?;
    if let Some(read) = read {
        for (c, slot) in slots.iter().enumerate() {
            if !read.get(c).copied().unwrap_or(false) {
                if let Ok(mut t) = slot.lock() {
                    *t = None;
                }
            }
        }
    }
    let wanted: Vec<usize> = (0..m.chunks.len())
        .filter(|&c| slots[c].lock().is_ok_and(|t| t.is_some()))
        .collect();
    let failed = &Stop::new(stop);
    let counters = Counters {
        l1_copy: AtomicBool::new(rehydrate && loaded.source != Source::L1 && s.cfg.rehydrate_l1),
        ..Counters::default()
    };
    let mut errors: Vec<(usize, Error)> = match (s.l3(), loaded.source) {
        (Some(l3), Source::L3) => {
            crate::restore::l3::l3_restore(s, l3, loaded, &wanted, &slots, failed, &counters)
        }
        _ => batch_restore(s, loaded, &wanted, &slots, failed, &counters),
    };
    // Report the first damaged chunk in shard order, whichever lane saw it.
    errors.sort_by_key(|(c, _)| *c);
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    if failed.cancelled() {
        return Err(Error::Pipeline(format!(
            "the read of step {} was {STOPPED}",
            m.info.step
        )));
    }
    Ok(RestoreStats {
        step: m.info.step,
        chunks: wanted.len() as u64,
        bytes_read: counters.bytes.load(Ordering::Relaxed),
        bytes_from_l3: counters.from_l3.load(Ordering::Relaxed),
        bytes_from_l2: counters.from_l2.load(Ordering::Relaxed),
        chunks_repaired: counters.repaired.load(Ordering::Relaxed),
        rehydrated: counters.l1_copy.load(Ordering::Relaxed),
        first_usable: None,
        duration: started.elapsed(),
    })
}

/// A step on L1 (or on a peer): batches of chunks per lane, with
/// per-chunk fallback to the peers, then L3.
fn batch_restore(
    s: &Shared,
    loaded: &Loaded,
    wanted: &[usize],
    slots: &[Mutex<Option<Targets<'_>>>],
    failed: &Stop<'_>,
    counters: &Counters,
) -> Vec<(usize, Error)> {
    let m = &loaded.shard.manifest;
    // Batches of consecutive needed chunks, bounded in count and bytes.
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    for &c in wanted {
        let len = u64::from(m.chunks[c].len);
        if !cur.is_empty() && (cur.len() >= FETCH_BATCH || cur_bytes + len > BATCH_BYTES) {
            batches.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(c);
        cur_bytes += len;
    }
    if !cur.is_empty() {
        batches.push(cur);
    }
    let next = AtomicUsize::new(0);
    run_lanes(RESTORE_LANES.min(batches.len()), |errors| {
        // The lane's read buffers, each chunk read into the smallest free
        // one that holds it, new ones faulted in on this thread
        // (`Recycler::buffers_or`). Offered in the order they came back, a
        // buffer too small for the chunk at its place was dropped and a new
        // one faulted in by the I/O thread: a shard's chunks differ in size
        // (`l1-bench --size 1GiB --reps 1`: 1.3 GiB of fresh read buffers
        // over its five restores of 0.95 GiB, 0.8 GiB with the best fit).
        //
        // Where none of the lane's own fits, a buffer the held background
        // copies lent (`Foreground::spares_for`) before a new one; at its end the lane gives
        // its free ones to those copies, if they lent theirs.
        let mut spare = Recycler::new(LANE_SPARE_BYTES);
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= batches.len() || failed.now() {
                s.foreground.return_spares(spare.take_free());
                return;
            }
            let batch = &batches[b];
            let lens: Vec<usize> = batch.iter().map(|&c| m.chunks[c].len as usize).collect();
            let got = {
                let _span =
                    tracing::debug_span!("fetch_batch", batch = b, chunks = batch.len()).entered();
                let bufs = spare.buffers_or(&lens, |l| s.foreground.spares_for(l));
                fetch_batch(s, loaded, batch, bufs, counters)
            };
            for (&c, res) in batch.iter().zip(got) {
                let placed = res
                    .map_err(|source| chunk_error(m, c, source))
                    .and_then(|data| {
                        place(m, c, data.as_slice(), take(slots, c))?;
                        counters
                            .bytes
                            .fetch_add(data.len() as u64, Ordering::Relaxed);
                        Ok(data)
                    });
                match placed {
                    Ok(data) => spare.lend([data]),
                    Err(e) => {
                        failed.fail();
                        errors.push((c, e));
                    }
                }
            }
        }
    })
}

/// One batch of chunks from the step's tier (L1 or a peer), verified, into
/// the lane's spare buffers, through the [`TieredReader`]: each chunk that
/// tier lacks or holds damaged is read from the next tier that has it (the
/// peers in ring order, then L3), and the copy where the step was read (L1
/// or that peer) is repaired. A step read from a peer is written back to
/// L1 whole, including the chunks that came from a fallback tier (the step
/// is then committed on L1).
fn fetch_batch(
    s: &Shared,
    loaded: &Loaded,
    batch: &[usize],
    spare: Vec<AlignedBuf>,
    counters: &Counters,
) -> Vec<strata_tiered::Result<strata_tiered::ChunkData>> {
    let m = &loaded.shard.manifest;
    // The tier the step was read from, then the other peers, then L3.
    let mut tiers = vec![ReadTier {
        store: match loaded.source {
            Source::L2(i) => &*s.l2()[i].store,
            _ => &*s.l1,
        },
        repair: true,
    }];
    let mut peer = vec![matches!(loaded.source, Source::L2(_))];
    for (i, p) in s.l2().iter().enumerate() {
        if loaded.source != Source::L2(i) {
            tiers.push(ReadTier {
                store: &*p.store,
                repair: false,
            });
            peer.push(true);
        }
    }
    if let Some(l3) = s.l3() {
        tiers.push(ReadTier {
            store: &**l3,
            repair: false,
        });
        peer.push(false);
    }
    // A step read from a peer is written back to L1 too (see
    // `rehydrate_l1`), every chunk of it wherever it came from, so the
    // node holds the whole step again before it is committed there.
    let write_back =
        matches!(loaded.source, Source::L2(_)) && counters.l1_copy.load(Ordering::Relaxed);
    let reader = TieredReader::new(&s.cfg.job, tiers).write_back(write_back.then_some(&*s.l1));
    let want: Vec<_> = batch.iter().map(|&c| m.chunks[c]).collect();
    let out = s.rt.block_on(reader.read(&want, spare));
    counters
        .repaired
        .fetch_add(out.repaired(), Ordering::Relaxed);
    if write_back {
        let complete = out.chunks.iter().all(|c| c.result.is_ok());
        let written = match &out.written_back {
            Some(Ok(_)) | None => true,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot copy the step back to L1");
                false
            }
        };
        // A chunk no tier could give: the step cannot be committed on L1
        // (the restore fails anyway).
        if !(complete && written) {
            counters.l1_copy.store(false, Ordering::Relaxed);
        }
    }
    let names: Vec<&str> = reader.tiers().iter().map(|t| t.store.name()).collect();
    out.chunks
        .into_iter()
        .zip(&want)
        .map(|(c, meta)| {
            for (t, e) in &c.errors {
                tracing::warn!(chunk = %meta.id, tier = names[*t], error = %e, "chunk copy unreadable");
            }
            if let (Some(from), false) = (c.from, c.errors.is_empty()) {
                tracing::warn!(chunk = %meta.id, from = names[from], "chunk read from another tier");
            }
            for (t, e) in &c.repair_failed {
                tracing::warn!(chunk = %meta.id, tier = names[*t], error = %e, "could not repair");
            }
            if let (Ok(d), Some(from)) = (&c.result, c.from) {
                let n = d.len() as u64;
                if peer[from] {
                    counters.from_l2.fetch_add(n, Ordering::Relaxed);
                } else if from > 0 {
                    counters.from_l3.fetch_add(n, Ordering::Relaxed);
                }
            }
            c.result
        })
        .collect()
}

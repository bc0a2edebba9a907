//! Restore: agree on a step, read the manifest, fetch and verify every
//! chunk, and place the bytes in the destination buffers.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use strata_format::{ChunkId, CommitRecord, ShardManifest};
use strata_tiered::{AlignedBuf, ChunkPut, ChunkStore, StepInfo, StoreErrorKind};

use crate::checkpointer::{Checkpointer, Shared};
use crate::error::{Error, Result};
use crate::gpu::DeviceBytes;
use crate::state::{RestoredEntry, RestoredState};
use crate::stats::RestoreStats;
use strata_tiered::aligned::align_up;

/// Most chunks one restore lane reads at once.
const FETCH_BATCH: usize = 16;
/// Most bytes one restore lane reads at once.
const BATCH_BYTES: u64 = 64 << 20;
/// Restore lanes: one reads while the others verify and copy.
const RESTORE_LANES: usize = 3;
/// Lanes for a step read from L3: object stores want many requests in
/// flight (each lane keeps up to 16), and decoding overlaps the transfers.
const L3_LANES: usize = 6;

/// Which step to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepSelector {
    /// The newest step every rank can restore.
    Latest,
    /// This step (every rank must be able to restore it).
    Step(u64),
}

/// The steps this rank committed on L1 in a world of the configured size.
pub(crate) fn restorable(cfg: &crate::Config, steps: &[StepInfo]) -> BTreeSet<u64> {
    steps
        .iter()
        .filter(|st| {
            st.committed_ranks().contains(&cfg.rank) && st.world_size() == Some(cfg.world_size)
        })
        .map(|st| st.step)
        .collect()
}

impl Checkpointer {
    /// The steps this rank has committed on L1, oldest first.
    pub fn committed_steps(&self) -> Result<Vec<u64>> {
        let s = &self.shared;
        let steps = s.rt.block_on(s.l1.list_steps(&s.cfg.job))?;
        Ok(restorable(&s.cfg, &steps).into_iter().collect())
    }

    /// Restores the selected step and returns the state (entries in save
    /// order, every byte verified). All ranks must call this together.
    pub fn restore(&self, which: StepSelector) -> Result<RestoredState> {
        let (step, loaded) = self.agree_and_load(which)?;
        let manifest = &loaded.manifest;
        let mut entries: Vec<RestoredEntry> = manifest
            .entries
            .iter()
            .map(|e| {
                let mut bytes = vec![0u8; e.len as usize];
                // Untouched memory yet: let it fault in as huge pages.
                strata_tiered::aligned::advise_huge_pages(&mut bytes);
                RestoredEntry {
                    name: e.name.clone(),
                    kind: e.kind.clone(),
                    bytes,
                }
            })
            .collect();
        let stats = {
            let mut dests: Vec<Option<&mut [u8]>> = entries
                .iter_mut()
                .map(|e| Some(e.bytes.as_mut_slice()))
                .collect();
            fetch_into(&self.shared, &loaded, &mut dests, true)?
        };
        let mut stats = stats;
        if stats.rehydrated {
            stats.rehydrated = self.commit_on_l1(&loaded);
        }
        Ok(RestoredState {
            step,
            entries,
            metadata: loaded.manifest.metadata,
            stats,
        })
    }

    /// [`Self::restore`] for async code: runs on a thread of its own (the
    /// restore blocks on disk I/O and hashing, which must not run on an
    /// async runtime's workers) and resolves with the state. Works on any
    /// executor.
    pub fn restore_async(
        self: &std::sync::Arc<Self>,
        which: StepSelector,
    ) -> impl std::future::Future<Output = Result<RestoredState>> + Send + 'static {
        let me = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("strata-restore".into())
            .spawn(move || {
                let _ = tx.send(me.restore(which));
            });
        async move {
            spawned.map_err(|e| Error::Pipeline(format!("cannot start a restore thread: {e}")))?;
            rx.await
                .map_err(|_| Error::Pipeline("the restore thread stopped".into()))?
        }
    }

    /// Restores the selected step into caller-provided buffers, by entry name
    /// (a subset of the entries is fine; only their chunks are read). Each
    /// buffer must be exactly the entry's length. Returns what was read
    /// (the step is `stats.step`).
    pub fn restore_into(
        &self,
        which: StepSelector,
        dests: &mut [(&str, &mut [u8])],
    ) -> Result<RestoreStats> {
        let (step, loaded) = self.agree_and_load(which)?;
        let manifest = &loaded.manifest;
        let index: HashMap<&str, usize> = manifest
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.as_str(), i))
            .collect();
        let mut slots: Vec<Option<&mut [u8]>> = (0..manifest.entries.len()).map(|_| None).collect();
        for (name, buf) in dests.iter_mut() {
            let i = *index
                .get(name)
                .ok_or_else(|| Error::InvalidState(format!("step {step} has no entry {name:?}")))?;
            let want = manifest.entries[i].len;
            if buf.len() as u64 != want {
                return Err(Error::InvalidState(format!(
                    "{name:?}: buffer of {} bytes for an entry of {want}",
                    buf.len()
                )));
            }
            slots[i] = Some(&mut **buf);
        }
        fetch_into(&self.shared, &loaded, &mut slots, false)
    }

    /// Restores the selected step into GPU memory, by entry name: each
    /// chunk is read and verified into pinned host memory, then copied to
    /// its device buffer on Strata's own stream; returns once every copy
    /// has landed. Each buffer must be exactly the entry's length. Needs the
    /// `cuda` feature and a driver, else [`Error::Gpu`] (before any read).
    pub fn restore_into_device(
        &self,
        which: StepSelector,
        dests: &[(&str, DeviceBytes)],
    ) -> Result<RestoreStats> {
        let s = &self.shared;
        let Some(gpu) = s.gpu_for(dests.iter().map(|(_, d)| *d))? else {
            return self.restore_into(which, &mut []);
        };
        let mut offsets = Vec::with_capacity(dests.len());
        let mut total = 0usize;
        for (_, d) in dests {
            offsets.push(total);
            let len = usize::try_from(d.len())
                .map_err(|_| Error::InvalidState("device buffer too large".into()))?;
            total += align_up(len);
        }
        let mut host = s.pool.take(total, Some(&gpu));
        let result = (|| {
            let stats = {
                let mut slots: Vec<(&str, &mut [u8])> = Vec::with_capacity(dests.len());
                let mut rest: &mut [u8] = &mut host;
                let mut at = 0usize;
                for ((name, d), &off) in dests.iter().zip(&offsets) {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(off - at);
                    let (mine, tail) = tail.split_at_mut(d.len() as usize);
                    slots.push((name, mine));
                    rest = tail;
                    at = off + d.len() as usize;
                }
                self.restore_into(which, &mut slots)?
            };
            let _span = tracing::info_span!("htod").entered();
            for ((_, d), &off) in dests.iter().zip(&offsets) {
                gpu.enqueue_htod(d.ptr(), &host[off..off + d.len() as usize])?;
            }
            gpu.synchronize()?;
            Ok(stats)
        })();
        s.pool.give_back_owned(host);
        result
    }

    /// After a full restore from L3 wrote every chunk back to L1: the
    /// manifest and the commit record too, so the step is on L1 again (the
    /// next save deduplicates against it, the next restore is local).
    /// Returns whether it worked; failures are logged, not fatal.
    fn commit_on_l1(&self, loaded: &Loaded) -> bool {
        let s = &self.shared;
        let cfg = &s.cfg;
        let step = loaded.manifest.info.step;
        let done =
            s.rt.block_on(s.l1.put_manifest(&cfg.job, step, cfg.rank, &loaded.bytes))
                .and_then(|()| s.rt.block_on(s.l1.commit(&loaded.record)));
        match done {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(step, error = %e, "could not commit the restored step on L1");
                false
            }
        }
    }

    /// Agrees with every rank on the step, then reads and checks this rank's
    /// manifest against its commit record.
    fn agree_and_load(&self, which: StepSelector) -> Result<(u64, Loaded)> {
        let s = &self.shared;
        let cfg = &s.cfg;
        let l1_steps = s.rt.block_on(s.l1.list_steps(&cfg.job))?;
        let on_l1 = restorable(cfg, &l1_steps);
        // L3 is only listed when configured; an unreachable L3 is logged and
        // leaves what L1 holds restorable.
        let l3_steps = match &s.l3 {
            Some(l3) => match s.rt.block_on(l3.list_steps(&cfg.job)) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list L3; restoring from L1 only");
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        let on_l3 = restorable(cfg, &l3_steps);
        let mine: BTreeSet<u64> = on_l1.union(&on_l3).copied().collect();
        let n = s.restores.fetch_add(1, Ordering::Relaxed);
        let payload: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = s.coord.all_gather(
            cfg.rank,
            &format!("restore/{}/{n}", cfg.job),
            payload,
            Duration::from_secs(cfg.coordination_timeout_secs),
        )?;
        let mut common = mine.clone();
        for (r, v) in all.iter().enumerate() {
            let theirs: BTreeSet<u64> = v
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                .collect();
            common = common.intersection(&theirs).copied().collect();
            if common.is_empty() {
                return Err(Error::NothingToRestore(Some(format!(
                    "rank {r} shares no committed step with rank {}",
                    cfg.rank
                ))));
            }
        }
        let step = match which {
            StepSelector::Latest => *common.last().ok_or(Error::NothingToRestore(None))?,
            StepSelector::Step(st) if common.contains(&st) => st,
            StepSelector::Step(st) => {
                return Err(Error::NothingToRestore(Some(format!(
                    "step {st} is not committed by every rank"
                ))))
            }
        };
        // The manifest from L1 if it holds the step, else (or if L1's copy
        // is damaged) from L3.
        let mut first_err = None;
        if on_l1.contains(&step) {
            match load_manifest(s, &s.l1, &l1_steps, step) {
                Ok((manifest, bytes, record)) => {
                    return Ok((
                        step,
                        Loaded {
                            manifest,
                            from_l3: false,
                            bytes,
                            record,
                        },
                    ))
                }
                Err(e) => {
                    tracing::warn!(step, error = %e, "L1 manifest unusable; trying L3");
                    first_err = Some(e);
                }
            }
        }
        match (&s.l3, on_l3.contains(&step)) {
            (Some(l3), true) => {
                let (manifest, bytes, record) = load_manifest(s, &**l3, &l3_steps, step)?;
                Ok((
                    step,
                    Loaded {
                        manifest,
                        from_l3: true,
                        bytes,
                        record,
                    },
                ))
            }
            _ => Err(first_err.unwrap_or(Error::NothingToRestore(None))),
        }
    }
}

/// A step's manifest and where it came from.
pub(crate) struct Loaded {
    manifest: ShardManifest,
    /// The step is read from L3 (L1 does not hold it, or its manifest there
    /// is damaged).
    from_l3: bool,
    /// The manifest's encoding.
    bytes: Vec<u8>,
    /// The commit record naming this rank's shard.
    record: CommitRecord,
}

/// Reads this rank's manifest of `step` from `tier` and checks it against
/// the tier's commit record. Returns the manifest, its bytes and the record.
pub(crate) fn load_manifest(
    s: &Shared,
    tier: &dyn ChunkStore,
    steps: &[StepInfo],
    step: u64,
) -> Result<(ShardManifest, Vec<u8>, CommitRecord)> {
    let cfg = &s.cfg;
    let (record, expected) = steps
        .iter()
        .find(|st| st.step == step)
        .and_then(|info| {
            info.records.values().find_map(|r| {
                r.shards
                    .iter()
                    .find(|sh| sh.rank == cfg.rank)
                    .map(|sh| (r.clone(), sh.manifest))
            })
        })
        .ok_or(Error::NothingToRestore(None))?;
    let bad = |reason: String| Error::Manifest {
        step,
        rank: cfg.rank,
        reason: format!("{} ({})", reason, tier.name()),
    };
    let bytes =
        s.rt.block_on(tier.get_manifest(&cfg.job, step, cfg.rank))
            .map_err(|e| bad(e.to_string()))?;
    if ShardManifest::id_of(&bytes) != expected {
        return Err(bad("manifest does not match its commit record".into()));
    }
    let manifest = ShardManifest::decode(&bytes).map_err(|e| bad(e.to_string()))?;
    if manifest.info.step != step || manifest.info.rank != cfg.rank || manifest.info.job != cfg.job
    {
        return Err(bad("manifest names another job, step or rank".into()));
    }
    Ok((manifest, bytes, record))
}

/// One segment of a chunk that lands in an entry:
/// (entry, offset in entry, offset in chunk, length).
type Use = (usize, usize, usize, usize);

/// Fetches the chunks the wanted entries need, verified by the tier, and
/// copies each segment into its entry's buffer.
///
/// [`RESTORE_LANES`] lanes each take the next batch of chunks (at most
/// [`BATCH_BYTES`]), read it into the lane's own reused buffers, and copy it
/// out: while one lane verifies and copies, another's reads keep the disk
/// busy. Memory in flight is bounded by lanes × batch bytes, whatever the
/// shard's size.
fn fetch_into(
    s: &Shared,
    loaded: &Loaded,
    dests: &mut [Option<&mut [u8]>],
    rehydrate: bool,
) -> Result<RestoreStats> {
    let m = &loaded.manifest;
    let started = Instant::now();
    let mut uses: Vec<Vec<Use>> = vec![Vec::new(); m.chunks.len()];
    for (ei, e) in m.entries.iter().enumerate() {
        if dests.get(ei).is_none_or(Option::is_none) {
            continue;
        }
        let mut at = 0usize;
        for seg in &e.segments {
            uses[seg.chunk as usize].push((ei, at, seg.offset as usize, seg.len as usize));
            at += seg.len as usize;
        }
    }
    // Batches of consecutive needed chunks, bounded in count and bytes.
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    for c in (0..m.chunks.len()).filter(|&c| !uses[c].is_empty()) {
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
    let dests: Vec<Option<Mutex<&mut [u8]>>> = dests
        .iter_mut()
        .map(|d| d.as_mut().map(|b| Mutex::new(&mut **b)))
        .collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    // Chunks read from L3 are also written to L1 (when asked), so the node
    // holds the step again; any failure there only stops that.
    let counters = Counters {
        from_l3: AtomicU64::new(0),
        repaired: AtomicU64::new(0),
        l1_copy: AtomicBool::new(rehydrate && loaded.from_l3),
    };
    let lane = |errors: &mut Vec<(usize, Error)>| {
        let mut spare: Vec<AlignedBuf> = Vec::new();
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= batches.len() || failed.load(Ordering::Relaxed) {
                return;
            }
            let batch = &batches[b];
            let ids: Vec<ChunkId> = batch.iter().map(|&c| m.chunks[c].id).collect();
            let got = {
                let _span =
                    tracing::debug_span!("fetch_batch", batch = b, chunks = ids.len()).entered();
                fetch_batch(
                    s,
                    loaded,
                    batch,
                    &ids,
                    std::mem::take(&mut spare),
                    &counters,
                )
            };
            for (&c, res) in batch.iter().zip(got) {
                let placed = res
                    .map_err(|source| Error::Chunk {
                        chunk: m.chunks[c].id,
                        entries: entry_names(m, &uses[c]),
                        source: Box::new(source),
                    })
                    .and_then(|data| {
                        place(m, c, &uses[c], data.as_slice(), &dests)?;
                        bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                        Ok(data)
                    });
                match placed {
                    Ok(data) => spare.extend(data.into_buf()),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        errors.push((c, e));
                    }
                }
            }
        }
    };
    let mut errors: Vec<(usize, Error)> = std::thread::scope(|sc| {
        let lanes = if loaded.from_l3 {
            L3_LANES
        } else {
            RESTORE_LANES
        };
        let handles: Vec<_> = (0..lanes.min(batches.len()))
            .map(|_| {
                sc.spawn(|| {
                    let mut errs = Vec::new();
                    lane(&mut errs);
                    errs
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    // Report the first damaged chunk in shard order, whichever lane saw it.
    errors.sort_by_key(|(c, _)| *c);
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    Ok(RestoreStats {
        step: m.info.step,
        chunks: batches.iter().map(Vec::len).sum::<usize>() as u64,
        bytes_read: bytes.load(Ordering::Relaxed),
        bytes_from_l3: counters.from_l3.load(Ordering::Relaxed),
        chunks_repaired: counters.repaired.load(Ordering::Relaxed),
        rehydrated: counters.l1_copy.load(Ordering::Relaxed),
        duration: started.elapsed(),
    })
}

/// What the restore lanes count together.
struct Counters {
    /// Bytes read from L3.
    from_l3: AtomicU64,
    /// L1 chunks rewritten from L3.
    repaired: AtomicU64,
    /// Chunks read from L3 are being copied to L1 (cleared on a failure).
    l1_copy: AtomicBool,
}

/// One batch of chunks, verified: from L1 (into the lane's spare buffers),
/// with each chunk L1 lacks or holds damaged read from L3 instead and its L1
/// copy repaired; or straight from L3 for a step L1 does not hold.
fn fetch_batch(
    s: &Shared,
    loaded: &Loaded,
    batch: &[usize],
    ids: &[ChunkId],
    spare: Vec<AlignedBuf>,
    counters: &Counters,
) -> Vec<strata_tiered::Result<strata_tiered::ChunkData>> {
    let Counters {
        from_l3,
        repaired,
        l1_copy,
    } = counters;
    let job = &s.cfg.job;
    let Some(l3) = &s.l3 else {
        return s.rt.block_on(s.l1.get_chunks_reusing(job, ids, spare));
    };
    if loaded.from_l3 {
        let got = s.rt.block_on(l3.get_chunks_reusing(job, ids, spare));
        let n: u64 = got.iter().flatten().map(|d| d.len() as u64).sum();
        from_l3.fetch_add(n, Ordering::Relaxed);
        if l1_copy.load(Ordering::Relaxed) {
            let puts: Vec<ChunkPut> = got
                .iter()
                .zip(batch)
                .filter_map(|(r, &c)| {
                    r.as_ref().ok().map(|d| ChunkPut {
                        id: loaded.manifest.chunks[c].id,
                        hint: loaded.manifest.chunks[c].hint,
                        data: d.clone(),
                    })
                })
                .collect();
            if let Err(e) = s.rt.block_on(s.l1.put_chunks(job, puts)) {
                tracing::warn!(error = %e, "cannot copy the step back to L1; restoring from L3 only");
                l1_copy.store(false, Ordering::Relaxed);
            }
        }
        return got;
    }
    let mut got = s.rt.block_on(s.l1.get_chunks_reusing(job, ids, spare));
    let retry: Vec<usize> = got
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.as_ref().err().is_some_and(|e| {
                matches!(e.kind(), StoreErrorKind::NotFound | StoreErrorKind::Corrupt)
            })
        })
        .map(|(i, _)| i)
        .collect();
    if retry.is_empty() {
        return got;
    }
    let want: Vec<ChunkId> = retry.iter().map(|&i| ids[i]).collect();
    let fetched = s.rt.block_on(l3.get_chunks(job, &want));
    let mut repairs = Vec::new();
    for (&i, r) in retry.iter().zip(fetched) {
        match r {
            Ok(data) => {
                tracing::warn!(chunk = %ids[i], "chunk missing or damaged on L1: read from L3, repairing L1");
                from_l3.fetch_add(data.len() as u64, Ordering::Relaxed);
                repairs.push(ChunkPut {
                    id: ids[i],
                    hint: loaded.manifest.chunks[batch[i]].hint,
                    data: data.clone(),
                });
                got[i] = Ok(data);
            }
            // Keep L1's error: it says what is wrong with the local copy;
            // L3's is logged.
            Err(e) => tracing::warn!(chunk = %ids[i], error = %e, "L3 copy unreadable too"),
        }
    }
    if !repairs.is_empty() {
        // The damaged file must go first: a present id is not rewritten.
        let ids: Vec<ChunkId> = repairs.iter().map(|p| p.id).collect();
        let fixed =
            s.rt.block_on(s.l1.delete_chunks(job, &ids))
                .and_then(|()| s.rt.block_on(s.l1.put_chunks(job, repairs)));
        match fixed {
            Ok(st) => {
                repaired.fetch_add(st.written, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "could not repair L1"),
        }
    }
    got
}

/// The names of the entries a chunk's segments belong to (for errors).
fn entry_names(m: &ShardManifest, uses: &[Use]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for u in uses {
        if !names.contains(&m.entries[u.0].name) {
            names.push(m.entries[u.0].name.clone());
        }
    }
    names
}

/// Copies a verified chunk's segments into their entries' buffers.
fn place(
    m: &ShardManifest,
    c: usize,
    uses: &[Use],
    bytes: &[u8],
    dests: &[Option<Mutex<&mut [u8]>>],
) -> Result<()> {
    for &(ei, eoff, coff, len) in uses {
        let bad = |reason: String| Error::Manifest {
            step: m.info.step,
            rank: m.info.rank,
            reason,
        };
        let src = bytes
            .get(coff..coff + len)
            .ok_or_else(|| bad(format!("segment outside chunk {}", m.chunks[c].id)))?;
        if let Some(Some(dst)) = dests.get(ei) {
            let mut dst = dst
                .lock()
                .map_err(|_| Error::Pipeline("a restore lane panicked".into()))?;
            dst.get_mut(eoff..eoff + len)
                .ok_or_else(|| bad(format!("segment outside entry {}", m.entries[ei].name)))?
                .copy_from_slice(src);
        }
    }
    Ok(())
}

//! Restore: agree on a step, read the manifest, fetch and verify every
//! chunk, and place the bytes in the destination buffers.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use strata_format::ShardManifest;
use strata_tiered::{AlignedBuf, ChunkStore, StepInfo};

use crate::checkpointer::{Checkpointer, Shared};
use crate::copy::commit_copy;
use crate::error::{Error, Result};
use crate::gpu::DeviceBytes;
use crate::inspect::LoadedShard;
use crate::reader::{ReadTier, TieredReader};
use crate::state::{RestoredEntry, RestoredState};
use crate::stats::RestoreStats;
use strata_tiered::aligned::align_up;

/// Most chunks one restore lane reads at once.
const FETCH_BATCH: usize = 16;
/// Most bytes one restore lane reads at once.
const BATCH_BYTES: u64 = 64 << 20;
/// Restore lanes: one reads while the others verify and copy.
const RESTORE_LANES: usize = 3;

/// Which step to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepSelector {
    /// The newest step every rank can restore.
    Latest,
    /// This step (every rank must be able to restore it).
    Step(u64),
}

pub(crate) use crate::commit::restorable;

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
        let manifest = &loaded.shard.manifest;
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
            metadata: loaded.shard.manifest.metadata,
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
        let manifest = &loaded.shard.manifest;
        let index: HashMap<&str, usize> = manifest
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.as_str(), i))
            .collect();
        let mut slots: Vec<Option<&mut [u8]>> = (0..manifest.entries.len()).map(|_| None).collect();
        let mut seen = std::collections::HashSet::new();
        for (name, _) in dests.iter() {
            if !seen.insert(*name) {
                return Err(Error::InvalidState(format!(
                    "two buffers for entry {name:?}"
                )));
            }
        }
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
        let step = loaded.shard.manifest.info.step;
        match s
            .rt
            .block_on(commit_copy(&*s.l1, &s.cfg.job, &loaded.shard))
        {
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
        // Each peer is listed too; one that cannot be reached is logged and
        // skipped.
        let l2_steps: Vec<Vec<StepInfo>> = s
            .l2
            .iter()
            .map(|p| match s.rt.block_on(p.store.list_steps(&cfg.job)) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(peer = %p.name, error = %e, "cannot list a peer; skipping it");
                    Vec::new()
                }
            })
            .collect();
        let on_l2: Vec<BTreeSet<u64>> = l2_steps.iter().map(|v| restorable(cfg, v)).collect();
        let mut mine: BTreeSet<u64> = on_l1.union(&on_l3).copied().collect();
        for set in &on_l2 {
            mine.extend(set.iter().copied());
        }
        // What this rank committed anywhere: a later save of one of these
        // steps is refused without listing the tiers again.
        s.committed.fill(mine.clone());
        let n = s.restores.fetch_add(1, Ordering::Relaxed);
        let mut common =
            crate::commit::agree(&*s.coord, cfg, &format!("restore/{}/{n}", cfg.job), &mine)?;
        // The newest common step (or the one asked for); if its manifest
        // turns out unusable on some rank, every rank drops it together and
        // tries the next older one (only for `Latest`).
        let mut last_err = None;
        loop {
            let step = match which {
                StepSelector::Latest => match common.last() {
                    Some(&st) => st,
                    None => {
                        return Err(last_err.unwrap_or(Error::NothingToRestore(None)));
                    }
                },
                StepSelector::Step(st) if common.contains(&st) => st,
                StepSelector::Step(st) => {
                    return Err(last_err.unwrap_or_else(|| {
                        Error::NothingToRestore(Some(format!(
                            "step {st} is not committed by every rank"
                        )))
                    }))
                }
            };
            let here = self.load_step(
                step, &on_l1, &l1_steps, &on_l2, &l2_steps, &on_l3, &l3_steps,
            );
            let ready = crate::commit::all_ready(
                &*s.coord,
                cfg,
                &format!("restore/{}/{n}/ready/{step}", cfg.job),
                here.is_ok(),
            )?;
            match here {
                Ok(loaded) if ready => return Ok((step, loaded)),
                Ok(_) => {
                    tracing::warn!(
                        step,
                        "another rank cannot use this step; trying an older one"
                    );
                    last_err = Some(Error::NothingToRestore(Some(format!(
                        "step {step} is unreadable on another rank"
                    ))));
                }
                Err(e) => {
                    tracing::warn!(step, error = %e, "this rank cannot use the step; trying an older one");
                    last_err = Some(e);
                }
            }
            common.remove(&step);
            if let StepSelector::Step(_) = which {
                common.clear();
            }
        }
    }

    /// This rank's manifest of `step`, checked against its record, from
    /// the fastest tier that holds a usable copy.
    #[allow(clippy::too_many_arguments)]
    fn load_step(
        &self,
        step: u64,
        on_l1: &BTreeSet<u64>,
        l1_steps: &[StepInfo],
        on_l2: &[BTreeSet<u64>],
        l2_steps: &[Vec<StepInfo>],
        on_l3: &BTreeSet<u64>,
        l3_steps: &[StepInfo],
    ) -> Result<Loaded> {
        let s = &self.shared;
        // The manifest from L1 if it holds the step, else (or if L1's copy
        // is damaged) from L3.
        let mut first_err = None;
        if on_l1.contains(&step) {
            match load_manifest(s, &s.l1, l1_steps, step) {
                Ok(shard) => {
                    return Ok(Loaded {
                        shard,
                        source: Source::L1,
                    })
                }
                Err(e) => {
                    tracing::warn!(step, error = %e, "L1 manifest unusable; trying peers and L3");
                    first_err = Some(e);
                }
            }
        }
        for (i, p) in s.l2.iter().enumerate() {
            if !on_l2[i].contains(&step) {
                continue;
            }
            match load_manifest(s, &*p.store, &l2_steps[i], step) {
                Ok(shard) => {
                    return Ok(Loaded {
                        shard,
                        source: Source::L2(i),
                    })
                }
                Err(e) => {
                    tracing::warn!(step, peer = %p.name, error = %e, "peer manifest unusable");
                    first_err.get_or_insert(e);
                }
            }
        }
        match (&s.l3, on_l3.contains(&step)) {
            (Some(l3), true) => Ok(Loaded {
                shard: load_manifest(s, &**l3, l3_steps, step)?,
                source: Source::L3,
            }),
            _ => Err(first_err.unwrap_or(Error::NothingToRestore(None))),
        }
    }
}

/// The tier a step is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// This node's disk.
    L1,
    /// The peer at this index of `Shared::l2` (L1 lacks the step).
    L2(usize),
    /// Object storage (neither L1 nor a reachable peer holds it).
    L3,
}

/// A step's manifest and where it came from.
pub(crate) struct Loaded {
    /// The manifest, its encoding and the commit record naming it.
    pub(crate) shard: LoadedShard,
    /// Where the step is read from.
    source: Source,
}

/// Reads this rank's manifest of `step` from `tier` and checks it against
/// the tier's commit record.
fn load_manifest(
    s: &Shared,
    tier: &dyn ChunkStore,
    steps: &[StepInfo],
    step: u64,
) -> Result<LoadedShard> {
    s.rt.block_on(crate::inspect::load_shard(
        tier, &s.cfg.job, steps, step, s.cfg.rank,
    ))
}

/// Where one chunk's bytes go: (offset in the chunk, destination), one
/// pair per segment of a wanted entry. Destinations of different chunks are
/// disjoint, so lanes fill them without locks.
pub(crate) type Targets<'a> = Vec<(usize, &'a mut [u8])>;

/// Splits the destination buffers along the manifest's segments: for each
/// chunk, the slices it fills (`None` for a chunk no wanted entry uses).
fn split_targets<'a>(
    m: &ShardManifest,
    dests: &'a mut [Option<&mut [u8]>],
) -> Result<Vec<Mutex<Option<Targets<'a>>>>> {
    let bad = |reason: String| Error::Manifest {
        step: m.info.step,
        rank: m.info.rank,
        reason,
    };
    let mut targets: Vec<Option<Targets<'a>>> = (0..m.chunks.len()).map(|_| None).collect();
    for (e, dest) in m.entries.iter().zip(dests.iter_mut()) {
        let Some(dest) = dest.as_mut() else { continue };
        let mut rest: &'a mut [u8] = std::mem::take(dest);
        for seg in &e.segments {
            let len = seg.len as usize;
            let chunk = m
                .chunks
                .get(seg.chunk as usize)
                .ok_or_else(|| bad(format!("{} names chunk {}", e.name, seg.chunk)))?;
            if u64::from(seg.offset) + u64::from(seg.len) > u64::from(chunk.len) {
                return Err(bad(format!(
                    "segment of {} outside chunk {}",
                    e.name, chunk.id
                )));
            }
            if len > rest.len() {
                return Err(bad(format!("segments of {} exceed its length", e.name)));
            }
            let (mine, tail) = rest.split_at_mut(len);
            rest = tail;
            targets[seg.chunk as usize]
                .get_or_insert_with(Vec::new)
                .push((seg.offset as usize, mine));
        }
        if !rest.is_empty() {
            return Err(bad(format!(
                "segments of {} fall short of its length",
                e.name
            )));
        }
    }
    Ok(targets.into_iter().map(Mutex::new).collect())
}

/// Takes a chunk's destinations (each chunk is handled by one lane once).
pub(crate) fn take<'a>(slots: &[Mutex<Option<Targets<'a>>>], c: usize) -> Targets<'a> {
    slots
        .get(c)
        .and_then(|m| m.lock().ok().and_then(|mut t| t.take()))
        .unwrap_or_default()
}

/// What the restore lanes count together.
#[derive(Default)]
pub(crate) struct Counters {
    /// Chunk bytes placed.
    pub(crate) bytes: AtomicU64,
    /// Bytes read from L3 (decoded).
    pub(crate) from_l3: AtomicU64,
    /// Bytes read from peers.
    pub(crate) from_l2: AtomicU64,
    /// L1 chunks rewritten from L3.
    pub(crate) repaired: AtomicU64,
    /// Chunks read from L3 are being copied to L1 (cleared on a failure).
    pub(crate) l1_copy: AtomicBool,
}

/// Fetches the chunks the wanted entries need, verified, and puts each
/// segment into its entry's buffer.
///
/// From L1, [`RESTORE_LANES`] lanes each take the next batch of chunks (at
/// most [`BATCH_BYTES`]), read it into the lane's reused buffers and copy it
/// out: while one lane verifies and copies, another's reads keep the disk
/// busy. From L3 (a step L1 does not hold), see [`l3_lane`]. Memory in
/// flight is bounded by the lanes, whatever the shard's size.
fn fetch_into(
    s: &Shared,
    loaded: &Loaded,
    dests: &mut [Option<&mut [u8]>],
    rehydrate: bool,
) -> Result<RestoreStats> {
    let m = &loaded.shard.manifest;
    let started = Instant::now();
    let slots = split_targets(m, dests)?;
    let wanted: Vec<usize> = (0..m.chunks.len())
        .filter(|&c| slots[c].lock().is_ok_and(|t| t.is_some()))
        .collect();
    let failed = AtomicBool::new(false);
    let counters = Counters {
        l1_copy: AtomicBool::new(rehydrate && loaded.source != Source::L1 && s.cfg.rehydrate_l1),
        ..Counters::default()
    };
    let mut errors: Vec<(usize, Error)> = match (&s.l3, loaded.source) {
        (Some(l3), Source::L3) => {
            crate::restore_l3::l3_restore(s, l3, loaded, &wanted, &slots, &failed, &counters)
        }
        _ => batch_restore(s, loaded, &wanted, &slots, &failed, &counters),
    };
    // Report the first damaged chunk in shard order, whichever lane saw it.
    errors.sort_by_key(|(c, _)| *c);
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    Ok(RestoreStats {
        step: m.info.step,
        chunks: wanted.len() as u64,
        bytes_read: counters.bytes.load(Ordering::Relaxed),
        bytes_from_l3: counters.from_l3.load(Ordering::Relaxed),
        bytes_from_l2: counters.from_l2.load(Ordering::Relaxed),
        chunks_repaired: counters.repaired.load(Ordering::Relaxed),
        rehydrated: counters.l1_copy.load(Ordering::Relaxed),
        duration: started.elapsed(),
    })
}

/// The typed error of a chunk that could not be restored.
pub(crate) fn chunk_error(m: &ShardManifest, c: usize, source: strata_tiered::StoreError) -> Error {
    Error::Chunk {
        chunk: m.chunks[c].id,
        entries: entry_names(m, c),
        source: Box::new(source),
    }
}

/// Runs `lanes` threads of `lane` and gathers their errors.
pub(crate) fn run_lanes<F>(lanes: usize, lane: F) -> Vec<(usize, Error)>
where
    F: Fn(&mut Vec<(usize, Error)>) + Sync,
{
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..lanes)
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
    })
}

/// A step on L1 (or on a peer): batches of chunks per lane, with
/// per-chunk fallback to the peers, then L3.
fn batch_restore(
    s: &Shared,
    loaded: &Loaded,
    wanted: &[usize],
    slots: &[Mutex<Option<Targets<'_>>>],
    failed: &AtomicBool,
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
        let mut spare: Vec<AlignedBuf> = Vec::new();
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= batches.len() || failed.load(Ordering::Relaxed) {
                return;
            }
            let batch = &batches[b];
            let got = {
                let _span =
                    tracing::debug_span!("fetch_batch", batch = b, chunks = batch.len()).entered();
                fetch_batch(s, loaded, batch, std::mem::take(&mut spare), counters)
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
                    Ok(data) => spare.extend(data.into_buf()),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
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
            Source::L2(i) => &*s.l2[i].store,
            _ => &*s.l1,
        },
        repair: true,
    }];
    let mut peer = vec![matches!(loaded.source, Source::L2(_))];
    for (i, p) in s.l2.iter().enumerate() {
        if loaded.source != Source::L2(i) {
            tiers.push(ReadTier {
                store: &*p.store,
                repair: false,
            });
            peer.push(true);
        }
    }
    if let Some(l3) = &s.l3 {
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

/// The names of the entries a chunk's segments belong to (for errors).
fn entry_names(m: &ShardManifest, c: usize) -> Vec<String> {
    m.entries
        .iter()
        .filter(|e| e.segments.iter().any(|seg| seg.chunk as usize == c))
        .map(|e| e.name.clone())
        .collect()
}

/// Copies a verified chunk's segments into their destinations.
pub(crate) fn place(m: &ShardManifest, c: usize, bytes: &[u8], targets: Targets<'_>) -> Result<()> {
    for (coff, dst) in targets {
        let src = bytes
            .get(coff..coff + dst.len())
            .ok_or_else(|| Error::Manifest {
                step: m.info.step,
                rank: m.info.rank,
                reason: format!("segment outside chunk {}", m.chunks[c].id),
            })?;
        dst.copy_from_slice(src);
    }
    Ok(())
}

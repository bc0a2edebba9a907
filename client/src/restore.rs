//! Restore: agree on a step, read the manifest, fetch and verify every
//! chunk, and place the bytes in the destination buffers.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use strata_format::{ChunkId, ShardManifest};
use strata_tiered::{ChunkStore, StepInfo};

use crate::checkpointer::{Checkpointer, Shared};
use crate::error::{Error, Result};
use crate::state::{RestoredEntry, RestoredState};

/// Chunks fetched per batch: bounds restore memory to this many chunks.
const FETCH_BATCH: usize = 16;

/// Which step to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepSelector {
    /// The newest step every rank can restore.
    Latest,
    /// This step (every rank must be able to restore it).
    Step(u64),
}

/// The steps this rank committed on L1 in a world of the configured size.
fn restorable(cfg: &crate::Config, steps: &[StepInfo]) -> BTreeSet<u64> {
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
        let (step, manifest) = self.agree_and_load(which)?;
        let mut entries: Vec<RestoredEntry> = manifest
            .entries
            .iter()
            .map(|e| RestoredEntry {
                name: e.name.clone(),
                kind: e.kind.clone(),
                bytes: vec![0u8; e.len as usize],
            })
            .collect();
        {
            let mut dests: Vec<Option<&mut [u8]>> = entries
                .iter_mut()
                .map(|e| Some(e.bytes.as_mut_slice()))
                .collect();
            fetch_into(&self.shared, &manifest, &mut dests)?;
        }
        Ok(RestoredState {
            step,
            entries,
            metadata: manifest.metadata,
        })
    }

    /// Restores the selected step into caller-provided buffers, by entry name
    /// (a subset of the entries is fine; only their chunks are read). Each
    /// buffer must be exactly the entry's length. Returns the step.
    pub fn restore_into(
        &self,
        which: StepSelector,
        dests: &mut [(&str, &mut [u8])],
    ) -> Result<u64> {
        let (step, manifest) = self.agree_and_load(which)?;
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
        fetch_into(&self.shared, &manifest, &mut slots)?;
        Ok(step)
    }

    /// Agrees with every rank on the step, then reads and checks this rank's
    /// manifest against its commit record.
    fn agree_and_load(&self, which: StepSelector) -> Result<(u64, ShardManifest)> {
        let s = &self.shared;
        let cfg = &s.cfg;
        let steps = s.rt.block_on(s.l1.list_steps(&cfg.job))?;
        let mine = restorable(cfg, &steps);
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
        let info = steps
            .iter()
            .find(|st| st.step == step)
            .ok_or(Error::NothingToRestore(None))?;
        let expected = info
            .records
            .values()
            .flat_map(|r| r.shards.iter())
            .find(|sh| sh.rank == cfg.rank)
            .map(|sh| sh.manifest)
            .ok_or(Error::NothingToRestore(None))?;
        let bad = |reason: String| Error::Manifest {
            step,
            rank: cfg.rank,
            reason,
        };
        let bytes =
            s.rt.block_on(s.l1.get_manifest(&cfg.job, step, cfg.rank))
                .map_err(|e| bad(e.to_string()))?;
        if ShardManifest::id_of(&bytes) != expected {
            return Err(bad("manifest does not match its commit record".into()));
        }
        let manifest = ShardManifest::decode(&bytes).map_err(|e| bad(e.to_string()))?;
        if manifest.info.step != step
            || manifest.info.rank != cfg.rank
            || manifest.info.job != cfg.job
        {
            return Err(bad("manifest names another job, step or rank".into()));
        }
        Ok((step, manifest))
    }
}

/// Fetches the chunks the wanted entries need (in bounded batches), verified
/// by the tier, and copies each segment into its entry's buffer.
fn fetch_into(s: &Shared, m: &ShardManifest, dests: &mut [Option<&mut [u8]>]) -> Result<()> {
    // chunk index -> (entry, offset in entry, offset in chunk, len)
    let mut uses: Vec<Vec<(usize, usize, usize, usize)>> = vec![Vec::new(); m.chunks.len()];
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
    let needed: Vec<usize> = (0..m.chunks.len())
        .filter(|&c| !uses[c].is_empty())
        .collect();
    for batch in needed.chunks(FETCH_BATCH) {
        let ids: Vec<ChunkId> = batch.iter().map(|&c| m.chunks[c].id).collect();
        let got = s.rt.block_on(s.l1.get_chunks(&s.cfg.job, &ids));
        for (&c, res) in batch.iter().zip(got) {
            let data = res.map_err(|source| Error::Chunk {
                chunk: m.chunks[c].id,
                entries: {
                    let mut names: Vec<String> = Vec::new();
                    for u in &uses[c] {
                        if !names.contains(&m.entries[u.0].name) {
                            names.push(m.entries[u.0].name.clone());
                        }
                    }
                    names
                },
                source: Box::new(source),
            })?;
            let bytes = data.as_slice();
            for &(ei, eoff, coff, len) in &uses[c] {
                let src = bytes.get(coff..coff + len).ok_or_else(|| Error::Manifest {
                    step: m.info.step,
                    rank: m.info.rank,
                    reason: format!("segment outside chunk {}", m.chunks[c].id),
                })?;
                if let Some(Some(dst)) = dests.get_mut(ei) {
                    dst[eoff..eoff + len].copy_from_slice(src);
                }
            }
        }
    }
    Ok(())
}

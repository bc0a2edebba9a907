//! Where a restore's bytes go: the step being read ([`Loaded`]), the
//! destination slices of each chunk ([`Targets`]), the lanes that fill
//! them and what they count. Shared by the restore from L1 or a peer
//! (`fetch.rs`) and the one from L3 (`l3.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

use strata_format::ShardManifest;

use crate::error::{Error, Result};
use crate::tiers::LoadedShard;

/// The tier a step is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
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
    pub(crate) source: Source,
}

/// Where one chunk's bytes go: (offset in the chunk, destination), one
/// pair per segment of a wanted entry. Destinations of different chunks are
/// disjoint, so lanes fill them without locks.
pub(crate) type Targets<'a> = Vec<(usize, &'a mut [u8])>;

/// Splits the destination buffers along the manifest's segments: for each
/// chunk, the slices it fills (`None` for a chunk no wanted entry uses).
pub(crate) fn split_targets<'a>(
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

/// When a restore's lanes stop before their next batch: one of them
/// failed (it sets this), or the caller stopped the read from outside
/// (a dropped [`crate::PriorityRestore`]).
pub(crate) struct Stop<'a> {
    failed: std::sync::atomic::AtomicBool,
    cancel: &'a std::sync::atomic::AtomicBool,
}

impl<'a> Stop<'a> {
    /// Lanes that stop when one fails or when `cancel` is set.
    pub(crate) fn new(cancel: &'a std::sync::atomic::AtomicBool) -> Self {
        Stop {
            failed: std::sync::atomic::AtomicBool::new(false),
            cancel,
        }
    }

    /// A lane failed: the others stop at their next batch.
    pub(crate) fn fail(&self) {
        self.failed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the lanes stop now.
    pub(crate) fn now(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.failed.load(Relaxed) || self.cancel.load(Relaxed)
    }

    /// Whether the caller stopped the read (not a lane's failure).
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(std::sync::atomic::Ordering::Relaxed)
    }
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

/// The names of the entries a chunk's segments belong to (for errors).
pub(crate) fn entry_names(m: &ShardManifest, c: usize) -> Vec<String> {
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

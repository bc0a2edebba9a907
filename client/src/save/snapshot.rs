//! Taking a snapshot: the state's bytes, cut into chunks by the layout, are
//! copied into staging segments, one segment per write batch.
//!
//! A save's chunks are grouped into batches that start small and double
//! (32 MiB up to 512 MiB). Each batch has its own staging segment, and each
//! segment is handed to the persist worker the moment it is filled: the
//! worker hashes and writes batch 0 while `save` still copies batch 1, so a
//! step becomes durable about one snapshot earlier than if persisting waited
//! for the whole copy. Batches end in a drain (last writes, fdatasyncs,
//! renames, directory fsyncs) that idles the disk, hence few, growing ones.

use std::ops::Range;
use std::sync::Mutex;

use strata_format::layout::Layout;
use strata_tiered::aligned::align_up;
use strata_tiered::AlignedBuf;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::par::par_map;
use crate::state::Entry;

/// Chunk bytes in the first batch.
const FIRST_BATCH_BYTES: u64 = 32 << 20;
/// Most chunk bytes in one batch.
const MAX_BATCH_BYTES: u64 = 512 << 20;

/// Where every chunk of a save lives in staging memory.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The layout of the state into chunks.
    pub(crate) layout: Layout,
    /// Consecutive chunk ranges, one per batch (and segment).
    pub(crate) batches: Vec<Range<usize>>,
    /// Each chunk's offset within its batch's segment (page-aligned, so it
    /// can be written with O_DIRECT straight from there).
    pub(crate) offsets: Vec<usize>,
    /// Each segment's length.
    pub(crate) segment_lens: Vec<usize>,
}

impl Plan {
    /// Cuts `layout`'s chunks into growing batches.
    pub(crate) fn new(layout: Layout) -> Self {
        let n = layout.chunks.len();
        let mut batches = Vec::new();
        let mut offsets = Vec::with_capacity(n);
        let mut segment_lens = Vec::new();
        let (mut start, mut bytes, mut seg) = (0usize, 0u64, 0usize);
        let mut limit = FIRST_BATCH_BYTES;
        for (i, c) in layout.chunks.iter().enumerate() {
            if i > start && bytes + u64::from(c.len) > limit {
                batches.push(start..i);
                segment_lens.push(seg);
                (start, bytes, seg) = (i, 0, 0);
                limit = (limit * 2).min(MAX_BATCH_BYTES);
            }
            offsets.push(seg);
            seg += align_up(c.len as usize);
            bytes += u64::from(c.len);
        }
        if start < n {
            batches.push(start..n);
            segment_lens.push(seg);
        }
        Plan {
            layout,
            batches,
            offsets,
            segment_lens,
        }
    }

    /// Chunk `i`'s bytes within its segment.
    pub(crate) fn range(&self, i: usize) -> Range<usize> {
        let off = self.offsets[i];
        off..off + self.layout.chunks[i].len as usize
    }
}

/// Fills segment `k` with its batch's chunks: device entries by
/// device-to-host copies on the GPU's stream (waited for), host entries by
/// memcpy on `threads` threads, alignment gaps of packed chunks zeroed.
pub(crate) fn fill_segment(
    plan: &Plan,
    k: usize,
    state: &[Entry<'_>],
    seg: &mut AlignedBuf,
    threads: usize,
    gpu: Option<&Gpu>,
) -> Result<()> {
    let batch = plan.batches[k].clone();
    if let Some(gpu) = gpu {
        let _span = tracing::debug_span!("snapshot_device", batch = k).entered();
        for i in batch.clone() {
            for p in &plan.layout.chunks[i].pieces {
                if let Some(dev) = state[p.entry].device {
                    let at = plan.offsets[i] + p.chunk_offset as usize;
                    let dst = seg
                        .get_mut(at..at + p.len as usize)
                        .ok_or_else(|| Error::Pipeline("staging segment too small".into()))?;
                    gpu.enqueue_dtoh(dst, dev.ptr() + p.entry_offset)?;
                }
            }
        }
        gpu.synchronize()?;
    }
    // One disjoint slice per chunk, so threads fill chunks in parallel
    // without sharing.
    let mut regions: Vec<Mutex<&mut [u8]>> = Vec::with_capacity(batch.len());
    let mut rest: &mut [u8] = seg;
    let mut at = 0;
    for i in batch.clone() {
        let off = plan.offsets[i];
        let len = plan.layout.chunks[i].len as usize;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(off - at);
        let (region, tail) = tail.split_at_mut(len);
        regions.push(Mutex::new(region));
        rest = tail;
        at = off + len;
    }
    par_map(
        batch.len(),
        threads,
        || (),
        |_, j| {
            let plan_c = &plan.layout.chunks[batch.start + j];
            if let Ok(mut region) = regions[j].lock() {
                // Zero only the alignment gaps between packed pieces: every
                // other byte is overwritten below (or was, by the GPU).
                let mut end = 0usize;
                for p in &plan_c.pieces {
                    region[end..p.chunk_offset as usize].fill(0);
                    end = (p.chunk_offset + p.len) as usize;
                }
                for p in plan_c
                    .pieces
                    .iter()
                    .filter(|p| state[p.entry].device.is_none())
                {
                    let src = &state[p.entry].bytes
                        [p.entry_offset as usize..p.entry_offset as usize + p.len as usize];
                    region[p.chunk_offset as usize..p.chunk_offset as usize + p.len as usize]
                        .copy_from_slice(src);
                }
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_format::EntrySpec;

    #[test]
    fn batches_grow_cover_every_chunk_and_keep_chunks_aligned() {
        let specs: Vec<EntrySpec> = (0..200)
            .map(|i| EntrySpec::blob(format!("e{i}"), 5 << 20))
            .collect();
        let plan = Plan::new(Layout::plan(&specs, 16 << 20).unwrap());
        let mut next = 0;
        for (k, b) in plan.batches.iter().enumerate() {
            assert_eq!(b.start, next);
            next = b.end;
            let bytes: u64 = b
                .clone()
                .map(|i| u64::from(plan.layout.chunks[i].len))
                .sum();
            let limit = (FIRST_BATCH_BYTES << k.min(8)).min(MAX_BATCH_BYTES);
            assert!(
                bytes <= limit || b.len() == 1,
                "batch {k}: {bytes} > {limit}"
            );
            for i in b.clone() {
                assert_eq!(plan.offsets[i] % 4096, 0);
                assert!(plan.range(i).end <= plan.segment_lens[k]);
            }
        }
        assert_eq!(next, plan.layout.chunks.len());
        assert!(plan.batches.len() >= 4, "{} batches", plan.batches.len());
        assert_eq!(plan.segment_lens.len(), plan.batches.len());
    }
}

//! Readahead: when a file of the mount is read sequentially, the chunks
//! that follow are fetched into the shared cache in the background.

use std::sync::atomic::Ordering;

use super::{Node, Part, View};

/// How far ahead of a sequential reader chunks are fetched: within the
/// entry it reads until it streams across entries (reading one tensor
/// fetches that tensor's chunks only).
const READAHEAD: u64 = 64 << 20;

/// Readahead windows in flight at once.
const READAHEAD_TASKS: usize = 4;

/// Readahead fetches a window in pieces of this size (a default chunk).
const PIECE: u64 = 16 << 20;

/// How a file is being read: where its last read ended, how far its
/// readahead reached, how many entry boundaries it streamed through, and
/// the entry its last read ended in.
pub(super) struct Sequential {
    pub(super) last_end: u64,
    pub(super) reached: u64,
    pub(super) crossings: u32,
    pub(super) entry: String,
}

impl View {
    /// For a read of `len` bytes at `off` of `node` whose last bytes come
    /// from `entry`, up to its byte `end` (called as the read starts, so
    /// that what follows is fetched beside it): when the file is read
    /// sequentially, fetch what follows the chunk the read ends in (that
    /// one is the read's own to fetch) into the cache in the background,
    /// up to [`READAHEAD`] ahead. Within the entry only, until the reader
    /// has streamed through two entry boundaries (`cp` of a whole file):
    /// reading one tensor fetches that tensor's chunks, not its
    /// neighbours'.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_ahead(
        &self,
        node: Node,
        step: u64,
        rank: u32,
        entry: &str,
        off: u64,
        len: u64,
        end: u64,
    ) {
        let Ok(shard) = self.shard(step, rank) else {
            return;
        };
        let Some(e) = shard.reader.manifest().entry(entry) else {
            return;
        };
        let here = off + len; // the file offset after the read
        let entry_end = here + e.len.saturating_sub(end); // in the file
                                                          // Where the segment holding the read's last byte ends, in the
                                                          // file: the read fetches that chunk itself, so readahead starting
                                                          // before it would only make the read wait for a piece that also
                                                          // covers the next chunk.
        let mut seg_end = 0u64;
        for seg in &e.segments {
            seg_end += u64::from(seg.len);
            if seg_end >= end {
                break;
            }
        }
        let chunk_end = here + seg_end.max(end).min(e.len).saturating_sub(end);
        let (from, to) = {
            let Ok(mut seq) = self.sequential.lock() else {
                return;
            };
            let s = seq.entry(node).or_insert_with(|| Sequential {
                last_end: u64::MAX,
                reached: 0,
                crossings: 0,
                entry: String::new(),
            });
            // A raw entry file read from its start is read in order (what
            // `cat`, `cp` and numpy's fromfile do): read ahead at once.
            let sequential = s.last_end == off || (off == 0 && matches!(node, Node::Entry(..)));
            if !sequential {
                s.crossings = 0;
                s.reached = here;
            } else if s.entry != entry {
                s.crossings += 1;
            }
            s.last_end = here;
            s.entry = entry.to_string();
            let streaming = s.crossings >= 2;
            let limit = if streaming { u64::MAX } else { entry_end };
            let file_len = match node {
                Node::RankFile(..) => shard.file.size(),
                _ => e.len,
            };
            let to = (here + READAHEAD).min(limit).min(file_len);
            let from = s.reached.max(chunk_end);
            // Fetch again once the reader is within half a window of what
            // was fetched.
            if !sequential || from > here + READAHEAD / 2 || to <= from {
                return;
            }
            if self.prefetching.fetch_add(1, Ordering::SeqCst) >= READAHEAD_TASKS {
                self.prefetching.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            s.reached = to;
            (from, to)
        };
        if let Ok(mut seq) = self.sequential.lock() {
            if seq.len() > 4096 {
                seq.clear(); // a bound, not a cache: losing it costs one readahead
            }
        }
        let parts: Vec<(String, u64, u64)> = match node {
            Node::RankFile(..) => shard
                .file
                .plan(from, to - from)
                .into_iter()
                .filter_map(|p| match p {
                    Part::Entry { entry, at, len, .. } => Some((entry, at, len as u64)),
                    Part::Header { .. } => None,
                })
                .collect(),
            _ => vec![(entry.to_string(), from, to - from)],
        };
        // In pieces of about a chunk, fetched at once: a reader waiting for
        // one chunk gets it when that chunk is in, not when the window is.
        let parts: Vec<(String, u64, u64)> = parts
            .into_iter()
            .flat_map(|(entry, at, len)| {
                (0..len.div_ceil(PIECE)).map(move |i| {
                    let a = at + i * PIECE;
                    (entry.clone(), a, PIECE.min(at + len - a))
                })
            })
            .collect();
        let (busy, counters) = (self.prefetching.clone(), self.counters.clone());
        let handle = self.tiers.handle();
        self.tiers.handle().spawn(async move {
            let tasks: Vec<_> = parts
                .into_iter()
                .map(|(entry, at, len)| {
                    let (shard, counters) = (shard.clone(), counters.clone());
                    handle.spawn(async move {
                        match shard.reader.prefetch(&entry, at, len).await {
                            Ok(st) => counters.add(&st),
                            // The read itself will fetch again, and say
                            // what failed.
                            Err(e) => tracing::debug!("readahead of {entry:?}: {e}"),
                        }
                    })
                })
                .collect();
            for t in tasks {
                let _ = t.await;
            }
            busy.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

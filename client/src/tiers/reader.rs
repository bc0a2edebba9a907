//! The tiered reader: chunks read from an ordered list of tiers, each one
//! verified by the tier that serves it; a chunk the first tier cannot give
//! (missing, damaged, unreachable, refused) is read from the next tier that
//! has a good copy. Tiers marked for repair get their bad copy replaced by the
//! good one (removed, rewritten, read back verified); an optional
//! write-back tier receives every chunk read. Used by restore, by
//! `strata export`, `diff` and `show`, and by `verify --repair`. It logs
//! nothing: what it found is in its result, for the caller to report.
//!
//! [`ShardReader`] reads entries and byte ranges of any rank's shard
//! through it, with a bounded cache of verified chunks (the Python
//! package's catalog and the resharding reads of DCP read this way).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use strata_format::manifest::ChunkRef;
use strata_format::{ChunkId, ShardManifest};
use strata_tiered::ChunkStoreExt;
use strata_tiered::StoreErrorKind as K;
use strata_tiered::{AlignedBuf, ChunkData, ChunkPut, ChunkStore, PutStats, StoreError};

/// One tier of a read, in the order tried.
#[derive(Clone, Copy)]
pub struct ReadTier<'a> {
    /// The store.
    pub store: &'a dyn ChunkStore,
    /// Whether a missing or damaged copy here is rewritten from the good
    /// copy found in a later tier.
    pub repair: bool,
}

/// What the read of one chunk found.
#[derive(Debug)]
pub struct ChunkRead {
    /// The verified bytes, or the first tier's error when no tier had a
    /// good copy (it says what is wrong where the chunk was expected).
    pub result: Result<ChunkData, StoreError>,
    /// The tier (index in the reader's order) whose copy was returned.
    pub from: Option<usize>,
    /// The tiers tried that failed, with their errors, in order.
    pub errors: Vec<(usize, StoreError)>,
    /// Tiers found holding a good copy (only the serving one unless
    /// [`TieredReader::every_copy`]).
    pub good: Vec<usize>,
    /// Tiers whose bad copy was rewritten and read back verified.
    pub repaired: Vec<usize>,
    /// Tiers whose repair failed, with why.
    pub repair_failed: Vec<(usize, StoreError)>,
}

/// What a read of a batch found.
#[derive(Debug)]
pub struct ReadOutcome {
    /// One result per chunk asked for, in order.
    pub chunks: Vec<ChunkRead>,
    /// The write-back's result, if one was asked for and had chunks.
    pub written_back: Option<Result<PutStats, StoreError>>,
}

impl ReadOutcome {
    /// Chunks rewritten in some tier.
    pub fn repaired(&self) -> u64 {
        self.chunks.iter().map(|c| c.repaired.len() as u64).sum()
    }
}

/// Reads chunks over an ordered list of tiers (see the module docs).
pub struct TieredReader<'a> {
    job: &'a str,
    tiers: Vec<ReadTier<'a>>,
    every_copy: bool,
    write_back: Option<&'a dyn ChunkStore>,
}

impl<'a> TieredReader<'a> {
    /// A reader of `job`'s chunks over `tiers`, fastest first.
    pub fn new(job: &'a str, tiers: Vec<ReadTier<'a>>) -> Self {
        TieredReader {
            job,
            tiers,
            every_copy: false,
            write_back: None,
        }
    }

    /// Once a chunk failed somewhere, read it from every later tier (not
    /// only until the first good copy): to report where good copies are.
    pub fn every_copy(mut self, yes: bool) -> Self {
        self.every_copy = yes;
        self
    }

    /// Put every chunk read, wherever it came from, to `tier` (chunks it
    /// holds are skipped by the put).
    pub fn write_back(mut self, tier: Option<&'a dyn ChunkStore>) -> Self {
        self.write_back = tier;
        self
    }

    /// The tiers, in order.
    pub fn tiers(&self) -> &[ReadTier<'a>] {
        &self.tiers
    }

    /// Reads `chunks`: from the first tier into `spare` buffers where it
    /// can, each failure from the next tiers in turn; then repairs and
    /// the write-back.
    pub async fn read(&self, chunks: &[ChunkRef], spare: Vec<AlignedBuf>) -> ReadOutcome {
        let ids: Vec<_> = chunks.iter().map(|c| c.id).collect();
        let mut out: Vec<ChunkRead> = ids
            .iter()
            .map(|_| ChunkRead {
                result: Err(StoreError::NotFound {
                    what: "chunk (no tier to read it from)".into(),
                }),
                from: None,
                errors: Vec::new(),
                good: Vec::new(),
                repaired: Vec::new(),
                repair_failed: Vec::new(),
            })
            .collect();
        let mut spare = Some(spare);
        for (t, tier) in self.tiers.iter().enumerate() {
            // Every chunk not served yet goes on to the next tier, whatever
            // the error (a tier refusing or failing must not hide a good
            // copy further down); a served one only to list good copies of
            // a chunk that failed somewhere.
            let todo: Vec<usize> = (0..ids.len())
                .filter(|&i| {
                    let r = &out[i];
                    t == 0 || r.from.is_none() || (self.every_copy && !r.errors.is_empty())
                })
                .collect();
            if todo.is_empty() {
                break;
            }
            let want: Vec<_> = todo.iter().map(|&i| ids[i]).collect();
            let got = match spare.take() {
                Some(bufs) if t == 0 => tier.store.get_chunks_reusing(self.job, &want, bufs).await,
                _ => tier.store.get_chunks(self.job, &want).await,
            };
            if got.len() != todo.len() {
                let e = StoreError::Internal(format!(
                    "{} answered {} results for {} chunks",
                    tier.store.name(),
                    got.len(),
                    todo.len()
                ));
                for &i in &todo {
                    out[i].errors.push((t, e.clone()));
                }
                continue;
            }
            for (i, r) in todo.into_iter().zip(got) {
                let c = &mut out[i];
                match r {
                    Ok(data) => {
                        c.good.push(t);
                        if c.from.is_none() {
                            c.from = Some(t);
                            c.result = Ok(data);
                        }
                    }
                    Err(e) => c.errors.push((t, e)),
                }
            }
        }
        for c in &mut out {
            if c.from.is_none() {
                if let Some((_, e)) = c.errors.first() {
                    c.result = Err(e.clone());
                }
            }
        }
        self.repair(chunks, &mut out).await;
        let written_back = self.put_back(chunks, &out).await;
        ReadOutcome {
            chunks: out,
            written_back,
        }
    }

    /// Rewrites, in each tier marked for repair, the copies it lacked or
    /// held damaged that a later tier had good: the bad copy is removed
    /// first (a present id is not rewritten), then the good one is put and
    /// read back verified.
    async fn repair(&self, chunks: &[ChunkRef], out: &mut [ChunkRead]) {
        for (t, tier) in self.tiers.iter().enumerate() {
            if !tier.repair {
                continue;
            }
            let mut puts = Vec::new();
            let mut which = Vec::new();
            for (i, c) in out.iter().enumerate() {
                let (Some(from), Ok(data)) = (c.from, &c.result) else {
                    continue;
                };
                // Only a copy found absent or damaged: an unreachable tier
                // has nothing to write to.
                let bad_here = c
                    .errors
                    .iter()
                    .any(|(x, e)| *x == t && matches!(e.kind(), K::NotFound | K::Corrupt));
                if from > t && bad_here {
                    puts.push(ChunkPut {
                        id: chunks[i].id,
                        hint: chunks[i].hint,
                        data: data.clone(),
                    });
                    which.push(i);
                }
            }
            if puts.is_empty() {
                continue;
            }
            let ids: Vec<_> = puts.iter().map(|p| p.id).collect();
            let written = async {
                tier.store.delete_chunks(self.job, &ids).await?;
                tier.store.put_chunks(self.job, puts).await
            }
            .await;
            if let Err(e) = written {
                for &i in &which {
                    out[i].repair_failed.push((t, e.clone()));
                }
                continue;
            }
            let mut back = tier.store.get_chunks(self.job, &ids).await;
            if back.len() != ids.len() {
                back = ids
                    .iter()
                    .map(|_| Err(StoreError::Internal("short read-back".into())))
                    .collect();
            }
            for (&i, r) in which.iter().zip(back) {
                match r {
                    Ok(_) => out[i].repaired.push(t),
                    Err(e) => out[i].repair_failed.push((t, e)),
                }
            }
        }
    }

    /// Puts every chunk read to the write-back tier.
    async fn put_back(
        &self,
        chunks: &[ChunkRef],
        out: &[ChunkRead],
    ) -> Option<Result<PutStats, StoreError>> {
        let tier = self.write_back?;
        let puts: Vec<ChunkPut> = out
            .iter()
            .zip(chunks)
            .filter_map(|(c, meta)| {
                c.result.as_ref().ok().map(|d| ChunkPut {
                    id: meta.id,
                    hint: meta.hint,
                    data: d.clone(),
                })
            })
            .collect();
        if puts.is_empty() {
            return None;
        }
        Some(tier.put_chunks(self.job, puts).await)
    }
}

/// Chunk bytes a [`ShardReader`] reads from the tiers at once.
const READ_BATCH_BYTES: u64 = 64 << 20;

/// What a [`ShardReader`] read found beyond the bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeStats {
    /// Chunks read from the tiers (not served from the cache).
    pub chunks_read: u64,
    /// Of those, chunks served by a tier after the first (fallback).
    pub fallbacks: u64,
    /// Copies rewritten in tiers marked for repair.
    pub repaired: u64,
    /// Chunks served from the cache.
    pub cached: u64,
    /// Chunks read, by the name of the tier that served each.
    pub served_by: std::collections::BTreeMap<String, u64>,
}

/// A bounded cache of verified chunks, evicting the oldest first, that
/// several [`ShardReader`]s may share ([`ShardReader::share_cache`]):
/// chunks are content-addressed, so one read by any shard's reader serves
/// every other shard (and step) that holds the same chunk.
#[derive(Clone)]
pub struct SharedChunkCache(Arc<Mutex<ChunkCache>>);

impl SharedChunkCache {
    /// A cache of at most `bytes` of chunks (0: none).
    pub fn new(bytes: usize) -> Self {
        SharedChunkCache(Arc::new(Mutex::new(ChunkCache {
            limit: bytes,
            held: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
            inflight: HashMap::new(),
        })))
    }

    /// Bytes of chunks held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// The cache, locked. A panic elsewhere while it was held leaves it
    /// consistent (every change is a few map operations), so a poisoned
    /// lock is taken as it is: waiters must always be woken.
    fn lock(&self) -> std::sync::MutexGuard<'_, ChunkCache> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

struct ChunkCache {
    limit: usize,
    held: usize,
    map: HashMap<ChunkId, ChunkData>,
    order: VecDeque<ChunkId>,
    /// Chunks being read from the tiers now, by any reader of this cache:
    /// another reader that needs one waits for that read instead of
    /// reading it again (readahead and the read it runs ahead of).
    inflight: HashMap<ChunkId, Arc<tokio::sync::Notify>>,
}

impl ChunkCache {
    fn get(&self, id: &ChunkId) -> Option<ChunkData> {
        self.map.get(id).cloned()
    }

    fn put(&mut self, id: ChunkId, data: ChunkData) {
        if data.len() > self.limit || self.map.contains_key(&id) {
            return;
        }
        while self.held + data.len() > self.limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(d) = self.map.remove(&old) {
                self.held -= d.len();
                give_back(d);
            }
        }
        self.held += data.len();
        self.order.push_back(id);
        self.map.insert(id, data);
    }
}

/// Bytes of spare read buffers kept for reuse, process-wide (four
/// default chunks: what one reader's next batch needs, not a second cache).
const SPARE_BYTES: usize = 64 << 20;

/// Read buffers no longer used, kept for the next reads: a buffer that is
/// reused is not faulted in and zeroed again (a fresh one costs about as
/// much CPU as the read). Bounded by [`SPARE_BYTES`].
static SPARE: Mutex<(Vec<AlignedBuf>, usize)> = Mutex::new((Vec::new(), 0));

/// A buffer for every read of `lens` bytes, in order: the smallest spare
/// that holds it, else a new one faulted in on this thread (outside the
/// pool's lock: [`super::recycle::fault_in_missing`]).
fn take_spare(lens: &[usize]) -> Vec<AlignedBuf> {
    let mut out = match SPARE.lock() {
        Ok(mut p) => {
            let out = super::recycle::fit(&mut p.0, lens);
            p.1 = p.0.iter().map(AlignedBuf::capacity).sum();
            out
        }
        Err(_) => Vec::new(),
    };
    super::recycle::fault_in_missing(&mut out, lens);
    out
}

/// Keeps `data`'s buffer for reuse when nothing else holds it.
fn give_back(data: ChunkData) {
    let Some(b) = data.into_buf() else { return };
    // Foreign memory (pinned, a caller's) is never pooled.
    if b.is_foreign() {
        return;
    }
    if let Ok(mut p) = SPARE.lock() {
        if p.1 + b.capacity() <= SPARE_BYTES {
            p.1 += b.capacity();
            p.0.push(b);
        }
    }
}

/// Unmarks chunks in flight in a cache and wakes their waiters, on drop:
/// only the marks this reader made (in a second round, another reader may
/// have marked the same chunk since).
struct Unmark<'a> {
    cache: &'a SharedChunkCache,
    marks: Vec<(ChunkId, Arc<tokio::sync::Notify>)>,
}

impl Drop for Unmark<'_> {
    fn drop(&mut self) {
        if self.marks.is_empty() {
            return;
        }
        let mut c = self.cache.lock();
        for (id, n) in &self.marks {
            if c.inflight.get(id).is_some_and(|m| Arc::ptr_eq(m, n)) {
                c.inflight.remove(id);
            }
            n.notify_waiters();
        }
    }
}

/// Reads entries and byte ranges of one shard (any rank's) over an
/// ordered list of tiers: each chunk from the first tier with a good copy,
/// verified, repaired in the tiers marked for it, kept in a bounded cache
/// so neighbouring ranges do not read a chunk twice. Owns what it reads
/// with, so a long-lived handle (the Python catalog's) can keep one.
pub struct ShardReader {
    job: String,
    manifest: ShardManifest,
    tiers: Vec<(super::Tier, bool)>,
    write_back: Option<super::Tier>,
    cache: SharedChunkCache,
}

impl ShardReader {
    /// A reader of `manifest`'s entries (of `job`) over `tiers`, fastest
    /// first, with a cache of at most `cache_bytes` of chunks (0: none).
    pub fn new(
        job: &str,
        manifest: ShardManifest,
        tiers: Vec<super::Tier>,
        cache_bytes: usize,
    ) -> Self {
        ShardReader {
            job: job.to_string(),
            manifest,
            tiers: tiers.into_iter().map(|t| (t, false)).collect(),
            write_back: None,
            cache: SharedChunkCache::new(cache_bytes),
        }
    }

    /// Keep chunks in `cache` (shared with other readers) instead of a
    /// cache of this reader's own.
    pub fn share_cache(mut self, cache: &SharedChunkCache) -> Self {
        self.cache = cache.clone();
        self
    }

    /// Rewrite a missing or damaged copy in the tiers `which` picks from
    /// the good copy a later tier holds (as `strata verify --repair`).
    pub fn repair(mut self, which: impl Fn(&super::Tier) -> bool) -> Self {
        for (t, r) in &mut self.tiers {
            *r = which(t);
        }
        self
    }

    /// Put every chunk read from the tiers to `tier` as well.
    pub fn write_back(mut self, tier: Option<super::Tier>) -> Self {
        self.write_back = tier;
        self
    }

    /// The manifest read.
    pub fn manifest(&self) -> &ShardManifest {
        &self.manifest
    }

    /// The whole of entry `name`.
    pub async fn read_entry(&self, name: &str) -> crate::Result<(Vec<u8>, RangeStats)> {
        let len = self
            .manifest
            .entry(name)
            .map(|e| e.len)
            .ok_or_else(|| self.no_entry(name))?;
        self.read_range(name, 0, len).await
    }

    /// `len` bytes of entry `name` from byte `offset`: every chunk the
    /// range touches read verified (from the cache, else the tiers). A
    /// range past the entry's end is an error of kind `Invalid`; a chunk
    /// no tier holds good fails with [`crate::Error::Chunk`].
    pub async fn read_range(
        &self,
        name: &str,
        offset: u64,
        len: u64,
    ) -> crate::Result<(Vec<u8>, RangeStats)> {
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        let stats = self
            .read_range_with(name, offset, len, |src| bytes.extend_from_slice(src))
            .await?;
        Ok((bytes, stats))
    }

    /// Like [`ShardReader::read_range`], into `dst` (its length is the
    /// length read): each verified chunk's bytes are copied straight to
    /// their place, with no intermediate buffer.
    pub async fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        dst: &mut [u8],
    ) -> crate::Result<RangeStats> {
        let mut at = 0usize;
        let len = dst.len() as u64;
        let stats = self
            .read_range_with(name, offset, len, |src| {
                // The parts cover exactly `len` bytes, in order (checked
                // against the entry's length), so this never overruns.
                if let Some(to) = dst.get_mut(at..at + src.len()) {
                    to.copy_from_slice(src);
                }
                at += src.len();
            })
            .await?;
        if at != dst.len() {
            return Err(crate::Error::Manifest {
                step: self.manifest.info.step,
                rank: self.manifest.info.rank,
                reason: format!("{name:?}: {at} bytes read for {} asked", dst.len()),
            });
        }
        Ok(stats)
    }

    /// Fetches the chunks of `len` bytes of entry `name` from `offset`
    /// into the cache, verified, copying nothing out: readahead for a
    /// reader that will ask for them next. Only useful with a cache that
    /// holds them (see [`ShardReader::share_cache`]).
    pub async fn prefetch(&self, name: &str, offset: u64, len: u64) -> crate::Result<RangeStats> {
        self.read_range_with(name, offset, len, |_| {}).await
    }

    /// Reads the range, handing each verified piece to `sink` in order.
    async fn read_range_with(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        mut sink: impl FnMut(&[u8]),
    ) -> crate::Result<RangeStats> {
        let m = &self.manifest;
        let e = m.entry(name).ok_or_else(|| self.no_entry(name))?;
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= e.len)
            .ok_or_else(|| {
                crate::Error::InvalidState(format!(
                    "{name:?}: bytes {offset}+{len} outside an entry of {}",
                    e.len
                ))
            })?;
        let bad = |reason: String| crate::Error::Manifest {
            step: m.info.step,
            rank: m.info.rank,
            reason,
        };
        // The segments the range touches: (chunk index, bytes in the chunk).
        let mut parts: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        let mut at = 0u64;
        for seg in &e.segments {
            let (s0, s1) = (at, at + u64::from(seg.len));
            at = s1;
            let (a, b) = (s0.max(offset), s1.min(end));
            if a >= b {
                continue;
            }
            let c = seg.chunk as usize;
            let chunk = m
                .chunks
                .get(c)
                .ok_or_else(|| bad(format!("{name} names chunk {c}")))?;
            let from = u64::from(seg.offset) + (a - s0);
            let to = from + (b - a);
            if to > u64::from(chunk.len) {
                return Err(bad(format!("segment of {name} outside chunk {}", chunk.id)));
            }
            parts.push((c, from as usize..to as usize));
        }
        let mut stats = RangeStats::default();
        // In batches of about READ_BATCH_BYTES of chunks: a whole entry of
        // many GiB is never held twice (chunks and output) at once.
        let mut at = 0;
        while at < parts.len() {
            let mut batch_end = at;
            let mut batch_bytes = 0u64;
            while batch_end < parts.len() && (batch_end == at || batch_bytes < READ_BATCH_BYTES) {
                batch_bytes += u64::from(m.chunks[parts[batch_end].0].len);
                batch_end += 1;
            }
            let batch = &parts[at..batch_end];
            at = batch_end;
            let have = self.fetch(name, batch, &mut stats).await?;
            for (c, range) in batch {
                let d = have
                    .get(c)
                    .ok_or_else(|| bad(format!("chunk {c} not read")))?;
                let src = d.as_slice().get(range.clone()).ok_or_else(|| {
                    bad(format!(
                        "chunk {} shorter than its segments",
                        m.chunks[*c].id
                    ))
                })?;
                sink(src);
            }
            // Buffers neither cached nor held elsewhere serve the next reads.
            have.into_values().for_each(give_back);
        }
        Ok(stats)
    }

    /// The chunks of `parts` (of entry `name`), from the cache or the
    /// tiers (verified, repaired where marked, cached), by chunk index.
    async fn fetch(
        &self,
        name: &str,
        parts: &[(usize, std::ops::Range<usize>)],
        stats: &mut RangeStats,
    ) -> crate::Result<HashMap<usize, ChunkData>> {
        let mut have: HashMap<usize, ChunkData> = HashMap::new();
        let waited = self
            .fetch_round(name, parts, stats, &mut have, true)
            .await?;
        if !waited.is_empty() {
            // Read by another reader meanwhile: from the cache now, else
            // (it failed, or was evicted already) read here.
            let again: Vec<(usize, std::ops::Range<usize>)> = parts
                .iter()
                .filter(|(c, _)| waited.contains(c))
                .cloned()
                .collect();
            self.fetch_round(name, &again, stats, &mut have, false)
                .await?;
        }
        Ok(have)
    }

    /// One round of [`ShardReader::fetch`]: chunks from the cache into
    /// `have`; those another reader is reading now waited for (when
    /// `join`) and returned, to be looked up again; the others read from
    /// the tiers, marked in flight while they are.
    async fn fetch_round(
        &self,
        name: &str,
        parts: &[(usize, std::ops::Range<usize>)],
        stats: &mut RangeStats,
        have: &mut HashMap<usize, ChunkData>,
        join: bool,
    ) -> crate::Result<Vec<usize>> {
        let m = &self.manifest;
        let mut missing: Vec<usize> = Vec::new();
        // Each wait registered under the cache lock: the reader in flight
        // unmarks (and wakes) under that lock too, so no wakeup falls
        // between seeing the mark and waiting for it.
        let mut waits: Vec<(
            usize,
            std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>,
        )> = Vec::new();
        let mut mine: Vec<(ChunkId, Arc<tokio::sync::Notify>)> = Vec::new();
        {
            let mut cache = self.cache.lock();
            for (c, _) in parts {
                if have.contains_key(c) || missing.contains(c) || waits.iter().any(|w| w.0 == *c) {
                    continue;
                }
                let id = m.chunks[*c].id;
                if let Some(d) = cache.get(&id) {
                    stats.cached += 1;
                    have.insert(*c, d);
                } else if let Some(n) = cache.inflight.get(&id).filter(|_| join) {
                    let mut w = Box::pin(n.clone().notified_owned());
                    w.as_mut().enable();
                    waits.push((*c, w));
                } else {
                    let n = cache
                        .inflight
                        .entry(id)
                        .or_insert_with(|| Arc::new(tokio::sync::Notify::new()))
                        .clone();
                    mine.push((id, n));
                    missing.push(*c);
                }
            }
        }
        // Whatever happens below, the chunks marked in flight here are
        // unmarked and their waiters woken.
        let unmark = Unmark {
            cache: &self.cache,
            marks: mine,
        };
        if !missing.is_empty() {
            self.read_missing(name, &missing, stats, have).await?;
        }
        drop(unmark);
        let mut waited = Vec::with_capacity(waits.len());
        for (c, w) in waits {
            w.await;
            waited.push(c);
        }
        Ok(waited)
    }

    /// Reads chunks `missing` from the tiers (verified, repaired where
    /// marked), caches them and puts them in `have`.
    async fn read_missing(
        &self,
        name: &str,
        missing: &[usize],
        stats: &mut RangeStats,
        have: &mut HashMap<usize, ChunkData>,
    ) -> crate::Result<()> {
        let m = &self.manifest;
        let refs: Vec<ChunkRef> = missing.iter().map(|&c| m.chunks[c]).collect();
        let tiers = self
            .tiers
            .iter()
            .map(|(t, repair)| ReadTier {
                store: &*t.store,
                repair: *repair,
            })
            .collect();
        let reader = TieredReader::new(&self.job, tiers)
            .write_back(self.write_back.as_ref().map(|t| &*t.store));
        let lens: Vec<usize> = refs.iter().map(|c| c.len as usize).collect();
        let out = reader.read(&refs, take_spare(&lens)).await;
        stats.repaired += out.repaired();
        let mut cache = self.cache.lock();
        for (&c, r) in missing.iter().zip(out.chunks) {
            stats.chunks_read += 1;
            if let Some(t) = r.from {
                if t > 0 {
                    stats.fallbacks += 1;
                }
                if let Some((tier, _)) = self.tiers.get(t) {
                    *stats.served_by.entry(tier.name.clone()).or_default() += 1;
                }
            }
            let data = r.result.map_err(|source| crate::Error::Chunk {
                chunk: m.chunks[c].id,
                entries: vec![name.to_string()],
                source: Box::new(source),
            })?;
            cache.put(m.chunks[c].id, data.clone());
            have.insert(c, data);
        }
        Ok(())
    }

    fn no_entry(&self, name: &str) -> crate::Error {
        crate::Error::Store(StoreError::NotFound {
            what: format!(
                "entry {name:?} in step {} rank {}",
                self.manifest.info.step, self.manifest.info.rank
            ),
        })
    }
}

//! The tiered reader: chunks read from an ordered list of tiers, each one
//! verified by the tier that serves it; a chunk the first tier cannot give
//! (missing, damaged, unreachable, refused) is read from the next tier that
//! has a good copy. Tiers marked for repair get their bad copy replaced by the
//! good one (removed, rewritten, read back verified); an optional
//! write-back tier receives every chunk read. Used by restore, by
//! `strata export`, `diff` and `show`, and by `verify --repair`. It logs
//! nothing: what it found is in its result, for the caller to report.

use strata_format::manifest::ChunkRef;
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

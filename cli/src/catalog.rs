//! The inspection commands' use of the client's catalog and reader
//! (`strata::tiers`): listing with a spinner, a shard's manifest with the
//! CLI's errors, chunks and entries read with per-chunk fallback.

use std::collections::BTreeMap;

use strata::tiered::{ChunkData, StoreError};
use strata::tiers::{LoadedShard, ReadTier, ShardReader, Tier, TieredReader, Tiers};
use strata_format::manifest::ChunkRef;

pub(crate) use strata::tiers::{Catalog, Held};

use crate::CliError;

/// Lists the steps of every tier in `tiers` (a tier that cannot be
/// listed is kept with its error: the others still answer).
pub(crate) fn load(t: &Tiers, tiers: Vec<&Tier>) -> Catalog {
    // Listing an object store or a distant peer can take a while: a
    // spinner on a terminal after the first second (on stderr only).
    let names: Vec<&str> = tiers.iter().map(|t| t.name.as_str()).collect();
    let spinner = crate::progress::Spinner::start("listing", false);
    spinner.set(&format!("listing {}", names.join(", ")));
    t.catalog(&tiers)
}

/// Rank `rank`'s manifest of `step` from the first tier that holds a
/// good one, that tier, and the errors of the tiers tried before it.
pub(crate) fn shard<'c>(
    cat: &'c Catalog,
    t: &Tiers,
    step: u64,
    rank: u32,
) -> Result<(&'c Tier, LoadedShard, Vec<String>), CliError> {
    match t.block_on(cat.shard(step, rank, |_, _| true)) {
        Ok(found) => {
            let errors = found
                .errors
                .iter()
                .map(|(tier, e)| format!("{tier}: {e}"))
                .collect();
            Ok((found.tier, found.shard, errors))
        }
        Err(strata::Error::NothingToRestore(Some(msg))) => Err(CliError::NotFound(msg)),
        Err(strata::Error::Manifest { reason, .. }) => Err(CliError::Store(format!(
            "{} for step {step} rank {rank}: {}",
            "no good manifest",
            reason.strip_prefix("no good manifest: ").unwrap_or(&reason)
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The newest step committed in any tier, or the step given (which must
/// be in some tier): the catalog's answer with the CLI's error.
pub(crate) fn pick(cat: &Catalog, step: Option<u64>) -> Result<u64, CliError> {
    cat.pick(step).map_err(|e| match e {
        strata::Error::NothingToRestore(Some(msg)) => CliError::NotFound(msg),
        other => other.into(),
    })
}

/// The listing errors of the tiers, as `name: error`.
pub(crate) fn listing_errors(cat: &Catalog) -> Vec<String> {
    cat.unreadable()
        .map(|(tier, e)| format!("{}: {e}", tier.name))
        .collect()
}

/// Reads `chunks` through the tiered reader over `order`: from the first
/// tier, each failure retried on the next; every chunk verified by the
/// tier that serves it. Returns each chunk's bytes (or the first tier's
/// error) and where it came from.
pub(crate) fn read_with_fallback(
    t: &Tiers,
    order: &[&Tier],
    chunks: &[ChunkRef],
) -> Vec<Result<(ChunkData, String), StoreError>> {
    let tiers = order
        .iter()
        .map(|x| ReadTier {
            store: &*x.store,
            repair: false,
        })
        .collect();
    let reader = TieredReader::new(t.job(), tiers);
    t.block_on(reader.read(chunks, Vec::new()))
        .chunks
        .into_iter()
        .map(|c| {
            let from = c.from.map(|i| order[i].name.clone()).unwrap_or_default();
            c.result.map(|d| (d, from))
        })
        .collect()
}

/// Names of the entries of a manifest that use each chunk index.
pub(crate) fn entries_by_chunk(m: &strata_format::ShardManifest) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for e in &m.entries {
        for s in &e.segments {
            let v = out.entry(s.chunk).or_default();
            if v.last() != Some(&e.name) {
                v.push(e.name.clone());
            }
        }
    }
    out
}

/// An entry's bytes, read from the tiers in `order` (verified).
pub(crate) fn entry_bytes(
    t: &Tiers,
    order: &[&Tier],
    m: &strata_format::ShardManifest,
    name: &str,
) -> Option<Vec<u8>> {
    let tiers = order.iter().map(|&x| x.clone()).collect();
    let reader = ShardReader::new(t.job(), m.clone(), tiers, 0);
    t.block_on(reader.read_entry(name)).ok().map(|(b, _)| b)
}

/// Whether an entry whose chunk ids differ between `a` and `b` still has
/// the same bytes: true only for an entry packed into chunks shared with
/// other entries (a small tensor beside one that changed), whose bytes are
/// then read and compared. Entries that own whole chunks differ when their
/// chunk ids do.
pub(crate) fn packed_and_same(
    t: &Tiers,
    order: &[&Tier],
    a: &strata_format::ShardManifest,
    b: &strata_format::ShardManifest,
    name: &str,
) -> bool {
    let packed = |m: &strata_format::ShardManifest| {
        m.entry(name).is_some_and(|e| {
            e.segments.iter().all(|s| {
                m.chunks
                    .get(s.chunk as usize)
                    .is_some_and(|c| s.len < c.len)
            })
        })
    };
    if !(packed(a) && packed(b)) {
        return false;
    }
    match (
        entry_bytes(t, order, a, name),
        entry_bytes(t, order, b, name),
    ) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

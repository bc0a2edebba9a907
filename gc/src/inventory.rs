//! [`Inventory`]: what a tier holds of a job, taken with a strict listing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use strata_format::{ChunkId, ShardManifest};
use strata_tiered::{ChunkInfo, ChunkStore, StepInfo, StoreErrorKind};

use crate::error::{GcError, Result};

/// The chunks one manifest references, or why it cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestRefs {
    /// The distinct chunks it references.
    Chunks(Vec<ChunkId>),
    /// The manifest is there but does not decode: while it is kept, no
    /// chunk is deleted (what it references is unknown).
    Unreadable(String),
}

/// What a tier holds of one job: the planner's whole input besides the
/// policy.
#[derive(Clone, Debug)]
pub struct Inventory {
    /// Every step with its records, manifests, retiring markers.
    pub steps: Vec<StepInfo>,
    /// The references of every manifest listed, by (step, rank).
    pub manifests: BTreeMap<(u64, u32), ManifestRefs>,
    /// Every chunk with its stored size and age (by the tier's clock).
    pub chunks: Vec<ChunkInfo>,
    /// Steps never retired (pinned in the tier).
    pub pins: BTreeSet<u64>,
    /// The tier's own time, which stamped the chunks.
    pub now: SystemTime,
}

/// Lists everything of `job` in `store` (the chunks only `with_chunks`).
/// Any error but a manifest gone
/// meanwhile (a concurrent retirement) aborts: a plan is never made from a
/// partial listing.
pub async fn take_inventory(
    store: &dyn ChunkStore,
    job: &str,
    with_chunks: bool,
) -> Result<Inventory> {
    let now = store
        .now(job)
        .await
        .map_err(GcError::store(format!("the time of {}", store.name())))?;
    let steps = store.list_steps(job).await.map_err(GcError::store(format!(
        "listing the steps of {}",
        store.name()
    )))?;
    let pins = store.list_pins(job).await.map_err(GcError::store(format!(
        "listing the pins of {}",
        store.name()
    )))?;
    let manifests = read_manifests(store, job, &steps).await?;
    let chunks = if with_chunks {
        store
            .list_chunk_info(job)
            .await
            .map_err(GcError::store(format!(
                "listing the chunks of {}",
                store.name()
            )))?
    } else {
        Vec::new()
    };
    Ok(Inventory {
        steps,
        manifests,
        chunks,
        pins,
        now,
    })
}

/// The references of every manifest of `steps`, read concurrently (the
/// store's own concurrency): one collector reads every rank's manifests,
/// thousands of them in a large job.
pub(crate) async fn read_manifests(
    store: &dyn ChunkStore,
    job: &str,
    steps: &[StepInfo],
) -> Result<BTreeMap<(u64, u32), ManifestRefs>> {
    use futures::StreamExt;
    let keys: Vec<(u64, u32)> = steps
        .iter()
        .flat_map(|st| st.manifests.iter().map(move |&rank| (st.step, rank)))
        .collect();
    let mut reads = futures::stream::iter(keys)
        .map(
            |(step, rank)| async move { ((step, rank), store.get_manifest(job, step, rank).await) },
        )
        .buffered(store.concurrency().max(1));
    let mut out = BTreeMap::new();
    while let Some(((step, rank), read)) = reads.next().await {
        match read {
            Ok(bytes) => {
                let refs = match ShardManifest::decode(&bytes) {
                    Ok(m) => ManifestRefs::Chunks(m.chunks.iter().map(|c| c.id).collect()),
                    Err(e) => ManifestRefs::Unreadable(e.to_string()),
                };
                out.insert((step, rank), refs);
            }
            Err(e) if e.kind() == StoreErrorKind::NotFound => {}
            Err(e) if e.kind() == StoreErrorKind::Corrupt => {
                out.insert((step, rank), ManifestRefs::Unreadable(e.to_string()));
            }
            Err(e) => {
                return Err(GcError::Store {
                    what: format!("reading the manifest of step {step} rank {rank}"),
                    source: e,
                })
            }
        }
    }
    Ok(out)
}

//! `strata show STEP`: the entries of one rank's shard.

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;
use strata_format::{ChunkId, EntryKind, ShardManifest};

use crate::catalog::packed_and_same;
use crate::out::say;
use crate::size::human;
use crate::store_args::{select, StoreArgs};
use crate::table::Table;
use crate::CliError;

/// `strata show`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata show 1200 --l1 /nvme/strata --job llama-70b\n  strata show 1200 --rank 3 --tier l3 --json"
)]
pub(crate) struct ShowArgs {
    /// The step (default: the newest committed).
    pub(crate) step: Option<u64>,
    /// The rank.
    #[arg(long, default_value_t = 0)]
    pub(crate) rank: u32,
    /// Read from this tier only (l1, l3, l2, or a peer's name); stored sizes
    /// and codec ratios are that tier's.
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print JSON (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// One entry of the shard.
#[derive(Serialize, Debug)]
pub(crate) struct EntryRow {
    pub(crate) name: String,
    /// `tensor` or `blob`.
    pub(crate) kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shape: Option<Vec<u64>>,
    pub(crate) bytes: u64,
    /// Chunks holding its bytes.
    pub(crate) chunks: usize,
    /// Its share of the stored bytes of those chunks in the tier read
    /// (a chunk shared by several entries is split by bytes); `null` if
    /// the tier does not report sizes.
    pub(crate) stored_bytes: Option<u64>,
    /// bytes / stored_bytes.
    pub(crate) codec_ratio: Option<f64>,
    /// `new` (not in the previous step), `changed` (other chunks),
    /// `same`, or `null` when there is no previous step.
    pub(crate) change: Option<&'static str>,
    /// Where the tensor lies in a global tensor (a DTensor's shard, a PyTorch
    /// DCP write item), from the shard's `strata.layout` metadata; absent
    /// for a tensor saved whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) global: Option<Place>,
}

/// A tensor entry's place in its global tensor.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    /// The global tensor's fully qualified name (`model.layers.0.weight`).
    pub(crate) fqn: String,
    /// The global tensor's shape.
    pub(crate) shape: Vec<u64>,
    /// The offsets of this entry's piece in it.
    pub(crate) offsets: Vec<u64>,
}

/// An entry's kind (`tensor` or `blob`), dtype and shape, as `show --json`
/// and the mount's `manifest.json` give them.
pub(crate) fn kind_dtype_shape(k: &EntryKind) -> (&'static str, Option<String>, Option<Vec<u64>>) {
    match k {
        EntryKind::Tensor { dtype, shape } => (
            "tensor",
            Some(dtype.name().to_string()),
            Some(shape.clone()),
        ),
        EntryKind::Blob => ("blob", None, None),
    }
}

/// The metadata key holding each tensor entry's place (written by the
/// Python package for DTensors and DCP checkpoints).
pub(crate) const LAYOUT_KEY: &str = "strata.layout";

/// The places named by a shard's `strata.layout` (`{entry: [fqn, shape,
/// offsets]}`); anything malformed is ignored here (`show` is a viewer:
/// the DCP reader is the one that refuses a bad layout).
pub(crate) fn places(metadata: &BTreeMap<String, String>) -> BTreeMap<String, Place> {
    type Raw = BTreeMap<String, (String, Vec<u64>, Vec<u64>)>;
    metadata
        .get(LAYOUT_KEY)
        .and_then(|v| serde_json::from_str::<Raw>(v).ok())
        .map(|raw| {
            raw.into_iter()
                .filter(|(_, (_, shape, offsets))| shape.len() == offsets.len())
                .map(|(k, (fqn, shape, offsets))| {
                    (
                        k,
                        Place {
                            fqn,
                            shape,
                            offsets,
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The shard.
#[derive(Serialize, Debug)]
pub(crate) struct Shown {
    pub(crate) job: String,
    pub(crate) step: u64,
    pub(crate) rank: u32,
    pub(crate) world_size: u32,
    /// The tier the manifest comes from (the sizes too, unless it reports
    /// none, as a peer: then the fastest tier holding the shard that does).
    pub(crate) tier: String,
    /// The step compared against for `change`.
    pub(crate) previous_step: Option<u64>,
    pub(crate) logical_bytes: u64,
    pub(crate) chunks: usize,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) entries: Vec<EntryRow>,
}

pub(crate) fn run(a: &ShowArgs) -> Result<(), CliError> {
    let t = a.store.open()?;
    let cat = crate::catalog::load(&t, select(&t, &a.tier)?);
    let order: Vec<_> = t.tiers().iter().collect();
    let step = crate::catalog::pick(&cat, a.step)?;
    let (tier, shard, _) = crate::catalog::shard(&cat, &t, step, a.rank)?;
    let m = &shard.manifest;
    // Stored sizes from the tier read, else from the fastest other tier
    // holding this rank's shard that reports them (a peer does not).
    let mut sizes = t.chunk_sizes(tier)?;
    if sizes.is_none() {
        sizes = t
            .tiers()
            .iter()
            .filter(|x| x.name != tier.name)
            .filter(|x| {
                cat.info(x, step)
                    .is_some_and(|i| i.committed_ranks().contains(&a.rank))
            })
            .find_map(|x| t.chunk_sizes(x).ok().flatten());
    }
    // The previous committed step of this rank, in any tier.
    let previous = cat
        .committed_steps()
        .into_iter()
        .filter(|&s| s < step)
        .rev()
        .find_map(|s| {
            crate::catalog::shard(&cat, &t, s, a.rank)
                .ok()
                .map(|(_, p, _)| (s, p))
        });
    let before: Option<Pieces<'_>> = previous.as_ref().map(|(_, p)| segments(&p.manifest));
    let now = segments(m);
    let layout = places(&m.metadata);
    let entries = m
        .entries
        .iter()
        .map(|e| {
            let mut ids: Vec<u32> = e.segments.iter().map(|s| s.chunk).collect();
            ids.dedup();
            let stored = sizes.as_ref().map(|sz| {
                e.segments
                    .iter()
                    .map(|s| {
                        let c = &m.chunks[s.chunk as usize];
                        let on_tier = sz.get(&c.id).copied().unwrap_or(u64::from(c.len));
                        // This entry's share of the chunk's stored bytes.
                        (on_tier as f64 * f64::from(s.len) / f64::from(c.len.max(1))).round() as u64
                    })
                    .sum::<u64>()
            });
            let (kind, dtype, shape) = kind_dtype_shape(&e.kind);
            let change = before.as_ref().map(|b| match b.get(e.name.as_str()) {
                None => "new",
                Some(old) if Some(old) == now.get(e.name.as_str()) => "same",
                Some(_) => match &previous {
                    Some((_, p)) if packed_and_same(&t, &order, &p.manifest, m, &e.name) => "same",
                    _ => "changed",
                },
            });
            EntryRow {
                name: e.name.clone(),
                kind,
                dtype,
                shape,
                bytes: e.len,
                chunks: ids.len(),
                stored_bytes: stored,
                codec_ratio: stored.map(|s| ratio(e.len, s)),
                change,
                global: layout.get(&e.name).cloned(),
            }
        })
        .collect();
    let shown = Shown {
        job: t.job().to_string(),
        step,
        rank: a.rank,
        world_size: m.info.world_size,
        tier: tier.name.clone(),
        previous_step: previous.map(|(s, _)| s),
        logical_bytes: m.logical_bytes(),
        chunks: m.chunks.len(),
        metadata: m.metadata.clone(),
        entries,
    };
    if a.json {
        return crate::print_json(&shown);
    }
    say!(
        "job {} step {} rank {}/{} from {}: {} in {} entries, {} chunks{}",
        shown.job,
        shown.step,
        shown.rank,
        shown.world_size,
        shown.tier,
        human(shown.logical_bytes),
        shown.entries.len(),
        shown.chunks,
        shown
            .previous_step
            .map_or(String::new(), |p| format!(", compared with step {p}"))
    );
    let layout = places(&shown.metadata);
    for (k, v) in &shown.metadata {
        if k == LAYOUT_KEY {
            // Shown per entry below (FQN, GLOBAL, AT), not as raw JSON.
            say!("  metadata {k} = ({} tensors placed)", layout.len());
        } else {
            say!("  metadata {k} = {v}");
        }
    }
    let placed = !layout.is_empty();
    let mut head = vec!["NAME", "DTYPE", "SHAPE"];
    if placed {
        head.extend(["FQN", "GLOBAL", "AT"]);
    }
    head.extend(["BYTES", "CHUNKS", "STORED", "RATIO", "CHANGE"]);
    let mut table = Table::new(head.into_iter().map(String::from).collect());
    for e in &shown.entries {
        let mut row = vec![
            e.name.clone(),
            e.dtype.clone().unwrap_or_else(|| "blob".into()),
            e.shape.as_ref().map_or("-".into(), |s| format!("{s:?}")),
        ];
        if placed {
            match &e.global {
                Some(p) => row.extend([
                    p.fqn.clone(),
                    format!("{:?}", p.shape),
                    format!("{:?}", p.offsets),
                ]),
                None => row.extend(["-".into(), "-".into(), "-".into()]),
            }
        }
        row.extend([
            human(e.bytes),
            e.chunks.to_string(),
            e.stored_bytes.map_or("-".into(), human),
            e.codec_ratio.map_or("-".into(), |r| format!("{r:.2}")),
            e.change.unwrap_or("-").to_string(),
        ]);
        table.row(row);
    }
    table.print();
    Ok(())
}

/// raw / stored, rounded to 3 decimals (1.0 for an empty entry).
pub(crate) fn ratio(raw: u64, stored: u64) -> f64 {
    if stored == 0 {
        return 1.0;
    }
    (raw as f64 / stored as f64 * 1000.0).round() / 1000.0
}

/// Each entry's bytes as (chunk id, offset in chunk, length) pieces, by name.
pub(crate) type Pieces<'a> = BTreeMap<&'a str, Vec<(ChunkId, u32, u32)>>;

/// The [`Pieces`] of a manifest.
pub(crate) fn segments(m: &ShardManifest) -> Pieces<'_> {
    m.entries
        .iter()
        .map(|e| {
            let segs = e
                .segments
                .iter()
                .map(|s| {
                    let id = m
                        .chunks
                        .get(s.chunk as usize)
                        .map_or(ChunkId::of(b""), |c| c.id);
                    (id, s.offset, s.len)
                })
                .collect();
            (e.name.as_str(), segs)
        })
        .collect()
}

//! `strata stat`: per tier, how many bytes the job's checkpoints take and
//! what deduplication and compression save.

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;
use strata_format::ChunkId;

use crate::catalog::Held;
use crate::out::say;
use crate::show::ratio;
use crate::size::human;
use crate::store_args::{select, StoreArgs};
use crate::table::Table;
use crate::CliError;

/// `strata stat`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata stat --config strata.toml\n  strata stat --tier l3 --json"
)]
pub(crate) struct StatArgs {
    /// Only this tier (l1, l3, l2, or a peer's name; repeatable).
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print JSON (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// One tier's figures.
#[derive(Serialize, Debug)]
pub(crate) struct TierStat {
    pub(crate) tier: String,
    /// Steps committed in this tier.
    pub(crate) steps: usize,
    /// Sum of the committed steps' logical bytes (what a naive copy of
    /// each step would take).
    pub(crate) logical_bytes: u64,
    /// Distinct chunks those steps reference, and their raw bytes.
    pub(crate) referenced_chunks: usize,
    pub(crate) referenced_bytes: u64,
    /// Bytes those chunks take in this tier (`null`: a peer, which does
    /// not report sizes).
    pub(crate) stored_bytes: Option<u64>,
    /// Every chunk the tier holds for the job (referenced or not), and
    /// their stored bytes when known.
    pub(crate) chunks_held: usize,
    pub(crate) bytes_held: Option<u64>,
    /// logical_bytes / referenced_bytes.
    pub(crate) dedup_ratio: f64,
    /// referenced_bytes / stored_bytes.
    pub(crate) compression_ratio: Option<f64>,
    /// Manifests or listings that could not be read.
    pub(crate) errors: Vec<String>,
}

/// All tiers.
#[derive(Serialize, Debug)]
pub(crate) struct Stats {
    pub(crate) job: String,
    pub(crate) tiers: Vec<TierStat>,
}

pub(crate) fn run(a: &StatArgs) -> Result<(), CliError> {
    let t = a.store.open()?;
    let cat = crate::catalog::load(&t, select(&t, &a.tier)?);
    let mut out = Vec::new();
    let spinner = crate::progress::Spinner::start("reading manifests", a.json);
    for l in cat.listings() {
        let (tier, listed) = (&l.tier, l.steps.as_ref().map_err(|e| e.to_string()));
        spinner.set(&format!(
            "reading the manifests and chunk sizes of {}",
            tier.name
        ));
        let mut errors = Vec::new();
        let steps = match listed {
            Ok(s) => s.as_slice(),
            Err(e) => {
                errors.push(e);
                &[]
            }
        };
        let mut referenced: BTreeMap<ChunkId, u64> = BTreeMap::new();
        let (mut n, mut logical) = (0usize, 0u64);
        for info in steps {
            if cat.held(tier, info.step) != Held::Committed {
                continue;
            }
            n += 1;
            logical += cat.logical_bytes_in(tier, info.step);
            for rank in info.committed_ranks() {
                match t.load_shard(tier, steps, info.step, rank) {
                    Ok(sh) => {
                        for c in &sh.manifest.chunks {
                            referenced.insert(c.id, u64::from(c.len));
                        }
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
        }
        let sizes = match t.chunk_sizes(tier) {
            Ok(s) => s,
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        };
        let held = match &sizes {
            Some(s) => s.len(),
            None => t
                .block_on(tier.store.list_chunks(t.job()))
                .map(|v| v.len())
                .unwrap_or_else(|e| {
                    errors.push(e.to_string());
                    0
                }),
        };
        let referenced_bytes: u64 = referenced.values().sum();
        let stored = sizes.as_ref().map(|s| {
            referenced
                .iter()
                .map(|(id, raw)| s.get(id).copied().unwrap_or(*raw))
                .sum::<u64>()
        });
        out.push(TierStat {
            tier: tier.name.clone(),
            steps: n,
            logical_bytes: logical,
            referenced_chunks: referenced.len(),
            referenced_bytes,
            stored_bytes: stored,
            chunks_held: held,
            bytes_held: sizes.as_ref().map(|s| s.values().sum()),
            dedup_ratio: ratio(logical, referenced_bytes),
            compression_ratio: stored.map(|s| ratio(referenced_bytes, s)),
            errors,
        });
    }
    drop(spinner);
    if !out.is_empty() && out.iter().all(|s| s.steps == 0 && !s.errors.is_empty()) {
        let why: Vec<String> = out
            .iter()
            .map(|s| format!("{}: {}", s.tier, s.errors.join("; ")))
            .collect();
        return Err(CliError::Store(why.join("; ")));
    }
    let stats = Stats {
        job: t.job().to_string(),
        tiers: out,
    };
    if a.json {
        return crate::print_json(&stats);
    }
    say!("job {}", stats.job);
    let mut table = Table::new(
        [
            "TIER", "STEPS", "LOGICAL", "UNIQUE", "STORED", "DEDUP", "COMPRESS", "CHUNKS", "HELD",
        ]
        .map(String::from)
        .to_vec(),
    );
    for s in &stats.tiers {
        table.row(vec![
            s.tier.clone(),
            s.steps.to_string(),
            human(s.logical_bytes),
            human(s.referenced_bytes),
            s.stored_bytes.map_or("-".into(), human),
            format!("{:.2}x", s.dedup_ratio),
            s.compression_ratio
                .map_or("-".into(), |r| format!("{r:.2}x")),
            s.chunks_held.to_string(),
            s.bytes_held.map_or("-".into(), human),
        ]);
    }
    table.print();
    for s in &stats.tiers {
        for e in &s.errors {
            eprintln!("strata: warning: {}: {e}", s.tier);
        }
    }
    Ok(())
}

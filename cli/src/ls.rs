//! `strata ls`: the job's steps, newest first, with their state in every
//! tier.

use std::collections::{BTreeMap, BTreeSet};

use clap::Args;
use serde::Serialize;
use strata::tiers::{Tier, TierKind, Tiers};
use strata_format::ChunkId;

use crate::catalog::{Catalog, Held};
use crate::out::say;
use crate::size::human;
use crate::store_args::StoreArgs;
use crate::table::Table;
use crate::CliError;

/// `strata ls`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata ls --l1 /nvme/strata --job llama-70b\n  strata ls --config strata.toml --json"
)]
pub(crate) struct LsArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print JSON (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// One tier's hold on a step.
#[derive(Serialize, Debug)]
pub(crate) struct TierState {
    /// Tier name: L1, L2:<peer>, L3.
    pub(crate) tier: String,
    /// committed, partial, chunks (L3: some of the step's chunks, no
    /// manifest yet), absent, unreadable.
    pub(crate) state: &'static str,
    /// For `chunks`: percent of the step's chunk bytes already there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) percent: Option<f64>,
    /// Ranks with a commit record in this tier (a node's L1 holds its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ranks: Option<usize>,
}

/// The replication of a step over the peers.
#[derive(Serialize, Debug)]
pub(crate) struct L2Summary {
    /// replicated, degraded, absent.
    pub(crate) state: &'static str,
    /// Fewest peers holding any one rank's committed shard.
    pub(crate) replicas: usize,
    /// Replicas the configuration asks for.
    pub(crate) wanted: usize,
}

/// One step.
#[derive(Serialize, Debug)]
pub(crate) struct StepRow {
    pub(crate) step: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) world_size: Option<u32>,
    pub(crate) logical_bytes: u64,
    /// Bytes of the step's distinct chunks where they are stored (the
    /// fastest tier holding it), `null` if unknown.
    pub(crate) stored_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) committed_unix_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) age_secs: Option<u64>,
    pub(crate) tiers: Vec<TierState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) l2: Option<L2Summary>,
    /// The tiers where the step is pinned (garbage collection keeps it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) pinned: Vec<String>,
}

/// The whole listing.
#[derive(Serialize, Debug)]
pub(crate) struct Listing {
    pub(crate) job: String,
    pub(crate) steps: Vec<StepRow>,
    /// Tiers that could not be listed, with why.
    pub(crate) errors: Vec<String>,
    /// Every tier was listed. With no steps: the store is empty. Without
    /// it, a tier that could not be read may hold steps (never "empty").
    pub(crate) complete: bool,
}

pub(crate) fn run(a: &LsArgs) -> Result<(), CliError> {
    let t = a.store.open()?;
    let listing = list(&t)?;
    if a.json {
        crate::print_json(&listing)?;
    } else {
        print(&t, &listing);
    }
    // No steps and a tier that could not be read: not an empty store.
    if listing.steps.is_empty() && !listing.complete {
        return Err(CliError::Store(format!(
            "could not read every tier, so the job may have steps: {}",
            listing.errors.join("; ")
        )));
    }
    Ok(())
}

fn list(t: &Tiers) -> Result<Listing, CliError> {
    let cat = crate::catalog::load(t, t.tiers().iter().collect());
    let errors = crate::catalog::listing_errors(&cat);
    if errors.len() == cat.listings().len() {
        return Err(CliError::Store(errors.join("; ")));
    }
    // Chunk sizes per tier: one listing each (L1 directory, L3 objects).
    let sizes: BTreeMap<String, BTreeMap<ChunkId, u64>> = t
        .tiers()
        .iter()
        .filter_map(|tier| {
            t.chunk_sizes(tier)
                .ok()
                .flatten()
                .map(|m| (tier.name.clone(), m))
        })
        .collect();
    // Pins per tier (a tier that cannot be listed shows none).
    let pins: Vec<(String, BTreeSet<u64>)> = t
        .tiers()
        .iter()
        .filter_map(|tier| {
            t.block_on(tier.store.list_pins(t.job()))
                .ok()
                .map(|p| (tier.name.clone(), p))
        })
        .collect();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut rows = Vec::new();
    for step in cat.all_steps().into_iter().rev() {
        let record = cat.record(step);
        // The step's distinct chunks, from every rank's manifest.
        let mut chunks: BTreeMap<ChunkId, u64> = BTreeMap::new();
        let mut home: Option<&Tier> = None;
        for rank in cat.ranks(step) {
            if let Ok((tier, shard, _)) = crate::catalog::shard(&cat, t, step, rank) {
                home.get_or_insert(tier);
                for c in &shard.manifest.chunks {
                    chunks.insert(c.id, u64::from(c.len));
                }
            }
        }
        let raw_total: u64 = chunks.values().sum();
        // Stored sizes from the fastest tier holding the step that reports
        // them (a peer does not: then L1 or L3 answer).
        let sized = t
            .tiers()
            .iter()
            .find(|x| cat.held(x, step) == Held::Committed && sizes.contains_key(&x.name))
            .or(home);
        let stored_bytes = sized
            .and_then(|h| sizes.get(&h.name))
            .map(|s| chunks.keys().filter_map(|id| s.get(id)).sum());
        let tiers: Vec<TierState> = t
            .tiers()
            .iter()
            .map(|tier| {
                let listed = cat.listing(&tier.name).is_some_and(|l| l.steps.is_ok());
                if !listed {
                    return TierState {
                        tier: tier.name.clone(),
                        state: "unreadable",
                        percent: None,
                        ranks: None,
                    };
                }
                let (state, percent) = match cat.held(tier, step) {
                    Held::Committed => ("committed", None),
                    Held::Partial => ("partial", None),
                    Held::Absent => {
                        // L3 fills lazily: how much of the step's data is
                        // there already (uploaded, or shared with steps
                        // uploaded before).
                        let there = sizes.get(&tier.name).map(|s| {
                            chunks
                                .iter()
                                .filter(|(id, _)| s.contains_key(id))
                                .map(|(_, l)| *l)
                                .sum::<u64>()
                        });
                        match there {
                            Some(b) if tier.kind == TierKind::L3 && b > 0 && raw_total > 0 => (
                                "chunks",
                                Some((b as f64 * 100.0 / raw_total as f64 * 10.0).round() / 10.0),
                            ),
                            _ => ("absent", None),
                        }
                    }
                };
                let ranks = cat
                    .info(tier, step)
                    .map(|i| i.committed_ranks().len())
                    .filter(|&n| n > 0);
                TierState {
                    tier: tier.name.clone(),
                    state,
                    percent,
                    ranks,
                }
            })
            .collect();
        let l2 = l2_summary(t, &cat, step);
        rows.push(StepRow {
            step,
            world_size: record.map(|r| r.world_size),
            logical_bytes: cat.logical_bytes(step),
            stored_bytes,
            committed_unix_ms: record.map(|r| r.committed_unix_ms),
            age_secs: record.map(|r| now_ms.saturating_sub(r.committed_unix_ms) / 1000),
            tiers,
            l2,
            pinned: pins
                .iter()
                .filter(|(_, p)| p.contains(&step))
                .map(|(n, _)| n.clone())
                .collect(),
        });
    }
    Ok(Listing {
        job: t.job().to_string(),
        steps: rows,
        complete: errors.is_empty(),
        errors,
    })
}

/// Replicas of the step over the peers: the fewest peers holding any one
/// rank's committed shard, against the configured count.
fn l2_summary(t: &Tiers, cat: &Catalog, step: u64) -> Option<L2Summary> {
    let peers: Vec<&Tier> = t
        .tiers()
        .iter()
        .filter(|x| x.kind == TierKind::L2)
        .collect();
    if peers.is_empty() {
        return None;
    }
    let wanted = t.config().replicas.max(1);
    let world = cat.record(step).map_or(1, |r| r.world_size.max(1));
    let mut fewest = usize::MAX;
    for rank in 0..world {
        let n = peers
            .iter()
            .filter(|p| {
                cat.info(p, step)
                    .is_some_and(|i| i.committed_ranks().contains(&rank))
            })
            .count();
        fewest = fewest.min(n);
    }
    let replicas = if fewest == usize::MAX { 0 } else { fewest };
    let state = match replicas {
        0 => "absent",
        r if r >= wanted => "replicated",
        _ => "degraded",
    };
    Some(L2Summary {
        state,
        replicas,
        wanted,
    })
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn print(t: &Tiers, l: &Listing) {
    for e in &l.errors {
        eprintln!("strata: warning: {e}");
    }
    if l.steps.is_empty() {
        if l.complete {
            say!(
                "job {}: no steps (every tier was listed: the store is empty)",
                l.job
            );
        } else {
            say!(
                "job {}: no steps in the tiers that could be read ({} could not be read: not known to be empty)",
                l.job,
                l.errors.len()
            );
        }
        return;
    }
    if !l.complete {
        say!(
            "job {}: incomplete listing ({} tier(s) could not be read; see the warnings)",
            l.job,
            l.errors.len()
        );
    }
    let mut head: Vec<String> = vec!["STEP".into()];
    let tier_names: BTreeSet<&str> = t.tiers().iter().map(|x| x.name.as_str()).collect();
    let names: Vec<&str> = t
        .tiers()
        .iter()
        .map(|x| x.name.as_str())
        .filter(|n| tier_names.contains(n))
        .collect();
    head.extend(names.iter().map(|n| n.to_string()));
    let with_l2 = l.steps.iter().any(|s| s.l2.is_some());
    if with_l2 {
        head.push("REPLICAS".into());
    }
    head.extend(["WORLD", "LOGICAL", "STORED", "AGE"].map(String::from));
    let with_pins = l.steps.iter().any(|s| !s.pinned.is_empty());
    if with_pins {
        head.push("PINNED".into());
    }
    let mut table = Table::new(head);
    for s in &l.steps {
        let mut row = vec![s.step.to_string()];
        for ts in &s.tiers {
            let world = s.world_size.map_or(0, |w| w as usize);
            row.push(match (ts.percent, ts.ranks) {
                (Some(p), _) => format!("{} {p:.0}%", ts.state),
                (None, _) if ts.state == "absent" => "-".into(),
                (None, Some(n)) if n < world => format!("{} {n}/{world} ranks", ts.state),
                (None, _) => ts.state.into(),
            });
        }
        if with_l2 {
            row.push(match &s.l2 {
                Some(x) => format!("{} {}/{}", x.state, x.replicas, x.wanted),
                None => "-".into(),
            });
        }
        row.push(s.world_size.map_or("-".into(), |w| w.to_string()));
        row.push(human(s.logical_bytes));
        row.push(s.stored_bytes.map_or("-".into(), human));
        row.push(s.age_secs.map_or("-".into(), age));
        if with_pins {
            row.push(if s.pinned.is_empty() {
                "-".into()
            } else {
                s.pinned.join(",")
            });
        }
        table.row(row);
    }
    say!("job {}", l.job);
    table.print();
}

//! `strata diff A B`: what changed between two steps, by chunk ids.

use std::collections::{BTreeMap, BTreeSet};

use clap::Args;
use serde::Serialize;
use strata_format::{ChunkId, EntryKind};

use crate::catalog::packed_and_same;
use crate::out::say;
use crate::show::segments;
use crate::size::human;
use crate::store_args::StoreArgs;
use crate::table::Table;
use crate::CliError;

/// `strata diff`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata diff 1100 1200 --l1 /nvme/strata --job llama-70b\n  strata diff 1100 1200 --rank 0 --json"
)]
pub(crate) struct DiffArgs {
    /// The older step.
    pub(crate) a: u64,
    /// The newer step.
    pub(crate) b: u64,
    /// Compare this rank only (default: every rank of either step).
    #[arg(long)]
    pub(crate) rank: Option<u32>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print JSON (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// One entry that differs.
#[derive(Serialize, Debug)]
pub(crate) struct Change {
    pub(crate) rank: u32,
    pub(crate) name: String,
    /// `added`, `removed` or `changed`.
    pub(crate) change: &'static str,
    /// Bytes of the entry in A (0 if added).
    pub(crate) bytes_a: u64,
    /// Bytes of the entry in B (0 if removed).
    pub(crate) bytes_b: u64,
    /// Bytes of B's entry held in chunks A's entry does not use (all of
    /// them when added; 0 when removed).
    pub(crate) bytes_differ: u64,
    /// dtype or shape differ (a changed tensor only).
    pub(crate) kind_changed: bool,
}

/// The comparison.
#[derive(Serialize, Debug)]
pub(crate) struct Diff {
    pub(crate) job: String,
    pub(crate) a: u64,
    pub(crate) b: u64,
    pub(crate) ranks: Vec<u32>,
    pub(crate) added: usize,
    pub(crate) removed: usize,
    pub(crate) changed: usize,
    pub(crate) unchanged: usize,
    /// Sum of `bytes_differ` over the changes.
    pub(crate) bytes_differ: u64,
    /// Logical bytes of B.
    pub(crate) bytes_b: u64,
    pub(crate) changes: Vec<Change>,
}

pub(crate) fn run(a: &DiffArgs) -> Result<(), CliError> {
    let t = a.store.open()?;
    let order: Vec<_> = t.tiers().iter().collect();
    let cat = crate::catalog::load(&t, order.clone());
    for s in [a.a, a.b] {
        crate::catalog::pick(&cat, Some(s))?;
    }
    let ranks: Vec<u32> = match a.rank {
        Some(r) => vec![r],
        None => cat
            .ranks(a.a)
            .union(&cat.ranks(a.b))
            .copied()
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect(),
    };
    let mut changes = Vec::new();
    let (mut unchanged, mut bytes_b) = (0usize, 0u64);
    for &rank in &ranks {
        let load = |s: u64| -> Result<Option<strata_format::ShardManifest>, CliError> {
            match crate::catalog::shard(&cat, &t, s, rank) {
                Ok((_, sh, _)) => Ok(Some(sh.manifest)),
                Err(CliError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let (ma, mb) = (load(a.a)?, load(a.b)?);
        if ma.is_none() && mb.is_none() {
            return Err(CliError::NotFound(format!(
                "rank {rank} is in neither step {} nor step {}",
                a.a, a.b
            )));
        }
        let sa = ma.as_ref().map(segments).unwrap_or_default();
        let sb = mb.as_ref().map(segments).unwrap_or_default();
        let kinds =
            |m: &Option<strata_format::ShardManifest>| -> BTreeMap<String, (EntryKind, u64)> {
                m.as_ref().map_or(BTreeMap::new(), |m| {
                    m.entries
                        .iter()
                        .map(|e| (e.name.clone(), (e.kind.clone(), e.len)))
                        .collect()
                })
            };
        let (ka, kb) = (kinds(&ma), kinds(&mb));
        bytes_b += kb.values().map(|(_, l)| *l).sum::<u64>();
        let names: BTreeSet<&String> = ka.keys().chain(kb.keys()).collect();
        for name in names {
            let (ea, eb) = (ka.get(name), kb.get(name));
            let change = match (ea, eb) {
                (None, Some((_, lb))) => Change {
                    rank,
                    name: name.clone(),
                    change: "added",
                    bytes_a: 0,
                    bytes_b: *lb,
                    bytes_differ: *lb,
                    kind_changed: false,
                },
                (Some((_, la)), None) => Change {
                    rank,
                    name: name.clone(),
                    change: "removed",
                    bytes_a: *la,
                    bytes_b: 0,
                    bytes_differ: 0,
                    kind_changed: false,
                },
                (Some((kind_a, la)), Some((kind_b, lb))) => {
                    let (pa, pb) = (&sa[name.as_str()], &sb[name.as_str()]);
                    let same_kind = kind_a == kind_b;
                    let same = pa == pb
                        || match (&ma, &mb) {
                            (Some(x), Some(y)) => {
                                same_kind && packed_and_same(&t, &order, x, y, name)
                            }
                            _ => false,
                        };
                    if same && same_kind {
                        unchanged += 1;
                        continue;
                    }
                    let ids_a: BTreeSet<ChunkId> = pa.iter().map(|p| p.0).collect();
                    let differ = pb
                        .iter()
                        .filter(|p| !ids_a.contains(&p.0))
                        .map(|p| u64::from(p.2))
                        .sum();
                    Change {
                        rank,
                        name: name.clone(),
                        change: "changed",
                        bytes_a: *la,
                        bytes_b: *lb,
                        bytes_differ: differ,
                        kind_changed: kind_a != kind_b,
                    }
                }
                (None, None) => continue,
            };
            changes.push(change);
        }
    }
    let count = |c: &str| changes.iter().filter(|x| x.change == c).count();
    let diff = Diff {
        job: t.job().to_string(),
        a: a.a,
        b: a.b,
        ranks,
        added: count("added"),
        removed: count("removed"),
        changed: count("changed"),
        unchanged,
        bytes_differ: changes.iter().map(|c| c.bytes_differ).sum(),
        bytes_b,
        changes,
    };
    if a.json {
        return crate::print_json(&diff);
    }
    say!(
        "job {}: step {} -> {}: {} added, {} removed, {} changed, {} unchanged; {} of {} differ",
        diff.job,
        diff.a,
        diff.b,
        diff.added,
        diff.removed,
        diff.changed,
        diff.unchanged,
        human(diff.bytes_differ),
        human(diff.bytes_b)
    );
    if diff.changes.is_empty() {
        return Ok(());
    }
    let mut table = Table::new(
        ["RANK", "CHANGE", "NAME", "BYTES A", "BYTES B", "DIFFER"]
            .map(String::from)
            .to_vec(),
    );
    for c in &diff.changes {
        table.row(vec![
            c.rank.to_string(),
            if c.kind_changed {
                "changed (dtype/shape)".into()
            } else {
                c.change.to_string()
            },
            c.name.clone(),
            human(c.bytes_a),
            human(c.bytes_b),
            human(c.bytes_differ),
        ]);
    }
    table.print();
    Ok(())
}

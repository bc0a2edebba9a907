//! `strata gc`: retention and garbage collection of every configured tier,
//! by one collector for every rank (an operator's run; the ranks collect
//! their own L1 shards after each save). `--dry-run` deletes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use strata::tiers::TierKind;
use strata_gc::{collect, Abandoned, Evidence, Options, Report, Retention, Scope};

use crate::out::say;
use crate::size::human;
use crate::store_args::{select, StoreArgs};
use crate::table::Table;
use crate::CliError;

/// `strata gc`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata gc --config strata.toml --dry-run\n  strata gc --tier l3 --keep-last 2 --keep-every 1000 --json\n\nDefaults per tier are the job's own (what the library collects by): L1 keeps keep_last steps; peers keep 2 (what strata peer serve keeps by default); L3 keeps l3_keep_last and every l3_keep_every-th, and is left alone with l3_keep_last = 0 (\"never collect L3\") unless --keep-last is given. The grace period (gc_grace_secs; L3: l3_gc_grace_secs) protects chunks a save in flight may reuse. On L1, run it while no rank of the job runs there: it does not know which steps a running rank still holds for an upload or a push."
)]
pub(crate) struct GcArgs {
    /// Only this tier (l1, l3, l2, or a peer's name; repeatable).
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Say what would be deleted; delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Keep the newest N committed steps (default: per tier).
    #[arg(long, value_name = "N")]
    pub(crate) keep_last: Option<usize>,
    /// Keep every step divisible by K (0: none; default: per tier).
    #[arg(long, value_name = "K")]
    pub(crate) keep_every: Option<u64>,
    /// Keep the steps committed within this many seconds.
    #[arg(long, value_name = "SECS")]
    pub(crate) keep_within: Option<u64>,
    /// Leave unreferenced chunks the tier touched within this many seconds
    /// (default: gc_grace_secs; L3: 3600).
    #[arg(long, value_name = "SECS")]
    pub(crate) grace: Option<u64>,
    /// L3 only: incomplete steps (some rank's shard never reached L3)
    /// whose every commit record says the step was saved (committed on
    /// L1, by the saving node's clock) at least this many seconds ago
    /// count as abandoned: of those, all but the newest keep-last go.
    /// Without it an incomplete step goes only once older than the oldest
    /// kept complete step. Give it only when no rank can still upload them
    /// (the job is over, or its missing ranks stopped): one run cannot
    /// tell.
    #[arg(long, value_name = "SECS")]
    pub(crate) abandoned_after: Option<u64>,
    /// Never retire this step (repeatable).
    #[arg(long = "keep", value_name = "STEP")]
    pub(crate) keep: Vec<u64>,
    /// Print JSON (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// One tier's outcome.
#[derive(Serialize, Debug)]
pub(crate) struct TierGc {
    pub(crate) tier: String,
    pub(crate) dry_run: bool,
    pub(crate) kept: Vec<u64>,
    pub(crate) shards_retired: u64,
    pub(crate) partial_removed: u64,
    pub(crate) chunks_deleted: u64,
    pub(crate) bytes_freed: u64,
    /// Incomplete multipart uploads aborted (L3).
    pub(crate) uploads_aborted: u64,
    /// Why stale uploads could not be aborted (the chunks were swept).
    pub(crate) uploads_error: Option<String>,
    pub(crate) held_back: Option<String>,
    /// Why this tier was not (fully) collected; nothing of it was deleted
    /// if the listing failed.
    pub(crate) error: Option<String>,
    /// Why the configuration leaves this tier alone (`l3_keep_last = 0`);
    /// nothing of it was deleted.
    pub(crate) skipped: Option<String>,
}

impl TierGc {
    fn of(tier: &str, r: Report) -> Self {
        TierGc {
            tier: tier.into(),
            dry_run: r.dry_run,
            kept: r.kept,
            shards_retired: r.shards_retired,
            partial_removed: r.partial_removed,
            chunks_deleted: r.chunks_deleted,
            bytes_freed: r.bytes_freed,
            uploads_aborted: r.uploads_aborted,
            uploads_error: r.uploads_error,
            held_back: r.held_back,
            error: None,
            skipped: None,
        }
    }
}

/// The policy for a tier: the job's own (`Config::retention_for`, the
/// definition the library collects by), then the flags. None where the
/// configuration never collects the tier (`l3_keep_last = 0`) and no
/// `--keep-last` asks for it explicitly.
fn policy(a: &GcArgs, kind: TierKind, cfg: &strata::Config) -> Option<Retention> {
    let mut p = match (cfg.retention_for(kind), a.keep_last) {
        (Some(p), _) => p,
        (None, Some(_)) => cfg.retention_rules(kind),
        (None, None) => return None,
    };
    if let Some(n) = a.keep_last {
        p.keep_last = n;
    }
    if let Some(k) = a.keep_every {
        p.keep_every = k;
    }
    if let Some(t) = a.keep_within {
        p.keep_within = Some(Duration::from_secs(t));
    }
    if let Some(g) = a.grace {
        p.grace = Duration::from_secs(g);
    }
    Some(p)
}

/// Why a tier the configuration never collects was left alone.
const NEVER_COLLECTED: &str =
    "not collected: l3_keep_last = 0 (the job never collects L3; --keep-last N collects it)";

pub(crate) fn run(a: &GcArgs) -> Result<(), CliError> {
    if a.keep_last == Some(0) {
        return Err(CliError::Arg("--keep-last must be at least 1".into()));
    }
    let t = a.store.open()?;
    let tiers = select(&t, &a.tier)?;
    if a.abandoned_after.is_some() && !tiers.iter().any(|x| x.kind == TierKind::L3) {
        return Err(CliError::Arg(
            "--abandoned-after applies to L3 only, and no L3 tier is selected".into(),
        ));
    }
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for tier in tiers {
        let Some(p) = policy(a, tier.kind, t.config()) else {
            out.push(TierGc {
                skipped: Some(NEVER_COLLECTED.into()),
                ..TierGc::of(&tier.name, Report::default())
            });
            continue;
        };
        let opts = Options {
            scope: Some(Scope::All),
            // Ranks copy their own records to L3: a step counts there once
            // every rank's is in.
            evidence: if tier.kind == TierKind::L3 {
                Evidence::EveryRank
            } else {
                Evidence::AnyRecord
            },
            abandoned: match a.abandoned_after {
                Some(secs) if tier.kind == TierKind::L3 => {
                    Abandoned::CommittedBefore(Duration::from_secs(secs))
                }
                _ => Abandoned::Unknown,
            },
            pins: a.keep.iter().copied().collect::<BTreeSet<u64>>(),
            dry_run: a.dry_run,
            ..Default::default()
        };
        let r = t.block_on(collect(&*tier.store, t.job(), &p, &opts));
        match r {
            Ok((_, report)) => out.push(TierGc::of(&tier.name, report)),
            Err(e) => {
                failed.push(format!("{}: {e}", tier.name));
                out.push(TierGc {
                    error: Some(e.to_string()),
                    ..TierGc::of(&tier.name, Report::default())
                });
            }
        }
    }
    if a.json {
        let doc = serde_json::json!({ "job": t.job(), "dry_run": a.dry_run, "tiers": out });
        say!("{doc}");
    } else {
        let verb = if a.dry_run { "would free" } else { "freed" };
        let mut table = Table::new(
            [
                "tier", "kept", "shards", "partial", "chunks", verb, "uploads", "note",
            ]
            .map(String::from)
            .to_vec(),
        );
        for g in &out {
            let kept = match (g.kept.first(), g.kept.last()) {
                (Some(a), Some(b)) if a != b => format!("{} ({a}..{b})", g.kept.len()),
                (Some(a), _) => format!("1 ({a})"),
                _ => "0".into(),
            };
            table.row(vec![
                g.tier.clone(),
                kept,
                g.shards_retired.to_string(),
                g.partial_removed.to_string(),
                g.chunks_deleted.to_string(),
                human(g.bytes_freed),
                g.uploads_aborted.to_string(),
                g.error
                    .clone()
                    .or_else(|| g.skipped.clone())
                    .or_else(|| g.held_back.clone())
                    .or_else(|| {
                        g.uploads_error
                            .as_ref()
                            .map(|e| format!("stale uploads not aborted: {e}"))
                    })
                    .unwrap_or_default(),
            ]);
        }
        table.print();
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Store(failed.join("; ")))
    }
}

/// `strata pin` / `strata unpin`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata pin 1000 --config strata.toml\n  strata unpin 1000 --tier l3\n\nA pin is stored in the tier: garbage collection (after saves, after uploads, strata gc) never retires a pinned step until it is unpinned. A peer keeps its pins on its spill disk, with its replicas, across restarts of its service."
)]
pub(crate) struct PinArgs {
    /// The step.
    pub(crate) step: u64,
    /// Only this tier (l1, l2, l3, a peer's name; repeatable; default: every tier).
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

/// Pins (`on`) or unpins a step in the selected tiers.
pub(crate) fn run_pin(a: &PinArgs, on: bool) -> Result<(), CliError> {
    let t = a.store.open()?;
    let tiers = select(&t, &a.tier)?;
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for tier in tiers {
        match t.block_on(tier.store.set_pin(t.job(), a.step, on)) {
            Ok(()) => done.push(tier.name.clone()),
            Err(e) => failed.push(format!("{}: {e}", tier.name)),
        }
    }
    let verb = if on { "pinned" } else { "unpinned" };
    if !done.is_empty() {
        say!("step {} {verb} in {}", a.step, done.join(", "));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Store(failed.join("; ")))
    }
}

//! `strata verify`: re-hash every chunk of the chosen steps in the chosen
//! tiers, name what is damaged or missing, where a good copy is, and with
//! `--repair` rewrite the bad copies from a good one.

use std::collections::{BTreeMap, BTreeSet};

use clap::Args;
use serde::Serialize;
use strata::tiered::StoreErrorKind;
use strata::tiers::copy::{copy_step, CopyOptions};
use strata::tiers::{ReadTier, TieredReader};
use strata::tiers::{Tier, Tiers};
use strata_format::codec::ElemHint;
use strata_format::manifest::ChunkRef;
use strata_format::ChunkId;

use crate::catalog::{Catalog, Held};
use crate::out::say;
use crate::progress::Progress;
use crate::size::human;
use crate::store_args::{select, StoreArgs};
use crate::CliError;

/// Bytes read per batch (bounded memory: one batch in flight).
const BATCH_BYTES: u64 = 256 << 20;

/// `strata verify`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata verify --l1 /nvme/strata --job llama-70b          # the newest step, every tier\n  strata verify --all --tier l3 --config strata.toml\n  strata verify 1200 --repair\n\nExit status: 0 nothing damaged; 1 damage remains; 5 damage was found and every bad copy was repaired; 3 a tier could not be read; 4 no such step."
)]
pub(crate) struct VerifyArgs {
    /// The step (default: the newest committed).
    pub(crate) step: Option<u64>,
    /// Every step committed in each tier.
    #[arg(long, conflicts_with = "step")]
    pub(crate) all: bool,
    /// Only this tier (l1, l3, l2, or a peer's name; repeatable).
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    /// Only this rank.
    #[arg(long)]
    pub(crate) rank: Option<u32>,
    /// Rewrite every damaged or missing copy from a good copy in another
    /// tier, and say what was rewritten.
    #[arg(long)]
    pub(crate) repair: bool,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print JSON (schema in docs/cli.md).
    #[arg(long)]
    pub(crate) json: bool,
}

/// Where an entry uses a chunk.
#[derive(Serialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Use {
    pub(crate) step: u64,
    pub(crate) rank: u32,
    pub(crate) entry: String,
}

/// One damaged, missing or unreadable copy.
#[derive(Serialize, Debug)]
pub(crate) struct Problem {
    pub(crate) tier: String,
    /// `chunk`, `manifest` or `commit record`.
    pub(crate) object: &'static str,
    /// The chunk id (hex), or `step/rank` for a manifest or a record.
    pub(crate) id: String,
    /// `damaged`, `missing` or `unreadable`.
    pub(crate) state: &'static str,
    pub(crate) error: String,
    /// The entries that use the chunk.
    pub(crate) entries: Vec<Use>,
    /// Tiers holding a verified good copy.
    pub(crate) good_copies: Vec<String>,
    /// True once `--repair` rewrote it and read it back verified.
    pub(crate) repaired: bool,
}

/// The outcome.
#[derive(Serialize, Debug)]
pub(crate) struct Report {
    pub(crate) job: String,
    pub(crate) tiers: Vec<String>,
    pub(crate) steps: Vec<u64>,
    pub(crate) chunks_verified: u64,
    pub(crate) bytes_verified: u64,
    pub(crate) manifests_verified: u64,
    pub(crate) problems: Vec<Problem>,
    pub(crate) repaired: usize,
    /// No problem left (after repairs).
    pub(crate) clean: bool,
    /// Chosen tiers that could not be listed (nothing in them was checked).
    pub(crate) unreadable_tiers: Vec<String>,
    /// Shards retention is removing (a retiring marker is there): what is
    /// left of them is not damage, and `--repair` leaves them alone; the
    /// next retention finishes the job.
    pub(crate) retiring: Vec<String>,
}

/// What one tier must hold: each chunk with its length, hint and users.
type Wanted = BTreeMap<ChunkId, (u32, ElemHint, Vec<Use>)>;

pub(crate) fn run(a: &VerifyArgs) -> Result<(), CliError> {
    let t = a.store.open()?;
    let all = crate::catalog::load(&t, t.tiers().iter().collect());
    let chosen = select(&t, &a.tier)?;
    let steps: Vec<u64> = if a.all {
        all.decided_steps().into_iter().collect()
    } else {
        vec![crate::catalog::pick(&all, a.step)?]
    };
    if steps.is_empty() {
        return Err(CliError::NotFound("no committed step in any tier".into()));
    }
    let mut problems = Vec::new();
    let mut retiring = Vec::new();
    let (mut chunks_verified, mut bytes_verified, mut manifests) = (0u64, 0u64, 0u64);
    let mut plans: Vec<(&Tier, Wanted)> = Vec::new();
    // Manifests first: each tier's, checked against its commit records.
    for &tier in &chosen {
        let mut wanted = Wanted::new();
        let steps_here = all.steps_of(tier);
        for &step in &steps {
            if all.held(tier, step) == Held::Absent {
                continue;
            }
            let ranks: BTreeSet<u32> = all
                .info(tier, step)
                .map(|i| i.committed_ranks())
                .unwrap_or_default();
            for rank in ranks {
                if a.rank.is_some_and(|r| r != rank) {
                    continue;
                }
                manifests += 1;
                let shard = match t.load_shard(tier, steps_here, step, rank) {
                    Ok(s) => s,
                    Err(e) => {
                        let mut p = Problem {
                            tier: tier.name.clone(),
                            object: "manifest",
                            id: format!("{step}/{rank}"),
                            state: state_of_error(&e),
                            error: e.to_string(),
                            entries: Vec::new(),
                            good_copies: Vec::new(),
                            repaired: false,
                        };
                        let good = good_manifest(&t, &all, tier, step, rank);
                        p.good_copies = good.iter().map(|x| x.name.clone()).collect();
                        if a.repair && !good.is_empty() {
                            let copied = copy_from_first(&t, &good, tier, step, rank);
                            // A tier already committed refuses the record
                            // again (AlreadyExists) after the manifest was
                            // rewritten: what counts is that it reads good.
                            p.repaired = t.load_shard(tier, steps_here, step, rank).is_ok();
                            if let (Err(e), false) = (copied, p.repaired) {
                                p.error = format!("{}; repair failed: {e}", p.error);
                            }
                        }
                        problems.push(p);
                        // The chunks are still checked, from a good manifest.
                        match crate::catalog::shard(&all, &t, step, rank) {
                            Ok((_, s, _)) => s,
                            Err(_) => continue,
                        }
                    }
                };
                let m = &shard.manifest;
                let users = crate::catalog::entries_by_chunk(m);
                for (i, c) in m.chunks.iter().enumerate() {
                    let w = wanted.entry(c.id).or_insert((c.len, c.hint, Vec::new()));
                    for name in users.get(&(i as u32)).into_iter().flatten() {
                        w.2.push(Use {
                            step,
                            rank,
                            entry: name.clone(),
                        });
                    }
                }
            }
        }
        problems.extend(record_problems(
            &t,
            &all,
            tier,
            &steps,
            a.rank,
            a.repair,
            &mut retiring,
        ));
        plans.push((tier, wanted));
    }
    let unreadable: Vec<String> = all
        .unreadable()
        .filter(|(x, _)| chosen.iter().any(|c| c.name == x.name))
        .map(|(x, e)| format!("{}: {e}", x.name))
        .collect();
    if manifests == 0 && !unreadable.is_empty() {
        return Err(CliError::Store(format!(
            "not verified: {}",
            unreadable.join("; ")
        )));
    }
    if manifests == 0 {
        return Err(CliError::NotFound(format!(
            "nothing to verify: step{} {}{} in none of {}",
            if steps.len() == 1 { "" } else { "s" },
            steps
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            a.rank.map_or(String::new(), |r| format!(" rank {r}")),
            chosen
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let total: u64 = plans
        .iter()
        .flat_map(|(_, w)| w.values().map(|(l, _, _)| u64::from(*l)))
        .sum();
    let progress = Progress::bytes(total, "verifying", a.json);
    for (tier, wanted) in &plans {
        // The tier under check first (repaired with --repair), then every
        // other tier, read for the chunks it fails to list the good copies.
        let order: Vec<&Tier> = std::iter::once(*tier)
            .chain(t.tiers().iter().filter(|x| x.name != tier.name))
            .collect();
        let reader = TieredReader::new(
            t.job(),
            order
                .iter()
                .enumerate()
                .map(|(i, x)| ReadTier {
                    store: &*x.store,
                    repair: a.repair && i == 0,
                })
                .collect(),
        )
        .every_copy(true);
        let ids: Vec<ChunkId> = wanted.keys().copied().collect();
        for batch in batches(&ids, wanted) {
            let refs: Vec<ChunkRef> = batch
                .iter()
                .map(|id| ChunkRef {
                    id: *id,
                    len: wanted[id].0,
                    hint: wanted[id].1,
                })
                .collect();
            let got = t.block_on(reader.read(&refs, Vec::new()));
            for (id, c) in batch.iter().zip(got.chunks) {
                let (len, _, users) = &wanted[id];
                progress.inc(u64::from(*len));
                let Some((_, e)) = c.errors.iter().find(|(x, _)| *x == 0) else {
                    chunks_verified += 1;
                    bytes_verified += u64::from(*len);
                    continue;
                };
                let state = match e.kind() {
                    StoreErrorKind::Corrupt => "damaged",
                    StoreErrorKind::NotFound => "missing",
                    _ => "unreadable",
                };
                let mut users = users.clone();
                users.sort();
                users.dedup();
                let mut error = e.to_string();
                if let Some((_, why)) = c.repair_failed.iter().find(|(x, _)| *x == 0) {
                    error = format!("{error}; repair failed: {why}");
                }
                problems.push(Problem {
                    tier: tier.name.clone(),
                    object: "chunk",
                    id: id.to_hex(),
                    state,
                    error,
                    entries: users,
                    good_copies: c.good.iter().map(|&i| order[i].name.clone()).collect(),
                    repaired: c.repaired.contains(&0),
                });
            }
        }
    }
    progress.finish();
    let repaired = problems.iter().filter(|p| p.repaired).count();
    let bad_manifests = problems
        .iter()
        .filter(|p| p.object == "manifest" && !p.repaired)
        .count() as u64;
    let report = Report {
        job: t.job().to_string(),
        tiers: chosen.iter().map(|x| x.name.clone()).collect(),
        steps,
        chunks_verified,
        bytes_verified,
        manifests_verified: manifests - bad_manifests,
        clean: problems.iter().all(|p| p.repaired),
        repaired,
        problems,
        unreadable_tiers: unreadable,
        retiring,
    };
    if a.json {
        crate::print_json(&report)?;
    } else {
        print(&report);
    }
    if report.problems.is_empty() && !report.unreadable_tiers.is_empty() {
        return Err(CliError::Store(format!(
            "not verified: {}",
            report.unreadable_tiers.join("; ")
        )));
    }
    if report.problems.is_empty() {
        Ok(())
    } else if report.clean {
        Err(CliError::Repaired(report.repaired))
    } else if report
        .problems
        .iter()
        .all(|p| p.repaired || p.state == "unreadable")
    {
        // Nothing found damaged; some copies could not be read at all.
        let left = report.problems.iter().filter(|p| !p.repaired).count();
        Err(CliError::Store(format!(
            "{left} cop{} could not be read (not verified)",
            if left == 1 { "y" } else { "ies" }
        )))
    } else {
        let left = report.problems.iter().filter(|p| !p.repaired).count();
        Err(CliError::Damage(format!(
            "{left} damaged, missing or unreadable cop{} left",
            if left == 1 { "y" } else { "ies" }
        )))
    }
}

/// Ranks whose shard manifest `tier` holds for a step committed elsewhere,
/// but whose commit record there is missing or unreadable (the tier's
/// listing skipped it): the step is not committed in that tier. `--repair`
/// copies the shard from a tier holding it committed (the chunks this tier
/// lacks, the manifest, the record; a damaged record is replaced: it
/// cannot be a valid winner of the create-only commit).
fn record_problems(
    t: &Tiers,
    all: &Catalog,
    tier: &Tier,
    steps: &[u64],
    only_rank: Option<u32>,
    repair: bool,
    retiring: &mut Vec<String>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    for &step in steps {
        let Some(info) = all.info(tier, step) else {
            continue;
        };
        let here = info.committed_ranks();
        for &rank in &info.manifests {
            if here.contains(&rank) || only_rank.is_some_and(|r| r != rank) {
                continue;
            }
            if info.retiring.contains(&rank) {
                // Retention was removing this shard (its record goes
                // first): not damage, and never committed again here.
                retiring.push(format!("step {step} rank {rank} in {}", tier.name));
                continue;
            }
            let good: Vec<(&Tier, &strata::format::CommitRecord)> = all
                .listings()
                .iter()
                .map(|l| &l.tier)
                .filter(|x| x.name != tier.name)
                .filter_map(|x| {
                    let rec = all
                        .info(x, step)?
                        .records
                        .values()
                        .find(|r| r.shards.iter().any(|sh| sh.rank == rank))?;
                    Some((x, rec))
                })
                .collect();
            if good.is_empty() {
                // No tier holds this rank's record. If another rank's
                // record of the step exists, every rank voted it durable
                // (no record is written before that): this shard is the
                // one its rank voted for, and its record is missing (the
                // write failed, or the rank died after its vote). Else the
                // step was never decided: a partial step, not damage.
                if let Some(p) = undecided_record(t, all, tier, step, rank, info, repair) {
                    out.push(p);
                }
                continue;
            };
            let mut p = Problem {
                tier: tier.name.clone(),
                object: "commit record",
                id: format!("{step}/{rank}"),
                state: "missing",
                error: format!(
                    "step {step} rank {rank}: the shard manifest is in {} but its commit record is missing or unreadable there (the step is not committed in {})",
                    tier.name, tier.name
                ),
                entries: Vec::new(),
                good_copies: good.iter().map(|(x, _)| x.name.clone()).collect(),
                repaired: false,
            };
            if repair {
                let from: Vec<&Tier> = good.iter().map(|(x, _)| *x).collect();
                match copy_from_first(t, &from, tier, step, rank) {
                    Ok(()) => {
                        p.repaired = t.steps(tier).is_ok_and(|v| {
                            v.iter()
                                .any(|i| i.step == step && i.committed_ranks().contains(&rank))
                        });
                    }
                    Err(e) => p.error = format!("{}; repair failed: {e}", p.error),
                }
            }
            out.push(p);
        }
    }
    out
}

/// A manifest of rank `rank` without a record in any tier, of a step
/// another rank committed (the step was decided): reported, and with
/// `repair` rolled forward (its record written, once its manifest and
/// chunks check out), as the rank itself would at its next restore.
fn undecided_record(
    t: &Tiers,
    all: &Catalog,
    tier: &Tier,
    step: u64,
    rank: u32,
    info: &strata::tiered::StepInfo,
    repair: bool,
) -> Option<Problem> {
    let (by, world) = all.listings().iter().find_map(|l| {
        let rec = all.info(&l.tier, step)?.records.values().next()?;
        Some((rec.shards.first()?.rank, rec.world_size))
    })?;
    if rank >= world || info.unreadable.contains_key(&rank) {
        return None;
    }
    let mut p = Problem {
        tier: tier.name.clone(),
        object: "commit record",
        id: format!("{step}/{rank}"),
        state: "missing",
        error: format!(
            "step {step} rank {rank}: the step was decided (rank {by} committed it), but this rank's commit record was never written (its write failed, or the rank died after its vote); --repair rolls it forward"
        ),
        entries: Vec::new(),
        good_copies: Vec::new(),
        repaired: false,
    };
    if repair {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        match t.block_on(strata::roll_forward::commit_decided(
            tier.store.as_ref(),
            t.job(),
            step,
            rank,
            world,
            now,
        )) {
            Ok(_) => {
                p.repaired = t.steps(tier).is_ok_and(|v| {
                    v.iter()
                        .any(|i| i.step == step && i.committed_ranks().contains(&rank))
                });
            }
            Err(e) => p.error = format!("{}; repair failed: {e}", p.error),
        }
    }
    Some(p)
}

fn state_of_error(e: &strata::Error) -> &'static str {
    match e {
        strata::Error::Store(s) if s.kind() == StoreErrorKind::NotFound => "missing",
        strata::Error::Store(s) if s.kind() == StoreErrorKind::Corrupt => "damaged",
        strata::Error::Manifest { reason, .. } if reason.contains("not found") => "missing",
        strata::Error::Manifest { .. } => "damaged",
        _ => "unreadable",
    }
}

/// Splits `ids` into batches of at most [`BATCH_BYTES`].
fn batches(ids: &[ChunkId], wanted: &Wanted) -> Vec<Vec<ChunkId>> {
    let mut out: Vec<Vec<ChunkId>> = Vec::new();
    let mut bytes = 0u64;
    for id in ids {
        let len = u64::from(wanted[id].0);
        match out.last_mut() {
            Some(b) if bytes + len <= BATCH_BYTES => b.push(*id),
            _ => {
                out.push(vec![*id]);
                bytes = 0;
            }
        }
        bytes += len;
    }
    out
}

/// The tiers other than `bad` holding a good copy of a manifest.
fn good_manifest<'t>(
    t: &'t Tiers,
    all: &Catalog,
    bad: &Tier,
    step: u64,
    rank: u32,
) -> Vec<&'t Tier> {
    t.tiers()
        .iter()
        .filter(|x| x.name != bad.name)
        .filter(|x| t.load_shard(x, all.steps_of(x), step, rank).is_ok())
        .collect()
}

/// Repairs `bad`'s copy of a shard by copying it whole from the first of
/// `good` that can give it ([`copy_step`]: the chunks `bad` lacks, the
/// manifest, the commit record).
fn copy_from_first(
    t: &Tiers,
    good: &[&Tier],
    bad: &Tier,
    step: u64,
    rank: u32,
) -> Result<(), String> {
    let mut errors = Vec::new();
    for src in good {
        let copied = t.block_on(copy_step(
            &src.store,
            &*bad.store,
            t.job(),
            step,
            rank,
            CopyOptions::default(),
            &|_| {},
        ));
        match copied {
            Ok(_) => return Ok(()),
            Err(e) => errors.push(format!("from {}: {e}", src.name)),
        }
    }
    Err(errors.join("; "))
}

fn short(id: &str) -> &str {
    id.get(..16).unwrap_or(id)
}

fn print(r: &Report) {
    say!(
        "job {}: verified step{} {} in {}",
        r.job,
        if r.steps.len() == 1 { "" } else { "s" },
        r.steps
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        r.tiers.join(", ")
    );
    for p in &r.problems {
        let users: Vec<String> = p
            .entries
            .iter()
            .map(|u| format!("{} (step {} rank {})", u.entry, u.step, u.rank))
            .collect();
        let good = if p.good_copies.is_empty() {
            "no good copy in any other tier".to_string()
        } else {
            format!("good copy in {}", p.good_copies.join(", "))
        };
        say!(
            "{:<10} {} {} in {}",
            p.state.to_uppercase(),
            p.object,
            short(&p.id),
            p.tier
        );
        say!("           {}", p.error);
        if !users.is_empty() {
            say!("           used by {}", users.join(", "));
        }
        say!("           {good}");
        if p.repaired {
            say!(
                "           REPAIRED: rewrote {} {} in {} from {}",
                p.object,
                short(&p.id),
                p.tier,
                p.good_copies.first().map_or("?", |s| s.as_str())
            );
        }
    }
    for u in &r.unreadable_tiers {
        say!("UNREADABLE tier {u}: nothing in it was verified");
    }
    for x in &r.retiring {
        say!(
            "RETIRING  {x}: retention is removing it (not damage; the next retention finishes it)"
        );
    }
    let count = |s: &str| r.problems.iter().filter(|p| p.state == s).count();
    say!(
        "{} manifests, {} chunks ({}) verified good; {} damaged, {} missing, {} unreadable{}",
        r.manifests_verified,
        r.chunks_verified,
        human(r.bytes_verified),
        count("damaged"),
        count("missing"),
        count("unreadable"),
        if r.repaired > 0 {
            format!(", {} repaired", r.repaired)
        } else {
            String::new()
        }
    );
}

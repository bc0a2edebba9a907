//! `strata rm`: deletes steps from the tiers, as a retirement (every
//! rank's shard: its retiring marker, its commit record, its manifest), so
//! an interrupted `rm` never leaves a step some rank could roll forward;
//! running it again finishes it. L3 and the peers go first, L1 last. Their
//! chunks are freed by the next collection (`strata gc`, or a save's).

use std::collections::BTreeSet;

use clap::Args;
use strata::tiers::Tier;

use crate::out::say;
use crate::store_args::{select, StoreArgs};
use crate::table::Table;
use crate::CliError;

/// `strata rm STEP...`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  strata rm 1300 1400 --config strata.toml\n  strata rm 1300 --tier l3\n\nRun it while the job is stopped, on every node (each node's L1 is reached only there; a running job rolls back with Checkpointer.delete, or load(step, discard_newer=True)). A pinned step is refused until it is unpinned. The steps' chunks are freed by the next strata gc."
)]
pub(crate) struct RmArgs {
    /// The steps.
    #[arg(required = true)]
    pub(crate) steps: Vec<u64>,
    /// Only this tier (l1, l2, l3, a peer's name; repeatable; default: every tier).
    #[arg(long)]
    pub(crate) tier: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

/// The steps of one tier to retire, each with the ranks it holds.
type Held = Vec<(u64, BTreeSet<u32>)>;

pub(crate) fn run(a: &RmArgs) -> Result<(), CliError> {
    let t = a.store.open()?;
    let tiers = select(&t, &a.tier)?;
    let wanted: BTreeSet<u64> = a.steps.iter().copied().collect();
    // Everything is listed, and pins checked, before anything is deleted.
    let mut plan: Vec<(&Tier, Held)> = Vec::new();
    for tier in tiers.iter().rev() {
        let steps = t
            .block_on(tier.store.list_steps(t.job()))
            .map_err(|e| CliError::Store(format!("{}: {e} (nothing was deleted)", tier.name)))?;
        let held: Held = steps
            .iter()
            .filter(|st| wanted.contains(&st.step))
            .map(|st| (st.step, st.ranks_held()))
            .filter(|(_, ranks)| !ranks.is_empty())
            .collect();
        if held.is_empty() {
            continue;
        }
        let pins = t
            .block_on(tier.store.list_pins(t.job()))
            .map_err(|e| CliError::Store(format!("{}: {e} (nothing was deleted)", tier.name)))?;
        if let Some((p, _)) = held.iter().find(|(s, _)| pins.contains(s)) {
            return Err(CliError::Arg(format!(
                "step {p} is pinned in {} (strata unpin {p} first); nothing was deleted",
                tier.name
            )));
        }
        plan.push((tier, held));
    }
    let found: BTreeSet<u64> = plan
        .iter()
        .flat_map(|(_, h)| h.iter().map(|(s, _)| *s))
        .collect();
    if found.is_empty() {
        return Err(CliError::NotFound(format!(
            "no tier holds step{} {} of job {}",
            if wanted.len() == 1 { "" } else { "s" },
            wanted
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            t.job()
        )));
    }
    let mut table = Table::new(
        ["tier", "step", "shards retired"]
            .map(String::from)
            .to_vec(),
    );
    let mut failed = Vec::new();
    for (tier, held) in &plan {
        for (step, ranks) in held {
            let mut done = 0;
            for &rank in ranks {
                match t.block_on(tier.store.delete_shard(t.job(), *step, rank)) {
                    Ok(()) => done += 1,
                    Err(e) => failed.push(format!("{} step {step} rank {rank}: {e}", tier.name)),
                }
            }
            table.row(vec![tier.name.clone(), step.to_string(), done.to_string()]);
        }
    }
    table.print();
    let missing: Vec<String> = wanted.difference(&found).map(u64::to_string).collect();
    if !missing.is_empty() {
        say!("not held by any tier: {}", missing.join(", "));
    }
    if failed.is_empty() {
        say!("their chunks are freed by the next strata gc");
        Ok(())
    } else {
        Err(CliError::Store(format!(
            "{} (run strata rm again to finish)",
            failed.join("; ")
        )))
    }
}

//! The commit and restore protocol at 1,024 simulated ranks over etcd
//! (128 nodes of 8; 256 with the in-process coordinator, which sees a
//! dead rank only at its timeout) with seeded faults: a node dying before its vote, after its vote,
//! and inside a restore's agreement, a slow node, and (over etcd) etcd
//! restarting. Every step commits or fails on every rank alike, and every
//! restore picks the same step everywhere, the newest decided one, with
//! every rank's bytes intact (`strata_sim::run` checks each phase).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_sim::faults::Fault;
use strata_sim::{run, Coord, Plan};
use strata_testkit::etcd::Etcd;

fn ranks(default: u32) -> u32 {
    std::env::var("STRATA_SIM_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("STRATA_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(11)
}

#[test]
fn in_process_ranks_with_seeded_faults_never_split() {
    let plan = Plan {
        ranks: ranks(256),
        per_node: 8,
        steps: 8,
        seed: seed(),
        faults: 4,
        // A dead rank is seen only at the timeout in process: each death
        // costs it.
        timeout_secs: 10,
        ..Plan::default()
    };
    let r = run(&plan, Coord::InProcess).unwrap_or_else(|e| panic!("seed {}: {e}", plan.seed));
    eprintln!("{r:?}\n{}", r.line());
    for must in [
        Fault::DiesBeforeVote,
        Fault::DiesAfterVote,
        Fault::DiesInRestore,
    ] {
        assert!(r.faults.iter().any(|f| f.fault == must), "{:?}", r.faults);
    }
    assert_eq!(r.failed_unfaulted, 0, "{r:?}");
    // Every step committed in the end, after the restarts.
    assert!(r.committed >= plan.steps, "{r:?}");
    assert!(r.epochs >= 4, "three deaths, three restarts: {r:?}");
    // L3 is listed once per restore for the whole job (rank 0), not per
    // rank or per node.
    assert!(
        !r.restore_lists.is_empty() && r.restore_lists.iter().all(|&n| n <= 1),
        "L3 listings per restore: {:?}",
        r.restore_lists
    );
}

#[test]
fn etcd_ranks_with_seeded_faults_never_split() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let plan = Plan {
        ranks: ranks(1024),
        per_node: 8,
        steps: 10,
        seed: seed(),
        faults: 6,
        timeout_secs: 30,
        lease_secs: 10,
        ..Plan::default()
    };
    let r =
        run(&plan, Coord::Etcd(&mut etcd)).unwrap_or_else(|e| panic!("seed {}: {e}", plan.seed));
    eprintln!("{r:?}\n{}", r.line());
    assert!(r.committed >= plan.steps, "{r:?}");
    assert!(r.epochs >= 4, "{r:?}");
    assert!(
        !r.restore_lists.is_empty() && r.restore_lists.iter().all(|&n| n <= 1),
        "L3 listings per restore: {:?}",
        r.restore_lists
    );
    // A round costs etcd about two requests per node, not per rank (a
    // waiting node puts its values and watches; the decider's own three),
    // and never more than three per node (a slow rank's round).
    let nodes = f64::from(r.nodes);
    let worst = r.round_requests.iter().copied().fold(0.0, f64::max);
    assert!(
        worst <= 3.0 * nodes + 4.0,
        "{worst} requests in a round of {nodes} nodes"
    );
    let mut sorted = r.round_requests.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    assert!(
        median <= 2.0 * nodes + 4.0,
        "{median} requests in the median round of {nodes} nodes"
    );
    // A restart where every rank holds the newest step (after the last
    // step, at least) agrees in one round, about one request per node:
    // no second round asks whether every rank can use the step.
    let fewest = r
        .restart_restore_requests
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    assert!(
        fewest <= 1.5 * nodes + 4.0,
        "{fewest} requests in a restart's restore of {nodes} nodes: {:?}",
        r.restart_restore_requests
    );
}

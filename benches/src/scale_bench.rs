//! Scale benchmark: the commit and restore protocol at N simulated ranks
//! (`strata-sim`: every rank a real `Checkpointer` on a thread, with an
//! in-memory disk; the ranks of each node sharing one etcd client) against
//! one real etcd started here. Prints each phase, then as its last line
//! `ranks=N nodes=M barrier_commit_median_ms=… barrier_commit_p99_ms=…
//! etcd_requests_per_round=… restore_agreement_ms=… l3_lists_per_restore=…
//! restart_restore_agreement_ms=… restart_restore_requests=…`: the restore
//! figures of every restore, then of a restarted job's (one that committed
//! steps before: the start after the last step, and after each death).
//!
//! `scale-bench --ranks N [--ranks-per-node 8] [--steps 10] [--seed 1]
//!  [--faults 0] [--bytes 4096] [--lease 10] [--in-process] [--no-upload] [--gather]`
//!
//! `--gather` agrees the way Strata did before reducing rounds (every rank
//! reads every value; with etcd it needs `--ranks-per-node 1`), for
//! comparison.

use strata_sim::{run, Coord, Plan};
use strata_testkit::etcd::Etcd;

fn parse<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))?
        .parse()
        .map_err(|_| format!("{flag}: not a number"))
}

fn main() {
    let mut plan = Plan {
        ranks: 1024,
        per_node: 8,
        steps: 10,
        timeout_secs: 120,
        lease_secs: 10,
        verbose: true,
        ..Plan::default()
    };
    let mut in_process = false;
    let mut args = std::env::args().skip(1);
    let parsed: Result<(), String> = (|| {
        while let Some(a) = args.next() {
            match a.as_str() {
                "--ranks" => plan.ranks = parse(&a, args.next())?,
                "--ranks-per-node" => plan.per_node = parse(&a, args.next())?,
                "--steps" => plan.steps = parse(&a, args.next())?,
                "--seed" => plan.seed = parse(&a, args.next())?,
                "--faults" => plan.faults = parse(&a, args.next())?,
                "--bytes" => plan.bytes = parse(&a, args.next())?,
                "--lease" => plan.lease_secs = parse(&a, args.next())?,
                "--in-process" => in_process = true,
                "--no-upload" => plan.upload = false,
                "--gather" => plan.gather = true,
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(())
    })();
    if let Err(e) = parsed {
        eprintln!("scale-bench: {e}\nscale-bench --ranks N [--ranks-per-node 8] [--steps 10] [--seed 1] [--faults 0] [--bytes 4096] [--lease 10] [--in-process] [--no-upload] [--gather]");
        std::process::exit(2);
    }
    println!(
        "scale-bench: {} ranks, {} per node, {} steps of {} bytes per rank, seed {}, {} faults, {}, L3 uploads {}",
        plan.ranks,
        plan.per_node,
        plan.steps,
        plan.bytes,
        plan.seed,
        plan.faults,
        if in_process {
            "in-process coordinator"
        } else {
            "one etcd on this machine"
        },
        if plan.upload { "on" } else { "off" }
    );
    let mut etcd = None;
    let coord = if in_process {
        Coord::InProcess
    } else {
        match Etcd::start() {
            Some(e) => Coord::Etcd(etcd.insert(e)),
            None => {
                eprintln!("scale-bench: no etcd binary (apt-get install etcd-server)");
                std::process::exit(1);
            }
        }
    };
    match run(&plan, coord) {
        Ok(r) => {
            println!(
                "steps committed {} failed {} (starts of the job {}); keep-alives {:.2} requests per node per second; etcd answers per step {:.2} MB (median); whole save phase {:.0} ms, whole restore phase {:.0} ms (medians)",
                r.committed,
                r.failed,
                r.epochs,
                r.keepalives_per_node_s,
                strata_sim::report::quantile(&r.round_bytes, 0.5) / 1e6,
                strata_sim::report::quantile(&r.save_phase_ms, 0.5),
                strata_sim::report::quantile(&r.restore_phase_ms, 0.5),
            );
            println!("{}", r.line());
        }
        Err(e) => {
            eprintln!("scale-bench: {e}");
            std::process::exit(1);
        }
    }
}

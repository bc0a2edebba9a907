//! `strata demo --nodes N --ranks-per-node M`: the demo as a cluster of
//! processes ([`strata_cli::cluster`]): N nodes (network namespaces where
//! this machine allows, else loopback addresses), each with its own peer
//! service and L1 directory, M `strata rank` processes per node agreeing
//! through etcd, an S3 server for L3. It saves the steps, prints per-rank
//! and per-node figures, then loses the last node (its processes killed,
//! its disk wiped) and brings a replacement up that restores its ranks'
//! shards from its peers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use strata_cli::cluster::{Cluster, Isolation, RankProc, Spec};

use crate::out::say;
use crate::size::human;
use crate::CliError;

/// What the cluster demo runs.
pub(crate) struct ClusterDemo {
    pub(crate) nodes: usize,
    pub(crate) ranks_per_node: usize,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) steps: u64,
    pub(crate) state_size: u64,
    pub(crate) upload_every: u64,
}

fn arg_err(e: impl std::fmt::Display) -> CliError {
    CliError::Arg(e.to_string())
}

/// Runs ranks to the end; fails with the first rank's error.
fn finish(ranks: &mut [RankProc], what: &str) -> Result<(), CliError> {
    for r in ranks.iter_mut() {
        match r.wait(Duration::from_secs(3600)) {
            Some(true) => {}
            _ => {
                let err = r
                    .events()
                    .iter()
                    .rev()
                    .find_map(|e| e["error"].as_str().map(String::from))
                    .unwrap_or_else(|| "no output (see its log under the demo directory)".into());
                return Err(CliError::Store(format!(
                    "{what}: rank {} failed: {err}",
                    r.rank
                )));
            }
        }
    }
    Ok(())
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn field(events: &[Value], kind: &str, name: &str) -> Vec<f64> {
    events
        .iter()
        .filter(|e| e["event"] == kind)
        .filter_map(|e| e[name].as_f64())
        .collect()
}

pub(crate) fn run(d: &ClusterDemo) -> Result<(), CliError> {
    if d.nodes < 2 || d.ranks_per_node == 0 {
        return Err(CliError::Arg(
            "--nodes needs at least 2 nodes (one is lost and restored from the others) and --ranks-per-node at least 1".into(),
        ));
    }
    let strata = std::env::current_exe().map_err(arg_err)?;
    let dir = d.dir.join("cluster");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| arg_err(format!("{}: {e}", dir.display())))?;
    }
    let spec = Spec {
        nodes: d.nodes,
        ranks_per_node: d.ranks_per_node,
        job: "demo".into(),
        dir: dir.clone(),
        strata,
        replicas: 1,
        upload_every: d.upload_every,
        lease_secs: 3,
        chunk_size: 4 << 20,
        keep_last: 2,
        force_loopback: false,
        node_link: true,
    };
    let t0 = Instant::now();
    let mut c = Cluster::start(spec).map_err(CliError::Store)?;
    let world = d.nodes * d.ranks_per_node;
    match &c.fabric.isolation {
        Isolation::Namespaces => say!(
            "cluster: {} nodes in network namespaces ({}), {} ranks each, etcd and S3 (s3s-fs) on the bridge; started in {:.1} s",
            d.nodes,
            c.nodes.iter().map(|n| n.addr.to_string()).collect::<Vec<_>>().join(", "),
            d.ranks_per_node,
            t0.elapsed().as_secs_f64()
        ),
        Isolation::Loopback(why) => say!(
            "cluster: {} nodes on loopback addresses (network namespaces unavailable: {why}), {} ranks each",
            d.nodes,
            d.ranks_per_node
        ),
    }
    say!(
        "{world} rank processes, {} of state each (half weights shared by every rank, half its own), {} steps",
        human(d.state_size),
        d.steps
    );
    let size = format!("{}", d.state_size);
    let all: Vec<usize> = (0..d.nodes).collect();
    let t = Instant::now();
    let mut ranks = c
        .spawn_ranks(
            &all,
            &[
                "--steps".into(),
                d.steps.to_string(),
                "--state-size".into(),
                size.clone(),
            ],
        )
        .map_err(CliError::Store)?;
    finish(&mut ranks, "saving")?;
    let took = t.elapsed();
    say!("\n  rank  node     stall ms  durable ms  barrier ms  commit ms   written   deduped");
    let mut per_node: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for r in &ranks {
        let ev = r.events();
        let (w, dd) = (
            field(&ev, "saved", "written"),
            field(&ev, "saved", "deduped"),
        );
        let e = per_node.entry(r.node).or_default();
        e.0 += w.iter().sum::<f64>();
        e.1 += dd.iter().sum::<f64>();
        say!(
            "  {:>4}  {:<7} {:>9.1} {:>11.1} {:>11.1} {:>10.2} {:>9} {:>9}",
            r.rank,
            c.nodes[r.node].name,
            mean(&field(&ev, "saved", "stall_ms")),
            mean(&field(&ev, "saved", "durable_ms")),
            mean(&field(&ev, "saved", "barrier_ms")),
            mean(&field(&ev, "saved", "commit_ms")),
            human(w.iter().sum::<f64>() as u64),
            human(dd.iter().sum::<f64>() as u64),
        );
    }
    say!("  (means per step; written and deduped: chunk bytes to the node's L1 over the run)");
    say!("\n  node     ranks  L1 written  deduplicated");
    for (i, (w, dd)) in &per_node {
        say!(
            "  {:<7} {:>6} {:>11} {:>13}",
            c.nodes[*i].name,
            d.ranks_per_node,
            human(*w as u64),
            human(*dd as u64)
        );
    }
    say!(
        "all {world} ranks saved {} steps in {:.1} s (replicated and uploaded before exiting)",
        d.steps,
        took.as_secs_f64()
    );

    // Lose the last node: its peer service killed, its disk wiped; a
    // replacement comes up empty and every rank resumes.
    let lost = d.nodes - 1;
    c.kill_peer(lost);
    c.wipe(lost).map_err(CliError::Store)?;
    say!(
        "\nlost {}: peer service killed, L1 and spill wiped; a replacement starts empty",
        c.nodes[lost].name
    );
    let t = Instant::now();
    c.start_peer(lost).map_err(CliError::Store)?;
    let mut again = c
        .spawn_ranks(
            &all,
            &[
                "--resume".into(),
                "--steps".into(),
                "1".into(),
                "--state-size".into(),
                size,
            ],
        )
        .map_err(CliError::Store)?;
    finish(&mut again, "resuming")?;
    for r in again.iter().filter(|r| r.node == lost) {
        let ev = r.events();
        if let Some(res) = ev.iter().find(|e| e["event"] == "resumed") {
            say!(
                "  rank {} on the replacement: step {} restored and verified in {:.0} ms ({} from peers, {} from L3), {:.1} s after its process started",
                r.rank,
                res["step"],
                res["ms"].as_f64().unwrap_or(0.0),
                human(res["from_l2"].as_u64().unwrap_or(0)),
                human(res["from_l3"].as_u64().unwrap_or(0)),
                res["since_start_ms"].as_f64().unwrap_or(0.0) / 1e3
            );
        }
    }
    say!(
        "the replacement node was training again (every rank resumed and saved the next step) {:.1} s after it came up",
        t.elapsed().as_secs_f64()
    );
    say!("logs and data: {}", dir.display());
    Ok(())
}

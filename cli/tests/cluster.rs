//! Ranks as processes on several nodes (network namespaces where this
//! machine allows, else loopback addresses), agreeing through a real etcd,
//! replicating to each other's peer services and uploading to a real S3
//! server: every step restores byte-identical on every rank; a node killed
//! mid-save leaves that step committed nowhere and the survivors see it
//! within the lease; a replacement node with an empty disk restores from
//! its peers, and with the peers gone too, from L3.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::Value;
use strata_cli::cluster::{find_bin, Cluster, Isolation, RankProc, Spec};
use strata_tiered::{ChunkStore, EngineChoice, L1Store};

const JOB: &str = "cluster";

/// A cluster of `nodes` × `ranks` under `dir`, or None (skipped) without
/// etcd or s3s-fs, unless the test command requires them.
fn cluster(dir: &std::path::Path, nodes: usize, ranks: usize) -> Option<Cluster> {
    for bin in ["etcd", "s3s-fs"] {
        if find_bin(bin).is_none() {
            let required = std::env::var("STRATA_REQUIRE_ETCD").as_deref() == Ok("1")
                || std::env::var("STRATA_REQUIRE_SERVERS").as_deref() == Ok("1");
            assert!(!required, "{bin} is required by the test command");
            eprintln!("SKIPPED: {bin} not found");
            return None;
        }
    }
    let c = Cluster::start(Spec {
        nodes,
        ranks_per_node: ranks,
        job: JOB.into(),
        dir: dir.to_path_buf(),
        strata: env!("CARGO_BIN_EXE_strata").into(),
        replicas: 1,
        upload_every: 1,
        lease_secs: 2,
        chunk_size: 1 << 20,
        keep_last: 2,
        force_loopback: false,
    })
    .unwrap();
    match &c.fabric.isolation {
        Isolation::Namespaces => eprintln!("nodes in network namespaces"),
        Isolation::Loopback(why) => {
            assert!(
                std::env::var("STRATA_REQUIRE_NETNS").as_deref() != Ok("1"),
                "STRATA_REQUIRE_NETNS=1 but namespaces could not be made: {why}"
            );
            eprintln!("nodes on loopback addresses (no namespaces: {why})");
        }
    }
    Some(c)
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Waits for every rank to exit; returns their exit successes.
fn wait_all(ranks: &mut [RankProc], timeout: Duration) -> Vec<bool> {
    ranks
        .iter_mut()
        .map(|r| {
            r.wait(timeout)
                .unwrap_or_else(|| panic!("rank {} still running: {:?}", r.rank, r.events()))
        })
        .collect()
}

fn of<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == kind).collect()
}

#[test]
fn three_nodes_of_two_ranks_save_twenty_steps_that_restore_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let Some(c) = cluster(dir.path(), 3, 2) else {
        return;
    };
    let t = Instant::now();
    let mut ranks = c
        .spawn_ranks(
            &[0, 1, 2],
            &args(&["--steps", "20", "--state-size", "2MiB", "--verify"]),
        )
        .unwrap();
    let ok = wait_all(&mut ranks, Duration::from_secs(600));
    for (r, ok) in ranks.iter().zip(&ok) {
        let ev = r.events();
        assert!(ok, "rank {} failed: {ev:?}", r.rank);
        assert_eq!(of(&ev, "saved").len(), 20, "rank {}", r.rank);
        let verified = of(&ev, "verified");
        assert_eq!(verified.len(), 20, "rank {}", r.rank);
        assert!(verified.iter().all(|v| v["ok"] == true));
        // Old steps (retired from L1 and the peers) came from L3.
        assert!(
            verified.iter().any(|v| v["from_l3"].as_u64() > Some(0)),
            "{verified:?}"
        );
    }
    eprintln!("6 ranks, 20 steps, verified in {:?}", t.elapsed());
}

/// The steps committed by `rank` on node `i`'s L1.
fn committed_on_l1(c: &Cluster, i: usize, rank: u32) -> Vec<u64> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l1 = L1Store::open(&c.nodes[i].l1, EngineChoice::Psync).unwrap();
    rt.block_on(l1.list_steps(JOB))
        .unwrap()
        .into_iter()
        .filter(|s| s.committed_ranks().contains(&rank))
        .map(|s| s.step)
        .collect()
}

#[test]
fn a_node_killed_mid_save_then_replaced_restores_from_peers_then_from_l3() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut c) = cluster(dir.path(), 3, 2) else {
        return;
    };
    let common = ["--state-size", "2MiB"];
    // Steps 1-3 everywhere.
    let mut first = c
        .spawn_ranks(
            &[0, 1, 2],
            &args(&[&["--steps", "3"][..], &common].concat()),
        )
        .unwrap();
    assert!(wait_all(&mut first, Duration::from_secs(300))
        .iter()
        .all(|&ok| ok));

    // Steps 4 and 5: node 2's ranks hold back before step 5 and are killed
    // (with node 2's peer service) while the others wait for them.
    let run = args(&[&["--resume", "--steps", "3"][..], &common].concat());
    let mut ranks = c.spawn_ranks(&[0, 1], &run).unwrap();
    let mut held = c
        .spawn_ranks(
            &[2],
            &args(
                &[
                    &run.iter().map(String::as_str).collect::<Vec<_>>()[..],
                    &["--pause-before", "5:600"],
                ]
                .concat(),
            ),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ranks
        .iter()
        .chain(&held)
        .all(|r| of(&r.events(), "saved").iter().any(|e| e["step"] == 4))
    {
        assert!(Instant::now() < deadline, "step 4 never saved");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500)); // the others are at step 5's barrier
    for r in &mut held {
        r.proc.kill();
    }
    c.kill_peer(2);
    let killed = Instant::now();
    let ok = wait_all(&mut ranks, Duration::from_secs(60));
    assert!(
        ok.iter().all(|&ok| !ok),
        "the survivors' save of step 5 fails"
    );
    for r in &ranks {
        let ev = r.events();
        let failed = of(&ev, "failed");
        assert_eq!(failed.len(), 1, "{ev:?}");
        assert_eq!(failed[0]["step"], 5);
        let msg = failed[0]["error"].as_str().unwrap_or("");
        assert!(msg.contains("left"), "names the dead ranks: {msg}");
    }
    // Seen within the 2 s lease (plus a keep-alive period), not the 120 s
    // coordination timeout.
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "{:?}",
        killed.elapsed()
    );
    // Step 5 is committed nowhere; step 4 is, on every surviving rank.
    for i in [0, 1] {
        for local in 0..2 {
            let rank = c.rank_of(i, local);
            let steps = committed_on_l1(&c, i, rank);
            assert!(
                steps.contains(&4) && !steps.contains(&5),
                "rank {rank}: {steps:?}"
            );
        }
    }

    // A replacement node-2 with an empty disk: its ranks restore step 4
    // from their peers, every rank resumes, step 5 commits.
    c.wipe(2).unwrap();
    c.start_peer(2).unwrap();
    let mut again = c
        .spawn_ranks(
            &[0, 1, 2],
            &args(&[&["--resume", "--steps", "1"][..], &common].concat()),
        )
        .unwrap();
    let ok = wait_all(&mut again, Duration::from_secs(300));
    for (r, ok) in again.iter().zip(ok) {
        let ev = r.events();
        assert!(ok, "rank {}: {ev:?}", r.rank);
        let resumed = of(&ev, "resumed");
        assert_eq!(resumed[0]["step"], 4, "{ev:?}");
        assert_eq!(resumed[0]["ok"], true);
        if r.node == 2 {
            assert!(
                resumed[0]["from_l2"].as_u64() > Some(0),
                "from a peer: {ev:?}"
            );
        }
        assert!(of(&ev, "saved").iter().any(|e| e["step"] == 5));
    }

    // Every node's disk and every peer lost: the ranks restore from L3.
    for i in 0..3 {
        c.kill_peer(i);
        c.wipe(i).unwrap();
        c.start_peer(i).unwrap();
    }
    let mut last = c
        .spawn_ranks(
            &[0, 1, 2],
            &args(&[&["--resume", "--steps", "1"][..], &common].concat()),
        )
        .unwrap();
    let ok = wait_all(&mut last, Duration::from_secs(300));
    for (r, ok) in last.iter().zip(ok) {
        let ev = r.events();
        assert!(ok, "rank {}: {ev:?}", r.rank);
        let resumed = of(&ev, "resumed");
        assert_eq!(resumed[0]["step"], 5, "{ev:?}");
        assert!(resumed[0]["from_l3"].as_u64() > Some(0), "from L3: {ev:?}");
    }
}

#[test]
fn two_processes_claiming_one_rank_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let Some(c) = cluster(dir.path(), 1, 2) else {
        return;
    };
    // Node 0's ranks 0 and 1, and a second rank 1 (same node, same disk).
    // The holders save two steps, then wait before the third (alive).
    let mut ranks = c
        .spawn_ranks(
            &[0],
            &args(&[
                "--steps",
                "3",
                "--state-size",
                "1MiB",
                "--pause-before",
                "3:12",
            ]),
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let mut twin = c
        .spawn_ranks(&[0], &args(&["--steps", "1", "--state-size", "1MiB"]))
        .unwrap();
    let ok = wait_all(&mut twin, Duration::from_secs(60));
    assert!(ok.iter().all(|&ok| !ok), "the second claims fail");
    for r in &twin {
        let ev = r.events();
        let err = of(&ev, "error");
        assert!(
            err.first()
                .and_then(|e| e["error"].as_str())
                .is_some_and(|m| m.contains("claimed twice")),
            "{ev:?}"
        );
        assert!(
            of(&ev, "saved").is_empty(),
            "the twin saved nothing: {ev:?}"
        );
    }
    // The holders learn of it at their next keep-alive and stop saving.
    let ok = wait_all(&mut ranks, Duration::from_secs(120));
    assert!(ok.iter().all(|&ok| !ok), "the holders fail too");
    for r in &ranks {
        let ev = r.events();
        let failed = of(&ev, "failed");
        assert!(
            failed
                .first()
                .and_then(|e| e["error"].as_str())
                .is_some_and(|m| m.contains("claimed twice")),
            "{ev:?}"
        );
        assert_eq!(failed[0]["kind"], "Conflict");
        assert_eq!(failed[0]["step"], 3, "{ev:?}");
    }
}

#[test]
fn the_cluster_demo_runs_loses_a_node_and_restores_it_from_peers() {
    if find_bin("etcd").is_none() || find_bin("s3s-fs").is_none() {
        assert!(
            std::env::var("STRATA_REQUIRE_ETCD").as_deref() != Ok("1"),
            "etcd and s3s-fs are required by the test command"
        );
        eprintln!("SKIPPED: etcd or s3s-fs not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "demo",
            "--nodes",
            "2",
            "--ranks-per-node",
            "2",
            "--steps",
            "2",
        ])
        .args(["--state-size", "4MiB", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("4 rank processes"), "{text}");
    assert!(text.contains("all 4 ranks saved 2 steps"), "{text}");
    assert!(text.contains("lost node-1"), "{text}");
    // Both of the lost node's ranks restored from a peer, none from L3.
    let restored: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("on the replacement"))
        .collect();
    assert_eq!(restored.len(), 2, "{text}");
    assert!(
        restored
            .iter()
            .all(|l| l.contains("4.00 MiB from peers, 0 B from L3")),
        "{text}"
    );
}

#[test]
fn a_link_cut_during_a_save_commits_nothing_and_the_next_step_commits_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let Some(c) = cluster(dir.path(), 3, 1) else {
        return;
    };
    if c.fabric.isolation != Isolation::Namespaces {
        eprintln!("SKIPPED: links can only be cut between network namespaces");
        return;
    }
    let common = ["--state-size", "2MiB"];
    let mut first = c
        .spawn_ranks(
            &[0, 1, 2],
            &args(&[&["--steps", "4"][..], &common].concat()),
        )
        .unwrap();
    assert!(wait_all(&mut first, Duration::from_secs(300))
        .iter()
        .all(|&ok| ok));
    // Step 5: node 2 holds back 4 s; its link is cut meanwhile.
    let run = args(&[&["--resume", "--steps", "1"][..], &common].concat());
    let mut ranks = c.spawn_ranks(&[0, 1], &run).unwrap();
    let held_args: Vec<String> = run
        .iter()
        .cloned()
        .chain(args(&["--pause-before", "5:4"]))
        .collect();
    let mut held = c.spawn_ranks(&[2], &held_args).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ranks
        .iter()
        .chain(&held)
        .all(|r| !of(&r.events(), "resumed").is_empty())
    {
        assert!(Instant::now() < deadline, "never resumed");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.fabric.link(2, false).unwrap();
    let ok = wait_all(&mut ranks, Duration::from_secs(60));
    let ok_held = wait_all(&mut held, Duration::from_secs(60));
    c.fabric.link(2, true).unwrap();
    assert!(
        ok.iter().chain(&ok_held).all(|&ok| !ok),
        "every rank's save of step 5 fails"
    );
    for r in ranks.iter().chain(&held) {
        let ev = r.events();
        let failed = of(&ev, "failed");
        assert_eq!(
            failed.first().map(|f| f["step"].clone()),
            Some(5.into()),
            "{ev:?}"
        );
    }
    for i in 0..3 {
        let steps = committed_on_l1(&c, i, c.rank_of(i, 0));
        assert!(
            steps.contains(&4) && !steps.contains(&5),
            "node {i}: {steps:?}"
        );
    }
    // The link is back: the next attempt commits step 5 everywhere. (The
    // cut-off ranks' claims expire with their leases first: on a loaded
    // machine etcd can take a few lease periods, and a new rank that finds
    // its claim still held fails, leaving the others to their timeout.)
    std::thread::sleep(Duration::from_secs(6));
    let mut again = c.spawn_ranks(&[0, 1, 2], &run).unwrap();
    let ok = wait_all(&mut again, Duration::from_secs(300));
    for (r, ok) in again.iter().zip(ok) {
        assert!(ok, "rank {}: {:?}", r.rank, r.events());
    }
    for r in &again {
        let ev = r.events();
        assert!(of(&ev, "saved").iter().any(|e| e["step"] == 5), "{ev:?}");
    }
}

#[test]
fn a_delay_is_set_where_the_kernel_has_netem_and_refused_clearly_elsewhere() {
    let f = strata_cli::cluster::Fabric::new(2, false);
    if f.isolation != Isolation::Namespaces {
        eprintln!("SKIPPED: delays need network namespaces");
        return;
    }
    match f.delay(0, Duration::from_millis(20)) {
        Ok(()) => f.delay(0, Duration::ZERO).unwrap(),
        Err(e) => assert!(e.contains("netem"), "{e}"),
    }
    // Loopback fabrics cannot delay or cut links at all.
    let lo = strata_cli::cluster::Fabric::new(1, true);
    assert!(lo.delay(0, Duration::from_millis(1)).is_err());
    assert!(lo.link(0, false).is_err());
}

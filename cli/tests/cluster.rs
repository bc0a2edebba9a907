//! Ranks as processes on several nodes (network namespaces where this
//! machine allows, else loopback addresses), agreeing through a real etcd,
//! replicating to each other's peer services and uploading to a real S3
//! server: every step restores byte-identical on every rank; a node killed
//! inside a save (its votes cast, waiting at the barrier for the others)
//! leaves that step committed nowhere once its leases lapsed, and the
//! survivors fail that step at once naming it; a replacement node with an
//! empty disk restores from its peers, and with the peers gone too, from
//! L3. Every wait is on an event (a rank's output, a key in etcd), never a
//! guessed sleep.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::Value;
use strata_cli::cluster::{find_bin, Cluster, Isolation, RankProc, Spec};
use strata_tiered::{ChunkStore, EngineChoice, L1Store};

const JOB: &str = "cluster";

/// A cluster of `nodes` × `ranks` under `dir`, or None (skipped) without
/// etcd or s3s-fs, unless the test command requires them.
fn cluster(dir: &std::path::Path, nodes: usize, ranks: usize) -> Option<Cluster> {
    cluster_with(dir, nodes, ranks, false)
}

/// [`cluster`], its ranks started as torchrun starts them when
/// `node_link` (a node's rank processes meet on the node link).
fn cluster_with(
    dir: &std::path::Path,
    nodes: usize,
    ranks: usize,
    node_link: bool,
) -> Option<Cluster> {
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
        node_link,
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

/// Waits for every rank to exit; returns their exit successes. A rank
/// still running at the timeout fails the test with every rank's events
/// and log (what it waited on is in one of them).
fn wait_all(c: &Cluster, ranks: &mut [RankProc], timeout: Duration) -> Vec<bool> {
    let mut out = Vec::new();
    for i in 0..ranks.len() {
        match ranks[i].wait(timeout) {
            Some(ok) => out.push(ok),
            None => {
                let all: Vec<String> = ranks
                    .iter()
                    .map(|r| {
                        format!(
                            "rank {}: {:?}\n{}",
                            r.rank,
                            r.events(),
                            c.rank_log(r.node, r.rank)
                        )
                    })
                    .collect();
                panic!(
                    "rank {} still running after {timeout:?}\n{}",
                    ranks[i].rank,
                    all.join("\n")
                );
            }
        }
    }
    out
}

fn of<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == kind).collect()
}

/// The keys and values under `prefix` in the cluster's etcd (through its
/// JSON gateway).
fn etcd_range(c: &Cluster, prefix: &str) -> Vec<(String, String)> {
    use base64::Engine as _;
    use std::io::{Read, Write};
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let body =
        serde_json::json!({ "key": b64.encode(prefix), "range_end": b64.encode(&end) }).to_string();
    let host = c.etcd_url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "POST /v3/kv/range HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let json = out.split("\r\n\r\n").nth(1).unwrap_or_default();
    // A chunked answer: the JSON object is the one line that starts with '{'.
    let line = json.lines().find(|l| l.starts_with('{')).unwrap_or(json);
    let v: Value = serde_json::from_str(line).unwrap();
    let text = |x: &Value| {
        String::from_utf8_lossy(&b64.decode(x.as_str().unwrap_or_default()).unwrap()).into_owned()
    };
    v["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| (text(&kv["key"]), text(&kv["value"])))
                .collect()
        })
        .unwrap_or_default()
}

/// The ranks whose vote on `step`'s commit barrier is in etcd now (each
/// process puts its ranks' votes under its first rank; rank 0's process
/// decides and puts none).
fn voted(c: &Cluster, step: u64) -> Vec<u32> {
    let round = format!("commit%2F{JOB}%2F{step}@");
    etcd_range(c, &format!("/strata/{JOB}/decide/"))
        .into_iter()
        .filter_map(|(k, _)| {
            let rest = &k[k.find(&round)? + round.len()..];
            let mut parts = rest.split('/').skip(1);
            if parts.next()? != "v" {
                return None;
            }
            parts.next()?.parse().ok()
        })
        .collect()
}

/// Rank claims in etcd held by a live process (not marked exited).
fn live_claims(c: &Cluster) -> Vec<u32> {
    etcd_range(c, &format!("/strata/{JOB}/ranks/"))
        .into_iter()
        .filter(|(_, v)| !v.split_whitespace().any(|w| w == "exited"))
        .filter_map(|(k, _)| k.rsplit('/').next()?.parse().ok())
        .collect()
}

/// Polls `cond` every 50 ms until it holds; panics with `what` after
/// `limit`.
fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} (after {limit:?})");
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let ok = wait_all(&c, &mut ranks, Duration::from_secs(600));
    if ok.contains(&false) {
        for r in &ranks {
            eprintln!("rank {} logged:\n{}", r.rank, c.rank_log(r.node, r.rank));
        }
    }
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
    assert!(wait_all(&c, &mut first, Duration::from_secs(300))
        .iter()
        .all(|&ok| ok));

    // Steps 4 and 5. Nodes 0 and 1 save step 4, then hold before step 5
    // (until a gate file exists). Node 2's ranks go on into their save of
    // step 5: they write it, cast their votes and wait at its barrier for
    // the others, and are killed there (with node 2's peer service),
    // inside the save.
    let gate = dir.path().join("gate-step-5");
    let run = args(&[&["--resume", "--steps", "3"][..], &common].concat());
    let gated: Vec<String> = run
        .iter()
        .cloned()
        .chain(args(&["--hold-before", &format!("5:{}", gate.display())]))
        .collect();
    let mut ranks = c.spawn_ranks(&[0, 1], &gated).unwrap();
    // Node 2's ranks wait for step 4's push to the peers before they go on
    // to step 5 (`--wait-tiers`): its replacement restores step 4 from
    // them. Without it, a kill before the push ended left step 4 on no
    // tier for node 2's ranks (seen once in a CI run: every rank resumed
    // step 3, and the survivors refused to save their committed step 4
    // again).
    let node2_run: Vec<String> = run.iter().cloned().chain(args(&["--wait-tiers"])).collect();
    let mut held = c.spawn_ranks(&[2], &node2_run).unwrap();
    let node2: Vec<u32> = (0..2).map(|l| c.rank_of(2, l)).collect();
    until(
        Duration::from_secs(120),
        "node 2's ranks never voted on step 5",
        || {
            let v = voted(&c, 5);
            node2.iter().all(|r| v.contains(r))
        },
    );
    for r in &mut held {
        // Still inside the save: not exited, step 5 not saved.
        assert!(r.proc.0.try_wait().unwrap().is_none(), "rank {}", r.rank);
        let ev = r.events();
        assert!(
            of(&ev, "saved").iter().any(|e| e["step"] == 4)
                && !of(&ev, "saved").iter().any(|e| e["step"] == 5),
            "{ev:?}"
        );
        r.proc.kill();
    }
    c.kill_peer(2);
    let killed = Instant::now();
    // Their claims lapse with their 2 s leases (plus keep-alive periods),
    // not the 120 s coordination timeout: their votes stop counting.
    until(
        Duration::from_secs(15),
        "the killed ranks' claims never lapsed",
        || {
            let live = live_claims(&c);
            node2.iter().all(|r| !live.contains(r))
        },
    );
    eprintln!(
        "node 2's claims lapsed {:?} after the kill",
        killed.elapsed()
    );
    // The survivors go on to step 5: it fails at once, naming the ranks
    // that left (seen in earlier rounds, gone now).
    std::fs::write(&gate, b"").unwrap();
    let released = Instant::now();
    let ok = wait_all(&c, &mut ranks, Duration::from_secs(60));
    assert!(
        ok.iter().all(|&ok| !ok),
        "the survivors' save of step 5 fails"
    );
    let survivors: Vec<u32> = ranks.iter().map(|r| r.rank).collect();
    let mut naming_node2 = 0;
    for r in &ranks {
        let ev = r.events();
        let failed = of(&ev, "failed");
        assert_eq!(failed.len(), 1, "{ev:?}");
        assert_eq!(failed[0]["step"], 5);
        let msg = failed[0]["error"].as_str().unwrap_or("");
        assert!(msg.contains("left"), "names the dead ranks: {msg}");
        // The ranks named as gone: node 2's; a survivor that fails last
        // may instead name the survivors that already failed and ended
        // (their votes went with them), never a rank still there.
        let named: Vec<u32> = msg
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list.split(", ").filter_map(|r| r.parse().ok()).collect())
            .unwrap_or_default();
        assert!(!named.is_empty(), "{msg}");
        assert!(
            named
                .iter()
                .all(|n| node2.contains(n) || (survivors.contains(n) && *n != r.rank)),
            "names only ranks that left: {msg}"
        );
        if node2.iter().all(|n| named.contains(n)) {
            naming_node2 += 1;
        }
    }
    // The first to fail saw node 2's ranks gone.
    assert!(
        naming_node2 >= 1,
        "no survivor named node 2's ranks {node2:?}"
    );
    assert!(
        released.elapsed() < Duration::from_secs(15),
        "{:?}",
        released.elapsed()
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
    let ok = wait_all(&c, &mut again, Duration::from_secs(300));
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
    let ok = wait_all(&c, &mut last, Duration::from_secs(300));
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
    // The holders hold their claims once they saved step 1.
    until(
        Duration::from_secs(120),
        "the holders never saved step 1",
        || {
            ranks
                .iter()
                .all(|r| of(&r.events(), "saved").iter().any(|e| e["step"] == 1))
        },
    );
    let mut twin = c
        .spawn_ranks(&[0], &args(&["--steps", "1", "--state-size", "1MiB"]))
        .unwrap();
    let ok = wait_all(&c, &mut twin, Duration::from_secs(60));
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
    let ok = wait_all(&c, &mut ranks, Duration::from_secs(120));
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
    assert!(wait_all(&c, &mut first, Duration::from_secs(300))
        .iter()
        .all(|&ok| ok));
    // Step 5: node 2 holds before it (until a gate file exists); its link
    // is cut meanwhile, then it goes on.
    let gate = dir.path().join("gate-step-5");
    let run = args(&[&["--resume", "--steps", "1"][..], &common].concat());
    let mut ranks = c.spawn_ranks(&[0, 1], &run).unwrap();
    let held_args: Vec<String> = run
        .iter()
        .cloned()
        .chain(args(&["--hold-before", &format!("5:{}", gate.display())]))
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
    std::fs::write(&gate, b"").unwrap();
    let ok = wait_all(&c, &mut ranks, Duration::from_secs(60));
    let ok_held = wait_all(&c, &mut held, Duration::from_secs(60));
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
    // The link is back: the next attempt commits step 5 everywhere, once
    // the cut-off rank's claim has expired with its lease (on a loaded
    // machine etcd can take a few lease periods; a new rank that finds its
    // claim still held fails, leaving the others to their timeout).
    until(
        Duration::from_secs(60),
        "the cut-off rank's claim never lapsed",
        || live_claims(&c).is_empty(),
    );
    let mut again = c.spawn_ranks(&[0, 1, 2], &run).unwrap();
    let ok = wait_all(&c, &mut again, Duration::from_secs(300));
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
    // Whether this kernel has netem, asked apart from the fabric: a netem
    // qdisc on the loopback of a namespace of the test's own.
    let probe = format!("snprobe{}", std::process::id());
    let ip = |a: &[&str]| std::process::Command::new("ip").args(a).output().unwrap();
    assert!(ip(&["netns", "add", &probe]).status.success());
    let tried = ip(&[
        "netns", "exec", &probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
    ]);
    ip(&["netns", "del", &probe]);
    let netem = tried.status.success();
    let delay = Duration::from_millis(300);
    match f.delay(0, delay) {
        Ok(()) => {
            assert!(netem, "a delay was set where the kernel has no netem");
            // The delay holds: node 0's packets (its SYN) wait `delay`.
            let l = std::net::TcpListener::bind((f.services_addr(), 0)).unwrap();
            let to = l.local_addr().unwrap();
            let connect = |f: &strata_cli::cluster::Fabric| {
                let t = Instant::now();
                let st = f
                    .command(0, std::path::Path::new("bash"))
                    .args(["-c", &format!("exec 3<>/dev/tcp/{}/{}", to.ip(), to.port())])
                    .status()
                    .unwrap();
                assert!(st.success());
                t.elapsed()
            };
            let slow = connect(&f);
            assert!(
                slow >= delay,
                "connect took {slow:?} under a {delay:?} delay"
            );
            f.delay(0, Duration::ZERO).unwrap();
            let fast = connect(&f);
            assert!(fast < slow, "removed: {fast:?} (was {slow:?})");
        }
        Err(e) => {
            let why = String::from_utf8_lossy(&tried.stderr);
            assert!(!netem, "the kernel has netem, yet: {e}");
            // Refused for the kernel's reason, in the fabric's words.
            assert!(e.contains("netem") && e.contains(why.trim()), "{e} / {why}");
        }
    }
    // Loopback fabrics cannot delay or cut links at all.
    let lo = strata_cli::cluster::Fabric::new(1, true);
    assert!(lo.delay(0, Duration::from_millis(1)).is_err());
    assert!(lo.link(0, false).is_err());
}

/// torchrun's placement (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`): each node's
/// rank processes meet on the node link, local rank 0 holding the node's
/// claims. One rank process killed inside a save ends its node at once:
/// every rank of the job fails that save long before the coordination
/// timeout (120 s), nothing commits it, and the job started again resumes
/// the step before on every rank.
#[test]
fn rank_processes_on_the_node_link_commit_and_one_killed_fails_the_save_everywhere_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(c) = cluster_with(dir.path(), 2, 3, true) else {
        return;
    };
    let common = ["--state-size", "1MiB"];
    let mut first = c
        .spawn_ranks(
            &[0, 1],
            &args(&[&["--steps", "2", "--verify"][..], &common].concat()),
        )
        .unwrap();
    let ok = wait_all(&c, &mut first, Duration::from_secs(300));
    for (r, ok) in first.iter().zip(&ok) {
        assert!(
            ok,
            "rank {}: {:?}\n{}",
            r.rank,
            r.events(),
            c.rank_log(r.node, r.rank)
        );
    }
    // Each node's claims are one process's: local rank 0's.
    let claims = etcd_range(&c, &format!("/strata/{JOB}/ranks/"));
    let pid = |v: &str| {
        v.split_whitespace()
            .find(|w| w.starts_with("pid="))
            .map(String::from)
    };
    let pids: Vec<Option<String>> = claims.iter().map(|(_, v)| pid(v)).collect();
    assert_eq!(pids.len(), 6, "{claims:?}");
    assert!(pids[..3].iter().all(|p| p == &pids[0]), "{claims:?}");
    assert!(
        pids[3..].iter().all(|p| p == &pids[3]) && pids[0] != pids[3],
        "{claims:?}"
    );

    // Step 3: every rank holds before it until the gate exists; then node
    // 1's local rank 2 (a member, not the leader) is killed.
    let gate = dir.path().join("gate-step-3");
    let run: Vec<String> = args(&[&["--resume", "--steps", "1"][..], &common].concat())
        .into_iter()
        .chain(args(&["--hold-before", &format!("3:{}", gate.display())]))
        .collect();
    let mut ranks = c.spawn_ranks(&[0, 1], &run).unwrap();
    until(Duration::from_secs(120), "never resumed", || {
        ranks.iter().all(|r| !of(&r.events(), "resumed").is_empty())
    });
    let victim = c.rank_of(1, 2);
    let t = Instant::now();
    for r in ranks.iter_mut().filter(|r| r.rank == victim) {
        r.proc.kill();
    }
    std::fs::write(&gate, b"").unwrap();
    let ok = wait_all(&c, &mut ranks, Duration::from_secs(100));
    let took = t.elapsed();
    eprintln!("one rank process killed: every rank's save ended in {took:?}");
    assert!(ok.iter().all(|&ok| !ok), "no rank commits step 3: {ok:?}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    for r in &ranks {
        assert!(
            !of(&r.events(), "saved").iter().any(|e| e["step"] == 3),
            "rank {}: {:?}",
            r.rank,
            r.events()
        );
    }
    // Started again (as the launcher would): every rank resumes step 2.
    let mut again = c
        .spawn_ranks(
            &[0, 1],
            &args(&[&["--resume", "--steps", "1", "--verify"][..], &common].concat()),
        )
        .unwrap();
    let t = Instant::now();
    let ok = wait_all(&c, &mut again, Duration::from_secs(300));
    // The killed rank's push claims (its chunks for the peer) are a dead
    // process's: the new ranks send those chunks at once, not after
    // waiting a minute for it.
    let took = t.elapsed();
    assert!(took < Duration::from_secs(40), "{took:?}");
    for (r, ok) in again.iter().zip(&ok) {
        let ev = r.events();
        assert!(
            ok,
            "rank {}: {ev:?}\n{}",
            r.rank,
            c.rank_log(r.node, r.rank)
        );
        assert_eq!(of(&ev, "resumed")[0]["step"], 2, "rank {}: {ev:?}", r.rank);
    }
}

//! The node link over a real etcd: a node's ranks as separate processes
//! (torchrun's and srun's one process per GPU) meet on a local socket and
//! local rank 0 takes part in etcd's rounds for all of them, so a round
//! costs about three requests per node however many ranks it runs. A rank
//! process killed mid-job ends its node at once (the other nodes see its
//! ranks gone, no round waits out its timeout); one that leaves cleanly is
//! forgotten; a launcher that places ranks cyclically is told so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::{
    Checkpointer, Config, Coordinator, Entry, ErrorKind, EtcdCoordinator, NodeCoordinator,
    NodePlace, StepSelector,
};
use strata_testkit::etcd;

mod rounds;
use rounds::{opts, rounds_agree, sum, LONG};

const CHILD: &str = "STRATA_NODE_LINK_CHILD";

fn place(node: &str, local_rank: u32, local_world: u32) -> NodePlace {
    NodePlace {
        node: node.into(),
        local_rank,
        local_world,
    }
}

/// The node coordinators of `nodes` nodes of `per` ranks, all joined at
/// once (members wait for their leader), by rank.
fn join_all(url: &str, job: &str, nodes: u32, per: u32, lease: u64) -> Vec<NodeCoordinator> {
    let world = nodes * per;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                s.spawn(move || {
                    EtcdCoordinator::join_node(
                        opts(url, lease),
                        job,
                        r,
                        world,
                        &place(&format!("n{}", r / per), r % per, per),
                        LONG,
                    )
                    .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn the_rank_processes_of_two_nodes_meet_locally_for_three_requests_per_node() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let (nodes, per) = (2u32, 4u32);
    let world = nodes * per;
    let coords = join_all(&etcd.url, "link", nodes, per, 60);
    let leaders: Vec<&Arc<EtcdCoordinator>> = coords.iter().filter_map(|c| c.etcd()).collect();
    assert_eq!(leaders.len(), 2, "local rank 0 of each node leads it");
    assert_eq!(coords[0].linked_ranks(), vec![1, 2, 3]);
    assert_eq!(coords[4].linked_ranks(), vec![5, 6, 7]);
    assert!(coords[1].etcd().is_none() && coords[1].linked_ranks().is_empty());
    // Each leader claimed its node's ranks: a claim per rank in etcd.
    assert_eq!(leaders[0].members().unwrap().len(), world as usize);
    let requests = || leaders.iter().map(|n| n.round_requests()).sum::<u64>();
    let rounds = 10u8;
    let before = requests();
    std::thread::scope(|s| {
        for (rank, c) in coords.iter().enumerate() {
            let rank = rank as u32;
            s.spawn(move || rounds_agree(c, rank, world, rounds, 3));
        }
    });
    let per_round = (requests() - before) as f64 / f64::from(rounds + 1);
    eprintln!("etcd requests per round, {nodes} nodes of {per} rank processes: {per_round:.1}");
    assert!(per_round <= 3.0 * f64::from(nodes) + 1.0, "{per_round}");
    // The same world with every rank its own etcd client: three per rank.
    let solo: Vec<EtcdCoordinator> = (0..world)
        .map(|r| EtcdCoordinator::connect(opts(&etcd.url, 60), "solo", r, world).unwrap())
        .collect();
    let before: u64 = solo.iter().map(|c| c.round_requests()).sum();
    std::thread::scope(|s| {
        for (rank, c) in solo.iter().enumerate() {
            s.spawn(move || c.all_reduce(rank as u32, "r", vec![1], LONG, &sum).unwrap());
        }
    });
    let solo_round = solo.iter().map(|c| c.round_requests()).sum::<u64>() - before;
    eprintln!("etcd requests per round, {world} rank processes each its own client: {solo_round}");
    assert!(
        solo_round as f64 >= 2.0 * per_round,
        "{solo_round} vs {per_round}"
    );
    // A member serves only its own rank.
    let e = coords[1]
        .all_reduce(2, "x", vec![], LONG, &sum)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

/// The member process of the next test: joins node "a" as rank 1 and
/// takes part in one round (`r/<round>`), then waits to be killed
/// (`stay`) or leaves cleanly (`leave`); or (`squat`) holds node "a"'s
/// socket as its leader, for the test of another user's leader.
fn child(spec: &str) -> ! {
    let v: Vec<&str> = spec.split(',').collect();
    let [url, job, world, round, mode] = v[..] else {
        panic!("{spec}")
    };
    let world: u32 = world.parse().unwrap();
    if mode == "squat" {
        // Another user's process holding the node's socket name.
        let p = place("a", 0, 2);
        let _c = EtcdCoordinator::join_node(opts(url, 3), job, 0, world, &p, LONG).unwrap();
        std::thread::sleep(Duration::from_secs(600));
        std::process::exit(3);
    }
    let c =
        EtcdCoordinator::join_node(opts(url, 3), job, 1, world, &place("a", 1, 2), LONG).unwrap();
    c.all_reduce(1, &format!("r/{round}"), vec![1], LONG, &sum)
        .unwrap();
    if mode == "leave" {
        drop(c);
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_secs(600));
    std::process::exit(3);
}

const THIS_TEST: &str =
    "a_killed_rank_process_ends_its_node_at_once_and_one_that_leaves_is_forgotten";

/// Rank 1 of node "a" as a process of its own (this test binary again).
fn child_command(url: &str, job: &str, world: u32, round: u32, mode: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", THIS_TEST, "--nocapture"])
        .env(CHILD, format!("{url},{job},{world},{round},{mode}"))
        .stdout(Stdio::null());
    c
}

fn spawn_child(url: &str, job: &str, world: u32, round: u32, mode: &str) -> std::process::Child {
    child_command(url, job, world, round, mode).spawn().unwrap()
}

#[test]
fn a_killed_rank_process_ends_its_node_at_once_and_one_that_leaves_is_forgotten() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
    }
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // Node "a": rank 0 here, rank 1 a process of its own; node "b": 2, 3.
    let mut proc1 = spawn_child(&etcd.url, "kill", 4, 0, "stay");
    let coords: Vec<(u32, NodeCoordinator)> = std::thread::scope(|s| {
        let url = &etcd.url;
        let hs: Vec<_> = [(0, "a", 0), (2, "b", 0), (3, "b", 1)]
            .into_iter()
            .map(|(r, n, l)| {
                s.spawn(move || {
                    let p = place(n, l, 2);
                    (
                        r,
                        EtcdCoordinator::join_node(opts(url, 3), "kill", r, 4, &p, LONG).unwrap(),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A round of all four: the other process's value arrived.
    std::thread::scope(|s| {
        for (r, c) in &coords {
            s.spawn(move || {
                let got = c.all_reduce(*r, "r/0", vec![*r as u8], LONG, &sum).unwrap();
                // Ranks 0, 2, 3 give their rank; the child gives 1.
                assert_eq!(got, [6, 0, 0, 0, 4]);
            });
        }
    });
    assert_eq!(coords[0].1.linked_ranks(), vec![1]);
    // SIGKILL: no goodbye. The next round fails on every rank, long before
    // its 60 s timeout: node "a" ended itself and revoked its claims.
    proc1.kill().unwrap();
    proc1.wait().unwrap();
    let t = Instant::now();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = coords
            .iter()
            .map(|(r, c)| s.spawn(move || c.all_reduce(*r, "r/1", vec![1], LONG, &sum)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap().unwrap_err().to_string())
            .collect()
    });
    let took = t.elapsed();
    eprintln!("after the kill, every rank failed in {took:?}: {errs:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        errs[0].contains("local rank 1") && errs[0].contains("ended without leaving"),
        "{}",
        errs[0]
    );
    // The keep-alive (every third of the 3 s lease) then finds the lease
    // revoked: the reason the rounds fail with stays the node's own.
    std::thread::sleep(Duration::from_millis(1500));
    let (r, c) = &coords[0];
    let e = c.all_reduce(*r, "r/2", vec![1], LONG, &sum).unwrap_err();
    assert!(e.to_string().contains("ended without leaving"), "{e}");
    drop(coords);

    // A process that leaves cleanly is forgotten: the leader goes on, its
    // claims stay, and the rank joins again in a new process.
    let p = place("a", 0, 2);
    let leader = EtcdCoordinator::join_node(opts(&etcd.url, 3), "leave", 0, 2, &p, LONG).unwrap();
    for round in 0..2u32 {
        let mut c = spawn_child(&etcd.url, "leave", 2, round, "leave");
        let t = Instant::now();
        while leader.linked_ranks().is_empty() {
            assert!(t.elapsed() < LONG, "rank 1 never joined again");
            std::thread::sleep(Duration::from_millis(20));
        }
        let got = leader
            .all_reduce(0, &format!("r/{round}"), vec![0], LONG, &sum)
            .unwrap();
        assert_eq!(got, [1, 0, 0, 0, 2], "round {round}");
        assert!(c.wait().unwrap().success());
        let t = Instant::now();
        while !leader.linked_ranks().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(10), "never forgotten");
            std::thread::sleep(Duration::from_millis(20));
        }
        let node = leader.etcd().unwrap();
        assert_eq!(node.members().unwrap().len(), 2, "the claims stay");
        // A round that needs the rank that left fails at once, naming it.
        let t = Instant::now();
        let e = leader
            .all_reduce(0, &format!("x/{round}"), vec![0], LONG, &sum)
            .unwrap_err();
        assert!(e.to_string().contains("left this node"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // Nothing of it stays behind for the rank that left.
        assert_eq!(leader.etcd().unwrap().rounds_open(), 0, "round x/{round}");
    }
}

#[test]
fn ranks_a_launcher_placed_cyclically_are_told_to_turn_the_link_off() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let url = &etcd.url;
    // Node "a" holds ranks 0 and 2 (cyclic): rank 0 leads 0..2, rank 2
    // comes as its local rank 1.
    let leader =
        EtcdCoordinator::join_node(opts(url, 60), "cyc", 0, 4, &place("a", 0, 2), LONG).unwrap();
    let e = EtcdCoordinator::join_node(opts(url, 60), "cyc", 3, 4, &place("a", 1, 2), LONG)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("etcd_node_rounds = false"), "{e}");
    // A second process for a rank already linked is refused, naming it.
    let first =
        EtcdCoordinator::join_node(opts(url, 60), "cyc", 1, 4, &place("a", 1, 2), LONG).unwrap();
    let e = EtcdCoordinator::join_node(opts(url, 60), "cyc", 1, 4, &place("a", 1, 2), LONG)
        .unwrap_err();
    assert!(
        matches!(e, strata::Error::RankClaimed { rank: 1, .. }),
        "{e}"
    );
    // Another job, or another start of it, never meets this node's leader.
    let short = Duration::from_secs(2);
    let e = EtcdCoordinator::join_node(opts(url, 60), "other", 1, 4, &place("a", 1, 2), short)
        .unwrap_err();
    assert!(e.to_string().contains("never listened"), "{e}");
    drop((first, leader));
    // The last node of a Slurm step may hold fewer ranks than
    // SLURM_NTASKS_PER_NODE says (a maximum): its leader claims up to the
    // world's end.
    let last =
        EtcdCoordinator::join_node(opts(url, 60), "tail", 4, 6, &place("z", 0, 4), LONG).unwrap();
    assert_eq!(last.etcd().unwrap().ranks(), 4..6);
    drop(last);
    // Impossible places are configuration errors before anything starts.
    let e = EtcdCoordinator::join_node(opts(url, 60), "cyc", 1, 4, &place("a", 2, 2), LONG)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

/// Through the settings: four checkpointers of one node, configured as
/// torchrun configures its processes (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`),
/// save and restore through the node link.
#[test]
fn checkpointers_configured_by_the_launcher_commit_and_restore_through_the_link() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let world = 4u32;
    let cfg = |rank: u32| {
        let mut c = Config::builder()
            .job("cfg-link")
            .rank(rank, world)
            .l1_dir(dir.path());
        c.etcd_endpoints = vec![etcd.url.clone()];
        c.local_rank = Some(rank);
        c.local_world_size = Some(world);
        c.node = "n0".into();
        c
    };
    assert!(NodePlace::from_config(&cfg(1)).is_some());
    let mut off = cfg(1);
    off.etcd_node_rounds = false;
    assert!(NodePlace::from_config(&off).is_none());
    std::thread::scope(|s| {
        for rank in 0..world {
            let c = cfg(rank);
            s.spawn(move || {
                let ck = Checkpointer::new(c).unwrap();
                for step in 1..=3u64 {
                    let data = vec![rank as u8 ^ step as u8; 4096];
                    let e = [Entry::tensor(
                        "w",
                        strata::format::DType::U8,
                        &[4096],
                        &data,
                    )];
                    ck.save(step, &e).unwrap().wait().unwrap();
                }
                let got = ck.restore(StepSelector::Latest).unwrap();
                assert_eq!(got.step, 3);
                assert_eq!(got.get("w").unwrap().bytes, vec![rank as u8 ^ 3; 4096]);
            });
        }
    });
    // One process held the node's four claims (local rank 0's, on one
    // lease), not four.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let leases: std::collections::BTreeSet<String> = (0..world)
        .map(|r| {
            let key = b64.encode(format!("/strata/cfg-link/ranks/{r:08}"));
            let got = etcd.call("/v3/kv/range", &serde_json::json!({ "key": key }));
            got["kvs"][0]["lease"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(leases.len(), 1, "{leases:?}");
}

/// A member gives its round the time it asked for, and no more: the
/// leader's round in etcd ends by the earliest deadline of the node's
/// ranks in it (a member that gave up while the leader's longer round
/// went on could see it fail where the others commit).
#[test]
fn a_node_round_ends_by_the_earliest_deadline_of_its_ranks() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let url = &etcd.url;
    // Rank 2 (node "b") never comes to the round.
    let _absent = EtcdCoordinator::connect(opts(url, 60), "early", 2, 3).unwrap();
    let (leader, member) = std::thread::scope(|s| {
        let m = s.spawn(|| {
            let p = place("a", 1, 2);
            EtcdCoordinator::join_node(opts(url, 60), "early", 1, 3, &p, LONG).unwrap()
        });
        let p = place("a", 0, 2);
        let l = EtcdCoordinator::join_node(opts(url, 60), "early", 0, 3, &p, LONG).unwrap();
        (l, m.join().unwrap())
    });
    let t = Instant::now();
    let (l, m) = std::thread::scope(|s| {
        let m = s.spawn(|| member.all_reduce(1, "r", vec![1], Duration::from_secs(1), &sum));
        std::thread::sleep(Duration::from_millis(300));
        let l = leader.all_reduce(0, "r", vec![0], LONG, &sum);
        (l, m.join().unwrap())
    });
    let took = t.elapsed();
    eprintln!("a member of 1 s and a leader of 60 s: the round ended in {took:?}: {l:?} / {m:?}");
    assert!(l.is_err() && m.is_err(), "{l:?} {m:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A leader that ends hands out the outcome of a round it decided before
/// it closes its links: the member sees the same success.
#[test]
fn a_leader_that_ends_hands_out_the_rounds_it_decided() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let url = &etcd.url;
    for i in 0..10 {
        let job = format!("drain-{i}");
        let job = job.as_str();
        std::thread::scope(|s| {
            let m = s.spawn(|| {
                let p = place("a", 1, 2);
                let c = EtcdCoordinator::join_node(opts(url, 60), job, 1, 2, &p, LONG).unwrap();
                c.all_reduce(1, "r", vec![2], LONG, &sum)
            });
            let p = place("a", 0, 2);
            let l = EtcdCoordinator::join_node(opts(url, 60), job, 0, 2, &p, LONG).unwrap();
            while l.linked_ranks().is_empty() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let want = [5, 0, 0, 0, 2];
            assert_eq!(l.all_reduce(0, "r", vec![3], LONG, &sum).unwrap(), want);
            drop(l);
            assert_eq!(m.join().unwrap().unwrap(), want, "run {i}");
        });
    }
}

/// Two leaders whose ranges overlap (a launcher that does not place a
/// node's ranks consecutively): the second is refused and told what to
/// turn off.
#[test]
fn overlapping_node_leaders_are_told_to_turn_the_link_off() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let url = &etcd.url;
    let a = place("a", 0, 4);
    let _a = EtcdCoordinator::join_node(opts(url, 1), "overlap", 0, 4, &a, LONG).unwrap();
    let b = place("b", 0, 2);
    let e = EtcdCoordinator::join_node(opts(url, 1), "overlap", 2, 4, &b, LONG).unwrap_err();
    assert!(
        matches!(e, strata::Error::RankClaimed { rank: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("etcd_node_rounds = false"), "{e}");
}

/// The node's socket name can be bound by any user of the host's network
/// namespace: a member trusts only a leader of its own user (the leader's
/// side: `node_link_tests.rs`). Needs root (to start a process as another
/// user).
#[test]
fn a_leader_of_another_user_is_refused() {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to start a process as another user");
        return;
    }
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let nobody = 65_534;
    // Another user's process took the node's name first: this member
    // refuses it, never sending it a value.
    let mut squat = child_command(&etcd.url, "users", 2, 0, "squat")
        .uid(nobody)
        .gid(nobody)
        .spawn()
        .unwrap();
    let p = place("a", 1, 2);
    let e = EtcdCoordinator::join_node(opts(&etcd.url, 3), "users", 1, 2, &p, LONG).unwrap_err();
    squat.kill().unwrap();
    squat.wait().unwrap();
    assert!(e.to_string().contains("another user"), "{e}");
}

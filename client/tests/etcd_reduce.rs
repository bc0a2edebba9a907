//! The reducing round over a real etcd: one process (rank 0's) decides,
//! every rank gets the same decision for about three requests per process;
//! the ranks of one process share a round; a rank that leaves, or a decider
//! that dies, fails the round on every rank; a process whose claim lapsed
//! never takes a decision; a round longer than the lease costs the decider
//! no more requests, and the processes waiting on it follow it by watch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::{Coordinator, Error, ErrorKind, EtcdCoordinator};
use strata_testkit::etcd;

mod rounds;
use rounds::{connect_nodes, on_every_rank, opts, rounds_agree, sum, LONG};

/// Waits (up to 30 s) until `rank`'s value of the first attempt of round
/// `key` is in etcd, as `c` reads the job's keys.
fn until_value_of(c: &EtcdCoordinator, key: &str, rank: u32) {
    let want = format!("/decide/{key}@1/v/{rank:08}/");
    let t = Instant::now();
    while !c.keys().unwrap().iter().any(|k| k.contains(&want)) {
        assert!(t.elapsed() < Duration::from_secs(30), "never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ten rounds of agreement (and the one `rounds_agree` ends with) on every
/// rank of `nodes`, each node a process of several ranks: the etcd requests
/// the rounds cost, per round, all nodes together.
fn requests_per_round(nodes: &[Arc<EtcdCoordinator>], world: u32) -> f64 {
    let requests = || nodes.iter().map(|n| n.round_requests()).sum::<u64>();
    let rounds = 10u8;
    let before = requests();
    on_every_rank(nodes, |h, rank| rounds_agree(h, rank, world, rounds, 2));
    (requests() - before) as f64 / f64::from(rounds + 1)
}

/// `c`'s round "r" as `rank` with `value`, and the round requests it sent.
fn counted(c: &EtcdCoordinator, rank: u32, value: u8) -> (strata::Result<Vec<u8>>, u64) {
    counted_as(c, rank, "r", value)
}

/// `c`'s round `key` as `rank` with `value`, and the round requests it sent.
fn counted_as(
    c: &EtcdCoordinator,
    rank: u32,
    key: &str,
    value: u8,
) -> (strata::Result<Vec<u8>>, u64) {
    let before = c.round_requests();
    let got = c.all_reduce(rank, key, vec![value], LONG, &sum);
    (got, c.round_requests() - before)
}

#[test]
fn the_ranks_of_two_nodes_reduce_once_for_about_three_requests_per_node() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let world = 6;
    // Long leases: no keep-alive falls inside the rounds counted.
    let nodes: Vec<Arc<EtcdCoordinator>> = [0..3, 3..6]
        .into_iter()
        .map(|r| EtcdCoordinator::connect_node(opts(&etcd.url, 60), "node", r, world).unwrap())
        .collect();
    assert_eq!(nodes[0].members().unwrap().len(), 6, "a claim per rank");
    let per_round = requests_per_round(&nodes, world);
    assert_eq!(
        nodes[0].members().unwrap().len(),
        6,
        "the rounds leave the claims alone"
    );
    eprintln!("etcd requests per round, 2 nodes of 3 ranks: {per_round:.1}");
    // Three per process; the decider reads again only when a value
    // arrives that its first read could not place.
    assert!(
        per_round <= 3.0 * 2.0 + 1.0,
        "{per_round} requests per round"
    );
    // Only the last round's keys are left: the decider clears a round
    // with its next decision.
    let keys = nodes[0].keys().unwrap();
    // (A round's values are under `decide/`, its decision under `decided/`.)
    let decided: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains("/decide/") || k.contains("/decided/"))
        .collect();
    assert!(
        decided
            .iter()
            .all(|k| k.contains("/decide/g@1/") || k.contains("/decided/g@1/")),
        "{decided:?}"
    );
    assert_eq!(decided.len(), 2, "one value and the decision: {decided:?}");
    // A rank handle serves only its rank, and a node's coordinator is not
    // a single rank's.
    let h = nodes[1].rank_handle(4).unwrap();
    let e = h.all_reduce(3, "x", vec![], LONG, &sum).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(nodes[1].rank_handle(0).is_err());
    let e = nodes[1].all_gather(3, "x", vec![], LONG).unwrap_err();
    assert!(e.to_string().contains("rank_handle"), "{e}");
}

#[test]
fn a_rank_that_left_fails_the_round_on_every_rank_naming_it() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let world = 3;
    let coords: Vec<EtcdCoordinator> = (0..world)
        .map(|r| EtcdCoordinator::connect(opts(&etcd.url, 2), "left", r, world).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (r, c) in coords.iter().enumerate() {
            s.spawn(move || {
                c.all_reduce(r as u32, "first", vec![1], LONG, &sum)
                    .unwrap()
            });
        }
    });
    let mut coords = coords;
    // Rank 2 ends (its claim is marked exited) without taking part again.
    drop(coords.pop());
    let t = Instant::now();
    let errors: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = coords
            .iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    c.all_reduce(r as u32, "second", vec![1], LONG, &sum)
                        .unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errors {
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("rank [2] left"), "{msg}");
    }
    assert_eq!(errors[0].to_string(), errors[1].to_string(), "one decision");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// The decider's first read may find every value there already (the
/// others reported before it came): it decides without looking further.
/// A rank it counted so is seen all the same, and when its process dies
/// the next round fails at once naming it, not after the round's whole
/// timeout as a rank that never came.
#[test]
fn a_rank_counted_in_the_deciders_first_read_that_dies_fails_the_next_round_at_once() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // Long leases: the claim goes only when the test revokes it.
    let decider = EtcdCoordinator::connect(opts(&etcd.url, 60), "early", 0, 2).unwrap();
    let other = EtcdCoordinator::connect(opts(&etcd.url, 60), "early", 1, 2).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| other.all_reduce(1, "first", vec![1], LONG, &sum));
        // Rank 1's value is in etcd before the decider reads the round.
        until_value_of(&decider, "first", 1);
        let got = decider.all_reduce(0, "first", vec![1], LONG, &sum).unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), got);
    });
    // Rank 1's process dies (its lease is gone, as after SIGKILL) before
    // the next round.
    etcd.revoke_claim("early", 1);
    let t = Instant::now();
    let e = decider
        .all_reduce(0, "second", vec![1], LONG, &sum)
        .unwrap_err();
    assert!(e.to_string().contains("rank [1] left"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// A process that came before the decider first sees the decider's claim
/// beside its decision (it waited on the decision alone). The decider is
/// seen all the same: when it dies, the next round fails at once naming
/// it, not after the round's whole timeout as a decider that never came.
#[test]
fn a_decider_first_seen_beside_its_decision_that_dies_fails_the_next_round_at_once() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // Long leases: rank 1's first wait (half a lease, on the decision
    // alone) outlasts the decider's coming and deciding, and the claim
    // goes only when the test revokes it.
    let other = EtcdCoordinator::connect(opts(&etcd.url, 60), "late", 1, 2).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| other.all_reduce(1, "first", vec![1], LONG, &sum));
        // Rank 1 waits on the round before rank 0's process has come.
        until_value_of(&other, "first", 1);
        let decider = EtcdCoordinator::connect(opts(&etcd.url, 60), "late", 0, 2).unwrap();
        let got = decider.all_reduce(0, "first", vec![1], LONG, &sum).unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), got);
        // Rank 0's process dies (its lease is gone, as after SIGKILL).
        etcd.revoke_claim("late", 0);
    });
    let t = Instant::now();
    let e = other
        .all_reduce(1, "second", vec![1], LONG, &sum)
        .unwrap_err();
    assert!(e.to_string().contains("rank [0] left"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn when_the_decider_dies_the_others_fail_within_its_lease() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let _decider = EtcdCoordinator::connect(opts(&etcd.url, 2), "orphan", 0, 2).unwrap();
    let other = EtcdCoordinator::connect(opts(&etcd.url, 2), "orphan", 1, 2).unwrap();
    let t = Instant::now();
    let e = std::thread::scope(|s| {
        let waiting = s.spawn(|| other.all_reduce(1, "r", vec![1], LONG, &sum));
        std::thread::sleep(Duration::from_millis(500));
        // Rank 0's process dies (its lease is gone, as after SIGKILL).
        etcd.revoke_claim("orphan", 0);
        waiting.join().unwrap().unwrap_err()
    });
    assert!(e.to_string().contains("rank [0] left"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn a_round_costs_one_request_per_process_that_waits_and_three_for_the_decider() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let (nodes, per) = (4u32, 2u32);
    let world = nodes * per;
    // Long leases: no keep-alive falls inside the rounds counted.
    let coords = connect_nodes(&opts(&etcd.url, 60), "two", nodes, per);
    let per_round = requests_per_round(&coords, world);
    eprintln!("etcd requests per round, {nodes} nodes of {per} ranks: {per_round:.1}");
    // A waiting process puts its values; its one watch of the job's
    // decisions, kept across rounds, brings the decision: it reads nothing
    // after it (three requests each before 2026-11-28, two before the
    // watch was kept). The decider reads, watches and writes.
    assert!(
        per_round <= f64::from(nodes) + 2.5,
        "{per_round} requests per round"
    );
    // The watch kept: no more than one request each for the rounds.
    // (The keep-alives, counted with them, come a third of the lease,
    // 20 s, after connecting.)
    let watches: u64 = coords.iter().map(|c| c.keepalive_requests()).sum();
    assert!(
        watches <= 2 * u64::from(nodes),
        "{watches} background requests"
    );
}

#[test]
fn a_process_follows_the_decisions_from_its_connect_not_from_its_first_round() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // (Asked again on a reply it could not read: the gauge is in every one.)
    let watchers = || {
        (0..5)
            .find_map(|_| etcd.metric("etcd_debugging_mvcc_watcher_total"))
            .expect("etcd exports its watchers")
    };
    let until = |n: f64| {
        let t = Instant::now();
        while watchers() != n {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} watches in etcd, not {n}",
                watchers()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let none = watchers();
    let (nodes, per) = (3u32, 2u32);
    let world = nodes * per;
    // At a restart every process's first round is the restore, all at
    // once: a watch set up in it is set up beside every node's values.
    // Each process other than the decider's follows the decisions once
    // connected (one after another), before any round.
    let coords = connect_nodes(&opts(&etcd.url, 60), "early", nodes, per);
    until(none + f64::from(nodes - 1));
    // The rounds start no watch of a waiting process's (the decider's
    // own follows a round's values, and ends with it).
    requests_per_round(&coords, world);
    until(none + f64::from(nodes - 1));
    drop(coords);
    until(none);
}

#[test]
fn the_decider_reads_the_claims_once_not_each_round() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // Rank 0's process alone, and one process of 239 ranks: 240 claims
    // (the rounds' values are a byte each).
    let world = 240;
    let coords: Vec<Arc<EtcdCoordinator>> = [0..1, 1..world]
        .into_iter()
        .map(|r| EtcdCoordinator::connect_node(opts(&etcd.url, 60), "claims", r, world).unwrap())
        .collect();
    // What one read of every claim costs the decider.
    let before = coords[0].received_bytes();
    assert_eq!(coords[0].members().unwrap().len(), world as usize);
    let claims = coords[0].received_bytes() - before;
    // Eleven rounds: the first reads them all; the next ten only those
    // written since (none), beside the values.
    let first = coords[0].received_bytes();
    requests_per_round(&coords, world);
    let per_round = (coords[0].received_bytes() - first) as f64 / 11.0;
    eprintln!("the decider reads {per_round:.0} bytes per round; every claim is {claims} bytes");
    assert!(
        per_round < claims as f64 / 2.0,
        "{per_round} bytes per round, every claim {claims} bytes"
    );
}

#[test]
fn a_process_whose_claim_lapsed_while_waiting_never_takes_the_decision() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let decider = EtcdCoordinator::connect(opts(&etcd.url, 2), "fenced", 0, 2).unwrap();
    // A long lease: its keep-alive does not notice the loss during the
    // test; only the round's own read of its claims can.
    let stale = EtcdCoordinator::connect(opts(&etcd.url, 60), "fenced", 1, 2).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| stale.all_reduce(1, "commit/7", vec![9], LONG, &sum));
        std::thread::sleep(Duration::from_millis(500));
        etcd.revoke_claim("fenced", 1);
        let fresh = EtcdCoordinator::connect(opts(&etcd.url, 2), "fenced", 1, 2).unwrap();
        let h = s.spawn(move || (fresh.all_reduce(1, "commit/7", vec![2], LONG, &sum), fresh));
        let got = decider
            .all_reduce(0, "commit/7", vec![1], LONG, &sum)
            .unwrap();
        // The replacement's value counted, not the stale process's.
        assert_eq!(got[..4], 3u32.to_le_bytes());
        let (fresh_got, _fresh) = h.join().unwrap();
        assert_eq!(fresh_got.unwrap(), got);
        let e = waiting.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::RankClaimed { rank: 1, .. }), "{e}");
    });
}

#[test]
fn a_round_a_node_gave_up_keeps_its_rounds_in_step_with_the_others() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let world = 4;
    let a = EtcdCoordinator::connect_node(opts(&etcd.url, 10), "abandon", 0..2, world).unwrap();
    let b = EtcdCoordinator::connect_node(opts(&etcd.url, 10), "abandon", 2..4, world).unwrap();
    let (a0, a1) = (a.rank_handle(0).unwrap(), a.rank_handle(1).unwrap());
    let (b2, b3) = (b.rank_handle(2).unwrap(), b.rank_handle(3).unwrap());
    let short = Duration::from_secs(2);
    std::thread::scope(|s| {
        // Node a's rank 1 is late: its rank 0 gives the round up, and node
        // b, waiting for the decision, times out.
        let hb: Vec<_> = [(&b2, 2), (&b3, 3)]
            .into_iter()
            .map(|(h, r)| s.spawn(move || h.all_reduce(r, "k", vec![1], short, &sum)))
            .collect();
        let e = a0
            .all_reduce(0, "k", vec![1], Duration::from_secs(1), &sum)
            .unwrap_err();
        assert!(e.to_string().contains("only 1 of this process's 2"), "{e}");
        for h in hb {
            assert!(h.join().unwrap().is_err());
        }
    });
    // The late rank's call of that round gets its outcome at once.
    let t = Instant::now();
    let e = a1.all_reduce(1, "k", vec![1], LONG, &sum).unwrap_err();
    assert!(e.to_string().contains("only 1 of this process's 2"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
    // The next round of the same key meets on every process.
    std::thread::scope(|s| {
        let hs: Vec<_> = [(&a0, 0u32), (&a1, 1), (&b2, 2), (&b3, 3)]
            .into_iter()
            .map(|(h, r)| s.spawn(move || h.all_reduce(r, "k", vec![1], LONG, &sum)))
            .collect();
        for h in hs {
            let got = h.join().unwrap().unwrap();
            assert_eq!(got[..4], 4u32.to_le_bytes());
        }
    });
}

#[test]
fn a_process_waiting_on_a_slow_rank_follows_the_decider_without_reading_each_half_lease() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // A 2 s lease; ranks 0 and 1 vote at once, rank 2 (a straggler) 6 s
    // later. Rank 1's process waits for the decision by watch: its value
    // with a read, a first watch of half a lease, a read, then the
    // decision and the decider's claim followed until the decision comes,
    // and the read of it (6). Reading the decision and the claims again
    // each half lease (as before) was 13 requests.
    let c: Vec<EtcdCoordinator> = (0..3)
        .map(|r| EtcdCoordinator::connect(opts(&etcd.url, 2), "slow", r, 3).unwrap())
        .collect();
    std::thread::scope(|s| {
        let decider = s.spawn(|| c[0].all_reduce(0, "r", vec![1], LONG, &sum));
        let waiting = s.spawn(|| counted(&c[1], 1, 2));
        std::thread::sleep(Duration::from_secs(6));
        let want = sum(&[vec![1], vec![2], vec![3]]);
        assert_eq!(c[2].all_reduce(2, "r", vec![3], LONG, &sum).unwrap(), want);
        assert_eq!(decider.join().unwrap().unwrap(), want);
        let (got, requests) = waiting.join().unwrap();
        assert_eq!(got.unwrap(), want);
        eprintln!("requests of a process waiting 6 s on a straggler (2 s lease): {requests}");
        assert!(
            requests <= 7,
            "the waiting process sent {requests} requests"
        );
    });
    // A decider that dies while the others wait on a straggler: they learn
    // it from its claim's watch within its lease, not at the timeout.
    let d: Vec<EtcdCoordinator> = (0..3)
        .map(|r| EtcdCoordinator::connect(opts(&etcd.url, 2), "slow2", r, 3).unwrap())
        .collect();
    std::thread::scope(|s| {
        let t = Instant::now();
        let _decider = s.spawn(|| d[0].all_reduce(0, "r", vec![1], Duration::from_secs(30), &sum));
        let waiting = s.spawn(|| d[1].all_reduce(1, "r", vec![2], Duration::from_secs(30), &sum));
        std::thread::sleep(Duration::from_secs(3));
        etcd.revoke_claim("slow2", 0);
        let e = waiting.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("rank [0] left"), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "{:?}: {e}",
            t.elapsed()
        );
    });
}

#[test]
fn a_decider_claim_that_goes_before_the_decider_came_costs_no_storm_of_requests() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // Rank 0's claim of an earlier process (ended cleanly: marked exited)
    // is no decider of rank 1's round; it goes (its lease revoked) while
    // rank 1 waits for a rank 0 to come. Watching from before that
    // deletion would see it again at once, every time: a read and two
    // watches in a loop until rank 0 comes.
    drop(EtcdCoordinator::connect(opts(&etcd.url, 2), "gone", 0, 2).unwrap());
    let b = EtcdCoordinator::connect(opts(&etcd.url, 2), "gone", 1, 2).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| counted(&b, 1, 2));
        std::thread::sleep(Duration::from_millis(1500));
        etcd.revoke_claim("gone", 0);
        std::thread::sleep(Duration::from_millis(1500));
        let a = EtcdCoordinator::connect(opts(&etcd.url, 2), "gone", 0, 2).unwrap();
        let want = sum(&[vec![1], vec![2]]);
        assert_eq!(a.all_reduce(0, "r", vec![1], LONG, &sum).unwrap(), want);
        let (got, requests) = waiting.join().unwrap();
        assert_eq!(got.unwrap(), want);
        eprintln!("requests of a process whose decider's old claim went: {requests}");
        // Its value, a watch and a read, then a read and two watches for
        // each change of rank 0's claim (gone, claimed, then the
        // decision): 12; the loop was 54 in these 3 s.
        assert!(
            requests <= 16,
            "the waiting process sent {requests} requests"
        );
    });
}

#[test]
fn a_round_longer_than_the_lease_costs_no_more_requests_and_a_late_claim_counts() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // A 2 s lease; rank 1's process comes (claims its rank) 5 s into the
    // round: the decider follows the job's keys, one watch per half lease,
    // instead of reading the round and every claim again each half lease.
    let a = EtcdCoordinator::connect(opts(&etcd.url, 2), "late", 0, 2).unwrap();
    std::thread::scope(|s| {
        let decided = s.spawn(|| counted(&a, 0, 3));
        std::thread::sleep(Duration::from_secs(5));
        let b = EtcdCoordinator::connect(opts(&etcd.url, 2), "late", 1, 2).unwrap();
        assert_eq!(
            b.all_reduce(1, "r", vec![4], LONG, &sum).unwrap(),
            sum(&[vec![3], vec![4]])
        );
        let (got, requests) = decided.join().unwrap();
        assert_eq!(got.unwrap(), sum(&[vec![3], vec![4]]));
        // Its read, a watch per half lease (about five), its decision,
        // and the one replay of the claims' history its first read asks
        // for (rank 1 had no claim then): no read of every value and claim
        // each half lease (that was 11 or more), and no second count when
        // the late claim came (6 then).
        assert!(requests <= 9, "the decider sent {requests} requests");
        drop(b);
    });
    // A rank first seen by the watch (claimed mid-round) that dies before
    // its vote left (named at once), it did not "never come" (the timeout).
    let c = EtcdCoordinator::connect(opts(&etcd.url, 2), "late2", 0, 2).unwrap();
    std::thread::scope(|s| {
        let t = Instant::now();
        let round = s.spawn(|| c.all_reduce(0, "r", vec![3], Duration::from_secs(30), &sum));
        std::thread::sleep(Duration::from_millis(500));
        let d = EtcdCoordinator::connect(opts(&etcd.url, 2), "late2", 1, 2).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        etcd.revoke_claim("late2", 1);
        let e = round.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("left"), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{:?}: {e}",
            t.elapsed()
        );
        drop(d);
    });
}

/// A round runs on the thread that calls it: no thread is started and
/// joined per round (at 4,096 simulated ranks, a round's own thread ending
/// in a process of thousands of threads held the median node's ranks
/// 200 ms after its decision came). The reduction runs inside the round,
/// so the thread it runs on is the round's. Called from inside an async
/// runtime, where blocking would panic, the round still completes (on a
/// thread of its own).
#[test]
fn a_round_runs_on_the_calling_thread_and_from_inside_a_runtime_too() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let decider = EtcdCoordinator::connect(opts(&etcd.url, 60), "own", 0, 2).unwrap();
    let other = EtcdCoordinator::connect(opts(&etcd.url, 60), "own", 1, 2).unwrap();
    let ran_on = std::sync::Mutex::new(Vec::new());
    let reduce = |all: &[Vec<u8>]| {
        ran_on.lock().unwrap().push(std::thread::current().id());
        sum(all)
    };
    std::thread::scope(|s| {
        for round in 0..3 {
            let key = format!("r/{round}");
            let (k, other) = (key.clone(), &other);
            let waiting = s.spawn(move || other.all_reduce(1, &k, vec![2], LONG, &sum));
            let got = decider.all_reduce(0, &key, vec![1], LONG, &reduce).unwrap();
            assert_eq!(waiting.join().unwrap().unwrap(), got);
            assert_eq!(got[..4], 3u32.to_le_bytes());
        }
    });
    let me = std::thread::current().id();
    let first = std::mem::take(&mut *ran_on.lock().unwrap());
    assert_eq!(first, vec![me; 3], "the rounds ran on other threads");

    // Inside a runtime: on a thread of its own, and the round completes.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| other.all_reduce(1, "inside", vec![2], LONG, &sum));
        let got = rt
            .block_on(async { decider.all_reduce(0, "inside", vec![1], LONG, &reduce) })
            .unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), got);
    });
    let inside = std::mem::take(&mut *ran_on.lock().unwrap());
    assert_eq!(inside.len(), 1);
    assert_ne!(inside[0], me);
}

/// A waiting process's watch of the job's decisions, kept across rounds,
/// outlives an etcd restart and a compaction of the revisions it would
/// resume from (etcd cancels it; it reads the decisions and follows on):
/// the rounds after agree, and once it follows again a round costs the
/// waiting process one request.
#[test]
fn the_watch_of_the_decisions_outlives_an_etcd_restart_and_a_compaction() {
    let Some(mut etcd) = etcd::Etcd::start() else {
        return;
    };
    let decider = EtcdCoordinator::connect(opts(&etcd.url, 60), "kept", 0, 2).unwrap();
    let other = EtcdCoordinator::connect(opts(&etcd.url, 60), "kept", 1, 2).unwrap();
    let round = |key: &str| {
        std::thread::scope(|s| {
            let waiting = s.spawn(|| counted_as(&other, 1, key, 2));
            let got = decider.all_reduce(0, key, vec![1], LONG, &sum).unwrap();
            let (theirs, requests) = waiting.join().unwrap();
            assert_eq!(theirs.unwrap(), got, "{key}");
            assert_eq!(got[..4], 3u32.to_le_bytes(), "{key}");
            requests
        })
    };
    round("r/0");
    assert_eq!(
        round("r/1"),
        1,
        "a round costs the waiting process one request"
    );
    // etcd restarts: the watch resumes from where it was, and the next
    // round's decision comes through it.
    etcd.restart(Duration::from_millis(500));
    assert_eq!(
        round("r/1b"),
        1,
        "the watch did not resume after the restart"
    );
    // Revisions move on and are compacted: the watch, still open, is
    // not cancelled; once etcd restarts, it resumes from a compacted
    // revision, which etcd cancels.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    for i in 0..5 {
        let k = b64.encode(format!("/elsewhere/{i}"));
        etcd.call("/v3/kv/put", &serde_json::json!({"key": k, "value": k}));
    }
    let now = etcd.call("/v3/kv/range", &serde_json::json!({"key": b64.encode("x")}));
    let rev = now["header"]["revision"].as_str().unwrap().to_string();
    etcd.call(
        "/v3/kv/compaction",
        &serde_json::json!({"revision": rev, "physical": true}),
    );
    etcd.restart(Duration::from_millis(500));
    let t = Instant::now();
    round("r/2");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    // Following again (the read after the cancel, then the watch).
    let mut last = u64::MAX;
    for i in 3..8 {
        last = round(&format!("r/{i}"));
        if last == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(last, 1, "the watch never followed again");
}

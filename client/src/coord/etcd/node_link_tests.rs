//! The node link against hostile local processes: bytes that are not a
//! hello, lengths meant to exhaust memory, a hello for another job, more
//! connections than the node has ranks that never say hello: each
//! connection is refused or closed, nothing panics or allocates what it
//! claims, and the node goes on serving its real members.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::node_leader::{link_addr, link_name, MAX_HELLO};
use super::wire::{self, Hello, ToLeader, ToMember, WireError};
use super::{EtcdCoordinator, EtcdOptions, NodePlace};
use crate::coord::coordinator::Coordinator;

const LONG: Duration = Duration::from_secs(30);

fn opts(url: &str) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![url.to_string()],
        lease_ttl: Duration::from_secs(60),
        ..EtcdOptions::default()
    }
}

fn place(local_rank: u32) -> NodePlace {
    NodePlace {
        node: "h".into(),
        local_rank,
        local_world: 2,
    }
}

fn connect() -> UnixStream {
    connect_to("hostile")
}

fn connect_to(job: &str) -> UnixStream {
    let addr = link_addr(&link_name("/strata", job, "", "h")).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// What the leader sends back before closing: a refusal, or nothing.
fn answer(mut s: UnixStream) -> Option<ToMember> {
    let got = wire::read_frame(&mut s).ok()??;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the link closes after a refusal");
    ToMember::decode(&got).ok()
}

/// The leader (rank 0) and its member (rank 1) run a round and agree.
fn a_round_of_the_node_runs(leader: &impl Coordinator, member: &impl Coordinator) {
    let sum = |all: &[Vec<u8>]| vec![all.iter().map(|v| v[0]).sum::<u8>()];
    std::thread::scope(|sc| {
        let m = sc.spawn(|| member.all_reduce(1, "r/0", vec![2], LONG, &sum).unwrap());
        assert_eq!(
            leader.all_reduce(0, "r/0", vec![3], LONG, &sum).unwrap(),
            [5]
        );
        assert_eq!(m.join().unwrap(), [5]);
    });
}

#[test]
fn hostile_connections_are_refused_and_the_node_goes_on() {
    let Some(etcd) = strata_testkit::etcd::Etcd::start() else {
        return;
    };
    let leader =
        EtcdCoordinator::join_node(opts(&etcd.url), "hostile", 0, 2, &place(0), LONG).unwrap();

    // Not a frame of a hello.
    let mut s = connect();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(matches!(
        answer(s),
        None | Some(ToMember::Refused(WireError::Coordination(_)))
    ));
    // A header claiming 4 GiB, or just more than a hello may be: refused
    // at once, before any allocation or any wait for the body.
    for len in [u32::MAX, MAX_HELLO as u32 + 1] {
        let t = std::time::Instant::now();
        let mut s = connect();
        s.write_all(&len.to_le_bytes()).unwrap();
        assert!(matches!(
            answer(s),
            None | Some(ToMember::Refused(WireError::Coordination(_)))
        ));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{len}: {:?}",
            t.elapsed()
        );
    }
    // A well-formed hello for another job, and one from another build.
    let hello = Hello {
        version: wire::VERSION,
        job: "someone-else".into(),
        incarnation: String::new(),
        world: 2,
        rank: 1,
        pid: 1,
    };
    for h in [
        hello.clone(),
        Hello {
            version: wire::VERSION + 1,
            job: "hostile".into(),
            ..hello.clone()
        },
        Hello {
            job: "hostile".into(),
            rank: 0,
            ..hello.clone()
        },
    ] {
        let mut s = connect();
        wire::write_frame(&mut s, &ToLeader::Hello(h.clone()).encode()).unwrap();
        match answer(s) {
            Some(ToMember::Refused(e)) => eprintln!("{h:?}: refused: {e:?}"),
            other => panic!("{h:?}: {other:?}"),
        }
    }
    // A round before any hello.
    let mut s = connect();
    let round = ToLeader::Round {
        id: 1,
        key: "r".into(),
        timeout_ms: 10,
        value: vec![1],
    };
    wire::write_frame(&mut s, &round.encode()).unwrap();
    assert!(matches!(answer(s), Some(ToMember::Refused(_))));

    // None of it ended the node: its real member joins and a round runs.
    let member =
        EtcdCoordinator::join_node(opts(&etcd.url), "hostile", 1, 2, &place(1), LONG).unwrap();
    a_round_of_the_node_runs(&leader, &member);
    assert_eq!(leader.linked_ranks(), vec![1]);
}

#[test]
fn connections_that_never_say_hello_are_bounded_and_a_member_still_joins() {
    let Some(etcd) = strata_testkit::etcd::Etcd::start() else {
        return;
    };
    let leader =
        EtcdCoordinator::join_node(opts(&etcd.url), "flood", 0, 2, &place(0), LONG).unwrap();
    // Two ranks on the node: at most 2 × 2 + 8 connections wait for their
    // hello at once (each for up to 10 s).
    let silent: Vec<UnixStream> = (0..12).map(|_| connect_to("flood")).collect();
    std::thread::sleep(Duration::from_millis(500));
    // The next ones are closed at once: no thread, no wait for a hello.
    for _ in 0..20 {
        let t = std::time::Instant::now();
        let mut extra = connect_to("flood");
        let mut b = [0u8; 1];
        assert_eq!(extra.read(&mut b).unwrap_or(0), 0, "closed, unanswered");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }
    // The real member connects again until the silent ones' time is up.
    let member =
        EtcdCoordinator::join_node(opts(&etcd.url), "flood", 1, 2, &place(1), LONG).unwrap();
    a_round_of_the_node_runs(&leader, &member);
    drop(silent);
}

const INTRUDER: &str = "STRATA_NODE_LINK_INTRUDER";

/// A process of another user (this test binary again, as `nobody`) says a
/// valid hello to a leader: refused, naming why. Needs root.
#[test]
fn a_member_of_another_user_is_refused() {
    use std::os::unix::process::CommandExt as _;
    if std::env::var(INTRUDER).is_ok() {
        let mut s = connect_to("intruded");
        let hello = Hello {
            version: wire::VERSION,
            job: "intruded".into(),
            incarnation: String::new(),
            world: 2,
            rank: 1,
            pid: std::process::id(),
        };
        // The leader may refuse on the socket's credentials and close
        // before the hello is written (a broken pipe here): its answer is
        // still there to read.
        let _ = wire::write_frame(&mut s, &ToLeader::Hello(hello).encode());
        let refused = matches!(answer(s), Some(ToMember::Refused(WireError::Config(m))) if m.contains("only its own user"));
        std::process::exit(if refused { 0 } else { 1 });
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to start a process as another user");
        return;
    }
    let Some(etcd) = strata_testkit::etcd::Etcd::start() else {
        return;
    };
    let leader =
        EtcdCoordinator::join_node(opts(&etcd.url), "intruded", 0, 2, &place(0), LONG).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "coord::etcd::node_link_tests::a_member_of_another_user_is_refused",
        ])
        .env(INTRUDER, "1")
        .uid(65_534)
        .gid(65_534)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(leader.linked_ranks().is_empty());
}

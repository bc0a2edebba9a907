//! The etcd coordinator speaks etcd's gRPC, not its JSON gateway: rounds
//! of processes of several ranks agree, with their leases renewed, against
//! an etcd whose gateway is off; and every stream the coordinator opens (a
//! round's watch, a lease's renewal) ends when it is done with it, so etcd
//! holds no stream beyond the one watch of the decisions each process keeps.
//! Over TLS, where etcd sends a failed call's status in its trailers, a
//! refused password is refused as such and an expired token is renewed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use strata::{Coordinator, ErrorKind, EtcdCoordinator, EtcdOptions};
use strata_testkit::etcd;

mod rounds;
use rounds::{connect_nodes, on_every_rank, opts, rounds_agree};

/// The gRPC streams of `method` etcd started and has not ended (its
/// `grpc_server_started_total` less its `grpc_server_handled_total`, every
/// status), asked again on a reply it could not read.
fn open_streams(etcd: &etcd::Etcd, method: &str) -> f64 {
    let label = format!("grpc_method=\"{method}\"");
    (0..5)
        .find_map(|_| {
            let started = etcd.metric_sum("grpc_server_started_total", &label)?;
            let ended = etcd.metric_sum("grpc_server_handled_total", &label)?;
            Some(started - ended)
        })
        .expect("etcd exports its gRPC counters")
}

#[test]
fn rounds_agree_over_grpc_alone_and_no_stream_is_left_open() {
    let Some(etcd) = etcd::Etcd::start_grpc_only() else {
        return;
    };
    // The gateway is off: a JSON call is not answered.
    assert!(etcd.post("/v3/kv/range", r#"{"key":"AA=="}"#).is_none());
    let (nodes, per) = (3u32, 2u32);
    let world = nodes * per;
    // A lease of 5 s, renewed every 5/3 s: the rounds below last 5 s, so
    // each process renews two or three times. (A shorter lease can lapse
    // on a machine loaded with other tests, and a process that lost its
    // claim waits out the round.)
    let coords = connect_nodes(&opts(&etcd.url, 5), "grpc", nodes, per);
    let t = Instant::now();
    on_every_rank(&coords, |h, rank| {
        rounds_agree(h, rank, world, 10, 64);
        // Until the leases were renewed a few times.
        std::thread::sleep(Duration::from_secs(5).saturating_sub(t.elapsed()));
        rounds_agree(h, rank, world, 2, 3);
    });
    assert!(
        coords.iter().map(|c| c.keepalive_requests()).sum::<u64>() >= 2 * u64::from(nodes),
        "the leases were renewed"
    );
    // Every renewal's stream ended; of the watches, only each process's
    // kept one of the decisions (the decider's process keeps none).
    let until = |method: &str, n: f64| {
        let t = Instant::now();
        while open_streams(&etcd, method) != n {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} {method} streams open in etcd, not {n}",
                open_streams(&etcd, method)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until("LeaseKeepAlive", 0.0);
    until("Watch", f64::from(nodes - 1));
    // The processes gone, etcd holds none.
    drop(coords);
    until("Watch", 0.0);
}

#[test]
fn over_tls_a_refused_password_is_unauthorized_and_an_expired_token_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    strata::peer::tls::make_certs(&certs, &["etcd".into()], &[], &[]).unwrap();
    // Tokens that lapse after a second unused.
    let Some(etcd) = etcd::Etcd::start_tls_with_plain(
        &certs.join("etcd.pem"),
        &certs.join("etcd.key"),
        &["--auth-token-ttl", "1"],
    ) else {
        return;
    };
    etcd.enable_auth("s3cret");
    let as_user = |password: &str| EtcdOptions {
        endpoints: vec![etcd.url.clone()],
        ca_file: Some(certs.join("ca.pem")),
        user: Some(("root".into(), password.into())),
        // Renewals every 20 s: none in the pause below uses the token.
        lease_ttl: Duration::from_secs(60),
        ..EtcdOptions::default()
    };
    // etcd refuses the password in the answer's trailers, over TLS.
    let e = EtcdCoordinator::connect(as_user("nope"), "tls-auth", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(e.to_string().contains("authentication failed"), "{e}");
    let c = EtcdCoordinator::connect(as_user("s3cret"), "tls-auth", 0, 1).unwrap();
    let long = Duration::from_secs(60);
    assert_eq!(c.all_gather(0, "r", vec![1], long).unwrap(), vec![vec![1]]);
    // The token lapses unused; the next round's first call is refused
    // ("invalid auth token"), the client authenticates again and goes on.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.all_gather(0, "r2", vec![2], long).unwrap(), vec![vec![2]]);
    drop(c);
    // Processes of several ranks, each but the decider's following the
    // decisions with a watch kept across rounds: rounds agree before and
    // after every token lapsed.
    let (nodes, per) = (2u32, 2u32);
    let world = nodes * per;
    let coords = connect_nodes(&as_user("s3cret"), "tls-nodes", nodes, per);
    for pause in [0, 3] {
        std::thread::sleep(Duration::from_secs(pause));
        on_every_rank(&coords, |h, rank| rounds_agree(h, rank, world, 3, 8));
    }
}

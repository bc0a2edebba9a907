//! The etcd coordinator against a real etcd server: all-gathers in order,
//! old rounds cleaned up, a rank claimed twice is an error on both
//! processes, a rank killed with SIGKILL is seen within its lease (not at
//! the timeout), also one killed before the first round, a rank that never came is named at the timeout, a
//! decider whose lease expired fails its round at once,
//! etcd's authentication is used when configured, and a rank that starts
//! before etcd answers waits for it (a request's time limit).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use strata_testkit::etcd;

use std::time::{Duration, Instant};

use strata::{Coordinator, Error, ErrorKind, EtcdCoordinator, EtcdOptions};

fn opts(url: &str) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![url.to_string()],
        lease_ttl: Duration::from_secs(2),
        ..EtcdOptions::default()
    }
}

const LONG: Duration = Duration::from_secs(60);

#[test]
fn ranks_gather_in_rank_order_and_old_rounds_are_removed() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let world = 3;
    let coords: Vec<EtcdCoordinator> = (0..world)
        .map(|r| EtcdCoordinator::connect(opts(&etcd.url), "gather", r, world).unwrap())
        .collect();
    let members = coords[0].members().unwrap();
    assert_eq!(members.len(), 3);
    // Each claim names its host and process.
    let pid = format!(" pid={} ", std::process::id());
    assert!(
        members
            .values()
            .all(|m| m.starts_with("host=") && m.contains(&pid)),
        "{members:?}"
    );
    std::thread::scope(|s| {
        for c in &coords {
            s.spawn(move || {
                let me = (0..world)
                    .find(|&r| c.all_gather(r, "probe", vec![], LONG).is_ok())
                    .unwrap();
                // Keys that nest ("k/1" and "k/1/x") are separate rounds.
                for round in ["k/1", "k/1/x", "k/2", "k/3"] {
                    let got = c
                        .all_gather(me, round, format!("{round}@{me}").into_bytes(), LONG)
                        .unwrap();
                    let want: Vec<Vec<u8>> = (0..world)
                        .map(|r| format!("{round}@{r}").into_bytes())
                        .collect();
                    assert_eq!(got, want, "{round}");
                }
            });
        }
    });
    // Only the last round's values are left (each rank deletes its value
    // of a round once the next one is complete), plus the claims.
    let keys = coords[0].keys().unwrap();
    let rounds: Vec<&String> = keys.iter().filter(|k| k.contains("/rounds/")).collect();
    assert_eq!(rounds.len(), 3, "{keys:?}");
    assert!(rounds.iter().all(|k| k.contains("k%2F3")), "{rounds:?}");
    // A rank that ends leaves its claim marked exited (a slower rank may
    // still read its last value); a new process takes the rank at once.
    drop(coords);
    let c = EtcdCoordinator::connect(opts(&etcd.url), "gather", 0, world).unwrap();
    let m = c.members().unwrap();
    assert!(!m[&0].contains("exited"), "{m:?}");
    assert!(
        m[&1].contains("exited") && m[&2].contains("exited"),
        "{m:?}"
    );
    // The new rank 0 never uses the ended ranks' values of a round with
    // the same key (they belong to an earlier incarnation of the job): it
    // waits for ranks 1 and 2 to come back.
    let e = c
        .all_gather(0, "k/3", vec![], Duration::from_secs(1))
        .unwrap_err();
    assert!(e.to_string().contains("only 1 of 3"), "{e}");
}

#[test]
fn a_rank_claimed_twice_is_an_error_on_both_processes() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let first = EtcdCoordinator::connect(opts(&etcd.url), "twice", 1, 2).unwrap();
    let e = EtcdCoordinator::connect(opts(&etcd.url), "twice", 1, 2).unwrap_err();
    assert!(matches!(e, Error::RankClaimed { rank: 1, .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(e.to_string().contains("pid="), "names the holder: {e}");
    // The holder learns of it at its next keep-alive (a third of the TTL).
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match first.all_gather(1, "after", vec![], Duration::from_millis(200)) {
            Err(e @ Error::RankClaimed { .. }) => break e,
            _ => assert!(Instant::now() < deadline, "the holder never learned"),
        }
    };
    assert!(e.to_string().contains("another process"), "{e}");
    // The other rank of the job is unaffected.
    EtcdCoordinator::connect(opts(&etcd.url), "twice", 0, 2).unwrap();
}

#[test]
fn a_rank_that_never_came_is_named_at_the_timeout() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let c = EtcdCoordinator::connect(opts(&etcd.url), "lonely", 0, 2).unwrap();
    let t = Instant::now();
    let e = c
        .all_gather(0, "commit/lonely/1", vec![1], Duration::from_secs(1))
        .unwrap_err();
    assert!(t.elapsed() >= Duration::from_secs(1));
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    let msg = e.to_string();
    assert!(msg.contains("only 1 of 2") && msg.contains("[1]"), "{msg}");
    // A coordinator serves only its own rank: a caller's mistake, at once.
    let t = Instant::now();
    let e = c.all_gather(1, "x", vec![], LONG).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("holds rank 0, not 1"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// Child side of the kill test: holds rank 1, joins one round, then
/// waits to be killed.
#[test]
fn child_rank_for_the_kill_test() {
    let Ok(url) = std::env::var("STRATA_TEST_ETCD_CHILD") else {
        return; // only runs as the child of the test below
    };
    let c = EtcdCoordinator::connect(opts(&url), "killed", 1, 2).unwrap();
    c.all_gather(1, "first", vec![1], LONG).unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

/// Child side of the early-death tests: claims rank 1 of job
/// `STRATA_TEST_ETCD_JOB`, says so on stdout, then waits to be killed
/// (it never joins a round).
#[test]
fn child_rank_that_only_connects() {
    let (Ok(url), Ok(job)) = (
        std::env::var("STRATA_TEST_ETCD_EARLY"),
        std::env::var("STRATA_TEST_ETCD_JOB"),
    ) else {
        return; // only runs as the child of the tests below
    };
    let _c = EtcdCoordinator::connect(opts(&url), &job, 1, 2).unwrap();
    println!("connected");
    std::thread::sleep(Duration::from_secs(120));
}

/// Starts [`child_rank_that_only_connects`] for `job`, waits until it
/// holds rank 1, kills it (SIGKILL) and returns once it is gone.
fn a_child_connects_and_is_killed(url: &str, job: &str) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_rank_that_only_connects", "--nocapture"])
        .env("STRATA_TEST_ETCD_EARLY", url)
        .env("STRATA_TEST_ETCD_JOB", job)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let connected = out
        .lines()
        .any(|l| l.is_ok_and(|l| l.contains("connected")));
    assert!(connected, "the child never connected");
    child.kill().unwrap(); // SIGKILL: its claim stays until its lease ends
    child.wait().unwrap();
}

/// A rank that claimed its place (after this process did) and died before
/// the first round read the claims: its claim is gone by then, and this
/// process never saw it live. It left all the same, and the round fails
/// within the lease, not at the timeout, in an all-gather (every rank
/// counts) and in a reduce (the decider counts, as a commit's vote does).
#[test]
fn a_rank_killed_before_the_first_round_is_seen_as_left_not_at_the_timeout() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // An all-gather (every rank counts) or a reduce (the decider counts,
    // as a commit's vote does).
    let round_fails_early = |me: &EtcdCoordinator, reduce: bool| {
        // Until the killed rank's claim is gone (its lease is 2 s): the
        // round then finds no claim of it, only its history.
        let gone = Instant::now() + Duration::from_secs(20);
        while me.members().unwrap().contains_key(&1) {
            assert!(Instant::now() < gone, "the killed rank's claim stayed");
            std::thread::sleep(Duration::from_millis(100));
        }
        let t = Instant::now();
        let within = Duration::from_secs(30);
        let first = |v: &[Vec<u8>]| v.concat();
        let e = if reduce {
            me.all_reduce(0, "first", vec![0], within, &first)
        } else {
            me.all_gather(0, "first", vec![0], within)
                .map(|v| v.concat())
        }
        .unwrap_err();
        let took = t.elapsed();
        assert!(e.to_string().contains("left"), "{e}");
        assert!(e.to_string().contains("[1]"), "{e}");
        assert!(took < Duration::from_secs(10), "seen after {took:?}");
    };
    for reduce in [false, true] {
        let job = format!("early-{}", if reduce { "reduce" } else { "gather" });
        let me = EtcdCoordinator::connect(opts(&etcd.url), &job, 0, 2).unwrap();
        a_child_connects_and_is_killed(&etcd.url, &job);
        round_fails_early(&me, reduce);
    }
}

#[test]
fn a_rank_killed_with_sigkill_is_seen_within_its_lease_not_the_timeout() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let me = EtcdCoordinator::connect(opts(&etcd.url), "killed", 0, 2).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_rank_for_the_kill_test", "--nocapture"])
        .env("STRATA_TEST_ETCD_CHILD", &etcd.url)
        .spawn()
        .unwrap();
    me.all_gather(0, "first", vec![0], LONG).unwrap();
    assert_eq!(me.members().unwrap().len(), 2);
    child.kill().unwrap(); // SIGKILL: no clean-up of its own
    child.wait().unwrap();
    let t = Instant::now();
    let e = me.all_gather(0, "second", vec![0], LONG).unwrap_err();
    let took = t.elapsed();
    assert!(e.to_string().contains("left"), "{e}");
    // The lease is 2 s; the timeout 60 s.
    assert!(took < Duration::from_secs(10), "seen after {took:?}");
    assert!(me.members().unwrap().keys().eq([0].iter()));
}

#[test]
fn etcd_authentication_is_used_when_configured() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    etcd.enable_auth("s3cret");
    let e = EtcdCoordinator::connect(opts(&etcd.url), "auth", 0, 1).unwrap_err();
    assert!(
        e.to_string().to_lowercase().contains("user"),
        "refused without credentials: {e}"
    );
    // The test's etcd speaks plain HTTP on loopback.
    let wrong = EtcdOptions {
        user: Some(("root".into(), "nope".into())),
        allow_plaintext_auth: true,
        ..opts(&etcd.url)
    };
    // Refused by etcd's authentication, not by anything else: the kind
    // says fix the credentials, not retry later.
    let e = EtcdCoordinator::connect(wrong, "auth", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("authentication failed"), "{e}");
    assert!(!msg.contains("nope"), "the password is never printed: {e}");
    let right = EtcdOptions {
        user: Some(("root".into(), "s3cret".into())),
        allow_plaintext_auth: true,
        ..opts(&etcd.url)
    };
    let c = EtcdCoordinator::connect(right, "auth", 0, 1).unwrap();
    assert_eq!(c.all_gather(0, "r", vec![7], LONG).unwrap(), vec![vec![7]]);
}

#[test]
fn etcd_over_https_needs_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    strata::peer::tls::make_certs(&certs, &["etcd".into()], &[], &["tls".into()]).unwrap();
    let Some(etcd) = etcd::Etcd::start_tls(&certs.join("etcd.pem"), &certs.join("etcd.key"), None)
    else {
        return;
    };
    assert!(etcd.url.starts_with("https://"));
    // Without the CA the server's certificate is not trusted.
    let e = EtcdCoordinator::connect(opts(&etcd.url), "tls", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let with_ca = EtcdOptions {
        ca_file: Some(certs.join("ca.pem")),
        ..opts(&etcd.url)
    };
    let c = EtcdCoordinator::connect(with_ca, "tls", 0, 1).unwrap();
    assert_eq!(c.all_gather(0, "r", vec![3], LONG).unwrap(), vec![vec![3]]);
    // A CA file that is not PEM trusts nothing: a configuration error
    // naming the file, before any connection is tried.
    std::fs::write(dir.path().join("bad.pem"), b"not a certificate").unwrap();
    let bad = EtcdOptions {
        ca_file: Some(dir.path().join("bad.pem")),
        ..opts(&etcd.url)
    };
    let e = EtcdCoordinator::connect(bad, "tls", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.to_string().contains("bad.pem"), "{e}");
}

#[test]
fn etcd_requiring_client_certificates_takes_the_jobs_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    strata::peer::tls::make_certs(&certs, &["etcd".into()], &[], &["mtls".into()]).unwrap();
    let ca = certs.join("ca.pem");
    let Some(etcd) =
        etcd::Etcd::start_tls(&certs.join("etcd.pem"), &certs.join("etcd.key"), Some(&ca))
    else {
        return;
    };
    // The CA alone is not enough: etcd wants a client certificate.
    let no_cert = EtcdOptions {
        ca_file: Some(ca.clone()),
        ..opts(&etcd.url)
    };
    // (Refused in the TLS handshake, which the client reports as an
    // unreachable server: Unavailable.)
    let e = EtcdCoordinator::connect(no_cert, "mtls", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let mutual = EtcdOptions {
        ca_file: Some(ca),
        cert_file: Some(certs.join("client-mtls.pem")),
        key_file: Some(certs.join("client-mtls.key")),
        ..opts(&etcd.url)
    };
    let c = EtcdCoordinator::connect(mutual, "mtls", 0, 1).unwrap();
    assert_eq!(c.all_gather(0, "r", vec![5], LONG).unwrap(), vec![vec![5]]);
}

#[test]
fn a_failed_round_leaves_nothing_behind_and_a_repeat_is_a_new_round() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let a = EtcdCoordinator::connect(opts(&etcd.url), "again", 0, 2).unwrap();
    let b = EtcdCoordinator::connect(opts(&etcd.url), "again", 1, 2).unwrap();
    let short = Duration::from_millis(500);
    // Rank 0 alone: fails. Rank 1 alone afterwards: fails too, rank 0's
    // value of the failed round is gone (it must not commit alone).
    let e = a
        .all_gather(0, "commit/again/5", b"old".to_vec(), short)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("only 1 of 2"), "{e}");
    let e = b
        .all_gather(1, "commit/again/5", b"b1".to_vec(), short)
        .unwrap_err();
    assert!(e.to_string().contains("only 1 of 2"), "{e}");
    // Both call the key again: a new round, with only the new values.
    let got = std::thread::scope(|s| {
        let ha = s.spawn(|| a.all_gather(0, "commit/again/5", b"a2".to_vec(), LONG));
        let hb = s.spawn(|| b.all_gather(1, "commit/again/5", b"b2".to_vec(), LONG));
        (ha.join().unwrap().unwrap(), hb.join().unwrap().unwrap())
    });
    assert_eq!(got.0, vec![b"a2".to_vec(), b"b2".to_vec()]);
    assert_eq!(got.0, got.1);
}

#[test]
fn rounds_of_different_starts_of_the_job_never_meet() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    let start = |i: &str| EtcdOptions {
        incarnation: Some(i.into()),
        ..opts(&etcd.url)
    };
    // Start 0 completes a round; its rank 0 ends, its rank 1 is still
    // ending (alive) when start 1's rank 0 comes up and calls the key.
    let old0 = EtcdCoordinator::connect(start("0"), "starts", 0, 2).unwrap();
    let old1 = EtcdCoordinator::connect(start("0"), "starts", 1, 2).unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| old1.all_gather(1, "restore/starts/0", b"old1".to_vec(), LONG));
        old0.all_gather(0, "restore/starts/0", b"old0".to_vec(), LONG)
            .unwrap();
        h.join().unwrap().unwrap();
    });
    drop(old0);
    let new0 = EtcdCoordinator::connect(start("1"), "starts", 0, 2).unwrap();
    // Rank 1's holder is still start 0's process, with a value under the
    // same key: it is not start 1's, so the round does not complete.
    let e = new0
        .all_gather(
            0,
            "restore/starts/0",
            b"new0".to_vec(),
            Duration::from_millis(800),
        )
        .unwrap_err();
    assert!(e.to_string().contains("only 1 of 2"), "{e}");
    drop(old1);
}

#[test]
fn a_process_whose_claim_lapsed_while_waiting_never_completes_the_round() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // A long lease: its keep-alive (every 20 s) does not notice the loss
    // during the test; only the round's own check can.
    let slow = EtcdOptions {
        lease_ttl: Duration::from_secs(60),
        ..opts(&etcd.url)
    };
    let a = EtcdCoordinator::connect(slow, "fence", 0, 2).unwrap();
    let b = EtcdCoordinator::connect(opts(&etcd.url), "fence", 1, 2).unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| a.all_gather(0, "commit/fence/7", b"stale".to_vec(), LONG));
        std::thread::sleep(Duration::from_millis(500));
        // Rank 0's claim lapses; a new process takes rank 0 and votes.
        etcd.revoke_claim("fence", 0);
        let a2 = EtcdCoordinator::connect(opts(&etcd.url), "fence", 0, 2).unwrap();
        let h2 = s.spawn(move || {
            let got = a2.all_gather(0, "commit/fence/7", b"new".to_vec(), LONG);
            (got, a2)
        });
        let got_b = b
            .all_gather(1, "commit/fence/7", b"b".to_vec(), LONG)
            .unwrap();
        assert_eq!(got_b, vec![b"new".to_vec(), b"b".to_vec()]);
        let (got2, _a2) = h2.join().unwrap();
        assert_eq!(got2.unwrap(), got_b);
        // The stale process must not complete the round with its
        // replacement's vote (it would then commit its own manifest).
        let e = waiting.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::RankClaimed { rank: 0, .. }), "{e}");
        assert_eq!(e.kind(), ErrorKind::Conflict);
        // And every later call of it fails the same way.
        let e = a
            .all_gather(0, "commit/fence/8", b"x".to_vec(), Duration::from_secs(2))
            .unwrap_err();
        assert!(matches!(e, Error::RankClaimed { .. }), "{e}");
    });
}

#[test]
fn a_decider_whose_lease_expired_fails_its_round_at_once_not_at_the_timeout() {
    let Some(etcd) = etcd::Etcd::start() else {
        return;
    };
    // Rank 1 is there but never votes: rank 0 (the decider) waits for it.
    let a = EtcdCoordinator::connect(opts(&etcd.url), "lapse", 0, 2).unwrap();
    let _b = EtcdCoordinator::connect(opts(&etcd.url), "lapse", 1, 2).unwrap();
    let reduce = |v: &[Vec<u8>]| v.concat();
    std::thread::scope(|s| {
        let started = Instant::now();
        let waiting = s.spawn(|| a.all_reduce(0, "commit/lapse/1", vec![1], LONG, &reduce));
        std::thread::sleep(Duration::from_millis(100));
        // Its lease goes (etcd starved of its keep-alives, a partition):
        // its keep-alive learns it within a third of the lease.
        etcd.revoke_claim("lapse", 0);
        let e = waiting.join().unwrap().unwrap_err();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "the round held on for {took:?} (its timeout is {LONG:?}): {e}"
        );
        assert!(
            e.to_string().contains("lease expired") || matches!(e, Error::RankClaimed { .. }),
            "{e}"
        );
    });
}

#[test]
fn a_rank_that_starts_before_etcd_answers_waits_for_it() {
    let Some(mut etcd) = etcd::Etcd::start() else {
        return;
    };
    let url = etcd.url.clone();
    // etcd down for 2 s (killed, then started again on its ports) while
    // a rank connects: its first contact is refused, then answered.
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| etcd.restart(Duration::from_secs(2)));
        std::thread::sleep(Duration::from_millis(300));
        let c = EtcdCoordinator::connect(opts(&url), "early", 0, 1).unwrap();
        assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(c.all_gather(0, "r", vec![3], LONG).unwrap(), vec![vec![3]]);
    });
    // Nothing listening at all: still an error, once a request's time
    // limit (here 1 s) has passed, that says so.
    let dead = EtcdOptions {
        request_timeout: Duration::from_secs(1),
        ..opts("http://127.0.0.1:1")
    };
    let t = Instant::now();
    let e = EtcdCoordinator::connect(dead, "early", 0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("Connection refused"), "{e}");
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

//! The training process's `/metrics` (`metrics_listen`), scraped over
//! HTTP as Prometheus would: saves, their stall and time to durable, bytes
//! written and deduplicated, restores and the tier that served them,
//! errors by kind, every series labelled with the job, rank and node; a
//! client that sends nothing does not hold the endpoint; closing the
//! checkpointer closes it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use strata::format::DType;
use strata::{Checkpointer, Config, Entry, ErrorKind, StepSelector};

/// One GET: the status line and the body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: strata\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the one sample named `name` whose labels contain every
/// one of `labels`.
fn value(body: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{')?;
            (n == name && labels.iter().all(|x| rest.contains(x))).then(|| v.parse().unwrap())
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in\n{body}");
    found[0]
}

fn state(step: u64) -> (Vec<u8>, Vec<u8>) {
    // No two chunks alike. The first tensor changes every other step (the
    // next save finds its chunks on L1 already); the second every step.
    let bytes = |n: u32, salt: u64| -> Vec<u8> {
        (0..n)
            .map(|i| (((u64::from(i) + 1) ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect()
    };
    (
        bytes(1 << 17, (step / 2) << 40),
        bytes(1 << 16, (step << 40) | 1 << 63),
    )
}

fn save(ck: &Checkpointer, step: u64) {
    let (a, b) = state(step);
    let (sa, sb) = ([a.len() as u64], [b.len() as u64]);
    ck.save(
        step,
        &[
            Entry::tensor("a", DType::U8, &sa, &a),
            Entry::tensor("b", DType::U8, &sb, &b),
        ],
    )
    .unwrap()
    .wait()
    .unwrap();
}

#[test]
fn a_scrape_reports_saves_restores_and_errors_labelled_with_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::builder()
        .job("metered")
        .l1_dir(dir.path())
        .chunk_size(1 << 16);
    cfg.node = "node-7".into();
    cfg.metrics_listen = Some("127.0.0.1:0".into());
    let ck = Checkpointer::new(cfg).unwrap();
    let addr = ck.metrics_addr().expect("served");
    assert_ne!(addr.port(), 0, "the port chosen");

    // Before anything: zeros, well formed.
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let me = ["job=\"metered\"", "rank=\"0\"", "node=\"node-7\""];
    assert_eq!(value(&body, "strata_saves_total", &me), 0.0);

    for step in 1..=3 {
        save(&ck, step);
    }
    let back = ck.restore(StepSelector::Step(3)).unwrap();
    assert_eq!(back.stats.bytes_from_l3 + back.stats.bytes_from_l2, 0);
    let missing = ck.restore(StepSelector::Step(99)).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);

    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    // Every sample line is `name{labels} number`, with this rank's labels.
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let (series, v) = l.rsplit_once(' ').unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
        assert!(me.iter().all(|x| series.contains(x)), "{l}");
    }
    assert_eq!(value(&body, "strata_saves_total", &me), 3.0);
    assert_eq!(value(&body, "strata_saves_failed_total", &me), 0.0);
    assert_eq!(value(&body, "strata_save_stall_seconds_count", &me), 3.0);
    assert_eq!(
        value(
            &body,
            "strata_save_durable_seconds_bucket",
            &["le=\"+Inf\""]
        ),
        3.0
    );
    assert!(value(&body, "strata_save_durable_seconds_sum", &me) > 0.0);
    let written = value(&body, "strata_save_bytes_written_total", &me);
    let deduped = value(&body, "strata_save_bytes_deduplicated_total", &me);
    // Step 1 wrote both tensors; steps 2 and 3 found one of them on L1.
    assert!(
        written >= (3 << 16) as f64 && deduped >= (1 << 17) as f64,
        "{written} {deduped}"
    );
    assert_eq!(value(&body, "strata_last_committed_step", &me), 3.0);
    assert_eq!(value(&body, "strata_restores_total", &me), 1.0);
    assert_eq!(value(&body, "strata_restores_failed_total", &me), 1.0);
    assert_eq!(
        value(&body, "strata_restore_bytes_total", &["tier=\"l1\""]),
        ((1 << 17) + (1 << 16)) as f64
    );
    assert_eq!(
        value(&body, "strata_restore_bytes_total", &["tier=\"l3\""]),
        0.0
    );
    assert_eq!(
        value(
            &body,
            "strata_errors_total",
            &["op=\"restore\"", "kind=\"not_found\""]
        ),
        1.0
    );
    assert_eq!(
        value(
            &body,
            "strata_errors_total",
            &["op=\"save\"", "kind=\"not_found\""]
        ),
        0.0
    );
    // No L3, no peers: nothing waits.
    assert_eq!(
        value(&body, "strata_upload_steps", &["state=\"queued\""]),
        0.0
    );
    assert_eq!(
        value(&body, "strata_replication_steps", &["state=\"degraded\""]),
        0.0
    );
    // The same text without HTTP.
    assert!(ck
        .metrics_text()
        .contains("strata_saves_total{job=\"metered\""));

    // Only /metrics; a client that sends nothing, or one byte at a time
    // under each read's timeout, holds the endpoint 2 s at most.
    assert_eq!(get(addr, "/other").0, "HTTP/1.1 404 Not Found");
    let idle = TcpStream::connect(addr).unwrap();
    let t = Instant::now();
    assert_eq!(get(addr, "/metrics").0, "HTTP/1.1 200 OK");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    drop(idle);
    let trickle = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for _ in 0..16 {
            if s.write_all(b"G").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(get(addr, "/metrics").0, "HTTP/1.1 200 OK");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    trickle.join().unwrap();

    // Closing the checkpointer closes the endpoint, a client connected
    // or not.
    let _lingering = TcpStream::connect(addr).unwrap();
    let t = Instant::now();
    ck.close().unwrap();
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let refused = TcpStream::connect_timeout(&addr, Duration::from_secs(2));
    assert!(refused.is_err(), "still listening after close");
}

#[test]
fn an_address_that_cannot_be_bound_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for listen in [
        "not-an-address".to_string(),
        taken.local_addr().unwrap().to_string(),
    ] {
        let mut cfg = Config::builder().job("metered").l1_dir(dir.path());
        cfg.metrics_listen = Some(listen.clone());
        let e = Checkpointer::new(cfg).err().expect("refused");
        assert_eq!(e.kind(), ErrorKind::Invalid, "{listen}");
        assert!(e.to_string().contains("metrics_listen"), "{e}");
    }
    // Nothing of the refused ones is left holding the directory's job.
    let ok = Checkpointer::new(Config::builder().job("metered").l1_dir(dir.path())).unwrap();
    ok.close().unwrap();
}

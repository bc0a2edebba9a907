//! A hostile authenticated client against a real `strata peer serve`
//! process with small budgets: many connections and streams of ranged
//! reads of spilled chunks, compressed puts that decode to the largest
//! chunk, large commit records and empty manifests. The service's resident
//! memory stays under its configured budgets plus a stated constant, and
//! another job's puts and reads keep working meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/peer_proc.rs"]
mod peer_proc;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_format::codec::{ElemHint, EncodeOptions};
use strata_format::{ChunkId, CommitRecord, ShardRef};
use strata_peer::tls::{make_certs, CertFiles};
use strata_peer::{PeerOptions, PeerStore};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, StoreErrorKind};

const MIB: u64 = 1 << 20;
/// The service's budgets (MiB), as passed on its command line.
const MEMORY: u64 = 32;
const INFLIGHT: u64 = 64;
const WORK: u64 = 64;
const MANIFESTS: u64 = 8;
/// What the process holds besides its budgets and its connections'
/// windows: its code, its runtime, TLS and QUIC state, allocator slack.
const CONSTANT: u64 = 96;
/// The largest request the service takes (`--max-chunk` and an envelope).
const MAX_REQUEST: u64 = 16 * MIB + 8192;
/// What QUIC may buffer per connection (docs/protocol.md): request bytes
/// and answers, each up to the connection's share of `--inflight` (a
/// quarter, at least one largest request).
const WINDOW: u64 = 2 * MAX_REQUEST.div_ceil(1024) * 1024;
/// Connections the test opens: 16 hostile, 1 well-behaved.
const CONNECTIONS: u64 = 17;
const BIG: usize = 16 << 20;

struct Server {
    child: Child,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `strata peer serve` on loopback with its certificates in `dir`, and
/// `args` (budgets, metrics).
fn serve_with(dir: &std::path::Path, args: &[String], stderr: Stdio) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "peer",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--node",
            "node-a",
        ])
        .args(args)
        .arg("--certs")
        .arg(dir)
        .arg("--spill")
        .arg(dir.join("spill"))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let (addr, metrics) = peer_proc::listening(&mut child);
    Server {
        child,
        addr,
        metrics,
    }
}

/// The service with the small budgets the hostile test holds it to.
fn serve(dir: &std::path::Path) -> Server {
    let args: Vec<String> = [
        "--memory".into(),
        format!("{MEMORY}MiB"),
        "--disk".into(),
        "256MiB".into(),
        "--inflight".into(),
        format!("{INFLIGHT}MiB"),
        "--work".into(),
        format!("{WORK}MiB"),
        "--manifest-memory".into(),
        format!("{MANIFESTS}MiB"),
        "--max-chunk".into(),
        "16MiB".into(),
        "--job-quota".into(),
        "200MiB".into(),
        "--job-manifest-quota".into(),
        "4MiB".into(),
    ]
    .to_vec();
    serve_with(dir, &args, Stdio::null())
}

/// Resident and peak resident memory of `pid`, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

fn client(addr: SocketAddr, dir: &std::path::Path, job: &str, codec: EncodeOptions) -> PeerStore {
    let certs = CertFiles::in_dir(dir, &format!("client-{job}"));
    PeerStore::new(
        addr,
        "node-a",
        &certs,
        PeerOptions {
            concurrency: 16,
            codec,
        },
    )
    .unwrap()
}

/// A `BIG`-byte chunk that compresses to almost nothing.
fn bomb(i: u32) -> ChunkPut {
    let mut d = vec![0u8; BIG];
    d[..4].copy_from_slice(&i.to_le_bytes());
    ChunkPut {
        id: ChunkId::of(&d),
        hint: ElemHint::BYTES,
        data: ChunkData::copy_from(&d),
    }
}

fn record(job: &str, step: u64, ranks: u32) -> CommitRecord {
    CommitRecord {
        job: job.into(),
        step,
        world_size: ranks,
        committed_unix_ms: 1,
        shards: (0..ranks)
            .map(|rank| ShardRef {
                rank,
                manifest: ChunkId::of(&rank.to_le_bytes()),
                logical_bytes: 1,
            })
            .collect(),
    }
}

#[test]
fn a_hostile_client_cannot_grow_the_service_past_its_budgets() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(
        dir.path(),
        &["node-a".into()],
        &[],
        &["evil".into(), "good".into()],
    )
    .unwrap();
    let server = serve(dir.path());
    let pid = server.child.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    std::thread::sleep(Duration::from_millis(300));
    let (idle, _) = rss(pid);
    // Request buffers come in size classes up to 1/32 larger than their
    // bytes (peer/src/service/arena.rs).
    let pooled = (MEMORY + INFLIGHT) * MIB / 32;
    let bound = idle
        + (MEMORY + INFLIGHT + WORK + MANIFESTS + CONSTANT) * MIB
        + pooled
        + CONNECTIONS * WINDOW;

    // Fill memory and spill: 12 chunks of 16 MiB, most of them spilled.
    let evil: Vec<Arc<PeerStore>> = (0..16)
        .map(|_| Arc::new(client(server.addr, dir.path(), "evil", EncodeOptions::ZSTD)))
        .collect();
    let stored: Vec<ChunkId> = (0..12u32).map(|i| bomb(i).id).collect();
    rt.block_on(async {
        for i in 0..12u32 {
            evil[0].put_chunks("evil", vec![bomb(i)]).await.unwrap();
        }
    });

    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss(pid).0, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let attacks = Arc::new(AtomicU64::new(0));
    // Every hostile request's outcome, by request: "ok" or its error kind.
    let tally: Arc<Mutex<BTreeMap<(&'static str, String), u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for (n, s) in evil.iter().enumerate() {
        for k in 0..16u64 {
            let (s, stored, attacks, tally) =
                (s.clone(), stored.clone(), attacks.clone(), tally.clone());
            tasks.push(rt.spawn(async move {
                let mut i = n as u64 * 16 + k;
                let count = |what: &'static str, r: Result<(), strata_tiered::StoreError>| {
                    let how = r.map_or_else(|e| format!("{:?}", e.kind()), |()| "ok".into());
                    *tally.lock().unwrap().entry((what, how)).or_insert(0) += 1;
                };
                while Instant::now() < deadline {
                    i += 1;
                    match i % 4 {
                        // A ranged read of a whole spilled chunk: when it
                        // is answered, with the chunk's very bytes.
                        0 | 1 => {
                            let j = i as usize % stored.len();
                            let r = s
                                .get_chunk("evil", &stored[j], Some(0..BIG as u32))
                                .await
                                .map(|d| {
                                    let want = bomb(j as u32);
                                    assert!(
                                        d.as_slice() == want.data.as_slice(),
                                        "a ranged read of chunk {j} gave other bytes"
                                    );
                                });
                            count("ranged read", r);
                        }
                        // A put that decodes to 16 MiB.
                        2 => count(
                            "bomb put",
                            s.put_chunks("evil", vec![bomb(1000 + i as u32)])
                                .await
                                .map(|_| ()),
                        ),
                        // A large record, and empty manifests.
                        _ => {
                            count(
                                "empty manifest",
                                s.put_manifest("evil", i, (i % 5000) as u32, &[]).await,
                            );
                            count(
                                "large record",
                                s.commit(&record("evil", 1_000_000 + i, 30_000)).await,
                            );
                        }
                    }
                    attacks.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }

    // Meanwhile another job's puts and reads keep working.
    let good = client(server.addr, dir.path(), "good", EncodeOptions::RAW);
    let mut rounds = 0;
    rt.block_on(async {
        while Instant::now() < deadline {
            let data: Vec<Vec<u8>> = (0..4u8)
                .map(|j| vec![rounds as u8 ^ j.wrapping_mul(77); 1 << 20])
                .collect();
            let puts: Vec<ChunkPut> = data
                .iter()
                .map(|d| ChunkPut {
                    id: ChunkId::of(d),
                    hint: ElemHint::BYTES,
                    data: ChunkData::copy_from(d),
                })
                .collect();
            let ids: Vec<ChunkId> = puts.iter().map(|p| p.id).collect();
            good.put_chunks("good", puts).await.unwrap();
            for (id, d) in ids.iter().zip(&data) {
                let got = good.get_chunk("good", id, None).await.unwrap();
                assert!(got.as_slice() == d.as_slice());
            }
            good.put_manifest("good", rounds, 0, b"m").await.unwrap();
            rounds += 1;
        }
    });
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let (_, hwm) = rss(pid);
    let peak = peak.load(Ordering::Relaxed).max(hwm);
    eprintln!(
        "idle RSS {} MiB, peak RSS {} MiB, bound {} MiB; {} hostile requests, {rounds} good rounds",
        idle / MIB,
        peak / MIB,
        bound / MIB,
        attacks.load(Ordering::Relaxed)
    );
    let tally = tally.lock().unwrap().clone();
    eprintln!("hostile outcomes: {tally:?}");
    check_outcomes(&tally);
    assert!(rounds >= 3, "the good job made {rounds} rounds");
    assert!(attacks.load(Ordering::Relaxed) > 100);
    assert!(
        peak <= bound,
        "peak RSS {} MiB over the bound {} MiB",
        peak / MIB,
        bound / MIB
    );
}

/// Connections refused in their handshake (a certificate from another CA)
/// are all counted on `/metrics`, but logged at most once a second: a
/// flood of junk cannot flood the log.
#[test]
fn refused_connections_are_counted_and_their_log_is_rate_limited() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), &["node-a".into()], &[], &["good".into()]).unwrap();
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path(), &["node-a".into()], &[], &["good".into()]).unwrap();
    // With metrics, whose address is on the same first line.
    let mut server = serve_with(
        dir.path(),
        &["--metrics".into(), "127.0.0.1:0".into()],
        Stdio::piped(),
    );
    let metrics = server.metrics.expect("metrics address");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let foreign =
        strata_peer::tls::client_config(&CertFiles::in_dir(other.path(), "client-good"), 8)
            .unwrap();
    const N: u64 = 200;
    let t0 = Instant::now();
    rt.block_on(async {
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(foreign);
        for _ in 0..N {
            let r = ep.connect(server.addr, "node-a").unwrap().await;
            assert!(r.is_err(), "a certificate of another CA was accepted");
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    // The counter sees every one (the last refusals may still be landing).
    let mut refused = 0;
    for _ in 0..50 {
        let mut s = std::net::TcpStream::connect(metrics).unwrap();
        use std::io::Write;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        refused = text
            .lines()
            .find(|l| l.starts_with("strata_peer_refused_connections_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if refused >= N {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(refused, N);
    let _ = server.child.kill();
    let mut log = String::new();
    server
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let lines = log
        .lines()
        .filter(|l| l.contains("connection refused"))
        .count();
    eprintln!("{N} refusals in {secs:.1} s: {lines} log lines");
    assert!(lines >= 1, "{log}");
    assert!(
        lines as f64 <= secs + 7.0,
        "{lines} log lines for {N} refusals in {secs:.1} s"
    );
    assert!(log.contains("unlogged_since_last"), "{log}");
}

/// The hostile requests' outcomes: each kind of request was answered (so
/// each attack reached the service), and every refusal has the kind its
/// budget or quota gives (busy, full, over a limit), never a corrupt
/// chunk, a missing one, or an internal error.
fn check_outcomes(tally: &BTreeMap<(&'static str, String), u64>) {
    let allowed: &[(&str, &[StoreErrorKind])] = &[
        ("ranged read", &[StoreErrorKind::Unavailable]),
        (
            "bomb put",
            &[StoreErrorKind::NoSpace, StoreErrorKind::Unavailable],
        ),
        (
            "empty manifest",
            &[StoreErrorKind::NoSpace, StoreErrorKind::Unavailable],
        ),
        (
            "large record",
            &[
                StoreErrorKind::Invalid,
                StoreErrorKind::NoSpace,
                StoreErrorKind::Unavailable,
            ],
        ),
    ];
    for (what, kinds) in allowed {
        let total: u64 = tally
            .iter()
            .filter(|((w, _), _)| w == what)
            .map(|(_, n)| n)
            .sum();
        assert!(total > 0, "no {what} was sent: {tally:?}");
        for ((w, how), n) in tally {
            if w == what && how != "ok" {
                assert!(
                    kinds.iter().any(|k| format!("{k:?}") == *how),
                    "{n} {what}s refused as {how}: {tally:?}"
                );
            }
        }
    }
}

//! `strata peer certs` and `strata peer serve` as real processes on
//! loopback: replicas pushed to two services over QUIC and read back
//! verified; one service killed during a push (the push fails with a typed
//! error, the other replica serves every chunk); `/metrics`; a graceful
//! stop on SIGTERM; a checkpointer's save whose peer is killed mid-push
//! (committed, replicated to the next node of the ring, then degraded);
//! a restore whose peer is killed mid-transfer (completed from the other
//! replica and written back to L1 whole).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/peer_proc.rs"]
mod peer_proc;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use strata_format::codec::ElemHint;
use strata_format::ChunkId;
use strata_peer::tls::CertFiles;
use strata_peer::{PeerOptions, PeerStore};
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, StoreErrorKind};

const JOB: &str = "peer-job";

struct Peer {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(certs: &Path, node: &str) -> Peer {
    serve_with(certs, node, &[])
}

fn serve_with(certs: &Path, node: &str, extra: &[&str]) -> Peer {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["peer", "serve", "--listen", "127.0.0.1:0", "--node", node])
        .args(["--metrics", "127.0.0.1:0", "--memory", "64MiB"])
        .args(extra)
        .arg("--certs")
        .arg(certs)
        .arg("--spill")
        .arg(certs.join(format!("spill-{node}")))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, metrics) = peer_proc::listening(&mut child);
    let metrics = metrics.expect("metrics address");
    Peer {
        child,
        addr,
        metrics,
    }
}

fn chunks(n: usize, len: usize, seed: u8) -> Vec<ChunkPut> {
    (0..n)
        .map(|i| {
            let d: Vec<u8> = (0..len)
                .map(|j| (j as u8).wrapping_mul(31) ^ (i as u8) ^ seed)
                .collect();
            ChunkPut {
                id: ChunkId::of(&d),
                hint: ElemHint::BYTES,
                data: ChunkData::copy_from(&d),
            }
        })
        .collect()
}

/// 96 tensors of 1 MiB (bf16), seeded: names and bytes.
fn state(seed: u8) -> (Vec<String>, Vec<Vec<u8>>) {
    let data: Vec<Vec<u8>> = chunks(96, 1 << 20, seed)
        .into_iter()
        .map(|p| p.data.as_slice().to_vec())
        .collect();
    ((0..data.len()).map(|i| format!("t{i}")).collect(), data)
}

fn as_entries<'a>(names: &'a [String], data: &'a [Vec<u8>]) -> Vec<strata::Entry<'a>> {
    const SHAPE: [u64; 1] = [1 << 19];
    names
        .iter()
        .zip(data)
        .map(|(n, d)| strata::Entry::tensor(n, strata::format::DType::BF16, &SHAPE, d))
        .collect()
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in {text}"))
}

#[test]
fn two_peer_processes_hold_replicas_and_survive_a_killed_peer() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    certs_for(certs, &["node-a", "node-b"]);
    assert!(certs.join("client-peer-job.pem").is_file());

    let mut a = serve(certs, "node-a");
    let b = serve(certs, "node-b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pa, pb) = stores(&rt, certs, &a, &b);
    // Both replicas take the same chunks; a second push sends nothing.
    let first = chunks(8, 1 << 20, 1);
    for p in [&pa, &pb] {
        let st = rt.block_on(p.put_chunks(JOB, first.clone())).unwrap();
        assert_eq!(st.written, 8);
        let again = rt.block_on(p.put_chunks(JOB, first.clone())).unwrap();
        assert_eq!((again.written, again.deduped), (0, 8));
    }
    // Node a dies during a push of more chunks (4 of 48 MiB arrived): a
    // typed error, no hang.
    let more = chunks(48, 1 << 20, 2);
    let before = metric(
        &http_get(a.metrics, "/metrics"),
        "strata_peer_bytes_in_total",
    );
    let push = {
        let more = more.clone();
        rt.spawn(async move { pa.put_chunks(JOB, more).await })
    };
    wait_for_metric(&a, "strata_peer_bytes_in_total", before + (4 << 20));
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    match rt.block_on(push).unwrap() {
        Ok(st) => panic!("a push to a killed peer succeeded: {st:?}"),
        Err(e) => assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}"),
    }
    // The other replica serves every chunk, verified.
    for c in &first {
        let got = rt.block_on(pb.get_chunk(JOB, &c.id, None)).unwrap();
        assert_eq!(got.as_slice(), c.data.as_slice());
    }
    let text = http_get(b.metrics, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(metric(&text, "strata_peer_chunks"), 8);
    assert!(metric(&text, "strata_peer_bytes_held{place=\"memory\"}") >= 8 << 20);
    assert!(metric(&text, "strata_peer_requests_total") >= 10);
    assert!(http_get(b.metrics, "/other").starts_with("HTTP/1.1 404"));

    // SIGTERM: a graceful stop.
    let mut b = b;
    // SAFETY: sending a signal to our own child process by its pid.
    let rc = unsafe { libc::kill(b.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = b.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Two peer processes hold replicas of a step (replicas = 2); the node's
/// disk is lost, and the peer the restore reads from is SIGKILLed while the
/// restore runs: the restore completes from the other replica, verified.
#[test]
fn a_peer_killed_during_a_restore_is_replaced_by_the_other_replica() {
    use strata::{Checkpointer, Config, L2State, StepSelector};
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    certs_for(certs, &["node-a", "node-b", "node-c"]);
    let mut b = serve(certs, "node-b");
    let c = serve(certs, "node-c");
    let l1 = dir.path().join("l1");
    let cfg = Config::builder()
        .job(JOB)
        .l1_dir(&l1)
        .chunk_size(1 << 20)
        .peers(
            "node-a",
            vec![format!("node-b={}", b.addr), format!("node-c={}", c.addr)],
            certs,
        )
        .replicas(2);
    let (names, data) = state(5);
    let entries = as_entries(&names, &data);
    {
        let ck = Checkpointer::new(cfg.clone()).unwrap();
        ck.save(1, &entries).unwrap().wait().unwrap();
        ck.wait_replication();
        match &ck.replication()[&1] {
            L2State::Replicated { peers, .. } => assert_eq!(peers.len(), 2),
            other => panic!("{other:?}"),
        }
    }
    std::fs::remove_dir_all(&l1).unwrap();
    let ck = Checkpointer::new(cfg.clone()).unwrap();
    let sent_before = metric(
        &http_get(b.metrics, "/metrics"),
        "strata_peer_bytes_out_total",
    );
    let restore = std::thread::spawn(move || ck.restore(StepSelector::Latest));
    // node-b is the ring's first peer for rank 0 of node-a: the one read.
    // It is killed once it has sent part of the step (4 of 96 MiB).
    wait_for_metric(&b, "strata_peer_bytes_out_total", sent_before + (4 << 20));
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let got = restore.join().unwrap().unwrap();
    assert_eq!(got.stats.bytes_from_l2, got.stats.bytes_read);
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    // node-c served the rest.
    let from_c = metric(
        &http_get(c.metrics, "/metrics"),
        "strata_peer_bytes_out_total",
    );
    assert!(from_c > 8 << 20, "node-c sent {from_c} bytes");
    // Written back to L1 whole and committed: a node with no peers at all
    // restores it from L1.
    assert!(got.stats.rehydrated);
    drop(c);
    let alone = Config::builder().job(JOB).l1_dir(&l1).chunk_size(1 << 20);
    let local = Checkpointer::new(alone)
        .unwrap()
        .restore(StepSelector::Latest)
        .unwrap();
    assert_eq!(local.stats.bytes_from_l2, 0);
    for (n, d) in names.iter().zip(&data) {
        assert!(&local.get(n).unwrap().bytes == d, "{n}");
    }
}

/// Polls a peer's `/metrics` until `name` reaches `at_least`.
fn wait_for_metric(p: &Peer, name: &str, at_least: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let v = metric(&http_get(p.metrics, "/metrics"), name);
        if v >= at_least {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{name} stayed at {v}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The job's client stores of peers `a` (node-a) and `b` (node-b).
fn stores(
    rt: &tokio::runtime::Runtime,
    certs: &Path,
    a: &Peer,
    b: &Peer,
) -> (PeerStore, PeerStore) {
    let client = CertFiles::in_dir(certs, &format!("client-{JOB}"));
    rt.block_on(async {
        (
            PeerStore::new(a.addr, "node-a", &client, PeerOptions::default()).unwrap(),
            PeerStore::new(b.addr, "node-b", &client, PeerOptions::default()).unwrap(),
        )
    })
}

fn certs_for(dir: &Path, nodes: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
    cmd.args(["peer", "certs"]);
    for n in nodes {
        cmd.args(["--node", n]);
    }
    let out = cmd.args(["--job", JOB, "--out"]).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// `--prefault`: a new service faults in request buffers for the job's
/// chunk size at start (resident, counted free on `/metrics`), and the
/// first push lands in them: no put of it allocates. Without the flag the
/// same push allocates a buffer per chunk.
#[test]
fn a_peer_started_with_prefault_takes_its_first_push_into_memory_already_faulted_in() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    certs_for(certs, &["node-a", "node-b"]);
    const FREE: &str = "strata_peer_buffer_bytes{state=\"free\"}";
    const FRESH: &str = "strata_peer_buffers_total{source=\"fresh\"}";
    const REUSED: &str = "strata_peer_buffers_total{source=\"reused\"}";
    // A put of a 1 MiB chunk is of the class 1 MiB + 32 KiB: 31 fit in
    // 32 MiB.
    let class: u64 = (1 << 20) + (32 << 10);
    let want = (32 << 20) / class * class;
    let a = serve_with(
        certs,
        "node-a",
        &["--prefault", "32MiB", "--prefault-chunk", "1MiB"],
    );
    let b = serve(certs, "node-b");
    wait_for_metric(&a, FREE, want);
    assert_eq!(metric(&http_get(a.metrics, "/metrics"), FREE), want);
    // Against the same service without the flag: the difference is the
    // memory faulted in (a quarter spared for the processes' own noise).
    let (rss_a, rss_b) = (resident_bytes(a.child.id()), resident_bytes(b.child.id()));
    assert!(
        rss_a >= rss_b + want * 3 / 4,
        "resident {rss_a} against {rss_b} without --prefault: not the {want} faulted in"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pa, pb) = stores(&rt, certs, &a, &b);
    let first = chunks(24, 1 << 20, 9);
    for p in [&pa, &pb] {
        let st = rt.block_on(p.put_chunks(JOB, first.clone())).unwrap();
        assert_eq!(st.written, 24);
    }
    let m = http_get(a.metrics, "/metrics");
    assert_eq!((metric(&m, FRESH), metric(&m, REUSED)), (0, 24), "{m}");
    assert_eq!(metric(&m, FREE), want - 24 * class);
    let m = http_get(b.metrics, "/metrics");
    assert_eq!((metric(&m, FRESH), metric(&m, REUSED)), (24, 0), "{m}");
    // The replicas read back whole from the prefaulted memory.
    let ids: Vec<ChunkId> = first.iter().map(|c| c.id).collect();
    let got = rt.block_on(pa.get_chunks(JOB, &ids));
    for (got, want) in got.into_iter().zip(&first) {
        assert_eq!(got.unwrap().as_slice(), want.data.as_slice());
    }
}

/// Three peer processes; a checkpointer saves with two replicas; the first
/// peer of the ring is SIGKILLed in the middle of the push (seen on its
/// `/metrics`). The save succeeds; the step goes to the next node of the
/// ring instead; with no node left to take its place, the next step is
/// degraded, and nothing is lost: a lost disk restores from the peers.
#[test]
fn a_peer_killed_during_a_push_leaves_the_save_committed_and_replicated_elsewhere() {
    use strata::{Checkpointer, Config, L2State, StepSelector};
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    certs_for(certs, &["node-a", "node-b", "node-c", "node-d"]);
    let mut peers: Vec<(String, Peer)> = ["node-b", "node-c", "node-d"]
        .iter()
        .map(|n| (n.to_string(), serve(certs, n)))
        .collect();
    let l1 = dir.path().join("l1");
    let cfg = Config::builder()
        .job(JOB)
        .l1_dir(&l1)
        .chunk_size(1 << 20)
        .keep_last(4)
        .peers(
            "node-a",
            peers
                .iter()
                .map(|(n, p)| format!("{n}={}", p.addr))
                .collect::<Vec<_>>(),
            certs,
        )
        .replicas(2);
    // The ring's order for rank 0 of node-a.
    let ring = strata_peer::ring::placement(
        &["node-a", "node-b", "node-c", "node-d"].map(String::from),
        "node-a",
        0,
    );
    let (first, third) = (ring[0].clone(), ring[2].clone());
    let (names, data) = state(9);
    let entries = as_entries(&names, &data);
    let ck = Checkpointer::new(cfg.clone()).unwrap();
    let idx = peers.iter().position(|(n, _)| *n == first).unwrap();
    let got_before = metric(
        &http_get(peers[idx].1.metrics, "/metrics"),
        "strata_peer_bytes_in_total",
    );
    let stats = ck.save(1, &entries).unwrap().wait().unwrap();
    assert!(stats.bytes_written > 0);
    // The push is under way (4 of 96 MiB arrived): kill that peer.
    wait_for_metric(
        &peers[idx].1,
        "strata_peer_bytes_in_total",
        got_before + (4 << 20),
    );
    let (_, mut killed) = peers.remove(idx);
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    ck.wait_replication();
    match &ck.replication()[&1] {
        L2State::Replicated { peers: on, .. } => {
            assert_eq!(on.len(), 2, "{on:?}");
            assert!(!on.contains(&first), "{on:?}");
            assert!(on.contains(&third), "not moved to the next node: {on:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(ck.committed_steps().unwrap().contains(&1));
    // Only two peers are left for two replicas; one more dies: degraded.
    let (_, mut second) = peers.remove(0);
    second.child.kill().unwrap();
    second.child.wait().unwrap();
    ck.save(2, &entries).unwrap().wait().unwrap();
    ck.wait_replication();
    match &ck.replication()[&2] {
        L2State::Degraded {
            peers: on, wanted, ..
        } => assert_eq!((on.len(), *wanted), (1, 2)),
        other => panic!("{other:?}"),
    }
    drop(ck);
    // The last peer holds step 2's manifest, within its manifest budget.
    let last = &peers[0].1;
    assert!(
        metric(
            &http_get(last.metrics, "/metrics"),
            "strata_peer_manifest_bytes"
        ) > 0
    );
    // Nothing lost: the disk goes, the last peer serves step 2. Two of
    // three peers are dead with two replicas per step: every replica of a
    // newer step could be on them, so a restore refuses to guess...
    std::fs::remove_dir_all(&l1).unwrap();
    let e = Checkpointer::new(cfg.clone())
        .unwrap()
        .restore(StepSelector::Latest)
        .unwrap_err();
    assert!(matches!(e, strata::Error::TierUnavailable { .. }), "{e}");
    // ...until the operator says to go on with the readable peer.
    let got = Checkpointer::new(cfg.skip_unreadable_tiers(true))
        .unwrap()
        .restore(StepSelector::Latest)
        .unwrap();
    assert_eq!(got.step, 2);
    assert_eq!(got.stats.bytes_from_l2, got.stats.bytes_read);
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
}

/// A rolling upgrade: a step is replicated to a peer service, which is
/// stopped with SIGTERM and started again on the same spill directory; it
/// reloads every replica (verified), and a node that lost its disk
/// restores the step from it, every byte from L2.
#[test]
fn a_restarted_peer_service_keeps_its_replicas_and_restores_a_lost_disk() {
    use strata::{Checkpointer, Config, L2State, StepSelector};
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path();
    // node-b's certificate is issued by a second run, from the CA the
    // first one made (the job's client certificate chains to it).
    for args in [
        ["--node", "node-a", "--job", JOB],
        ["--node", "node-b", "--job", "other"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["peer", "certs"])
            .args(args)
            .arg("--out")
            .arg(certs)
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    let l1 = dir.path().join("l1");
    let cfg = |b: &Peer| {
        Config::builder()
            .job(JOB)
            .l1_dir(&l1)
            .chunk_size(1 << 20)
            .peers("node-a", vec![format!("node-b={}", b.addr)], certs)
            .replicas(1)
    };
    let (names, data) = state(7);
    let entries = as_entries(&names, &data);
    // 96 MiB against a 64 MiB memory budget: some replicas in memory, the
    // rest spilled.
    let mut b = serve(certs, "node-b");
    {
        let ck = Checkpointer::new(cfg(&b)).unwrap();
        ck.save(1, &entries).unwrap().wait().unwrap();
        ck.wait_replication();
        assert!(
            matches!(ck.replication()[&1], L2State::Replicated { .. }),
            "{:?}",
            ck.replication()
        );
    }
    let held = metric(&http_get(b.metrics, "/metrics"), "strata_peer_chunks");
    assert_eq!(held, 96);
    // The service runs at its background priority (--nice, default 10).
    let nice = |pid: u32| -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1.to_string();
        rest.split_whitespace().nth(16).unwrap().parse().unwrap()
    };
    assert_eq!(nice(b.child.id()), nice(std::process::id()).max(10));
    // SAFETY: sending a signal to our own child process by its pid.
    let rc = unsafe { libc::kill(b.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(b.child.wait().unwrap().success());
    drop(b);

    let b = serve(certs, "node-b");
    let text = http_get(b.metrics, "/metrics");
    assert_eq!(metric(&text, "strata_peer_reloaded_chunks"), 96);
    assert_eq!(metric(&text, "strata_peer_chunks"), 96);
    assert_eq!(
        metric(
            &text,
            "strata_peer_dropped_at_start{what=\"damaged_chunks\"}"
        ),
        0
    );
    assert_eq!(
        metric(
            &text,
            "strata_peer_dropped_at_start{what=\"incomplete_shards\"}"
        ),
        0
    );
    std::fs::remove_dir_all(&l1).unwrap();
    let got = Checkpointer::new(cfg(&b))
        .unwrap()
        .restore(StepSelector::Latest)
        .unwrap();
    assert_eq!(got.step, 1);
    assert_eq!(got.stats.bytes_from_l2, got.stats.bytes_read);
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    let text = http_get(b.metrics, "/metrics");
    assert!(
        text.contains(&format!("strata_peer_job_chunks{{job=\"{JOB}\"}} 96\n")),
        "{text}"
    );
    assert!(
        text.contains("strata_peer_request_seconds_count{op=\"get_chunk\"}"),
        "{text}"
    );
}

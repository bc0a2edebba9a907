//! L2 replication from a checkpointer to peer services (in this process,
//! over QUIC on loopback): the ring's choice of peer, dedup of unchanged
//! chunks, restore of a node whose disk is gone from its peer, a dead peer
//! replaced by the next one in the ring, degraded steps pushed again when
//! the peer returns, per-chunk fallback from a damaged L1 to a peer with
//! repair, and from a peer lacking a chunk to another peer (the restored
//! step written back to L1 whole, the peer's copy repaired).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use strata::format::DType;
use strata::{Checkpointer, Config, Entry, L2State, StepSelector};
use strata_peer::replicas::Limits;
use strata_peer::service::{Service, ServiceConfig};
use strata_peer::tls::{make_certs, CertFiles};
use strata_tiered::ChunkStore;

const MIB: usize = 1 << 20;
const JOB: &str = "repl";

/// Ten 2 MiB tensors; `step` changes tensor `step % 10` only.
fn state(step: u64) -> Vec<Vec<u8>> {
    (0..10u64)
        .map(|i| {
            let version = if i == step % 10 { step } else { 0 };
            let key = (i << 40) ^ (version << 20);
            (0..2 * MIB as u64)
                .map(|j| ((j ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
                .collect()
        })
        .collect()
}

fn names() -> Vec<String> {
    (0..10).map(|i| format!("layer.{i}.weight")).collect()
}

fn entries<'a>(names: &'a [String], data: &'a [Vec<u8>]) -> Vec<Entry<'a>> {
    const SHAPE: [u64; 1] = [MIB as u64];
    names
        .iter()
        .zip(data)
        .map(|(n, d)| Entry::tensor(n, DType::BF16, &SHAPE, d))
        .collect()
}

/// Saves `state(step)`, waits until it is durable and its replication
/// has ended.
fn save_replicated(ck: &Checkpointer, names: &[String], step: u64) {
    ck.save(step, &entries(names, &state(step)))
        .unwrap()
        .wait()
        .unwrap();
    ck.wait_replication();
}

/// Three peer services (node-a, node-b, node-c) and their certificates.
struct Cluster {
    rt: tokio::runtime::Runtime,
    services: std::sync::Mutex<Vec<(String, Arc<Service>)>>,
    dir: tempfile::TempDir,
}

fn service_cfg(dir: &std::path::Path, n: &str, listen: std::net::SocketAddr) -> ServiceConfig {
    ServiceConfig {
        node: n.to_string(),
        listen,
        certs: CertFiles::in_dir(dir, n),
        spill: dir.join(format!("spill-{n}")),
        // No grace: retention frees unreferenced chunks at once (each test
        // waits for replication before the next save).
        limits: Limits {
            grace: std::time::Duration::ZERO,
            ..Limits::default()
        },
        max_streams: 32,
        inflight_bytes: 256 << 20,
        max_request: ServiceConfig::DEFAULT_MAX_REQUEST,
        work_bytes: ServiceConfig::DEFAULT_WORK_BYTES,
        max_connections: ServiceConfig::DEFAULT_MAX_CONNECTIONS,
    }
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<String> = ["node-a", "node-b", "node-c"].map(String::from).to_vec();
        make_certs(dir.path(), &nodes, &[], &[JOB.into()]).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let services = nodes
            .iter()
            .map(|n| {
                let cfg = service_cfg(dir.path(), n, "127.0.0.1:0".parse().unwrap());
                let svc = rt.block_on(async { Service::bind(&cfg).unwrap() });
                rt.spawn(svc.clone().run());
                (n.clone(), svc)
            })
            .collect();
        Cluster {
            rt,
            services: std::sync::Mutex::new(services),
            dir,
        }
    }

    fn service(&self, node: &str) -> Arc<Service> {
        let services = self.services.lock().unwrap();
        services.iter().find(|(n, _)| n == node).unwrap().1.clone()
    }

    /// Starts `node` again on its old address (reloading what it kept in
    /// its spill directory).
    fn restart(&self, node: &str) {
        let addr = self.service(node).local_addr().unwrap();
        let cfg = service_cfg(self.dir.path(), node, addr);
        self.services.lock().unwrap().retain(|(n, _)| n != node);
        // The stopped service's socket is freed once its last handle goes.
        let mut tries = 0;
        let svc = loop {
            match self.rt.block_on(async { Service::bind(&cfg) }) {
                Ok(svc) => break svc,
                Err(e) if tries < 100 => {
                    tries += 1;
                    eprintln!("rebinding {addr}: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        };
        self.rt.spawn(svc.clone().run());
        self.services.lock().unwrap().push((node.to_string(), svc));
    }

    /// A client of `node` with the job's certificate.
    fn client(&self, node: &str) -> strata_peer::PeerStore {
        let addr = self.service(node).local_addr().unwrap();
        let certs = CertFiles::in_dir(self.dir.path(), &format!("client-{JOB}"));
        let _guard = self.rt.enter();
        strata_peer::PeerStore::new(addr, node, &certs, strata_peer::PeerOptions::default())
            .unwrap()
    }

    fn peers(&self) -> Vec<String> {
        self.services
            .lock()
            .unwrap()
            .iter()
            .map(|(n, s)| format!("{n}={}", s.local_addr().unwrap()))
            .collect()
    }

    fn stop(&self, node: &str) {
        let svc = self.service(node);
        self.rt.block_on(svc.shutdown());
    }

    fn cfg(&self, l1: &std::path::Path, replicas: usize) -> Config {
        Config::builder()
            .job(JOB)
            .l1_dir(l1)
            .chunk_size(MIB as u32)
            .keep_last(2)
            .gc_grace_secs(0)
            .peers("node-a", self.peers(), self.dir.path())
            .replicas(replicas)
    }
}

#[test]
fn steps_replicate_to_the_ring_and_a_lost_disk_restores_from_the_peer() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    {
        let ck = Checkpointer::new(cluster.cfg(l1.path(), 1)).unwrap();
        for step in 1..=4 {
            let data = state(step);
            ck.save(step, &entries(&names, &data))
                .unwrap()
                .wait()
                .unwrap();
            ck.wait_replication();
        }
        let repl = ck.replication();
        // Rank 0 on node-a: its first peer in the ring is node-b.
        for step in 1..=4 {
            match &repl[&step] {
                L2State::Replicated { peers, wanted, .. } => {
                    assert_eq!(peers, &vec!["node-b".to_string()]);
                    assert_eq!(*wanted, 1);
                }
                other => panic!("step {step}: {other:?}"),
            }
        }
        // Only what changed went again (1 tensor of 10, plus nothing else).
        match &repl[&4] {
            L2State::Replicated { sent, .. } => assert!(*sent <= 4 * MIB as u64, "sent {sent}"),
            other => panic!("{other:?}"),
        }
        let tiers = ck.steps().unwrap();
        assert!(tiers.iter().any(|t| t.step == 4 && t.replication.is_some()));
    }
    // The peer keeps its newest two committed steps (its --keep-last) and
    // frees the chunks only the steps it dropped used (tensor 2's version
    // of step 2; step 1's version of tensor 1 is tensor 1's base halves
    // swapped, the same chunks).
    let b = cluster.client("node-b");
    let held: Vec<u64> = cluster
        .rt
        .block_on(b.list_steps(JOB))
        .unwrap()
        .iter()
        .map(|s| s.step)
        .collect();
    assert_eq!(held, [3, 4]);
    let only_step2: Vec<strata::format::ChunkId> = state(2)[2]
        .chunks(MIB)
        .map(strata::format::ChunkId::of)
        .collect();
    let kept: Vec<strata::format::ChunkId> = state(4)[4]
        .chunks(MIB)
        .map(strata::format::ChunkId::of)
        .collect();
    assert_eq!(
        cluster.rt.block_on(b.has_chunks(JOB, &only_step2)).unwrap(),
        [false, false]
    );
    assert_eq!(
        cluster.rt.block_on(b.has_chunks(JOB, &kept)).unwrap(),
        [true, true]
    );
    // The node's disk is lost; its peer still holds step 4.
    std::fs::remove_dir_all(l1.path()).unwrap();
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 1)).unwrap();
    assert!(ck.committed_steps().unwrap().is_empty());
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 4);
    assert_eq!(got.stats.bytes_from_l2, got.stats.bytes_read);
    for (n, d) in names.iter().zip(&state(4)) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    // Written back to L1 and committed there: the next restore is local.
    assert!(got.stats.rehydrated);
    assert_eq!(ck.committed_steps().unwrap(), vec![4]);
    let again = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(again.stats.bytes_from_l2, 0);
}

#[test]
fn a_dead_peer_is_replaced_by_the_next_in_the_ring_and_too_few_is_degraded() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 1)).unwrap();
    save_replicated(&ck, &names, 1);
    cluster.stop("node-b");
    // The save does not wait for or fail on the dead peer.
    save_replicated(&ck, &names, 2);
    match &ck.replication()[&2] {
        L2State::Replicated { peers, .. } => assert_eq!(peers, &vec!["node-c".to_string()]),
        other => panic!("{other:?}"),
    }
    drop(ck);
    // Two replicas wanted, one live peer left: degraded, naming the error.
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 2)).unwrap();
    save_replicated(&ck, &names, 3);
    match &ck.replication()[&3] {
        L2State::Degraded {
            peers,
            wanted,
            errors,
        } => {
            assert_eq!(peers, &vec!["node-c".to_string()]);
            assert_eq!(*wanted, 2);
            assert!(errors.iter().any(|e| e.starts_with("node-b")), "{errors:?}");
        }
        other => panic!("{other:?}"),
    }
    // The step is committed on L1 all the same.
    assert!(ck.committed_steps().unwrap().contains(&3));
}

#[test]
fn a_damaged_l1_chunk_is_read_from_the_peer_and_repaired() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 1)).unwrap();
    let data = state(4);
    ck.save(4, &entries(&names, &data)).unwrap().wait().unwrap();
    ck.wait_replication();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = strata::format::ShardManifest::decode(
        &rt.block_on(ck.l1().unwrap().get_manifest(JOB, 4, 0))
            .unwrap(),
    )
    .unwrap();
    let p = ck.l1().unwrap().chunk_path(JOB, &m.chunks[5].id);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[7] ^= 0x40;
    std::fs::write(&p, &bytes).unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    assert_eq!(got.stats.bytes_from_l2, MIB as u64);
    assert_eq!(got.stats.chunks_repaired, 1);
    let again = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(again.stats.bytes_from_l2, 0);
}

#[test]
fn a_degraded_step_is_pushed_again_when_its_peer_returns_without_a_new_save() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    // Three replicas wanted from a ring of two other nodes: degraded, and
    // the reason is named (not shown as 2/2).
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 3)).unwrap();
    save_replicated(&ck, &names, 1);
    match &ck.replication()[&1] {
        L2State::Degraded {
            peers,
            wanted,
            errors,
        } => {
            assert_eq!((peers.len(), *wanted), (2, 3));
            assert!(
                errors.iter().any(|e| e.contains("2 other nodes")),
                "{errors:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    drop(ck);

    let ck = Checkpointer::new(cluster.cfg(l1.path(), 2).replication_retry_secs(1)).unwrap();
    cluster.stop("node-b");
    save_replicated(&ck, &names, 2);
    assert!(
        matches!(&ck.replication()[&2], L2State::Degraded { peers, .. } if peers == &["node-c"]),
        "{:?}",
        ck.replication()[&2]
    );
    // node-b comes back (empty); no save follows, yet the step reaches it.
    cluster.restart("node-b");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let L2State::Replicated { peers, .. } = &ck.replication()[&2] {
            assert_eq!(peers.len(), 2);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {:?}",
            ck.replication()[&2]
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let steps = cluster
        .rt
        .block_on(cluster.client("node-b").list_steps(JOB))
        .unwrap();
    assert!(steps.iter().any(|s| s.step == 2 && !s.records.is_empty()));
}

#[test]
fn a_chunk_missing_on_the_peer_read_comes_from_another_and_l1_gets_the_whole_step() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    let data = state(5);
    let victim = {
        let ck = Checkpointer::new(cluster.cfg(l1.path(), 2)).unwrap();
        ck.save(5, &entries(&names, &data)).unwrap().wait().unwrap();
        ck.wait_replication();
        assert!(
            matches!(&ck.replication()[&5], L2State::Replicated { peers, .. } if peers.len() == 2)
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        let m = strata::format::ShardManifest::decode(
            &rt.block_on(ck.l1().unwrap().get_manifest(JOB, 5, 0))
                .unwrap(),
        )
        .unwrap();
        m.chunks[3].id
    };
    // node-b (read first) loses one chunk; the node loses its disk.
    let b = cluster.client("node-b");
    cluster
        .rt
        .block_on(b.delete_chunks(JOB, &[victim]))
        .unwrap();
    assert_eq!(
        cluster.rt.block_on(b.has_chunks(JOB, &[victim])).unwrap(),
        [false]
    );
    std::fs::remove_dir_all(l1.path()).unwrap();

    let ck = Checkpointer::new(cluster.cfg(l1.path(), 2)).unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 5);
    for (n, d) in names.iter().zip(&data) {
        assert!(&got.get(n).unwrap().bytes == d, "{n}");
    }
    assert_eq!(got.stats.bytes_from_l2, got.stats.bytes_read);
    assert!(got.stats.rehydrated);
    assert_eq!(got.stats.chunks_repaired, 1);
    // node-b holds the chunk again.
    assert_eq!(
        cluster.rt.block_on(b.has_chunks(JOB, &[victim])).unwrap(),
        [true]
    );
    drop(ck);
    // L1 holds the whole step: a restore with no peers at all reads it.
    let alone = Config::builder()
        .job(JOB)
        .l1_dir(l1.path())
        .chunk_size(MIB as u32);
    let ck = Checkpointer::new(alone).unwrap();
    let local = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(local.step, 5);
    assert_eq!(local.stats.bytes_from_l2, 0);
    for (n, d) in names.iter().zip(&data) {
        assert!(&local.get(n).unwrap().bytes == d, "{n}");
    }
}

/// New chunks go to the peer while they are written to L1 (from staging
/// memory), and the push after the L1 commit sends only what is left; with
/// `eager_push` off, everything goes after the commit. Either way the
/// peer ends up holding the step.
#[test]
fn new_chunks_go_to_the_peer_beside_the_l1_write() {
    let cluster = Cluster::start();
    let names = names();
    for eager in [true, false] {
        let l1 = tempfile::tempdir().unwrap();
        let ck = Checkpointer::new(cluster.cfg(l1.path(), 1).eager_push(eager)).unwrap();
        // Step 1 opens the connection; step 2's tensors are all new (and
        // new to the peer in both runs). The second run saves other step
        // numbers: the peer still holds the first run's steps committed,
        // and a committed step is never saved again.
        let base = if eager { 0 } else { 10 };
        for step in [base + 1u64, base + 2] {
            let salt = (step - base) as u8 + if eager { 0 } else { 100 };
            let data: Vec<Vec<u8>> = state(step - base)
                .into_iter()
                .map(|mut t| {
                    t.iter_mut().for_each(|b| *b ^= salt);
                    t
                })
                .collect();
            ck.save(step, &entries(&names, &data))
                .unwrap()
                .wait()
                .unwrap();
            ck.wait_replication();
        }
        match &ck.replication()[&(base + 2)] {
            L2State::Replicated { sent, early, .. } => {
                eprintln!("eager_push {eager}: sent {sent} bytes, {early} beside the L1 write");
                assert_eq!(*sent, 20 * MIB as u64, "eager {eager}");
                if eager {
                    assert!(*early > 0, "nothing went beside the L1 write");
                } else {
                    assert_eq!(*early, 0);
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The eager push's copy out of staging takes only the chunks new since
/// the process's last save: a step with one tensor of ten changed copies
/// its two chunks, not the eighteen L1 (and the peer) already held. (It
/// copied every chunk of each batch before: 20 MiB here for 2 MiB of new
/// chunks, and on an incremental step of `l2-bench` the L1 write waited
/// for it.)
#[test]
fn the_eager_push_copies_only_the_chunks_new_since_the_last_save() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 1).eager_push(true)).unwrap();
    let copied = || -> u64 {
        let text = ck.metrics_text();
        let line = text
            .lines()
            .find(|l| l.starts_with("strata_eager_copied_bytes_total{"))
            .expect("the eager push's counter");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(copied(), 0);
    // Step 1 opens the connection; step 2's tensors are all new.
    save_replicated(&ck, &names, 1);
    let mut data: Vec<Vec<u8>> = state(2)
        .into_iter()
        .map(|mut t| {
            t.iter_mut().for_each(|b| *b ^= 0x77);
            t
        })
        .collect();
    let before = copied();
    ck.save(2, &entries(&names, &data)).unwrap().wait().unwrap();
    ck.wait_replication();
    assert!(copied() > before, "a new step is copied for the eager push");
    // Step 3 changes the last tensor only: its two 1 MiB chunks are new.
    for b in data[9].iter_mut() {
        *b ^= 0x11;
    }
    let before = copied();
    ck.save(3, &entries(&names, &data)).unwrap().wait().unwrap();
    ck.wait_replication();
    let third = copied() - before;
    assert!(
        third <= 2 * MIB as u64,
        "copied {third} bytes for 2 MiB of new chunks"
    );
    assert!(
        matches!(&ck.replication()[&3], L2State::Replicated { .. }),
        "{:?}",
        ck.replication()
    );
}

#[test]
fn data_parallel_ranks_of_a_node_send_their_identical_chunks_once() {
    // Two ranks of node-a share its L1 and hold the same 20 MiB (data
    // parallel); both save at once and replicate to the same peer. Each
    // chunk crosses the network once: the peer receives about 20 MiB, not
    // 40, and both shards are committed there. With the eager push, and
    // with the push after the commit alone: the two ranks' pushes then
    // start together, at the barrier, both finding every chunk missing on
    // the peer, and only the claims keep the second from sending it too.
    let cluster = Cluster::start();
    let names = names();
    let ring = strata_peer::ring::placement(
        &["node-a", "node-b", "node-c"].map(String::from),
        "node-a",
        0,
    );
    let peer = ring[0].clone();
    let received = || cluster.service(&peer).stats().bytes_in;
    for (eager, step, salt) in [(true, 1u64, 0u8), (false, 2, 0x5a)] {
        let l1 = tempfile::tempdir().unwrap();
        let coord = strata::InProcessCoordinator::new(2);
        // Each round's bytes are new to the peer.
        let data: Vec<Vec<u8>> = state(step)
            .into_iter()
            .map(|mut t| {
                t.iter_mut().for_each(|b| *b ^= salt);
                t
            })
            .collect();
        let before = received();
        std::thread::scope(|sc| {
            for rank in 0..2u32 {
                let (coord, names, peer, data) = (coord.clone(), &names, peer.clone(), &data);
                let cfg = cluster.cfg(l1.path(), 1).rank(rank, 2).eager_push(eager);
                sc.spawn(move || {
                    let ck = Checkpointer::with_coordinator(cfg, Arc::new(coord)).unwrap();
                    ck.save(step, &entries(names, data))
                        .unwrap()
                        .wait()
                        .unwrap();
                    ck.wait_replication();
                    assert!(
                        matches!(&ck.replication()[&step], L2State::Replicated { peers, .. } if peers == std::slice::from_ref(&peer)),
                        "{:?}",
                        ck.replication()
                    );
                });
            }
        });
        let got = received() - before;
        let shard: u64 = data.iter().map(|d| d.len() as u64).sum();
        assert!(
            got < shard + shard / 4,
            "eager push {eager}: the peer received {got} bytes for two identical shards of {shard}"
        );
        // Both ranks' shards are committed on the peer.
        let store = cluster.client(&peer);
        let steps = cluster.rt.block_on(store.list_steps(JOB)).unwrap();
        let ranks = steps
            .iter()
            .find(|s| s.step == step)
            .unwrap()
            .committed_ranks();
        assert_eq!(ranks.into_iter().collect::<Vec<_>>(), [0, 1]);
    }
}

/// A step pinned on a peer (through the protocol, as `strata pin` does)
/// stays there, whole, while newer steps rotate through its retention
/// (`strata_gc` on the service); unpinned, the next commit retires it.
#[test]
fn a_step_pinned_on_a_peer_outlives_its_retention_until_unpinned() {
    let cluster = Cluster::start();
    let l1 = tempfile::tempdir().unwrap();
    let names = names();
    let b = cluster.client("node-b");
    let held = || -> Vec<u64> {
        cluster
            .rt
            .block_on(b.list_steps(JOB))
            .unwrap()
            .iter()
            .map(|s| s.step)
            .collect()
    };
    let ck = Checkpointer::new(cluster.cfg(l1.path(), 1)).unwrap();
    save_replicated(&ck, &names, 1);
    cluster.rt.block_on(b.set_pin(JOB, 1, true)).unwrap();
    assert_eq!(
        cluster.rt.block_on(b.list_pins(JOB)).unwrap(),
        std::collections::BTreeSet::from([1])
    );
    for step in 2..=5 {
        save_replicated(&ck, &names, step);
    }
    assert_eq!(held(), [1, 4, 5]);
    // Step 1 is whole on the peer: its manifest and every chunk it names.
    let bytes = cluster.rt.block_on(b.get_manifest(JOB, 1, 0)).unwrap();
    let m = strata::format::ShardManifest::decode(&bytes).unwrap();
    let ids: Vec<_> = m.chunks.iter().map(|c| c.id).collect();
    assert!(cluster
        .rt
        .block_on(b.has_chunks(JOB, &ids))
        .unwrap()
        .iter()
        .all(|&h| h));
    // Unpinned: the next commit's retention retires it.
    cluster.rt.block_on(b.set_pin(JOB, 1, false)).unwrap();
    save_replicated(&ck, &names, 6);
    assert_eq!(held(), [5, 6]);
    assert!(cluster.rt.block_on(b.list_pins(JOB)).unwrap().is_empty());
}

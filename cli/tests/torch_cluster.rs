//! PyTorch on the multi-node test bed: `torchrun --nnodes 2
//! --nproc-per-node 2`, one torchrun per node, each node in its own network
//! namespace with its own peer service. The ranks save through the Python
//! package (agreeing through torch.distributed's store) and wait until each
//! step is on the peers; then node 1 is lost (its peer service killed, its
//! disk wiped) and replaced, and the job resumes: node 1's ranks restore
//! from the peers' copies, every byte checked.
//!
//! Needs a Python with torch and the `strata` package: `STRATA_PYTHON`
//! (scripts/test.sh sets it and `STRATA_REQUIRE_TORCH=1`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use strata_cli::cluster::{find_bin, Cluster, Isolation, Spec};

fn python() -> Option<PathBuf> {
    let required = std::env::var("STRATA_REQUIRE_TORCH").as_deref() == Ok("1");
    let py = std::env::var_os("STRATA_PYTHON").map(PathBuf::from);
    let usable = py.as_ref().is_some_and(|p| {
        std::process::Command::new(p)
            .args(["-c", "import torch, strata"])
            .status()
            .is_ok_and(|s| s.success())
    });
    if !usable {
        assert!(
            !required,
            "STRATA_REQUIRE_TORCH=1 but STRATA_PYTHON ({py:?}) cannot import torch and strata"
        );
        eprintln!("SKIPPED: no STRATA_PYTHON with torch and strata");
        return None;
    }
    py
}

fn worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/tests/workers/node_worker.py")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts torchrun on every node for `mode`; returns the children.
fn torchrun(c: &Cluster, py: &Path, mode: &str, out: &Path) -> Vec<Child> {
    let port = free_port();
    let master = c.nodes[0].addr.to_string();
    (0..c.nodes.len())
        .map(|i| {
            let n = &c.nodes[i];
            c.fabric
                .command(i, py)
                .args(["-m", "torch.distributed.run", "--nnodes", "2"])
                .args(["--nproc-per-node", "2", "--node-rank", &i.to_string()])
                .args(["--master-addr", &master, "--master-port", &port.to_string()])
                .arg(worker())
                .arg(mode)
                .arg(&c.config)
                .arg(&n.l1)
                .arg(&n.name)
                .arg(n.addr.to_string())
                .arg(out)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(out.join(format!("{mode}-node{i}.log"))).unwrap())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn wait_ok(mut children: Vec<Child>, out: &Path, mode: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    for (i, ch) in children.iter_mut().enumerate() {
        loop {
            if let Some(st) = ch.try_wait().unwrap() {
                let log = std::fs::read_to_string(out.join(format!("{mode}-node{i}.log")))
                    .unwrap_or_default();
                assert!(st.success(), "{mode} on node {i}: {st}\n{log}");
                break;
            }
            if Instant::now() > deadline {
                let _ = ch.kill();
                panic!("{mode} on node {i} still running after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn result(out: &Path, rank: u32) -> Value {
    let text = std::fs::read_to_string(out.join(format!("rank{rank}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn torchrun_on_two_nodes_resumes_a_replaced_node_from_its_peers() {
    let Some(py) = python() else { return };
    for bin in ["etcd", "s3s-fs"] {
        if find_bin(bin).is_none() {
            assert!(
                std::env::var("STRATA_REQUIRE_SERVERS").as_deref() != Ok("1"),
                "{bin} is required by the test command"
            );
            eprintln!("SKIPPED: {bin} not found");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(Spec {
        nodes: 2,
        ranks_per_node: 2,
        job: "torch".into(),
        dir: dir.path().to_path_buf(),
        strata: env!("CARGO_BIN_EXE_strata").into(),
        replicas: 1,
        upload_every: 0,
        lease_secs: 2,
        chunk_size: 1 << 20,
        keep_last: 3,
        force_loopback: false,
        node_link: false,
    })
    .unwrap();
    if let Isolation::Loopback(why) = &c.fabric.isolation {
        assert!(
            std::env::var("STRATA_REQUIRE_NETNS").as_deref() != Ok("1"),
            "STRATA_REQUIRE_NETNS=1 but namespaces could not be made: {why}"
        );
        eprintln!("nodes on loopback addresses (no namespaces: {why})");
    }
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();

    let saving = torchrun(&c, &py, "save", &out);
    wait_ok(saving, &out, "save", Duration::from_secs(300));
    for rank in 0..4 {
        let r = result(&out, rank);
        assert_eq!(r["world"], 4);
        let steps: Vec<u64> = r["stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, [1, 2, 3], "rank {rank}");
    }

    // Node 1 dies and comes back empty: its peer service and its disk.
    c.kill_peer(1);
    c.wipe(1).unwrap();
    c.start_peer(1).unwrap();

    let resuming = torchrun(&c, &py, "resume", &out);
    wait_ok(resuming, &out, "resume", Duration::from_secs(300));
    for rank in 0..4 {
        let r = result(&out, rank);
        assert_eq!(r["latest"], 3, "rank {rank}: {r}");
        assert_eq!(r["ok"], true, "rank {rank}: {r}");
        let from_peers = r["restore"]["bytes_from_l2"].as_u64().unwrap();
        if r["node"] == "node-1" {
            assert!(from_peers > 0, "rank {rank} restored from its peers: {r}");
            assert_eq!(
                from_peers,
                r["restore"]["bytes_read"].as_u64().unwrap(),
                "rank {rank}: every byte from the peers (L1 was wiped, no L3 upload): {r}"
            );
        } else {
            assert_eq!(from_peers, 0, "rank {rank} restored from its own L1: {r}");
        }
    }
}

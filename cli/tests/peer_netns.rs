//! A peer in another network namespace, reached over a veth pair: the
//! link is cut (the save succeeds, its replication is degraded), then
//! restored (the next step replicates again, and a lost disk restores from
//! the peer). Needs root and `ip netns` (CI runs as root); elsewhere it
//! says so and skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata::format::DType;
use strata::{Checkpointer, Config, Entry, L2State, StepSelector};

const JOB: &str = "netjob";
const MIB: usize = 1 << 20;

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// A namespace with one end of a veth pair; the other end stays here.
struct Net {
    ns: String,
    here: String,
    prefix: String,
}

impl Net {
    fn new() -> Option<Net> {
        let id = std::process::id() % 10_000;
        let net = Net {
            ns: format!("strata-t{id}"),
            here: format!("sva{id}"),
            prefix: format!("10.213.{}", id % 250),
        };
        let there = format!("svb{id}");
        let ok = ip(&["netns", "add", &net.ns])
            && ip(&[
                "link", "add", &net.here, "type", "veth", "peer", "name", &there,
            ])
            && ip(&["link", "set", &there, "netns", &net.ns])
            && ip(&[
                "addr",
                "add",
                &format!("{}.1/24", net.prefix),
                "dev",
                &net.here,
            ])
            && ip(&["link", "set", &net.here, "up"])
            && ip(&[
                "netns",
                "exec",
                &net.ns,
                "ip",
                "addr",
                "add",
                &format!("{}.2/24", net.prefix),
                "dev",
                &there,
            ])
            && ip(&["netns", "exec", &net.ns, "ip", "link", "set", &there, "up"])
            && ip(&["netns", "exec", &net.ns, "ip", "link", "set", "lo", "up"]);
        if ok {
            Some(net)
        } else {
            drop(net);
            None
        }
    }

    fn link(&self, up: bool) {
        assert!(ip(&[
            "link",
            "set",
            &self.here,
            if up { "up" } else { "down" }
        ]));
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.here])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn state(step: u64) -> Vec<Vec<u8>> {
    (0..8u64)
        .map(|i| {
            let v = if i == step % 8 { step } else { 0 };
            (0..MIB as u64)
                .map(|j| {
                    ((j ^ (i << 40) ^ (v << 20)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
                })
                .collect()
        })
        .collect()
}

fn save(ck: &Checkpointer, step: u64) {
    const SHAPE: [u64; 1] = [MIB as u64 / 2];
    let data = state(step);
    let names: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
    let entries: Vec<Entry<'_>> = names
        .iter()
        .zip(&data)
        .map(|(n, d)| Entry::tensor(n, DType::BF16, &SHAPE, d))
        .collect();
    ck.save(step, &entries).unwrap().wait().unwrap();
}

#[test]
fn a_peer_cut_off_and_back_degrades_then_replicates_again() {
    let Some(net) = Net::new() else {
        // The test command sets this where it can run (root, iproute2).
        assert!(
            std::env::var("STRATA_REQUIRE_NETNS").as_deref() != Ok("1"),
            "STRATA_REQUIRE_NETNS=1 but network namespaces cannot be made (root and `ip netns` needed)"
        );
        eprintln!("SKIPPED network-namespace test: needs root and `ip netns`");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let peer_ip = format!("{}.2", net.prefix);
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["peer", "certs", "--node", "node-a", "--node", "node-b"])
        .args(["--addr", &peer_ip, "--job", JOB, "--out"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut child = Command::new("ip")
        .args(["netns", "exec", &net.ns])
        .arg(env!("CARGO_BIN_EXE_strata"))
        .args([
            "peer",
            "serve",
            "--listen",
            &format!("{peer_ip}:7070"),
            "--node",
            "node-b",
        ])
        .arg("--certs")
        .arg(&certs)
        .arg("--spill")
        .arg(dir.path().join("spill"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening on"), "{line}");
    let _peer = Proc(child);

    let l1 = dir.path().join("l1");
    let cfg = Config::builder()
        .job(JOB)
        .l1_dir(&l1)
        .chunk_size(MIB as u32)
        .keep_last(3)
        .gc_grace_secs(0)
        .peers("node-a", vec![format!("node-b={peer_ip}:7070")], &certs)
        .replicas(1);
    let ck = Checkpointer::new(cfg.clone()).unwrap();
    save(&ck, 1);
    ck.wait_replication();
    assert!(
        matches!(ck.replication()[&1], L2State::Replicated { .. }),
        "{:?}",
        ck.replication()
    );

    // Cut the link: the save is not held up, its replication is degraded.
    net.link(false);
    let t = Instant::now();
    save(&ck, 2);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the save waited for the peer"
    );
    ck.wait_replication();
    match &ck.replication()[&2] {
        L2State::Degraded { peers, errors, .. } => {
            assert!(peers.is_empty());
            assert!(errors[0].starts_with("node-b"), "{errors:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(ck.committed_steps().unwrap().contains(&2));

    // Restore the link: the next step replicates again.
    net.link(true);
    save(&ck, 3);
    ck.wait_replication();
    assert!(
        matches!(ck.replication()[&3], L2State::Replicated { .. }),
        "{:?}",
        ck.replication()
    );
    // And step 2, degraded while the link was down, is pushed again.
    match &ck.replication()[&2] {
        L2State::Replicated { peers, .. } => assert_eq!(peers, &vec!["node-b".to_string()]),
        other => panic!("step 2 after the link came back: {other:?}"),
    }
    drop(ck);

    // The node's disk is lost: step 3 comes back from the peer.
    std::fs::remove_dir_all(&l1).unwrap();
    let ck = Checkpointer::new(cfg).unwrap();
    let got = ck.restore(StepSelector::Latest).unwrap();
    assert_eq!(got.step, 3);
    assert_eq!(got.stats.bytes_from_l2, got.stats.bytes_read);
    for (i, d) in state(3).iter().enumerate() {
        assert!(&got.get(&format!("t{i}")).unwrap().bytes == d);
    }
}

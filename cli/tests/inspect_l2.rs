//! The inspection commands on a job replicated to two peer services (in
//! this process, over QUIC on loopback): `ls` shows the replicas and a dead
//! peer, `verify` finds a damaged replica and `--repair` rewrites it from
//! L1, `export` reads from a peer when L1 is gone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::sync::Arc;

mod support;

use serde_json::Value;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry};
use strata_peer::replicas::Limits;
use strata_peer::service::{Service, ServiceConfig};
use strata_peer::tls::{make_certs, CertFiles};

const JOB: &str = "insp-l2";

struct Peers {
    rt: tokio::runtime::Runtime,
    services: Vec<(String, Arc<Service>)>,
    dir: tempfile::TempDir,
}

impl Peers {
    fn start() -> Peers {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<String> = ["node-a", "node-b", "node-c"].map(String::from).to_vec();
        make_certs(dir.path(), &nodes, &[], &[JOB.into()]).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let services = nodes[1..]
            .iter()
            .map(|n| {
                let cfg = ServiceConfig {
                    node: n.clone(),
                    listen: "127.0.0.1:0".parse().unwrap(),
                    certs: CertFiles::in_dir(dir.path(), n),
                    spill: dir.path().join(format!("spill-{n}")),
                    // Everything on the spill disk, where the test can damage it.
                    limits: Limits {
                        memory_bytes: 0,
                        ..Limits::default()
                    },
                    max_streams: 32,
                    inflight_bytes: 256 << 20,
                    max_request: ServiceConfig::DEFAULT_MAX_REQUEST,
                    work_bytes: ServiceConfig::DEFAULT_WORK_BYTES,
                    max_connections: ServiceConfig::DEFAULT_MAX_CONNECTIONS,
                };
                let svc = rt.block_on(async { Service::bind(&cfg).unwrap() });
                rt.spawn(svc.clone().run());
                (n.clone(), svc)
            })
            .collect();
        Peers { rt, services, dir }
    }

    fn list(&self) -> String {
        self.services
            .iter()
            .map(|(n, s)| format!("{n}={}", s.local_addr().unwrap()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn run(args: &[String]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env_remove("STRATA_PEERS")
        .env_remove("STRATA_L1_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "{err}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        err,
    )
}

fn json(out: &(i32, String, String)) -> Value {
    serde_json::from_str(&out.1).unwrap_or_else(|e| panic!("{e}: {}\n{}", out.1, out.2))
}

#[test]
fn peers_are_tiers_for_ls_verify_repair_and_export() {
    let peers = Peers::start();
    let l1 = tempfile::tempdir().unwrap();
    let w: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    let shape = [3u64 << 19];
    {
        let cfg = Config::builder()
            .job(JOB)
            .l1_dir(l1.path())
            .chunk_size(1 << 20)
            .peers(
                "node-a",
                peers
                    .list()
                    .split(',')
                    .map(String::from)
                    .collect::<Vec<String>>(),
                peers.dir.path(),
            )
            .replicas(2);
        let ck = Checkpointer::new(cfg).unwrap();
        ck.save(5, &[Entry::tensor("w", DType::BF16, &shape, &w)])
            .unwrap()
            .wait()
            .unwrap();
        ck.wait_replication();
    }
    let base = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        v.extend([
            "--job".into(),
            JOB.into(),
            "--l1".into(),
            l1.path().display().to_string(),
            "--peers".into(),
            peers.list(),
            "--peer-certs".into(),
            peers.dir.path().display().to_string(),
            "--replicas".into(),
            "2".into(),
        ]);
        v
    };

    let ls = json(&run(&base(&["ls", "--json"])));
    let step = &ls["steps"][0];
    assert_eq!(step["step"], 5);
    let states: Vec<(&str, &str)> = step["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["tier"].as_str().unwrap(), t["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![
            ("L1", "committed"),
            ("L2:node-b", "committed"),
            ("L2:node-c", "committed")
        ]
    );
    assert_eq!(step["l2"]["state"], "replicated");

    // Damage node-b's copy of one chunk on its spill disk.
    let spill = peers.dir.path().join("spill-node-b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l1s = strata::tiered::L1Store::open(l1.path(), "psync".parse().unwrap()).unwrap();
    let m = strata::format::ShardManifest::decode(
        &rt.block_on(strata::tiered::ChunkStore::get_manifest(&l1s, JOB, 5, 0))
            .unwrap(),
    )
    .unwrap();
    let hex = m.chunks[1].id.to_hex();
    let file = support::find_spilled(&spill, &hex).expect("the spilled replica");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    let found = run(&base(&["verify", "--tier", "node-b", "--json"]));
    assert_eq!(found.0, 1, "{}\n{}", found.1, found.2);
    let r = json(&found);
    assert_eq!(r["problems"][0]["tier"], "L2:node-b");
    assert_eq!(r["problems"][0]["state"], "damaged");
    assert_eq!(r["problems"][0]["id"], hex.as_str());
    assert_eq!(
        r["problems"][0]["good_copies"],
        serde_json::json!(["L1", "L2:node-c"])
    );
    let fixed = run(&base(&["verify", "--tier", "node-b", "--repair"]));
    assert_eq!(fixed.0, 5, "{}\n{}", fixed.1, fixed.2);
    assert!(fixed.1.contains("REPAIRED"), "{}", fixed.1);
    assert_eq!(run(&base(&["verify"])).0, 0);

    // node-c goes away: ls names it unreadable and the step degraded.
    let c = &peers.services[1].1;
    peers.rt.block_on(c.shutdown());
    let ls = run(&base(&["ls", "--json"]));
    assert_eq!(ls.0, 0, "{}", ls.2);
    let ls = json(&ls);
    assert_eq!(ls["steps"][0]["l2"]["state"], "degraded", "{ls}");
    assert!(ls["errors"][0].as_str().unwrap().contains("node-c"), "{ls}");
    // verify of the dead peer checked nothing there: not a pass.
    let v = run(&base(&["verify", "--tier", "node-c", "--json"]));
    assert_eq!(v.0, 3, "{}\n{}", v.1, v.2);
    assert!(
        v.2.contains("not verified") && v.2.contains("node-c"),
        "{}",
        v.2
    );
    // Beside a readable tier, it is named in the report and still fails.
    let v = run(&base(&[
        "verify", "--tier", "l1", "--tier", "node-c", "--json",
    ]));
    assert_eq!(v.0, 3, "{}\n{}", v.1, v.2);
    assert!(json(&v)["unreadable_tiers"][0]
        .as_str()
        .unwrap()
        .contains("node-c"));
    // The other tiers still verify clean.
    assert_eq!(
        run(&base(&["verify", "--tier", "l1", "--tier", "node-b"])).0,
        0
    );

    // L1 lost: export comes from node-b.
    std::fs::remove_dir_all(l1.path().join(JOB)).unwrap();
    let out = tempfile::tempdir().unwrap();
    let f = out.path().join("w.safetensors");
    let e = run(&base(&["export", "5", "-o", f.to_str().unwrap(), "--json"]));
    assert_eq!(e.0, 0, "{}", e.2);
    assert_eq!(json(&e)["sources"]["L2:node-b"], 3 << 20);
    let st = std::fs::read(&f).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    assert!(st.tensor("w").unwrap().data() == w.as_slice());
}

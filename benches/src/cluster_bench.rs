//! cluster-bench: ranks as processes on nodes (network namespaces where
//! allowed), agreeing through a real etcd.
//!
//! 1. The barrier and commit of a step with 2, 6 and 12 ranks (2 per
//!    node): per step and rank, the time waiting for the others at the
//!    barrier plus writing the commit record, against one raw etcd write
//!    measured in the same run (the floor of any agreement through etcd).
//! 2. A node lost and replaced (3 nodes × 2 ranks): the time from the
//!    replacement's peer service coming up to its ranks having restored
//!    their shards from peers and saved the next step, against a raw QUIC
//!    download of the same bytes from a `strata peer sink` on another
//!    node (same TLS, one stream).
//!
//!   benches/cluster-bench.sh [--steps 10] [--size 256MiB] [--dir DIR]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use strata_benches::quic::raw;
use strata_cli::cluster::{Cluster, Isolation, RankProc, Spec};
use strata_peer::tls::{client_config, make_certs, CertFiles};

fn strata_bin() -> PathBuf {
    std::env::var_os("STRATA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/strata"))
}

fn spec(dir: &Path, nodes: usize, per_node: usize, job: &str, node_link: bool) -> Spec {
    Spec {
        nodes,
        ranks_per_node: per_node,
        job: job.into(),
        dir: dir.to_path_buf(),
        strata: strata_bin(),
        replicas: 1,
        upload_every: 0,
        lease_secs: 5,
        chunk_size: 4 << 20,
        keep_last: 2,
        force_loopback: false,
        node_link,
    }
}

fn finish(ranks: &mut [RankProc]) -> Result<(), String> {
    for r in ranks.iter_mut() {
        if r.wait(Duration::from_secs(3600)) != Some(true) {
            return Err(format!("rank {} failed: {:?}", r.rank, r.events()));
        }
    }
    Ok(())
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Requests etcd has served so far (every gRPC call and stream started,
/// the gateway's included), from its own metrics.
fn etcd_requests(url: &str) -> Result<u64, String> {
    let addr = url.trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains("etcdserverpb"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Median time of one `PUT` to etcd's gateway over a fresh HTTP/1.1
/// connection (what a coordinator's request costs at least).
fn raw_etcd_put(url: &str, n: usize) -> Result<f64, String> {
    let addr = url.trim_start_matches("http://").to_string();
    let body = r#"{"key":"L2JlbmNoL3Jhdw==","value":"eA=="}"#;
    let mut ms = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect(&addr).map_err(|e| e.to_string())?;
        write!(
            s,
            "POST /v3/kv/put HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| e.to_string())?;
        if !out.starts_with("HTTP/1.1 200") {
            return Err(format!("etcd put: {out}"));
        }
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(pct(&mut ms, 0.5))
}

fn barrier(
    dir: &Path,
    steps: u64,
    worlds: &[usize],
    per_node: usize,
    node_link: bool,
) -> Result<(), String> {
    println!(
        "  ranks  nodes  barrier+commit per step: median     p90   raw etcd put  ratio (median)  etcd requests per step"
    );
    for &world in worlds {
        let d = dir.join(format!("barrier-{world}"));
        let _ = std::fs::remove_dir_all(&d);
        let n = world.div_ceil(per_node);
        let c = Cluster::start(spec(&d, n, per_node, "bench", node_link))?;
        let nodes: Vec<usize> = (0..n).collect();
        let args: Vec<String> = ["--steps", &steps.to_string(), "--state-size", "1MiB"]
            .map(String::from)
            .to_vec();
        let before = etcd_requests(&c.etcd_url)?;
        let mut ranks = c.spawn_ranks(&nodes, &args)?;
        finish(&mut ranks)?;
        // Every request of the run (claims, keep-alives, rounds) by step.
        let per_step = (etcd_requests(&c.etcd_url)? - before) as f64 / steps as f64;
        // Step 1 is warm-up (connections, first writes).
        let mut v: Vec<f64> = ranks
            .iter()
            .flat_map(|r| r.events())
            .filter(|e| e["event"] == "saved" && e["step"].as_u64() > Some(1))
            .filter_map(|e| Some(e["barrier_ms"].as_f64()? + e["commit_ms"].as_f64()?))
            .collect();
        let raw = raw_etcd_put(&c.etcd_url, 50)?;
        let med = pct(&mut v, 0.5);
        println!(
            "  {world:>5}  {:>5}  {:>33.1} ms {:>5.1} ms {:>11.2} ms  {:>13.1}x  {per_step:>22.1}",
            n,
            med,
            pct(&mut v, 0.9),
            raw,
            med / raw
        );
        if let Isolation::Loopback(why) = &c.fabric.isolation {
            println!("         (nodes on loopback addresses: {why})");
        }
    }
    println!("  (barrier: from this rank's shard durable to every rank's vote in; it includes waiting for the slowest rank)");
    Ok(())
}

fn node_loss(dir: &Path, size: &str) -> Result<(), String> {
    let d = dir.join("loss");
    let _ = std::fs::remove_dir_all(&d);
    let mut c = Cluster::start(spec(&d, 3, 2, "bench", true))?;
    let all = [0usize, 1, 2];
    let common = ["--state-size".to_string(), size.to_string()];
    let mut first = c.spawn_ranks(
        &all,
        &[&["--steps".to_string(), "2".into()][..], &common].concat(),
    )?;
    finish(&mut first)?;
    let lost = 2;
    c.kill_peer(lost);
    c.wipe(lost)?;
    let t = Instant::now();
    c.start_peer(lost)?;
    let mut again = c.spawn_ranks(
        &all,
        &[
            &["--resume".to_string(), "--steps".into(), "1".into()][..],
            &common,
        ]
        .concat(),
    )?;
    finish(&mut again)?;
    let back = t.elapsed();
    let mine: Vec<Vec<Value>> = again
        .iter()
        .filter(|r| r.node == lost)
        .map(RankProc::events)
        .collect();
    let from_peers: u64 = mine
        .iter()
        .flat_map(|ev| ev.iter().filter(|e| e["event"] == "resumed"))
        .filter_map(|e| e["from_l2"].as_u64())
        .sum();
    let restore_ms: f64 = mine
        .iter()
        .flat_map(|ev| ev.iter().filter(|e| e["event"] == "resumed"))
        .filter_map(|e| e["ms"].as_f64())
        .fold(0.0, f64::max);

    // The same bytes, raw: one QUIC stream from a sink on node 0.
    let certs = d.join("sink-certs");
    let sink_ip = c.nodes[0].addr.to_string();
    make_certs(
        &certs,
        &["sink".into()],
        std::slice::from_ref(&sink_ip),
        &["bench".into()],
    )
    .map_err(|e| e.to_string())?;
    let mut sink = c
        .fabric
        .command(0, &strata_bin())
        .args([
            "peer",
            "sink",
            "--listen",
            &format!("{sink_ip}:7171"),
            "--node",
            "sink",
            "--certs",
        ])
        .arg(&certs)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    if let Some(out) = sink.stdout.as_mut() {
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
    }
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let raw_time = rt.block_on(async {
        let mut ep =
            strata_peer::tls::endpoint("0.0.0.0:0".parse().map_err(|e| format!("{e}"))?, None)
                .map_err(|e| e.to_string())?;
        ep.set_default_client_config(
            client_config(&CertFiles::in_dir(&certs, "client-bench"), 64)
                .map_err(|e| e.to_string())?,
        );
        raw(
            &ep,
            format!("{sink_ip}:7171")
                .parse()
                .map_err(|e| format!("{e}"))?,
            1,
            from_peers,
        )
        .await
    });
    let _ = sink.kill();
    let _ = sink.wait();
    let raw_time = raw_time?;
    println!(
        "  node lost, replacement up -> its 2 ranks restored {:.0} MiB from peers (slowest restore {:.0} ms) and saved the next step: {:.2} s",
        from_peers as f64 / 1048576.0,
        restore_ms,
        back.as_secs_f64()
    );
    println!(
        "  raw QUIC download of the same bytes (one stream, same TLS): {:.2} s -> restore alone {:.2}x raw, loss-to-training {:.2}x raw",
        raw_time.as_secs_f64(),
        restore_ms / 1e3 / raw_time.as_secs_f64(),
        back.as_secs_f64() / raw_time.as_secs_f64()
    );
    Ok(())
}

fn main() {
    let mut steps = 10u64;
    let mut size = "256MiB".to_string();
    let mut dir = PathBuf::from("strata-cluster-bench");
    let mut worlds = vec![2usize, 6, 12];
    let mut per_node = 2usize;
    let mut node_loss_too = true;
    let mut node_link = true;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--steps" => steps = it.next().and_then(|v| v.parse().ok()).unwrap_or(steps),
            "--size" => size = it.next().unwrap_or(size),
            "--dir" => dir = it.next().map(PathBuf::from).unwrap_or(dir),
            "--worlds" => {
                worlds = it
                    .next()
                    .map(|v| v.split(',').filter_map(|w| w.parse().ok()).collect())
                    .unwrap_or(worlds)
            }
            "--ranks-per-node" => {
                per_node = it.next().and_then(|v| v.parse().ok()).unwrap_or(per_node)
            }
            "--no-node-loss" => node_loss_too = false,
            "--no-node-link" => node_link = false,
            other => {
                eprintln!(
                    "cluster-bench: unknown argument {other} (--steps N --size SIZE --dir DIR --worlds 2,6,12 --ranks-per-node 2 --no-node-loss --no-node-link)"
                );
                std::process::exit(2);
            }
        }
    }
    println!(
        "cluster-bench: ranks as processes ({per_node} per node{}), etcd and s3s-fs on the bridge, {steps} steps",
        if node_link {
            ", meeting on the node link"
        } else {
            ", each its own etcd client"
        }
    );
    let r = barrier(&dir, steps, &worlds, per_node, node_link).and_then(|()| {
        if node_loss_too {
            node_loss(&dir, &size)
        } else {
            Ok(())
        }
    });
    if let Err(e) = r {
        eprintln!("cluster-bench: {e}");
        std::process::exit(1);
    }
}

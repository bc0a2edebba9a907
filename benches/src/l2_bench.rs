//! L2 benchmark, between this process and peer processes on loopback:
//!
//! ```text
//! benches/l2-bench.sh [--size 2GiB] [--reps 2] [--prefault SIZE]
//! ```
//!
//! - push: a checkpointer saves the state and replicates it to a new
//!   `strata peer serve` process (read back from L1, presence check, one
//!   request per chunk, several at once) vs a raw quinn single-stream upload
//!   of the same number of bytes to a `strata peer sink` process (same TLS);
//!   with `--prefault`, the peer is started with `--prefault SIZE` and
//!   pushed to once its buffers are faulted in;
//! - restore of the shard from that peer onto an empty L1 (many streams,
//!   every chunk verified) vs a raw single-stream download of the same bytes;
//! - bytes pushed for a step with 1 tensor in 20 changed, over the first push.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata::par::default_threads;
use strata::{synthetic, Checkpointer, Config, Entry, L2State, StepSelector};
use strata_benches::cpu::Cpu;
use strata_benches::quic::raw;
use strata_peer::tls::{client_config, make_certs, CertFiles};

const JOB: &str = "bench";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn strata_bin() -> PathBuf {
    std::env::var_os("STRATA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/strata"))
}

/// Starts `strata peer <what>` and returns it with its address.
fn start(
    what: &str,
    certs: &Path,
    node: &str,
    extra: &[&str],
) -> Result<(Proc, SocketAddr), String> {
    let mut child = Command::new(strata_bin())
        .args([
            "peer",
            what,
            "--listen",
            "127.0.0.1:0",
            "--node",
            node,
            "--certs",
        ])
        .arg(certs)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "{}: {e} (benches/l2-bench.sh builds it)",
                strata_bin().display()
            )
        })?;
    let mut line = String::new();
    if let Some(out) = child.stdout.as_mut() {
        let mut out = BufReader::new(out);
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        if extra.contains(&"--prefault") {
            // Ready once its buffers are faulted in (as a peer started
            // with the node is long before the first checkpoint).
            let mut more = String::new();
            while !more.contains("faulted in") {
                more.clear();
                if out.read_line(&mut more).map_err(|e| e.to_string())? == 0 {
                    return Err("the peer ended before its prefault".into());
                }
            }
            println!("  ({})", more.trim_start_matches("strata peer ").trim_end());
        }
    }
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|a| a.trim().parse().ok())
        .ok_or_else(|| format!("no address in {line:?}"))?;
    Ok((Proc(child), addr))
}

fn gb(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

/// `n` bytes up (op 0) or down (op 1) over `conns` connections with
/// `streams` streams each, all at once: how far QUIC goes with more
/// parallelism than one stream.
async fn raw_parallel(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    op: u8,
    n: u64,
    conns: usize,
    streams: usize,
) -> Result<Duration, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut links = Vec::new();
    for _ in 0..conns.max(1) {
        links.push(
            ep.connect(addr, "sink")
                .map_err(|x| e(&x))?
                .await
                .map_err(|x| e(&x))?,
        );
    }
    let per = n / (conns.max(1) * streams.max(1)) as u64;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for conn in &links {
        for _ in 0..streams.max(1) {
            let conn = conn.clone();
            tasks.push(tokio::spawn(async move {
                let e = |e: &dyn std::fmt::Display| e.to_string();
                let (mut send, mut recv) = conn.open_bi().await.map_err(|x| e(&x))?;
                let mut head = vec![op];
                head.extend_from_slice(&per.to_le_bytes());
                send.write_all(&head).await.map_err(|x| e(&x))?;
                let mut got = 0u64;
                if op == 0 {
                    let buf = vec![7u8; 1 << 20];
                    let mut left = per;
                    while left > 0 {
                        let k = left.min(buf.len() as u64) as usize;
                        send.write_all(&buf[..k]).await.map_err(|x| e(&x))?;
                        left -= k as u64;
                    }
                    send.finish().map_err(|x| e(&x))?;
                    let mut ack = [0u8; 8];
                    recv.read_exact(&mut ack).await.map_err(|x| e(&x))?;
                    got = u64::from_le_bytes(ack);
                } else {
                    send.finish().map_err(|x| e(&x))?;
                    while let Some(c) =
                        recv.read_chunk(usize::MAX, true).await.map_err(|x| e(&x))?
                    {
                        got += c.bytes.len() as u64;
                    }
                }
                if got == per {
                    Ok(())
                } else {
                    Err(format!("moved {got} of {per} bytes"))
                }
            }));
        }
    }
    for t in tasks {
        t.await.map_err(|x| x.to_string())??;
    }
    let d = t.elapsed();
    for c in links {
        c.close(0u32.into(), b"done");
    }
    Ok(d)
}

fn cfg(l1: &Path, peer: SocketAddr, certs: &Path) -> Config {
    Config::builder()
        .job(JOB)
        .l1_dir(l1)
        .keep_last(2)
        .gc_grace_secs(0)
        .peers("node-a", vec![format!("node-b={peer}")], certs)
        .replicas(1)
}

fn run(
    size: u64,
    reps: usize,
    dir: &Path,
    transport_only: bool,
    prefault: Option<&str>,
) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let certs = dir.join("certs");
    make_certs(
        &certs,
        &["node-a".into(), "node-b".into(), "sink".into()],
        &[],
        &[JOB.into()],
    )
    .map_err(|e| e.to_string())?;
    let (specs, mut data) = synthetic::generate(size, 7, default_threads());
    let logical: u64 = data.iter().map(|d| d.len() as u64).sum();
    println!(
        "l2-bench: {:.2} GiB synthetic state ({} entries), peer processes on loopback, best of {reps}",
        logical as f64 / f64::from(1u32 << 30),
        specs.len()
    );
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let (sink, sink_addr) = start("sink", &certs, "sink", &[])?;
    let ep = rt.block_on(async {
        let mut ep =
            strata_peer::tls::endpoint("127.0.0.1:0".parse().map_err(|e| format!("{e}"))?, None)
                .map_err(|e| e.to_string())?;
        ep.set_default_client_config(
            client_config(&CertFiles::in_dir(&certs, &format!("client-{JOB}")), 64)
                .map_err(|e| e.to_string())?,
        );
        Ok::<_, String>(ep)
    })?;

    let (mut raw_up, mut raw_down, mut push, mut restore) = (vec![], vec![], vec![], vec![]);
    // A resuming job's own tensors, allocated and written once (as a
    // model's parameters are before it loads a checkpoint into them).
    let mut into: Vec<Vec<u8>> = data.iter().map(|d| vec![0xA5u8; d.len()]).collect();
    let mut restore_into = vec![];
    let mut sent = (0u64, 0u64);
    for r in 0..reps {
        let sink_cpu = Cpu {
            server: sink.0.id().to_string(),
        };
        let c0 = sink_cpu.now();
        raw_up.push(rt.block_on(raw(&ep, sink_addr, 0, logical))?);
        sink_cpu.since(c0, "raw upload", raw_up[r]);
        let c0 = sink_cpu.now();
        raw_down.push(rt.block_on(raw(&ep, sink_addr, 1, logical))?);
        sink_cpu.since(c0, "raw download", raw_down[r]);
        if transport_only {
            println!(
                "  raw quinn, one stream: upload {:.2} GB/s, download {:.2} GB/s",
                gb(logical, raw_up[r]),
                gb(logical, raw_down[r])
            );
            for (conns, streams) in [(1, 4), (1, 8), (2, 4), (4, 2)] {
                let up = rt.block_on(raw_parallel(&ep, sink_addr, 0, logical, conns, streams))?;
                let down = rt.block_on(raw_parallel(&ep, sink_addr, 1, logical, conns, streams))?;
                println!(
                    "  raw quinn, {conns} connection(s) x {streams} streams: upload {:.2} GB/s, download {:.2} GB/s",
                    gb(logical, up),
                    gb(logical, down)
                );
            }
            continue;
        }

        let spill = dir.join(format!("spill-{r}")).display().to_string();
        let mut peer_args = vec!["--memory", "8GiB", "--spill", &spill];
        if let Some(p) = prefault {
            peer_args.extend(["--prefault", p]);
        }
        let (peer, peer_addr) = start("serve", &certs, "node-b", &peer_args)?;
        let peer_cpu = Cpu {
            server: peer.0.id().to_string(),
        };
        let l1 = dir.join(format!("l1-{r}"));
        {
            // The push alone (after the L1 commit, from L1): eager off.
            let ck = Checkpointer::new(cfg(&l1, peer_addr, &certs).eager_push(false))
                .map_err(|e| e.to_string())?;
            let entries: Vec<Entry<'_>> = synthetic::as_entries(&specs, &data);
            ck.save(1, &entries)
                .and_then(|h| h.wait())
                .map_err(|e| e.to_string())?;
            // The push starts when the step commits on L1.
            let (t, c0) = (Instant::now(), peer_cpu.now());
            ck.wait_replication();
            let d = t.elapsed();
            peer_cpu.since(c0, "push", d);
            match ck.replication().get(&1) {
                Some(L2State::Replicated { sent: s, .. }) => sent.0 = *s,
                other => return Err(format!("replication: {other:?}")),
            }
            push.push(d);
            if r == 0 {
                // 1 tensor in 20 changed.
                for d in data.iter_mut().skip(7).step_by(20) {
                    for at in (0..d.len()).step_by(1 << 20) {
                        d[at] ^= 0x5A;
                    }
                }
                let entries: Vec<Entry<'_>> = synthetic::as_entries(&specs, &data);
                ck.save(2, &entries)
                    .and_then(|h| h.wait())
                    .map_err(|e| e.to_string())?;
                ck.wait_replication();
                match ck.replication().get(&2) {
                    Some(L2State::Replicated { sent: s, .. }) => sent.1 = *s,
                    other => return Err(format!("replication of step 2: {other:?}")),
                }
            }
        }
        // The node's disk is lost: restore from the peer.
        std::fs::remove_dir_all(&l1).map_err(|e| e.to_string())?;
        let ck = Checkpointer::new(cfg(&l1, peer_addr, &certs).rehydrate_l1(false))
            .map_err(|e| e.to_string())?;
        let (t, c0) = (Instant::now(), peer_cpu.now());
        let got = ck
            .restore(StepSelector::Latest)
            .map_err(|e| e.to_string())?;
        restore.push(t.elapsed());
        peer_cpu.since(c0, "restore", t.elapsed());
        if got.stats.bytes_from_l2 != got.stats.bytes_read {
            return Err("the restore did not come from the peer".into());
        }
        for (s, d) in specs.iter().zip(&data) {
            if got.get(&s.name).map(|e| &e.bytes) != Some(d) {
                return Err(format!("{} differs after the restore", s.name));
            }
        }
        drop(got);
        // Again, into buffers the caller holds (L1 is still empty).
        let mut dests: Vec<(&str, &mut [u8])> = specs
            .iter()
            .zip(into.iter_mut())
            .map(|(s, b)| (s.name.as_str(), b.as_mut_slice()))
            .collect();
        let (t, c0) = (Instant::now(), peer_cpu.now());
        let st = ck
            .restore_into(StepSelector::Latest, &mut dests)
            .map_err(|e| e.to_string())?;
        restore_into.push(t.elapsed());
        peer_cpu.since(c0, "restore into the caller's buffers", t.elapsed());
        if st.bytes_from_l2 != st.bytes_read || into != data {
            return Err("the restore into buffers did not come whole from the peer".into());
        }
        for b in &mut into {
            b.fill(0xA5);
        }
    }
    if transport_only {
        return Ok(());
    }
    let min = |v: &[Duration]| v.iter().copied().min().unwrap_or_default();
    let row = |what: &str, ours: Duration, base: Duration, label: &str, goal: &str| {
        let (o, b) = (gb(logical, ours), gb(logical, base));
        println!(
            "  {what:<44} {o:>5.2} GB/s  {label} {b:>5.2} GB/s {:>8.2}  {goal}",
            o / b
        );
    };
    println!(
        "  {:<44} {:>10}  {:<34} {:>6}  goal",
        "measure", "Strata", "baseline (same run)", "ratio"
    );
    let push_label = match prefault {
        Some(p) => format!("push to a new peer, --prefault {p}"),
        None => "push to a peer (L1 read, check, put)".to_string(),
    };
    row(
        &push_label,
        min(&push),
        min(&raw_up),
        "raw quinn, one stream, upload  ",
        ">=0.8",
    );
    row(
        "restore from a peer (verify every chunk)",
        min(&restore),
        min(&raw_down),
        "raw quinn, one stream, download",
        "",
    );
    row(
        "restore from a peer into the caller's buffers",
        min(&restore_into),
        min(&raw_down),
        "raw quinn, one stream, download",
        ">=0.8",
    );
    println!(
        "  {:<44} {:>7.1} MiB  first push {:.1} MiB {:>16.3}  ~0.05",
        "push of a step with 1 tensor in 20 changed",
        sent.1 as f64 / f64::from(1u32 << 20),
        sent.0 as f64 / f64::from(1u32 << 20),
        sent.1 as f64 / sent.0.max(1) as f64
    );
    let steady = steady_pushes(&specs, &mut data, dir, &certs)?;
    let times: Vec<String> = steady
        .iter()
        .map(|d| format!("{:.2}", gb(logical, *d) / gb(logical, min(&raw_up))))
        .collect();
    println!(
        "  {:<44} {:>5.2} GB/s  {:<34} {:>6}  >=0.8",
        "push of a full step to a peer that retired one",
        gb(logical, steady[steady.len() - 1]),
        "(steps 1.. to one peer, ratio each:",
        format!("{})", times.join(" "))
    );
    time_to_replicated(&specs, &mut data, dir, &certs)?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Pushes of full steps (every chunk changed) to one peer process that
/// keeps one step and retires the older at once (`--keep-last 1
/// --grace-secs 0`): a long-running peer's steady state, where the memory
/// of a retired step serves a later one. Returns each push's time.
fn steady_pushes(
    specs: &[strata::format::EntrySpec],
    data: &mut [Vec<u8>],
    dir: &Path,
    certs: &Path,
) -> Result<Vec<Duration>, String> {
    let (peer, addr) = start(
        "serve",
        certs,
        "node-b",
        &[
            "--memory",
            "8GiB",
            "--keep-last",
            "1",
            "--grace-secs",
            "0",
            "--spill",
            &dir.join("spill-steady").display().to_string(),
        ],
    )?;
    let l1 = dir.join("l1-steady");
    let ck = Checkpointer::new(cfg(&l1, addr, certs).eager_push(false).keep_last(1))
        .map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    for step in 1..=4u64 {
        for d in data.iter_mut() {
            for at in (0..d.len()).step_by(1 << 20) {
                d[at] = d[at].wrapping_add(1);
            }
        }
        let entries: Vec<Entry<'_>> = synthetic::as_entries(specs, data);
        ck.save(step, &entries)
            .and_then(|h| h.wait())
            .map_err(|e| e.to_string())?;
        let peer_cpu = Cpu {
            server: peer.0.id().to_string(),
        };
        let (t, c0) = (Instant::now(), peer_cpu.now());
        ck.wait_replication();
        times.push(t.elapsed());
        peer_cpu.since(c0, &format!("push of step {step} to one peer"), t.elapsed());
        match ck.replication().get(&step) {
            Some(L2State::Replicated { .. }) => {}
            other => return Err(format!("replication of step {step}: {other:?}")),
        }
    }
    Ok(times)
}

/// Time from `save` to replicated on the peer, for a full step and then an
/// incremental one (1 tensor in 20 changed), with the push only after the
/// L1 commit and with the eager push beside the L1 write; each on a fresh
/// peer process and L1.
fn time_to_replicated(
    specs: &[strata::format::EntrySpec],
    data: &mut [Vec<u8>],
    dir: &Path,
    certs: &Path,
) -> Result<(), String> {
    let mut rows = Vec::new();
    for eager in [false, true] {
        let (_peer, addr) = start(
            "serve",
            certs,
            "node-b",
            &[
                "--memory",
                "8GiB",
                "--spill",
                &dir.join(format!("spill-eager-{eager}"))
                    .display()
                    .to_string(),
            ],
        )?;
        let l1 = dir.join(format!("l1-eager-{eager}"));
        let ck = Checkpointer::new(cfg(&l1, addr, certs).eager_push(eager))
            .map_err(|e| e.to_string())?;
        let mut times = Vec::new();
        for step in [1u64, 2] {
            if step == 2 {
                for d in data.iter_mut().skip(3).step_by(20) {
                    for at in (0..d.len()).step_by(1 << 20) {
                        d[at] ^= 0x33;
                    }
                }
            }
            let entries: Vec<Entry<'_>> = synthetic::as_entries(specs, data);
            let t = Instant::now();
            let durable = ck
                .save(step, &entries)
                .and_then(|h| h.wait())
                .map_err(|e| e.to_string())?;
            let on_l1 = t.elapsed();
            ck.wait_replication();
            let replicated = t.elapsed();
            let early = match ck.replication().get(&step) {
                Some(L2State::Replicated { sent, early, .. }) => (*early, *sent),
                other => return Err(format!("replication of step {step}: {other:?}")),
            };
            times.push((on_l1, replicated, early, durable.bytes_written));
        }
        rows.push((eager, times));
    }
    println!("  save -> replicated on the peer (time from the save call):");
    println!(
        "    {:<24} {:>14} {:>14} {:>22}",
        "step", "durable on L1", "replicated", "sent beside the write"
    );
    for (eager, times) in &rows {
        for (i, (on_l1, repl, (early, sent), _)) in times.iter().enumerate() {
            println!(
                "    {:<24} {:>12.2} s {:>12.2} s {:>10.1} of {:.1} MiB",
                format!(
                    "{} {}",
                    if i == 0 { "full" } else { "1 in 20 changed" },
                    if *eager { "eager" } else { "after commit" }
                ),
                on_l1.as_secs_f64(),
                repl.as_secs_f64(),
                *early as f64 / f64::from(1u32 << 20),
                *sent as f64 / f64::from(1u32 << 20)
            );
        }
    }
    for i in 0..2 {
        let (a, b) = (rows[0].1[i].1, rows[1].1[i].1);
        println!(
            "    {} step: eager push replicated in {:.2}x the time of the push after the commit",
            if i == 0 { "full" } else { "incremental" },
            b.as_secs_f64() / a.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}

fn main() {
    let mut size: u64 = 2 << 30;
    let mut reps = 2usize;
    let mut dir = PathBuf::from("strata-l2-bench");
    let mut transport_only = false;
    let mut prefault: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--transport-only" {
            transport_only = true;
            continue;
        }
        let v = args.next();
        match (a.as_str(), v) {
            ("--size", Some(v)) => {
                size = v
                    .trim_end_matches("GiB")
                    .trim_end_matches("MiB")
                    .parse::<u64>()
                    .map(|n| if v.ends_with("MiB") { n << 20 } else { n << 30 })
                    .unwrap_or(size)
            }
            ("--reps", Some(v)) => reps = v.parse().unwrap_or(reps).max(1),
            ("--dir", Some(v)) => dir = PathBuf::from(v),
            // A size of zero prefaults nothing (the peer then says nothing
            // to wait for).
            ("--prefault", Some(v)) => {
                let zero = v
                    .trim_end_matches(|c: char| c.is_ascii_alphabetic())
                    .parse::<f64>()
                    .is_ok_and(|n| n == 0.0);
                prefault = (!zero).then_some(v)
            }
            _ => {
                eprintln!(
                    "l2-bench [--size 2GiB|512MiB] [--reps 2] [--dir DIR] [--transport-only] [--prefault SIZE]"
                );
                std::process::exit(2);
            }
        }
    }
    if let Err(e) = run(size, reps, &dir, transport_only, prefault.as_deref()) {
        eprintln!("l2-bench: {e}");
        std::process::exit(1);
    }
}

//! `strata peer serve` (the L2 peer service) and `strata peer certs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use strata_peer::replicas::Limits;
use strata_peer::service::{Service, ServiceConfig};
use strata_peer::tls::{default_ca_dir, issue_client, make_certs_with_ca, CertFiles};

use crate::out::say;
use crate::size::parse_size;
use crate::CliError;

/// `strata peer ...`
#[derive(Subcommand, Debug)]
pub(crate) enum PeerCmd {
    /// Run the peer service: holds replicas of other nodes' checkpoints,
    /// serves them over QUIC with mutual TLS.
    ///
    /// Example: strata peer serve --listen 0.0.0.0:7070 --certs /etc/strata --node node-a
    Serve(ServeArgs),
    /// Make a cluster CA (or use the one already in --out and --ca-dir)
    /// and certificates for nodes and jobs, or, with --client, issue one
    /// more client certificate from the CA in --out.
    ///
    /// Example: strata peer certs --out certs --node node-a --node node-b --job llama
    Certs(CertsArgs),
    /// A raw QUIC endpoint with the same TLS as `serve` that only moves
    /// bytes: the baseline of the L2 benchmark (benches/l2-bench.sh).
    #[command(hide = true)]
    Sink(SinkArgs),
}

#[derive(Args, Debug)]
pub(crate) struct SinkArgs {
    /// UDP address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Directory with ca.pem and this node's certificate.
    #[arg(long)]
    certs: PathBuf,
    /// This node's name.
    #[arg(long)]
    node: String,
}

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// UDP address to listen on (port 0: any free port; the one bound is printed).
    #[arg(long, default_value = "0.0.0.0:7070")]
    listen: SocketAddr,
    /// Directory with ca.pem and this node's <node>.pem / <node>.key.
    #[arg(long)]
    certs: PathBuf,
    /// This node's name (its certificate file name).
    #[arg(long)]
    node: String,
    /// Spill directory: replicas beyond --memory, every manifest, commit
    /// record and pin, and on SIGTERM everything held; reloaded and
    /// verified at start (so a restart or an upgrade keeps L2). Give it
    /// room for --memory plus --disk.
    #[arg(long, default_value = "strata-peer-spill")]
    spill: PathBuf,
    /// Chunk bytes kept in memory.
    #[arg(long, default_value = "4GiB", value_parser = parse_size)]
    memory: u64,
    /// Chunk bytes spilled to disk beyond the memory budget.
    #[arg(long, default_value = "64GiB", value_parser = parse_size)]
    disk: u64,
    /// Manifest bytes kept in memory for all jobs together.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    manifest_memory: u64,
    /// Committed steps kept per job (the newest).
    #[arg(long, default_value_t = strata_gc::Retention::l2().keep_last)]
    keep_last: usize,
    /// Also keep every step divisible by this (0: none).
    #[arg(long, default_value_t = strata_gc::Retention::l2().keep_every)]
    keep_every: u64,
    /// Also keep steps committed within this many seconds.
    #[arg(long)]
    keep_within_secs: Option<u64>,
    /// A job no request named for this many seconds has its unpinned
    /// replicas dropped (0, the default: never). Only where L3 holds every
    /// job's steps: a job whose node died may have its newest steps only
    /// on the peers.
    #[arg(long, default_value_t = 0)]
    job_idle_secs: u64,
    /// Chunks touched this recently are never deleted by retention.
    #[arg(long, default_value_t = strata_gc::Retention::l2().grace.as_secs())]
    grace_secs: u64,
    /// Largest request (a chunk frame): chunks above it cannot be replicated here.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    max_chunk: u64,
    /// Request bytes held at once by the service.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    inflight: u64,
    /// Bytes allocated at once to answer requests (decoding compressed
    /// puts, spilled frames read back, ranged reads).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    work: u64,
    /// Chunk bytes (memory and disk) one job may hold (default: no quota
    /// beyond --memory and --disk).
    #[arg(long, value_parser = parse_size)]
    job_quota: Option<u64>,
    /// Manifest and commit record bytes one job may hold (default: no
    /// quota beyond --manifest-memory).
    #[arg(long, value_parser = parse_size)]
    job_manifest_quota: Option<u64>,
    /// Connections open at once; more are refused.
    #[arg(long, default_value_t = ServiceConfig::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Request buffers faulted in at start, for chunks of
    /// --prefault-chunk bytes (at most --memory plus --inflight), so the
    /// first steps pushed here land in memory already backed. A node that
    /// runs the service for a job's lifetime pays the page faults once,
    /// at start, instead of during the first checkpoints (0: none).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    prefault: u64,
    /// The chunk size of the jobs pushing here (their `chunk_size`), for
    /// --prefault.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    prefault_chunk: u64,
    /// Serve Prometheus metrics over HTTP on this address (`/metrics`).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Nice value of the service (0..=19): on a node that trains, the
    /// training processes get the cores first (0: no change).
    #[arg(long, default_value_t = 10)]
    nice: u8,
}

#[derive(Args, Debug)]
pub(crate) struct CertsArgs {
    /// Directory to write into (created).
    #[arg(long)]
    out: PathBuf,
    /// A node certificate per name (repeat).
    #[arg(long = "node")]
    nodes: Vec<String>,
    /// Extra IP addresses or DNS names for every node certificate (repeat).
    #[arg(long = "addr")]
    addrs: Vec<String>,
    /// A client certificate per job, `client-<job>.pem` (repeat); with
    /// --client, the jobs that one certificate allows.
    #[arg(long = "job")]
    jobs: Vec<String>,
    /// Issue only `client-<NAME>.pem` for --job ... from the existing CA.
    #[arg(long)]
    client: Option<String>,
    /// Where the CA's key is written (and read, with --client): kept apart
    /// from what is copied to nodes. Default: `<out>/private`.
    #[arg(long)]
    ca_dir: Option<PathBuf>,
}

pub(crate) fn run(cmd: &PeerCmd) -> Result<(), CliError> {
    match cmd {
        PeerCmd::Serve(a) => serve(a),
        PeerCmd::Certs(a) => certs(a),
        PeerCmd::Sink(a) => sink(a),
    }
}

fn certs(a: &CertsArgs) -> Result<(), CliError> {
    let ca_dir = a.ca_dir.clone().unwrap_or_else(|| default_ca_dir(&a.out));
    let written = match &a.client {
        Some(name) => issue_client(&a.out, &ca_dir, name, &a.jobs),
        None => make_certs_with_ca(&a.out, &ca_dir, &a.nodes, &a.addrs, &a.jobs),
    }
    .map_err(|e| CliError::Arg(e.to_string()))?;
    for f in written {
        say!("wrote {}", f.display());
    }
    Ok(())
}

/// Faults in request buffers on a thread of its own (at the service's
/// nice value, inherited), while the service already answers; says when
/// it is done.
fn prefault_in_background(service: &std::sync::Arc<Service>, node: &str, chunk: u64, bytes: u64) {
    let (service, node) = (service.clone(), node.to_string());
    let chunk = usize::try_from(chunk).unwrap_or(usize::MAX);
    let spawned = std::thread::Builder::new()
        .name("strata-prefault".into())
        .spawn(move || {
            let t = std::time::Instant::now();
            let added = service.prefault(chunk, bytes);
            say!(
                "strata peer {node}: {} of request buffers faulted in for {} chunks in {:.2} s",
                crate::size::human(added),
                crate::size::human(chunk as u64),
                t.elapsed().as_secs_f64()
            );
        });
    if let Err(e) = spawned {
        // Said on stdout like the thread's own line: whoever waits for
        // the prefault is not left waiting.
        say!("strata peer: 0 B of request buffers faulted in (cannot start the prefault thread: {e}; buffers fault in as requests arrive)");
    }
}

fn serve(a: &ServeArgs) -> Result<(), CliError> {
    return_large_buffers_to_the_system();
    // Before any thread starts: every thread of the service inherits it.
    strata::priority::lower_this_thread(a.nice);
    let cfg = ServiceConfig {
        node: a.node.clone(),
        listen: a.listen,
        certs: CertFiles::in_dir(&a.certs, &a.node),
        spill: a.spill.clone(),
        limits: Limits {
            memory_bytes: a.memory,
            disk_bytes: a.disk,
            keep_last: a.keep_last.max(1),
            keep_every: a.keep_every,
            keep_within: a.keep_within_secs.map(Duration::from_secs),
            grace: Duration::from_secs(a.grace_secs),
            max_chunk: u32::try_from(a.max_chunk).unwrap_or(u32::MAX),
            manifest_bytes: a.manifest_memory,
            job_bytes: a.job_quota.unwrap_or(u64::MAX),
            job_manifest_bytes: a.job_manifest_quota.unwrap_or(u64::MAX),
            job_idle: (a.job_idle_secs > 0).then(|| Duration::from_secs(a.job_idle_secs)),
        },
        max_streams: 32,
        inflight_bytes: usize::try_from(a.inflight).unwrap_or(usize::MAX),
        max_request: usize::try_from(a.max_chunk)
            .unwrap_or(usize::MAX)
            .saturating_add(ServiceConfig::ENVELOPE),
        work_bytes: usize::try_from(a.work).unwrap_or(usize::MAX),
        max_connections: a.max_connections.max(1),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-peer")
        .build()
        .map_err(|e| CliError::Arg(format!("cannot start the runtime: {e}")))?;
    rt.block_on(async {
        let service = Service::bind(&cfg).map_err(|e| CliError::Arg(e.to_string()))?;
        let addr = service
            .local_addr()
            .map_err(|e| CliError::Arg(e.to_string()))?;
        let metrics = match a.metrics {
            Some(m) => {
                let l = tokio::net::TcpListener::bind(m)
                    .await
                    .map_err(|e| CliError::Arg(format!("metrics on {m}: {e}")))?;
                let bound = l.local_addr().map_err(|e| CliError::Arg(e.to_string()))?;
                tokio::spawn(strata_peer::metrics::serve(l, service.clone()));
                format!(", metrics on http://{bound}/metrics")
            }
            None => String::new(),
        };
        say!("strata peer {}: listening on {addr}{metrics}", cfg.node);
        let back = service.reloaded();
        if back.chunks + back.steps + back.damaged + back.shards_dropped > 0 {
            say!(
                "strata peer {}: reloaded {} chunks ({}) and {} steps of {} jobs from {}; dropped {} damaged chunks and {} incomplete shards",
                cfg.node,
                back.chunks,
                crate::size::human(back.bytes),
                back.steps,
                back.jobs,
                cfg.spill.display(),
                back.damaged,
                back.shards_dropped
            );
        }
        if a.prefault > 0 {
            prefault_in_background(&service, &cfg.node, a.prefault_chunk, a.prefault);
        }
        let runner = tokio::spawn(service.clone().run());
        wait_for_signal().await;
        say!("strata peer {}: shutting down", cfg.node);
        service.shutdown().await;
        runner.abort();
        Ok(())
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The benchmark's raw baseline. On each stream: u8 op and u64 n; op 0:
/// read n bytes, answer the u64 count; op 1: send n bytes.
fn sink(a: &SinkArgs) -> Result<(), CliError> {
    let server = strata_peer::tls::server_config(&CertFiles::in_dir(&a.certs, &a.node), 32)
        .map_err(|e| CliError::Arg(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Arg(e.to_string()))?;
    rt.block_on(async {
        let ep = strata_peer::tls::endpoint(a.listen, Some(server))
            .map_err(|e| CliError::Arg(format!("{}: {e}", a.listen)))?;
        let addr = ep.local_addr().map_err(|e| CliError::Arg(e.to_string()))?;
        say!("strata peer sink {}: listening on {addr}", a.node);
        let accept = async {
            while let Some(inc) = ep.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = inc.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        tokio::spawn(async move {
                            let mut head = [0u8; 9];
                            if recv.read_exact(&mut head).await.is_err() {
                                return;
                            }
                            let mut n = [0u8; 8];
                            n.copy_from_slice(&head[1..]);
                            let n = u64::from_le_bytes(n);
                            let buf = vec![0u8; 1 << 20];
                            if head[0] == 0 {
                                let mut got = 0u64;
                                while let Ok(Some(c)) = recv.read_chunk(usize::MAX, true).await {
                                    got += c.bytes.len() as u64;
                                }
                                let _ = send.write_all(&got.to_le_bytes()).await;
                            } else {
                                let mut left = n;
                                while left > 0 {
                                    let k = left.min(buf.len() as u64) as usize;
                                    if send.write_all(&buf[..k]).await.is_err() {
                                        return;
                                    }
                                    left -= k as u64;
                                }
                            }
                            let _ = send.finish();
                            let _ = send.stopped().await;
                        });
                    }
                });
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = wait_for_signal() => {}
        }
        Ok(())
    })
}

/// The service allocates and frees buffers of up to a chunk (requests,
/// decodes, spilled frames) on many threads. glibc would keep freed large
/// buffers in its arenas once its adaptive threshold has grown, so the
/// process would stay as large as its worst moment; with a fixed 1 MiB
/// threshold they are mapped and unmapped, and its memory follows its
/// budgets.
fn return_large_buffers_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before
    // the runtime starts any thread, reads no pointer and cannot fail
    // unsafely (a refusal returns 0 and changes nothing).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

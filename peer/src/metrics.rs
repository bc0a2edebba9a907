//! `/metrics` for Prometheus: a minimal HTTP/1.1 responder (one request per
//! connection, bounded reads, a timeout) over the service's counters:
//! what it holds in all and per job (`job` label), its traffic, request
//! latency by kind (`op` label), and what its start reloaded or dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::prom::{head, quoted};
use crate::replicas::JobHeld;
use crate::service::{Service, OPS};

/// The counters in Prometheus' text format.
pub fn render(service: &Service) -> String {
    let s = service.stats();
    let c = service.counters();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in samples {
            out.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    metric(
        "strata_peer_bytes_held",
        "gauge",
        "Chunk bytes held, by place.",
        &[
            ("{place=\"memory\"}", s.bytes_in_memory),
            ("{place=\"disk\"}", s.bytes_on_disk),
        ],
    );
    metric(
        "strata_peer_chunks",
        "gauge",
        "Chunks held.",
        &[("", s.chunks)],
    );
    metric(
        "strata_peer_manifest_bytes",
        "gauge",
        "Manifest bytes held (all jobs).",
        &[("", service.manifest_bytes())],
    );
    metric(
        "strata_peer_jobs",
        "gauge",
        "Jobs with chunks held.",
        &[("", s.jobs)],
    );
    metric(
        "strata_peer_bytes_in_total",
        "counter",
        "Request bytes received.",
        &[("", s.bytes_in)],
    );
    metric(
        "strata_peer_bytes_out_total",
        "counter",
        "Response bytes sent.",
        &[("", s.bytes_out)],
    );
    metric(
        "strata_peer_connections",
        "gauge",
        "Client connections open.",
        &[("", s.connections)],
    );
    metric(
        "strata_peer_refused_connections_total",
        "counter",
        "Connections refused (TLS, authorization, handshake).",
        &[("", s.refused)],
    );
    metric(
        "strata_peer_requests_total",
        "counter",
        "Requests answered.",
        &[("", c.requests.load(Ordering::Relaxed))],
    );
    metric(
        "strata_peer_errors_total",
        "counter",
        "Requests answered with an error.",
        &[("", s.errors)],
    );
    metric(
        "strata_peer_jobs_expired_total",
        "counter",
        "Idle jobs whose unpinned replicas were dropped (--job-idle-secs).",
        &[("", c.jobs_expired.load(Ordering::Relaxed))],
    );
    let arena = service.arena();
    metric(
        "strata_peer_buffer_bytes",
        "gauge",
        "Request buffers: kept free for the next puts (a retired step's), and in use (requests and replicas in memory).",
        &[
            ("{state=\"free\"}", arena.free_bytes),
            ("{state=\"in_use\"}", arena.out_bytes),
        ],
    );
    metric(
        "strata_peer_buffers_total",
        "counter",
        "Large requests by where their buffer came from: reused from a retired step, or fresh from the kernel (zeroed and faulted in).",
        &[
            ("{source=\"reused\"}", arena.reused),
            ("{source=\"fresh\"}", arena.fresh),
        ],
    );
    let back = service.reloaded();
    metric(
        "strata_peer_reloaded_chunks",
        "gauge",
        "Chunks this start reloaded from the spill directory, verified.",
        &[("", back.chunks)],
    );
    metric(
        "strata_peer_dropped_at_start",
        "gauge",
        "What this start dropped: spilled frames that did not match their name, and shards naming a chunk not held.",
        &[
            ("{what=\"damaged_chunks\"}", back.damaged),
            ("{what=\"incomplete_shards\"}", back.shards_dropped),
        ],
    );
    let jobs = service.jobs();
    let label = |j: &JobHeld| format!("job=\"{}\"", quoted(&j.job));
    let per_job = |f: fn(&JobHeld) -> u64| -> Vec<(String, u64)> {
        jobs.iter()
            .map(|j| (format!("{{{}}}", label(j)), f(j)))
            .collect()
    };
    let held: Vec<(String, u64)> = jobs
        .iter()
        .flat_map(|j| {
            [("memory", j.memory), ("disk", j.disk)]
                .map(|(place, v)| (format!("{{{},place=\"{place}\"}}", label(j)), v))
        })
        .collect();
    for (name, help, samples) in [
        (
            "strata_peer_job_bytes_held",
            "Chunk bytes held for a job, by place.",
            held,
        ),
        (
            "strata_peer_job_chunks",
            "Chunks held for a job.",
            per_job(|j| j.chunks),
        ),
        (
            "strata_peer_job_manifest_bytes",
            "Manifest and commit record bytes held for a job.",
            per_job(|j| j.manifest_bytes),
        ),
    ] {
        let refs: Vec<(&str, u64)> = samples.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(name, "gauge", help, &refs);
    }
    let name = "strata_peer_request_seconds";
    head(
        &mut out,
        name,
        "histogram",
        "Time from a request's stream opening to its answer handed to QUIC, by kind.",
    );
    for (op, h) in OPS.iter().zip(&c.latency) {
        h.render_samples(&mut out, name, &format!("op=\"{op}\""));
    }
    out
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, service: Arc<Service>) {
    while let Ok((mut sock, _)) = listener.accept().await {
        let service = service.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                let mut head = Vec::with_capacity(512);
                let mut buf = [0u8; 1024];
                while !crate::prom::head_done(&head) {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = crate::prom::answer(&head, || Some(render(&service)));
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            })
            .await;
        });
    }
}

//! `/metrics` for Prometheus: a minimal HTTP/1.1 responder (one request per
//! connection, bounded reads, a timeout) over the service's counters.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::service::Service;

/// Largest request head read.
const MAX_HEAD: usize = 8192;

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
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
                let (status, body) = if line.starts_with(b"GET /metrics ") || line == b"GET /metrics"
                {
                    ("200 OK", render(&service))
                } else {
                    ("404 Not Found", "only /metrics is served here\n".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            })
            .await;
        });
    }
}

//! `metrics_listen`: `/metrics` over plain HTTP/1.1 from a thread of the
//! training process (one request per connection, the head bounded, reads
//! and writes under a timeout, so a slow or hostile client holds the
//! thread for two seconds at most and never grows its memory).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::shared::Shared;

/// Largest request head read.
const MAX_HEAD: usize = 8192;
/// How long one client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The running endpoint; stopped (and its thread joined) when dropped.
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `listen` and serves the checkpointer's metrics from a thread
    /// that holds it weakly (the checkpointer's close is not held up).
    pub(crate) fn start(listen: &str, shared: Weak<Shared>) -> Result<MetricsServer> {
        let listener = TcpListener::bind(listen)
            .map_err(|e| Error::Config(format!("metrics_listen {listen:?}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Config(format!("metrics_listen {listen:?}: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("strata-metrics".into())
            .spawn(move || {
                for sock in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(sock) = sock else { continue };
                    answer(sock, &shared);
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the metrics thread: {e}")))?;
        tracing::info!(%addr, "metrics served at http://{addr}/metrics");
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens (the port chosen where `metrics_listen` named 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; its thread then sees the flag.
        let wake = match self.addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], a.port()))
            }
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
            }
            a => a,
        };
        let woke = TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.thread.take() {
            if woke {
                let _ = t.join();
            }
            // Otherwise the thread is left to end with the process: a
            // join could wait forever on an accept nothing wakes.
        }
    }
}

/// Reads one request head and answers it.
fn answer(mut sock: TcpStream, shared: &Weak<Shared>) {
    let _ = sock.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = sock.set_write_timeout(Some(CLIENT_TIMEOUT));
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let path = line.split(|&b| b == b' ').nth(1).unwrap_or_default();
    let (status, body) = match (line.starts_with(b"GET "), path) {
        (true, b"/metrics") => match shared.upgrade() {
            Some(s) => ("200 OK", s.metrics_text()),
            None => (
                "503 Service Unavailable",
                "the checkpointer is closed\n".into(),
            ),
        },
        _ => (
            "404 Not Found",
            "only GET /metrics is served here\n".to_string(),
        ),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(resp.as_bytes());
    let _ = sock.flush();
}

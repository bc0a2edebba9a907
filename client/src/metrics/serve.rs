//! `metrics_listen`: `/metrics` over plain HTTP/1.1 from a thread of the
//! training process: one request per connection, the head bounded, and
//! each client given 2 s in all to send its request and read the answer,
//! so a slow or hostile client holds the thread 2 s at most and never
//! grows its memory. The listener is bound before the checkpointer starts
//! anything else (an address in use fails the build cleanly), and polled,
//! so closing the checkpointer stops the thread within a poll and frees
//! the port.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Renders the metrics, or None once the checkpointer is gone.
pub(crate) type Render = Box<dyn Fn() -> Option<String> + Send>;

/// How long one client may take, in all, to send its request and read
/// the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the idle listener looks for a connection or a stop.
const POLL: Duration = Duration::from_millis(50);

/// A bound `metrics_listen` address, not served yet.
pub(crate) struct Bound(TcpListener);

/// Binds `listen` (port 0: one the system picks).
pub(crate) fn bind(listen: &str) -> Result<Bound> {
    let bad = |e: std::io::Error| Error::Config(format!("metrics_listen {listen:?}: {e}"));
    let listener = TcpListener::bind(listen).map_err(bad)?;
    listener.set_nonblocking(true).map_err(bad)?;
    Ok(Bound(listener))
}

/// The running endpoint; stopped (its thread joined, its port freed) when
/// dropped.
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves what `render` renders on `bound`, from a thread of its own
    /// (the checkpointer hands a renderer that holds it weakly, so its
    /// close is not held up by it).
    pub(crate) fn start(bound: Bound, render: Render) -> Result<MetricsServer> {
        let listener = bound.0;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Config(format!("metrics_listen: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("strata-metrics".into())
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((sock, _)) => answer(sock, &render),
                        // Nothing waiting, or a failure that may last
                        // (descriptors exhausted): never a busy loop.
                        Err(_) => std::thread::sleep(POLL),
                    }
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
        // Ends within one poll, or one client's time limit.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request head and answers it, within [`CLIENT_TIMEOUT`] in all.
fn answer(mut sock: TcpStream, render: &Render) {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    // An accepted socket may inherit the listener's non-blocking mode.
    let _ = sock.set_nonblocking(false);
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !strata_peer::prom::head_done(&head) {
        let Some(d) = left() else { return };
        let _ = sock.set_read_timeout(Some(d));
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    let resp = strata_peer::prom::answer(&head, render);
    let mut rest = resp.as_bytes();
    while !rest.is_empty() {
        let Some(d) = left() else { return };
        let _ = sock.set_write_timeout(Some(d));
        match sock.write(rest) {
            Ok(0) | Err(_) => return,
            Ok(n) => rest = &rest[n..],
        }
    }
    let _ = sock.flush();
}

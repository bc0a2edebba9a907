//! The peer service (`strata peer serve`): QUIC with mutual TLS, one
//! request per bidirectional stream, replicas in [`Replicas`].
//!
//! Bounds: a connection has at most `max_streams` requests open (QUIC flow
//! control makes a client wait for more); every request's length is checked
//! before anything is allocated, and all requests in flight on the service
//! together hold at most `inflight_bytes` (a semaphore); a request must
//! arrive whole within [`REQUEST_TIMEOUT`]. A connection must say `Hello`
//! within [`HELLO_TIMEOUT`] naming a job its certificate lists, or it is
//! closed unread. A bad request gets an error response and the connection
//! stays usable; the service keeps serving everyone else.
//!
//! This module owns the service's lifecycle (bind, accept, the `Hello`,
//! the budgets, shutdown); `config.rs` its settings, start-up errors and
//! counters; `serve.rs` the answer to each request after `Hello`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use strata_tiered::{StoreError, StoreErrorKind};
use tokio::sync::Semaphore;

use crate::proto::{message_len, ErrorCode, Request, Response, ServiceStats, MAX_MESSAGE, VERSION};
use crate::replicas::Replicas;
use crate::tls::{allows_job, server_config_with_windows};
pub use config::{Counters, ServiceConfig, ServiceError, OPS};

mod arena;
mod config;
mod serve;

pub use arena::ArenaStats;
use arena::{Arena, ArenaBuf};

/// Time a new connection has to complete its `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a request has to arrive whole once its first byte did.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest `Hello` (a version and a job id): a client is not trusted with
/// the service's request budget before it has named an allowed job.
pub const MAX_HELLO: usize = 1024;
/// Time [`Service::shutdown`] lets requests in flight finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// A request's share of the connection's and the service's budgets.
type Permits<'a> = (
    tokio::sync::SemaphorePermit<'a>,
    tokio::sync::OwnedSemaphorePermit,
);
/// A share of the connection's and the service's work pools.
type Work = (
    tokio::sync::OwnedSemaphorePermit,
    tokio::sync::OwnedSemaphorePermit,
);

/// Semaphore unit for in-flight bytes.
const UNIT: usize = 1024;

/// A running peer service.
pub struct Service {
    endpoint: quinn::Endpoint,
    replicas: Arc<Replicas>,
    counters: Arc<Counters>,
    inflight: Arc<Semaphore>,
    inflight_units: usize,
    /// Bytes allocated to answer requests (see [`ServiceConfig::work_bytes`]).
    work: Arc<Semaphore>,
    work_units: usize,
    max_request: usize,
    max_connections: usize,
    /// Connections accepted and not yet closed (handshakes included).
    open: AtomicU64,
    /// Refusals not logged yet (at most one line a second).
    unlogged_refusals: AtomicU64,
    last_refusal_log: std::sync::Mutex<Option<std::time::Instant>>,
    node: String,
    /// Requests being served now (a graceful shutdown waits for them).
    active: AtomicU64,
    /// Set by a shutdown: new requests are refused as `Unavailable`.
    draining: std::sync::atomic::AtomicBool,
    /// Request buffers reused across steps.
    arena: Arc<Arena>,
}

/// Counts a request as active while it lives.
struct ActiveGuard<'a>(&'a AtomicU64);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Service({})", self.node)
    }
}

impl Service {
    /// Binds the service (inside a tokio runtime). Call [`Self::run`] to
    /// serve.
    pub fn bind(cfg: &ServiceConfig) -> Result<Arc<Self>, ServiceError> {
        let max_request = cfg.max_request.clamp(4096, MAX_MESSAGE);
        let units = (cfg.inflight_bytes / UNIT).max(4 * max_request.div_ceil(UNIT));
        // What QUIC buffers for one connection: request bytes up to the
        // connection's share of the request budget (it reads no more at
        // once), answers as much (a smaller send window slowed restores
        // from a peer by about 15% here). So a connection costs
        // at most `connection_window()` beyond the budgets.
        let (receive, send) = Self::windows(units, max_request);
        let server = server_config_with_windows(
            &cfg.certs,
            cfg.max_streams,
            Some((receive as u64, send as u64)),
        )?;
        // A put's frame is decoded to be verified: no chunk larger than a
        // request is accepted, so one put cannot claim more memory.
        let mut limits = cfg.limits.clone();
        limits.max_chunk = limits
            .max_chunk
            .min(u32::try_from(max_request).unwrap_or(u32::MAX));
        let replicas = Replicas::new(&cfg.spill, limits)?;
        let endpoint = crate::tls::endpoint(cfg.listen, Some(server)).map_err(|source| {
            ServiceError::Bind {
                addr: cfg.listen,
                source,
            }
        })?;
        // One ranged read of the largest chunk needs its frame, the decoded
        // chunk and the answer.
        let work_units = (cfg.work_bytes / UNIT).max(3 * max_request.div_ceil(UNIT));
        Ok(Arc::new(Service {
            endpoint,
            replicas: Arc::new(replicas),
            counters: Arc::new(Counters::default()),
            inflight: Arc::new(Semaphore::new(units)),
            inflight_units: units,
            work: Arc::new(Semaphore::new(work_units)),
            work_units,
            max_request,
            max_connections: cfg.max_connections.max(1),
            open: AtomicU64::new(0),
            unlogged_refusals: AtomicU64::new(0),
            last_refusal_log: std::sync::Mutex::new(None),
            node: cfg.node.clone(),
            active: AtomicU64::new(0),
            draining: std::sync::atomic::AtomicBool::new(false),
            // What the budgets let it hold at its peak anyway: replicas in
            // memory and requests in flight.
            arena: Arena::new(
                cfg.limits
                    .memory_bytes
                    .saturating_add((units * UNIT) as u64),
            ),
        }))
    }

    /// A connection's QUIC windows (receive, send) in bytes, for a request
    /// budget of `units` and the largest request.
    fn windows(units: usize, max_request: usize) -> (usize, usize) {
        let share = Self::connection_units(units, max_request) * UNIT;
        (share, share)
    }

    /// One connection's share of the request budget, in units.
    fn connection_units(units: usize, max_request: usize) -> usize {
        (units / 4).max(max_request.div_ceil(UNIT))
    }

    /// What one open connection may make QUIC buffer beyond the service's
    /// budgets (its receive and send windows): the service's memory is
    /// bounded by `--memory`, `--inflight`, `--work`, `--manifest-memory`,
    /// plus this times the connections open (at most `--max-connections`).
    pub fn connection_window(&self) -> u64 {
        let (r, s) = Self::windows(self.inflight_units, self.max_request);
        (r + s) as u64
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Serves until [`Self::shutdown`]; expires idle jobs meanwhile
    /// (`Limits::job_idle`).
    pub async fn run(self: Arc<Self>) {
        if let Some(idle) = self.replicas.limits().job_idle {
            // A weak reference: the ticker never keeps a stopped service
            // (its socket, its spill directory's lock) alive.
            let me = Arc::downgrade(&self);
            tokio::spawn(expire_idle_jobs(me, idle));
        }
        while let Some(incoming) = self.endpoint.accept().await {
            if self.open.load(Ordering::Acquire) >= self.max_connections as u64 {
                let remote = incoming.remote_address();
                incoming.refuse();
                self.refuse("too many connections", remote);
                continue;
            }
            self.open.fetch_add(1, Ordering::AcqRel);
            let me = self.clone();
            tokio::spawn(async move {
                // Counted down even if the connection's task panics.
                let _open = ActiveGuard(&me.open);
                me.clone().connection(incoming).await;
            });
        }
    }

    /// Stops gracefully: refuses new connections and new requests
    /// (`Unavailable`, so clients go to another replica), lets the requests
    /// in flight finish for up to [`SHUTDOWN_GRACE`], closes every
    /// connection and waits until they are gone, then writes the replicas
    /// held in memory to the spill directory, where the next start of the
    /// service reloads them.
    pub async fn shutdown(&self) {
        self.shutdown_within(SHUTDOWN_GRACE).await;
    }

    /// [`Self::shutdown`] with a chosen grace period.
    pub async fn shutdown_within(&self, grace: Duration) {
        self.draining.store(true, Ordering::Release);
        self.endpoint.set_server_config(None);
        let deadline = tokio::time::Instant::now() + grace;
        while self.active.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.inflight.close();
        self.work.close();
        self.endpoint.close(0u32.into(), b"shutting down");
        self.endpoint.wait_idle().await;
        // What is held in memory goes to the spill disk, so that the next
        // start of the service (an upgrade, a restart) serves it again.
        let r = self.replicas.clone();
        match tokio::task::spawn_blocking(move || r.keep_memory_on_disk()).await {
            Ok(Ok((kept, 0))) => tracing::info!(kept, "replicas in memory kept on disk"),
            Ok(Ok((kept, lost))) => {
                tracing::warn!(
                    kept,
                    lost,
                    "some replicas in memory could not be kept on disk"
                )
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "replicas in memory not kept on disk"),
            Err(e) => tracing::warn!(error = %e, "keeping replicas on disk"),
        }
    }

    /// What is held for every job.
    pub fn jobs(&self) -> Vec<crate::replicas::JobHeld> {
        self.replicas.jobs().unwrap_or_default()
    }

    /// What this start found in the spill directory (reloaded, verified,
    /// dropped).
    pub fn reloaded(&self) -> crate::replicas::Reloaded {
        self.replicas.reloaded()
    }

    /// The request buffers: kept free, in use, and where they came from.
    pub fn arena(&self) -> ArenaStats {
        self.arena.stats()
    }

    /// Faults in free request buffers for chunks of `chunk_size` bytes
    /// until `bytes` are held (at most the service's memory and in-flight
    /// budgets together), so that the first steps pushed to a new service
    /// land in memory already backed rather than pages zeroed and faulted
    /// in as they arrive. Blocking (it writes every page): call it from a
    /// thread of its own. Returns the bytes it added.
    pub fn prefault(&self, chunk_size: usize, bytes: u64) -> u64 {
        // A chunk put is the chunk's frame in a request envelope: room for
        // the largest envelope (a reserve buffer is cut to the class a put
        // needs).
        self.arena
            .prefault(chunk_size.saturating_add(ServiceConfig::ENVELOPE), bytes)
    }

    /// Requests being served now.
    pub fn active_requests(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Counters and holdings as the protocol reports them.
    pub fn stats(&self) -> ServiceStats {
        self.stats_with(self.replicas.stats().unwrap_or_default())
    }

    /// Manifest bytes held for all jobs (their budget is `--manifest-memory`).
    pub fn manifest_bytes(&self) -> u64 {
        self.replicas.manifest_bytes().unwrap_or_default()
    }

    /// [`Self::stats`] as a job's client sees it: what is held for its own
    /// job (other jobs' holdings are not its business), and the service's
    /// traffic counters.
    fn job_stats(&self, job: &str) -> ServiceStats {
        let (mem, disk, chunks) = self.replicas.job_stats(job).unwrap_or_default();
        self.stats_with((mem, disk, chunks, u64::from(chunks > 0)))
    }

    /// The traffic counters with `held` (bytes in memory, on disk, chunks,
    /// jobs).
    fn stats_with(&self, held: (u64, u64, u64, u64)) -> ServiceStats {
        let (bytes_in_memory, bytes_on_disk, chunks, jobs) = held;
        let c = &self.counters;
        ServiceStats {
            bytes_in_memory,
            bytes_on_disk,
            chunks,
            jobs,
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
        }
    }

    /// Counts a refused connection; logs at most one line a second (junk
    /// datagrams must not flood the log), with how many went unlogged.
    fn refuse(&self, why: &str, remote: SocketAddr) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        let now = std::time::Instant::now();
        let due = match self.last_refusal_log.lock() {
            Ok(mut last) => {
                let due = last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
                if due {
                    *last = Some(now);
                }
                due
            }
            Err(_) => false,
        };
        if due {
            let more = self.unlogged_refusals.swap(0, Ordering::AcqRel);
            tracing::warn!(%remote, why, unlogged_since_last = more, "connection refused");
        } else {
            self.unlogged_refusals.fetch_add(1, Ordering::AcqRel);
        }
    }

    async fn connection(self: Arc<Self>, incoming: quinn::Incoming) {
        let remote = incoming.remote_address();
        // The TLS handshake refuses a missing certificate or one from
        // another CA before any request is read.
        let conn = match incoming.await {
            Ok(c) => c,
            Err(e) => return self.refuse(&e.to_string(), remote),
        };
        let cert: Option<CertificateDer<'static>> = conn
            .peer_identity()
            .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
            .and_then(|v| v.into_iter().next());
        let Some(cert) = cert else {
            conn.close(1u32.into(), b"no client certificate");
            return self.refuse("no client certificate", remote);
        };
        let job = match tokio::time::timeout(HELLO_TIMEOUT, self.hello(&conn, &cert)).await {
            Ok(Ok(job)) => job,
            Ok(Err(why)) => {
                conn.close(2u32.into(), why.as_bytes());
                return self.refuse(&why, remote);
            }
            Err(_) => {
                conn.close(2u32.into(), b"no hello in time");
                return self.refuse("no hello in time", remote);
            }
        };
        tracing::info!(%remote, job, "client connected");
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        let job: Arc<str> = job.into();
        // One connection may hold at most a quarter of the service's
        // in-flight budget: a client that announces large requests and
        // sends them slowly cannot starve the others.
        let mine = Arc::new(Semaphore::new(Self::connection_units(
            self.inflight_units,
            self.max_request,
        )));
        // And at most its share of the work pool.
        let work = Arc::new(Semaphore::new(self.work_share_units()));
        while let Ok((send, recv)) = conn.accept_bi().await {
            let (me, job, mine, work) = (self.clone(), job.clone(), mine.clone(), work.clone());
            tokio::spawn(async move { me.stream(&job, &mine, &work, send, recv).await });
        }
        self.counters.connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// The first stream: `Hello` with our version and an allowed job.
    async fn hello(
        &self,
        conn: &quinn::Connection,
        cert: &CertificateDer<'_>,
    ) -> Result<String, String> {
        let (mut send, mut recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
        let mine = Semaphore::new(MAX_HELLO.div_ceil(UNIT));
        let refuse = |code, text: String| Response::Error {
            code,
            message: text,
        };
        let read = self.read_request(&mut recv, &mine, MAX_HELLO).await;
        let decoded = match &read {
            Ok((msg, _)) => Request::decode(msg).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let (answer, outcome) = match decoded {
            Ok(Request::Hello { version, .. }) if version != VERSION => (
                refuse(
                    ErrorCode::Invalid,
                    format!("protocol version {version}; this service speaks {VERSION}"),
                ),
                Err(format!("version {version}")),
            ),
            Ok(Request::Hello { job, .. }) if !allows_job(cert, &job) => (
                refuse(
                    ErrorCode::Forbidden,
                    format!("this certificate does not allow job {job:?}"),
                ),
                Err(format!("certificate does not allow job {job:?}")),
            ),
            Ok(Request::Hello { job, .. }) => (
                Response::HelloOk {
                    version: VERSION,
                    node: self.node.clone(),
                },
                Ok(job),
            ),
            Ok(_) => (
                refuse(ErrorCode::Invalid, "the first request must be Hello".into()),
                Err("no hello".into()),
            ),
            Err(e) => (
                refuse(ErrorCode::Invalid, e.to_string()),
                Err(e.to_string()),
            ),
        };
        let _ = send.write_all(&answer.encode()).await;
        let _ = send.finish();
        if outcome.is_err() {
            // Let the refusal reach the client before the close.
            let _ = tokio::time::timeout(Duration::from_millis(200), send.stopped()).await;
        }
        outcome
    }

    /// Reads one length-prefixed request of at most `limit` bytes, holding
    /// its size in the service-wide in-flight budget until the permit drops.
    async fn read_request<'a>(
        &self,
        recv: &mut quinn::RecvStream,
        mine: &'a Semaphore,
        limit: usize,
    ) -> Result<(ArenaBuf, Permits<'a>), StoreError> {
        let bad = |e: String| StoreError::invalid("peer request", e);
        let mut prefix = [0u8; 4];
        recv.read_exact(&mut prefix)
            .await
            .map_err(|e| bad(e.to_string()))?;
        let len = message_len(prefix).map_err(|e| bad(e.to_string()))?;
        if len > limit {
            return Err(bad(format!(
                "a request of {len} bytes exceeds this service's limit of {limit}"
            )));
        }
        let units = u32::try_from(len.div_ceil(UNIT)).unwrap_or(u32::MAX);
        let closed = |_| StoreError::Unavailable("shutting down".into());
        // The connection's share first, then the service's.
        let local = mine.acquire_many(units).await.map_err(closed)?;
        let global = self
            .inflight
            .clone()
            .acquire_many_owned(units)
            .await
            .map_err(closed)?;
        let permit = (local, global);
        // A chunk put is kept where it lands, in a buffer a retired step
        // gave back where one is free (`arena`).
        let mut msg = self.arena.take(len);
        tokio::time::timeout(REQUEST_TIMEOUT, recv.read_exact(&mut msg))
            .await
            .map_err(|_| bad("request not received in time".into()))?
            .map_err(|e| bad(e.to_string()))?;
        self.counters
            .bytes_in
            .fetch_add(4 + len as u64, Ordering::Relaxed);
        Ok((msg, permit))
    }

    /// Serves one request stream, timed by the kind of its request.
    async fn stream(
        &self,
        job: &str,
        mine: &Semaphore,
        work: &Arc<Semaphore>,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    ) {
        self.active.fetch_add(1, Ordering::AcqRel);
        let _active = ActiveGuard(&self.active);
        let t0 = std::time::Instant::now();
        let op = self.stream_inner(job, mine, work, send, recv).await;
        self.counters.observe(op, t0.elapsed());
    }

    /// [`Self::stream`]'s work; returns the request's kind
    /// ([`config::OPS`]).
    async fn stream_inner(
        &self,
        job: &str,
        mine: &Semaphore,
        work: &Arc<Semaphore>,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) -> &'static str {
        if self.draining.load(Ordering::Acquire) {
            let bytes = error(
                ErrorCode::Unavailable,
                "the service is shutting down".into(),
            )
            .encode();
            if send.write_all(&bytes).await.is_ok() {
                let _ = send.finish();
            }
            return "refused";
        }
        let read = self.read_request(&mut recv, mine, self.max_request).await;
        // From the request's arrival until its answer is sent: an idle
        // job's expiry never runs beside a request of that job (a stream
        // opened with nothing on it does not hold it off).
        let _job = self.replicas.enter_job(job).await;
        let mut op = "invalid";
        let resp = match read {
            // A chunk is kept where it was received: no copy out of the
            // message.
            Ok((msg, _permit)) if crate::proto::put_chunk_in(&msg).is_some() => {
                match crate::proto::put_chunk_in(&msg) {
                    Some((id, at)) => {
                        op = "put_chunk";
                        let frame = bytes::Bytes::from_owner(msg).slice(at..);
                        self.put_chunk(job, work, id, frame).await
                    }
                    None => error(ErrorCode::Invalid, "not a put".into()),
                }
            }
            Ok((msg, _permit)) => match Request::decode(&msg) {
                // Whole frames go out without being copied into a message:
                // the envelope, then the stored bytes.
                Ok(Request::GetChunk { id, range: None }) => {
                    op = "get_chunk";
                    // A spilled frame is read into memory: its bytes wait
                    // for the work budget, held until it is sent.
                    let work = match self.spilled_len(job, &id) {
                        Ok(n) => self.work_permit(work, n).await,
                        Err(e) => Err(e),
                    };
                    let got = match work {
                        Ok(work) => {
                            let r = self.replicas.clone();
                            let job_s = job.to_string();
                            tokio::task::spawn_blocking(move || r.get_frame(&job_s, &id))
                                .await
                                .map_err(|e| StoreError::Internal(format!("request task: {e}")))
                                .and_then(|x| x)
                                .map(|f| (f, work))
                        }
                        Err(e) => Err(e),
                    };
                    match got {
                        Ok((frame, _work)) => {
                            self.send_frame(send, frame).await;
                            return op;
                        }
                        Err(e) => from_store(&e),
                    }
                }
                Ok(req) => {
                    let op = config::op_of(&req);
                    let mut hold = None;
                    let resp = self.dispatch(job, req, work, &mut hold).await;
                    self.answer(send, resp).await;
                    return op;
                }
                Err(e) => error(ErrorCode::Invalid, e.to_string()),
            },
            Err(e) => from_store(&e),
        };
        self.answer(send, resp).await;
        op
    }

    /// Sends `resp` and counts it.
    async fn answer(&self, mut send: quinn::SendStream, resp: Response) {
        if let Response::Bytes(b) = resp {
            // Its envelope, then the bytes as they are: no second copy.
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let head = crate::proto::bytes_envelope(b.len());
            self.counters
                .bytes_out
                .fetch_add((head.len() + b.len()) as u64, Ordering::Relaxed);
            let body = bytes::Bytes::from(b);
            let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
                send.write_all(&head).await.is_ok() && send.write_chunk(body).await.is_ok()
            })
            .await;
            finish_or_reset(&mut send, sent);
            return;
        }
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        if matches!(resp, Response::Error { .. }) {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let bytes = resp.encode();
        self.counters
            .bytes_out
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
            send.write_all(&bytes).await.is_ok()
        })
        .await;
        finish_or_reset(&mut send, sent);
    }

    /// A `Frame` response: its envelope (the same bytes `Response::encode`
    /// writes), then the frame itself, uncopied.
    async fn send_frame(&self, mut send: quinn::SendStream, frame: bytes::Bytes) {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let head = crate::proto::frame_envelope(frame.len());
        self.counters
            .bytes_out
            .fetch_add((head.len() + frame.len()) as u64, Ordering::Relaxed);
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
            send.write_all(&head).await.is_ok() && send.write_chunk(frame).await.is_ok()
        })
        .await;
        finish_or_reset(&mut send, sent);
    }

    /// Verifies and keeps one chunk (hashing blocks: off the async workers).
    async fn put_chunk(
        &self,
        job: &str,
        work: &Arc<Semaphore>,
        id: strata_format::ChunkId,
        frame: bytes::Bytes,
    ) -> Response {
        // A compressed frame is decoded to be verified: its raw length
        // counts against the in-flight budget like the request did.
        let _decode = match self.decode_permit(work, &frame).await {
            Ok(p) => p,
            Err(e) => return from_store(&e),
        };
        let r = self.replicas.clone();
        let job_s = job.to_string();
        let done = tokio::task::spawn_blocking(move || r.put_chunk(&job_s, id, frame))
            .await
            .map_err(|e| StoreError::Internal(format!("request task: {e}")))
            .and_then(|x| x);
        match done {
            Ok(new) => Response::Stored { new },
            Err(e) => from_store(&e),
        }
    }

    /// Budget for decoding `frame` to verify it (nothing for a raw frame,
    /// which is hashed where it lies, with no allocation). A frame whose
    /// header does not parse needs none: it is refused before anything is
    /// allocated. From the work pool, never the request pool its request
    /// already holds a share of.
    async fn decode_permit(
        &self,
        work: &Arc<Semaphore>,
        frame: &[u8],
    ) -> Result<Option<Work>, StoreError> {
        let limit = self.replicas.limits().max_chunk;
        match strata_format::frame::FrameHeader::decode(frame, limit) {
            Ok(h) if h.codec != strata_format::codec::Codec::Raw => {
                self.work_permit(work, u64::from(h.raw_len)).await.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// `bytes` of the work pool (capped at the whole pool), held until the
    /// permit drops.
    async fn work_permit(&self, work: &Arc<Semaphore>, bytes: u64) -> Result<Work, StoreError> {
        let closed = |_| StoreError::Unavailable("shutting down".into());
        let share = u32::try_from(self.work_share_units()).unwrap_or(u32::MAX);
        let units = u32::try_from(bytes.div_ceil(UNIT as u64))
            .unwrap_or(u32::MAX)
            .min(share);
        // The connection's share first, then the service's: a client that
        // does not read its answers holds at most its share.
        let local = work
            .clone()
            .acquire_many_owned(units)
            .await
            .map_err(closed)?;
        let global = self
            .work
            .clone()
            .acquire_many_owned(units)
            .await
            .map_err(closed)?;
        Ok((local, global))
    }

    /// One connection's share of the work pool, in units: a quarter, at
    /// least one ranged read of the largest chunk (capped at the pool).
    fn work_share_units(&self) -> usize {
        (self.work_units / 4)
            .max(3 * self.max_request.div_ceil(UNIT))
            .min(self.work_units)
    }

    /// The stored length of a chunk if it is spilled (reading it back
    /// allocates that much), else 0.
    fn spilled_len(&self, job: &str, id: &strata_format::ChunkId) -> Result<u64, StoreError> {
        Ok(self.replicas.spilled_len(job, id)?.unwrap_or(0))
    }

    /// Serves `req`; a permit the answer needs stays in `hold` until the
    /// caller has sent it.
    async fn dispatch(
        &self,
        job: &str,
        req: Request,
        work: &Arc<Semaphore>,
        hold: &mut Option<Work>,
    ) -> Response {
        match self.serve(job, req, work, hold).await {
            Ok(r) => r,
            Err(e) => from_store(&e),
        }
    }
}

/// Looks for idle jobs every [`crate::replicas::expiry_tick`] until the
/// service drains or is dropped.
async fn expire_idle_jobs(service: std::sync::Weak<Service>, idle: Duration) {
    let tick = crate::replicas::expiry_tick(idle);
    loop {
        tokio::time::sleep(tick).await;
        let Some(me) = service.upgrade() else { return };
        if me.draining.load(Ordering::Acquire) {
            return;
        }
        match me.replicas.expire_idle().await {
            Ok(gone) => {
                me.counters
                    .jobs_expired
                    .fetch_add(gone.len() as u64, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "looking for idle jobs failed"),
        }
    }
}

/// Ends an answer: finished if it was handed to QUIC whole; reset if the
/// client did not take it within [`REQUEST_TIMEOUT`] (a client that does
/// not read its answers holds its budgets that long at most).
fn finish_or_reset(send: &mut quinn::SendStream, sent: Result<bool, tokio::time::error::Elapsed>) {
    match sent {
        Ok(true) => {
            let _ = send.finish();
        }
        Ok(false) => {}
        Err(_) => {
            let _ = send.reset(0u32.into());
        }
    }
}

fn error(code: ErrorCode, message: String) -> Response {
    Response::Error { code, message }
}

/// The protocol error for a store error.
fn from_store(e: &StoreError) -> Response {
    let code = match e.kind() {
        StoreErrorKind::NotFound => ErrorCode::NotFound,
        StoreErrorKind::Corrupt => ErrorCode::Corrupt,
        StoreErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        StoreErrorKind::NoSpace => ErrorCode::NoSpace,
        StoreErrorKind::Invalid => ErrorCode::Invalid,
        StoreErrorKind::Unavailable => ErrorCode::Unavailable,
        StoreErrorKind::Unauthorized => ErrorCode::Forbidden,
        _ => ErrorCode::Internal,
    };
    error(code, e.to_string())
}

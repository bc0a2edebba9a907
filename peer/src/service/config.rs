//! A peer service's settings, its start-up errors and its counters.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;

use strata_tiered::StoreError;

use crate::prom::Histogram;
use crate::proto::Request;
use crate::replicas::Limits;
use crate::tls::{CertFiles, TlsError};

/// Settings of a service.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// This node's name (reported in `HelloOk`).
    pub node: String,
    /// UDP address to listen on.
    pub listen: SocketAddr,
    /// CA, node certificate and key.
    pub certs: CertFiles,
    /// Spill directory: replicas beyond the memory budget, every manifest,
    /// record and pin, and on a graceful stop everything held; reloaded and
    /// verified at start.
    pub spill: std::path::PathBuf,
    /// Budgets and retention.
    pub limits: Limits,
    /// Requests open at once per connection.
    pub max_streams: u32,
    /// Request bytes held at once by the whole service (at least four
    /// times `max_request`); one connection holds at most a quarter.
    pub inflight_bytes: usize,
    /// Largest request accepted (a chunk frame and its envelope); chunks
    /// larger than this cannot be replicated to this service.
    pub max_request: usize,
    /// Bytes the service allocates at once to answer requests, beyond the
    /// requests themselves: decoding a compressed put to verify it, a
    /// spilled frame read back, a ranged read's decoded chunk and answer
    /// (at least `max_request`; a request waits for its share, never while
    /// holding another share of this pool).
    pub work_bytes: usize,
    /// Connections open (or in their handshake) at once; more are refused.
    pub max_connections: usize,
}

impl ServiceConfig {
    /// What a request may add to the chunk frame it carries (its
    /// envelope): the largest request is the largest chunk plus this.
    pub const ENVELOPE: usize = 8192;
    /// Default largest request: a 64 MiB chunk frame and its envelope.
    pub const DEFAULT_MAX_REQUEST: usize = (64 << 20) + Self::ENVELOPE;
    /// Default work budget.
    pub const DEFAULT_WORK_BYTES: usize = 1 << 30;
    /// Default connection limit.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
}

/// Errors starting a service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Certificates or TLS settings.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The spill directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Binding the socket.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The kinds of request whose latency is kept (the `op` label of
/// `strata_peer_request_seconds`).
pub const OPS: [&str; 14] = [
    "put_chunk",
    "has_chunks",
    "get_chunk",
    "get_range",
    "put_manifest",
    "get_manifest",
    "commit",
    "list_steps",
    "list_chunks",
    "delete",
    "pins",
    "stats",
    "invalid",
    "refused",
];

/// The kind of a request (one of [`OPS`]).
pub(crate) fn op_of(req: &Request) -> &'static str {
    match req {
        Request::PutChunk { .. } => "put_chunk",
        Request::HasChunks(_) => "has_chunks",
        Request::GetChunk { range: None, .. } => "get_chunk",
        Request::GetChunk { .. } => "get_range",
        Request::PutManifest { .. } => "put_manifest",
        Request::GetManifest { .. } => "get_manifest",
        Request::Commit(_) => "commit",
        Request::ListSteps => "list_steps",
        Request::ListChunks { .. } => "list_chunks",
        Request::DeleteStep(_) | Request::DeleteShard { .. } | Request::DeleteChunks(_) => "delete",
        Request::SetPin { .. } | Request::ListPins => "pins",
        Request::Stats => "stats",
        Request::Hello { .. } => "invalid",
    }
}

/// Counters exported on `/metrics` and by `Stats`.
#[derive(Default, Debug)]
pub struct Counters {
    /// Request bytes received.
    pub bytes_in: AtomicU64,
    /// Response bytes sent.
    pub bytes_out: AtomicU64,
    /// Connections open now.
    pub connections: AtomicU64,
    /// Connections refused (TLS, authorization, handshake).
    pub refused: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Requests served.
    pub requests: AtomicU64,
    /// Idle jobs whose replicas were expired (`Limits::job_idle`).
    pub jobs_expired: AtomicU64,
    /// Time from a request's stream opening to its answer handed to QUIC, by
    /// kind ([`OPS`], same order).
    pub latency: [Histogram; OPS.len()],
}

impl Counters {
    /// Counts one request of kind `op` that took `d`.
    pub fn observe(&self, op: &str, d: std::time::Duration) {
        if let Some(i) = OPS.iter().position(|o| *o == op) {
            self.latency[i].observe(d);
        }
    }
}

//! [`PeerStore`]: a [`ChunkStore`] over one peer service.
//!
//! One QUIC connection per job (each opened with a `Hello` naming it),
//! reopened after a failure; each request on a stream of its own, many at
//! once. Chunks go up as frames in the store's codec after one presence
//! check for the whole batch, so a step that changed 5% sends about 5%;
//! whole chunks come back as frames that are decoded and verified here.
//! Ranged reads are decoded and verified by the peer (the range alone
//! cannot be checked against the chunk's id).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use strata_format::codec::{Codec, EncodeOptions};
use strata_format::frame::{
    raw_frame_header, FrameDecoder, FrameEncoder, FrameHeader, FRAME_HEADER_LEN, MAX_CHUNK_LEN,
};
use strata_format::names::validate_job_id;
use strata_format::{ChunkId, CommitRecord};
use strata_tiered::{
    AlignedBuf, ChunkData, ChunkPut, ChunkStore, PutStats, Result, StepInfo, StoreError,
};

use crate::proto::{
    message_len, put_chunk_envelope, ErrorCode, Request, Response, MAX_IDS, VERSION,
};
use crate::tls::{client_config, CertFiles};
use strata_tiered::{PutOptions, ReadOptions};

/// Time to connect and say hello (a handshake with a dead address gives
/// up after the idle timeout anyway).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(4);
/// Time for one request and its response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Settings of a peer client.
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// How chunks are encoded for the wire and the peer's memory.
    pub codec: EncodeOptions,
}

impl Default for PeerOptions {
    fn default() -> Self {
        PeerOptions {
            concurrency: 8,
            // Loopback and datacenter links outrun the codecs on few cores.
            codec: EncodeOptions::RAW,
        }
    }
}

/// After a failed connection attempt, requests fail at once for this long
/// instead of each waiting for a peer that is down.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The connection for one job.
enum Link {
    Up(quinn::Connection),
    /// The last attempt failed, at this time, for this reason.
    Down(std::time::Instant, String),
}

/// A peer service as a chunk store.
pub struct PeerStore {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    server_name: String,
    label: String,
    opts: PeerOptions,
    conns: tokio::sync::Mutex<HashMap<String, Link>>,
}

impl std::fmt::Debug for PeerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerStore({})", self.label)
    }
}

fn unavailable(what: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(what.to_string())
}

impl PeerStore {
    /// A store talking to the service at `addr`, whose node certificate
    /// names `server_name`, presenting the client certificate in `certs`.
    /// Connects lazily. Must be called inside a tokio runtime.
    pub fn new(
        addr: SocketAddr,
        server_name: &str,
        certs: &CertFiles,
        opts: PeerOptions,
    ) -> Result<Self> {
        let cfg =
            client_config(certs, 64).map_err(|e| StoreError::invalid("peer TLS", e.to_string()))?;
        let bind: SocketAddr = if addr.is_ipv6() {
            "[::]:0".parse()
        } else {
            "0.0.0.0:0".parse()
        }
        .map_err(|e| StoreError::Internal(format!("{e}")))?;
        let mut endpoint = crate::tls::endpoint(bind, None)
            .map_err(|e| StoreError::io("binding a UDP socket", "peer client", e))?;
        endpoint.set_default_client_config(cfg);
        Ok(PeerStore {
            endpoint,
            addr,
            server_name: server_name.to_string(),
            label: format!("peer {server_name} at {addr}"),
            opts,
            conns: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The peer's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The live connection for `job`, opened (with its `Hello`) if needed.
    async fn conn(&self, job: &str) -> Result<quinn::Connection> {
        // Held across the attempt: one attempt at a time; requests queued
        // behind a failed one fail at once (see RETRY_AFTER).
        let mut conns = self.conns.lock().await;
        match conns.get(job) {
            Some(Link::Up(c)) if c.close_reason().is_none() => return Ok(c.clone()),
            Some(Link::Down(at, why)) if at.elapsed() < RETRY_AFTER => {
                return Err(unavailable(format!("{} is down: {why}", self.label)))
            }
            _ => {}
        }
        let connect = async {
            let conn = self
                .endpoint
                .connect(self.addr, &self.server_name)
                .map_err(|e| unavailable(format!("{}: {e}", self.label)))?
                .await
                .map_err(|e| unavailable(format!("{}: {e}", self.label)))?;
            let hello = Request::Hello {
                version: VERSION,
                job: job.to_string(),
            };
            match roundtrip(&conn, &hello, &self.label).await? {
                Response::HelloOk { .. } => Ok(conn),
                Response::Error { code, message } => Err(to_store(code, message, &self.label)),
                other => Err(unavailable(format!(
                    "{}: unexpected answer to hello: {other:?}",
                    self.label
                ))),
            }
        };
        let outcome = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| unavailable(format!("{}: no answer in time", self.label)))
            .and_then(|r| r);
        match outcome {
            Ok(conn) => {
                conns.insert(job.to_string(), Link::Up(conn.clone()));
                Ok(conn)
            }
            Err(e) => {
                // A refusal (wrong job, bad certificate) is not a peer
                // being down: do not hold it against later requests.
                if e.kind() == strata_tiered::StoreErrorKind::Unavailable {
                    conns.insert(
                        job.to_string(),
                        Link::Down(std::time::Instant::now(), e.to_string()),
                    );
                }
                Err(e)
            }
        }
    }

    /// Sends one request for `job` and returns the answer; a service error
    /// becomes the matching store error.
    pub async fn request(&self, job: &str, req: &Request) -> Result<Response> {
        validate_job_id(job)?;
        let conn = self.conn(job).await?;
        match roundtrip(&conn, req, &self.label).await? {
            Response::Error { code, message } => Err(to_store(code, message, &self.label)),
            r => Ok(r),
        }
    }

    /// Sends one request given as the pieces of its encoded message.
    async fn request_parts(&self, job: &str, parts: Vec<Bytes>) -> Result<Response> {
        validate_job_id(job)?;
        let conn = self.conn(job).await?;
        let msg = roundtrip_parts(&conn, parts, &self.label).await?;
        match Response::decode(&msg).map_err(|e| StoreError::Corrupt {
            what: format!("answer from {}", self.label),
            source: e,
        })? {
            Response::Error { code, message } => Err(to_store(code, message, &self.label)),
            r => Ok(r),
        }
    }

    /// One whole chunk, verified. A raw frame's payload is read from the
    /// stream straight into `spare` (reused when large enough) and hashed
    /// there: no message buffer, no decode copy. Other codecs are read
    /// whole and decoded into `spare`.
    ///
    /// The read and the check run as a task of the runtime, not in the
    /// caller's future ([`strata_tiered::task`] says why): the stream is
    /// read on the runtime's workers (those that drive the connection where
    /// the endpoint was bound on that runtime, as a checkpointer's own
    /// peers and the CLI's are) and the lane is woken once per chunk
    /// (`l2-bench --size 1GiB`, restore into the caller's buffers: client
    /// CPU 1.6–2.2 s → 1.1–1.5 s, 0.67–0.79 → 0.89–0.96 of raw quinn). The
    /// read then runs at the runtime's priority (a checkpointer's own
    /// runtime is at `background_nice`), as QUIC's driver and the check
    /// already did.
    async fn get_one(
        &self,
        job: &str,
        id: ChunkId,
        spare: Option<AlignedBuf>,
    ) -> Result<ChunkData> {
        validate_job_id(job)?;
        let conn = self.conn(job).await?;
        let label = self.label.clone();
        let io = async move {
            let lost = |e: &dyn std::fmt::Display| unavailable(format!("{label}: {e}"));
            let corrupt = |source| StoreError::Corrupt {
                what: format!("chunk {id} from {label}"),
                source,
            };
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
            send.write_all(&Request::GetChunk { id, range: None }.encode())
                .await
                .map_err(|e| lost(&e))?;
            let _ = send.finish();
            let mut prefix = [0u8; 4];
            recv.read_exact(&mut prefix).await.map_err(|e| lost(&e))?;
            let len = message_len(prefix).map_err(|e| StoreError::Corrupt {
                what: format!("answer from {label}"),
                source: e,
            })?;
            // The frame envelope and header, if the answer is a frame.
            let head_len = 5 + FRAME_HEADER_LEN;
            let mut head = vec![0u8; len.min(head_len)];
            recv.read_exact(&mut head).await.map_err(|e| lost(&e))?;
            if len < head_len || crate::proto::frame_len_in(&head) != Some(len - 5) {
                // An error, or something unexpected: read the rest, decode.
                let mut msg = head;
                msg.resize(len, 0);
                recv.read_exact(&mut msg[len.min(head_len)..])
                    .await
                    .map_err(|e| lost(&e))?;
                return Err(
                    match Response::decode(&msg).map_err(|e| StoreError::Corrupt {
                        what: format!("answer from {label}"),
                        source: e,
                    })? {
                        Response::Error { code, message } => to_store(code, message, &label),
                        // A frame too short to hold its header: damaged.
                        Response::Frame(f) => corrupt(strata_format::FormatError::Truncated {
                            what: "chunk frame",
                            needed: FRAME_HEADER_LEN as u64,
                            available: f.len() as u64,
                        }),
                        other => unexpected(&label, &other),
                    },
                );
            }
            let h = FrameHeader::decode(&head[5..], MAX_CHUNK_LEN).map_err(corrupt)?;
            if h.id != id {
                return Err(corrupt(strata_format::FormatError::HashMismatch {
                    expected: id.to_hex(),
                    actual: h.id.to_hex(),
                }));
            }
            let raw_len = h.raw_len as usize;
            let sized = |spare: Option<AlignedBuf>| match spare {
                Some(mut b) if b.capacity() >= raw_len => {
                    b.set_len(raw_len);
                    b
                }
                _ => AlignedBuf::zeroed(raw_len),
            };
            if h.codec == Codec::Raw && h.stored_len == h.raw_len && len == head_len + raw_len {
                // The buffer is the size of the message being received.
                let mut buf = sized(spare);
                recv.read_exact(&mut buf).await.map_err(|e| lost(&e))?;
                return Ok((buf, None));
            }
            // An encoded frame: its bytes first, the (larger) decode buffer
            // only once they have all arrived. Its size is the one its
            // header states, checked before anything is allocated (a peer
            // may not make this side hold a message-sized buffer for a
            // small chunk), and it is allocated once at that size rather
            // than grown from the header's (a reallocation and a copy).
            let mut frame = vec![0u8; encoded_frame_len(len - 5, &h).map_err(corrupt)?];
            frame[..FRAME_HEADER_LEN].copy_from_slice(&head[5..]);
            recv.read_exact(&mut frame[FRAME_HEADER_LEN..])
                .await
                .map_err(|e| lost(&e))?;
            Ok((sized(spare), Some(frame)))
        };
        let label = self.label.clone();
        let task = async move {
            let (buf, frame) = tokio::time::timeout(REQUEST_TIMEOUT, io)
                .await
                .map_err(|_| unavailable(format!("{label}: no answer in time")))??;
            // Hashing (and decoding) blocks: off the async workers.
            strata_tiered::task::blocking("decoder", move || {
                let corrupt = |source| StoreError::Corrupt {
                    what: format!("chunk {id} from {label}"),
                    source,
                };
                let mut buf = buf;
                match frame {
                    None => {
                        let actual = ChunkId::of(&buf);
                        if actual != id {
                            return Err(corrupt(strata_format::FormatError::HashMismatch {
                                expected: id.to_hex(),
                                actual: actual.to_hex(),
                            }));
                        }
                    }
                    Some(frame) => {
                        let mut dec = FrameDecoder::new().map_err(corrupt)?;
                        dec.decode_into(&frame, Some(&id), &mut buf)
                            .map_err(corrupt)?;
                    }
                }
                Ok(ChunkData::whole(buf))
            })
            .await
        };
        // Aborted if the caller drops the read (a copy's prefetched batch
        // aborted, a caller that gave up).
        strata_tiered::task::read_as_task(format!("chunk {id} from {}", self.label), task).await
    }

    async fn send(&self, job: &str, chunks: Vec<ChunkPut>) -> Result<PutStats> {
        let codec = self.opts.codec;
        let results: Vec<(u64, u64, bool)> = futures::stream::iter(chunks)
            .map(|c| async move {
                let raw = c.data.len() as u64;
                let id = c.id;
                let parts = if codec.codec == Codec::Raw {
                    // The message is its envelope, a raw frame header and
                    // the chunk's own buffer: the chunk is never copied.
                    let header = raw_frame_header(id, c.data.len())
                        .map_err(|e| StoreError::invalid("chunk", e.to_string()))?;
                    let envelope = put_chunk_envelope(&id, header.len() + c.data.len())
                        .ok_or_else(|| StoreError::invalid("chunk", "too large for a message"))?;
                    let mut head = envelope.to_vec();
                    head.extend_from_slice(&header);
                    vec![Bytes::from(head), Bytes::from_owner(c.data)]
                } else {
                    let frame = tokio::task::spawn_blocking(move || {
                        FrameEncoder::new(codec)?.encode(c.data.as_slice(), c.hint, Some(c.id))
                    })
                    .await
                    .map_err(|e| StoreError::Internal(format!("encoder task: {e}")))?
                    .map_err(|e| StoreError::invalid("chunk", e.to_string()))?;
                    vec![Bytes::from(Request::PutChunk { id, frame }.encode())]
                };
                let stored = parts.iter().map(|p| p.len() as u64).sum::<u64>() - 41;
                match self.request_parts(job, parts).await? {
                    Response::Stored { new } => Ok((raw, stored, new)),
                    other => Err(unexpected(&self.label, &other)),
                }
            })
            .buffer_unordered(self.opts.concurrency.max(1))
            .try_collect()
            .await?;
        let mut stats = PutStats::default();
        for (raw, stored, new) in results {
            stats.count(raw, stored, new);
        }
        Ok(stats)
    }

    /// Closes the connections.
    pub async fn close(&self) {
        self.endpoint.close(0u32.into(), b"bye");
        self.endpoint.wait_idle().await;
    }
}

/// The length of an encoded frame whose message carries `frame_len`
/// bytes: what its header states (the header and `stored_len` bytes), or
/// an error where the two differ.
fn encoded_frame_len(
    frame_len: usize,
    h: &FrameHeader,
) -> Result<usize, strata_format::FormatError> {
    let stated = h.frame_len();
    if frame_len != stated {
        return Err(strata_format::FormatError::malformed(
            "chunk frame",
            format!("{frame_len} bytes sent for a frame whose header states {stated}"),
        ));
    }
    Ok(stated)
}

/// The answer of a service that predates a request kind.
fn too_old(e: &StoreError) -> bool {
    e.kind() == strata_tiered::StoreErrorKind::Invalid && e.to_string().contains("unknown kind")
}

fn unexpected(label: &str, r: &Response) -> StoreError {
    let kind = match r {
        Response::Frame(_) => "a frame",
        Response::Bytes(_) => "bytes",
        Response::Present(_) => "presence bits",
        Response::Steps(_) => "steps",
        Response::Ids(_) => "ids",
        Response::Stats(_) => "stats",
        _ => "another answer",
    };
    unavailable(format!("{label}: unexpected answer ({kind})"))
}

/// One request on a new stream of `conn`, and its answer (bounded).
async fn roundtrip(conn: &quinn::Connection, req: &Request, label: &str) -> Result<Response> {
    let msg = roundtrip_raw(conn, req, label).await?;
    Response::decode(&msg).map_err(|e| StoreError::Corrupt {
        what: format!("answer from {label}"),
        source: e,
    })
}

/// One request and its answer's body (after the length prefix), undecoded.
async fn roundtrip_raw(conn: &quinn::Connection, req: &Request, label: &str) -> Result<Vec<u8>> {
    roundtrip_parts(conn, vec![Bytes::from(req.encode())], label).await
}

/// One request, given as the pieces of its encoded message (handed to the
/// transport as they are), and its answer's body, undecoded.
async fn roundtrip_parts(
    conn: &quinn::Connection,
    mut parts: Vec<Bytes>,
    label: &str,
) -> Result<Vec<u8>> {
    let io = async {
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| unavailable(format!("{label}: {e}")))?;
        send.write_all_chunks(&mut parts)
            .await
            .map_err(|e| unavailable(format!("{label}: {e}")))?;
        let _ = send.finish();
        let mut prefix = [0u8; 4];
        recv.read_exact(&mut prefix)
            .await
            .map_err(|e| unavailable(format!("{label}: {e}")))?;
        let len = message_len(prefix).map_err(|e| StoreError::Corrupt {
            what: format!("answer from {label}"),
            source: e,
        })?;
        let mut msg = vec![0u8; len];
        recv.read_exact(&mut msg)
            .await
            .map_err(|e| unavailable(format!("{label}: {e}")))?;
        Ok(msg)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, io)
        .await
        .map_err(|_| unavailable(format!("{label}: no answer in time")))?
}

fn to_store(code: ErrorCode, message: String, label: &str) -> StoreError {
    let what = format!("{label}: {message}");
    match code {
        ErrorCode::NotFound => StoreError::NotFound { what },
        ErrorCode::AlreadyExists => StoreError::AlreadyExists { what },
        ErrorCode::Corrupt => StoreError::Corrupt {
            what,
            source: strata_format::FormatError::malformed("peer copy", message),
        },
        ErrorCode::NoSpace => StoreError::NoSpace {
            op: "replicating to a peer (its budget is full)",
            path: label.into(),
        },
        ErrorCode::Invalid => StoreError::invalid("peer request", what),
        ErrorCode::Forbidden => StoreError::Unauthorized(what),
        ErrorCode::Unavailable => StoreError::Unavailable(what),
        ErrorCode::Internal => StoreError::Internal(what),
    }
}

#[async_trait]
impl ChunkStore for PeerStore {
    fn name(&self) -> &str {
        "l2"
    }
    /// With `known_missing`, chunks the caller just found missing (with
    /// `has_chunks`) are sent without asking again: one request per chunk,
    /// several at once.
    async fn put_chunks_opts(
        &self,
        job: &str,
        chunks: Vec<ChunkPut>,
        opts: PutOptions,
    ) -> Result<PutStats> {
        validate_job_id(job)?;
        let (todo, mut stats) = strata_tiered::store::dedup_call(chunks)?;
        if opts.known_missing {
            let mut sent = self.send(job, todo).await?;
            sent += stats;
            return Ok(sent);
        }
        let ids: Vec<ChunkId> = todo.iter().map(|c| c.id).collect();
        let present = self.has_chunks(job, &ids).await?;
        let mut send = Vec::new();
        for (c, p) in todo.into_iter().zip(present) {
            if p {
                stats.deduped += 1;
                stats.bytes_deduped += c.data.len() as u64;
            } else {
                send.push(c);
            }
        }
        stats += self.send(job, send).await?;
        Ok(stats)
    }

    /// Verified either way (the service sends frames, decoded and checked
    /// here), several at once.
    async fn get_chunks_opts(
        &self,
        job: &str,
        ids: &[ChunkId],
        opts: ReadOptions,
    ) -> Vec<Result<ChunkData>> {
        strata_tiered::store::read_each(ids, opts.spare, self.opts.concurrency, |id, buf| {
            self.get_one(job, id, buf)
        })
        .await
    }

    async fn get_chunk(
        &self,
        job: &str,
        id: &ChunkId,
        range: Option<Range<u32>>,
    ) -> Result<ChunkData> {
        match range {
            None => self.get_one(job, *id, None).await,
            Some(r) => {
                if r.start > r.end {
                    return Err(StoreError::invalid("chunk range", format!("{r:?}")));
                }
                match self
                    .request(
                        job,
                        &Request::GetChunk {
                            id: *id,
                            range: Some((r.start, r.end)),
                        },
                    )
                    .await?
                {
                    Response::Bytes(b) if b.len() == (r.end - r.start) as usize => {
                        Ok(ChunkData::copy_from(&b))
                    }
                    other => Err(unexpected(&self.label, &other)),
                }
            }
        }
    }

    async fn has_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<Vec<bool>> {
        let mut out = Vec::with_capacity(ids.len());
        for part in ids.chunks(MAX_IDS) {
            match self
                .request(job, &Request::HasChunks(part.to_vec()))
                .await?
            {
                Response::Present(p) if p.len() == part.len() => out.extend(p),
                other => return Err(unexpected(&self.label, &other)),
            }
        }
        Ok(out)
    }

    async fn list_chunks(&self, job: &str) -> Result<Vec<ChunkId>> {
        // Page by page: a job may hold more ids than one message carries.
        let mut out: Vec<ChunkId> = Vec::new();
        loop {
            let after = out.last().copied();
            match self.request(job, &Request::ListChunks { after }).await? {
                Response::Ids(v) => {
                    let full = v.len() >= MAX_IDS;
                    if v.first().is_some_and(|f| after.is_some_and(|a| *f <= a)) {
                        return Err(StoreError::Corrupt {
                            what: format!("chunk listing from {}", self.label),
                            source: strata_format::FormatError::malformed(
                                "chunk listing",
                                "a page does not follow the previous one",
                            ),
                        });
                    }
                    out.extend(v);
                    if !full {
                        return Ok(out);
                    }
                }
                other => return Err(unexpected(&self.label, &other)),
            }
        }
    }

    async fn delete_chunks(&self, job: &str, ids: &[ChunkId]) -> Result<()> {
        for part in ids.chunks(MAX_IDS) {
            match self
                .request(job, &Request::DeleteChunks(part.to_vec()))
                .await?
            {
                Response::Ok => {}
                other => return Err(unexpected(&self.label, &other)),
            }
        }
        Ok(())
    }

    async fn put_manifest(&self, job: &str, step: u64, rank: u32, bytes: &[u8]) -> Result<()> {
        let req = Request::PutManifest {
            step,
            rank,
            bytes: bytes.to_vec(),
        };
        match self.request(job, &req).await? {
            Response::Ok => Ok(()),
            other => Err(unexpected(&self.label, &other)),
        }
    }

    async fn get_manifest(&self, job: &str, step: u64, rank: u32) -> Result<Vec<u8>> {
        match self
            .request(job, &Request::GetManifest { step, rank })
            .await?
        {
            Response::Bytes(b) => Ok(b),
            other => Err(unexpected(&self.label, &other)),
        }
    }

    async fn commit(&self, record: &CommitRecord) -> Result<()> {
        let bytes = record
            .encode()
            .map_err(|e| StoreError::invalid("commit record", e.to_string()))?;
        match self.request(&record.job, &Request::Commit(bytes)).await? {
            Response::Ok => Ok(()),
            other => Err(unexpected(&self.label, &other)),
        }
    }

    async fn list_steps(&self, job: &str) -> Result<Vec<StepInfo>> {
        let steps = match self.request(job, &Request::ListSteps).await? {
            Response::Steps(s) => s,
            other => return Err(unexpected(&self.label, &other)),
        };
        let mut out = Vec::with_capacity(steps.len());
        for s in steps {
            let mut info = StepInfo {
                step: s.step,
                manifests: s.manifests.into_iter().collect(),
                ..StepInfo::default()
            };
            for (i, bytes) in s.records.into_iter().enumerate() {
                // One record this client cannot read (a newer format from
                // another client) hides only itself; its slot is unknown,
                // so it is reported under a placeholder from the top.
                match CommitRecord::decode(&bytes) {
                    Ok(r) => {
                        let first = r.shards.first().map_or(0, |sh| sh.rank);
                        info.records.insert(first, r);
                    }
                    Err(e) => {
                        info.unreadable.insert(
                            u32::MAX - i as u32,
                            format!("commit record of step {} from {}: {e}", s.step, self.label),
                        );
                    }
                }
            }
            out.push(info);
        }
        Ok(out)
    }

    async fn delete_step(&self, job: &str, step: u64) -> Result<()> {
        match self.request(job, &Request::DeleteStep(step)).await? {
            Response::Ok => Ok(()),
            other => Err(unexpected(&self.label, &other)),
        }
    }

    async fn delete_shard(&self, job: &str, step: u64, rank: u32) -> Result<()> {
        match self
            .request(job, &Request::DeleteShard { step, rank })
            .await?
        {
            Response::Ok => Ok(()),
            other => Err(unexpected(&self.label, &other)),
        }
    }

    async fn set_pin(&self, job: &str, step: u64, pinned: bool) -> Result<()> {
        match self.request(job, &Request::SetPin { step, pinned }).await {
            Ok(Response::Ok) => Ok(()),
            Ok(other) => Err(unexpected(&self.label, &other)),
            Err(e) if too_old(&e) => Err(StoreError::invalid(
                "pin",
                format!("{} is older than pins: upgrade its service", self.label),
            )),
            Err(e) => Err(e),
        }
    }

    /// A service older than pins (it answers the kind as unknown) holds
    /// none: its steps are listed as unpinned, so `strata gc` and `ls` go
    /// on working against it.
    async fn list_pins(&self, job: &str) -> Result<std::collections::BTreeSet<u64>> {
        match self.request(job, &Request::ListPins).await {
            Ok(Response::Pins(v)) => Ok(v.into_iter().collect()),
            Ok(other) => Err(unexpected(&self.label, &other)),
            Err(e) if too_old(&e) => Ok(std::collections::BTreeSet::new()),
            Err(e) => Err(e),
        }
    }

    fn describe(&self) -> String {
        format!("{} ({})", self.label, self.addr())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::encoded_frame_len;
    use strata_format::codec::{ElemHint, EncodeOptions};
    use strata_format::frame::{encode_frame, FrameHeader, MAX_CHUNK_LEN};

    #[test]
    fn an_encoded_frame_is_as_long_as_its_header_states_or_refused() {
        let data = vec![7u8; 1 << 20];
        let frame = encode_frame(&data, ElemHint::BYTES, EncodeOptions::ZSTD).unwrap();
        let h = FrameHeader::decode(&frame, MAX_CHUNK_LEN).unwrap();
        assert_eq!(encoded_frame_len(frame.len(), &h).unwrap(), frame.len());
        // A message far longer than the frame its header states (a peer
        // making this side hold 256 MiB for a small chunk), or shorter.
        let err = encoded_frame_len(256 << 20, &h).unwrap_err();
        assert!(err.to_string().contains("header states"), "{err}");
        assert!(encoded_frame_len(frame.len() - 1, &h).is_err());
    }
}

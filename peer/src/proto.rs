//! The peer protocol's messages and their codec: pure (no I/O), bounded on
//! every length, so any byte string decodes to a message or a typed error,
//! never a panic or an allocation larger than the input. See
//! `docs/protocol.md` for the byte layout.
//!
//! On the wire a message is `u32 length (LE) | u8 kind | body`, where the
//! length counts the kind and the body and is at most [`MAX_MESSAGE`]. Each
//! request goes on a QUIC bidirectional stream of its own and gets one
//! response on it.

use strata_format::frame::{FRAME_HEADER_LEN, MAX_CHUNK_LEN};
use strata_format::manifest::MAX_MANIFEST_LEN;
use strata_format::names::{validate_job_id, MAX_JOB_ID_LEN};
use strata_format::wire::{Reader, Writer};
use strata_format::{ChunkId, FormatError};

/// Protocol version spoken by this build.
pub const VERSION: u16 = 1;
/// ALPN identifier of the protocol (TLS refuses other protocols).
pub const ALPN: &[u8] = b"strata/1";
/// Largest message: a chunk frame of the largest chunk plus its envelope.
pub const MAX_MESSAGE: usize = FRAME_HEADER_LEN + MAX_CHUNK_LEN as usize + 4096;
/// Most chunk ids in one request or response.
pub const MAX_IDS: usize = 1 << 16;
/// Most steps in one listing.
pub const MAX_STEPS: usize = 1 << 16;
/// Most ranks named in one step of a listing.
pub const MAX_RANKS: usize = 1 << 20;
/// Largest commit record.
pub const MAX_RECORD: usize = 1 << 20;
/// Largest error or name text.
pub const MAX_TEXT: usize = 4096;

type Result<T> = std::result::Result<T, FormatError>;

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First request on a connection: the protocol version and the job the
    /// connection serves (the client's certificate must allow it).
    Hello {
        /// Client's protocol version.
        version: u16,
        /// Job id.
        job: String,
    },
    /// Store a chunk (idempotent): its frame (docs/format.md), any codec.
    PutChunk {
        /// The chunk's id; the frame must decode to bytes hashing to it.
        id: ChunkId,
        /// The encoded frame.
        frame: Vec<u8>,
    },
    /// Which of these ids are held.
    HasChunks(Vec<ChunkId>),
    /// A chunk: the whole frame, or raw bytes of a range of the chunk.
    GetChunk {
        /// The chunk.
        id: ChunkId,
        /// Byte range of the decoded chunk (start, end), or the whole frame.
        range: Option<(u32, u32)>,
    },
    /// Store a shard manifest.
    PutManifest {
        /// Step.
        step: u64,
        /// Rank.
        rank: u32,
        /// Encoded manifest.
        bytes: Vec<u8>,
    },
    /// Read a shard manifest.
    GetManifest {
        /// Step.
        step: u64,
        /// Rank.
        rank: u32,
    },
    /// Steps with their manifests and commit records.
    ListSteps,
    /// Write a commit record, create-only.
    Commit(Vec<u8>),
    /// Delete a step's manifests and records.
    DeleteStep(u64),
    /// Delete chunks.
    DeleteChunks(Vec<ChunkId>),
    /// Every chunk id held for the job.
    ListChunks,
    /// The service's counters.
    Stats,
}

/// One step in a listing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StepEntry {
    /// Step.
    pub step: u64,
    /// Ranks whose manifest is held.
    pub manifests: Vec<u32>,
    /// Encoded commit records.
    pub records: Vec<Vec<u8>>,
}

/// Counters of a peer service.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServiceStats {
    /// Chunk bytes held in memory.
    pub bytes_in_memory: u64,
    /// Chunk bytes spilled to the service's disk.
    pub bytes_on_disk: u64,
    /// Chunks held.
    pub chunks: u64,
    /// Jobs held.
    pub jobs: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Connections open now.
    pub connections: u64,
    /// Connections refused (TLS, authorization, handshake).
    pub refused: u64,
    /// Requests that failed.
    pub errors: u64,
}

/// Error classes carried in [`Response::Error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// Not held.
    NotFound = 1,
    /// Damaged bytes (or a chunk that does not match its id).
    Corrupt = 2,
    /// A create-only write found something there.
    AlreadyExists = 3,
    /// The budget is exhausted.
    NoSpace = 4,
    /// A malformed or invalid request.
    Invalid = 5,
    /// Not allowed for this client.
    Forbidden = 6,
    /// Anything else.
    Internal = 7,
    /// Temporarily unable (shutting down, overloaded).
    Unavailable = 8,
}

impl ErrorCode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => ErrorCode::NotFound,
            2 => ErrorCode::Corrupt,
            3 => ErrorCode::AlreadyExists,
            4 => ErrorCode::NoSpace,
            5 => ErrorCode::Invalid,
            6 => ErrorCode::Forbidden,
            7 => ErrorCode::Internal,
            8 => ErrorCode::Unavailable,
            _ => return None,
        })
    }
}

/// What a service answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// Done.
    Ok,
    /// The handshake is accepted.
    HelloOk {
        /// Service's protocol version.
        version: u16,
        /// Service's node name.
        node: String,
    },
    /// The request failed.
    Error {
        /// Class.
        code: ErrorCode,
        /// Human text.
        message: String,
    },
    /// A chunk put: whether it was new.
    Stored {
        /// False if the chunk was held already.
        new: bool,
    },
    /// A whole chunk frame.
    Frame(Vec<u8>),
    /// Raw bytes (a manifest, a range of a chunk).
    Bytes(Vec<u8>),
    /// One bit per asked id, in order.
    Present(Vec<bool>),
    /// Steps.
    Steps(Vec<StepEntry>),
    /// Chunk ids.
    Ids(Vec<ChunkId>),
    /// Counters.
    Stats(ServiceStats),
}

mod kind {
    pub(super) const HELLO: u8 = 1;
    pub(super) const PUT_CHUNK: u8 = 2;
    pub(super) const HAS_CHUNKS: u8 = 3;
    pub(super) const GET_CHUNK: u8 = 4;
    pub(super) const PUT_MANIFEST: u8 = 5;
    pub(super) const GET_MANIFEST: u8 = 6;
    pub(super) const LIST_STEPS: u8 = 7;
    pub(super) const COMMIT: u8 = 8;
    pub(super) const DELETE_STEP: u8 = 9;
    pub(super) const DELETE_CHUNKS: u8 = 10;
    pub(super) const LIST_CHUNKS: u8 = 11;
    pub(super) const STATS: u8 = 12;

    pub(super) const OK: u8 = 128;
    pub(super) const HELLO_OK: u8 = 129;
    pub(super) const ERROR: u8 = 130;
    pub(super) const STORED: u8 = 131;
    pub(super) const FRAME: u8 = 132;
    pub(super) const BYTES: u8 = 133;
    pub(super) const PRESENT: u8 = 134;
    pub(super) const STEPS: u8 = 135;
    pub(super) const IDS: u8 = 136;
    pub(super) const STATS_R: u8 = 137;
}

/// The first bytes of a `Frame` response carrying `len` frame bytes (the
/// frame follows): lets a sender write a stored frame without copying it
/// into the message.
pub fn frame_envelope(len: usize) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[..4].copy_from_slice(&((len + 5) as u32).to_le_bytes());
    h[4] = kind::FRAME;
    h[5..].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// If `msg` (a response body, after the length prefix) is a `Frame`,
/// the frame bytes in place, checked against the stated length.
pub fn frame_in(msg: &[u8]) -> Option<&[u8]> {
    if msg.len() < 5 || msg[0] != kind::FRAME {
        return None;
    }
    let n = u32::from_le_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
    (n == msg.len() - 5).then(|| &msg[5..])
}

/// The bytes of a `PutChunk` message that come before its frame (length
/// prefix, kind, id, frame length): a sender writes these, then the frame's
/// pieces, and has sent the same message [`Request::encode`] would build,
/// without copying the chunk into it. `None` if the frame is too large for
/// one message.
pub fn put_chunk_envelope(id: &ChunkId, frame_len: usize) -> Option<[u8; 41]> {
    let total = 1 + 32 + 4 + frame_len;
    if total > MAX_MESSAGE {
        return None;
    }
    let mut h = [0u8; 41];
    h[..4].copy_from_slice(&(total as u32).to_le_bytes());
    h[4] = kind::PUT_CHUNK;
    h[5..37].copy_from_slice(id.as_bytes());
    h[37..].copy_from_slice(&(frame_len as u32).to_le_bytes());
    Some(h)
}

/// If `msg` (a request body, after the length prefix) is a well-formed
/// `PutChunk`, its chunk id and the offset at which its frame starts: the
/// receiver keeps the frame in place instead of copying it out.
pub fn put_chunk_in(msg: &[u8]) -> Option<(ChunkId, usize)> {
    if msg.len() < 37 || msg[0] != kind::PUT_CHUNK {
        return None;
    }
    let id: [u8; 32] = msg[1..33].try_into().ok()?;
    let n = u32::from_le_bytes([msg[33], msg[34], msg[35], msg[36]]) as usize;
    (n == msg.len() - 37).then_some((ChunkId::from_bytes(id), 37))
}

/// If `head` (the first bytes of a response body) starts a `Frame`, the
/// frame length it states: a reader then takes the frame from the stream
/// into a buffer of its own.
pub fn frame_len_in(head: &[u8]) -> Option<usize> {
    if head.len() < 5 || head[0] != kind::FRAME {
        return None;
    }
    Some(u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize)
}

/// Reads the 4-byte length prefix of a message and checks it.
pub fn message_len(prefix: [u8; 4]) -> Result<usize> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n == 0 {
        return Err(FormatError::malformed("peer message", "empty message"));
    }
    if n > MAX_MESSAGE {
        return Err(FormatError::TooLarge {
            what: "peer message",
            value: n as u64,
            limit: MAX_MESSAGE as u64,
        });
    }
    Ok(n)
}

/// Starts a message: room for the length, then the kind.
fn start(kind: u8, capacity: usize) -> Writer {
    let mut w = Writer {
        buf: Vec::with_capacity(capacity + 5),
    };
    w.u32(0);
    w.u8(kind);
    w
}

/// Fills in the length prefix.
fn finish(mut w: Writer) -> Vec<u8> {
    let n = (w.buf.len() - 4) as u32;
    w.buf[..4].copy_from_slice(&n.to_le_bytes());
    w.buf
}

fn blob(w: &mut Writer, b: &[u8]) {
    w.len32(b.len());
    w.bytes(b);
}

fn ids(w: &mut Writer, v: &[ChunkId]) {
    w.len32(v.len());
    for id in v {
        w.bytes(id.as_bytes());
    }
}

fn read_blob(r: &mut Reader<'_>, limit: usize, what: &'static str) -> Result<Vec<u8>> {
    Ok(r.blob(limit, what)?.to_vec())
}

fn read_ids(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<ChunkId>> {
    let n = r.count(MAX_IDS, 32, what)?;
    (0..n).map(|_| r.chunk_id(what)).collect()
}

impl Request {
    /// The message, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello { version, job } => {
                let mut w = start(kind::HELLO, 8 + job.len());
                w.u16(*version);
                w.string(job);
                finish(w)
            }
            Request::PutChunk { id, frame } => {
                let mut w = start(kind::PUT_CHUNK, 40 + frame.len());
                w.bytes(id.as_bytes());
                blob(&mut w, frame);
                finish(w)
            }
            Request::HasChunks(v) => {
                let mut w = start(kind::HAS_CHUNKS, 4 + 32 * v.len());
                ids(&mut w, v);
                finish(w)
            }
            Request::GetChunk { id, range } => {
                let mut w = start(kind::GET_CHUNK, 41);
                w.bytes(id.as_bytes());
                match range {
                    None => w.u8(0),
                    Some((a, b)) => {
                        w.u8(1);
                        w.u32(*a);
                        w.u32(*b);
                    }
                }
                finish(w)
            }
            Request::PutManifest { step, rank, bytes } => {
                let mut w = start(kind::PUT_MANIFEST, 16 + bytes.len());
                w.u64(*step);
                w.u32(*rank);
                blob(&mut w, bytes);
                finish(w)
            }
            Request::GetManifest { step, rank } => {
                let mut w = start(kind::GET_MANIFEST, 12);
                w.u64(*step);
                w.u32(*rank);
                finish(w)
            }
            Request::ListSteps => finish(start(kind::LIST_STEPS, 0)),
            Request::Commit(b) => {
                let mut w = start(kind::COMMIT, 4 + b.len());
                blob(&mut w, b);
                finish(w)
            }
            Request::DeleteStep(s) => {
                let mut w = start(kind::DELETE_STEP, 8);
                w.u64(*s);
                finish(w)
            }
            Request::DeleteChunks(v) => {
                let mut w = start(kind::DELETE_CHUNKS, 4 + 32 * v.len());
                ids(&mut w, v);
                finish(w)
            }
            Request::ListChunks => finish(start(kind::LIST_CHUNKS, 0)),
            Request::Stats => finish(start(kind::STATS, 0)),
        }
    }

    /// Decodes a message body (after the length prefix: kind, then body).
    pub fn decode(msg: &[u8]) -> Result<Request> {
        let what = "peer request";
        let mut r = Reader::new(msg);
        let req = match r.u8(what)? {
            kind::HELLO => {
                let version = r.u16(what)?;
                let job = r.string(MAX_JOB_ID_LEN, what)?;
                validate_job_id(&job)?;
                Request::Hello { version, job }
            }
            kind::PUT_CHUNK => {
                let id = r.chunk_id(what)?;
                let frame = read_blob(&mut r, MAX_MESSAGE, what)?;
                Request::PutChunk { id, frame }
            }
            kind::HAS_CHUNKS => Request::HasChunks(read_ids(&mut r, what)?),
            kind::GET_CHUNK => {
                let id = r.chunk_id(what)?;
                let range = match r.u8(what)? {
                    0 => None,
                    1 => {
                        let (a, b) = (r.u32(what)?, r.u32(what)?);
                        if a > b || b > MAX_CHUNK_LEN {
                            return Err(FormatError::malformed(what, format!("range {a}..{b}")));
                        }
                        Some((a, b))
                    }
                    t => return Err(FormatError::malformed(what, format!("range tag {t}"))),
                };
                Request::GetChunk { id, range }
            }
            kind::PUT_MANIFEST => {
                let step = r.u64(what)?;
                let rank = r.u32(what)?;
                let bytes = read_blob(&mut r, MAX_MANIFEST_LEN, what)?;
                Request::PutManifest { step, rank, bytes }
            }
            kind::GET_MANIFEST => {
                let step = r.u64(what)?;
                let rank = r.u32(what)?;
                Request::GetManifest { step, rank }
            }
            kind::LIST_STEPS => Request::ListSteps,
            kind::COMMIT => Request::Commit(read_blob(&mut r, MAX_RECORD, what)?),
            kind::DELETE_STEP => Request::DeleteStep(r.u64(what)?),
            kind::DELETE_CHUNKS => Request::DeleteChunks(read_ids(&mut r, what)?),
            kind::LIST_CHUNKS => Request::ListChunks,
            kind::STATS => Request::Stats,
            k => return Err(FormatError::malformed(what, format!("unknown kind {k}"))),
        };
        r.finish(what)?;
        Ok(req)
    }
}

impl Response {
    /// The message, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Response::Ok => finish(start(kind::OK, 0)),
            Response::HelloOk { version, node } => {
                let mut w = start(kind::HELLO_OK, 6 + node.len());
                w.u16(*version);
                w.string(truncate(node));
                finish(w)
            }
            Response::Error { code, message } => {
                let mut w = start(kind::ERROR, 5 + message.len());
                w.u8(*code as u8);
                w.string(truncate(message));
                finish(w)
            }
            Response::Stored { new } => {
                let mut w = start(kind::STORED, 1);
                w.u8(u8::from(*new));
                finish(w)
            }
            Response::Frame(b) => {
                let mut w = start(kind::FRAME, 4 + b.len());
                blob(&mut w, b);
                finish(w)
            }
            Response::Bytes(b) => {
                let mut w = start(kind::BYTES, 4 + b.len());
                blob(&mut w, b);
                finish(w)
            }
            Response::Present(v) => {
                let mut w = start(kind::PRESENT, 4 + v.len() / 8 + 1);
                w.len32(v.len());
                let mut bits = vec![0u8; v.len().div_ceil(8)];
                for (i, _) in v.iter().enumerate().filter(|(_, p)| **p) {
                    bits[i / 8] |= 1 << (i % 8);
                }
                w.bytes(&bits);
                finish(w)
            }
            Response::Steps(v) => {
                let mut w = start(kind::STEPS, 64 * v.len());
                w.len32(v.len());
                for s in v {
                    w.u64(s.step);
                    w.len32(s.manifests.len());
                    for r in &s.manifests {
                        w.u32(*r);
                    }
                    w.len32(s.records.len());
                    for rec in &s.records {
                        blob(&mut w, rec);
                    }
                }
                finish(w)
            }
            Response::Ids(v) => {
                let mut w = start(kind::IDS, 4 + 32 * v.len());
                ids(&mut w, v);
                finish(w)
            }
            Response::Stats(s) => {
                let mut w = start(kind::STATS_R, 80);
                for v in [
                    s.bytes_in_memory,
                    s.bytes_on_disk,
                    s.chunks,
                    s.jobs,
                    s.bytes_in,
                    s.bytes_out,
                    s.connections,
                    s.refused,
                    s.errors,
                ] {
                    w.u64(v);
                }
                finish(w)
            }
        }
    }

    /// Decodes a message body (after the length prefix).
    pub fn decode(msg: &[u8]) -> Result<Response> {
        let what = "peer response";
        let mut r = Reader::new(msg);
        let resp = match r.u8(what)? {
            kind::OK => Response::Ok,
            kind::HELLO_OK => {
                let version = r.u16(what)?;
                let node = r.string(MAX_TEXT, what)?;
                Response::HelloOk { version, node }
            }
            kind::ERROR => {
                let c = r.u8(what)?;
                let code = ErrorCode::from_u8(c)
                    .ok_or_else(|| FormatError::malformed(what, format!("error code {c}")))?;
                let message = r.string(MAX_TEXT, what)?;
                Response::Error { code, message }
            }
            kind::STORED => Response::Stored {
                new: match r.u8(what)? {
                    0 => false,
                    1 => true,
                    b => return Err(FormatError::malformed(what, format!("stored flag {b}"))),
                },
            },
            kind::FRAME => Response::Frame(read_blob(&mut r, MAX_MESSAGE, what)?),
            kind::BYTES => Response::Bytes(read_blob(&mut r, MAX_MESSAGE, what)?),
            kind::PRESENT => {
                let n = r.u32(what)? as usize;
                if n > MAX_IDS {
                    return Err(FormatError::TooLarge {
                        what,
                        value: n as u64,
                        limit: MAX_IDS as u64,
                    });
                }
                let bits = r.bytes(n.div_ceil(8), what)?;
                Response::Present((0..n).map(|i| bits[i / 8] & (1 << (i % 8)) != 0).collect())
            }
            kind::STEPS => {
                let n = r.count(MAX_STEPS, 16, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let step = r.u64(what)?;
                    let m = r.count(MAX_RANKS, 4, what)?;
                    let manifests = (0..m).map(|_| r.u32(what)).collect::<Result<_>>()?;
                    let k = r.count(MAX_RANKS, 4, what)?;
                    let records = (0..k)
                        .map(|_| read_blob(&mut r, MAX_RECORD, what))
                        .collect::<Result<_>>()?;
                    v.push(StepEntry {
                        step,
                        manifests,
                        records,
                    });
                }
                Response::Steps(v)
            }
            kind::IDS => Response::Ids(read_ids(&mut r, what)?),
            kind::STATS_R => {
                let mut f = [0u64; 9];
                for x in &mut f {
                    *x = r.u64(what)?;
                }
                Response::Stats(ServiceStats {
                    bytes_in_memory: f[0],
                    bytes_on_disk: f[1],
                    chunks: f[2],
                    jobs: f[3],
                    bytes_in: f[4],
                    bytes_out: f[5],
                    connections: f[6],
                    refused: f[7],
                    errors: f[8],
                })
            }
            k => return Err(FormatError::malformed(what, format!("unknown kind {k}"))),
        };
        r.finish(what)?;
        Ok(resp)
    }
}

/// At most [`MAX_TEXT`] bytes of `s`, cut at a character boundary.
fn truncate(s: &str) -> &str {
    if s.len() <= MAX_TEXT {
        return s;
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Fuzzing entry point: decodes arbitrary bytes as a length-prefixed
/// request and a response; must never panic. Returns whether either
/// decoded (and re-encoding what decoded gives back the same bytes).
pub fn fuzz_decode(data: &[u8]) -> bool {
    let mut ok = false;
    if let Ok(req) = Request::decode(data) {
        let enc = req.encode();
        assert_eq!(&enc[4..], data, "request round trip");
        ok = true;
    }
    if let Ok(resp) = Response::decode(data) {
        let enc = resp.encode();
        // Error and name texts are cut at MAX_TEXT; bit padding is free.
        if !matches!(resp, Response::Present(_)) {
            assert_eq!(&enc[4..], data, "response round trip");
        }
        ok = true;
    }
    if data.len() >= 4 {
        let _ = message_len([data[0], data[1], data[2], data[3]]);
    }
    // The in-place readers agree with the decoder: a put the fast path
    // takes is a put the decoder takes, with the same id and frame.
    if let Some((id, at)) = put_chunk_in(data) {
        let decoded = Request::decode(data);
        assert!(
            matches!(&decoded, Ok(Request::PutChunk { id: want, frame })
                if *want == id && frame.as_slice() == &data[at..]),
            "put_chunk_in took what decode gives as {decoded:?}"
        );
    }
    let _ = frame_len_in(data);
    ok
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use proptest::prelude::*;

    fn id(b: u8) -> ChunkId {
        ChunkId::of(&[b])
    }

    fn requests() -> Vec<Request> {
        vec![
            Request::Hello {
                version: VERSION,
                job: "job-1".into(),
            },
            Request::PutChunk {
                id: id(1),
                frame: vec![1, 2, 3],
            },
            Request::HasChunks(vec![id(1), id(2)]),
            Request::GetChunk {
                id: id(3),
                range: None,
            },
            Request::GetChunk {
                id: id(3),
                range: Some((5, 9)),
            },
            Request::PutManifest {
                step: 7,
                rank: 2,
                bytes: vec![9; 40],
            },
            Request::GetManifest { step: 7, rank: 2 },
            Request::ListSteps,
            Request::Commit(vec![4; 10]),
            Request::DeleteStep(3),
            Request::DeleteChunks(vec![id(4)]),
            Request::ListChunks,
            Request::Stats,
        ]
    }

    fn responses() -> Vec<Response> {
        vec![
            Response::Ok,
            Response::HelloOk {
                version: 1,
                node: "node-a".into(),
            },
            Response::Error {
                code: ErrorCode::Forbidden,
                message: "no".into(),
            },
            Response::Stored { new: true },
            Response::Frame(vec![1; 100]),
            Response::Bytes(vec![]),
            Response::Present(vec![
                true, false, true, true, false, false, false, false, true,
            ]),
            Response::Steps(vec![
                StepEntry {
                    step: 1,
                    manifests: vec![0, 1],
                    records: vec![vec![1, 2], vec![3]],
                },
                StepEntry::default(),
            ]),
            Response::Ids(vec![id(1), id(9)]),
            Response::Stats(ServiceStats {
                bytes_in_memory: 1,
                errors: 9,
                ..ServiceStats::default()
            }),
        ]
    }

    #[test]
    fn every_message_round_trips_and_states_its_length() {
        for r in requests() {
            let enc = r.encode();
            let n = message_len(enc[..4].try_into().unwrap()).unwrap();
            assert_eq!(n, enc.len() - 4);
            assert_eq!(Request::decode(&enc[4..]).unwrap(), r);
        }
        for r in responses() {
            let enc = r.encode();
            assert_eq!(Response::decode(&enc[4..]).unwrap(), r);
        }
    }

    #[test]
    fn frame_envelopes_match_the_encoder() {
        let f = vec![9u8; 1000];
        let enc = Response::Frame(f.clone()).encode();
        assert_eq!(&enc[..9], &frame_envelope(f.len()));
        assert_eq!(frame_in(&enc[4..]), Some(f.as_slice()));
        assert_eq!(frame_in(&Response::Ok.encode()[4..]), None);
        assert_eq!(frame_in(&enc[4..enc.len() - 1]), None);
        assert_eq!(frame_len_in(&enc[4..20]), Some(f.len()));
        assert_eq!(frame_len_in(&Response::Ok.encode()[4..]), None);
        assert_eq!(frame_len_in(&enc[4..7]), None);
    }

    #[test]
    fn put_chunk_envelopes_match_the_encoder() {
        let frame = vec![7u8; 1000];
        let req = Request::PutChunk {
            id: id(5),
            frame: frame.clone(),
        };
        let enc = req.encode();
        let head = put_chunk_envelope(&id(5), frame.len()).unwrap();
        assert_eq!(&enc[..41], &head);
        assert_eq!(&enc[41..], frame.as_slice());
        assert_eq!(put_chunk_in(&enc[4..]), Some((id(5), 37)));
        // Short, long, or another kind: not a put.
        assert_eq!(put_chunk_in(&enc[4..enc.len() - 1]), None);
        let mut long = enc[4..].to_vec();
        long.push(0);
        assert_eq!(put_chunk_in(&long), None);
        assert_eq!(put_chunk_in(&Request::Stats.encode()[4..]), None);
        assert_eq!(put_chunk_in(&enc[4..20]), None);
        assert!(put_chunk_envelope(&id(5), MAX_MESSAGE).is_none());
    }

    #[test]
    fn hostile_lengths_and_values_are_refused() {
        assert!(message_len((MAX_MESSAGE as u32 + 1).to_le_bytes()).is_err());
        assert!(message_len(0u32.to_le_bytes()).is_err());
        assert!(message_len(u32::MAX.to_le_bytes()).is_err());
        // A count of ids far beyond the bytes present.
        let mut m = vec![kind::HAS_CHUNKS];
        m.extend_from_slice(&(MAX_IDS as u32).to_le_bytes());
        assert!(Request::decode(&m).is_err());
        // A blob claiming 4 GiB.
        let mut m = vec![kind::COMMIT];
        m.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Request::decode(&m).is_err());
        // A bad job id, an inverted range, trailing bytes, unknown kinds.
        let bad_job = Request::Hello {
            version: 1,
            job: "../etc".into(),
        }
        .encode();
        assert!(Request::decode(&bad_job[4..]).is_err());
        let mut m = vec![kind::GET_CHUNK];
        m.extend_from_slice(id(1).as_bytes());
        m.push(1);
        m.extend_from_slice(&9u32.to_le_bytes());
        m.extend_from_slice(&5u32.to_le_bytes());
        assert!(Request::decode(&m).is_err());
        let mut ok = Request::Stats.encode();
        ok.push(0);
        assert!(Request::decode(&ok[4..]).is_err());
        assert!(Request::decode(&[200]).is_err());
        assert!(Response::decode(&[1]).is_err());
        assert!(Request::decode(&[]).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = fuzz_decode(&data);
        }

        #[test]
        fn the_in_place_put_reader_agrees_with_the_decoder(
            frame in proptest::collection::vec(any::<u8>(), 0..200),
            cut in 0usize..260,
            stated in proptest::option::of(0u32..300),
        ) {
            let mut m = Request::PutChunk { id: id(1), frame }.encode()[4..].to_vec();
            if let Some(n) = stated {
                m[33..37].copy_from_slice(&n.to_le_bytes());
            }
            m.truncate(cut.max(1));
            // Panics if the two disagree.
            let _ = fuzz_decode(&m);
        }

        #[test]
        fn any_truncation_of_a_valid_message_is_an_error(cut in 0usize..60) {
            for r in requests() {
                let enc = r.encode();
                let body = &enc[4..];
                if cut < body.len() {
                    prop_assert!(Request::decode(&body[..cut]).is_err());
                }
            }
        }
    }
}

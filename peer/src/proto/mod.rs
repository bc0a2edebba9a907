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

mod in_place;
pub use in_place::{
    bytes_envelope, frame_envelope, frame_in, frame_len_in, put_chunk_envelope, put_chunk_in,
};

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
/// Most steps pinned per job on a service.
pub const MAX_PINS: usize = 4096;

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
    /// Retire one rank's shard of a step (its record, then its manifest),
    /// leaving every other rank's alone.
    DeleteShard {
        /// Step.
        step: u64,
        /// Rank.
        rank: u32,
    },
    /// The chunk ids held for the job, ascending, after `after` (a page
    /// of at most [`MAX_IDS`]; a full page means ask again after its last).
    ListChunks {
        /// Resume after this id (none: from the start).
        after: Option<ChunkId>,
    },
    /// The service's counters.
    Stats,
    /// Pin a step of the job (garbage collection never retires it), or
    /// unpin it.
    SetPin {
        /// Step.
        step: u64,
        /// Pin (true) or unpin.
        pinned: bool,
    },
    /// The job's pinned steps.
    ListPins,
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
    /// Pinned steps, ascending (at most [`MAX_PINS`]).
    Pins(Vec<u64>),
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
    pub(super) const DELETE_SHARD: u8 = 13;
    pub(super) const SET_PIN: u8 = 14;
    pub(super) const LIST_PINS: u8 = 15;

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
    pub(super) const PINS: u8 = 138;
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
            Request::DeleteShard { step, rank } => {
                let mut w = start(kind::DELETE_SHARD, 12);
                w.u64(*step);
                w.u32(*rank);
                finish(w)
            }
            Request::DeleteChunks(v) => {
                let mut w = start(kind::DELETE_CHUNKS, 4 + 32 * v.len());
                ids(&mut w, v);
                finish(w)
            }
            Request::ListChunks { after } => {
                let mut w = start(kind::LIST_CHUNKS, 33);
                match after {
                    None => w.u8(0),
                    Some(id) => {
                        w.u8(1);
                        w.bytes(id.as_bytes());
                    }
                }
                finish(w)
            }
            Request::Stats => finish(start(kind::STATS, 0)),
            Request::SetPin { step, pinned } => {
                let mut w = start(kind::SET_PIN, 9);
                w.u64(*step);
                w.u8(u8::from(*pinned));
                finish(w)
            }
            Request::ListPins => finish(start(kind::LIST_PINS, 0)),
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
            kind::DELETE_SHARD => {
                let step = r.u64(what)?;
                let rank = r.u32(what)?;
                Request::DeleteShard { step, rank }
            }
            kind::LIST_CHUNKS => Request::ListChunks {
                after: match r.u8(what)? {
                    0 => None,
                    1 => Some(r.chunk_id(what)?),
                    t => return Err(FormatError::malformed(what, format!("cursor tag {t}"))),
                },
            },
            kind::STATS => Request::Stats,
            kind::SET_PIN => {
                let step = r.u64(what)?;
                let pinned = match r.u8(what)? {
                    0 => false,
                    1 => true,
                    b => return Err(FormatError::malformed(what, format!("pin flag {b}"))),
                };
                Request::SetPin { step, pinned }
            }
            kind::LIST_PINS => Request::ListPins,
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
            Response::Pins(v) => {
                let mut w = start(kind::PINS, 4 + 8 * v.len());
                w.len32(v.len());
                for s in v {
                    w.u64(*s);
                }
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
            kind::PINS => {
                let n = r.count(MAX_PINS, 8, what)?;
                Response::Pins((0..n).map(|_| r.u64(what)).collect::<Result<_>>()?)
            }
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
mod tests;

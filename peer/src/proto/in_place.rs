//! Reading and writing the large messages in place: the envelope of a
//! `Frame` answer or a `PutChunk` request is written before the frame's own
//! buffer (no copy into a message), and a received one is recognised
//! without copying the frame out. Each agrees byte for byte with
//! [`super::Request::encode`] / [`super::Response::decode`] (tested, and
//! checked by the fuzz entry point).

use strata_format::ChunkId;

use super::{kind, MAX_MESSAGE};

/// The first bytes of a `Frame` response carrying `len` frame bytes (the
/// frame follows): lets a sender write a stored frame without copying it
/// into the message.
pub fn frame_envelope(len: usize) -> [u8; 9] {
    envelope(kind::FRAME, len)
}

/// The bytes [`Response::Bytes`](super::Response::Bytes) of a `len`-byte
/// blob starts with: the blob follows, so a large answer is sent without
/// being copied into a message.
pub fn bytes_envelope(len: usize) -> [u8; 9] {
    envelope(kind::BYTES, len)
}

fn envelope(kind: u8, len: usize) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[..4].copy_from_slice(&((len + 5) as u32).to_le_bytes());
    h[4] = kind;
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
/// pieces, and has sent the same message [`super::Request::encode`] would build,
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

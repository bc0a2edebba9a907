//! gRPC's framing over HTTP/2, as etcd's server speaks it: a message is a
//! byte (compressed: never here) and a 4-byte big-endian length before the
//! protobuf bytes; a call that fails says so in `grpc-status` and
//! `grpc-message` (headers without a body: gRPC's "trailers only").
//! Reading is bounded: a length over the limit is refused before anything
//! is allocated for it.

use crate::error::{Error, Result};

/// `msg` as one gRPC message on the wire.
pub(crate) fn frame(msg: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(msg.len())
        .map_err(|_| Error::Coordination("etcd request: larger than 4 GiB".into()))?;
    let mut b = Vec::with_capacity(5 + msg.len());
    b.push(0);
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(msg);
    Ok(b)
}

/// The messages of a stream as its bytes come, each at most `max` bytes.
pub(crate) struct Frames {
    buf: Vec<u8>,
    max: usize,
}

impl Frames {
    pub(crate) fn new(max: usize) -> Self {
        Frames {
            buf: Vec::new(),
            max,
        }
    }

    /// Adds bytes read from the stream.
    pub(crate) fn push(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// The next whole message, if its bytes are all there; an error for a
    /// compressed message (never asked for) or one over the bound.
    pub(crate) fn next(&mut self) -> Result<Option<Vec<u8>>> {
        let Some(head) = self.buf.get(..5) else {
            return Ok(None);
        };
        if head[0] != 0 {
            return Err(Error::Coordination(format!(
                "etcd answer: a message with flags {:#x} (compression was not asked for)",
                head[0]
            )));
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > self.max {
            return Err(Error::Coordination(format!(
                "etcd answer: a message of {len} bytes, over the bound of {}",
                self.max
            )));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let msg = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some(msg))
    }

    /// Bytes held that are not yet a whole message.
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// The error a response's headers (or trailers) carry, if any: an HTTP
/// status other than 200, or a `grpc-status` other than 0 (with etcd's own message,
/// which callers match: "authentication failed", "invalid auth token").
pub(crate) fn failed(
    what: &str,
    h: &reqwest::header::HeaderMap,
    status: reqwest::StatusCode,
) -> Option<Error> {
    let code = h.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(|m| strata_tiered::percent_decode(m, false))
        .unwrap_or_default();
    if !status.is_success() {
        return Some(Error::Coordination(format!(
            "etcd {what}: HTTP {}{}",
            status,
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        )));
    }
    match code {
        None | Some("0") => None,
        Some(c) => Some(Error::Coordination(format!(
            "etcd {what}: gRPC status {c}: {message}"
        ))),
    }
}

/// A gRPC answer read message by message, with its status at the end:
/// in the trailers, or in the headers of a reply without a body (etcd's
/// plain port sends a failure that way; over TLS its status is always in
/// the trailers).
pub(crate) struct Reader {
    body: reqwest::Body,
    frames: Frames,
    what: String,
}

impl Reader {
    /// The answer's reader, or the error its headers already say.
    pub(crate) fn new(what: &str, resp: reqwest::Response, max: usize) -> Result<Self> {
        if let Some(e) = failed(what, resp.headers(), resp.status()) {
            return Err(e);
        }
        Ok(Reader {
            body: reqwest::Body::from(resp),
            frames: Frames::new(max),
            what: what.to_string(),
        })
    }

    /// The next message (`got` is told the bytes of each piece read), or
    /// None at the end of an answer whose status is OK; an error for
    /// another status, and for an answer that ends without one.
    pub(crate) async fn next(&mut self, got: impl Fn(usize)) -> Result<Option<Vec<u8>>> {
        use http_body_util::BodyExt as _;
        loop {
            if let Some(m) = self.frames.next()? {
                return Ok(Some(m));
            }
            let frame = match self.body.frame().await {
                Some(f) => {
                    f.map_err(|e| Error::Coordination(format!("etcd {}: {e}", self.what)))?
                }
                None => {
                    return Err(Error::Coordination(format!(
                        "etcd {}: the answer ended without its status ({} bytes left)",
                        self.what,
                        self.frames.pending()
                    )))
                }
            };
            match frame.into_data() {
                Ok(data) => {
                    got(data.len());
                    self.frames.push(&data);
                }
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    return match failed(&self.what, &trailers, reqwest::StatusCode::OK) {
                        Some(e) => Err(e),
                        None if trailers.contains_key("grpc-status") => {
                            if self.frames.pending() > 0 {
                                return Err(Error::Coordination(format!(
                                    "etcd {}: the answer ended inside a message",
                                    self.what
                                )));
                            }
                            Ok(None)
                        }
                        None => Err(Error::Coordination(format!(
                            "etcd {}: trailers without a status",
                            self.what
                        ))),
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_whole_in_order_and_bounded() {
        let mut f = Frames::new(16);
        let mut wire = frame(b"hello").unwrap();
        wire.extend(frame(b"").unwrap());
        wire.extend(frame(b"world!").unwrap());
        // Byte by byte: a message only once its last byte is there.
        let mut got = Vec::new();
        for b in &wire {
            f.push(std::slice::from_ref(b));
            while let Some(m) = f.next().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![b"hello".to_vec(), Vec::new(), b"world!".to_vec()]);
        assert_eq!(f.pending(), 0);
        // A length over the bound is refused from its header alone.
        let mut f = Frames::new(16);
        f.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(f.next().is_err());
        // A compressed message is refused.
        let mut f = Frames::new(16);
        f.push(&[1, 0, 0, 0, 1, 7]);
        assert!(f.next().is_err());
    }

    #[test]
    fn messages_are_unpercented_with_plus_kept() {
        let unpercent = |m| strata_tiered::percent_decode(m, false);
        assert_eq!(unpercent("1+1"), "1+1");
        assert_eq!(
            unpercent("etcdserver: invalid auth token"),
            "etcdserver: invalid auth token"
        );
        assert_eq!(unpercent("a%20b%3Ac"), "a b:c");
        assert_eq!(unpercent("100%"), "100%");
        assert_eq!(unpercent("%zz"), "%zz");
    }
}

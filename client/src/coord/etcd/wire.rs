//! The node link's messages: how the rank processes of one node reach the
//! node's leader ([`super::node_leader`]) over a local socket. A frame is
//! a 4-byte little-endian length, then the message; nothing from the
//! socket is trusted: lengths are bounded before anything is allocated,
//! and a malformed message is an error, never a panic.

use std::io::{Read, Write};

use strata_format::wire::{Reader, Writer};

use crate::error::{Error, Result};

/// Version of the link; a process of another build is refused.
pub(super) const VERSION: u8 = 1;

/// Largest frame either side accepts: a round's value (a restore round's
/// list of steps is bounded far below this) and its key, with room.
pub(super) const MAX_FRAME: usize = 72 << 20;

/// Largest string field (a job id, a key, a message).
pub(super) const MAX_STRING: usize = 64 << 10;

/// What a rank process sends its node's leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ToLeader {
    /// The first message: who this process is.
    Hello(Hello),
    /// This rank's value in the reducing round `key` (answered by an
    /// [`ToMember::Outcome`] of the same `id`).
    Round {
        id: u64,
        key: String,
        timeout_ms: u64,
        value: Vec<u8>,
    },
    /// The process is leaving cleanly (its checkpointer was dropped).
    Bye,
}

/// A rank process's introduction: the leader checks every field against
/// its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) version: u8,
    pub(super) job: String,
    pub(super) incarnation: String,
    pub(super) world: u32,
    pub(super) rank: u32,
    pub(super) pid: u32,
}

/// What the leader answers.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum ToMember {
    /// The hello was accepted: the rank takes part through this link.
    Welcome,
    /// The hello was refused (and the link closes).
    Refused(WireError),
    /// The outcome of the round `id`.
    Outcome {
        id: u64,
        result: std::result::Result<Vec<u8>, WireError>,
    },
}

/// An error crossing the link: the kinds a round or a hello can end with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum WireError {
    Coordination(String),
    Config(String),
    RankClaimed {
        job: String,
        rank: u32,
        other: String,
    },
}

impl From<&Error> for WireError {
    fn from(e: &Error) -> Self {
        match e {
            Error::Config(m) => WireError::Config(m.clone()),
            Error::RankClaimed { job, rank, other } => WireError::RankClaimed {
                job: job.clone(),
                rank: *rank,
                other: other.clone(),
            },
            Error::Coordination(m) => WireError::Coordination(m.clone()),
            other => WireError::Coordination(other.to_string()),
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Coordination(m) => Error::Coordination(m),
            WireError::Config(m) => Error::Config(m),
            WireError::RankClaimed { job, rank, other } => Error::RankClaimed { job, rank, other },
        }
    }
}

fn malformed(e: strata_format::FormatError) -> Error {
    Error::Coordination(format!("node link: a malformed message ({e})"))
}

fn bad(what: &'static str) -> Error {
    malformed(strata_format::FormatError::malformed(what, "unknown value"))
}

/// `s` cut to [`MAX_STRING`] bytes (an error message; names and keys are
/// checked by their senders instead).
fn cut(s: &str) -> &str {
    let mut n = s.len().min(MAX_STRING);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

fn put_error(w: &mut Writer, e: &WireError) {
    match e {
        WireError::Coordination(m) => {
            w.u8(0);
            w.string(cut(m));
        }
        WireError::Config(m) => {
            w.u8(1);
            w.string(cut(m));
        }
        WireError::RankClaimed { job, rank, other } => {
            w.u8(2);
            w.string(cut(job));
            w.u32(*rank);
            w.string(cut(other));
        }
    }
}

fn get_error(r: &mut Reader<'_>) -> strata_format::Result<Option<WireError>> {
    Ok(Some(match r.u8("error kind")? {
        0 => WireError::Coordination(r.string(MAX_STRING, "message")?),
        1 => WireError::Config(r.string(MAX_STRING, "message")?),
        2 => WireError::RankClaimed {
            job: r.string(MAX_STRING, "job")?,
            rank: r.u32("rank")?,
            other: r.string(MAX_STRING, "message")?,
        },
        _ => return Ok(None),
    }))
}

impl ToLeader {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            ToLeader::Hello(h) => {
                w.u8(1);
                w.u8(h.version);
                w.string(&h.job);
                w.string(&h.incarnation);
                w.u32(h.world);
                w.u32(h.rank);
                w.u32(h.pid);
            }
            ToLeader::Round {
                id,
                key,
                timeout_ms,
                value,
            } => {
                w.u8(2);
                w.u64(*id);
                w.string(key);
                w.u64(*timeout_ms);
                w.len32(value.len());
                w.bytes(value);
            }
            ToLeader::Bye => w.u8(3),
        }
        w.buf
    }

    pub(super) fn decode(b: &[u8]) -> Result<ToLeader> {
        let mut r = Reader::new(b);
        let m = match r.u8("tag").map_err(malformed)? {
            1 => (|| {
                Ok(ToLeader::Hello(Hello {
                    version: r.u8("version")?,
                    job: r.string(MAX_STRING, "job")?,
                    incarnation: r.string(MAX_STRING, "incarnation")?,
                    world: r.u32("world")?,
                    rank: r.u32("rank")?,
                    pid: r.u32("pid")?,
                }))
            })(),
            2 => (|| {
                Ok(ToLeader::Round {
                    id: r.u64("id")?,
                    key: r.string(MAX_STRING, "key")?,
                    timeout_ms: r.u64("timeout")?,
                    value: r.blob(MAX_FRAME, "value")?.to_vec(),
                })
            })(),
            3 => Ok(ToLeader::Bye),
            _ => return Err(bad("tag")),
        }
        .map_err(malformed)?;
        r.finish("message").map_err(malformed)?;
        Ok(m)
    }
}

impl ToMember {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            ToMember::Welcome => w.u8(1),
            ToMember::Refused(e) => {
                w.u8(2);
                put_error(&mut w, e);
            }
            ToMember::Outcome { id, result } => {
                w.u8(3);
                w.u64(*id);
                match result {
                    Ok(v) => {
                        w.u8(1);
                        w.len32(v.len());
                        w.bytes(v);
                    }
                    Err(e) => {
                        w.u8(0);
                        put_error(&mut w, e);
                    }
                }
            }
        }
        w.buf
    }

    pub(super) fn decode(b: &[u8]) -> Result<ToMember> {
        let mut r = Reader::new(b);
        let error = |r: &mut Reader<'_>| {
            get_error(r)
                .map_err(malformed)?
                .ok_or_else(|| bad("error kind"))
        };
        let m = match r.u8("tag").map_err(malformed)? {
            1 => ToMember::Welcome,
            2 => ToMember::Refused(error(&mut r)?),
            3 => ToMember::Outcome {
                id: r.u64("id").map_err(malformed)?,
                result: match r.u8("outcome").map_err(malformed)? {
                    1 => Ok(r.blob(MAX_FRAME, "value").map_err(malformed)?.to_vec()),
                    0 => Err(error(&mut r)?),
                    _ => return Err(bad("outcome")),
                },
            },
            _ => return Err(bad("tag")),
        };
        r.finish("message").map_err(malformed)?;
        Ok(m)
    }
}

/// Writes one frame.
pub(super) fn write_frame(w: &mut impl Write, msg: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(msg.len())
        .ok()
        .filter(|&n| n as usize <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other("node link: message too large"))?;
    let mut b = Vec::with_capacity(4 + msg.len());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(msg);
    w.write_all(&b)?;
    w.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of the stream (between
/// frames). A frame longer than [`MAX_FRAME`] is an error before anything
/// is allocated for it.
pub(super) fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    read_frame_max(r, MAX_FRAME)
}

/// [`read_frame`] with a smaller bound (a hello is small: a process that
/// has not introduced itself gets no large buffer).
pub(super) fn read_frame_max(r: &mut impl Read, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("node link: a frame of {n} bytes (at most {max})"),
        ));
    }
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)?;
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_to_leader() -> Vec<ToLeader> {
        vec![
            ToLeader::Hello(Hello {
                version: VERSION,
                job: "job-é".into(),
                incarnation: "3".into(),
                world: 16,
                rank: 5,
                pid: 4242,
            }),
            ToLeader::Round {
                id: 7,
                key: "commit/j/12".into(),
                timeout_ms: 30_000,
                value: vec![1, 0, 1],
            },
            ToLeader::Bye,
        ]
    }

    fn all_to_member() -> Vec<ToMember> {
        vec![
            ToMember::Welcome,
            ToMember::Refused(WireError::RankClaimed {
                job: "j".into(),
                rank: 3,
                other: "pid 9 holds it".into(),
            }),
            ToMember::Outcome {
                id: 1,
                result: Ok(vec![9; 100]),
            },
            ToMember::Outcome {
                id: 2,
                result: Err(WireError::Coordination("rank 4 failed".into())),
            },
            ToMember::Outcome {
                id: 3,
                result: Err(WireError::Config("bad".into())),
            },
        ]
    }

    #[test]
    fn messages_round_trip_and_every_truncation_is_an_error() {
        for m in all_to_leader() {
            let b = m.encode();
            assert_eq!(ToLeader::decode(&b).unwrap(), m);
            for cut in 0..b.len() {
                assert!(ToLeader::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(ToLeader::decode(&long).is_err());
        }
        for m in all_to_member() {
            let b = m.encode();
            assert_eq!(ToMember::decode(&b).unwrap(), m);
            for cut in 0..b.len() {
                assert!(ToMember::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
        }
        assert!(ToLeader::decode(&[9]).is_err());
        assert!(ToMember::decode(&[3, 0, 0, 0, 0, 0, 0, 0, 0, 7]).is_err());
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocating() {
        // A string field claiming 4 GiB in a 9-byte message.
        let mut b = vec![1, VERSION];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(b"abc");
        assert!(ToLeader::decode(&b).is_err());
        // A frame header claiming more than MAX_FRAME.
        let mut r = std::io::Cursor::new(((MAX_FRAME + 1) as u32).to_le_bytes().to_vec());
        let e = read_frame(&mut r).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        // A stream cut inside a header or a body.
        assert!(read_frame(&mut std::io::Cursor::new(vec![5, 0])).is_err());
        assert!(read_frame(&mut std::io::Cursor::new(vec![5, 0, 0, 0, 1])).is_err());
        assert!(read_frame(&mut std::io::Cursor::new(Vec::new()))
            .unwrap()
            .is_none());
    }

    #[test]
    fn frames_carry_messages_and_errors_keep_their_kind() {
        let mut buf = Vec::new();
        for m in all_to_member() {
            write_frame(&mut buf, &m.encode()).unwrap();
        }
        let mut r = std::io::Cursor::new(buf);
        for m in all_to_member() {
            let f = read_frame(&mut r).unwrap().unwrap();
            assert_eq!(ToMember::decode(&f).unwrap(), m);
        }
        assert!(read_frame(&mut r).unwrap().is_none());
        let e: Error = WireError::RankClaimed {
            job: "j".into(),
            rank: 2,
            other: "x".into(),
        }
        .into();
        assert!(matches!(e, Error::RankClaimed { rank: 2, .. }));
        let back = WireError::from(&Error::Config("c".into()));
        assert_eq!(back, WireError::Config("c".into()));
    }
}

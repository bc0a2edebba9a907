//! The node link's messages: how the rank processes of one node reach the
//! node's leader ([`super::node_leader`]) over a local socket. A frame is
//! a 4-byte little-endian length, then the message; nothing from the
//! socket is trusted: lengths are bounded before anything is allocated,
//! and a malformed message is an error, never a panic.

use std::io::{Read, Write};

use crate::error::{Error, Result};

/// Version of the link; a process of another build is refused.
pub(super) const VERSION: u8 = 1;

/// Largest frame either side accepts: a round's value (a restore round's
/// list of steps is bounded far below this) and its key, with room.
pub(super) const MAX_FRAME: usize = 72 << 20;

/// Largest string field (a job id, a key, a message).
const MAX_STRING: usize = 64 << 10;

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

fn malformed(what: &str) -> Error {
    Error::Coordination(format!("node link: a malformed message ({what})"))
}

/// Builds a message's bytes.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        // Frames are bounded far below 4 GiB (MAX_FRAME), so the length fits.
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    fn str(&mut self, v: &str) -> &mut Self {
        let mut n = v.len().min(MAX_STRING);
        while !v.is_char_boundary(n) {
            n -= 1;
        }
        self.bytes(&v.as_bytes()[..n])
    }
    fn error(&mut self, e: &WireError) -> &mut Self {
        match e {
            WireError::Coordination(m) => self.u8(0).str(m),
            WireError::Config(m) => self.u8(1).str(m),
            WireError::RankClaimed { job, rank, other } => {
                self.u8(2).str(job).u32(*rank).str(other)
            }
        }
    }
}

/// Reads a message's fields, each bounded by what is left.
struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(malformed(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
    fn str(&mut self, what: &str) -> Result<String> {
        let b = self.bytes(what)?;
        if b.len() > MAX_STRING {
            return Err(malformed(what));
        }
        String::from_utf8(b.to_vec()).map_err(|_| malformed(what))
    }
    fn error(&mut self) -> Result<WireError> {
        Ok(match self.u8("error kind")? {
            0 => WireError::Coordination(self.str("message")?),
            1 => WireError::Config(self.str("message")?),
            2 => WireError::RankClaimed {
                job: self.str("job")?,
                rank: self.u32("rank")?,
                other: self.str("message")?,
            },
            _ => return Err(malformed("error kind")),
        })
    }
    fn end(&self, what: &str) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(malformed(what))
        }
    }
}

impl ToLeader {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut o = Out::default();
        match self {
            ToLeader::Hello(h) => {
                o.u8(1)
                    .u8(h.version)
                    .str(&h.job)
                    .str(&h.incarnation)
                    .u32(h.world)
                    .u32(h.rank)
                    .u32(h.pid);
            }
            ToLeader::Round {
                id,
                key,
                timeout_ms,
                value,
            } => {
                o.u8(2).u64(*id).str(key).u64(*timeout_ms).bytes(value);
            }
            ToLeader::Bye => {
                o.u8(3);
            }
        }
        o.0
    }

    pub(super) fn decode(b: &[u8]) -> Result<ToLeader> {
        let mut i = In(b);
        let m = match i.u8("tag")? {
            1 => ToLeader::Hello(Hello {
                version: i.u8("version")?,
                job: i.str("job")?,
                incarnation: i.str("incarnation")?,
                world: i.u32("world")?,
                rank: i.u32("rank")?,
                pid: i.u32("pid")?,
            }),
            2 => ToLeader::Round {
                id: i.u64("id")?,
                key: i.str("key")?,
                timeout_ms: i.u64("timeout")?,
                value: i.bytes("value")?.to_vec(),
            },
            3 => ToLeader::Bye,
            _ => return Err(malformed("tag")),
        };
        i.end("trailing bytes")?;
        Ok(m)
    }
}

impl ToMember {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut o = Out::default();
        match self {
            ToMember::Welcome => {
                o.u8(1);
            }
            ToMember::Refused(e) => {
                o.u8(2).error(e);
            }
            ToMember::Outcome { id, result } => {
                o.u8(3).u64(*id);
                match result {
                    Ok(v) => o.u8(1).bytes(v),
                    Err(e) => o.u8(0).error(e),
                };
            }
        }
        o.0
    }

    pub(super) fn decode(b: &[u8]) -> Result<ToMember> {
        let mut i = In(b);
        let m = match i.u8("tag")? {
            1 => ToMember::Welcome,
            2 => ToMember::Refused(i.error()?),
            3 => ToMember::Outcome {
                id: i.u64("id")?,
                result: match i.u8("outcome")? {
                    1 => Ok(i.bytes("value")?.to_vec()),
                    0 => Err(i.error()?),
                    _ => return Err(malformed("outcome")),
                },
            },
            _ => return Err(malformed("tag")),
        };
        i.end("trailing bytes")?;
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

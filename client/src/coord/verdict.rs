//! A round's decision as the reducing rank sends it to every rank
//! ([`Coordinator::all_reduce`](crate::coord::coordinator::Coordinator::all_reduce)):
//! `[1, payload…]` when the round succeeded, `[0, message…]` when it
//! decided against (every rank then fails with that same message).

use crate::error::{Error, Result};

/// Longest message carried in a failed verdict (a longer one is cut).
const MAX_MESSAGE: usize = 4096;

/// The bytes of a verdict.
pub(crate) fn encode(r: std::result::Result<Vec<u8>, Error>) -> Vec<u8> {
    match r {
        Ok(payload) => {
            let mut out = Vec::with_capacity(payload.len() + 1);
            out.push(1);
            out.extend_from_slice(&payload);
            out
        }
        Err(e) => {
            let msg = match e {
                Error::Coordination(m) => m,
                other => other.to_string(),
            };
            let mut n = msg.len().min(MAX_MESSAGE);
            while !msg.is_char_boundary(n) {
                n -= 1;
            }
            let mut out = Vec::with_capacity(n + 1);
            out.push(0);
            out.extend_from_slice(&msg.as_bytes()[..n]);
            out
        }
    }
}

/// The payload of a verdict, or the round's failure as
/// [`Error::Coordination`]; a malformed verdict is an error too.
pub(crate) fn decode<'a>(key: &str, b: &'a [u8]) -> Result<&'a [u8]> {
    match b.split_first() {
        Some((1, payload)) => Ok(payload),
        Some((0, msg)) => Err(Error::Coordination(
            String::from_utf8_lossy(msg).into_owned(),
        )),
        _ => Err(Error::Coordination(format!(
            "{key}: the coordinator returned a malformed decision ({} bytes)",
            b.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_and_bad_ones_are_errors() {
        let ok = encode(Ok(vec![7, 8]));
        assert_eq!(decode("k", &ok).unwrap(), &[7, 8]);
        let no = encode(Err(Error::Coordination("rank 3 failed".into())));
        let e = decode("k", &no).unwrap_err();
        assert_eq!(e.to_string(), "coordination: rank 3 failed");
        assert!(decode("k", &[]).is_err());
        assert!(decode("k", &[2, 1]).is_err());
        let long = encode(Err(Error::Coordination("é".repeat(5000))));
        assert!(long.len() <= MAX_MESSAGE + 1);
        assert!(decode("k", &long).is_err());
    }
}

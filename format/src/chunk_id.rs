//! [`ChunkId`]: the BLAKE3-256 content address of a chunk's raw bytes.

use std::fmt;
use std::str::FromStr;

use crate::error::FormatError;

/// The BLAKE3-256 hash of a chunk's raw (uncompressed) bytes.
///
/// The same bytes have the same id in every tier, whatever codec a tier
/// stores them with. Manifests are addressed the same way: the id of a
/// manifest is the hash of its encoded bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId([u8; 32]);

impl ChunkId {
    /// The id of `bytes` (one thread).
    pub fn of(bytes: &[u8]) -> Self {
        ChunkId(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps a raw 32-byte digest.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        ChunkId(bytes)
    }

    /// The 32 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// Parses 64 hex digits (either case).
    pub fn from_hex(s: &str) -> Result<Self, FormatError> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(FormatError::invalid(
                "chunk id",
                format!("expected 64 hex digits, got {} characters", s.len()),
            ));
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]);
            let lo = hex_val(pair[1]);
            match (hi, lo) {
                (Some(h), Some(l)) => out[i] = (h << 4) | l,
                _ => {
                    return Err(FormatError::invalid(
                        "chunk id",
                        format!("non-hex character near position {}", 2 * i),
                    ))
                }
            }
        }
        Ok(ChunkId(out))
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({self})")
    }
}

impl FromStr for ChunkId {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ChunkId::from_hex(s)
    }
}

impl serde::Serialize for ChunkId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ChunkId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ChunkId::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_value() {
        let id = ChunkId::of(b"");
        // BLAKE3 of the empty input, from the BLAKE3 specification.
        assert_eq!(
            id.to_hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(ChunkId::from_hex(&id.to_hex()), Ok(id));
        assert_eq!(id.to_hex().to_uppercase().parse::<ChunkId>(), Ok(id));
    }

    #[test]
    fn bad_hex_is_a_typed_error() {
        assert!(ChunkId::from_hex("abc").is_err());
        assert!(ChunkId::from_hex(&"g".repeat(64)).is_err());
        assert!(ChunkId::from_hex(&"é".repeat(32)).is_err());
    }
}

//! The safetensors file format: an 8-byte little-endian header length, a
//! JSON header naming each tensor's dtype, shape and byte range, then the
//! tensor bytes back to back.
//!
//! [`encode_header`] writes the prefix of a file whose data follows in the
//! given order; [`decode_header`] reads one from untrusted bytes: bounded,
//! every tensor's range checked against its dtype and shape, the data
//! section covered exactly once (as the reference implementation requires).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::{DType, FormatError};

/// Longest header accepted (the reference implementation's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Most tensors in one file accepted.
pub const MAX_TENSORS: usize = 1 << 20;

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape (empty for a scalar).
    pub shape: Vec<u64>,
    /// Byte range within the data section.
    pub begin: u64,
    /// End of the byte range (exclusive).
    pub end: u64,
}

impl TensorInfo {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }

    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.begin == self.end
    }
}

/// A decoded header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Tensors in data order.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` map.
    pub metadata: BTreeMap<String, String>,
    /// Offset of the data section in the file (8 + header length).
    pub data_start: u64,
}

fn bad(reason: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        what: "safetensors header",
        reason: reason.into(),
    }
}

/// Bytes of a tensor of `dtype` and `shape`, or an error on overflow.
fn tensor_len(dtype: DType, shape: &[u64]) -> Result<u64, FormatError> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))
}

/// A file prefix and each tensor's `(begin, end)` in the data section.
pub type EncodedHeader = (Vec<u8>, Vec<(u64, u64)>);

/// The file prefix (length, JSON header padded with spaces to a multiple of
/// 8 bytes) for tensors whose bytes follow in the order given. Returns the
/// prefix and each tensor's `(begin, end)` in the data section.
pub fn encode_header(
    tensors: &[(&str, DType, &[u64])],
    metadata: &BTreeMap<String, String>,
) -> Result<EncodedHeader, FormatError> {
    let mut obj = Map::new();
    if !metadata.is_empty() {
        let m: Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        obj.insert("__metadata__".into(), Value::Object(m));
    }
    let mut ranges = Vec::with_capacity(tensors.len());
    let mut at = 0u64;
    for &(name, dtype, shape) in tensors {
        if name == "__metadata__" || obj.contains_key(name) {
            return Err(bad(format!("duplicate or reserved tensor name {name:?}")));
        }
        let len = tensor_len(dtype, shape)?;
        let end = at
            .checked_add(len)
            .ok_or_else(|| bad("data section overflows"))?;
        let mut t = Map::new();
        t.insert("dtype".into(), Value::String(dtype.name().into()));
        t.insert(
            "shape".into(),
            Value::Array(shape.iter().map(|&d| Value::from(d)).collect()),
        );
        t.insert(
            "data_offsets".into(),
            Value::Array(vec![Value::from(at), Value::from(end)]),
        );
        obj.insert(name.into(), Value::Object(t));
        ranges.push((at, end));
        at = end;
    }
    let mut json = serde_json::to_vec(&Value::Object(obj)).map_err(|e| bad(e.to_string()))?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    if json.len() as u64 > MAX_HEADER_LEN {
        return Err(FormatError::TooLarge {
            what: "safetensors header",
            value: json.len() as u64,
            limit: MAX_HEADER_LEN,
        });
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok((out, ranges))
}

/// How many bytes of the file's start [`decode_header`] needs, read from
/// its first 8 bytes (bounded by [`MAX_HEADER_LEN`]).
pub fn prefix_len(first8: &[u8]) -> Result<u64, FormatError> {
    let n: [u8; 8] =
        first8
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or(FormatError::Truncated {
                what: "safetensors header length",
                needed: 8,
                available: first8.len() as u64,
            })?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER_LEN {
        return Err(FormatError::TooLarge {
            what: "safetensors header",
            value: n,
            limit: MAX_HEADER_LEN,
        });
    }
    Ok(8 + n)
}

/// Decodes the header at the start of a file of `file_len` bytes. `prefix`
/// must hold at least [`prefix_len`] bytes.
pub fn decode_header(prefix: &[u8], file_len: u64) -> Result<Header, FormatError> {
    let need = prefix_len(prefix)?;
    let truncated = |available: u64| FormatError::Truncated {
        what: "safetensors header",
        needed: need.saturating_sub(available),
        available,
    };
    if need > file_len {
        return Err(truncated(file_len));
    }
    let json = prefix
        .get(8..need as usize)
        .ok_or_else(|| truncated(prefix.len() as u64))?;
    let value: Value = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
    let Value::Object(obj) = value else {
        return Err(bad("not a JSON object"));
    };
    if obj.len() > MAX_TENSORS {
        return Err(FormatError::TooLarge {
            what: "safetensors tensor count",
            value: obj.len() as u64,
            limit: MAX_TENSORS as u64,
        });
    }
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(obj.len());
    for (name, v) in obj {
        if name == "__metadata__" {
            let Value::Object(m) = v else {
                return Err(bad("__metadata__ is not an object"));
            };
            for (k, v) in m {
                let Value::String(v) = v else {
                    return Err(bad(format!("metadata value of {k:?} is not a string")));
                };
                metadata.insert(k, v);
            }
            continue;
        }
        let field = |f: &str| v.get(f).ok_or_else(|| bad(format!("{name:?} has no {f}")));
        let dtype: DType = field("dtype")?
            .as_str()
            .ok_or_else(|| bad(format!("{name:?}: dtype is not a string")))?
            .parse()
            .map_err(|_| bad(format!("{name:?}: unknown dtype {}", v["dtype"])))?;
        let ints = |f: &str| -> Result<Vec<u64>, FormatError> {
            field(f)?
                .as_array()
                .ok_or_else(|| bad(format!("{name:?}: {f} is not an array")))?
                .iter()
                .map(|x| {
                    x.as_u64()
                        .ok_or_else(|| bad(format!("{name:?}: {f} holds a non-integer")))
                })
                .collect()
        };
        let shape = ints("shape")?;
        let offsets = ints("data_offsets")?;
        let [begin, end] = offsets[..] else {
            return Err(bad(format!("{name:?}: data_offsets needs two values")));
        };
        if end < begin || end - begin != tensor_len(dtype, &shape)? {
            return Err(bad(format!(
                "{name:?}: {}-byte range for {dtype} {shape:?}",
                end.saturating_sub(begin)
            )));
        }
        tensors.push(TensorInfo {
            name,
            dtype,
            shape,
            begin,
            end,
        });
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    // The data section must be covered exactly, with no holes or overlaps.
    let mut at = 0u64;
    for t in &tensors {
        if t.begin != at {
            return Err(bad(format!(
                "{:?} starts at {} where {at} was expected (hole or overlap)",
                t.name, t.begin
            )));
        }
        at = t.end;
    }
    if need.checked_add(at) != Some(file_len) {
        return Err(bad(format!(
            "tensors cover {at} data bytes; the file holds {}",
            file_len.saturating_sub(need)
        )));
    }
    Ok(Header {
        tensors,
        metadata,
        data_start: need,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_metadata() {
        let meta: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let (prefix, ranges) = encode_header(
            &[
                ("b", DType::BF16, &[2, 3]),
                ("a", DType::F32, &[]),
                ("z", DType::U8, &[0]),
            ],
            &meta,
        )
        .unwrap();
        assert_eq!(prefix.len() % 8, 0);
        assert_eq!(ranges, vec![(0, 12), (12, 16), (16, 16)]);
        let h = decode_header(&prefix, prefix.len() as u64 + 16).unwrap();
        assert_eq!(h.metadata, meta);
        assert_eq!(h.data_start, prefix.len() as u64);
        let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b", "a", "z"]);
        assert_eq!(h.tensors[0].shape, vec![2, 3]);
        assert_eq!(h.tensors[1].dtype, DType::F32);
    }

    fn file(json: &str, data: u64) -> (Vec<u8>, u64) {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        let n = v.len() as u64 + data;
        (v, n)
    }

    #[test]
    fn hostile_headers_are_refused() {
        let cases = [
            r#"[]"#,
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            r#"{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[18446744073709551615,4],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            r#"{"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":"#,
        ];
        for json in cases {
            let (prefix, len) = file(json, 4);
            assert!(decode_header(&prefix, len).is_err(), "accepted {json}");
        }
        // A data section longer than the tensors.
        let (prefix, len) = file(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            5,
        );
        assert!(decode_header(&prefix, len).is_err());
        // A header length past the limit or the file.
        let mut huge = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(decode_header(&huge, 10).is_err());
        let mut long = 100u64.to_le_bytes().to_vec();
        long.extend_from_slice(b"{}");
        assert!(decode_header(&long, 10).is_err());
        assert!(prefix_len(b"abc").is_err());
    }
}

//! # strata-format
//!
//! The bytes Strata writes and reads, and nothing else: no I/O, no async.
//! Every decoder here takes untrusted input (from disk or a peer), checks
//! every length against a bound before allocating, and returns a typed
//! [`FormatError`] rather than panicking. All of it is fuzzed (`fuzz/`).
//!
//! * [`ChunkId`]: BLAKE3-256 of a chunk's raw bytes.
//! * [`DType`]: tensor element types (the safetensors set).
//! * [`frame`]: the chunk frame — header, codec payload, verified decode.
//! * [`codec`]: `raw`, `zstd`, and byte-plane `zstd` (the ZipNN idea, with a
//!   one-bit rotation so a float's exponent fills a byte, and entropy-guided
//!   plane selection).
//! * [`layout`]: cutting a shard's entries into chunks so that unchanged and
//!   replicated tensors dedup.
//! * [`manifest`] and [`commit`]: versioned, checksummed binary encodings, with
//!   JSON renderings.
//!
//! The byte layouts are specified in `docs/format.md`; every version ever
//! written stays readable (tested against checked-in samples).
//!
//! ```
//! use strata_format::{codec::{ElemHint, EncodeOptions}, frame, ChunkId};
//! let raw = vec![7u8; 4096];
//! let f = frame::encode_frame(&raw, ElemHint::BYTES, EncodeOptions::ZSTD).unwrap();
//! assert!(f.len() < raw.len());
//! let (header, back) = frame::decode_frame(&f).unwrap();
//! assert_eq!(header.id, ChunkId::of(&raw));
//! assert_eq!(back, raw);
//! ```

mod chunk_id;
pub mod codec;
pub mod commit;
mod dtype;
mod error;
pub mod frame;
pub mod fuzzing;
mod json;
pub mod layout;
pub mod manifest;
pub mod names;
pub mod safetensors;
pub mod wire;

pub use chunk_id::ChunkId;
pub use commit::{CommitRecord, ShardRef};
pub use dtype::DType;
pub use error::{ErrorKind, FormatError, Result};
pub use layout::{EntryKind, EntrySpec, Layout};
pub use manifest::{ShardInfo, ShardManifest};

//! Entry points shared by the cargo-fuzz targets (`fuzz/`) and the test that
//! replays every input that ever crashed them (`tests/fuzz_regressions.rs`),
//! so both exercise exactly the same code.
//!
//! Each takes arbitrary bytes and must return without panicking; it also
//! checks the properties a decoder promises (a decoded value re-encodes to
//! bytes that decode to the same value).

use crate::frame::FrameDecoder;
use crate::{CommitRecord, ShardManifest};

/// The raw-length limit the frame target decodes with, so a hostile header
/// cannot make each run allocate a quarter gigabyte.
pub const FUZZ_MAX_CHUNK: u32 = 1 << 20;

/// Decodes and verifies `data` as a chunk frame.
pub fn frame(data: &[u8]) {
    let Ok(mut dec) = FrameDecoder::with_limit(FUZZ_MAX_CHUNK) else {
        return;
    };
    if let Ok((h, bytes)) = dec.decode(data, None) {
        assert_eq!(
            crate::ChunkId::of(&bytes),
            h.id,
            "a decoded frame always matches its hash"
        );
    }
}

/// Decodes `data` as a shard manifest; a success must round-trip.
pub fn manifest(data: &[u8]) {
    if let Ok(m) = ShardManifest::decode(data) {
        let again = m.encode().map(|b| ShardManifest::decode(&b));
        assert!(
            matches!(again, Ok(Ok(ref m2)) if *m2 == m),
            "a decoded manifest re-encodes"
        );
        let _ = m.to_json();
    }
}

/// Decodes `data` as a commit record; a success must round-trip.
pub fn commit(data: &[u8]) {
    if let Ok(r) = CommitRecord::decode(data) {
        let again = r.encode().map(|b| CommitRecord::decode(&b));
        assert!(
            matches!(again, Ok(Ok(ref r2)) if *r2 == r),
            "a decoded commit record re-encodes"
        );
        let _ = r.to_json();
    }
}

//! Property tests of chunk frames and codecs: round trips on every codec and
//! element class, and damaged frames that must fail with a typed error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use strata_format::codec::{Codec, ElemHint, EncodeOptions, PlaneCoder, PlaneSelect};
use strata_format::frame::{
    raw_frame_header, FrameDecoder, FrameEncoder, FrameHeader, FRAME_HEADER_LEN,
};
use strata_format::{ChunkId, FormatError};

fn hints() -> impl Strategy<Value = ElemHint> {
    (prop::sample::select(vec![1u8, 2, 4, 8]), any::<bool>())
        .prop_map(|(size, float)| ElemHint { size, float })
}

fn options() -> impl Strategy<Value = EncodeOptions> {
    (
        prop::sample::select(vec![Codec::Raw, Codec::Zstd, Codec::Planes]),
        any::<bool>(),
        prop::sample::select(vec![
            PlaneSelect::All,
            PlaneSelect::MaxEntropy(7.5),
            PlaneSelect::MaxEntropy(0.0),
        ]),
        prop::sample::select(vec![-1, 1, 3]),
        prop::sample::select(vec![
            PlaneCoder::Zstd,
            PlaneCoder::Huffman,
            PlaneCoder::Auto,
        ]),
    )
        .prop_map(
            |(codec, rotate_floats, select, level, coder)| EncodeOptions {
                codec,
                level,
                rotate_floats,
                select,
                coder,
            },
        )
}

/// Bytes with structure (runs, small alphabets, float-like values) as well as noise.
fn chunk_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..5000),
        prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x3f, 0x80]), 0..5000),
        prop::collection::vec(-1.0f32..1.0, 0..1500)
            .prop_map(|v| v.iter().flat_map(|f| f.to_le_bytes()).collect()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn frames_round_trip(raw in chunk_bytes(), hint in hints(), opts in options()) {
        let mut enc = FrameEncoder::new(opts).unwrap();
        let frame = enc.encode(&raw, hint, None).unwrap();
        let h = FrameHeader::decode(&frame, u32::MAX).unwrap();
        prop_assert_eq!(h.id, ChunkId::of(&raw));
        prop_assert_eq!(h.raw_len as usize, raw.len());
        prop_assert!(h.stored_len as usize <= raw.len(), "a frame never stores more than raw");
        if opts.codec == Codec::Raw {
            prop_assert_eq!(h.codec, Codec::Raw);
        }
        let mut dec = FrameDecoder::new().unwrap();
        let (h2, back) = dec.decode(&frame, Some(&h.id)).unwrap();
        prop_assert_eq!(h2, h);
        prop_assert_eq!(back, raw);
    }

    #[test]
    fn any_single_byte_change_is_detected(raw in chunk_bytes(), hint in hints(), opts in options(), pos in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let frame = FrameEncoder::new(opts).unwrap().encode(&raw, hint, None).unwrap();
        let mut bad = frame.clone();
        let i = pos.index(bad.len());
        bad[i] ^= xor;
        let mut dec = FrameDecoder::new().unwrap();
        // The only acceptable outcome besides an error: the change hit a byte
        // that does not affect the decoded bytes (never different bytes).
        match dec.decode(&bad, Some(&ChunkId::of(&raw))) {
            Err(_) => {}
            Ok((_, back)) => prop_assert_eq!(back, raw),
        }
    }

    #[test]
    fn verify_accepts_exactly_what_decode_accepts(raw in chunk_bytes(), hint in hints(), opts in options(), pos in any::<prop::sample::Index>(), xor in 0u8..=255) {
        let mut frame = FrameEncoder::new(opts).unwrap().encode(&raw, hint, None).unwrap();
        let i = pos.index(frame.len());
        frame[i] ^= xor;
        let id = ChunkId::of(&raw);
        let mut dec = FrameDecoder::new().unwrap();
        let mut scratch = Vec::new();
        let verified = dec.verify(&frame, Some(&id), &mut scratch).is_ok();
        let decoded = dec.decode(&frame, Some(&id)).is_ok();
        prop_assert_eq!(verified, decoded);
        if xor == 0 {
            prop_assert!(verified, "an undamaged frame verifies");
        }
    }

    #[test]
    fn a_raw_header_and_the_bytes_are_the_raw_frame(raw in chunk_bytes()) {
        let id = ChunkId::of(&raw);
        let mut sent = raw_frame_header(id, raw.len()).unwrap().to_vec();
        sent.extend_from_slice(&raw);
        let encoded = FrameEncoder::new(EncodeOptions::RAW).unwrap().encode(&raw, ElemHint::BYTES, None).unwrap();
        prop_assert_eq!(&sent, &encoded);
    }

    #[test]
    fn truncated_or_extended_frames_fail(raw in chunk_bytes(), opts in options(), cut in any::<prop::sample::Index>(), extra in 1usize..16) {
        let frame = FrameEncoder::new(opts).unwrap().encode(&raw, ElemHint { size: 4, float: true }, None).unwrap();
        let mut dec = FrameDecoder::new().unwrap();
        let short = &frame[..cut.index(frame.len())];
        prop_assert!(dec.decode(short, None).is_err());
        let mut long = frame.clone();
        long.extend(std::iter::repeat_n(0u8, extra));
        prop_assert!(dec.decode(&long, None).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), hdr in any::<bool>()) {
        let mut input = bytes;
        if hdr && input.len() >= 8 {
            input[..4].copy_from_slice(b"STCK");
            input[4] = 1;
        }
        let mut dec = FrameDecoder::with_limit(1 << 16).unwrap();
        let _ = dec.decode(&input, None);
    }
}

#[test]
fn bf16_weights_compress_with_planes() {
    // Near-normal bf16 values (std 0.02), like trained weights.
    let mut x = 1u64;
    let raw: Vec<u8> = (0..1 << 18)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s: u64 = (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48);
            let v = ((s as f64 - 131_071.0) / 37_837.0 * 0.02) as f32;
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect();
    let hint = ElemHint {
        size: 2,
        float: true,
    };
    let planes = FrameEncoder::new(EncodeOptions::PLANES)
        .unwrap()
        .encode(&raw, hint, None)
        .unwrap();
    let zstd = FrameEncoder::new(EncodeOptions::ZSTD)
        .unwrap()
        .encode(&raw, hint, None)
        .unwrap();
    let ratio = raw.len() as f64 / planes.len() as f64;
    assert!(ratio > 1.3, "planes ratio {ratio}");
    assert!(planes.len() < zstd.len(), "planes beat plain zstd on bf16");
    let (_, back) = FrameDecoder::new().unwrap().decode(&planes, None).unwrap();
    assert_eq!(back, raw);
}

#[test]
fn random_bytes_are_stored_raw() {
    let mut x = 0x1234_5678_9abc_def1u64;
    let raw: Vec<u8> = (0..1u32 << 13)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    for opts in [EncodeOptions::ZSTD, EncodeOptions::PLANES] {
        let frame = FrameEncoder::new(opts)
            .unwrap()
            .encode(
                &raw,
                ElemHint {
                    size: 2,
                    float: true,
                },
                None,
            )
            .unwrap();
        let h = FrameHeader::decode(&frame, u32::MAX).unwrap();
        assert_eq!(h.codec, Codec::Raw);
        assert_eq!(frame.len(), FRAME_HEADER_LEN + raw.len());
    }
}

#[test]
fn decoder_refuses_chunks_over_its_limit_before_allocating() {
    let raw = vec![0u8; 1 << 20];
    let frame = FrameEncoder::new(EncodeOptions::ZSTD)
        .unwrap()
        .encode(&raw, ElemHint::BYTES, None)
        .unwrap();
    assert!(frame.len() < 1024, "a megabyte of zeros is a small frame");
    let err = FrameDecoder::with_limit(1 << 16)
        .unwrap()
        .decode(&frame, None)
        .unwrap_err();
    assert!(matches!(err, FormatError::TooLarge { .. }), "{err}");
}

#[test]
fn wrong_expected_id_is_a_hash_mismatch() {
    let raw = vec![1u8; 100];
    let frame = FrameEncoder::new(EncodeOptions::RAW)
        .unwrap()
        .encode(&raw, ElemHint::BYTES, None)
        .unwrap();
    let other = ChunkId::of(b"other");
    let err = FrameDecoder::new()
        .unwrap()
        .decode(&frame, Some(&other))
        .unwrap_err();
    assert!(matches!(err, FormatError::HashMismatch { .. }));
    assert_eq!(err.kind(), strata_format::ErrorKind::Corrupt);
}

#[test]
fn payload_corruption_behind_a_valid_header_is_a_hash_mismatch() {
    let raw: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
    let mut frame = FrameEncoder::new(EncodeOptions::RAW)
        .unwrap()
        .encode(&raw, ElemHint::BYTES, None)
        .unwrap();
    frame[FRAME_HEADER_LEN + 100] ^= 0x10;
    let err = FrameDecoder::new()
        .unwrap()
        .decode(&frame, None)
        .unwrap_err();
    assert!(matches!(err, FormatError::HashMismatch { .. }), "{err}");
}

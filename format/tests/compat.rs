//! Every format version ever written stays readable.
//!
//! `tests/samples/v<N>/` holds files written by version N of each encoder.
//! This test decodes all of them and checks they mean what they meant when
//! they were written. Samples of the current version must also be what the
//! encoders write today, byte for byte (manifests and commit records are
//! deterministic; frames are only checked for their decoded bytes, since a
//! newer zstd may compress differently).
//!
//! To add samples for a new version: bump the version, then run
//! `STRATA_WRITE_SAMPLES=1 cargo test -p strata-format --test compat`;
//! existing files are never overwritten.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use strata_format::codec::{ElemHint, EncodeOptions, PlaneCoder};
use strata_format::frame::{FrameDecoder, FrameEncoder, FrameHeader};
use strata_format::layout::{EntrySpec, Layout};
use strata_format::{ChunkId, CommitRecord, DType, ShardInfo, ShardManifest, ShardRef};

fn dir(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/samples/v{version}"))
}

/// Deterministic float-like bytes.
fn weights(n: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n / 2)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s = (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48);
            let v = ((s as f64 - 131_071.0) / 37_837.0 * 0.02) as f32;
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

fn frame_samples() -> Vec<(&'static str, Vec<u8>, ElemHint, EncodeOptions)> {
    let bf16 = ElemHint {
        size: 2,
        float: true,
    };
    vec![
        ("frame-raw.bin", weights(4096), bf16, EncodeOptions::RAW),
        (
            "frame-zstd.bin",
            vec![9u8; 4096],
            ElemHint::BYTES,
            EncodeOptions::ZSTD,
        ),
        (
            "frame-planes-bf16.bin",
            weights(65536),
            bf16,
            EncodeOptions {
                coder: PlaneCoder::Zstd,
                ..EncodeOptions::PLANES
            },
        ),
        (
            "frame-planes-huffman-f32.bin",
            weights(65536),
            ElemHint {
                size: 4,
                float: true,
            },
            EncodeOptions {
                coder: PlaneCoder::Huffman,
                ..EncodeOptions::PLANES
            },
        ),
    ]
}

fn sample_manifest() -> ShardManifest {
    let specs = vec![
        EntrySpec::tensor("model.embed.weight", DType::BF16, vec![64, 16]).unwrap(),
        EntrySpec::tensor("model.norm.weight", DType::F32, vec![16]).unwrap(),
        EntrySpec::tensor("step", DType::I64, vec![]).unwrap(),
        EntrySpec::blob("dataloader", 100),
    ];
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| weights(s.len as usize + 1)[..s.len as usize].to_vec())
        .collect();
    let layout = Layout::plan(&specs, 1024).unwrap();
    let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut buf = Vec::new();
    let ids: Vec<ChunkId> = (0..layout.chunks.len())
        .map(|i| {
            layout.fill_chunk(i, &views, &mut buf).unwrap();
            ChunkId::of(&buf)
        })
        .collect();
    let info = ShardInfo {
        job: "compat-job".into(),
        step: 1200,
        rank: 3,
        world_size: 4,
        created_unix_ms: 1_790_000_000_000,
    };
    let meta = BTreeMap::from([("framework".to_string(), "torch 2.9".to_string())]);
    ShardManifest::from_layout(info, &specs, &layout, &ids, meta).unwrap()
}

fn sample_commit(m: &[u8]) -> CommitRecord {
    CommitRecord {
        job: "compat-job".into(),
        step: 1200,
        world_size: 4,
        committed_unix_ms: 1_790_000_000_500,
        shards: vec![
            ShardRef {
                rank: 1,
                manifest: ChunkId::of(b"rank 1"),
                logical_bytes: 2240,
            },
            ShardRef {
                rank: 3,
                manifest: ShardManifest::id_of(m),
                logical_bytes: 2240,
            },
        ],
    }
}

fn write_if_absent(path: &Path, bytes: &[u8]) {
    if !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

#[test]
fn write_current_samples_on_request() {
    if std::env::var_os("STRATA_WRITE_SAMPLES").is_none() {
        return;
    }
    let d = dir(1);
    for (name, raw, hint, opts) in frame_samples() {
        write_if_absent(
            &d.join(name),
            &FrameEncoder::new(opts)
                .unwrap()
                .encode(&raw, hint, None)
                .unwrap(),
        );
    }
    let m = sample_manifest();
    let mb = m.encode().unwrap();
    write_if_absent(&d.join("manifest.bin"), &mb);
    write_if_absent(
        &d.join("manifest.json"),
        serde_json::to_string_pretty(&m.to_json())
            .unwrap()
            .as_bytes(),
    );
    let c = sample_commit(&mb);
    write_if_absent(&d.join("commit.bin"), &c.encode().unwrap());
    write_if_absent(
        &d.join("commit.json"),
        serde_json::to_string_pretty(&c.to_json())
            .unwrap()
            .as_bytes(),
    );
}

#[test]
fn v1_frames_decode_to_their_bytes() {
    let mut dec = FrameDecoder::new().unwrap();
    for (name, raw, _, opts) in frame_samples() {
        let bytes = std::fs::read(dir(1).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let h = FrameHeader::decode(&bytes, u32::MAX).unwrap();
        assert_eq!(h.version, 1);
        if opts.codec != strata_format::codec::Codec::Raw {
            assert_ne!(
                h.codec,
                strata_format::codec::Codec::Raw,
                "{name} sample exercises its codec"
            );
        }
        let (_, back) = dec.decode(&bytes, Some(&ChunkId::of(&raw))).unwrap();
        assert_eq!(back, raw, "{name}");
    }
}

#[test]
fn v1_manifest_and_commit_decode_and_match_today() {
    let d = dir(1);
    let mb = std::fs::read(d.join("manifest.bin")).unwrap();
    let m = ShardManifest::decode(&mb).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m.to_json(), json);
    assert_eq!(m, sample_manifest());
    assert_eq!(
        m.encode().unwrap(),
        mb,
        "v1 is the current version: encoding is unchanged"
    );

    let cb = std::fs::read(d.join("commit.bin")).unwrap();
    let c = CommitRecord::decode(&cb).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("commit.json")).unwrap()).unwrap();
    assert_eq!(c.to_json(), json);
    assert_eq!(c, sample_commit(&mb));
    assert_eq!(c.encode().unwrap(), cb);
}

#[test]
fn unknown_future_versions_are_refused_as_unsupported() {
    let mut mb = std::fs::read(dir(1).join("manifest.bin")).unwrap();
    mb[4] = 99;
    let err = ShardManifest::decode(&mb).unwrap_err();
    assert_eq!(err.kind(), strata_format::ErrorKind::Unsupported, "{err}");
    let mut fb = std::fs::read(dir(1).join("frame-zstd.bin")).unwrap();
    fb[4] = 2;
    assert_eq!(
        FrameDecoder::new()
            .unwrap()
            .decode(&fb, None)
            .unwrap_err()
            .kind(),
        strata_format::ErrorKind::Unsupported
    );
}

//! Property tests of the shard layout: coverage, alignment, determinism,
//! dedup stability, and the manifest built from it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use strata_format::layout::{EntrySpec, Layout, OWN_CHUNK_DIVISOR, PACK_ALIGN};
use strata_format::{ChunkId, CommitRecord, DType, ShardInfo, ShardManifest, ShardRef};

const CHUNK: u32 = 1024;

fn entry_specs() -> impl Strategy<Value = Vec<EntrySpec>> {
    let one = prop_oneof![
        (
            prop::sample::select(DType::ALL.to_vec()),
            prop::collection::vec(0u64..40, 0..3)
        )
            .prop_map(|(d, shape)| (Some(d), shape, 0u64)),
        (0u64..3000).prop_map(|len| (None, vec![], len)),
    ];
    prop::collection::vec(one, 0..40).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (d, shape, len))| match d {
                Some(d) => EntrySpec::tensor(format!("t{i}"), d, shape).unwrap(),
                None => EntrySpec::blob(format!("b{i}"), len),
            })
            .collect()
    })
}

fn bytes_for(specs: &[EntrySpec], salt: u8) -> Vec<Vec<u8>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (0..s.len)
                .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8) ^ salt)
                .collect()
        })
        .collect()
}

fn chunk_ids(layout: &Layout, data: &[Vec<u8>]) -> Vec<ChunkId> {
    let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut buf = Vec::new();
    (0..layout.chunks.len())
        .map(|i| {
            layout.fill_chunk(i, &views, &mut buf).unwrap();
            ChunkId::of(&buf)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_byte_covered_exactly_once(specs in entry_specs()) {
        let layout = Layout::plan(&specs, CHUNK).unwrap();
        // Per chunk: no byte claimed twice, every chunk within its length and size.
        for c in &layout.chunks {
            prop_assert!(c.len > 0 && c.len <= CHUNK);
            let mut claimed = vec![false; c.len as usize];
            for p in &c.pieces {
                for b in &mut claimed[p.chunk_offset as usize..(p.chunk_offset + p.len) as usize] {
                    prop_assert!(!*b, "byte claimed twice");
                    *b = true;
                }
            }
        }
        // Per entry: segments cover it exactly, in order, matching the pieces.
        for (i, (spec, segs)) in specs.iter().zip(&layout.segments).enumerate() {
            let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
            prop_assert_eq!(total, spec.len);
            let mut off = 0u64;
            for s in segs {
                let chunk = &layout.chunks[s.chunk as usize];
                let piece = chunk.pieces.iter().find(|p| p.entry == i && p.entry_offset == off).unwrap();
                prop_assert_eq!((piece.chunk_offset, piece.len), (s.offset, s.len));
                off += u64::from(s.len);
            }
        }
        let pieces: usize = layout.chunks.iter().map(|c| c.pieces.len()).sum();
        let segs: usize = layout.segments.iter().map(Vec::len).sum();
        prop_assert_eq!(pieces, segs);
    }

    #[test]
    fn alignment_rule(specs in entry_specs()) {
        let layout = Layout::plan(&specs, CHUNK).unwrap();
        for (spec, segs) in specs.iter().zip(&layout.segments) {
            if spec.len >= u64::from(CHUNK) / OWN_CHUNK_DIVISOR {
                // Large and medium entries own their chunks, starting at offset 0, full except the tail.
                for (k, s) in segs.iter().enumerate() {
                    prop_assert_eq!(s.offset, 0);
                    prop_assert_eq!(layout.chunks[s.chunk as usize].pieces.len(), 1);
                    if k + 1 < segs.len() {
                        prop_assert_eq!(s.len, CHUNK);
                    }
                }
            } else if spec.len > 0 {
                // Small entries sit whole in one pack, aligned; packs stay
                // within an eighth of a chunk.
                prop_assert_eq!(segs.len(), 1);
                prop_assert_eq!(u64::from(segs[0].offset) % PACK_ALIGN, 0);
                let pack = u64::from(layout.chunks[segs[0].chunk as usize].len);
                prop_assert!(pack <= u64::from(CHUNK) / OWN_CHUNK_DIVISOR);
            } else {
                prop_assert!(segs.is_empty());
            }
        }
    }

    #[test]
    fn deterministic_and_dedup_stable(specs in entry_specs(), salt in 1u8..255) {
        let a = Layout::plan(&specs, CHUNK).unwrap();
        prop_assert_eq!(&a, &Layout::plan(&specs, CHUNK).unwrap());
        let data = bytes_for(&specs, 0);
        let ids = chunk_ids(&a, &data);
        // Change every packed entry: the chunks of entries that own theirs keep their ids.
        let mut changed = data.clone();
        for (spec, bytes) in specs.iter().zip(changed.iter_mut()) {
            if spec.len < u64::from(CHUNK) / OWN_CHUNK_DIVISOR {
                for b in bytes.iter_mut() {
                    *b ^= salt;
                }
            }
        }
        let ids2 = chunk_ids(&a, &changed);
        for (spec, segs) in specs.iter().zip(&a.segments) {
            if spec.len >= u64::from(CHUNK) / OWN_CHUNK_DIVISOR {
                for s in segs {
                    prop_assert_eq!(ids[s.chunk as usize], ids2[s.chunk as usize]);
                }
            }
        }
    }

    #[test]
    fn manifest_and_commit_round_trip(specs in entry_specs(), step in any::<u64>(), rank in 0u32..8, meta in prop::collection::btree_map("[a-z]{1,8}", ".{0,20}", 0..4)) {
        let layout = Layout::plan(&specs, CHUNK).unwrap();
        let ids = chunk_ids(&layout, &bytes_for(&specs, 0));
        let info = ShardInfo { job: "job-1".into(), step, rank, world_size: 8, created_unix_ms: 1_700_000_000_000 };
        let m = ShardManifest::from_layout(info, &specs, &layout, &ids, meta).unwrap();
        let bytes = m.encode().unwrap();
        let back = ShardManifest::decode(&bytes).unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(back.encode().unwrap(), bytes.clone());
        // Reassembling each entry from the manifest's segments gives its bytes.
        let data = bytes_for(&specs, 0);
        let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut chunks = std::collections::HashMap::new();
        let mut buf = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            layout.fill_chunk(i, &views, &mut buf).unwrap();
            chunks.insert(*id, buf.clone());
        }
        for (e, want) in m.entries.iter().zip(&data) {
            let mut got = Vec::new();
            for s in &e.segments {
                let c = &chunks[&m.chunks[s.chunk as usize].id];
                got.extend_from_slice(&c[s.offset as usize..(s.offset + s.len) as usize]);
            }
            prop_assert_eq!(&got, want);
        }
        let rec = CommitRecord {
            job: "job-1".into(),
            step,
            world_size: 8,
            committed_unix_ms: 5,
            shards: vec![ShardRef { rank, manifest: ShardManifest::id_of(&bytes), logical_bytes: m.logical_bytes() }],
        };
        let rb = rec.encode().unwrap();
        prop_assert_eq!(CommitRecord::decode(&rb).unwrap(), rec);
    }

    #[test]
    fn manifest_damage_is_detected(specs in entry_specs(), pos in any::<prop::sample::Index>(), xor in 1u8..=255, cut in any::<prop::sample::Index>()) {
        let layout = Layout::plan(&specs, CHUNK).unwrap();
        let ids = chunk_ids(&layout, &bytes_for(&specs, 0));
        let info = ShardInfo { job: "j".into(), step: 1, rank: 0, world_size: 1, created_unix_ms: 0 };
        let bytes = ShardManifest::from_layout(info, &specs, &layout, &ids, BTreeMap::new()).unwrap().encode().unwrap();
        let mut bad = bytes.clone();
        bad[pos.index(bytes.len())] ^= xor;
        prop_assert!(ShardManifest::decode(&bad).is_err());
        prop_assert!(ShardManifest::decode(&bytes[..cut.index(bytes.len())]).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(mut bytes in prop::collection::vec(any::<u8>(), 0..400), magic in 0u8..3) {
        if bytes.len() >= 6 {
            match magic {
                0 => bytes[..4].copy_from_slice(b"STMF"),
                1 => bytes[..4].copy_from_slice(b"STCR"),
                _ => {}
            }
            bytes[4] = 1;
            bytes[5] = 0;
        }
        let _ = ShardManifest::decode(&bytes);
        let _ = CommitRecord::decode(&bytes);
    }
}

#[test]
fn large_tensors_own_their_chunks_and_small_ones_pack_by_class() {
    let specs = vec![
        EntrySpec::tensor("norm", DType::BF16, vec![10]).unwrap(),
        EntrySpec::tensor("w", DType::BF16, vec![1000]).unwrap(), // 2000 B: 2 chunks
        EntrySpec::tensor("bias", DType::F32, vec![10]).unwrap(),
        EntrySpec::tensor("norm2", DType::BF16, vec![10]).unwrap(),
        EntrySpec::blob("empty", 0),
    ];
    let l = Layout::plan(&specs, CHUNK).unwrap();
    // norm and norm2 share a pack; bias (another class) has its own; w owns two chunks.
    assert_eq!(l.segments[0][0].chunk, l.segments[3][0].chunk);
    assert_ne!(l.segments[0][0].chunk, l.segments[2][0].chunk);
    assert_eq!(l.segments[1].len(), 2);
    assert_eq!(l.segments[1][1].len, 2000 - CHUNK);
    assert!(l.segments[4].is_empty());
    assert_eq!(l.chunks.len(), 4);
}

#[test]
fn invalid_inputs_are_typed_errors() {
    let t = EntrySpec::tensor("a", DType::F32, vec![2]).unwrap();
    assert!(
        Layout::plan(&[t.clone(), t.clone()], CHUNK).is_err(),
        "duplicate names"
    );
    assert!(
        Layout::plan(std::slice::from_ref(&t), 100).is_err(),
        "chunk size not a multiple of 64"
    );
    assert!(Layout::plan(std::slice::from_ref(&t), 0).is_err());
    let mut wrong = t;
    wrong.len = 7;
    assert!(
        Layout::plan(&[wrong], CHUNK).is_err(),
        "length disagrees with shape"
    );
    assert!(EntrySpec::tensor("huge", DType::F64, vec![u64::MAX, 2]).is_err());
    assert!(
        Layout::plan(&[EntrySpec::blob("", 1)], CHUNK).is_err(),
        "empty name"
    );
}

//! The codec report of `strata demo`: what the formats do to the state.
//!
//! Lays the state out into chunks, hashes every chunk, encodes every chunk
//! with the byte-plane codec (as a compressing tier will store it), decodes
//! and verifies every chunk against the original bytes, and round-trips the
//! shard manifest and commit record. Prints throughput against a plain memcpy
//! of the same bytes in the same run, and compression ratios by dtype; any
//! mismatch is an error (non-zero exit).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use strata::par::par_map;
use strata_format::codec::{Codec, EncodeOptions};
use strata_format::frame::{FrameDecoder, FrameEncoder};
use strata_format::{
    ChunkId, CommitRecord, EntryKind, EntrySpec, Layout, ShardInfo, ShardManifest, ShardRef,
};

use crate::out::say;
use crate::size::human;
use crate::CliError;

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

struct Encoded {
    frame: Vec<u8>,
    codec: Codec,
}

/// Lays out, hashes, encodes (byte-plane codec, as L3 will store it),
/// decodes and verifies a state, and prints throughput against a memcpy of
/// the same bytes and compression ratios by dtype.
pub(crate) fn report(
    specs: &[EntrySpec],
    data: &[Vec<u8>],
    chunk_size: u32,
    threads: usize,
) -> Result<(), CliError> {
    let logical: u64 = specs.iter().map(|s| s.len).sum();
    // Baseline: a plain memcpy of the same bytes, on the same threads.
    let t = Instant::now();
    let copies: Vec<usize> = par_map(
        data.len(),
        threads,
        || (),
        |_, i| {
            let v = data[i].clone();
            std::hint::black_box(&v);
            v.len()
        },
    );
    let memcpy = t.elapsed();
    row(
        "memcpy (baseline)",
        copies.iter().map(|&n| n as u64).sum(),
        memcpy,
        "",
    );

    let t = Instant::now();
    let layout = Layout::plan(specs, chunk_size)?;
    let packed = layout
        .chunks
        .iter()
        .filter(|c| c.single_piece().is_none())
        .count();
    say!(
        "  {:<22} {} chunks ({} whole-tensor, {packed} packed), {} incl. padding, {:.2} ms",
        "layout",
        layout.chunks.len(),
        layout.chunks.len() - packed,
        human(layout.stored_len()),
        t.elapsed().as_secs_f64() * 1e3
    );
    let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let chunk_bytes = |scratch: &mut Vec<u8>, i: usize| -> Result<(), CliError> {
        layout.fill_chunk(i, &views, scratch)?;
        Ok(())
    };

    // Hash: whole-tensor chunks straight from the entry bytes, packed ones assembled.
    let t = Instant::now();
    let ids: Vec<Result<ChunkId, CliError>> = par_map(
        layout.chunks.len(),
        threads,
        Vec::new,
        |scratch, i| match layout.chunks[i].single_piece() {
            Some(p) => {
                let start = p.entry_offset as usize;
                Ok(ChunkId::of(&views[p.entry][start..start + p.len as usize]))
            }
            None => {
                chunk_bytes(scratch, i)?;
                Ok(ChunkId::of(scratch))
            }
        },
    );
    let ids: Vec<ChunkId> = ids.into_iter().collect::<Result<_, _>>()?;
    let hash_time = t.elapsed();
    row(
        "hash (BLAKE3)",
        layout.stored_len(),
        hash_time,
        &format!("{:.2}x memcpy time", ratio(hash_time, memcpy)),
    );

    // Encode every chunk with the byte-plane codec.
    let t = Instant::now();
    let frames: Vec<Result<Encoded, CliError>> = par_map(
        layout.chunks.len(),
        threads,
        || (FrameEncoder::new(EncodeOptions::PLANES), Vec::new()),
        |(enc, scratch), i| {
            let enc = enc.as_mut().map_err(|e| CliError::Format(e.clone()))?;
            chunk_bytes(scratch, i)?;
            let frame = enc.encode(scratch, layout.chunks[i].hint, Some(ids[i]))?;
            Ok(Encoded {
                codec: strata_format::frame::FrameHeader::decode(&frame, u32::MAX)?.codec,
                frame,
            })
        },
    );
    let frames: Vec<Encoded> = frames.into_iter().collect::<Result<_, _>>()?;
    let enc_time = t.elapsed();
    let stored: u64 = frames.iter().map(|f| f.frame.len() as u64).sum();
    row(
        "encode (planes codec)",
        layout.stored_len(),
        enc_time,
        &format!(
            "stored {} ratio {:.3}",
            human(stored),
            layout.stored_len() as f64 / stored as f64
        ),
    );

    // Decode and verify every frame; compare with the original bytes.
    let t = Instant::now();
    let checks: Vec<Result<(), CliError>> = par_map(
        frames.len(),
        threads,
        || (FrameDecoder::new(), Vec::new(), Vec::new()),
        |(dec, out, orig), i| {
            let dec = dec.as_mut().map_err(|e| CliError::Format(e.clone()))?;
            out.clear();
            out.resize(layout.chunks[i].len as usize, 0);
            dec.decode_into(&frames[i].frame, Some(&ids[i]), out)?;
            chunk_bytes(orig, i)?;
            if out != orig {
                return Err(CliError::Verify(format!(
                    "chunk {i} ({}) decoded to different bytes",
                    ids[i]
                )));
            }
            Ok(())
        },
    );
    let dec_time = t.elapsed();
    for c in checks {
        c?;
    }
    row(
        "decode + verify",
        layout.stored_len(),
        dec_time,
        "every chunk byte-identical",
    );

    // Per-dtype compression ratios.
    let mut by_kind: BTreeMap<String, (u64, u64, usize)> = BTreeMap::new();
    for (i, plan) in layout.chunks.iter().enumerate() {
        let mut names: Vec<&str> = plan
            .pieces
            .iter()
            .map(|p| match &specs[p.entry].kind {
                EntryKind::Tensor { dtype, .. } => dtype.name(),
                EntryKind::Blob => "blob",
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        let key = names.join("+");
        let e = by_kind.entry(key).or_default();
        e.0 += u64::from(plan.len);
        e.1 += frames[i].frame.len() as u64;
        e.2 += usize::from(frames[i].codec != Codec::Raw);
    }
    say!("  compression by dtype (raw -> stored, chunks not stored raw):");
    for (k, (raw, st, n)) in &by_kind {
        say!(
            "    {k:<8} {:>11} -> {:>11}  ratio {:.3}  ({n} compressed)",
            human(*raw),
            human(*st),
            *raw as f64 / *st as f64
        );
    }

    // Manifest and commit record round trip.
    let info = ShardInfo {
        job: "demo".into(),
        step: 1,
        rank: 0,
        world_size: 1,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    let mut meta = BTreeMap::new();
    meta.insert("framework".into(), "synthetic".into());
    let manifest = ShardManifest::from_layout(info.clone(), specs, &layout, &ids, meta)?;
    let encoded = manifest.encode()?;
    if ShardManifest::decode(&encoded)? != manifest {
        return Err(CliError::Verify("manifest did not round-trip".into()));
    }
    let record = CommitRecord {
        job: info.job.clone(),
        step: info.step,
        world_size: 1,
        committed_unix_ms: info.created_unix_ms,
        shards: vec![ShardRef {
            rank: 0,
            manifest: ShardManifest::id_of(&encoded),
            logical_bytes: manifest.logical_bytes(),
        }],
    };
    let rec_bytes = record.encode()?;
    if CommitRecord::decode(&rec_bytes)? != record {
        return Err(CliError::Verify("commit record did not round-trip".into()));
    }
    say!(
        "  {:<22} {} entries, {} distinct chunks: {} binary, round trip ok; commit record {} B",
        "manifest",
        manifest.entries.len(),
        manifest.chunks.len(),
        human(encoded.len() as u64),
        rec_bytes.len()
    );
    say!(
        "ok: {} hashed at {:.2} GB/s, encoded at {:.2} GB/s (ratio {:.3}), decoded+verified at {:.2} GB/s; memcpy {:.2} GB/s",
        human(layout.stored_len()),
        gbps(layout.stored_len(), hash_time),
        gbps(layout.stored_len(), enc_time),
        layout.stored_len() as f64 / stored as f64,
        gbps(layout.stored_len(), dec_time),
        gbps(logical, memcpy),
    );
    Ok(())
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

fn row(what: &str, bytes: u64, d: Duration, extra: &str) {
    say!(
        "  {what:<22} {:>11} in {:>7.3} s = {:>6.2} GB/s  {extra}",
        human(bytes),
        d.as_secs_f64(),
        gbps(bytes, d)
    );
}

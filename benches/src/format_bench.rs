//! `format-bench`: throughput of BLAKE3 and of every codec, on random bytes
//! and on real weights (fp32, and bf16 made from them), against a plain
//! `memcpy` of the same bytes measured in the same run.
//!
//! ```text
//! benches/fetch-weights.sh            # once: real weights into benches/data/
//! cargo run --release -p strata-benches --bin format-bench
//! ```
//!
//! Every figure is the best of `--reps` runs. Compression and decompression
//! are per chunk (the unit every tier works in), on one thread and on all
//! cores; "decode" includes the BLAKE3 verification a reader always does,
//! "payload" is the codec alone (comparable with ZipNN's figures).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use strata::par::{default_threads, par_map};
use strata::synthetic::bf16_bits;
use strata_format::codec::{
    entropy_of, Codec, ElemHint, EncodeOptions, PayloadDecoder, PlaneCoder, PlaneSelect,
};
use strata_format::frame::{FrameDecoder, FrameEncoder, FrameHeader, FRAME_HEADER_LEN};
use strata_format::ChunkId;

struct Opts {
    weights: PathBuf,
    random_size: usize,
    chunk: usize,
    reps: usize,
    threads: usize,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        weights: Path::new(env!("CARGO_MANIFEST_DIR")).join("data/model.safetensors"),
        random_size: 256 << 20,
        chunk: 16 << 20,
        reps: 3,
        threads: default_threads(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--weights" => o.weights = PathBuf::from(val("--weights")?),
            "--random-mib" => {
                o.random_size = val("--random-mib")?
                    .parse::<usize>()
                    .map_err(|e| e.to_string())?
                    << 20
            }
            "--chunk-mib" => {
                o.chunk = val("--chunk-mib")?
                    .parse::<usize>()
                    .map_err(|e| e.to_string())?
                    << 20
            }
            "--reps" => {
                o.reps = val("--reps")?
                    .parse()
                    .map_err(|e: std::num::ParseIntError| e.to_string())?
            }
            "--threads" => {
                o.threads = val("--threads")?
                    .parse()
                    .map_err(|e: std::num::ParseIntError| e.to_string())?
            }
            "-h" | "--help" => {
                println!("format-bench [--weights FILE.safetensors] [--random-mib N] [--chunk-mib N] [--reps N] [--threads N]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(o)
}

/// Best wall time of `reps` runs of `f`.
fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        out = Some(v);
    }
    // reps >= 1, so `out` is set.
    (best, out.unwrap_or_else(|| unreachable!()))
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

/// The fp32 tensors of a safetensors file, concatenated in file order.
fn load_f32_weights(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("{}: {e} (run benches/fetch-weights.sh)", path.display()))?;
    let n = u64::from_le_bytes(
        bytes
            .get(..8)
            .ok_or("short file")?
            .try_into()
            .map_err(|_| "short file")?,
    ) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(bytes.get(8..8 + n).ok_or("short header")?)
            .map_err(|e| e.to_string())?;
    let data = &bytes[8 + n..];
    let mut spans: Vec<(usize, usize)> = header
        .as_object()
        .ok_or("header is not an object")?
        .iter()
        .filter(|(k, v)| *k != "__metadata__" && v["dtype"] == "F32")
        .filter_map(|(_, v)| {
            let o = v["data_offsets"].as_array()?;
            Some((o.first()?.as_u64()? as usize, o.get(1)?.as_u64()? as usize))
        })
        .collect();
    spans.sort_unstable();
    let mut out = Vec::with_capacity(data.len());
    for (a, b) in spans {
        out.extend_from_slice(data.get(a..b).ok_or("tensor outside the file")?);
    }
    Ok(out)
}

fn to_bf16(f32s: &[u8]) -> Vec<u8> {
    f32s.chunks_exact(4)
        .flat_map(|c| bf16_bits(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
        .collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    v
}

struct Row {
    name: String,
    ratio: f64,
    c1: f64,
    d1: f64,
    p1: f64,
    cn: f64,
    dn: f64,
}

fn bench_codec(
    name: &str,
    data: &[u8],
    hint: ElemHint,
    opts: EncodeOptions,
    o: &Opts,
) -> Result<Row, String> {
    let chunks: Vec<&[u8]> = data.chunks(o.chunk).collect();
    let ids: Vec<ChunkId> = chunks.iter().map(|c| ChunkId::of(c)).collect();
    let encode = |threads: usize| -> Result<Vec<Vec<u8>>, String> {
        par_map(
            chunks.len(),
            threads,
            || FrameEncoder::new(opts),
            |enc, i| {
                enc.as_mut()
                    .map_err(|e| e.to_string())?
                    .encode(chunks[i], hint, Some(ids[i]))
                    .map_err(|e| e.to_string())
            },
        )
        .into_iter()
        .collect()
    };
    let decode = |threads: usize, frames: &[Vec<u8>]| -> Result<(), String> {
        par_map(
            frames.len(),
            threads,
            || (FrameDecoder::new(), Vec::new()),
            |(dec, out), i| {
                out.resize(chunks[i].len(), 0);
                dec.as_mut()
                    .map_err(|e| e.to_string())?
                    .decode_into(&frames[i], Some(&ids[i]), out)
                    .map_err(|e| e.to_string())?;
                Ok(())
            },
        )
        .into_iter()
        .collect()
    };
    let (c1, frames) = best(o.reps, || encode(1));
    let frames = frames?;
    let (cn, _) = best(o.reps, || encode(o.threads));
    let (d1, r) = best(o.reps, || decode(1, &frames));
    r?;
    let (dn, r) = best(o.reps, || decode(o.threads, &frames));
    r?;
    // The codec alone, without the hash check.
    let (p1, r) = best(o.reps, || -> Result<(), String> {
        let mut dec = PayloadDecoder::new().map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let h = FrameHeader::decode(f, u32::MAX).map_err(|e| e.to_string())?;
            out.resize(chunks[i].len(), 0);
            dec.decode_into(h.codec, h.elem_size, &f[FRAME_HEADER_LEN..], &mut out)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    r?;
    let stored: usize = frames.iter().map(Vec::len).sum();
    Ok(Row {
        name: name.to_string(),
        ratio: data.len() as f64 / stored as f64,
        c1: gbps(data.len(), c1),
        d1: gbps(data.len(), d1),
        p1: gbps(data.len(), p1),
        cn: gbps(data.len(), cn),
        dn: gbps(data.len(), dn),
    })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("format-bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let o = parse_args()?;
    let random = random_bytes(o.random_size);
    let f32w = load_f32_weights(&o.weights)?;
    let bf16w = to_bf16(&f32w);
    println!(
        "# format-bench: {} threads, chunk {} MiB, best of {} runs",
        o.threads,
        o.chunk >> 20,
        o.reps
    );
    println!(
        "# real weights: {} ({} MB fp32)\n",
        o.weights.display(),
        f32w.len() / 1_000_000
    );

    println!("| data | memcpy 1 thread GB/s | memcpy all cores GB/s | BLAKE3 1 thread GB/s | BLAKE3 all cores GB/s | BLAKE3 / memcpy (all cores) |");
    println!("|---|---|---|---|---|---|");
    let mut memcpy_all = Vec::new();
    for (name, data) in [
        ("random", &random),
        ("fp32 weights", &f32w),
        ("bf16 weights", &bf16w),
    ] {
        let chunks: Vec<&[u8]> = data.chunks(o.chunk).collect();
        let copy = |threads| {
            par_map(
                chunks.len(),
                threads,
                || (),
                |_, i| {
                    let v = chunks[i].to_vec();
                    std::hint::black_box(v.len())
                },
            )
        };
        let (m1, _) = best(o.reps, || copy(1));
        let (mn, _) = best(o.reps, || copy(o.threads));
        let (h1, _) = best(o.reps, || blake3::hash(data));
        let (hn, _) = best(o.reps, || {
            blake3::Hasher::new().update_rayon(data).finalize()
        });
        memcpy_all.push(gbps(data.len(), mn));
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            gbps(data.len(), m1),
            gbps(data.len(), mn),
            gbps(data.len(), h1),
            gbps(data.len(), hn),
            gbps(data.len(), hn) / gbps(data.len(), mn),
        );
    }

    let planes_all = EncodeOptions {
        codec: Codec::Planes,
        rotate_floats: false,
        select: PlaneSelect::All,
        level: 1,
        coder: PlaneCoder::Zstd,
    };
    let planes_sel = EncodeOptions {
        rotate_floats: true,
        select: EncodeOptions::PLANES.select,
        ..planes_all
    };
    let planes_huf = EncodeOptions {
        coder: PlaneCoder::Huffman,
        ..EncodeOptions::PLANES
    };
    let configs: [(&str, EncodeOptions); 6] = [
        ("raw", EncodeOptions::RAW),
        ("zstd-1", EncodeOptions::ZSTD),
        ("planes, every plane zstd-1 (ZipNN-style split)", planes_all),
        ("planes, rotated, entropy-selected, zstd-1", planes_sel),
        ("planes, rotated, entropy-selected, huffman", planes_huf),
        (
            "planes, rotated, selected, auto (default)",
            EncodeOptions::PLANES,
        ),
    ];
    println!("\n| data | codec | ratio | compress 1T GB/s | decode+verify 1T GB/s | payload decode 1T GB/s | compress {n}T GB/s | decode+verify {n}T GB/s | compress / memcpy ({n}T) |", n = o.threads);
    println!("|---|---|---|---|---|---|---|---|---|");
    let datasets: [(&str, &[u8], ElemHint, f64); 3] = [
        (
            "random",
            &random,
            ElemHint {
                size: 4,
                float: true,
            },
            memcpy_all[0],
        ),
        (
            "fp32 weights",
            &f32w,
            ElemHint {
                size: 4,
                float: true,
            },
            memcpy_all[1],
        ),
        (
            "bf16 weights",
            &bf16w,
            ElemHint {
                size: 2,
                float: true,
            },
            memcpy_all[2],
        ),
    ];
    for (dname, data, hint, mc) in datasets {
        for (cname, opts) in configs {
            let r = bench_codec(cname, data, hint, opts, &o)?;
            println!(
                "| {dname} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} |",
                r.name,
                r.ratio,
                r.c1,
                r.d1,
                r.p1,
                r.cn,
                r.dn,
                r.cn / mc
            );
        }
    }

    // How close the default codec gets to what an order-0 coder could do.
    let n = bf16w.len() / 2;
    let mut hi = [0u32; 256];
    let mut lo = [0u32; 256];
    for c in bf16w.chunks_exact(2) {
        let v = u16::from_le_bytes([c[0], c[1]]).rotate_left(1);
        hi[usize::from(v >> 8)] += 1;
        lo[usize::from(v as u8)] += 1;
    }
    let (h_hi, h_lo) = (entropy_of(&hi, n as u64), entropy_of(&lo, n as u64));
    println!(
        "\nbf16 order-0 entropy after rotation: exponent byte {h_hi:.3} bits, sign+mantissa byte {h_lo:.3} bits; \
         best ratio an order-0 coder of both planes could reach: {:.3} (exponent plane only: {:.3})",
        16.0 / (h_hi + h_lo),
        16.0 / (h_hi + 8.0)
    );
    Ok(())
}

//! L3 benchmark on a real S3 server (s3s-fs on loopback, started here):
//! Strata's upload and restore against raw `object_store` transfers of the
//! same bytes, measured in the same run.
//!
//! ```text
//! benches/l3-bench.sh [--size 1GiB] [--reps 2]
//! ```
//!
//! - upload (`Checkpointer::upload`: read from L1, encode, multipart put)
//!   vs parallel multipart puts of the same bytes as 16 MiB objects;
//! - restore of a node with an empty L1 (`restore`: ranged GETs, verify,
//!   decode, place) vs parallel GETs of those objects;
//! - bytes uploaded for a step with 1 tensor in 20 changed, over a full upload;
//! - stored size of real bf16 weights (`benches/fetch-weights.sh`) vs raw.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use strata::format::DType;
use strata::{synthetic, Checkpointer, Config, L3State, StepSelector};
use strata_benches::cpu::Cpu;
use strata_benches::s3::{options, raw_store, start_s3s_fs, BUCKET};
use strata_benches::state::State;
use strata_tiered::ChunkStoreExt;
use strata_tiered::{ChunkData, ChunkPut, ChunkStore, L3Options, L3Store};

const OBJECT: usize = 16 << 20;
const CONCURRENCY: usize = 16;

/// Extra `--l3-option K=V` settings (Strata's own L3 options, e.g.
/// `concurrency=32`, `range_size=4194304`), applied to Strata's side only.
static EXTRA: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

fn strata_options(port: u16) -> Vec<(String, String)> {
    let mut o = options(port);
    o.extend(EXTRA.get().cloned().unwrap_or_default());
    o
}

fn gb(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

/// Raw baseline: the bytes as 16 MiB objects, multipart, CONCURRENCY at once.
async fn raw_put(
    store: &Arc<dyn ObjectStore>,
    data: &[Bytes],
    prefix: &str,
) -> Result<Duration, String> {
    let t = Instant::now();
    futures::stream::iter(data.iter().enumerate())
        .map(|(i, b)| {
            let store = store.clone();
            let key = object_store::path::Path::from(format!("{prefix}/{i}"));
            let b = b.clone();
            async move {
                let up = store.put_multipart(&key).await?;
                let mut w = WriteMultipart::new_with_chunk_size(up, 8 << 20);
                w.put(b);
                w.finish().await.map(|_| ())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|e| e.to_string())?;
    Ok(t.elapsed())
}

/// Raw baseline: parallel GETs of those objects.
async fn raw_get(
    store: &Arc<dyn ObjectStore>,
    n: usize,
    prefix: &str,
) -> Result<(Duration, u64), String> {
    let t = Instant::now();
    let sizes: Vec<u64> = futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            let key = object_store::path::Path::from(format!("{prefix}/{i}"));
            async move { store.get(&key).await?.bytes().await.map(|b| b.len() as u64) }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((t.elapsed(), sizes.iter().sum()))
}

/// Real bf16 weights (fp32 weights of all-MiniLM-L6-v2 rounded to bf16).
fn real_bf16() -> Result<Vec<u8>, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/model.safetensors");
    let bytes = std::fs::read(&path)
        .map_err(|e| format!("{}: {e} (run benches/fetch-weights.sh)", path.display()))?;
    let h = strata::format::safetensors::decode_header(&bytes, bytes.len() as u64)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for t in h.tensors.iter().filter(|t| t.dtype == DType::F32) {
        let a = (h.data_start + t.begin) as usize;
        let b = (h.data_start + t.end) as usize;
        for c in bytes[a..b].chunks_exact(4) {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            out.extend_from_slice(&synthetic::bf16_bits(v).to_le_bytes());
        }
    }
    Ok(out)
}

fn run(size: u64, reps: usize, dir: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let (server, port) = start_s3s_fs(&dir.join("s3"))?;
    let cpu = Cpu {
        server: server.pid().to_string(),
    };
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let state = State::new(size, 7);
    let logical = state.logical();
    println!(
        "l3-bench: {:.2} GiB synthetic state ({} entries), s3s-fs on loopback, {} requests in flight, best of {reps}",
        logical as f64 / f64::from(1u32 << 30),
        state.specs.len(),
        CONCURRENCY
    );

    // The same bytes as raw objects.
    let flat: Vec<u8> = state.data.concat();
    let objects: Vec<Bytes> = flat.chunks(OBJECT).map(Bytes::copy_from_slice).collect();
    drop(flat);
    let raw = raw_store(port)?;

    let best = |v: &mut Vec<Duration>, d: Duration| v.push(d);
    let (mut raw_up, mut raw_down, mut up, mut down) = (vec![], vec![], vec![], vec![]);
    let mut down_only = vec![];
    let mut stored = 0u64;
    for r in 0..reps {
        let c0 = cpu.now();
        let d = rt.block_on(raw_put(&raw, &objects, &format!("raw{r}")))?;
        cpu.since(c0, "raw put", d);
        best(&mut raw_up, d);
        let c0 = cpu.now();
        let (d, n) = rt.block_on(raw_get(&raw, objects.len(), &format!("raw{r}")))?;
        cpu.since(c0, "raw get", d);
        if n != logical {
            return Err(format!("raw GETs returned {n} of {logical} bytes"));
        }
        best(&mut raw_down, d);

        // Strata: save to L1, upload, then restore with L1 gone.
        let l1 = dir.join(format!("l1-{r}"));
        let cfg = Config::builder()
            .job(format!("bench{r}"))
            .l1_dir(&l1)
            .gc_grace_secs(0)
            .l3_url(format!("s3://{BUCKET}/strata"));
        let mut cfg = cfg;
        for (k, v) in strata_options(port) {
            cfg = cfg.l3_option(k, v);
        }
        {
            let ck = Checkpointer::new(cfg.clone()).map_err(|e| e.to_string())?;
            ck.save(1, &state.entries())
                .and_then(|h| h.wait())
                .map_err(|e| e.to_string())?;
            let (t, c0) = (Instant::now(), cpu.now());
            ck.upload(1).map_err(|e| e.to_string())?;
            ck.wait_uploads();
            cpu.since(c0, "upload", t.elapsed());
            best(&mut up, t.elapsed());
            match ck.uploads().get(&1) {
                Some(L3State::Committed { .. }) => {}
                other => return Err(format!("upload: {other:?}")),
            }
            if r == 0 {
                // Stored bytes of the step on L3.
                let l3 = ck.l3().ok_or("no L3")?;
                let listed: Vec<_> = rt
                    .block_on(l3.list_chunks("bench0"))
                    .map_err(|e| e.to_string())?;
                stored = listed.len() as u64;
            }
        }
        // Restore with L1 gone: reading into memory only, and (the default)
        // also writing the step back to L1.
        for write_back in [false, true] {
            std::fs::remove_dir_all(&l1).map_err(|e| e.to_string())?;
            let ck = Checkpointer::new(cfg.clone().rehydrate_l1(write_back))
                .map_err(|e| e.to_string())?;
            let (t, c0) = (Instant::now(), cpu.now());
            let got = ck
                .restore(StepSelector::Latest)
                .map_err(|e| e.to_string())?;
            cpu.since(
                c0,
                &format!(
                    "{} (fetching {:.2} s)",
                    if write_back {
                        "restore + write-back"
                    } else {
                        "restore"
                    },
                    got.stats.duration.as_secs_f64()
                ),
                t.elapsed(),
            );
            best(
                if write_back {
                    &mut down
                } else {
                    &mut down_only
                },
                t.elapsed(),
            );
            if got.stats.bytes_from_l3 != got.stats.bytes_read {
                return Err("the restore did not come from L3".into());
            }
            if got.stats.rehydrated != write_back {
                return Err(format!("rehydrated: {}", got.stats.rehydrated));
            }
            for (s, d) in state.specs.iter().zip(&state.data) {
                if got.get(&s.name).map(|e| &e.bytes) != Some(d) {
                    return Err(format!("{} differs after the L3 restore", s.name));
                }
            }
        }
    }
    let min = |v: &[Duration]| v.iter().copied().min().unwrap_or_default();
    let (ru, rd, u, d) = (min(&raw_up), min(&raw_down), min(&up), min(&down));
    let d_only = min(&down_only);
    println!("  ({stored} chunk objects per step on L3)");
    println!(
        "  {:<44} {:>10}  {:<36} {:>6}  {:>6}",
        "measure", "Strata", "baseline (same run)", "ratio", "goal"
    );
    let row = |what: &str, ours: f64, base: f64, label: &str, goal: f64| {
        let ratio = ours / base;
        println!(
            "  {what:<44} {:>5.2} GB/s  {label} {base:>5.2} GB/s {:>8.2}  >={goal}  {}",
            ours,
            ratio,
            if ratio >= goal { "ok" } else { "MISSED" }
        );
    };
    row(
        "upload (L1 -> L3, encode, multipart)",
        gb(logical, u),
        gb(logical, ru),
        "raw parallel multipart puts  ",
        0.8,
    );
    row(
        "restore from L3 into memory",
        gb(logical, d_only),
        gb(logical, rd),
        "raw parallel GETs            ",
        0.8,
    );
    row(
        "  same, also writing the step back to L1",
        gb(logical, d),
        gb(logical, rd),
        "raw parallel GETs            ",
        0.8,
    );

    // Incremental upload: 1 tensor in 20 changed.
    {
        let l1 = dir.join("l1-inc");
        let mut cfg = Config::builder()
            .job("inc")
            .l1_dir(&l1)
            .gc_grace_secs(0)
            .l3_url(format!("s3://{BUCKET}/strata"));
        for (k, v) in strata_options(port) {
            cfg = cfg.l3_option(k, v);
        }
        let ck = Checkpointer::new(cfg).map_err(|e| e.to_string())?;
        let mut st = State {
            specs: state.specs.clone(),
            data: state.data.clone(),
        };
        let mut sent = Vec::new();
        for step in 1..=2u64 {
            if step == 2 {
                for d in st.data.iter_mut().skip(7).step_by(20) {
                    for at in (0..d.len()).step_by(1 << 20) {
                        d[at] ^= 0x5A;
                    }
                }
            }
            ck.save(step, &st.entries())
                .and_then(|h| h.wait())
                .map_err(|e| e.to_string())?;
            ck.upload(step).map_err(|e| e.to_string())?;
            ck.wait_uploads();
            match ck.uploads().get(&step) {
                Some(L3State::Committed { sent: s, .. }) => sent.push(*s),
                other => return Err(format!("upload of step {step}: {other:?}")),
            }
        }
        println!(
            "  {:<44} {:>7.1} MiB  full upload {:.1} MiB {:>18.3}  <=0.07  {}",
            "incremental upload, 1 tensor in 20 changed",
            sent[1] as f64 / f64::from(1u32 << 20),
            sent[0] as f64 / f64::from(1u32 << 20),
            sent[1] as f64 / sent[0] as f64,
            if (sent[1] as f64 / sent[0] as f64) <= 0.07 {
                "ok"
            } else {
                "MISSED"
            }
        );
    }

    // Stored size of real bf16 weights.
    match real_bf16() {
        Ok(w) => {
            let l3 = L3Store::from_url(
                &format!("s3://{BUCKET}/weights"),
                &options(port),
                L3Options::default(),
            )
            .map_err(|e| e.to_string())?;
            let puts: Vec<ChunkPut> = w
                .chunks(16 << 20)
                .map(|c| ChunkPut {
                    id: strata::format::ChunkId::of(c),
                    hint: strata::format::codec::ElemHint {
                        size: 2,
                        float: true,
                    },
                    data: ChunkData::copy_from(c),
                })
                .collect();
            let st = rt
                .block_on(l3.put_chunks("weights", puts))
                .map_err(|e| e.to_string())?;
            println!(
                "  stored size of real bf16 weights (all-MiniLM-L6-v2): {:.1} MiB -> {:.1} MiB on L3, ratio {:.3}",
                st.bytes_written as f64 / f64::from(1u32 << 20),
                st.bytes_stored as f64 / f64::from(1u32 << 20),
                st.bytes_written as f64 / st.bytes_stored.max(1) as f64
            );
        }
        Err(e) => println!("  real-weights row skipped: {e}"),
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

fn main() {
    let mut size: u64 = 1 << 30;
    let mut reps = 2usize;
    let mut dir = PathBuf::from("strata-l3-bench");
    let mut extra = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next();
        match (a.as_str(), v) {
            ("--size", Some(v)) => {
                size = v
                    .trim_end_matches("GiB")
                    .trim_end_matches("MiB")
                    .parse::<u64>()
                    .map(|n| if v.ends_with("MiB") { n << 20 } else { n << 30 })
                    .unwrap_or(size)
            }
            ("--reps", Some(v)) => reps = v.parse().unwrap_or(reps).max(1),
            ("--dir", Some(v)) => dir = PathBuf::from(v),
            ("--l3-option", Some(v)) => match v.split_once('=') {
                Some((k, v)) => extra.push((k.to_string(), v.to_string())),
                None => {
                    eprintln!("--l3-option takes KEY=VALUE");
                    std::process::exit(2);
                }
            },
            _ => {
                eprintln!(
                    "l3-bench [--size 1GiB|512MiB] [--reps 2] [--dir DIR] [--l3-option KEY=VALUE]..."
                );
                std::process::exit(2);
            }
        }
    }
    let _ = EXTRA.set(extra);
    if let Err(e) = run(size, reps, &dir) {
        eprintln!("l3-bench: {e}");
        std::process::exit(1);
    }
}

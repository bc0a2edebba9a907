//! L1 benchmark: Strata's save and restore against baselines measured in
//! the same run, on the same bytes, in the same directory.
//!
//! ```text
//! cargo run --release -p strata-benches --bin l1-bench -- [--dir DIR] [--size 2GiB] [--reps 3]
//! ```
//!
//! - save throughput (save call → durable and committed) vs `fio` writing
//!   the same number of bytes with O_DIRECT (io_uring, 4 MiB, depth 8);
//! - save stall vs a memcpy of the same bytes into warm memory on as many
//!   threads as the snapshot uses;
//! - restore into caller buffers vs `fio` reading them back with O_DIRECT;
//! - durable save and load vs the `safetensors` Python package
//!   (`save_file` + fsync; `load_file` with the file evicted from the page
//!   cache) on the same tensors;
//! - bytes written by a step where 5% of the bytes changed, over a full save;
//! - priority restore: the time to a third of the bytes (weights whose
//!   optimizer state is twice their size) over the time to everything;
//! - with `--background`: the stall of a save and a restore while the
//!   previous step's upload to an L3 directory on the same disk runs
//!   (capped at 1 GB/s, `BENCH_UPLOAD_BYTES_PER_SEC`, so that it spans
//!   them), over the memcpy and the same restore once the upload is done;
//!   only runs the upload ran beside throughout count.
//!
//! Every figure is the best of `--reps` runs of each side. Without `fio`
//! the raw-disk baselines use `dd` (O_DIRECT, 4 MiB blocks); without
//! Python's `safetensors` and `numpy` that comparison is skipped with a note.
//! `benches/l1-bench.sh` installs both and runs this.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use strata::format::{DType, EntryKind};
use strata::par::{default_threads, par_map};
use strata::{Checkpointer, Config, StepSelector};
use strata_benches::state::State;

mod phases;

struct Opts {
    dir: PathBuf,
    size: u64,
    reps: usize,
    chunk_size: u32,
    engine: String,
    python: String,
    overlap: Option<bool>,
    background: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let mul: u64 = match mul.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?}")),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("bad size {s:?}"))?;
    Ok((n * mul as f64) as u64)
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        dir: PathBuf::from("strata-bench"),
        size: 2 << 30,
        reps: 3,
        chunk_size: 16 << 20,
        engine: "auto".into(),
        python: "python3".into(),
        overlap: None,
        background: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--dir" => o.dir = PathBuf::from(val("--dir")?),
            "--size" => o.size = parse_size(&val("--size")?)?,
            "--reps" => {
                o.reps = val("--reps")?
                    .parse()
                    .map_err(|_| "--reps needs a number".to_string())?
            }
            "--chunk-size" => {
                o.chunk_size = parse_size(&val("--chunk-size")?)?
                    .try_into()
                    .map_err(|_| "--chunk-size too large".to_string())?
            }
            "--engine" => o.engine = val("--engine")?,
            "--background" => o.background = true,
            "--python" => o.python = val("--python")?,
            "--overlap" => {
                o.overlap = match val("--overlap")?.as_str() {
                    "on" => Some(true),
                    "off" => Some(false),
                    "default" => None,
                    other => return Err(format!("--overlap on|off|default, not {other:?}")),
                }
            }
            "-h" | "--help" => {
                println!(
                    "l1-bench [--dir DIR] [--size 2GiB] [--reps 3] [--chunk-size 16MiB] \
                     [--engine auto|io_uring|psync] [--python python3] [--overlap on|off|default] \
                     [--background]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    o.reps = o.reps.max(1);
    Ok(o)
}

fn gb(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// The file system type of `dir`, for the report.
fn fs_type(dir: &Path) -> String {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => "unknown fs".into(),
    }
}

/// A raw-disk baseline run: GB/s and which tool measured it.
struct Raw {
    gbps: f64,
    tool: &'static str,
}

/// Writes (or reads) `bytes` to `file` with O_DIRECT using fio, or dd where
/// fio is missing. Returns the tool's throughput.
fn raw_io(file: &Path, bytes: u64, write: bool) -> Result<Raw, String> {
    const BS: u64 = 4 << 20;
    let bytes = bytes.div_ceil(BS) * BS;
    let have_fio = Command::new("fio").arg("--version").output().is_ok();
    if have_fio {
        let out_json = file.with_extension("fio.json");
        let status = Command::new("fio")
            .arg("--name=raw")
            .arg(format!("--filename={}", file.display()))
            .arg(format!("--rw={}", if write { "write" } else { "read" }))
            .args([
                "--bs=4M",
                "--direct=1",
                "--ioengine=io_uring",
                "--iodepth=8",
                "--end_fsync=1",
                "--output-format=json",
            ])
            .arg(format!("--size={bytes}"))
            .arg(format!("--output={}", out_json.display()))
            .status()
            .map_err(|e| format!("fio: {e}"))?;
        if !status.success() {
            return Err(format!("fio exited with {status}"));
        }
        let text = std::fs::read_to_string(&out_json).map_err(|e| format!("fio output: {e}"))?;
        let _ = std::fs::remove_file(&out_json);
        // fio may print notes before the JSON object.
        let json = text.find('{').map_or("", |i| &text[i..]);
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("fio output: {e}"))?;
        let bw = v["jobs"][0][if write { "write" } else { "read" }]["bw_bytes"]
            .as_f64()
            .ok_or("fio output has no bw_bytes")?;
        return Ok(Raw {
            gbps: bw / 1e9,
            tool: "fio",
        });
    }
    let count = (bytes / BS).to_string();
    let mut cmd = Command::new("dd");
    if write {
        cmd.arg("if=/dev/zero")
            .arg(format!("of={}", file.display()))
            .args(["bs=4M", "oflag=direct", "conv=fdatasync"]);
    } else {
        cmd.arg(format!("if={}", file.display()))
            .args(["of=/dev/null", "bs=4M", "iflag=direct"]);
    }
    cmd.arg(format!("count={count}"));
    let t = Instant::now();
    let out = cmd.output().map_err(|e| format!("dd: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Raw {
        gbps: gb(bytes, t.elapsed()),
        tool: "dd",
    })
}

/// Writes the state as a safetensors file the numpy loader reads:
/// bf16 and fp8 stored as same-sized unsigned integers (numpy has no
/// such dtypes; the bytes, and so the work, are the same), blobs as u8.
fn write_safetensors(state: &State, path: &Path) -> Result<(), String> {
    let numpy_dtype = |d: DType| match d {
        DType::BF16 => DType::U16,
        DType::F8_E4M3 | DType::F8_E5M2 => DType::U8,
        other => other,
    };
    let descr: Vec<(String, DType, Vec<u64>)> = state
        .specs
        .iter()
        .map(|s| match &s.kind {
            EntryKind::Tensor { dtype, shape } => {
                let nd = numpy_dtype(*dtype);
                // Same bytes: scale the last dimension if sizes differ.
                let mut shape = shape.clone();
                if nd.size() != dtype.size() {
                    if let Some(last) = shape.last_mut() {
                        *last = *last * dtype.size() as u64 / nd.size() as u64;
                    }
                }
                (s.name.clone(), nd, shape)
            }
            EntryKind::Blob => (s.name.clone(), DType::U8, vec![s.len]),
        })
        .collect();
    let tensors: Vec<(&str, DType, &[u64])> = descr
        .iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
        .collect();
    let (prefix, _) = strata::format::safetensors::encode_header(
        &tensors,
        &[("format".to_string(), "np".to_string())].into(),
    )
    .map_err(|e| e.to_string())?;
    let mut f = std::io::BufWriter::with_capacity(
        8 << 20,
        std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
    );
    f.write_all(&prefix).map_err(|e| e.to_string())?;
    for d in &state.data {
        f.write_all(d).map_err(|e| e.to_string())?;
    }
    f.into_inner()
        .map_err(|e| e.to_string())?
        .sync_all()
        .map_err(|e| e.to_string())
}

fn best(v: &[Duration]) -> Duration {
    v.iter().copied().min().unwrap_or_default()
}

/// A copy of the state into already-faulted memory, on as many threads as
/// the snapshot uses: the floor for a save's stall.
fn memcpy_time(state: &State) -> Duration {
    let dst: Vec<std::sync::Mutex<Vec<u8>>> = state
        .data
        .iter()
        .map(|d| std::sync::Mutex::new(vec![1u8; d.len()]))
        .collect();
    let t = Instant::now();
    par_map(
        state.data.len(),
        default_threads(),
        || (),
        |_, i| {
            if let Ok(mut d) = dst[i].lock() {
                d.copy_from_slice(&state.data[i]);
            }
        },
    );
    let e = t.elapsed();
    std::hint::black_box(&dst);
    e
}

/// The Python baseline's timings.
struct PyResult {
    save: Duration,
    load: Duration,
    versions: String,
}

fn python_baseline(o: &Opts, src: &Path) -> Result<PyResult, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("safetensors_baseline.py");
    let out = Command::new(&o.python)
        .arg(&script)
        .arg(src)
        .arg(o.dir.join("py-out.safetensors"))
        .arg(o.reps.to_string())
        .output()
        .map_err(|e| format!("{}: {e}", o.python))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("baseline output: {e}"))?;
    let secs = |k: &str| -> Result<Duration, String> {
        let best = v[k]
            .as_array()
            .ok_or(format!("baseline output has no {k}"))?
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .fold(f64::INFINITY, f64::min);
        Ok(Duration::from_secs_f64(best))
    };
    Ok(PyResult {
        save: secs("save_s")?,
        load: secs("load_s")?,
        versions: format!(
            "safetensors {}, numpy {}",
            v["safetensors"].as_str().unwrap_or("?"),
            v["numpy"].as_str().unwrap_or("?")
        ),
    })
}

fn run(o: &Opts) -> Result<bool, String> {
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let store = o.dir.join("l1");
    let _ = std::fs::remove_dir_all(&store);
    let t = Instant::now();
    let mut state = State::new(o.size, 0x5EED);
    let logical = state.logical();
    let chunk = o.chunk_size as usize;
    println!(
        "l1-bench: {:.2} GiB state in {} entries (generated in {:.1} s), chunk {} MiB, \
         dir {} ({}), {} threads, best of {}",
        gib(logical),
        state.specs.len(),
        t.elapsed().as_secs_f64(),
        o.chunk_size >> 20,
        o.dir.display(),
        fs_type(&o.dir),
        default_threads(),
        o.reps
    );

    // Strata and its raw-disk baselines, interleaved rep by rep so that each
    // pair runs under the same conditions (this disk's speed drifts).
    let raw_file = o.dir.join("raw.bin");
    let mut cfg = Config::builder()
        .job("bench")
        .l1_dir(&store)
        .chunk_size(o.chunk_size)
        .io_engine(o.engine.clone())
        .keep_last(1)
        .gc_grace_secs(0)
        // STRATA_* variables tune the checkpointer (STRATA_HASH_THREADS=1, ...).
        .with_env(std::env::vars())
        .map_err(|e| e.to_string())?;
    if let Some(on) = o.overlap {
        cfg = cfg.persist_during_snapshot(on);
    }
    let overlap = cfg.persist_during_snapshot;
    let bg_cfg = cfg.clone().l1_dir(o.dir.join("l1-bg"));
    let ck = std::sync::Arc::new(Checkpointer::new(cfg).map_err(|e| e.to_string())?);
    let mut step = 0u64;
    let mut save = |state: &State| -> Result<strata::SaveStats, String> {
        step += 1;
        let h = ck.save(step, &state.entries()).map_err(|e| e.to_string())?;
        h.wait().map_err(|e| e.to_string())
    };
    let t = Instant::now();
    ck.prepare(&state.entries()).map_err(|e| e.to_string())?;
    let prepared = t.elapsed();
    let first = save(&state)?;
    // A second warm-up: the staging pool holds two buffers.
    state.touch_all(chunk, 0x11);
    save(&state)?;
    let (mut raw_w, mut raw_r, mut memcpy) = (Vec::new(), Vec::new(), Vec::new());
    let (mut full, mut restore_into, mut restore_fresh) = (Vec::new(), Vec::new(), Vec::new());
    let mut tool = "?";
    for r in 0..o.reps {
        let _ = std::fs::remove_file(&raw_file);
        let w = raw_io(&raw_file, logical, true)?;
        tool = w.tool;
        raw_w.push(w.gbps);
        // A full save: every chunk new.
        // Salts two apart (`touch_all` XORs `salt | 1`: 0x20 + r would
        // repeat a salt and bring back an earlier step's bytes).
        state.touch_all(chunk, 0x20 + 2 * r as u8);
        memcpy.push(memcpy_time(&state));
        let s = save(&state)?;
        if s.bytes_deduped > 0 {
            eprintln!(
                "note: a full save deduplicated {} bytes (chunks repeated in the state)",
                s.bytes_deduped
            );
        }
        full.push(s);
        raw_r.push(raw_io(&raw_file, logical, false)?.gbps);
        let mut dests: Vec<(&str, &mut [u8])> = state
            .specs
            .iter()
            .zip(state.data.iter_mut())
            .map(|(s, d)| (s.name.as_str(), d.as_mut_slice()))
            .collect();
        let st = ck
            .restore_into(StepSelector::Latest, &mut dests)
            .map_err(|e| e.to_string())?;
        restore_into.push(st.duration);
        let t = Instant::now();
        let got = ck
            .restore(StepSelector::Latest)
            .map_err(|e| e.to_string())?;
        restore_fresh.push(t.elapsed());
        // Check what came back, outside the timing.
        for (spec, d) in state.specs.iter().zip(&state.data) {
            if got.get(&spec.name).map(|e| &e.bytes) != Some(d) {
                return Err(format!(
                    "restored {} differs from what was saved",
                    spec.name
                ));
            }
        }
    }
    let _ = std::fs::remove_file(&raw_file);
    let raw_w = raw_w.iter().copied().fold(0.0, f64::max);
    let raw_r = raw_r.iter().copied().fold(0.0, f64::max);
    let memcpy = best(&memcpy);
    let save_best = full
        .iter()
        .min_by_key(|s| s.to_durable)
        .cloned()
        .unwrap_or_default();
    let stall_best = best(&full.iter().map(|s| s.stall).collect::<Vec<_>>());
    let restore_into = best(&restore_into);
    let restore_fresh = best(&restore_fresh);

    // Priority restore: a third of the bytes first (weights whose
    // optimizer state is twice their size), spread over the shard.
    let weights = phases::spread_names(&state.specs, 1.0 / 3.0);
    let prio = phases::priority(&ck, &weights, 1.0 / 3.0, o.reps)?;

    // Incremental: 5% of the tensors change.
    let changed = state.touch_every_20th_entry(chunk, 0x40);
    let inc = save(&state)?;
    drop(ck);
    let _ = std::fs::remove_dir_all(&store);
    let bg = if o.background {
        let _ = std::fs::remove_dir_all(o.dir.join("l1-bg"));
        let r = phases::background(&o.dir, bg_cfg, &mut state, chunk, o.reps);
        let _ = std::fs::remove_dir_all(o.dir.join("l1-bg"));
        Some(r?)
    } else {
        None
    };

    // The safetensors baseline on the same tensors.
    let st_file = o.dir.join("state.safetensors");
    write_safetensors(&state, &st_file)?;
    drop(state);
    let py = python_baseline(o, &st_file);
    let _ = std::fs::remove_file(&st_file);
    let _ = std::fs::remove_file(o.dir.join("py-out.safetensors"));

    let save_gbps = gb(logical, save_best.to_durable);
    // The background part: from the snapshot taken (save returned) until
    // durable and committed. The stall has its own row.
    let persist_best = full
        .iter()
        .map(|s| s.to_durable.saturating_sub(s.stall))
        .min()
        .unwrap_or_default();
    let persist_gbps = gb(logical, persist_best);
    let restore_gbps = gb(logical, restore_into);
    let stall_ratio = stall_best.as_secs_f64() / memcpy.as_secs_f64().max(1e-9);
    let inc_ratio = inc.bytes_written as f64 / logical as f64;
    println!(
        "  persist during snapshot: {} (--overlap on|off)",
        if overlap { "on" } else { "off" }
    );
    println!(
        "  staging prepared in {:.2} s; first save: stall {:.3} s, durable in {:.2} s",
        prepared.as_secs_f64(),
        first.stall.as_secs_f64(),
        first.to_durable.as_secs_f64()
    );
    println!(
        "  full save: stall {:.3} s, then hashing ({:.2} s, overlapped with writes), chunks \
         and manifest durable {:.2} s after save was called, commit record {:.1} ms",
        save_best.stall.as_secs_f64(),
        save_best.hash_time.as_secs_f64(),
        save_best.write_time.as_secs_f64(),
        save_best.commit_time.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "  {:<38} {:>10}  {:<34} {:>6}  {:>6}",
        "measure", "Strata", "baseline (same run)", "ratio", "goal"
    );
    let mut ok = true;
    let mut row = |what: &str, ours: String, base: String, ratio: f64, goal: &str, pass: bool| {
        ok &= pass;
        println!(
            "  {what:<38} {ours:>10}  {base:<34} {ratio:>6.2}  {goal:>6}  {}",
            if goal == "-" {
                ""
            } else if pass {
                "ok"
            } else {
                "MISSED"
            }
        );
    };
    row(
        "save: persist (snapshot -> durable)",
        format!("{persist_gbps:.2} GB/s"),
        format!("{tool} O_DIRECT write {raw_w:.2} GB/s"),
        persist_gbps / raw_w,
        ">=0.9",
        persist_gbps / raw_w >= 0.9,
    );
    row(
        "save: end to end (call -> durable)",
        format!("{save_gbps:.2} GB/s"),
        format!("{tool} O_DIRECT write {raw_w:.2} GB/s"),
        save_gbps / raw_w,
        "-",
        true,
    );
    row(
        "save stall",
        format!("{:.3} s", stall_best.as_secs_f64()),
        format!(
            "memcpy, warm, {} threads {:.3} s",
            default_threads(),
            memcpy.as_secs_f64()
        ),
        stall_ratio,
        "<=1.2",
        stall_ratio <= 1.2,
    );
    row(
        "restore into buffers",
        format!("{restore_gbps:.2} GB/s"),
        format!("{tool} O_DIRECT read {raw_r:.2} GB/s"),
        restore_gbps / raw_r,
        ">=0.9",
        restore_gbps / raw_r >= 0.9,
    );
    match &py {
        Ok(p) => {
            let save_x = p.save.as_secs_f64() / save_best.to_durable.as_secs_f64();
            let load_x = p.load.as_secs_f64() / restore_fresh.as_secs_f64();
            let blocked_x = p.save.as_secs_f64() / stall_best.as_secs_f64().max(1e-9);
            row(
                "training blocked per save vs safetensors",
                format!("{:.2} s", stall_best.as_secs_f64()),
                format!("save_file+fsync {:.2} s", p.save.as_secs_f64()),
                blocked_x,
                ">=3",
                blocked_x >= 3.0,
            );
            row(
                "time to durable vs safetensors",
                format!("{:.2} s", save_best.to_durable.as_secs_f64()),
                format!("save_file+fsync {:.2} s", p.save.as_secs_f64()),
                save_x,
                ">=3",
                save_x >= 3.0,
            );
            row(
                "load vs safetensors (new memory)",
                format!("{:.2} s", restore_fresh.as_secs_f64()),
                format!("load_file, cold {:.2} s", p.load.as_secs_f64()),
                load_x,
                ">=3",
                load_x >= 3.0,
            );
            println!("  (Python baseline: {})", p.versions);
        }
        Err(e) => println!(
            "  safetensors comparison skipped: {e}\n  (pip install numpy safetensors, or run benches/l1-bench.sh)"
        ),
    }
    row(
        "incremental step, 1 tensor in 20",
        format!(
            "{:.1} MiB",
            inc.bytes_written as f64 / f64::from(1u32 << 20)
        ),
        format!(
            "full {:.1} MiB ({:.1}% touched)",
            logical as f64 / f64::from(1u32 << 20),
            100.0 * changed as f64 / logical as f64
        ),
        inc_ratio,
        "<=0.07",
        inc_ratio <= 0.07,
    );
    let prio_ratio = prio.first.as_secs_f64() / prio.all.as_secs_f64().max(1e-9);
    row(
        "priority restore: 1/3 of the bytes first",
        format!("{:.2} s", prio.first.as_secs_f64()),
        format!(
            "everything {:.2} s ({:.0}% first)",
            prio.all.as_secs_f64(),
            prio.share * 100.0
        ),
        prio_ratio,
        "<=0.4",
        prio_ratio <= 0.4,
    );
    if let Some(bg) = &bg {
        let stall_x = bg.stall.as_secs_f64() / memcpy.as_secs_f64().max(1e-9);
        row(
            "save stall, upload running",
            format!("{:.3} s", bg.stall.as_secs_f64()),
            format!("memcpy, warm {:.3} s", memcpy.as_secs_f64()),
            stall_x,
            "<=1.2",
            // Only a run whose save the upload ran beside counts.
            stall_x <= 1.2 && bg.stall_overlapped > 0,
        );
        let busy_gbps = gb(logical, bg.restore_busy);
        let idle_gbps = gb(logical, bg.restore_idle);
        row(
            "restore, upload running",
            format!("{busy_gbps:.2} GB/s"),
            format!("same restore, idle {idle_gbps:.2} GB/s"),
            busy_gbps / idle_gbps.max(1e-9),
            ">=0.8",
            // Only a run whose restore the upload ran beside counts.
            busy_gbps / idle_gbps.max(1e-9) >= 0.8 && bg.restore_overlapped > 0,
        );
        println!(
            "  (background: the upload still ran at the end of the restore in {} of {} runs and of the save in {}, the best of those taken; uploads held back {:.2} s in all)",
            bg.restore_overlapped, bg.reps, bg.stall_overlapped, bg.held
        );
    }
    Ok(ok)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("l1-bench: {e}");
            std::process::exit(2);
        }
    };
    match run(&o) {
        Ok(true) => {}
        Ok(false) => {
            println!("some goals were missed on this run (see MISSED)");
        }
        Err(e) => {
            eprintln!("l1-bench: {e}");
            std::process::exit(1);
        }
    }
}

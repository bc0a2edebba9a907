//! `strata mount` benchmark, against baselines measured in the same run:
//!
//! - `cp` of a `rank-0.safetensors` from a fresh mount of L1 (then fsync)
//!   vs `strata export` of the same step and rank (which fsyncs): goal
//!   ≥ 0.8 of export's throughput;
//! - one tensor read from a fresh mount of L3 alone (s3s-fs on loopback)
//!   vs ranged GETs of the same number of bytes from one plain object on
//!   the same server (one GET, and 8 MiB ranges in parallel).
//!
//! ```text
//! benches/mount-bench.sh [--size 1GiB] [--reps 3] [--dir DIR]
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use strata::par::default_threads;
use strata::{synthetic, Checkpointer, Config};
use strata_benches::s3::{options, raw_store, start_s3s_fs, BUCKET};

const JOB: &str = "mount-bench";

fn strata_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("STRATA_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = me.with_file_name("strata");
    p.is_file()
        .then_some(p)
        .ok_or_else(|| "no strata binary beside mount-bench (cargo build --release -p strata-cli, or STRATA_BIN)".into())
}

fn mounted(at: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == at.to_str())
}

/// A foreground mount; SIGTERM and wait on drop.
struct Mount(Child, PathBuf);

fn mount(
    strata: &Path,
    args: &[String],
    at: &Path,
    env: &[(&str, String)],
) -> Result<Mount, String> {
    std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
    let at = at.canonicalize().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(strata);
    cmd.arg("mount").args(args).arg(&at).arg("--foreground");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut m = Mount(child, at.clone());
    let t0 = Instant::now();
    while !mounted(&at) {
        if let Ok(Some(s)) = m.0.try_wait() {
            return Err(format!("strata mount exited: {s}"));
        }
        if t0.elapsed() > Duration::from_secs(30) {
            return Err("not mounted within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(m)
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn gbs(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

/// `cp FROM TO` (coreutils, as people run it), then fsync of TO.
fn copy_synced(from: &Path, to: &Path) -> Result<u64, String> {
    let st = Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .map_err(|e| format!("cp: {e}"))?;
    if !st.success() {
        return Err(format!("cp {} failed: {st}", from.display()));
    }
    let f = std::fs::File::open(to).map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())?;
    Ok(f.metadata().map_err(|e| e.to_string())?.len())
}

fn run(size: u64, reps: usize, dir: &Path) -> Result<(), String> {
    let strata = strata_bin()?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    let (_server, port) = start_s3s_fs(&dir.join("s3"))?;
    let l1 = dir.join("l1");
    let url = format!("s3://{BUCKET}/mount");
    let opts = options(port);

    // One step, on L1 and uploaded to L3.
    let (specs, data) = synthetic::generate(size, 7, default_threads());
    let mut cfg = Config::builder()
        .job(JOB)
        .l1_dir(&l1)
        .l3_url(&url)
        .upload_every(1);
    for (k, v) in &opts {
        cfg = cfg.l3_option(k, v);
    }
    let ck = Checkpointer::new(cfg).map_err(|e| e.to_string())?;
    ck.save(1, &synthetic::as_entries(&specs, &data))
        .and_then(|h| h.wait())
        .map_err(|e| e.to_string())?;
    ck.flush().map_err(|e| e.to_string())?;
    ck.close().map_err(|e| e.to_string())?;
    let logical: u64 = data.iter().map(|d| d.len() as u64).sum();
    // The largest tensor, for the single-tensor read.
    let (big, big_bytes) = specs
        .iter()
        .zip(&data)
        .max_by_key(|(_, d)| d.len())
        .map(|(s, d)| (s.name.clone(), d.clone()))
        .ok_or("no tensors")?;
    println!(
        "mount-bench: {:.2} GiB synthetic state ({} tensors), chunk cache 256 MiB, best of {reps}",
        logical as f64 / (1u64 << 30) as f64,
        specs.len()
    );

    let store = vec![
        "--job".to_string(),
        JOB.to_string(),
        "--l1".into(),
        l1.display().to_string(),
    ];
    let mnt = dir.join("mnt");
    let (mut export_s, mut cp_s, mut read_s) = (f64::MAX, f64::MAX, f64::MAX);
    let mut file_bytes = 0;
    for _ in 0..reps {
        let out = dir.join("export.safetensors");
        let t0 = Instant::now();
        let st = Command::new(&strata)
            .args(["export", "1", "--rank", "0", "-o"])
            .arg(&out)
            .args(&store)
            .output()
            .map_err(|e| e.to_string())?;
        if !st.status.success() {
            return Err(format!("export: {}", String::from_utf8_lossy(&st.stderr)));
        }
        export_s = export_s.min(t0.elapsed().as_secs_f64());
        // A fresh mount: nothing cached, in the mount or the page cache.
        let m = mount(&strata, &store, &mnt, &[])?;
        let copy = dir.join("cp.safetensors");
        let t0 = Instant::now();
        file_bytes = copy_synced(&m.1.join("latest/rank-0.safetensors"), &copy)?;
        cp_s = cp_s.min(t0.elapsed().as_secs_f64());
        drop(m);
        // Reading alone (no file written): what the mount itself costs.
        let m = mount(&strata, &store, &mnt, &[])?;
        let t0 = Instant::now();
        let st = Command::new("cat")
            .arg(m.1.join("latest/rank-0.safetensors"))
            .stdout(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if !st.success() {
            return Err("cat of the mount's file failed".into());
        }
        read_s = read_s.min(t0.elapsed().as_secs_f64());
        drop(m);
        if std::fs::read(&copy).map_err(|e| e.to_string())?
            != std::fs::read(&out).map_err(|e| e.to_string())?
        {
            return Err("the mount's rank-0.safetensors differs from strata export's".into());
        }
        let _ = std::fs::remove_file(copy);
        let _ = std::fs::remove_file(out);
    }
    println!(
        "  whole shard   cp from the mount {:.3} s ({:.2} GB/s)   strata export {:.3} s ({:.2} GB/s)   ratio {:.2} (goal >= 0.8)",
        cp_s,
        gbs(file_bytes, Duration::from_secs_f64(cp_s)),
        export_s,
        gbs(file_bytes, Duration::from_secs_f64(export_s)),
        export_s / cp_s
    );
    println!(
        "  reading alone  cat from the mount to /dev/null {:.3} s ({:.2} GB/s)",
        read_s,
        gbs(file_bytes, Duration::from_secs_f64(read_s))
    );

    // One tensor from L3 alone.
    let only_l3 = {
        let mut v = vec![
            "--job".to_string(),
            JOB.to_string(),
            "--l3".into(),
            url.clone(),
        ];
        for (k, val) in &opts {
            v.push("--l3-option".into());
            v.push(format!("{k}={val}"));
        }
        v
    };
    let no_l1 = [("STRATA_L1_DIR", dir.join("no-l1").display().to_string())];
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let raw = raw_store(port)?;
    let key = object_store::path::Path::from("raw/tensor");
    rt.block_on(raw.put(&key, Bytes::from(big_bytes.clone()).into()))
        .map_err(|e| e.to_string())?;
    let n = big_bytes.len() as u64;
    let (mut mount_s, mut get_s, mut par_s) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..reps {
        let m = mount(&strata, &only_l3, &mnt, &no_l1)?;
        let path = m.1.join("latest/rank-0").join(&big);
        let t0 = Instant::now();
        let got = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        mount_s = mount_s.min(t0.elapsed().as_secs_f64());
        if got != big_bytes {
            return Err(format!("{big} read from the mount differs"));
        }
        drop(m);
        let t0 = Instant::now();
        let b = rt
            .block_on(raw.get_range(&key, 0..n))
            .map_err(|e| e.to_string())?;
        get_s = get_s.min(t0.elapsed().as_secs_f64());
        assert_eq!(b.len() as u64, n);
        let t0 = Instant::now();
        let piece = 8u64 << 20;
        let total: usize = rt.block_on(
            futures::stream::iter((0..n).step_by(piece as usize).map(|a| {
                let raw = raw.clone();
                let key = key.clone();
                async move {
                    raw.get_range(&key, a..(a + piece).min(n))
                        .await
                        .map(|b| b.len())
                }
            }))
            .buffer_unordered(8)
            .fold(0usize, |acc, r| async move { acc + r.unwrap_or(0) }),
        );
        par_s = par_s.min(t0.elapsed().as_secs_f64());
        assert_eq!(total as u64, n);
    }
    println!(
        "  one tensor from L3 ({}, {:.1} MiB)   mount {:.3} s ({:.2} GB/s)   one ranged GET {:.3} s ({:.2} GB/s)   8 MiB ranges x8 {:.3} s ({:.2} GB/s)   ratio {:.2} / {:.2}",
        big,
        n as f64 / (1 << 20) as f64,
        mount_s,
        gbs(n, Duration::from_secs_f64(mount_s)),
        get_s,
        gbs(n, Duration::from_secs_f64(get_s)),
        par_s,
        gbs(n, Duration::from_secs_f64(par_s)),
        get_s / mount_s,
        par_s / mount_s
    );
    Ok(())
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = s.strip_suffix("gib") {
        (n, 1u64 << 30)
    } else if let Some(n) = s.strip_suffix("mib") {
        (n, 1 << 20)
    } else {
        (s.as_str(), 1)
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("bad size {s:?}"))?;
    Ok((n * mul as f64) as u64)
}

fn main() {
    let mut size = 1u64 << 30;
    let mut reps = 3;
    let mut dir = std::env::temp_dir().join("strata-mount-bench");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--size" => size = parse_size(&v).unwrap_or(size),
            "--reps" => reps = v.parse().unwrap_or(reps),
            "--dir" => dir = PathBuf::from(v),
            _ => {
                eprintln!("mount-bench [--size 1GiB] [--reps 3] [--dir DIR]");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    if let Err(e) = run(size, reps.max(1), &dir) {
        eprintln!("mount-bench: {e}");
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

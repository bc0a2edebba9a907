//! `strata mount` on real FUSE mounts: a store of two ranks and three
//! steps on L1 and on an S3 server (s3s-fs), read with `ls`, `stat`,
//! `cat`, `du` and Python's `safetensors`; writes refused; a damaged
//! chunk is EIO, or read from another tier where there is one; the mount
//! survives a retention run beside it; unmounts are clean.
//!
//! Skips, saying so, without root, `/dev/fuse` or `fusermount3`, unless
//! `STRATA_REQUIRE_FUSE=1` (the test command sets it where it can mount).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry, InProcessCoordinator};
use strata_testkit::servers;

const JOB: &str = "mnt";
const STRATA: &str = env!("CARGO_BIN_EXE_strata");
const PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/mount_read.py");

fn fuse_ready() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root
        && Path::new("/dev/fuse").exists()
        && Command::new("fusermount3")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("STRATA_REQUIRE_FUSE").as_deref() != Ok("1"),
            "FUSE is required (STRATA_REQUIRE_FUSE=1): root, /dev/fuse and fusermount3"
        );
        eprintln!("SKIPPED: mounting needs root, /dev/fuse and fusermount3");
    }
    ok
}

/// The tensors rank `rank` saves at `step`: two float matrices of 2 MiB
/// (two 1 MiB chunks each), one that changes every step, a name that is
/// not a path component, and a blob.
fn tensors(rank: u32, step: u64) -> Vec<(String, DType, Vec<u64>, Vec<u8>)> {
    let f32s = |seed: u64, n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((seed as f32) * 1000.0 + i as f32 * 0.25).to_le_bytes())
            .collect()
    };
    let r = u64::from(rank);
    let mut v: Vec<(String, DType, Vec<u64>, Vec<u8>)> = vec![
        (
            "model.layers.0.weight".into(),
            DType::F32,
            vec![512, 1024],
            f32s(10 + r, 512 * 1024),
        ),
        (
            "model.layers.1.weight".into(),
            DType::F32,
            vec![512, 1024],
            f32s(20 + r * 100 + step, 512 * 1024),
        ),
        (
            "optim/state/../0".into(),
            DType::F32,
            vec![100],
            f32s(30 + r, 100),
        ),
        (
            "extra".into(),
            DType::U8,
            vec![],
            b"dataloader position 17".to_vec(),
        ),
    ];
    // More layers: one tensor is a small part of the shard.
    for i in 4..20u64 {
        v.push((
            format!("model.layers.{i}.weight"),
            DType::F32,
            vec![256, 1024],
            f32s(40 + i + r * 7, 256 * 1024),
        ));
    }
    v
}

/// Saves steps `steps` of two ranks (threads) to `l1`, and to L3 when
/// given (every step uploaded before returning).
fn save(l1: &Path, l3: Option<(&str, &[(String, String)])>, steps: std::ops::RangeInclusive<u64>) {
    let coord = std::sync::Arc::new(InProcessCoordinator::new(2));
    std::thread::scope(|sc| {
        for rank in 0..2u32 {
            let (coord, steps) = (coord.clone(), steps.clone());
            sc.spawn(move || {
                let mut c = Config::builder()
                    .job(JOB)
                    .l1_dir(l1)
                    .rank(rank, 2)
                    .chunk_size(1 << 20)
                    .keep_last(10);
                if let Some((url, opts)) = l3 {
                    c = c.l3_url(url).upload_every(1);
                    for (k, v) in opts {
                        c = c.l3_option(k, v);
                    }
                }
                let ck = Checkpointer::with_coordinator(c, coord).unwrap();
                for step in steps {
                    let t = tensors(rank, step);
                    let entries: Vec<Entry<'_>> = t
                        .iter()
                        .map(|(n, d, s, b)| {
                            if s.is_empty() && *d == DType::U8 {
                                Entry::blob(n, b)
                            } else {
                                Entry::tensor(n, *d, s, b)
                            }
                        })
                        .collect();
                    let h = ck.save(step, &entries).unwrap();
                    h.wait().unwrap();
                    ck.flush().unwrap();
                }
                ck.close().unwrap();
            });
        }
    });
}

/// A `strata mount --foreground` child; unmounted (SIGTERM) on drop.
struct Mounted {
    child: Option<Child>,
    at: PathBuf,
    log: PathBuf,
}

fn mounted(at: &Path) -> bool {
    let want = at.canonicalize().unwrap_or_else(|_| at.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.to_str().unwrap()))
}

fn mount(store: &[String], at: &Path, extra: &[&str]) -> Mounted {
    std::fs::create_dir_all(at).unwrap();
    let log = at.with_extension("log");
    let child = Command::new(STRATA)
        .arg("mount")
        .args(store)
        .args(extra)
        .arg(at)
        .arg("--foreground")
        .env(
            "STRATA_LOG",
            std::env::var("MOUNT_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut m = Mounted {
        child: Some(child),
        at: at.to_path_buf(),
        log,
    };
    let t0 = Instant::now();
    while !mounted(at) {
        if let Some(s) = m.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("strata mount exited ({s}): {}", m.log_text());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not mounted in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

impl Mounted {
    fn path(&self, rel: &str) -> PathBuf {
        self.at.join(rel)
    }

    fn stats(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.path(".stats.json")).unwrap()).unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status; the mount point is a plain directory
    /// again.
    fn stop(&mut self) -> std::process::ExitStatus {
        self.term();
        self.wait_exit()
    }

    fn term(&self) {
        let child = self.child.as_ref().unwrap();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        let t0 = Instant::now();
        loop {
            // (Left in place until it exits: a failing test's drop kills it.)
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no exit 30 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if mounted(&self.at) {
            let _ = Command::new("fusermount3").arg("-u").arg(&self.at).status();
        }
    }
}

fn l1_args(l1: &Path) -> Vec<String> {
    vec![
        "--job".into(),
        JOB.into(),
        "--l1".into(),
        l1.display().to_string(),
    ]
}

fn l3_args(url: &str, opts: &[(String, String)]) -> Vec<String> {
    let mut v = vec!["--l3".into(), url.to_string()];
    for (k, val) in opts {
        v.push("--l3-option".into());
        v.push(format!("{k}={val}"));
    }
    v
}

/// Writes `bytes` of f32 as an .npy file.
fn npy(path: &Path, shape: &[u64], dtype: &str, bytes: &[u8]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut h = format!("{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(bytes);
    std::fs::write(path, out).unwrap();
}

fn python(args: &[&Path]) -> Value {
    let out = Command::new("python3").arg(PY).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn python_ready() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, safetensors.numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("STRATA_REQUIRE_PYTHON").as_deref() != Ok("1"),
            "python3 with numpy and safetensors is required"
        );
        eprintln!("SKIPPED: python3 with numpy and safetensors not found");
    }
    ok
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn a_mount_of_l1_and_s3_shows_every_step_and_rank_with_the_right_bytes() {
    if !fuse_ready() || !python_ready() {
        return;
    }
    let Some(s3) = servers::s3s_fs() else { return };
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    let url = format!("s3://{}/mount", servers::BUCKET);
    let opts = s3.options();
    save(&l1, Some((&url, &opts)), 1..=3);
    let mut store = l1_args(&l1);
    store.extend(l3_args(&url, &opts));
    let mut m = mount(&store, &dir.path().join("mnt"), &[]);

    // The tree.
    assert_eq!(
        names(&m.at),
        [
            ".stats.json",
            "latest",
            "step-000001",
            "step-000002",
            "step-000003"
        ]
    );
    assert_eq!(
        std::fs::read_link(m.path("latest")).unwrap(),
        PathBuf::from("step-000003")
    );
    assert_eq!(
        names(&m.path("latest")),
        [
            "manifest.json",
            "rank-0",
            "rank-0.safetensors",
            "rank-1",
            "rank-1.safetensors"
        ]
    );
    assert_eq!(
        names(&m.path("step-000002/rank-1")),
        [
            "extra",
            "model.layers.0.weight",
            "model.layers.1.weight",
            "model.layers.10.weight",
            "model.layers.11.weight",
            "model.layers.12.weight",
            "model.layers.13.weight",
            "model.layers.14.weight",
            "model.layers.15.weight",
            "model.layers.16.weight",
            "model.layers.17.weight",
            "model.layers.18.weight",
            "model.layers.19.weight",
            "model.layers.4.weight",
            "model.layers.5.weight",
            "model.layers.6.weight",
            "model.layers.7.weight",
            "model.layers.8.weight",
            "model.layers.9.weight",
            "optim%2Fstate%2F..%2F0"
        ]
    );
    // Entry files: their sizes and bytes.
    for step in 1..=3u64 {
        for rank in 0..2u32 {
            for (name, _, _, bytes) in tensors(rank, step) {
                let esc = name.replace('/', "%2F");
                let p = m.path(&format!("step-{step:06}/rank-{rank}/{esc}"));
                assert_eq!(
                    std::fs::metadata(&p).unwrap().len(),
                    bytes.len() as u64,
                    "{p:?}"
                );
                assert!(std::fs::read(&p).unwrap() == bytes, "{p:?}");
            }
        }
    }
    // `cat` and `stat` as people run them.
    let cat = Command::new("cat")
        .arg(m.path("step-000003/rank-1/extra"))
        .output()
        .unwrap();
    assert_eq!(cat.stdout, b"dataloader position 17");
    let stat = Command::new("stat")
        .args(["-c", "%s %A"])
        .arg(m.path("step-000003/rank-0/model.layers.0.weight"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&stat.stdout).trim(),
        "2097152 -r--r--r--"
    );
    // du counts every file: two steps' worth at least per rank file.
    let du = Command::new("du")
        .args(["-sb"])
        .arg(m.path("step-000001"))
        .output()
        .unwrap();
    let du_bytes: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(du_bytes >= 2 * 2 * (4 << 20), "du says {du_bytes}");
    // manifest.json: every rank, every entry with its file.
    let mj: Value =
        serde_json::from_slice(&std::fs::read(m.path("step-000002/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(mj["step"], 2);
    assert_eq!(mj["world_size"], 2);
    let r1 = &mj["ranks"][1];
    assert_eq!(r1["rank"], 1);
    let e = r1["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "optim/state/../0")
        .unwrap();
    assert_eq!(e["path"], "rank-1/optim%2Fstate%2F..%2F0");
    assert_eq!(e["shape"], serde_json::json!([100]));

    // Python's safetensors reads a synthesized file whole, equal.
    let want = dir.path().join("want");
    std::fs::create_dir_all(&want).unwrap();
    for (name, dtype, shape, bytes) in tensors(1, 2) {
        let (d, shape) = if dtype == DType::U8 {
            ("|u1", vec![bytes.len() as u64])
        } else {
            ("<f4", shape)
        };
        npy(
            &want.join(format!("{}.npy", name.replace('/', "%2F"))),
            &shape,
            d,
            &bytes,
        );
    }
    let got = python(&[
        Path::new("load"),
        &m.path("step-000002/rank-1.safetensors"),
        &want,
    ]);
    assert_eq!(got["mismatched"], serde_json::json!([]));

    // safe_open of one tensor of a step not read yet fetches its chunks
    // only (two of 1 MiB); nothing else of the step.
    let before = m.stats();
    let one = want.join("one.npy");
    let (_, _, shape, bytes) = tensors(0, 3).remove(4);
    npy(&one, &shape, "<f4", &bytes);
    // Step 3 rank 0's entry files were read above: use a fresh mount
    // (fresh cache, fresh page cache) for the count.
    drop(before);
    assert!(m.stop().success(), "{}", m.log_text());
    assert!(!mounted(&m.at));
    let m = mount(&store, &dir.path().join("mnt"), &[]);
    let got = python(&[
        Path::new("one"),
        &m.path("step-000003/rank-0.safetensors"),
        Path::new("model.layers.4.weight"),
        &one,
    ]);
    assert_eq!(got["equal"], true);
    // Its chunk; the one the header's read (128 KiB) touches; those the
    // kernel's reads on each side of it touch (128 KiB windows: the tail
    // of `model.layers.1.weight`, the two small entries, the head of
    // `model.layers.5.weight`): never the rest of the shard.
    let (mine, all) = chunks_of(&manifest(&l1, 3, 0), "model.layers.4.weight");
    let st = m.stats();
    let fetched = st["chunks_fetched"].as_u64().unwrap() as usize;
    assert!(
        fetched >= mine && fetched <= mine + 5 && fetched < all / 3,
        "{mine} of {all}: {st}\n{}",
        m.log_text()
    );
    assert_eq!(
        st["chunks_by_tier"]["L1"].as_u64().unwrap() as usize,
        fetched,
        "{st}"
    );

    // Every write is refused with EROFS.
    let erofs = Some(libc::EROFS);
    assert_eq!(errno_of(std::fs::File::create(m.path("new"))), erofs);
    assert_eq!(errno_of(std::fs::create_dir(m.path("latest/dir"))), erofs);
    assert_eq!(
        errno_of(
            std::fs::OpenOptions::new()
                .write(true)
                .open(m.path("latest/manifest.json"))
        ),
        erofs
    );
    assert_eq!(
        errno_of(std::fs::remove_file(m.path("latest/rank-0.safetensors"))),
        erofs
    );
    assert_eq!(
        errno_of(std::fs::rename(
            m.path("step-000001"),
            m.path("step-000009")
        )),
        erofs
    );
    drop(m);
}

#[test]
fn a_mount_of_l3_alone_fetches_only_the_chunks_read() {
    if !fuse_ready() || !python_ready() {
        return;
    }
    let Some(s3) = servers::s3s_fs() else { return };
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    let url = format!("s3://{}/l3only", servers::BUCKET);
    let opts = s3.options();
    save(&l1, Some((&url, &opts)), 1..=2);
    let saved = manifest(&l1, 2, 1);
    std::fs::remove_dir_all(&l1).unwrap();
    let mut store = vec!["--job".to_string(), JOB.to_string()];
    store.extend(l3_args(&url, &opts));
    let m = mount(&store, &dir.path().join("mnt"), &[]);
    assert_eq!(names(&m.path("latest")).len(), 5);
    let one = dir.path().join("one.npy");
    let (_, _, shape, bytes) = tensors(1, 2).remove(4);
    npy(&one, &shape, "<f4", &bytes);
    let got = python(&[
        Path::new("one"),
        &m.path("step-000002/rank-1.safetensors"),
        Path::new("model.layers.4.weight"),
        &one,
    ]);
    assert_eq!(got["equal"], true);
    let (mine, all) = chunks_of(&saved, "model.layers.4.weight");
    let st = m.stats();
    let fetched = st["chunks_by_tier"]["L3"].as_u64().unwrap() as usize;
    assert_eq!(
        st["chunks_fetched"].as_u64().unwrap() as usize,
        fetched,
        "{st}"
    );
    assert!(
        fetched >= mine && fetched <= mine + 5 && fetched < all / 3,
        "{mine} of {all}: {st}\n{}",
        m.log_text()
    );
    // The other file of the step is still whole and right.
    let raw = std::fs::read(m.path("step-000002/rank-0/model.layers.1.weight")).unwrap();
    assert!(raw == tensors(0, 2)[1].3);
}

/// Rank `rank`'s manifest of `step` on L1.
fn manifest(l1: &Path, step: u64, rank: u32) -> strata::format::ShardManifest {
    let cfg = Config::builder().job(JOB).l1_dir(l1);
    let t = strata::tiers::Tiers::open(cfg, true).unwrap();
    let all: Vec<_> = t.tiers().iter().collect();
    let cat = t.catalog(&all);
    let r = t.shard_reader(&cat, step, rank, false, 0).unwrap();
    r.manifest().clone()
}

/// How many chunks `entry` of the manifest touches, and the shard's total.
fn chunks_of(m: &strata::format::ShardManifest, entry: &str) -> (usize, usize) {
    let mut ids: Vec<u32> = m
        .entry(entry)
        .unwrap()
        .segments
        .iter()
        .map(|s| s.chunk)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    (ids.len(), m.chunks.len())
}

/// The L1 chunk file holding the first byte of `entry` of `rank`'s shard of
/// `step`.
fn l1_chunk_of(l1: &Path, step: u64, rank: u32, entry: &str) -> PathBuf {
    let m = manifest(l1, step, rank);
    let e = m.entry(entry).unwrap();
    let id = m.chunks[e.segments[0].chunk as usize].id;
    let hex = id.to_hex();
    l1.join(JOB).join("chunks").join(&hex[..2]).join(hex)
}

#[test]
fn a_damaged_chunk_is_eio_alone_and_read_from_l3_where_it_holds_one() {
    if !fuse_ready() {
        return;
    }
    let Some(s3) = servers::s3s_fs() else { return };
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    let url = format!("s3://{}/damage", servers::BUCKET);
    let opts = s3.options();
    save(&l1, Some((&url, &opts)), 1..=1);
    let chunk = l1_chunk_of(&l1, 1, 0, "model.layers.1.weight");
    let mut b = std::fs::read(&chunk).unwrap();
    b[1000] ^= 0xff;
    std::fs::write(&chunk, &b).unwrap();
    let want = &tensors(0, 1)[1].3;

    // L1 alone: that read is EIO and logged; the rest of the shard reads.
    let mut m = mount(&l1_args(&l1), &dir.path().join("mnt1"), &[]);
    let p = m.path("step-000001/rank-0/model.layers.1.weight");
    assert_eq!(errno_of(std::fs::read(&p)), Some(libc::EIO));
    assert!(
        std::fs::read(m.path("step-000001/rank-0/model.layers.0.weight")).unwrap()
            == tensors(0, 1)[0].3
    );
    // (The kernel may ask again, or read ahead into the damaged chunk.)
    assert!(m.stats()["read_errors"].as_u64().unwrap() >= 1);
    assert!(m.stop().success());
    let log = m.log_text();
    assert!(
        log.contains("model.layers.1.weight") && log.to_lowercase().contains("corrupt"),
        "{log}"
    );

    // With L3 beside it: the right bytes, from L3.
    let mut store = l1_args(&l1);
    store.extend(l3_args(&url, &opts));
    let m = mount(&store, &dir.path().join("mnt2"), &[]);
    let got = std::fs::read(m.path("step-000001/rank-0/model.layers.1.weight")).unwrap();
    assert!(got == *want);
    let st = m.stats();
    assert!(st["fallbacks"].as_u64().unwrap() >= 1, "{st}");
    assert!(st["chunks_by_tier"]["L3"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["read_errors"], 0);
}

#[test]
fn the_mount_survives_retention_beside_it_and_sees_new_steps() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    save(&l1, None, 1..=3);
    let m = mount(
        &l1_args(&l1),
        &dir.path().join("mnt"),
        &["--refresh", "0.2"],
    );
    // A file of step 1 held open, part read.
    let mut f = std::fs::File::open(m.path("step-000001/rank-0.safetensors")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact(&mut head).unwrap();
    let whole = std::fs::metadata(m.path("step-000001/rank-0.safetensors"))
        .unwrap()
        .len();
    // Retention beside the mount: keep the newest step only.
    let gc = Command::new(STRATA)
        .arg("gc")
        .args(l1_args(&l1))
        .args(["--keep-last", "1", "--grace", "0"])
        .output()
        .unwrap();
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(names(&m.at), [".stats.json", "latest", "step-000003"]);
    assert!(!m.path("step-000001").exists());
    // The open file: the rest reads as it was, or fails with EIO; never
    // other bytes.
    let mut rest = Vec::new();
    match f.read_to_end(&mut rest) {
        Ok(n) => assert_eq!(4096 + n as u64, whole),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
    }
    // A new step appears.
    save(&l1, None, 4..=4);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        std::fs::read_link(m.path("latest")).unwrap(),
        PathBuf::from("step-000004")
    );
    assert!(
        std::fs::read(m.path("latest/rank-1/model.layers.1.weight")).unwrap() == tensors(1, 4)[1].3
    );
}

#[test]
fn strata_umount_ends_a_background_mount_and_bad_mounts_fail_clearly() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1");
    save(&l1, None, 1..=1);
    let at = dir.path().join("mnt");
    std::fs::create_dir_all(&at).unwrap();
    let out = Command::new(STRATA)
        .arg("mount")
        .args(l1_args(&l1))
        .arg(&at)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mounted(&at));
    assert_eq!(names(&at.join("latest")).len(), 5);
    // Mounting again on it is refused, in one line.
    let again = Command::new(STRATA)
        .arg("mount")
        .args(l1_args(&l1))
        .arg(&at)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already a mount point"));
    let um = Command::new(STRATA)
        .arg("umount")
        .arg(&at)
        .output()
        .unwrap();
    assert!(
        um.status.success(),
        "{}",
        String::from_utf8_lossy(&um.stderr)
    );
    assert!(!mounted(&at));
    assert!(names(&at).is_empty());
    // Nothing mounted there any more: exit 4.
    let um = Command::new(STRATA)
        .arg("umount")
        .arg(&at)
        .output()
        .unwrap();
    assert_eq!(um.status.code(), Some(4));
    // A mount killed outright leaves no dead mount behind (its watcher
    // unmounts it).
    let mut m = mount(&l1_args(&l1), &at, &[]);
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    while mounted(&at) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "a dead mount stayed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(names(&at).is_empty());
    drop(m);
    // A store with no tier: a clear error, nothing mounted.
    let none = Command::new(STRATA)
        .args(["mount", "--job", JOB, "--l1"])
        .arg(dir.path().join("missing"))
        .arg(&at)
        .output()
        .unwrap();
    assert!(!none.status.success());
    assert!(!mounted(&at));
}

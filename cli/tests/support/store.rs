//! The store the inspection tests run the binary on: steps 1..=3 written
//! by the library to an L1 directory and an L3 object store (a local
//! directory behind `object_store`), and the helpers that run the binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use strata::format::DType;
use strata::{Checkpointer, Config, Entry};

use super::find;

pub(crate) const JOB: &str = "insp";

/// A store with steps 1..=3 on L1 and L3. Step 2 changes `layer.1.w`;
/// step 3 also adds `extra.bias` and drops `old.scale`.
pub(crate) struct Store {
    _dir: tempfile::TempDir,
    pub(crate) l1: PathBuf,
    pub(crate) l3: PathBuf,
}

pub(crate) fn tensor(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Small-magnitude values: compressible like real weights.
            (x >> 60) as u8
        })
        .collect()
}

pub(crate) fn cfg(l1: &Path, l3: &Path) -> Config {
    Config::builder()
        .job(JOB)
        .l1_dir(l1)
        .chunk_size(1 << 20)
        .keep_last(10)
        .l3_url(format!("file://{}", l3.display()))
        .upload_every(1)
}

impl Store {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (l1, l3) = (dir.path().join("l1"), dir.path().join("l3"));
        std::fs::create_dir_all(&l3).unwrap();
        let ck = Checkpointer::new(cfg(&l1, &l3)).unwrap();
        for step in 1..=3u64 {
            let w0 = tensor(1, 3 << 20);
            let w1 = tensor(if step >= 2 { 20 + step } else { 2 }, 2 << 20);
            let bias = tensor(3, 4096);
            let extra = tensor(4, 8192);
            let scale = tensor(5, 64);
            let opt = tensor(6, 1000);
            let shape0 = [768u64, 1024];
            let shape1 = [1024u64, 1024];
            let shape_b = [1024u64];
            let shape_e = [2048u64];
            let shape_s = [16u64];
            let mut entries = vec![
                Entry::tensor("layer.0.w", DType::F32, &shape0, &w0),
                Entry::tensor("layer.1.w", DType::BF16, &shape1, &w1),
                Entry::tensor("layer.1.b", DType::F32, &shape_b, &bias),
                Entry::blob("optimizer.state", &opt),
            ];
            if step == 3 {
                entries.push(Entry::tensor("extra.bias", DType::F32, &shape_e, &extra));
            } else {
                entries.push(Entry::tensor("old.scale", DType::F32, &shape_s, &scale));
            }
            let meta = [("arch".to_string(), "tiny".to_string())].into();
            ck.save_with_metadata(step, &entries, meta)
                .unwrap()
                .wait()
                .unwrap();
        }
        drop(ck); // waits for the uploads
        Store { _dir: dir, l1, l3 }
    }

    pub(crate) fn args(&self) -> Vec<String> {
        vec![
            "--job".into(),
            JOB.into(),
            "--l1".into(),
            self.l1.display().to_string(),
            "--l3".into(),
            format!("file://{}", self.l3.display()),
        ]
    }

    pub(crate) fn run(&self, cmd: &[&str]) -> Out {
        let mut all: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        all.extend(self.args());
        run(&all)
    }

    /// The L1 file of the `i`-th chunk of step `step`'s manifest.
    pub(crate) fn l1_chunk(&self, step: u64, i: usize) -> (PathBuf, String) {
        let out = self.run(&["show", &step.to_string(), "--tier", "l1", "--json"]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let _ = out;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let l1 = strata::tiered::L1Store::open(&self.l1, "psync".parse().unwrap()).unwrap();
        use strata::tiered::ChunkStore;
        let m = strata::format::ShardManifest::decode(
            &rt.block_on(l1.get_manifest(JOB, step, 0)).unwrap(),
        )
        .unwrap();
        let id = m.chunks[i].id;
        (l1.chunk_path(JOB, &id), id.to_hex())
    }

    /// The L3 object of chunk `hex`.
    pub(crate) fn l3_chunk(&self, hex: &str) -> PathBuf {
        find(&self.l3, hex).unwrap_or_else(|| panic!("no object {hex} under L3"))
    }
}

pub(crate) struct Out {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Out {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: not JSON:\n{}\n{}", self.stdout, self.stderr))
    }
}

pub(crate) fn run(args: &[String]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env_remove("STRATA_L1_DIR")
        .env_remove("STRATA_JOB")
        .env_remove("STRATA_L3_URL")
        .env_remove("STRATA_PEERS")
        .output()
        .unwrap();
    let o = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    assert!(
        !o.stderr.contains("panicked") && !o.stderr.contains("RUST_BACKTRACE"),
        "{}",
        o.stderr
    );
    o
}

/// Every file under `dir` with its bytes, to prove a command wrote nothing.
pub(crate) fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

//! `strata export` and `import` against the reference Python `safetensors`
//! package (tests/python/safetensors_roundtrip.py). Skips, saying so, when
//! Python with numpy and safetensors is missing, unless
//! `STRATA_REQUIRE_PYTHON=1` (the test command sets it and installs them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use strata::format::DType;
use strata::{Checkpointer, Config, Entry};

fn python_ready() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy, safetensors.numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn python_safetensors_loads_exports_and_imports_round_trip() {
    if !python_ready() {
        assert!(
            std::env::var("STRATA_REQUIRE_PYTHON").as_deref() != Ok("1"),
            "python3 with numpy and safetensors is required (STRATA_REQUIRE_PYTHON=1)"
        );
        eprintln!("SKIPPED: python3 with numpy and safetensors not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib_l1 = dir.path().join("lib-l1");
    {
        let ck = Checkpointer::new(Config::builder().job("lib").l1_dir(&lib_l1)).unwrap();
        let f32s: Vec<u8> = (0..4096)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect();
        let i64s: Vec<u8> = (0..300i64).flat_map(|i| (-i).to_le_bytes()).collect();
        let u8s: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let (s1, s2, s3) = ([64u64, 64], [300u64], [50u64, 100]);
        ck.save(
            3,
            &[
                Entry::tensor("w.f32", DType::F32, &s1, &f32s),
                Entry::tensor("w.i64", DType::I64, &s2, &i64s),
                Entry::tensor("w.u8", DType::U8, &s3, &u8s),
            ],
        )
        .unwrap()
        .wait()
        .unwrap();
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/safetensors_roundtrip.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_strata"))
        .arg(dir.path())
        .arg(&lib_l1)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok: 8 arrays"), "{stdout}");
}

"""Export and import against the reference `safetensors` package (numpy).

Run by cli/tests/safetensors_python.rs:
    safetensors_roundtrip.py STRATA_BIN WORKDIR LIBRARY_L1

1. Arrays made here are saved with safetensors.numpy.save_file, imported
   with `strata import`, exported with `strata export`, loaded back with
   safetensors.numpy.load_file: same dtypes, shapes, values and metadata.
2. A checkpoint written by the Rust library (job "lib", step 3, in
   LIBRARY_L1) is exported and compared with the arrays it was made from.
"""

import json
import os
import subprocess
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def strata(binary, *args):
    out = subprocess.run([binary, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"strata {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return out.stdout


def same(name, want, got):
    if want.dtype != got.dtype or want.shape != got.shape:
        sys.exit(f"{name}: {want.dtype}{want.shape} became {got.dtype}{got.shape}")
    if want.tobytes() != got.tobytes():
        sys.exit(f"{name}: values differ")


def main():
    binary, work, lib_l1 = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = np.random.default_rng(7)
    arrays = {
        "embed.weight": rng.standard_normal((512, 64)).astype(np.float16),
        "layer.0.w": rng.standard_normal((256, 256)).astype(np.float32),
        "layer.0.b": rng.standard_normal(256).astype(np.float64),
        "step_count": np.array(1234, dtype=np.int64),
        "mask": rng.random((33, 7)) > 0.5,
        "tokens": rng.integers(-128, 127, size=(1000,), dtype=np.int8),
        "ids": rng.integers(0, 2**31, size=(17, 3), dtype=np.uint32),
        "big": rng.standard_normal((1024, 1024)).astype(np.float32),
    }
    metadata = {"format": "np", "source": "python", "note": "ünïcode ok"}
    a = os.path.join(work, "from_python.safetensors")
    b = os.path.join(work, "exported.safetensors")
    l1 = os.path.join(work, "l1")
    save_file(arrays, a, metadata=metadata)
    store = ["--job", "py", "--l1", l1]
    strata(binary, "import", a, "--step", "1", *store)
    summary = json.loads(strata(binary, "export", "1", "-o", b, "--json", *store))
    if summary["tensors"] != len(arrays):
        sys.exit(f"exported {summary['tensors']} tensors, expected {len(arrays)}")
    back = load_file(b)
    if sorted(back) != sorted(arrays):
        sys.exit(f"names {sorted(back)} != {sorted(arrays)}")
    for name, want in arrays.items():
        same(name, want, back[name])
    with safe_open(b, framework="np") as f:
        if f.metadata() != metadata:
            sys.exit(f"metadata {f.metadata()} != {metadata}")

    # A checkpoint the Rust library wrote.
    c = os.path.join(work, "library.safetensors")
    strata(binary, "export", "3", "-o", c, "--job", "lib", "--l1", lib_l1)
    lib = load_file(c)
    want = {
        "w.f32": (np.arange(4096, dtype=np.float32) * 0.5).reshape(64, 64),
        "w.i64": -np.arange(300, dtype=np.int64),
        "w.u8": (np.arange(5000) % 251).astype(np.uint8).reshape(50, 100),
    }
    for name, w in want.items():
        same(name, w, lib[name])
    print(f"ok: {len(arrays)} arrays through import/export, {len(want)} from the library")


if __name__ == "__main__":
    main()

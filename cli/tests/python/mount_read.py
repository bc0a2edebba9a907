"""Reads a strata mount the way people do, with the reference packages.

    python3 mount_read.py load FILE.safetensors EXPECTED_DIR
        load_file equals every tensor saved as EXPECTED_DIR/<name>.npy
    python3 mount_read.py one FILE.safetensors NAME EXPECTED.npy
        safe_open reads one tensor, equal to EXPECTED.npy

Prints one JSON line: what was compared. Exits 1 on a mismatch.
"""

import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "load":
        got = load_file(sys.argv[2])
        want = {
            f[:-4].replace("%2F", "/"): np.load(os.path.join(sys.argv[3], f))
            for f in os.listdir(sys.argv[3])
            if f.endswith(".npy")
        }
        bad = [k for k in want if k not in got or not np.array_equal(got[k], want[k])]
        print(json.dumps({"tensors": sorted(got), "mismatched": bad}))
        return 1 if bad or set(got) != set(want) else 0
    if cmd == "one":
        with safe_open(sys.argv[2], framework="np") as f:
            t = f.get_tensor(sys.argv[3])
        want = np.load(sys.argv[4])
        ok = t.dtype == want.dtype and np.array_equal(t, want)
        print(json.dumps({"tensor": sys.argv[3], "equal": bool(ok), "shape": list(t.shape)}))
        return 0 if ok else 1
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())

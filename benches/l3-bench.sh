#!/usr/bin/env bash
# L3 benchmark on a local s3s-fs server: installs s3s-fs under .tools/ if
# missing, fetches the real weights if missing, then runs l3-bench.
#   benches/l3-bench.sh [--size 1GiB] [--reps 2] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PATH"
if ! command -v s3s-fs >/dev/null 2>&1; then
  cargo install s3s-fs@0.14.1 --features binary --locked --root "$PWD/.tools"
fi
[ -f benches/data/model.safetensors ] || benches/fetch-weights.sh || true
cargo run --release --locked -p strata-benches --bin l3-bench -- "$@"

#!/usr/bin/env bash
# strata mount benchmark: cp of a synthesized safetensors file from the
# mount vs strata export, and one tensor from L3 through the mount vs
# ranged GETs (s3s-fs on loopback, installed under .tools/ if missing).
# Needs FUSE (root, /dev/fuse).
#   benches/mount-bench.sh [--size 1GiB] [--reps 3] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PATH"
if ! command -v s3s-fs >/dev/null 2>&1; then
  cargo install s3s-fs@0.14.1 --features binary --locked --root "$PWD/.tools"
fi
cargo build --release --locked -p strata-cli -p strata-benches --bin strata --bin mount-bench
exec target/release/mount-bench "$@"

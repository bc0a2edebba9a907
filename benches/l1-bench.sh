#!/usr/bin/env bash
# L1 benchmark with its baselines: installs fio (Debian) and the Python
# safetensors + numpy packages if missing, then runs l1-bench.
#   benches/l1-bench.sh [--dir DIR] [--size 2GiB] [--reps 3] [--overlap on|off]
# DIR must be on the disk to measure (default: ./strata-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v fio >/dev/null 2>&1; then
  (apt-get install -y fio || (apt-get update && apt-get install -y fio)) >/dev/null
fi
if ! python3 -c 'import numpy, safetensors' 2>/dev/null; then
  python3 -m pip install --quiet numpy safetensors 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages numpy safetensors
fi
cargo run --release --locked -p strata-benches --bin l1-bench -- "$@"

#!/usr/bin/env bash
# L2 benchmark: builds the strata binary, then pushes to and restores from a
# `strata peer serve` process, against raw quinn transfers to a
# `strata peer sink` process, on loopback.
#   benches/l2-bench.sh [--size 2GiB] [--reps 2] [--dir DIR] [--prefault SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p strata-cli
cargo run --release --locked -p strata-benches --bin l2-bench -- "$@"

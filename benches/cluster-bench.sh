#!/usr/bin/env bash
# Cluster benchmark: barrier + commit per step with 2, 6 and 12 rank
# processes (etcd), and a node's loss to its replacement training again
# against a raw QUIC download of the same bytes. Needs etcd (Debian's
# etcd-server) and s3s-fs (scripts/test.sh installs it under .tools/).
#   benches/cluster-bench.sh [--steps 10] [--size 256MiB] [--dir DIR]
#     [--worlds 2,6,12] [--ranks-per-node 2] [--no-node-loss]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PATH"
if ! command -v etcd >/dev/null 2>&1; then
  (apt-get install -y -qq etcd-server || (apt-get update -qq && apt-get install -y -qq etcd-server)) >/dev/null
fi
cargo build --release --locked -p strata-cli
cargo run --release --locked -p strata-benches --bin cluster-bench -- "$@"

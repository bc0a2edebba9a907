#!/usr/bin/env bash
# Scale benchmark: the commit and restore protocol at N simulated ranks
# (strata-sim: real Checkpointers on threads, a node's ranks sharing one
# etcd client) against one real etcd started on this machine. The last
# line is the summary (barrier + commit median and p99, etcd requests per
# round, restore agreement, L3 listings per restore).
#   benches/scale-bench.sh --ranks N [--ranks-per-node 8] [--steps 10] [--faults 0]
# Thousands of ranks need thousands of threads: as root it raises the
# kernel's pid and memory-map limits for the run if they are too low.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PATH"
if ! command -v etcd >/dev/null 2>&1; then
  (apt-get install -y -qq etcd-server || (apt-get update -qq && apt-get install -y -qq etcd-server)) >/dev/null
fi
if [ "$(id -u)" = 0 ]; then
  [ "$(cat /proc/sys/kernel/pid_max)" -ge 262144 ] || sysctl -qw kernel.pid_max=262144 || true
  [ "$(cat /proc/sys/vm/max_map_count)" -ge 1048576 ] || sysctl -qw vm.max_map_count=1048576 || true
  [ "$(cat /proc/sys/kernel/threads-max)" -ge 262144 ] || sysctl -qw kernel.threads-max=262144 || true
fi
ulimit -u unlimited 2>/dev/null || true
cargo build --release --locked -p strata-benches --bin scale-bench
exec target/release/scale-bench "$@"

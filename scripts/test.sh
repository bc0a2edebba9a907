#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh machine:
#   installs what the tests need, then cargo fmt --check, clippy -D warnings,
#   a build of the fuzz targets, the doc tests, and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

log "toolchain"
cargo --version
# Incremental caches only help rebuilds; a CI run on a fresh clone pays their
# disk (GBs) for nothing. Free space is printed so a full disk is plain to see.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
df -h . | tail -1
for c in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep "^$c" >/dev/null; then
    rustup component add "$c"
  fi
done
if ! command -v cargo-nextest >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

log "test servers: s3s-fs (authenticated S3) and moto (exclusive create-if-absent)"
# Installed under .tools/ (git-ignored) so reruns skip the build.
TOOLS="$PWD/.tools"
export PATH="$TOOLS/bin:$HOME/.local/bin:$PATH"
if ! command -v s3s-fs >/dev/null 2>&1; then
  cargo install s3s-fs@0.14.1 --features binary --locked --root "$TOOLS"
fi
if ! command -v moto_server >/dev/null 2>&1; then
  python3 -m pip install --quiet 'moto[server]' 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages 'moto[server]'
fi
command -v s3s-fs moto_server

log "python: numpy and safetensors (the export/import test against the reference package)"
if ! python3 -c 'import numpy, safetensors.numpy' 2>/dev/null; then
  python3 -m pip install --quiet numpy safetensors 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages numpy safetensors
fi
python3 -c 'import numpy, safetensors; print("numpy", numpy.__version__, "safetensors", safetensors.__version__)'
export STRATA_REQUIRE_PYTHON=1
# The L3 tests fail (instead of skipping) if a server is missing.
export STRATA_REQUIRE_SERVERS=1

log "etcd (the cross-process coordinator's tests run a real server)"
if ! command -v etcd >/dev/null 2>&1; then
  (apt-get install -y -qq etcd-server || (apt-get update -qq && apt-get install -y -qq etcd-server)) >/dev/null
fi
# Not `| head -1`: under pipefail, etcd writing its later lines into a closed
# pipe ends in SIGPIPE and fails the whole run (exit 141).
etcd_version=$(etcd --version)
echo "${etcd_version%%$'\n'*}"
export STRATA_REQUIRE_ETCD=1

log "iproute2 (the network-namespace test; it skips without root or ip netns)"
if ! command -v ip >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq iproute2) \
    || echo "iproute2 unavailable: the network-namespace test will say SKIPPED"
fi
# As root with iproute2 the network-namespace test must run, not skip.
if [ "$(id -u)" = 0 ] && ip netns list >/dev/null 2>&1; then
  export STRATA_REQUIRE_NETNS=1
fi

log "fuse3 (the strata mount tests mount real FUSE file systems)"
if ! command -v fusermount3 >/dev/null 2>&1; then
  (apt-get install -y -qq fuse3 || (apt-get update -qq && apt-get install -y -qq fuse3)) >/dev/null \
    || echo "fuse3 unavailable: the mount tests will say SKIPPED"
fi
# As root with /dev/fuse and fusermount3 the mount tests must run, not skip.
if [ "$(id -u)" = 0 ] && [ -c /dev/fuse ] && (exec 3<>/dev/fuse) 2>/dev/null \
  && command -v fusermount3 >/dev/null 2>&1; then
  export STRATA_REQUIRE_FUSE=1
fi
if [ "${STRATA_REQUIRE_FUSE:-}" = 1 ]; then
  echo "mount tests: required"
else
  echo "mount tests: may skip (no root, /dev/fuse or fusermount3)"
fi

log "python: a venv with torch (CPU use of the PyPI build), numpy, pytest; the strata package"
# torch is ~5 GB: the venv lives outside the repo and is reused when present.
VENV="${STRATA_VENV:-$HOME/.cache/strata/venv}"
if ! "$VENV/bin/python" -c 'import torch, numpy, pytest' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet 'torch==2.15.*' 'numpy<3' 'pytest>=7' 'maturin>=1.9,<2'
fi
"$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "gloo", torch.distributed.is_gloo_available())'
# The mount's DCP test reads model.safetensors with the reference package.
"$VENV/bin/python" -c 'import safetensors' 2>/dev/null || "$VENV/bin/pip" install --quiet 'safetensors>=0.4'
# What a user runs: pip builds the extension (maturin, release) and installs it.
"$VENV/bin/pip" install --quiet ./python
export STRATA_PYTHON="$VENV/bin/python" STRATA_REQUIRE_TORCH=1

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (workspace, all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked --features strata-peer/fuzzing -- -D warnings

log "cargo clippy --features cuda (the GPU path compiles without a toolkit or driver)"
cargo clippy -p strata -p strata-python --all-targets --features cuda --locked -- -D warnings

log "fuzz targets compile"
# Stable toolchain: this checks the targets' code; running them needs cargo-fuzz.
cargo check --manifest-path fuzz/Cargo.toml --locked --bins

log "doc tests"
cargo test --workspace --doc --locked

log "tests"
# With the peer protocol's conversation harness (a feature of its own).
cargo nextest run --workspace --locked --no-fail-fast --features strata-peer/fuzzing

log "deploy/ (Kubernetes manifests against the 1.30 schemas, the dashboard's series, the systemd unit's flags)"
"$STRATA_PYTHON" -c 'import kubernetes_validate' 2>/dev/null \
  || "$VENV/bin/pip" install --quiet 'kubernetes-validate>=1.30,<2'
"$STRATA_PYTHON" deploy/check.py target/debug/strata

log "python tests (pytest: round trips, torchrun with gloo, a rank killed mid-save, the example killed and resumed)"
# From the tests' directory, so the installed package is imported, not the source tree.
(cd python/tests && "$STRATA_PYTHON" -m pytest -q -p no:cacheprovider .)

log "Slurm: a real Slurm here (scripts/slurm-up.sh: this host, and two nodes as slurmds of their own); srun strata rank, srun train.py, slurm peers, deploy/slurm's sbatch and prolog/epilog"
# As root, Slurm must come up and every part must pass, as with the
# STRATA_REQUIRE_* tests; without root (installing and starting slurmctld,
# slurmd and munged needs it) the block says SKIPPED.
if [ "$(id -u)" = 0 ]; then
  scripts/slurm-test.sh target/debug/strata "$STRATA_PYTHON"
else
  echo "Slurm tests SKIPPED: not root (scripts/slurm-up.sh installs and starts Slurm and munge)"
fi

log "GPU tests with --features cuda (prints whether the GPU path ran or why it was skipped)"
cargo nextest run -p strata --features cuda --locked --no-capture --test gpu

log "disk used by the build"
du -sh target 2>/dev/null || true
df -h . | tail -1

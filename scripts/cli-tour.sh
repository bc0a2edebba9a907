#!/usr/bin/env bash
# A tour of the inspection commands on a real store: the demo writes three
# steps to L1 and L3 (then loses L1 and restores the newest step from L3),
# and each command runs on the result; one L1 chunk is then damaged,
# found, and repaired from L3. The README's CLI tour is this script's output.
#   scripts/cli-tour.sh [DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
D=${1:-strata-tour}
rm -rf "$D"
cargo build --release --locked -q -p strata-cli
S=target/release/strata
run() { echo "\$ strata $*"; "$S" "$@"; echo "[exit $?]"; }
"$S" demo --dir "$D" --state-size 256MiB --steps 3 --no-codecs --no-peers \
  --upload-every 1 --keep-last 3 >/dev/null
export STRATA_JOB=demo STRATA_L1_DIR="$D" STRATA_L3_URL="file://$(realpath "$D")/l3-objects"
echo "# STRATA_JOB=demo STRATA_L1_DIR=$D STRATA_L3_URL=file://.../l3-objects"
run ls
run show 3 --tier l3
run diff 2 3
run stat
run verify --all
f=$(find "$D/demo/chunks" -type f | sort | sed -n 1p)
dd if=/dev/urandom of="$f" bs=16 count=1 seek=10 conv=notrunc status=none
echo "# (16 bytes of one L1 chunk file overwritten)"
run verify
run verify --repair
run verify
run export 3 -o "$D/step3.safetensors"
run import "$D/step3.safetensors" --step 1 --job imported
run ls --job imported

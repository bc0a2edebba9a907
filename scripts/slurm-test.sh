#!/usr/bin/env bash
# Strata under a real Slurm (scripts/slurm-up.sh: this machine as node of
# partition "debug", and partition "pair" of two nodes, strata-n1 and
# strata-n2, each a slurmd of its own on this host with an address of its
# own), every rank configured by what srun and sbatch set (SLURM_PROCID,
# SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST,
# SLURMD_NODENAME), nothing mapped by hand:
#
#   a) srun -n 4 strata rank: 4 ranks sharing the node's L1 directory agree
#      through etcd, save and commit 3 steps; a second srun resumes after
#      the last committed step, saves 3 more and verifies every byte.
#   b) srun -n 2 python examples/train.py: torch.distributed (gloo) from
#      Slurm's variables, Strata through its store; run again, it resumes
#      from the last step, and its loss curve equals an uninterrupted run's
#      bit for bit.
#   c) peers = ["slurm:PORT"]: under srun the list is SLURM_JOB_NODELIST
#      expanded and the node is named SLURMD_NODENAME; on one node, ranks
#      save with it, `strata ls` lists the node's peer service and nothing
#      is replicated (a node is never its own replica); outside Slurm the
#      setting is refused naming SLURM_JOB_NODELIST. On two nodes
#      (strata-n[1-2]), 4 ranks replicate each node's steps to the other's
#      service; one node's L1 deleted, its ranks resume from the other.
#   d) deploy/slurm/train.sbatch under sbatch on the two nodes: a peer
#      service step (one per node), training, a clean SIGTERM stop of the
#      peers; submitted again, the peers reload their replicas and training
#      resumes; a third job sent SIGTERM (what its --signal=B:TERM@300
#      does) stops training, then the peers.
#   e) deploy/slurm/strata-peer-{prolog,epilog}.sh as the cluster's prolog
#      and epilog: the service starts with a job and stops after it; the
#      replicas it held are reloaded by the next job's service and a rank
#      whose L1 is gone restores from it.
#
#   scripts/slurm-test.sh [STRATA_BINARY [PYTHON]]
#
# Defaults: target/debug/strata, $STRATA_PYTHON or ~/.cache/strata/venv/bin/python
# (with torch, numpy and the strata package). Root only (it runs
# slurm-up.sh). Prints PASS or FAIL per part and exits 1 if any failed.
# Every srun and sbatch runs under a timeout (SLURM_TEST_TIMEOUT seconds,
# default 240); etcd, peer services and temporary files are removed at exit
# (SLURM_TEST_KEEP=1 keeps the files). SLURM_TEST_PARTS="a c" runs some.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

BIN=${1:-${STRATA_BIN:-target/debug/strata}}
PY=${2:-${STRATA_PYTHON:-$HOME/.cache/strata/venv/bin/python}}
TIMEOUT=${SLURM_TEST_TIMEOUT:-240}
KEEP=${SLURM_TEST_KEEP:-}
PARTS=${SLURM_TEST_PARTS:-a b c d e}
MINUTES=$(((TIMEOUT + 59) / 60 + 1))
TAG="strata-test-$$"
started=$(date +%s)

say() { printf 'slurm-test: %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { say "FAIL: needs root (scripts/slurm-up.sh installs and starts Slurm)"; exit 1; }
[ -x "$BIN" ] || { say "FAIL: no strata binary at $BIN (cargo build -p strata-cli)"; exit 1; }
BIN=$(realpath "$BIN")
PY=$(command -v "$PY" || true)
[ -n "$PY" ] && "$PY" -c 'import strata, torch' 2>/dev/null \
  || { say "FAIL: ${2:-${STRATA_PYTHON:-the venv python}} cannot import strata and torch"; exit 1; }
command -v etcd >/dev/null 2>&1 || { say "FAIL: etcd not found (apt-get install etcd-server)"; exit 1; }

# Only Slurm's variables, as srun sets them, configure the ranks: nothing
# from an outer allocation, torchrun or STRATA_* settings of the caller
# (this script's own SLURM_TEST_* were read above).
while IFS= read -r v; do
  case $v in
    SLURM_* | SBATCH_* | SALLOC_* | SRUN_* | SQUEUE_* | SACCT_*) unset "$v" ;;
    STRATA_LOG | STRATA_REQUIRE_* | STRATA_PYTHON | STRATA_BIN | STRATA_QUIC_MTU) ;;
    STRATA_*) unset "$v" ;;
  esac
done < <(compgen -e)
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK ROLE_RANK MASTER_ADDR MASTER_PORT \
  TORCHELASTIC_RESTART_COUNT
export STRATA_LOG=${STRATA_LOG:-warn}

if ! "$ROOT/scripts/slurm-up.sh"; then
  say "FAIL: Slurm is not up (scripts/slurm-up.sh)"
  exit 1
fi
NODE=$(hostname -s)

TMP=$(mktemp -d /tmp/strata-slurm-test.XXXXXX)
ETCD_PID="" PEER_PID="" PEER_PIDS=()
cleanup() {
  rm -rf /run/strata-slurm-test
  # Our jobs, if a timeout left any.
  squeue -h -o '%i %j' 2>/dev/null | awk -v t="$TAG" 'index($2, t) == 1 { print $1 }' \
    | while read -r j; do scancel "$j" 2>/dev/null; done
  local p
  for p in "$PEER_PID" "${PEER_PIDS[@]}" "$(cat "$TMP/e/run/pid" 2>/dev/null)" "$ETCD_PID"; do
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
  done
  for p in "$PEER_PID" "${PEER_PIDS[@]}" "$ETCD_PID"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null
  done
  if [ "$KEEP" = 1 ]; then say "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { # tcp | udp
  "$PY" -c 'import socket, sys
k = socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, k); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' "$1"
}
# srun under a timeout, its stdout and stderr to files: NAME SRUN-ARGS...
# Its exit status is also left in RC (124: the timeout).
RC=0
srun_t() {
  local name=$1
  shift
  timeout -k 15 "$TIMEOUT" srun --time="$MINUTES" --kill-on-bad-exit=1 --wait=60 "$@" \
    </dev/null >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
  return "$RC"
}
# The end of a command's output, for a failure's report.
show() {
  local f
  for f in "$@"; do
    [ -s "$f" ] && { printf -- '--- %s (last lines)\n' "${f#"$TMP"/}"; tail -n 25 "$f"; }
  done
  return 0
}
# Waits up to SECONDS until FILE has COUNT (default 1) lines matching PATTERN.
wait_for() { # FILE PATTERN SECONDS [COUNT]
  local i n
  for ((i = 0; i < $3 * 4; i++)); do
    n=$(grep -c -- "$2" "$1" 2>/dev/null)
    [ "${n:-0}" -ge "${4:-1}" ] && return 0
    sleep 0.25
  done
  return 1
}

# The checks on `srun -l strata rank` output (JSON lines labelled by task).
cat >"$TMP/check.py" <<'EOF'
import json, sys

def events(path):
    """Per task (srun --label): the JSON events it printed."""
    out = {}
    for line in open(path):
        label, sep, rest = line.rstrip("\n").partition(": ")
        if sep and label.strip().isdigit() and rest.startswith("{"):
            out.setdefault(int(label), []).append(json.loads(rest))
    return out

def rank(path, tasks, first, last, node, resumed=None, per_node=None, from_l2=()):
    """Every task t printed rank t (SLURM_PROCID), saved and verified
    first..last on node `node` (a name, or one per task), ended with done;
    with `resumed`, first resumed that step with local_rank t % per_node
    (SLURM_LOCALID) and node_rank t // per_node (SLURM_NODEID), every byte
    from the peers for the tasks in `from_l2` and none for the others."""
    ev, bad = events(path), []
    per_node = per_node or tasks
    nodes = node if isinstance(node, list) else [node] * tasks
    if sorted(ev) != list(range(tasks)):
        return [f"tasks {sorted(ev)} printed, expected 0..{tasks - 1}"]
    for t, es in ev.items():
        kinds = [e["event"] for e in es]
        for e in es:
            if e["event"] in ("error", "failed"):
                bad.append(f"task {t}: {e}")
            if "rank" in e and e["rank"] != t:
                bad.append(f"task {t} (SLURM_PROCID {t}) says rank {e['rank']}")
        saved = [e["step"] for e in es if e["event"] == "saved"]
        if saved != list(range(first, last + 1)):
            bad.append(f"task {t}: saved {saved}, expected {first}..{last}")
        ver = [(e["step"], e["ok"]) for e in es if e["event"] == "verified"]
        if ver != [(s, True) for s in range(first, last + 1)]:
            bad.append(f"task {t}: verified {ver}")
        done = [e for e in es if e["event"] == "done"]
        if len(done) != 1 or (done[0]["first"], done[0]["last"]) != (first, last):
            bad.append(f"task {t}: done {done}")
        if any(e.get("node", nodes[t]) != nodes[t] for e in es):
            bad.append(f"task {t}: node {[e.get('node') for e in es]} is not {nodes[t]}")
        res = [e for e in es if e["event"] == "resumed"]
        if resumed is None:
            if res:
                bad.append(f"task {t}: resumed {res} in a first run")
        elif len(res) != 1 or kinds[0] != "resumed":
            bad.append(f"task {t}: resumed {res}, expected step {resumed} first")
        else:
            r = res[0]
            want = {"step": resumed, "ok": True, "local_rank": t % per_node, "node_rank": t // per_node,
                    "from_l2": r["bytes"] if t in from_l2 else 0}
            got = {k: r.get(k) for k in want}
            if got != want or r["bytes"] <= 0:
                bad.append(f"task {t}: resumed {got} of {r['bytes']} bytes, expected {want}")
    return bad

def ls(path, steps, world, l1_ranks=None, l2=None):
    """`strata ls --json`: exactly `steps`, committed on L1 by `l1_ranks`
    (default: all) of `world` ranks; with l2 = [tiers, replicas, wanted],
    each tier listed and committed (a one-node ring: listed at least) and
    the replica counts."""
    j, bad = json.load(open(path)), []
    got = [s["step"] for s in j["steps"]]
    if got != steps:
        bad.append(f"steps {got}, expected {steps}")
    if not j.get("complete"):
        bad.append(f"listing incomplete: {j.get('errors')}")
    for s in j["steps"]:
        l1 = [t for t in s["tiers"] if t["tier"] == "L1"]
        if s.get("world_size") != world or not l1 or l1[0].get("state") != "committed" \
                or l1[0].get("ranks") != (l1_ranks or world):
            bad.append(f"step {s['step']}: world {s.get('world_size')}, L1 {l1}")
        if l2:
            tiers, replicas, wanted = l2
            listed = {t["tier"]: t for t in s["tiers"]}
            for tier in tiers:
                if tier not in listed or (replicas and listed[tier].get("state") != "committed"):
                    bad.append(f"step {s['step']}: {tier} not listed and committed in {s['tiers']}")
            if (s.get("l2") or {}).get("replicas") != replicas or s["l2"].get("wanted") != wanted:
                bad.append(f"step {s['step']}: l2 {s.get('l2')}, expected {replicas} of {wanted}")
    return bad

def claims(etcd, job, ranks, processes):
    """The claims of ranks 0..ranks-1 of `job` in etcd are held by exactly
    `processes` processes (with the node link, one per node: local rank
    0's), counted by the pid each claim names."""
    import base64, urllib.request
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    prefix = f"/strata/{job}/ranks/"
    body = json.dumps({"key": b64(prefix), "range_end": b64(prefix[:-1] + "0")}).encode()
    got = json.load(urllib.request.urlopen(f"{etcd}/v3/kv/range", body, timeout=10))
    kvs = got.get("kvs", [])
    pids = {base64.b64decode(kv["key"]).decode(): [w for w in base64.b64decode(kv["value"]).decode().split()
                                                    if w.startswith("pid=")] for kv in kvs}
    bad = []
    if len(pids) != ranks:
        bad.append(f"{len(pids)} claims, expected {ranks}: {sorted(pids)}")
    held = {tuple(p) for p in pids.values()}
    if len(held) != processes:
        bad.append(f"claims held by {len(held)} processes, expected {processes}: {pids}")
    return bad

if __name__ == "__main__":
    what, args = sys.argv[1], json.loads(sys.argv[2])
    bad = {"rank": rank, "ls": ls, "claims": claims}[what](**args)
    for b in bad:
        print("  " + b)
    sys.exit(1 if bad else 0)
EOF
check() { "$PY" "$TMP/check.py" "$@"; }

# --- etcd: how separate `strata rank` processes agree ----------------------
ETCD_PORT=$(free_port tcp)
ETCD="http://127.0.0.1:$ETCD_PORT"
etcd --name strata-slurm-test --data-dir "$TMP/etcd" --listen-client-urls "$ETCD" \
  --advertise-client-urls "$ETCD" --listen-peer-urls "http://127.0.0.1:$(free_port tcp)" \
  --log-level error >"$TMP/etcd.log" 2>&1 &
ETCD_PID=$!
for ((i = 0; i < 80; i++)); do
  (exec 3<>"/dev/tcp/127.0.0.1/$ETCD_PORT") 2>/dev/null && break
  kill -0 "$ETCD_PID" 2>/dev/null || break
  sleep 0.25
done
if ! (exec 3<>"/dev/tcp/127.0.0.1/$ETCD_PORT") 2>/dev/null; then
  say "FAIL: etcd did not start"
  show "$TMP/etcd.log"
  exit 1
fi

# Certificates of this node's peer service and of the jobs that reach it.
"$BIN" peer certs --out "$TMP/certs" --node "$NODE" --node strata-n1 --node strata-n2 \
  --job "$TAG-peers" --job "$TAG-pair" --job "$TAG-sbatch" --job "$TAG-prolog" >"$TMP/certs.log" 2>&1 \
  || { say "FAIL: strata peer certs"; show "$TMP/certs.log"; exit 1; }

# --- a) strata rank under srun -n 4 -----------------------------------------
part_a() {
  mkdir -p "$TMP/a"
  cat >"$TMP/a/strata.toml" <<EOF
job = "$TAG-rank"
l1_dir = "$TMP/a/$NODE/l1"          # one L1 directory per node, shared by its ranks
chunk_size = 1048576
keep_last = 3
gc_grace_secs = 600                  # ranks share the directory: chunks younger than this are never collected
coordination_timeout_secs = 120
etcd_endpoints = ["$ETCD"]
EOF
  local run=(-N 1 -n 4 --ntasks-per-node=4 -J "$TAG-rank" --label
    "$BIN" rank --config "$TMP/a/strata.toml" --state-size 4MiB --steps 3 --verify)
  if ! srun_t a1 "${run[@]}"; then
    echo "  first srun -n 4 failed (exit $RC)"; show "$TMP/a1.out" "$TMP/a1.err"; return 1
  fi
  check rank "{\"path\": \"$TMP/a1.out\", \"tasks\": 4, \"first\": 1, \"last\": 3, \"node\": \"$NODE\"}" \
    || { show "$TMP/a1.out" "$TMP/a1.err"; return 1; }
  echo "  srun -n 4: ranks 0-3 (SLURM_PROCID) saved, committed and verified steps 1-3"
  check claims "{\"etcd\": \"$ETCD\", \"job\": \"$TAG-rank\", \"ranks\": 4, \"processes\": 1}" \
    || return 1
  echo "  the node's 4 rank processes met on the node link: one process (SLURM_LOCALID 0) held their etcd claims"
  if ! srun_t a2 "${run[@]}" --resume; then
    echo "  second srun -n 4 --resume failed (exit $RC)"; show "$TMP/a2.out" "$TMP/a2.err"; return 1
  fi
  check rank "{\"path\": \"$TMP/a2.out\", \"tasks\": 4, \"first\": 4, \"last\": 6, \"node\": \"$NODE\", \"resumed\": 3}" \
    || { show "$TMP/a2.out" "$TMP/a2.err"; return 1; }
  echo "  srun -n 4 --resume: every rank resumed step 3 (local_rank = SLURM_LOCALID, node_rank 0), saved and verified 4-6"
  if ! srun_t a3 -n 1 -J "$TAG-ls" "$BIN" ls --config "$TMP/a/strata.toml" --json; then
    echo "  strata ls failed"; show "$TMP/a3.out" "$TMP/a3.err"; return 1
  fi
  check ls "{\"path\": \"$TMP/a3.out\", \"steps\": [6, 5, 4], \"world\": 4}" \
    || { show "$TMP/a3.out"; return 1; }
  echo "  strata ls: steps 6, 5, 4 committed by 4 ranks (keep_last 3 retired 1-3)"
}

# --- b) examples/train.py under srun -n 2 -----------------------------------
part_b() {
  mkdir -p "$TMP/b"
  local train=(-N 1 -n 2 -J "$TAG-train" --label "$PY" "$ROOT/examples/train.py" --every 20)
  if ! srun_t b1 "${train[@]}" --dir "$TMP/b/run" --steps 40; then
    echo "  srun -n 2 train.py failed (exit $RC)"; show "$TMP/b1.out" "$TMP/b1.err"; return 1
  fi
  local r
  for r in 0 1; do
    grep -q "^$r: rank $r: trained to step 40;" "$TMP/b1.out" \
      || { echo "  rank $r did not train to step 40"; show "$TMP/b1.out" "$TMP/b1.err"; return 1; }
  done
  if grep -q "resumed" "$TMP/b1.out"; then
    echo "  a first run resumed"; show "$TMP/b1.out"; return 1
  fi
  echo "  srun -n 2: ranks 0 and 1 (torch.distributed from SLURM_*) trained to step 40, checkpoints 20 and 40"
  if ! srun_t b2 "${train[@]}" --dir "$TMP/b/run" --steps 60; then
    echo "  second srun -n 2 train.py failed (exit $RC)"; show "$TMP/b2.out" "$TMP/b2.err"; return 1
  fi
  for r in 0 1; do
    grep -q "^$r: rank $r: resumed from step 40$" "$TMP/b2.out" \
      && grep -q "^$r: rank $r: trained to step 60;" "$TMP/b2.out" \
      || { echo "  rank $r did not resume from step 40 and train to 60"; show "$TMP/b2.out" "$TMP/b2.err"; return 1; }
  done
  echo "  srun -n 2 again: both ranks resumed from step 40 and trained to step 60"
  if ! srun_t b3 "${train[@]}" --dir "$TMP/b/ref" --steps 60; then
    echo "  uninterrupted srun -n 2 train.py failed"; show "$TMP/b3.out" "$TMP/b3.err"; return 1
  fi
  for r in 0 1; do
    if ! cmp -s "$TMP/b/run/loss-rank$r.txt" "$TMP/b/ref/loss-rank$r.txt" \
      || [ "$(wc -l <"$TMP/b/run/loss-rank$r.txt")" != 60 ]; then
      echo "  rank $r: the resumed loss curve differs from an uninterrupted run's"
      diff "$TMP/b/run/loss-rank$r.txt" "$TMP/b/ref/loss-rank$r.txt" | head -5
      return 1
    fi
  done
  echo "  loss curves of both ranks (60 steps) equal an uninterrupted run's, bit for bit"
}

# --- c) peers = ["slurm:PORT"] ------------------------------------------------
part_c() {
  mkdir -p "$TMP/c"
  local port
  port=$(free_port udp)
  # This node's peer service, as a node daemon or the prolog runs it.
  "$BIN" peer serve --listen "0.0.0.0:$port" --certs "$TMP/certs" --node "$NODE" \
    --spill "$TMP/c/spill" --memory 64MiB --disk 256MiB >"$TMP/c/peer.log" 2>&1 &
  PEER_PID=$!
  wait_for "$TMP/c/peer.log" "listening on" 30 || { echo "  the peer service did not start"; show "$TMP/c/peer.log"; return 1; }
  cat >"$TMP/c/strata.toml" <<EOF
job = "$TAG-peers"
l1_dir = "$TMP/c/$NODE/l1"
chunk_size = 1048576
peers = ["slurm:$port"]              # every node of the allocation, on this port
peer_certs = "$TMP/certs"
replicas = 1
coordination_timeout_secs = 120
etcd_endpoints = ["$ETCD"]
EOF
  # What the configuration becomes inside a step.
  if ! srun_t c1 -n 1 -J "$TAG-peers" "$PY" -c '
import json, os, sys, strata
c = strata.resolve_config(sys.argv[1])
print(json.dumps({"peers": c["peers"], "node": c["node"], "nodelist": os.environ["SLURM_JOB_NODELIST"],
                  "slurmd": os.environ.get("SLURMD_NODENAME")}))' "$TMP/c/strata.toml"; then
    echo "  resolve_config under srun failed"; show "$TMP/c1.out" "$TMP/c1.err"; return 1
  fi
  local want="{\"peers\": [\"$NODE=$NODE:$port\"], \"node\": \"$NODE\", \"nodelist\": \"$NODE\", \"slurmd\": \"$NODE\"}"
  if [ "$(cat "$TMP/c1.out")" != "$want" ]; then
    echo "  under srun the configuration says $(cat "$TMP/c1.out"), expected $want"; return 1
  fi
  echo "  under srun, peers = [\"slurm:$port\"] is [\"$NODE=$NODE:$port\"] (SLURM_JOB_NODELIST=$NODE), node $NODE (SLURMD_NODENAME)"
  if ! srun_t c2 -N 1 -n 2 -J "$TAG-peers" --label "$BIN" rank --config "$TMP/c/strata.toml" \
    --state-size 2MiB --steps 2 --verify; then
    echo "  srun -n 2 strata rank with slurm peers failed (exit $RC)"; show "$TMP/c2.out" "$TMP/c2.err"; return 1
  fi
  check rank "{\"path\": \"$TMP/c2.out\", \"tasks\": 2, \"first\": 1, \"last\": 2, \"node\": \"$NODE\"}" \
    || { show "$TMP/c2.out" "$TMP/c2.err"; return 1; }
  if ! srun_t c3 -n 1 -J "$TAG-ls" "$BIN" ls --config "$TMP/c/strata.toml" --json; then
    echo "  strata ls with slurm peers failed"; show "$TMP/c3.out" "$TMP/c3.err"; return 1
  fi
  check ls "{\"path\": \"$TMP/c3.out\", \"steps\": [2, 1], \"world\": 2, \"l2\": [[\"L2:$NODE\"], 0, 1]}" \
    || { show "$TMP/c3.out"; return 1; }
  echo "  srun -n 2 strata rank saved and verified steps 1-2; strata ls lists L2:$NODE (complete),"
  echo "  and 0 of 1 replicas: the ring of a one-node allocation has no other node (never this one)"
  if "$BIN" ls --config "$TMP/c/strata.toml" >"$TMP/c4.out" 2>&1; then
    echo "  outside Slurm, peers = [\"slurm:PORT\"] was accepted"; show "$TMP/c4.out"; return 1
  fi
  grep -q "SLURM_JOB_NODELIST" "$TMP/c4.out" \
    || { echo "  outside Slurm, the error does not name SLURM_JOB_NODELIST"; show "$TMP/c4.out"; return 1; }
  echo "  outside Slurm the setting is refused: $(grep -m1 SLURM_JOB_NODELIST "$TMP/c4.out")"
  kill -TERM "$PEER_PID"
  wait "$PEER_PID" 2>/dev/null
  PEER_PID=""

  # Two nodes (partition "pair": strata-n1 and strata-n2, a slurmd each on
  # this host, each with an address of its own): a peer service on each
  # node's address, as each node would run one.
  mkdir -p "$TMP/c2"
  local n addr
  port=$(free_port udp)
  for n in strata-n1 strata-n2; do
    addr=$(getent ahostsv4 "$n" | awk 'NR == 1 { print $1 }')
    "$BIN" peer serve --listen "$addr:$port" --certs "$TMP/certs" --node "$n" \
      --spill "$TMP/c2/spill-$n" --memory 64MiB --disk 256MiB >"$TMP/c2/peer-$n.log" 2>&1 &
    PEER_PIDS+=($!)
  done
  for n in strata-n1 strata-n2; do
    wait_for "$TMP/c2/peer-$n.log" "listening on" 30 \
      || { echo "  the peer service of $n did not start"; show "$TMP/c2/peer-$n.log"; return 1; }
  done
  cat >"$TMP/c2/strata.toml" <<EOF
job = "$TAG-pair"
chunk_size = 1048576
peers = ["slurm:$port"]
peer_certs = "$TMP/certs"
replicas = 1
coordination_timeout_secs = 120
etcd_endpoints = ["$ETCD"]
EOF
  # Each node's L1 on its own "disk" (one host here: a directory per node).
  local pair=(-p pair -N 2 --ntasks-per-node=2 -J "$TAG-pair" --label
    bash -c 'STRATA_L1_DIR=$0/$SLURMD_NODENAME/l1 exec "$@"' "$TMP/c2"
    "$BIN" rank --config "$TMP/c2/strata.toml" --state-size 2MiB --verify)
  local nodes='["strata-n1", "strata-n1", "strata-n2", "strata-n2"]'
  if ! srun_t c5 "${pair[@]}" --steps 2 --wait-tiers; then
    echo "  srun -p pair -N 2 strata rank failed (exit $RC)"; show "$TMP/c5.out" "$TMP/c5.err"; return 1
  fi
  check rank "{\"path\": \"$TMP/c5.out\", \"tasks\": 4, \"first\": 1, \"last\": 2, \"node\": $nodes}" \
    || { show "$TMP/c5.out" "$TMP/c5.err"; return 1; }
  if ! srun_t c6 -p pair -N 2 -n 2 -J "$TAG-pair" bash -c \
    '[ "$SLURM_PROCID" != 0 ] || STRATA_L1_DIR=$0/$SLURMD_NODENAME/l1 exec "$@"' "$TMP/c2" \
    "$BIN" ls --config "$TMP/c2/strata.toml" --json; then
    echo "  strata ls on two nodes failed"; show "$TMP/c6.out" "$TMP/c6.err"; return 1
  fi
  check ls "{\"path\": \"$TMP/c6.out\", \"steps\": [2, 1], \"world\": 4, \"l1_ranks\": 2, \"l2\": [[\"L2:strata-n1\", \"L2:strata-n2\"], 1, 1]}" \
    || { show "$TMP/c6.out"; return 1; }
  echo "  two nodes (SLURM_JOB_NODELIST=strata-n[1-2]): 4 ranks saved steps 1-2, each node's replicated"
  echo "  to the other's peer service (strata ls: L2:strata-n1 and L2:strata-n2 committed, 1 of 1 replicas)"
  # strata-n1 loses its disk: its ranks restore from strata-n2's service.
  rm -rf "$TMP/c2/strata-n1"
  if ! srun_t c7 "${pair[@]}" --steps 1 --resume; then
    echo "  srun -p pair -N 2 strata rank --resume failed (exit $RC)"; show "$TMP/c7.out" "$TMP/c7.err"; return 1
  fi
  check rank "{\"path\": \"$TMP/c7.out\", \"tasks\": 4, \"first\": 3, \"last\": 3, \"node\": $nodes, \"resumed\": 2, \"per_node\": 2, \"from_l2\": [0, 1]}" \
    || { show "$TMP/c7.out" "$TMP/c7.err"; return 1; }
  echo "  strata-n1's L1 deleted: its ranks resumed step 2 from strata-n2's peer, strata-n2's from L1;"
  echo "  local_rank = SLURM_LOCALID (0, 1 on each node), node_rank = SLURM_NODEID (0, 1)"
  for addr in "${PEER_PIDS[@]}"; do kill -TERM "$addr" 2>/dev/null; done
  for addr in "${PEER_PIDS[@]}"; do wait "$addr" 2>/dev/null; done
  PEER_PIDS=()
}

# --- d) deploy/slurm/train.sbatch ---------------------------------------------
part_d() {
  mkdir -p "$TMP/d"
  local port i out rc r step jid n addr
  port=$(free_port udp)
  # sbatch train.sbatch with this machine's sizes (partition "pair": two
  # nodes on one host, so each service listens on its node's own address;
  # one task per node; no GPU): N SBATCH-ARGS... -- SCRIPT-ARGS... The
  # time limit stays well above the script's --signal=B:TERM@300 (below
  # 300 s the script would be told to stop at once); the timeout here ends
  # it sooner anyway.
  submit() {
    local n=$1 sb=()
    shift
    while [ "$1" != -- ]; do sb+=("$1"); shift; done
    shift
    STRATA="$BIN" PYTHON="$PY" TRAIN_SCRIPT="$ROOT/examples/train.py" \
      TOML="$ROOT/deploy/slurm/strata.toml" CERTS="$TMP/certs" NVME="$TMP/d/nvme" \
      PEER_PORT="$port" PEER_BIND=node PEER_MEMORY=64MiB PEER_DISK=256MiB LOG_DIR="$TMP/d/logs" \
      timeout -k 15 "$TIMEOUT" sbatch "${sb[@]}" --job-name="$TAG-sbatch" --partition=pair --nodes=2 \
      --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 \
      --time=$((MINUTES + 10)) --signal=B:TERM@300 --output="$TMP/d/job-$n.out" \
      "$ROOT/deploy/slurm/train.sbatch" "$@" </dev/null >"$TMP/d$n.out" 2>"$TMP/d$n.err"
  }
  for i in 1 2; do
    step=$((40 + 20 * (i - 1)))
    submit "$i" --wait -- --steps "$step" --every 20
    rc=$?
    out="$TMP/d/job-$i.out"
    if [ "$rc" != 0 ]; then
      echo "  sbatch --wait train.sbatch ($i) exited $rc"; show "$TMP/d$i.err" "$out" "$TMP/d"/logs/peer-*.log; return 1
    fi
    for r in 0 1; do
      grep -q "^$r: rank $r: trained to step $step;" "$out" \
        || { echo "  job $i: rank $r did not train to step $step"; show "$out"; return 1; }
      if [ "$i" = 2 ] && ! grep -q "^$r: rank $r: resumed from step 40$" "$out"; then
        echo "  job 2: rank $r did not resume from step 40"; show "$out"; return 1
      fi
    done
    grep -q "peer services up on strata-n\[1-2\]" "$out" && grep -q "training ended with exit code 0" "$out" \
      || { echo "  job $i: the script's messages are missing"; show "$out"; return 1; }
    # (srun truncates the logs at each job.)
    # (peer-<node index>-<host name>.log: both nodes are this host.)
    cat "$TMP/d"/logs/peer-*.log >"$TMP/d/peers-$i.log"
    for n in strata-n1 strata-n2; do
      addr=$(getent ahostsv4 "$n" | awk 'NR == 1 { print $1 }')
      grep -q "strata peer $n: listening on $addr:$port" "$TMP/d/peers-$i.log" \
        && grep -q "strata peer $n: shutting down" "$TMP/d/peers-$i.log" \
        || { echo "  job $i: $n's peer service did not listen on $addr, or did not stop on SIGTERM"; show "$TMP/d/peers-$i.log"; return 1; }
      # Each node's service holds the other node's replicas: the second
      # job's reloads them from its spill.
      if [ "$i" = 2 ] && ! grep -q "strata peer $n: reloaded [1-9][0-9]* chunks .* and [1-9][0-9]* steps of 1 jobs" "$TMP/d/peers-$i.log"; then
        echo "  job 2: $n's peer service did not reload the replicas of job 1"; show "$TMP/d/peers-$i.log"; return 1
      fi
    done
  done
  echo "  sbatch train.sbatch on strata-n[1-2]: a peer service on each node's address, a rank per node"
  echo "  trained to step 40, every checkpoint replicated to the other node, the peers stopped by SIGTERM"
  echo "  submitted again: the peers reloaded their replicas, both ranks resumed from step 40, trained to 60"
  # A third job is told to stop, as --signal=B:TERM@300 does before its
  # time limit: training is stopped (SIGTERM to its tasks), then the peers.
  out="$TMP/d/job-3.out"
  submit 3 --parsable -- --steps 100000 --every 20 --step-sleep 0.05
  jid=$(cut -d';' -f1 "$TMP/d3.out")
  [ -n "$jid" ] || { echo "  sbatch (3) failed"; show "$TMP/d3.err"; return 1; }
  if ! wait_for "$out" "rank [01]: resumed from step 60$" "$TIMEOUT" 2; then
    echo "  job 3 did not resume from step 60"; show "$out"; return 1
  fi
  scancel --batch --signal=TERM "$jid"
  for ((i = 0; i < TIMEOUT * 2; i++)); do
    [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] && break
    sleep 0.5
  done
  [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] || { echo "  job 3 did not end after SIGTERM"; show "$out"; return 1; }
  grep -q "SIGTERM: stopping training, then the peers" "$out" \
    && grep -q "training ended with exit code 143" "$out" \
    && [ "$(cat "$TMP/d"/logs/peer-*.log | grep -c "strata peer strata-n[12]: shutting down")" = 2 ] \
    || { echo "  job 3 did not stop training, then the peers"; show "$out" "$TMP/d"/logs/peer-*.log; return 1; }
  echo "  a third job, sent SIGTERM (as --signal=B:TERM@300 does): training got SIGTERM (exit 143), then the peers"
}

# --- e) the prolog and epilog of deploy/slurm ---------------------------------
part_e() {
  mkdir -p "$TMP/e" /run/strata-slurm-test
  local port
  port=$(free_port udp)
  cat >/run/strata-slurm-test/peer.env <<EOF
STRATA=$BIN
CERTS=$TMP/certs
SPILL=$TMP/e/spill
PORT=$port
MEMORY=64MiB
DISK=256MiB
RUN=$TMP/e/run
LOG=$TMP/e/peer.log
START_TIMEOUT=60
STOP_TIMEOUT=60
EOF
  ln -sf "$ROOT/deploy/slurm/strata-peer-prolog.sh" /run/strata-slurm-test/prolog
  ln -sf "$ROOT/deploy/slurm/strata-peer-epilog.sh" /run/strata-slurm-test/epilog
  # One node: the ranks call their node "elsewhere", so this node's service
  # (from the Slurm node list) is theirs to replicate to.
  cat >"$TMP/e/strata.toml" <<EOF
job = "$TAG-prolog"
l1_dir = "$TMP/e/l1"
chunk_size = 1048576
peers = ["slurm:$port"]
peer_certs = "$TMP/certs"
node = "elsewhere"
replicas = 1
EOF
  local rank=("$BIN" rank --config "$TMP/e/strata.toml" --state-size 2MiB)
  if ! srun_t e1 -n 1 -J "$TAG-prolog" "${rank[@]}" --steps 2 --wait-tiers; then
    echo "  strata rank in a job with the prolog failed"; show "$TMP/e1.out" "$TMP/e1.err" "$TMP/e/peer.log"; return 1
  fi
  grep -q "started strata peer serve as $NODE" "$TMP/e/peer.log" && grep -q "listening on" "$TMP/e/peer.log" \
    || { echo "  the prolog did not start the service"; show "$TMP/e/peer.log"; return 1; }
  wait_for "$TMP/e/peer.log" "epilog job .*: stopped" 60 \
    || { echo "  the epilog did not stop the service"; show "$TMP/e/peer.log"; return 1; }
  echo "  the prolog started strata peer serve for the job, the epilog stopped it (SIGTERM) after it"
  # The node lost its disk: the next job's service reloads its replicas,
  # and the rank restores from it.
  rm -rf "$TMP/e/l1"
  if ! srun_t e2 -n 1 -J "$TAG-prolog" "${rank[@]}" --steps 1 --resume; then
    echo "  strata rank --resume with an empty L1 failed"; show "$TMP/e2.out" "$TMP/e2.err" "$TMP/e/peer.log"; return 1
  fi
  grep -q "reloaded [1-9][0-9]* chunks .* and 2 steps of 1 jobs" "$TMP/e/peer.log" \
    || { echo "  the second job's service did not reload the replicas"; show "$TMP/e/peer.log"; return 1; }
  "$PY" -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "\"resumed\"" in l]
assert len(r) == 1 and r[0]["step"] == 2 and r[0]["ok"] and r[0]["from_l2"] == r[0]["bytes"] > 0, r
' "$TMP/e2.out" || { echo "  the rank did not restore step 2 from the peer"; show "$TMP/e2.out"; return 1; }
  echo "  next job: the service reloaded 2 steps from its spill; a rank with an empty L1 restored step 2 from it"
  wait_for "$TMP/e/peer.log" "epilog job .*: stopped" 60 2 \
    || { echo "  the epilog did not stop the second job's service"; show "$TMP/e/peer.log"; return 1; }
  if [ -e "$TMP/e/run/pid" ]; then
    echo "  the service's pid file outlived the last job"; return 1
  fi
  echo "  the epilog stopped it again after the last job"
  rm -rf /run/strata-slurm-test
}

failed=0
for part in $PARTS; do
  t0=$(date +%s)
  case $part in
    a) what="srun -n 4 strata rank: SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, save, resume, verify" ;;
    b) what="srun -n 2 examples/train.py: resumes from the last step, bit for bit" ;;
    c) what="peers = [\"slurm:PORT\"] from SLURM_JOB_NODELIST under srun" ;;
    d) what="sbatch deploy/slurm/train.sbatch: peer step, training, SIGTERM stop, resubmitted resumes" ;;
    e) what="deploy/slurm prolog/epilog: peer service per allocation, replicas kept across jobs" ;;
  esac
  say "($part) $what"
  if "part_$part"; then
    say "PASS ($part) in $(($(date +%s) - t0)) s"
  else
    say "FAIL ($part) in $(($(date +%s) - t0)) s"
    failed=$((failed + 1))
  fi
done
nparts=$(wc -w <<<"$PARTS")
if [ "$failed" = 0 ]; then
  say "PASS: all $nparts parts ($PARTS) in $(($(date +%s) - started)) s"
else
  say "FAIL: $failed of $nparts parts failed ($(($(date +%s) - started)) s)"
  exit 1
fi

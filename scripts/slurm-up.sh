#!/usr/bin/env bash
# A real one-node Slurm on this machine, for scripts/slurm-test.sh (and for
# trying the deploy/slurm examples by hand). Run as root. Idempotent: when
# munged, slurmctld and slurmd already run with this configuration and the
# node is idle, it only checks that a step runs (well under a second).
#
#   scripts/slurm-up.sh            # install (first time), configure, start, check
#   SLURM_UP_TIMEOUT=120 scripts/slurm-up.sh
#
# What it does, each step only when needed:
#   - apt-get installs Debian's slurm-wlm and munge (no recommends: the
#     daemons, the client tools and the basic plugins);
#   - creates /etc/munge/munge.key and starts munged (as the munge user);
#   - writes /etc/slurm/slurm.conf: cluster "strata-test", this host
#     (`hostname -s`) as controller and as the node of partition "debug"
#     (the default), 8 CPUs declared (more than the cores here, accepted
#     through SlurmdParameters=config_overrides, so `srun -n 4` runs on a
#     2-core machine); no cgroups (proctrack/linuxproc, task/none), so it
#     runs in containers and VMs without a cgroup hierarchy of its own;
#   - and partition "pair": two more nodes, strata-n1 and strata-n2, each
#     a slurmd of its own on this host (`slurmd -N`; Debian builds Slurm
#     with multiple-slurmd support) with an address of its own
#     (127.0.2.1 and 127.0.2.2, added to /etc/hosts), so a job there has
#     a real two-node SLURM_JOB_NODELIST (strata-n[1-2]), a SLURMD_NODENAME
#     per node and SLURM_NODEID 0 and 1, and each node's peer service can
#     listen on its own address;
#   - starts slurmctld and the slurmds directly (no systemd needed; logs
#     under /var/log/slurm), restarting them when the configuration changed;
#   - waits until sinfo shows the nodes idle and `srun -n 1 true` and
#     `srun -p pair -N 2 true` work, or fails after SLURM_UP_TIMEOUT
#     seconds (default 90) printing the daemons' logs.
set -euo pipefail

TIMEOUT="${SLURM_UP_TIMEOUT:-90}"
CPUS="${SLURM_UP_CPUS:-8}"
CONF=/etc/slurm/slurm.conf
LOGDIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
# The two nodes of partition "pair": name, address, slurmd port.
PAIR=("strata-n1 127.0.2.1 17021" "strata-n2 127.0.2.2 17022")
started=$(date +%s.%N)

say() { printf 'slurm-up: %s\n' "$*"; }
die() {
  printf 'slurm-up: FAIL: %s\n' "$*" >&2
  for f in "$LOGDIR"/slurmctld.log "$LOGDIR"/slurmd*.log /var/log/munge/munged.log; do
    if [ -s "$f" ]; then
      printf '\n--- last lines of %s\n' "$f" >&2
      tail -n 40 "$f" >&2
    fi
  done
  exit 1
}
elapsed() { awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"

# --- packages --------------------------------------------------------------
have_all() {
  local c
  for c in slurmctld slurmd srun sinfo scontrol munged munge unmunge; do
    command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || return 1
  done
}
if ! have_all; then
  say "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  pkgs=(slurm-wlm munge)
  if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/tmp/slurm-up-apt.log 2>&1; then
    apt-get update -qq >>/tmp/slurm-up-apt.log 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >>/tmp/slurm-up-apt.log 2>&1 \
      || { tail -n 30 /tmp/slurm-up-apt.log >&2; die "apt-get install ${pkgs[*]} failed"; }
  fi
  have_all || die "slurm-wlm/munge installed but a command is missing"
  say "installed ($(elapsed) s): $(slurmctld -V)"
fi
export PATH="$PATH:/usr/sbin:/sbin"

# --- this host -------------------------------------------------------------
NODE="$(hostname -s)"
[ -n "$NODE" ] || die "hostname -s is empty"
# The controller, slurmd and srun find each other by this name.
if ! getent hosts "$NODE" >/dev/null 2>&1; then
  say "$NODE does not resolve: adding '127.0.1.1 $NODE' to /etc/hosts"
  printf '127.0.1.1\t%s\n' "$NODE" >>/etc/hosts
fi
# The pair's names resolve to their addresses (for Slurm, and for the
# ranks that reach their peer services by node name).
for n in "${PAIR[@]}"; do
  read -r name addr _ <<<"$n"
  if [ "$(getent ahostsv4 "$name" 2>/dev/null | awk 'NR == 1 { print $1 }')" != "$addr" ]; then
    say "adding '$addr $name' to /etc/hosts"
    # Rewritten in place, not replaced: in a container /etc/hosts is often
    # a bind mount.
    hosts=$(awk -v n="$name" '{ for (i = 2; i <= NF; i++) if ($i == n) next; print }' /etc/hosts)
    printf '%s\n%s\t%s\n' "$hosts" "$addr" "$name" >/etc/hosts
  fi
done

# --- munge -----------------------------------------------------------------
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
  id munge >/dev/null 2>&1 || die "no munge user (the munge package creates it)"
  install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
  install -d -o munge -g munge -m 0755 /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null 2>&1 || [ -x /usr/sbin/mungekey ]; then
      mungekey --create --force --keyfile /etc/munge/munge.key >/dev/null
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  # A munged that runs but does not answer (a stale socket) is replaced.
  if [ -s /run/munge/munged.pid ]; then
    old=$(cat /run/munge/munged.pid)
    if [ "$(cat "/proc/$old/comm" 2>/dev/null)" = munged ]; then
      kill "$old" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  say "starting munged"
  runuser -u munge -- munged --force >/dev/null 2>&1 || true
  for _ in $(seq 1 50); do munge_ok && break; sleep 0.1; done
  munge_ok || die "munged does not answer (munge -n | unmunge)"
fi

# --- slurm.conf ------------------------------------------------------------
install -d -m 0755 /etc/slurm "$LOGDIR" /var/spool/slurmctld /var/spool/slurmd
pair_nodes=""
for n in "${PAIR[@]}"; do
  read -r name addr port <<<"$n"
  pair_nodes+="NodeName=$name NodeAddr=$addr NodeHostname=$NODE Port=$port CPUs=4 State=UNKNOWN"$'\n'
done
want=$(cat <<EOF
# Written by scripts/slurm-up.sh (Strata's test Slurm): this host as one
# node, and two more nodes on it (their own slurmd each); no cgroups.
ClusterName=strata-test
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=60
KillWait=5
Waittime=0
# A hook for scripts/slurm-test.sh (deploy/slurm's prolog and epilog, while
# a test installs them): does nothing otherwise.
Prolog=/etc/slurm/strata-test-prolog
Epilog=/etc/slurm/strata-test-epilog
PrologFlags=Alloc
NodeName=$NODE CPUs=$CPUS State=UNKNOWN
${pair_nodes}PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=pair Nodes=strata-n[1-2] Default=NO MaxTime=INFINITE State=UP
EOF
)
changed=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
  if [ -f "$CONF" ] && ! grep -q '^# Written by scripts/slurm-up.sh' "$CONF"; then
    cp "$CONF" "$CONF.before-strata.$(date +%s)"
    say "kept the previous $CONF as $CONF.before-strata.*"
  fi
  printf '%s\n' "$want" >"$CONF"
  changed=1
  say "wrote $CONF (node $NODE with $CPUS CPUs; strata-n1 and strata-n2)"
fi
# Debian's slurm reads cgroup.conf only for cgroup plugins; none here.

# The prolog and epilog hooks: run what slurm-test.sh put under
# /run/strata-slurm-test (a symlink to deploy/slurm/strata-peer-*.sh and
# its settings), else nothing. Read by slurmd at each job: no restart.
for kind in prolog epilog; do
  hook="#!/bin/sh
# Written by scripts/slurm-up.sh: the test's $kind, if one is installed.
[ -x /run/strata-slurm-test/$kind ] || exit 0
exec /run/strata-slurm-test/$kind /run/strata-slurm-test/peer.env"
  if [ "$(cat "/etc/slurm/strata-test-$kind" 2>/dev/null)" != "$hook" ]; then
    printf '%s\n' "$hook" >"/etc/slurm/strata-test-$kind"
  fi
  chmod 0755 "/etc/slurm/strata-test-$kind"
done

# --- daemons ---------------------------------------------------------------
# The pid of a running daemon from its pid file (empty if none runs).
running() {
  local pidfile=$1 name=$2 pid
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then echo "$pid"; fi
}
stop() {
  local pidfile=$1 name=$2 pid
  pid=$(running "$pidfile" "$name")
  [ -n "$pid" ] || return 0
  say "stopping $name (pid $pid): its configuration changed"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    [ -d "/proc/$pid" ] || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}
NODES=("$NODE")
for n in "${PAIR[@]}"; do NODES+=("${n%% *}"); done
if [ "$changed" = 1 ]; then
  # Every slurmd, under this layout's pid files or an earlier one's.
  for f in /run/slurmd.pid /run/slurmd-*.pid; do
    [ -e "$f" ] && stop "$f" slurmd
  done
  stop "$CTLD_PID" slurmctld
fi
if [ -z "$(running "$CTLD_PID" slurmctld)" ]; then
  say "starting slurmctld"
  slurmctld || die "slurmctld did not start"
fi
for n in "${NODES[@]}"; do
  if [ -z "$(running "/run/slurmd-$n.pid" slurmd)" ]; then
    say "starting slurmd for node $n"
    install -d -m 0755 "/var/spool/slurmd/$n"
    if [ "$n" = "$NODE" ]; then slurmd; else slurmd -N "$n"; fi || die "slurmd -N $n did not start"
  fi
done

# --- ready? ----------------------------------------------------------------
deadline=$(($(date +%s) + TIMEOUT))
state=""
tries=0
while :; do
  ready=0 states=""
  for n in "${NODES[@]}"; do
    state=$(sinfo -h -N -n "$n" -o '%T' 2>/dev/null | head -n 1 || true)
    states+="$n=${state:-?} "
    case "$state" in
      idle | mixed | allocated | completing) ready=$((ready + 1)) ;;
      drain* | down*)
        # A node drained or down from an earlier life (a reboot, a killed
        # slurmd) is put back once it answers (tried every 5 s).
        if [ $((tries % 10)) = 0 ] && scontrol ping >/dev/null 2>&1; then
          scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
        fi
        ;;
    esac
  done
  tries=$((tries + 1))
  [ "$ready" = "${#NODES[@]}" ] && break
  [ "$(date +%s)" -lt "$deadline" ] \
    || die "nodes not idle after ${TIMEOUT} s (sinfo says ${states}; scontrol ping: $(scontrol ping 2>&1 | tr '\n' ' '))"
  [ -n "$(running "$CTLD_PID" slurmctld)" ] || die "slurmctld exited"
  for n in "${NODES[@]}"; do
    [ -n "$(running "/run/slurmd-$n.pid" slurmd)" ] || die "the slurmd of node $n exited"
  done
  sleep 0.5
done
left=$((deadline - $(date +%s)))
[ "$left" -ge 10 ] || left=10
if ! out=$(timeout "$left" srun -N 1 -n 1 --time=1 -J slurm-up true 2>&1); then
  printf '%s\n' "$out" >&2
  die "srun -n 1 true failed"
fi
if ! out=$(timeout "$left" srun -p pair -N 2 --ntasks-per-node=1 --time=1 -J slurm-up \
  printenv SLURMD_NODENAME 2>&1) || [ "$(sort <<<"$out" | tr '\n' ' ')" != "strata-n1 strata-n2 " ]; then
  printf '%s\n' "$out" >&2
  die "srun -p pair -N 2 did not run on strata-n1 and strata-n2"
fi
say "up: ${states}($(sinfo -h -N -n "$NODE" -o '%c') CPUs on $NODE), srun works on both partitions ($(elapsed) s)"

#!/bin/bash
# Slurm prolog: starts this node's Strata peer service (L2) when a job is
# allocated the node, unless it runs already; strata-peer-epilog.sh stops
# it (SIGTERM) when the node's last such job ends. The alternative to the
# step train.sbatch starts, for sites that want the service run by root
# and outside the job's limits. In slurm.conf on every node:
#
#   Prolog=/etc/slurm/strata-peer-prolog.sh
#   Epilog=/etc/slurm/strata-peer-epilog.sh
#   PrologFlags=Alloc      # at allocation, on every node (not only where a step starts)
#
# Not with PrologFlags=Contain: the prolog would run inside the job's
# cgroup, and the service would die with the first job instead of
# keeping its replicas across jobs.
#
# Settings: the defaults below, overridden by /etc/strata/slurm-peer.env
# (the same file both scripts read; another file as the first argument,
# for a wrapper or a test). The service is named as Slurm names
# the node (SLURMD_NODENAME): the name the ranks give it with
# peers = ["slurm:PORT"], and the name of its certificate in CERTS.
#
# A failing prolog drains the node, so this one never fails: a service
# that does not come up is logged (LOG) and the job runs without this
# node's L2 (its steps are degraded, its restores use the other tiers).

STRATA=/usr/local/bin/strata
CERTS=/shared/strata/certs          # ca.pem, <node>.pem, <node>.key (key 0600, or root's 0640)
SPILL=/nvme/strata-peer-spill       # node-local: room for MEMORY + DISK
PORT=7070
MEMORY=32GiB
DISK=512GiB
EXTRA_ARGS=""                       # more `strata peer serve` flags (--metrics 0.0.0.0:9464 ...)
PARTITIONS="*"                      # "*": every job; else e.g. "gpu a100": jobs in these only
RUN=/run/strata-peer                # pid file, lock, one marker per job on the node
LOG=/var/log/strata-peer.log
START_TIMEOUT=120                   # seconds to wait for "listening" (the spill is reloaded first)
ENV_FILE=${1:-/etc/strata/slurm-peer.env}
# shellcheck source=/dev/null
[ -r "$ENV_FILE" ] && . "$ENV_FILE"

case " $PARTITIONS " in
  *" * "* | *" ${SLURM_JOB_PARTITION:-} "*) ;;
  *) exit 0 ;;
esac
log() { printf '%s prolog job %s: %s\n' "$(date '+%F %T')" "${SLURM_JOB_ID:-?}" "$*" >>"$LOG"; }
node=${SLURMD_NODENAME:-$(hostname -s)}

mkdir -p "$RUN/jobs" || { log "cannot create $RUN"; exit 0; }
exec 9>"$RUN/lock"
flock -w 60 9 || { log "lock busy"; exit 0; }
: >"$RUN/jobs/${SLURM_JOB_ID:-unknown}"

pid=$(cat "$RUN/pid" 2>/dev/null || true)
if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = strata ]; then
  exit 0 # running already (another job on this node, or a previous job's service still up)
fi

mark=$(wc -l <"$LOG" 2>/dev/null || echo 0)
# Its own session, stdio away from slurmd, the lock not inherited: the
# prolog returns at once and the service outlives it.
# shellcheck disable=SC2086
setsid "$STRATA" peer serve --listen "0.0.0.0:$PORT" --certs "$CERTS" --node "$node" \
  --spill "$SPILL" --memory "$MEMORY" --disk "$DISK" $EXTRA_ARGS \
  </dev/null >>"$LOG" 2>&1 9>&- &
pid=$!
echo "$pid" >"$RUN/pid"
log "started strata peer serve as $node on port $PORT (pid $pid)"

# Ranks list every peer when they resume: hold the job until this one
# listens (or gave up).
for _ in $(seq 1 $((START_TIMEOUT * 4))); do
  if tail -n +"$((mark + 1))" "$LOG" 2>/dev/null | grep -q "strata peer $node: listening on"; then
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    log "strata peer serve exited at start (see the lines above)"
    rm -f "$RUN/pid"
    exit 0
  fi
  sleep 0.25
done
log "strata peer serve not listening after ${START_TIMEOUT} s; the job goes on"
exit 0

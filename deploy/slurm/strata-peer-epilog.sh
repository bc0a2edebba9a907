#!/bin/bash
# Slurm epilog: the pair of strata-peer-prolog.sh (read it first). When
# the node's last job that the prolog counted ends, stops the node's
# Strata peer service with SIGTERM: it finishes the requests in flight and
# writes the replicas it holds in memory to its spill directory, which the
# next start reloads and verifies. The epilog waits for that (up to
# STOP_TIMEOUT), then SIGKILLs a service that did not exit.
#
# A job whose epilog never ran (slurmd died meanwhile) leaves its marker
# in $RUN/jobs, which keeps the service up after the node's other jobs:
# remove it by hand (/run is emptied at boot). Neither script calls Slurm
# commands: prologs and epilogs that query slurmctld slow large clusters.

RUN=/run/strata-peer
LOG=/var/log/strata-peer.log
STOP_TIMEOUT=120                    # seconds: spilling MEMORY at the disk's speed, with room
ENV_FILE=${1:-/etc/strata/slurm-peer.env}
# shellcheck source=/dev/null
[ -r "$ENV_FILE" ] && . "$ENV_FILE"

[ -d "$RUN/jobs" ] || exit 0
log() { printf '%s epilog job %s: %s\n' "$(date '+%F %T')" "${SLURM_JOB_ID:-?}" "$*" >>"$LOG"; }

exec 9>"$RUN/lock"
flock -w 60 9 || { log "lock busy"; exit 0; }
rm -f "$RUN/jobs/${SLURM_JOB_ID:-unknown}"
if [ -n "$(ls -A "$RUN/jobs" 2>/dev/null)" ]; then
  exit 0 # another job on this node still uses the service
fi
pid=$(cat "$RUN/pid" 2>/dev/null || true)
[ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = strata ] || { rm -f "$RUN/pid"; exit 0; }

# Gone, or a zombie nobody reaped yet.
gone() { [ ! -d "/proc/$1" ] || [ "$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null)" = Z ]; }

log "stopping strata peer serve (pid $pid) with SIGTERM"
kill -TERM "$pid" 2>/dev/null
for _ in $(seq 1 $((STOP_TIMEOUT * 4))); do
  gone "$pid" && { rm -f "$RUN/pid"; log "stopped"; exit 0; }
  sleep 0.25
done
log "still running after ${STOP_TIMEOUT} s: SIGKILL (what it held only in memory is lost)"
kill -KILL "$pid" 2>/dev/null
rm -f "$RUN/pid"
exit 0

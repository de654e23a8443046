#!/usr/bin/env bash
# Stop the one-node SLURM cluster that scripts/slurm-up.sh started: cancel its jobs, then stop
# exactly the daemons whose pid files slurm-up.sh left in the state folder (slurmd, slurmctld,
# and munged only when slurm-up.sh started it). Safe to run when nothing is up; always exits 0
# unless a daemon refuses to die.
set -uo pipefail

STATE="${DEPSI_SLURM_DIR:-/tmp/depsi-slurm}"
CONF="$STATE/slurm.conf"

log() { echo "slurm-down: $*" >&2; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {  # stop NAME PIDFILE: TERM, wait up to 10 s, then KILL
    local name=$1 pidfile=$2 pid
    if ! alive "$pidfile"; then rm -f "$pidfile"; return 0; fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null; sleep 0.2
    fi
    kill -0 "$pid" 2>/dev/null && { log "ERROR: $name (pid $pid) still alive"; return 1; }
    rm -f "$pidfile"
    log "stopped $name (pid $pid)"
}

[[ -d "$STATE" ]] || { log "nothing to stop ($STATE does not exist)"; exit 0; }

# Jobs first, so their slurmstepd and worker processes end before slurmd goes.
if alive "$STATE/slurmctld.pid" && [[ -s "$CONF" ]]; then
    if [[ -n "$(SLURM_CONF="$CONF" squeue -h -o %i 2>/dev/null)" ]]; then
        log "cancelling remaining jobs"
        SLURM_CONF="$CONF" scancel --quiet --full --partition=debug 2>/dev/null
        for _ in $(seq 100); do
            [[ -z "$(SLURM_CONF="$CONF" squeue -h -o %i 2>/dev/null)" ]] && break
            sleep 0.1
        done
    fi
fi

rc=0
stop slurmd "$STATE/slurmd.pid" || rc=1
stop slurmctld "$STATE/slurmctld.pid" || rc=1
stop munged "$STATE/munged.pid" || rc=1
exit $rc

#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine for depsi's test suite (Debian 12, Slurm 22.05,
# as root, no systemd or cgroups). Installs munge and the Slurm daemons with apt when missing,
# writes slurm.conf under the state folder, starts munged, slurmctld and slurmd, and waits for
# the node to be idle. Running it again while the cluster is up does nothing.
#
#   bash scripts/slurm-up.sh            # state folder: $DEPSI_SLURM_DIR or /tmp/depsi-slurm
#   . /tmp/depsi-slurm/env              # exports SLURM_CONF for sinfo/sbatch/squeue
#   bash scripts/slurm-down.sh          # stops exactly what this script started
#
# Exit status: 0 when the node is idle; 2 when SLURM cannot be started here (not root, no apt,
# install failed), with the reason on stderr in a line starting "slurm-up: cannot start SLURM:".
# 1 for any other failure (daemon did not come up; the logs are in the state folder).
set -uo pipefail

STATE="${DEPSI_SLURM_DIR:-/tmp/depsi-slurm}"
CONF="$STATE/slurm.conf"
# nproc alone obeys OMP_NUM_THREADS (Dask sets it to 1 in the test process); count real CPUs.
NODE_CPUS="${DEPSI_SLURM_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
WAIT_S="${DEPSI_SLURM_WAIT_S:-60}"
PACKAGES=(munge slurmctld slurmd slurm-client)

log() { echo "slurm-up: $*" >&2; }
cannot() { log "cannot start SLURM: $*"; echo "$*" > "$STATE/unavailable" 2>/dev/null; exit 2; }
die() { log "ERROR: $*"; exit 1; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

mkdir -p "$STATE" 2>/dev/null || { echo "slurm-up: cannot create $STATE" >&2; exit 2; }
rm -f "$STATE/unavailable"

[[ "$(id -u)" == 0 ]] || cannot "not running as root (uid $(id -u)); the daemons need root"

install_packages() {
    local missing=()
    for cmd in munged slurmctld slurmd sinfo; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    [[ ${#missing[@]} == 0 ]] && return 0
    command -v apt-get >/dev/null 2>&1 || cannot "missing ${missing[*]} and no apt-get to install ${PACKAGES[*]}"
    log "installing ${PACKAGES[*]} (missing: ${missing[*]})"
    # Keep the packages' maintainer scripts from starting daemons we would not track.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local ok=1
    apt-get update -qq >"$STATE/apt.log" 2>&1 \
        && apt-get install -y -qq --no-install-recommends \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            "${PACKAGES[@]}" >>"$STATE/apt.log" 2>&1 || ok=0
    [[ $own_policy == 1 ]] && rm -f "$policy"
    [[ $ok == 1 ]] || cannot "apt-get install ${PACKAGES[*]} failed (see $STATE/apt.log: $(tail -n 1 "$STATE/apt.log"))"
}

start_munge() {
    if alive "$STATE/munged.pid"; then
        log "munged already running (pid $(cat "$STATE/munged.pid"))"
        return 0
    fi
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already running (not started by this script, will not be stopped)"
        return 0
    fi
    id munge >/dev/null 2>&1 || die "user 'munge' does not exist (munge package incomplete?)"
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key --force >/dev/null
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --force >"$STATE/munged.out" 2>&1 \
        || die "munged failed to start: $(cat "$STATE/munged.out")"
    for _ in $(seq 50); do
        [[ -s /run/munge/munged.pid ]] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    [[ -s /run/munge/munged.pid ]] || die "munged wrote no pid file"
    cp /run/munge/munged.pid "$STATE/munged.pid"
    log "munged started (pid $(cat "$STATE/munged.pid"))"
}

write_conf() {
    local mem_mb
    mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    mkdir -p "$STATE/ctld" "$STATE/spool"
    cat > "$CONF" <<CONF
# One-node SLURM cluster for depsi's tests, written by scripts/slurm-up.sh.
ClusterName=depsi
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=2
DefMemPerCPU=1024
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    printf 'export SLURM_CONF=%s\n' "$CONF" > "$STATE/env"
}

node_state() { SLURM_CONF="$CONF" sinfo -h -n localhost -o %T 2>/dev/null | head -n 1; }

wait_idle() {
    local state=""
    for _ in $(seq $((WAIT_S * 5))); do
        state=$(node_state)
        case "$state" in
            idle|mixed|allocated|completing) log "node localhost is $state (SLURM_CONF=$CONF)"; return 0 ;;
            down*|drain*) SLURM_CONF="$CONF" scontrol update nodename=localhost state=resume 2>/dev/null ;;
        esac
        sleep 0.2
    done
    die "node not idle after ${WAIT_S}s (state '${state:-unknown}'); see $STATE/slurmctld.log and $STATE/slurmd.log"
}

start_slurm() {
    if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid"; then
        log "already running (slurmctld pid $(cat "$STATE/slurmctld.pid"), slurmd pid $(cat "$STATE/slurmd.pid"))"
        return 0
    fi
    alive "$STATE/slurmctld.pid" || {
        slurmctld -c -f "$CONF" >"$STATE/slurmctld.out" 2>&1 \
            || die "slurmctld failed: $(cat "$STATE/slurmctld.out"; tail -n 5 "$STATE/slurmctld.log" 2>/dev/null)"
    }
    for _ in $(seq 50); do alive "$STATE/slurmctld.pid" && break; sleep 0.1; done
    alive "$STATE/slurmctld.pid" || die "slurmctld did not stay up: $(tail -n 5 "$STATE/slurmctld.log" 2>/dev/null)"
    alive "$STATE/slurmd.pid" || {
        slurmd -f "$CONF" -N localhost >"$STATE/slurmd.out" 2>&1 \
            || die "slurmd failed: $(cat "$STATE/slurmd.out"; tail -n 5 "$STATE/slurmd.log" 2>/dev/null)"
    }
    for _ in $(seq 50); do alive "$STATE/slurmd.pid" && break; sleep 0.1; done
    alive "$STATE/slurmd.pid" || die "slurmd did not stay up: $(tail -n 5 "$STATE/slurmd.log" 2>/dev/null)"
    log "slurmctld pid $(cat "$STATE/slurmctld.pid"), slurmd pid $(cat "$STATE/slurmd.pid")"
}

start=$SECONDS
install_packages
[[ -s "$CONF" ]] && alive "$STATE/slurmctld.pid" || write_conf
start_munge
start_slurm
wait_idle
log "up in $((SECONDS - start)) s; run '. $STATE/env' to point sinfo/sbatch at it"

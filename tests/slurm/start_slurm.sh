#!/usr/bin/env bash
# A real single-node Slurm cluster (slurmctld + slurmd + munge from Debian's packages) with
# four fake `gpu:a100` GRES, for the Slurm tests. Idempotent: a healthy cluster is left as it
# is (about 0.1 s); a missing one is installed and started (about 8 s from nothing).
# Measured facts behind every setting: ../shared/notes/slurm-local.md.
#
#   tests/slurm/start_slurm.sh          install (apt) if needed, write the config, start
#   tests/slurm/start_slurm.sh stop     stop the daemons (config and packages stay)
#
# Partitions: `onepool` (what onepool's Slurm pool submits into; PriorityTier 1, jobs there
# are preempted by `urgent`, no grace), `urgent` (PriorityTier 10: jobs submitted there by
# hand preempt onepool's). Needs root (mknod, /etc/slurm, daemons). Exit 3: cannot run here.
set -euo pipefail

STATE=/var/lib/onepool-slurm
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
GPUS=4
CPUS=${SLURM_CPUS:-16}
LOG=$STATE/start.log
CONF_VERSION=onepool-test-slurm-v1

say() { echo "start_slurm: $*" >&2; }

alive() {  # pidfile -> 0 if the process lives and is not a zombie (PID 1 here reaps late)
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    [ "$(awk '{print $3}' "/proc/$pid/stat")" != Z ]
}

stop() {
    for d in slurmd slurmctld; do
        if alive "/run/$d.pid"; then kill "$(cat /run/$d.pid)" 2>/dev/null || true; fi
    done
    for _ in $(seq 50); do
        alive /run/slurmd.pid || alive /run/slurmctld.pid || break
        sleep 0.1
    done
}

if [ "${1:-}" = stop ]; then stop; exit 0; fi
if [ "$(id -u)" != 0 ]; then say "needs root (mknod, /etc/slurm, daemons)"; exit 3; fi

healthy() {
    alive /run/slurmctld.pid && alive /run/slurmd.pid && grep -q "$CONF_VERSION" "$CONF" 2>/dev/null \
        && grep -q "NodeName=$NODE " "$CONF" \
        && timeout 5 scontrol -o show node "$NODE" 2>/dev/null | grep -Eq "State=(IDLE|MIXED|ALLOCATED)[ +]" \
        && timeout 5 scontrol -o show node "$NODE" 2>/dev/null | grep -q "Gres=gpu:a100:$GPUS"
}
if healthy; then exit 0; fi

mkdir -p "$STATE"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    say "installing slurmctld slurmd slurm-client munge from Debian (about 7 s)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge; } >"$LOG" 2>&1 \
        || { say "apt-get failed (see $LOG)"; tail -5 "$LOG" >&2; exit 3; }
fi

getent hosts "$NODE" >/dev/null || echo "127.0.0.1 $NODE" >>/etc/hosts

# munge: the key, then the daemon (as the munge user, which the package created)
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! alive /run/munge/munged.pid; then
    rm -f /run/munge/munge.socket.2
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
fi

# fake GPUs: character devices (major 195 like /dev/nvidiaN) so Slurm sets CUDA_VISIBLE_DEVICES
mkdir -p "$STATE/fakegpu"
for i in $(seq 0 $((GPUS - 1))); do
    [ -c "$STATE/fakegpu/nvidia$i" ] || mknod -m 666 "$STATE/fakegpu/nvidia$i" c 195 "$i"
done

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
NEW=$(mktemp)
cat >"$NEW" <<EOF
# $CONF_VERSION: written by onepool's tests/slurm/start_slurm.sh
ClusterName=onepool-test
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
SlurmctldParameters=preempt_send_user_signal
SlurmdParameters=config_overrides
SchedulerParameters=bf_interval=1,sched_interval=2
KillWait=5
MinJobAge=600
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
NodeName=$NODE CPUs=$CPUS RealMemory=4000 Gres=gpu:a100:$GPUS State=UNKNOWN
PartitionName=onepool Nodes=$NODE Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=0 MaxTime=INFINITE State=UP
PartitionName=urgent Nodes=$NODE PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
cat >"$STATE/gres.conf" <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu Type=a100 File=$STATE/fakegpu/nvidia[0-$((GPUS - 1))]
EOF
if ! cmp -s "$NEW" "$CONF" || ! cmp -s "$STATE/gres.conf" /etc/slurm/gres.conf; then
    say "writing $CONF (node $NODE, $GPUS fake a100 GPUs, $CPUS CPUs)"
    stop
    cp "$NEW" "$CONF"
    cp "$STATE/gres.conf" /etc/slurm/gres.conf
fi
rm -f "$NEW"

alive /run/slurmctld.pid || slurmctld
alive /run/slurmd.pid || slurmd
for _ in $(seq 100); do
    line=$(timeout 5 scontrol -o show node "$NODE" 2>/dev/null || true)
    case "$line" in
        *State=*DRAIN*|*State=*DOWN*|*State=*INVAL*)
            scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    if echo "$line" | grep -Eq "State=(IDLE|MIXED|ALLOCATED)[ +]" && echo "$line" | grep -q "Gres=gpu:a100:$GPUS"; then
        exit 0
    fi
    sleep 0.1
done
say "the node did not become idle with gpu:a100:$GPUS in 10 s:"
timeout 5 scontrol -o show node "$NODE" >&2 || true
tail -5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 3

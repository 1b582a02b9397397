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
# hand preempt onepool's), and, where a network namespace can be made, `gang`: this node plus
# a second one, `sn2` (its own slurmd in namespace opslurm2 at 10.231.254.3, four more fake
# GPUs), for multi-node jobs. Needs root (mknod, /etc/slurm, daemons). Exit 3: cannot run here.
set -euo pipefail

STATE=/var/lib/onepool-slurm
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
GPUS=4
CPUS=${SLURM_CPUS:-16}
LOG=$STATE/start.log
CONF_VERSION=onepool-test-slurm-v3
NS=opslurm2 BR=opslurm-br NET=10.231.254 N2=sn2

say() { echo "start_slurm: $*" >&2; }

alive() {  # pidfile -> 0 if the process lives and is not a zombie (PID 1 here reaps late)
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    [ "$(awk '{print $3}' "/proc/$pid/stat")" != Z ]
}

PIDS="/run/slurmctld.pid /run/slurmd.$NODE.pid /run/slurmd.$N2.pid"
stop() {
    for f in $PIDS; do
        if alive "$f"; then kill "$(cat "$f")" 2>/dev/null || true; fi
    done
    for _ in $(seq 50); do
        any=0
        for f in $PIDS; do alive "$f" && any=1; done
        [ $any = 0 ] && break
        sleep 0.1
    done
}

netns() {  # the second node's network: a bridge on the host, a namespace behind a veth pair
    ip netns list 2>/dev/null | grep -qw "$NS" || ip netns add "$NS" || return 1
    if ! ip link show "$BR" >/dev/null 2>&1; then
        ip link add "$BR" type bridge && ip addr add "$NET.1/24" dev "$BR" || return 1
    fi
    ip link set "$BR" up || return 1
    if ! ip link show opslurm-h2 >/dev/null 2>&1; then
        ip link add opslurm-h2 type veth peer name opslurm-n2 && ip link set opslurm-n2 netns "$NS" \
            && ip link set opslurm-h2 master "$BR" || return 1
    fi
    ip link set opslurm-h2 up || return 1
    ip netns exec "$NS" sh -c "ip addr show opslurm-n2 | grep -q '$NET.3/' || ip addr add $NET.3/24 dev opslurm-n2; \
        ip link set opslurm-n2 up && ip link set lo up"
}

if [ "${1:-}" = stop ]; then stop; exit 0; fi
if [ "$(id -u)" != 0 ]; then say "needs root (mknod, /etc/slurm, daemons)"; exit 3; fi

node_ok() {
    local line
    line=$(timeout 5 scontrol -o show node "$1" 2>/dev/null) || return 1
    echo "$line" | grep -Eq "State=(IDLE|MIXED|ALLOCATED)[ +]" && echo "$line" | grep -q "Gres=gpu:a100:$GPUS"
}
healthy() {
    alive /run/slurmctld.pid && alive "/run/slurmd.$NODE.pid" && grep -q "$CONF_VERSION" "$CONF" 2>/dev/null \
        && grep -q "NodeName=$NODE " "$CONF" && node_ok "$NODE" \
        && { ! grep -q "NodeName=$N2 " "$CONF" || { alive "/run/slurmd.$N2.pid" && node_ok "$N2"; }; }
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
    j=$((i + GPUS))
    [ -c "$STATE/fakegpu/nvidia$j" ] || mknod -m 666 "$STATE/fakegpu/nvidia$j" c 195 "$j"
done
TWO=0
if [ "${SLURM_ONE_NODE:-0}" != 1 ] && netns >>"$LOG" 2>&1; then TWO=1; else say "no network namespace: one node only"; fi

mkdir -p /etc/slurm /var/lib/slurm/slurmctld "/var/lib/slurm/slurmd.$NODE" "/var/lib/slurm/slurmd.$N2" /var/log/slurm
if [ $TWO = 1 ]; then
    CTLD="$NODE($NET.1)" ADDR=" NodeAddr=$NET.1"
    SECOND="NodeName=$N2 NodeAddr=$NET.3 NodeHostname=$NODE CPUs=$CPUS RealMemory=4000 Gres=gpu:a100:$GPUS State=UNKNOWN
PartitionName=gang Nodes=$NODE,$N2 PriorityTier=1 PreemptMode=REQUEUE GraceTime=0 MaxTime=INFINITE State=UP"
    SECOND_GRES="NodeName=$N2 Name=gpu Type=a100 File=$STATE/fakegpu/nvidia[$GPUS-$((2 * GPUS - 1))]"
else
    CTLD=$NODE ADDR="" SECOND="" SECOND_GRES=""
fi
NEW=$(mktemp)
cat >"$NEW" <<EOF
# $CONF_VERSION: written by onepool's tests/slurm/start_slurm.sh
ClusterName=onepool-test
SlurmctldHost=$CTLD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd.%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.%n.log
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
KillWait=15
MinJobAge=600
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
NodeName=$NODE$ADDR CPUs=$CPUS RealMemory=4000 Gres=gpu:a100:$GPUS State=UNKNOWN
$SECOND
PartitionName=onepool Nodes=$NODE Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=0 MaxTime=INFINITE State=UP
PartitionName=urgent Nodes=$NODE PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
cat >"$STATE/gres.conf" <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu Type=a100 File=$STATE/fakegpu/nvidia[0-$((GPUS - 1))]
$SECOND_GRES
EOF
if ! cmp -s "$NEW" "$CONF" || ! cmp -s "$STATE/gres.conf" /etc/slurm/gres.conf; then
    say "writing $CONF (node $NODE, $GPUS fake a100 GPUs, $CPUS CPUs)"
    stop
    cp "$NEW" "$CONF"
    cp "$STATE/gres.conf" /etc/slurm/gres.conf
fi
rm -f "$NEW"

NODES=$NODE
alive /run/slurmctld.pid || slurmctld
alive "/run/slurmd.$NODE.pid" || slurmd -N "$NODE"
if [ $TWO = 1 ]; then  # nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs its cgroup mounts
    NODES="$NODE $N2"
    alive "/run/slurmd.$N2.pid" || nsenter --net="/var/run/netns/$NS" slurmd -N "$N2"
fi
for _ in $(seq 100); do
    ok=1
    for n in $NODES; do
        line=$(timeout 5 scontrol -o show node "$n" 2>/dev/null || true)
        case "$line" in
            *State=*DRAIN*|*State=*DOWN*|*State=*INVAL*)
                scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true ;;
        esac
        node_ok "$n" || ok=0
    done
    [ $ok = 1 ] && exit 0
    sleep 0.1
done
say "the nodes ($NODES) did not become idle with gpu:a100:$GPUS in 10 s:"
for n in $NODES; do timeout 5 scontrol -o show node "$n" >&2 || true; done
tail -5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.*.log >&2 || true
exit 3

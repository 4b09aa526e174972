#!/usr/bin/env bash
# A one-node Slurm cluster on loopback, for gmux's cluster tests (docs/cluster.md).
#
#   scripts/slurm-testbed.sh start DIR [PROLOG EPILOG TASKPROLOG TASKEPILOG]
#   scripts/slurm-testbed.sh stop DIR
#
# start: installs munge, slurmctld, slurmd and the client from Debian's packages when missing,
# writes slurm.conf, gres.conf and cgroup.conf into DIR (a `gpu` GRES on a stand-in device file,
# with 8 `shard`s; proctrack/cgroup on the host's cgroups), starts munged, slurmctld and slurmd
# (all as root, listening on loopback ports picked free), waits until the node is idle, and
# prints `export SLURM_CONF=DIR/slurm.conf`. The optional scripts become Prolog, Epilog,
# TaskProlog and TaskEpilog. stop: stops what start started (by the pid files in DIR). Needs root.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" || ( "$cmd" != start && "$cmd" != stop ) ]]; then
  echo "usage: $0 start DIR [PROLOG EPILOG TASKPROLOG TASKEPILOG] | stop DIR" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "$0: must run as root (slurmd and munged do)" >&2
  exit 2
fi

stop() {
  local p
  for p in slurmd slurmctld munged; do
    if [[ -f "$dir/$p.pid" ]]; then
      local pid
      pid=$(cat "$dir/$p.pid" 2>/dev/null || true)
      if [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; then
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$dir/$p.pid"
    fi
  done
}

if [[ "$cmd" == stop ]]; then
  stop
  exit 0
fi

# proctrack/cgroup on cgroup v1: what these hosts offer. A host with cgroup v2 only would need
# cgroup/v2, which Slurm 22.05 runs under systemd's slurmstepd.scope: not written here.
if [[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" == cgroup2fs ]]; then
  echo "$0: this host has cgroup v2 only; the test bed is written for cgroup v1" >&2
  exit 3
fi

need=()
command -v munged >/dev/null || need+=(munge)
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
if (( ${#need[@]} )); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
prolog=${3:-}
epilog=${4:-}
taskprolog=${5:-}
taskepilog=${6:-}
chmod 755 "$dir"
mkdir -p "$dir/munge" "$dir/ctld" "$dir/spool" "$dir/dev"
chmod 700 "$dir/munge"

free_port() {  # a loopback port nothing listens on
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  echo "$0: no free port" >&2
  return 1
}
ctld_port=$(free_port)
slurmd_port=$(free_port)
node=$(hostname -s)

# munge: a key of our own, its socket in DIR.
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
chmod 755 "$dir/munge"  # clients (the users' sbatch) reach the socket

# A stand-in for the GPU's device file: Slurm 22.05 wants a `gpu` GRES under `shard`s.
# Slurm checks that it is a device: one like /dev/null (1:3), which nobody here opens.
rm -f "$dir/dev/gpu0"
mknod -m 666 "$dir/dev/gpu0" c 1 3

cat > "$dir/slurm.conf" <<CONF
ClusterName=gmuxtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu,shard
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 RealMemory=1024 Gres=gpu:1,shard:8 State=UNKNOWN
PartitionName=gmux Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
[[ -n "$prolog" ]] && echo "Prolog=$prolog" >> "$dir/slurm.conf"
[[ -n "$epilog" ]] && echo "Epilog=$epilog" >> "$dir/slurm.conf"
[[ -n "$taskprolog" ]] && echo "TaskProlog=$taskprolog" >> "$dir/slurm.conf"
[[ -n "$taskepilog" ]] && echo "TaskEpilog=$taskepilog" >> "$dir/slurm.conf"

cat > "$dir/gres.conf" <<CONF
NodeName=$node Name=gpu File=$dir/dev/gpu0
NodeName=$node Name=shard Count=8 File=$dir/dev/gpu0
CONF
cat > "$dir/cgroup.conf" <<CONF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainDevices=no
ConstrainCores=no
ConstrainRAMSpace=no
CONF
chmod 644 "$dir"/*.conf

export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$dir/slurm.conf" -i
slurmd -f "$dir/slurm.conf"
for _ in $(seq 150); do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
  [[ "$state" == idle ]] && break
  sleep 0.2
done
if [[ "${state:-}" != idle ]]; then
  echo "$0: the node did not come up (state '${state:-none}'); logs in $dir" >&2
  tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  stop
  exit 1
fi
echo "export SLURM_CONF=$dir/slurm.conf"

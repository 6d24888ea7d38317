#!/usr/bin/env bash
# Runs examples/slurm/train_fashion_mnist.sbatch through a real single-node Slurm: starts munged,
# slurmctld and slurmd as root with a minimal configuration (proctrack/linuxproc, task/none,
# state, spool, sockets and logs under a temporary directory), submits the script twice with
# sbatch (launched with srun --mpi=pmi2, then with mpiexec inside the allocation), waits for each
# job's end state with scontrol, checks
# that both jobs completed and trained, and stops the daemons again. Exit 77 (skipped) with the
# reason when Slurm cannot be started here.
# usage: run_slurm.sh SBATCH_SCRIPT TRAIN_BINARY DATA_FILE
set -uo pipefail
script=${1:?sbatch script}
binary=${2:?example 10 binary}
data=${3:?data file}

skip() {
  echo "SKIPPED: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "starting slurmctld/slurmd/munged needs root"
for b in munged slurmctld slurmd sbatch srun sinfo scontrol; do
  command -v "$b" >/dev/null || skip "$b not found (Debian: slurm-wlm munge)"
done
[ -f "$data" ] || skip "data file $data not found"

tmp=$(mktemp -d /tmp/dtrain-slurm.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp"/{state,spool,munge,log}
chmod 700 "$tmp/munge"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
host=$(hostname -s)
ncpu=$(getconf _NPROCESSORS_ONLN)
(( ncpu < 2 )) && ncpu=2

dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munged --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.socket" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/log/munged.log" \
  --seed-file="$tmp/munge/munge.seed" || skip "munged did not start: $(tail -n 3 "$tmp/log/munged.log" 2>/dev/null)"
for _ in $(seq 50); do [ -s "$tmp/munge/munged.pid" ] && break; sleep 0.1; done
pids+=("$(cat "$tmp/munge/munged.pid")")

cat > "$tmp/slurm.conf" <<CONF
ClusterName=dtraintest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.socket
CredType=cred/munge
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$ncpu State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=30 State=UP
CONF
export SLURM_CONF=$tmp/slurm.conf

slurmctld -D -i >/dev/null 2>&1 &
pids+=($!)
slurmd -D >/dev/null 2>&1 &
pids+=($!)
ready=0
for _ in $(seq 100); do
  if [ "$(sinfo -h -n "$host" -o %t 2>/dev/null)" = "idle" ]; then ready=1; break; fi
  sleep 0.2
done
if [ $ready -ne 1 ]; then
  echo "slurmctld log:"; tail -n 5 "$tmp/log/slurmctld.log" 2>/dev/null
  echo "slurmd log:"; tail -n 5 "$tmp/log/slurmd.log" 2>/dev/null
  skip "the single-node Slurm did not come up (node not idle within 20 s)"
fi
echo "slurm: $(sinfo -h -o '%P %D %t %C')"

status=0
for launcher in srun mpiexec; do
  out="$tmp/job-$launcher.out"
  rm -rf "$tmp/run-$launcher"
  # A short run with a checkpoint, so the job exercises MPI, HDF5 reads and writes; no accuracy
  # target (this checks the batch system, not the training).
  # Submitted, then its state polled every 0.2 s: sbatch --wait polls at intervals of seconds
  # (10 s per 2 s job here).
  # The script's multi-level checkpoints, node-local directory inside the test's own.
  job=$(DTRAIN_LAUNCHER=$launcher DTRAIN_CKPT_LOCAL_DIR="$tmp/local-$launcher" sbatch --parsable --ntasks=2 --output="$out" \
      --chdir="$tmp" "$script" "$binary" --data "$data" --max-steps 60 --log-every 20 \
      --run-dir "$tmp/run-$launcher" --ckpt-every 30 --no-plot --target 0) || job=""
  state=""
  if [ -n "$job" ]; then
    for _ in $(seq 1400); do  # 280 s
      state=$(scontrol show job -o "${job%%;*}" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
      case "$state" in PENDING|CONFIGURING|RUNNING|COMPLETING|"") sleep 0.2 ;; *) break ;; esac
    done
  fi
  if [ "$state" != COMPLETED ]; then
    echo "FAIL: the $launcher job did not complete successfully (job ${job:-not submitted}, state ${state:-unknown})"
    [ -n "$job" ] && scontrol cancel "${job%%;*}" 2>/dev/null
    status=1
  fi
  echo "---- job output ($launcher) ----"
  cat "$out" 2>/dev/null
  if ! grep -q "launcher $launcher" "$out" 2>/dev/null; then
    echo "FAIL: the $launcher job did not run the script"
    status=1
  fi
  if ! ls "$tmp/run-$launcher"/ckpt-*.h5 >/dev/null 2>&1; then
    echo "FAIL: the $launcher job left no checkpoint"
    status=1
  fi
  if ! ls "$tmp/local-$launcher"/ckpt-*.h5 >/dev/null 2>&1; then
    echo "FAIL: the $launcher job left no node-local checkpoint"
    status=1
  fi
done
[ $status -eq 0 ] && echo "PASS"
exit $status

#!/usr/bin/env bash
# Two builds of train_bench side by side, quiet and under N CPU-bound busy loops, in one run: the
# before/after check of a change to how the communication layer waits (detail/backoff.hpp,
# detail/futex_wait.hpp). Each build runs in turn under the same conditions, REPS times
# alternating; perf stat counts the context switches and CPU time of the whole mpiexec job.
#   benchmarks/compare/waits_ab.sh BUILD_A BUILD_B OUT_DIR [STEPS] [LOAD] [CONFIG] [REPS]
#   CONFIG = "HIDDEN BATCH OPTIMIZER" (default "1024 128 sgd"), LOAD default 2, REPS default 2.
# A baseline build of an earlier commit, e.g. the one before the kernel waits:
#   git archive 0dff0e2cc8 | tar -x -C /tmp/base && cd /tmp/base && source scripts/lib.sh &&
#   configure_build build && cmake --build build --target train_bench
set -euo pipefail
A=${1:?first build directory}
B=${2:?second build directory}
OUT=${3:?output directory}
STEPS=${4:-300}
LOAD=${5:-2}
CONFIG=${6:-1024 128 sgd}
REPS=${7:-2}
read -r hidden batch opt <<<"$CONFIG"
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
pids=()
stop_load() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_load EXIT
run() {  # run NAME BUILD SUFFIX
  local name=$1 build=$2 suffix=$3
  perf stat -x, -e context-switches,task-clock -o "$OUT/$name-$suffix.perf" -- \
    mpiexec.mpich -n 2 "$build/benchmarks/train_bench" --hidden "$hidden" --batch "$batch" \
    --optimizer "$opt" --steps "$STEPS" --json "$OUT/$name-$suffix.json" >"$OUT/$name-$suffix.txt"
}
for ((r = 0; r < REPS; ++r)); do
  run A "$A" "quiet-$r"
  run B "$B" "quiet-$r"
  if ((LOAD > 0)); then
    for ((i = 0; i < LOAD; ++i)); do
      bash -c 'while :; do :; done' &
      pids+=($!)
    done
    run A "$A" "load-$r"
    run B "$B" "load-$r"
    stop_load
  fi
done
/usr/bin/python3 - "$OUT" "$REPS" "$LOAD" "$A" "$B" <<'PY'
import json, sys
out, reps, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(f"A = {sys.argv[4]}, B = {sys.argv[5]}; 2-rank samples/s per mode, context switches and CPU "
      "seconds of the whole job")
print("| rep | condition | build | overlap | no-overlap | fused | ctx switches | CPU s |")
print("|---|---|---|---|---|---|---|---|")
for r in range(reps):
    for cond in (["quiet"] + ([f"load"] if load else [])):
        for name in "AB":
            d = json.load(open(f"{out}/{name}-{cond}-{r}.json"))
            perf = {l.split(",")[2]: l.split(",")[0] for l in open(f"{out}/{name}-{cond}-{r}.perf")
                    if l.count(",") > 2}
            m = {k: v["samples_per_s_2"] for k, v in d["modes"].items()}
            c = cond if cond == "quiet" else f"{load} busy loops"
            print(f"| {r} | {c} | {name} | {m.get('overlap', 0):.0f} | {m.get('no-overlap', 0):.0f} | "
                  f"{m.get('fused', 0):.0f} | {perf.get('context-switches', '?')} | "
                  f"{float(perf.get('task-clock', 'nan')) / 1e3:.1f} |")
PY

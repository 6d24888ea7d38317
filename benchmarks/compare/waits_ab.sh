#!/usr/bin/env bash
# Two builds of train_bench side by side, quiet and under N CPU-bound busy loops, in one run: the
# before/after check of a change to how the communication layer waits (detail/backoff.hpp,
# detail/futex_wait.hpp, detail/progress_engine.hpp). Each build runs in turn under the same
# conditions, REPS times alternating; perf stat counts the context switches and CPU time of the
# whole mpiexec job.
#   benchmarks/compare/waits_ab.sh BUILD_A BUILD_B OUT_DIR [STEPS] [LOAD] [CONFIG] [REPS]
#   CONFIG = "HIDDEN BATCH OPTIMIZER" (default "1024 128 sgd"), LOAD default 2, REPS default 2.
# Environment:
#   PROGRESS="thread caller"  also alternate DTRAIN_COMM_PROGRESS (default: thread only)
#   ALLREDUCE=1               each repetition first runs allreduce_bench of both builds (2 ranks,
#                             DTRAIN_SHM=0, 4 KiB-256 KiB, rd/rhd/ring, median of 3 rounds) and
#                             the summary adds its times and the calibration's latency terms
# A baseline build of an earlier commit, e.g. the one before the kernel waits:
#   git archive 0dff0e2cc8 | tar -x -C /tmp/base && cd /tmp/base && source scripts/lib.sh &&
#   configure_build build && cmake --build build --target train_bench allreduce_bench
set -euo pipefail
A=${1:?first build directory}
B=${2:?second build directory}
OUT=${3:?output directory}
STEPS=${4:-300}
LOAD=${5:-2}
CONFIG=${6:-1024 128 sgd}
REPS=${7:-2}
PROGRESS=${PROGRESS:-thread}
ALLREDUCE=${ALLREDUCE:-0}
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
run() {  # run NAME BUILD SUFFIX PROGRESS
  local name=$1 build=$2 suffix=$3 progress=$4
  DTRAIN_COMM_PROGRESS=$progress perf stat -x, -e context-switches,task-clock \
    -o "$OUT/$name-$suffix-$progress.perf" -- \
    mpiexec.mpich -n 2 "$build/benchmarks/train_bench" --hidden "$hidden" --batch "$batch" \
    --optimizer "$opt" --steps "$STEPS" --json "$OUT/$name-$suffix-$progress.json" \
    >"$OUT/$name-$suffix-$progress.txt"
}
allreduce() {  # allreduce NAME BUILD REP
  DTRAIN_SHM=0 mpiexec.mpich -n 2 "$2/benchmarks/allreduce_bench" -b 4K -e 256K -f 4 -n 50 -w 5 \
    -R 3 --algo rd,rhd,ring --stat median --json "$OUT/$1-allreduce-$3.json" >/dev/null
}
echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/log.txt"
for ((r = 0; r < REPS; ++r)); do
  if ((ALLREDUCE)); then
    allreduce A "$A" "$r"
    allreduce B "$B" "$r"
  fi
  for p in $PROGRESS; do
    run A "$A" "quiet-$r" "$p"
    run B "$B" "quiet-$r" "$p"
  done
  if ((LOAD > 0)); then
    for ((i = 0; i < LOAD; ++i)); do
      bash -c 'while :; do :; done' &
      pids+=($!)
    done
    for p in $PROGRESS; do
      run A "$A" "load-$r" "$p"
      run B "$B" "load-$r" "$p"
    done
    stop_load
  fi
  echo "rep $r done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/log.txt"
done
/usr/bin/python3 - "$OUT" "$REPS" "$LOAD" "$A" "$B" "$PROGRESS" "$ALLREDUCE" <<'PY'
import json, statistics, sys
out, reps, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
progress, allreduce = sys.argv[6].split(), int(sys.argv[7])
print(f"A = {sys.argv[4]}, B = {sys.argv[5]}; 2-rank samples/s per mode, context switches and CPU "
      "seconds of the whole job")
print("| rep | condition | progress | build | overlap | no-overlap | fused | ctx switches | CPU s |")
print("|---|---|---|---|---|---|---|---|---|")
sps = {}
for r in range(reps):
    for cond in ["quiet"] + (["load"] if load else []):
        for p in progress:
            for name in "AB":
                base = f"{out}/{name}-{cond}-{r}-{p}"
                d = json.load(open(base + ".json"))
                perf = {l.split(",")[2]: l.split(",")[0] for l in open(base + ".perf")
                        if l.count(",") > 2}
                m = {k: v["samples_per_s_2"] for k, v in d["modes"].items()}
                for k, v in m.items():
                    sps.setdefault((cond, p, k, name), []).append(v)
                c = cond if cond == "quiet" else f"{load} busy loops"
                print(f"| {r} | {c} | {p} | {name} | {m.get('overlap', 0):.0f} | "
                      f"{m.get('no-overlap', 0):.0f} | {m.get('fused', 0):.0f} | "
                      f"{perf.get('context-switches', '?')} | "
                      f"{float(perf.get('task-clock', 'nan')) / 1e3:.1f} |")
print("\nMedians over the repetitions, B / A:")
print("| condition | progress | mode | A | B | B / A |")
print("|---|---|---|---|---|---|")
for (cond, p, k, name), v in sorted(sps.items()):
    if name != "A" or (cond, p, k, "B") not in sps:
        continue
    a, b = statistics.median(v), statistics.median(sps[(cond, p, k, "B")])
    print(f"| {cond} | {p} | {k} | {a:.0f} | {b:.0f} | {b / a:.2f} |")
if allreduce:
    cells, terms = {}, {"A": [], "B": []}
    for r in range(reps):
        for name in "AB":
            d = json.load(open(f"{out}/{name}-allreduce-{r}.json"))
            cm = d["cost_model"]
            terms[name].append(f"{cm['alpha'] * 1e6:.2f}/{cm['call'] * 1e6:.2f}")
            for row in d["rows"]:
                cells.setdefault((row["algo"], row["bytes"], name), []).append(row["time_us"])
    print("\nallreduce_bench, 2 ranks, DTRAIN_SHM=0, us (median of the repetitions' medians):")
    print("| algo | size | A | B | B / A |")
    print("|---|---|---|---|---|")
    for algo, size, name in sorted(cells):
        if name != "A":
            continue
        a = statistics.median(cells[(algo, size, "A")])
        b = statistics.median(cells[(algo, size, "B")])
        print(f"| {algo} | {size // 1024} KiB | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    for name in "AB":
        print(f"calibration alpha / per-call term (us), {name}: {', '.join(terms[name])}")
PY

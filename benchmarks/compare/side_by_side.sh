#!/usr/bin/env bash
# dtrain's train_bench next to PyTorch DDP (ddp_bench.py) on the same machine in one run: the three
# configurations of benchmarks/RESULTS.md, each framework in turn, 2 ranks, one thread per rank.
#   benchmarks/compare/side_by_side.sh [--load N] [--rounds N] [--configs "H B OPT;H B OPT..."]
#       BUILD_DIR OUT_DIR [STEPS]
# Needs BUILD_DIR/benchmarks/train_bench and Debian's python3-torch (installed here when missing,
# as root; otherwise the apt-get line is printed). Writes one JSON per run into OUT_DIR and prints
# the table with the ratios dtrain / PyTorch.
# --load N: after the quiet pair of runs of a configuration, start N CPU-bound busy loops (one
# process each), run both frameworks again under that load, then stop the loops; the second table
# compares each framework's loaded throughput with its own quiet one, so "dtrain's slowdown under
# load is no worse than PyTorch's" is read off one run (last column >= 1), and the third splits
# that "kept" into the share of the machine each job received under load (its cores loaded over
# its cores quiet, from /proc/stat and the loops' own CPU time) and the work it did per core; the
# fourth sets each framework's kept against the most a fair scheduler lets it keep: its share of
# the cores under the load over the cores its 2-rank figure used quiet.
# --rounds N: interleaved rounds of both benches' 1- and 2-rank figures (each figure the median of
# N; default 1).
# --configs: the configurations to run (default "256 64 adamw;1024 128 sgd;1024 128 adamw").
set -euo pipefail
LOAD=0
ROUNDS=1
CONFIGS="256 64 adamw;1024 128 sgd;1024 128 adamw"
while [[ $# -gt 0 && $1 == --* ]]; do
  case "$1" in
    --load)
      LOAD=${2:?--load needs a count}
      [[ $LOAD =~ ^[0-9]+$ ]] || { echo "side_by_side.sh: --load wants a count, got '$LOAD'" >&2; exit 2; }
      shift 2 ;;
    --rounds)
      ROUNDS=${2:?--rounds needs a count}
      [[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "side_by_side.sh: --rounds wants a count, got '$ROUNDS'" >&2; exit 2; }
      shift 2 ;;
    --configs) CONFIGS=${2:?--configs needs a list}; shift 2 ;;
    *) echo "side_by_side.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
BUILD=${1:?build directory}
OUT=${2:?output directory}
STEPS=${3:-300}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/lib.sh
source "$HERE/../../scripts/lib.sh"
ensure_packages python3-torch
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Under Linux's autogroup scheduling, CPU time is shared between sessions first. MPICH's mpiexec
# (hydra) starts every rank in a session of its own, while PyTorch's ranks and the busy loops stay
# in this script's session: a load then weighs differently on the two frameworks (and, with this
# session reniced, the loops take almost all CPU from dtrain's ranks). Say which regime the run is in.
AUTOGROUP=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo absent)
echo "== scheduler: sched_autogroup_enabled=$AUTOGROUP, this session $(cat /proc/self/autogroup 2>/dev/null || echo '(no autogroup)')"
if ((LOAD > 0)) && [[ $AUTOGROUP == 1 ]]; then
  echo "side_by_side.sh: warning: autogroup scheduling is on, so the load does not weigh alike on both" \
       "frameworks; for a fair loaded comparison run with it off (echo 0 > /proc/sys/kernel/sched_autogroup_enabled)" >&2
fi
IFS=';' read -r -a configs <<<"$CONFIGS"

load_pids=()
stop_load() {
  local pid
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${load_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  load_pids=()
}
start_load() {
  local i
  for ((i = 0; i < LOAD; ++i)); do
    bash -c 'while :; do :; done' &
    load_pids+=($!)
  done
}
trap stop_load EXIT

# CPU accounting of a run, so that a loaded run can be read as "how much of the machine did the
# job get" and "what did it do with it": the machine's busy jiffies and all jiffies so far
# (/proc/stat), and the busy loops' own (utime + stime).
machine_jiffies() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
load_jiffies() {
  local pid sum=0 t
  for pid in "${load_pids[@]}"; do
    t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    sum=$((sum + t))
  done
  echo "$sum"
}
# timed_cpu FILE CMD...: runs CMD and writes to FILE the cores the job used on average over its
# run: the machine's busy cores less the busy loops' (any other process counts as the job's, so
# run on an otherwise idle machine). Cores by getconf: nproc honours the OMP_NUM_THREADS=1 above.
timed_cpu() {
  local file=$1 b0 t0 l0 b1 t1 l1
  shift
  read -r b0 t0 < <(machine_jiffies)
  l0=$(load_jiffies)
  "$@"
  read -r b1 t1 < <(machine_jiffies)
  l1=$(load_jiffies)
  echo "$b0 $t0 $l0 $b1 $t1 $l1 $(getconf _NPROCESSORS_ONLN)" |
    awk '{cores = $7 * (($4 - $1) - ($6 - $3)) / ($5 - $2); printf "%.3f\n", cores}' >"$file"
}

# run_pair TAG SUFFIX: dtrain then PyTorch for one configuration, results as *-TAG-SUFFIX.json
# and the cores each job used as cpu-*-TAG-SUFFIX.txt.
run_pair() {
  local tag=$1 suffix=$2
  echo "== $tag ($suffix): dtrain train_bench"
  timed_cpu "$OUT/cpu-dtrain-$tag-$suffix.txt" \
    mpiexec.mpich -n 2 "$BUILD/benchmarks/train_bench" --hidden "$hidden" --batch "$batch" \
    --optimizer "$opt" --steps "$STEPS" --rounds "$ROUNDS" --json "$OUT/dtrain-$tag-$suffix.json"
  echo "== $tag ($suffix): PyTorch DDP"
  timed_cpu "$OUT/cpu-torch-$tag-$suffix.txt" \
    /usr/bin/python3 "$HERE/ddp_bench.py" --hidden "$hidden" --batch "$batch" --optimizer "$opt" \
    --steps "$STEPS" --rounds "$ROUNDS" --json "$OUT/torch-$tag-$suffix.json"
}

for c in "${configs[@]}"; do
  read -r hidden batch opt <<<"$c"
  tag="h${hidden}-b${batch}-${opt}"
  run_pair "$tag" quiet
  if ((LOAD > 0)); then
    start_load
    echo "== load: $LOAD busy loops (pids ${load_pids[*]}), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    run_pair "$tag" "load$LOAD"
    stop_load
  fi
done

/usr/bin/python3 - "$OUT" "$LOAD" "$(getconf _NPROCESSORS_ONLN)" "${configs[@]}" <<'PY'
import json, sys
out, load, ncpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
configs = [c.split() for c in sys.argv[4:]]
def get(fw, tag, suffix):
    return json.load(open(f"{out}/{fw}-{tag}-{suffix}.json"))
print("| model | optimizer | batch/rank | dtrain 1 rank | dtrain 2 ranks | dtrain eff. | "
      "PyTorch 1 rank | PyTorch 2 ranks | PyTorch eff. | 2-rank ratio | dtrain optimizer share |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for h, b, o in configs:
    tag = f"h{h}-b{b}-{o}"
    d, t = get("dtrain", tag, "quiet"), get("torch", tag, "quiet")
    print(f"| 784-{h}-{h}-10 | {o} | {b} | {d['samples_per_s_1']:.0f} | {d['samples_per_s_2']:.0f} | "
          f"{d['scaling_efficiency']:.3f} | {t['samples_per_s_1']:.0f} | {t['samples_per_s_2']:.0f} | "
          f"{t['scaling_efficiency']:.3f} | {d['samples_per_s_2'] / t['samples_per_s_2']:.2f}x | "
          f"{100 * d['phase_split_2']['optimizer']:.1f}% |")
if load:
    print()
    print(f"Under load ({load} busy loops), 2-rank samples/s; kept = loaded / quiet of the same framework:")
    print("| model | optimizer | batch/rank | dtrain quiet | dtrain loaded | dtrain kept | "
          "PyTorch quiet | PyTorch loaded | PyTorch kept | loaded ratio dtrain / PyTorch | "
          "dtrain kept / PyTorch kept |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for h, b, o in configs:
        tag = f"h{h}-b{b}-{o}"
        dq, dl = get("dtrain", tag, "quiet"), get("dtrain", tag, f"load{load}")
        tq, tl = get("torch", tag, "quiet"), get("torch", tag, f"load{load}")
        dk = dl["samples_per_s_2"] / dq["samples_per_s_2"]
        tk = tl["samples_per_s_2"] / tq["samples_per_s_2"]
        print(f"| 784-{h}-{h}-10 | {o} | {b} | {dq['samples_per_s_2']:.0f} | "
              f"{dl['samples_per_s_2']:.0f} | {dk:.2f} | {tq['samples_per_s_2']:.0f} | "
              f"{tl['samples_per_s_2']:.0f} | {tk:.2f} | "
              f"{dl['samples_per_s_2'] / tl['samples_per_s_2']:.2f}x | {dk / tk:.2f} |")
    print()
    print("Where the loaded throughput went: the cores each job used (the whole run, 1- and 2-rank "
          "figures; loaded: the machine's busy cores less the loops'), the share of them it kept under "
          "load (CPU kept), and its 2-rank samples/s kept per core kept (1.00: the load cost it only "
          "CPU time; below: the cores it got did less work than quiet ones):")
    print("| model | optimizer | dtrain cores quiet / loaded | dtrain CPU kept | dtrain kept per CPU | "
          "PyTorch cores quiet / loaded | PyTorch CPU kept | PyTorch kept per CPU |")
    print("|---|---|---|---|---|---|---|---|")
    def cores(fw, tag, suffix):
        return float(open(f"{out}/cpu-{fw}-{tag}-{suffix}.txt").read())
    for h, b, o in configs:
        tag = f"h{h}-b{b}-{o}"
        row = f"| 784-{h}-{h}-10 | {o} |"
        for fw in ("dtrain", "torch"):
            q, l = cores(fw, tag, "quiet"), cores(fw, tag, f"load{load}")
            kept = get(fw, tag, f"load{load}")["samples_per_s_2"] / get(fw, tag, "quiet")["samples_per_s_2"]
            row += f" {q:.2f} / {l:.2f} | {l / q:.2f} | {kept / (l / q):.2f} |"
        print(row)
    # The ceiling a fair scheduler puts on "kept": the 2 ranks and the busy loops each want a core,
    # so the 2-rank job gets at most 2 * ncpu / (2 + load) cores under the load, against the cores
    # its 2-rank figure used quiet (train_bench's and ddp_bench's own getrusage over the timed
    # loop). A job that idles part of its quiet run has a higher ceiling than one that keeps its
    # cores busy. Above 1.00 in "of ceiling": the job got more than that share (several runnable
    # threads per rank, or the loops' share not taken).
    fair = min(2.0, 2.0 * ncpu / (2 + load))
    print()
    print(f"The ceiling on kept under a fair scheduler: {fair:.2f} cores for the 2 ranks among {load} "
          f"busy loops on {ncpu} cores, over the cores the 2-rank figure used quiet (its own "
          f"getrusage over the timed steps):")
    print("| model | optimizer | dtrain 2-rank cores quiet | dtrain ceiling | dtrain kept | of ceiling | "
          "PyTorch 2-rank cores quiet | PyTorch ceiling | PyTorch kept | of ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for h, b, o in configs:
        tag = f"h{h}-b{b}-{o}"
        row = f"| 784-{h}-{h}-10 | {o} |"
        for fw in ("dtrain", "torch"):
            q, l = get(fw, tag, "quiet"), get(fw, tag, f"load{load}")
            kept = l["samples_per_s_2"] / q["samples_per_s_2"]
            cq = q["cpu_cores_2"]
            ceiling = min(1.0, fair / cq)
            row += f" {cq:.2f} | {ceiling:.2f} | {kept:.2f} | {kept / ceiling:.2f} |"
        print(row)
PY

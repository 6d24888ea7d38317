#!/usr/bin/env bash
# blas_threads_check.sh: train_bench on 2 ranks with no thread variable set (dtrain chooses the
# BLAS threads of each rank, kernels/host/blas_threads.hpp) against OPENBLAS_NUM_THREADS=1, the
# two alternated run by run so that a drift of this shared machine reaches both alike. Passes
# when, in every mode, the median 2-rank samples/s with no variable set is at least --min-ratio
# of the median with one thread.
#
# usage: benchmarks/blas_threads_check.sh [--build DIR] [--runs N] [--min-ratio R]
#            [--baseline-binary PATH] [--out DIR] [-- train_bench arguments...]
#   --build DIR            build tree holding benchmarks/train_bench (default: build)
#   --runs N               runs of each configuration (default 3)
#   --min-ratio R          pass threshold (default 0.85)
#   --baseline-binary P    also run train_bench binary P with no variable set, a third column
#                          (e.g. one built before dtrain chose the threads)
#   --out DIR              keep every run's output there (default: a temporary directory)
# Every run starts from `env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u GOTO_NUM_THREADS
# -u DTRAIN_BLAS_THREADS`, so nothing the calling shell set leaks in. The 1-minute load average
# (uptime) is recorded before each run: quote figures taken at a load below about 1.
# Exit status: 0 pass, 1 below the threshold, 2 usage or a run that failed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build"
runs=3
min_ratio=0.85
baseline=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --min-ratio) min_ratio=$2; shift 2 ;;
    --baseline-binary) baseline=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "blas_threads_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
bench="$build/benchmarks/train_bench"
[ -x "$bench" ] || { echo "blas_threads_check: $bench not found (build the train_bench target)" >&2; exit 2; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "blas_threads_check: $baseline not executable" >&2; exit 2; }
mpiexec=$(command -v mpiexec.mpich || command -v mpiexec)
if [ -z "$out" ]; then out=$(mktemp -d /tmp/blas_threads_check.XXXXXX); fi
mkdir -p "$out"

clean=(env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u GOTO_NUM_THREADS -u DTRAIN_BLAS_THREADS)
configs=(one_thread unset)
[ -n "$baseline" ] && configs+=(baseline_unset)

echo "# blas_threads_check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), $(getconf _NPROCESSORS_ONLN) online CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# train_bench: $bench ${*:-}"
echo "# outputs: $out"
for ((r = 1; r <= runs; ++r)); do
  for c in "${configs[@]}"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    f="$out/run${r}_$c"
    echo "$load" > "$f.load"
    case "$c" in
      one_thread) cmd=("${clean[@]}" OPENBLAS_NUM_THREADS=1 "$mpiexec" -n 2 "$bench" "$@") ;;
      unset) cmd=("${clean[@]}" "$mpiexec" -n 2 "$bench" "$@") ;;
      baseline_unset) cmd=("${clean[@]}" "$mpiexec" -n 2 "$baseline" "$@") ;;
    esac
    echo "# run $r $c (load $load): ${cmd[*]}"
    if ! "${cmd[@]}" > "$f.out" 2> "$f.err"; then
      echo "blas_threads_check: run $r $c failed:" >&2
      tail -n 20 "$f.err" >&2
      exit 2
    fi
    grep -h "BLAS threads" "$f.err" | sed 's/^/#   /' || true
  done
done

# The table: per mode, each configuration's 2-rank samples/s (median of the runs, and the runs),
# the ratio of the medians; then the 1-rank figures and both ranks training alone.
python3 - "$out" "$runs" "$min_ratio" "${configs[@]}" <<'PY'
import re, statistics, sys
out, runs, min_ratio, configs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
modes = ["overlap", "no-overlap", "fused", "sharded"]
fig = {}  # (config, run) -> {(mode, ranks): sps}
loads = {}
for c in configs:
    for r in range(1, runs + 1):
        d = {}
        text = open(f"{out}/run{r}_{c}.out").read()
        for m in modes:
            x = re.search(r"^  %s\s+(\d+)\s+(\d+)\s" % re.escape(m), text, re.M)
            if not x:
                sys.exit(f"blas_threads_check: no '{m}' row in run{r}_{c}.out")
            d[(m, 1)], d[(m, 2)] = float(x.group(1)), float(x.group(2))
        x = re.search(r"training alone at once.*?: (\d+) samples/s together", text)
        d[("alone", 2)] = float(x.group(1)) if x else float("nan")
        fig[(c, r)] = d
        loads[(c, r)] = open(f"{out}/run{r}_{c}.load").read().strip()
names = {"one_thread": "OPENBLAS_NUM_THREADS=1", "unset": "nothing set",
         "baseline_unset": "nothing set, baseline binary"}
def med(c, key):
    return statistics.median(fig[(c, r)][key] for r in range(1, runs + 1))
def runs_of(c, key):
    return "/".join("%.0f" % fig[(c, r)][key] for r in range(1, runs + 1))
print()
print("2 ranks, samples/s: median of %d runs (the runs in order)" % runs)
head = "| mode | " + " | ".join(names[c] for c in configs) + " | nothing set / one thread |"
print(head)
print("|" + "---|" * (len(configs) + 2))
ok = True
for key in [(m, 2) for m in modes] + [("alone", 2)]:
    cells = ["%.0f (%s)" % (med(c, key), runs_of(c, key)) for c in configs]
    ratio = med("unset", key) / med("one_thread", key)
    label = key[0] if key[0] != "alone" else "both alone, no communication"
    if key[0] in modes and not ratio >= min_ratio:
        ok = False
    print("| %s | %s | %.2f |" % (label, " | ".join(cells), ratio))
print()
print("1 rank (rank 0 alone, the other asleep), samples/s: median of %d runs" % runs)
print("| mode | " + " | ".join(names[c] for c in configs) + " | nothing set / one thread |")
print("|" + "---|" * (len(configs) + 2))
for m in modes:
    cells = ["%.0f (%s)" % (med(c, (m, 1)), runs_of(c, (m, 1))) for c in configs]
    print("| %s | %s | %.2f |" % (m, " | ".join(cells), med("unset", (m, 1)) / med("one_thread", (m, 1))))
print()
print("1-minute load before each run: " + ", ".join(
    "run%d %s %s" % (r, c, loads[(c, r)]) for r in range(1, runs + 1) for c in configs))
print("%s: every mode's 2-rank median with nothing set %s %.2f x the one-thread median" %
      ("PASS" if ok else "FAIL", ">=" if ok else "is not >=", min_ratio))
sys.exit(0 if ok else 1)
PY

#!/usr/bin/env bash
# auto_check.sh BUILD OUT: the automatic all-reduce check, repeated.
#
# Runs allreduce_bench with every algorithm and `auto` REPS times (default 5) in each of three
# launches: 2 ranks, 4 ranks, and 4 ranks as two fake nodes of two (DTRAIN_RANKS_PER_NODE=2).
# Every bench run calibrates afresh (no tuning file), times each algorithm in ROUNDS interleaved
# rounds (default 15; each algorithm after every other in turn) and reports per size the median round. Then it
# evaluates, per run and per size, whether the algorithm `auto` chose measured within 10% of the
# fastest dtrain algorithm at that size (the headline criterion), and separately whether it lay
# within the fastest one's spread over the rounds (its median at or below the fastest one's third
# quartile: the two are then not told apart by this run's own repetitions). With
# DTRAIN_ALLREDUCE_ADAPT=1 (passed through) the plans check their choice while timed and may
# change algorithm: "chosen" is then the one in use at the end; the summary also compares
# `auto`'s own time, its checking windows included, with the best, and lists the changes.
# With HEAP=1 every algorithm, `auto` included, runs on buffers from the node-shared heap
# (allreduce_bench's NAME@heap cells: shm, and hier and hier_leader inside each fake node, read
# them in place, as they do a model built on Communicator::shared_allocator()). Prints a markdown
# summary for benchmarks/RESULTS.md, with each run's core-to-core round trip at its start and end
# (where its two cores sat: one L3 or two; 2 ranks only); raw outputs and JSON are kept in OUT.
#
#   benchmarks/auto_check.sh build /tmp/auto_check
#   REPS=2 ROUNDS=3 benchmarks/auto_check.sh build-calib /tmp/ac   # a short validation
#   LAUNCHES="p2 2x2" benchmarks/auto_check.sh build /tmp/ac        # some launches only
#   ITERS=10 LAUNCHES=2x2 benchmarks/auto_check.sh build /tmp/ac    # timed calls per round
#   HEAP=1 benchmarks/auto_check.sh build /tmp/ac-heap              # buffers in the heap
#
# About 3-4 minutes at the defaults on an idle 2-core machine (4 ranks busy-poll on 2 cores).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
BUILD=$1
OUT=$2
REPS=${REPS:-5}
# 15 rounds: with 7, the bench's two timings of one algorithm in one run (as auto and by name)
# lay more than 10% apart in 5-7 of 35 cells at 2 ranks, with 15 in 4 of 35 (benchmarks/RESULTS.md).
ROUNDS=${ROUNDS:-15}
LAUNCHES=${LAUNCHES:-p2 p4 2x2}
HEAP=${HEAP:-0}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
BENCH=$BUILD/benchmarks/allreduce_bench
[[ -x $BENCH ]] || { echo "auto_check.sh: $BENCH not built" >&2; exit 2; }
mkdir -p "$OUT"
unset DTRAIN_TUNING_FILE DTRAIN_ALLREDUCE_ALGO DTRAIN_COMM_REPRODUCIBLE DTRAIN_RANKS_PER_NODE

# name ranks ranks-per-node max-size iterations algorithms
CONFIGS=(
  "p2 2 0 16M 5 ring,tree,rhd,rd,shm,auto"
  "p4 4 0 4M 3 ring,tree,rhd,rd,shm,auto"
  "2x2 4 2 4M 3 ring,tree,rhd,rd,hier,hier_leader,auto"
)

start=$(date -u +%H:%M)
load0=$(cut -d' ' -f1 /proc/loadavg)
for cfg in "${CONFIGS[@]}"; do
  read -r name np rpn max iters algos <<<"$cfg"
  iters=${ITERS:-$iters}
  [[ " $LAUNCHES " == *" $name "* ]] || continue
  [[ $HEAP == 1 ]] && algos=$(sed 's/\([a-z_]*\)/\1@heap/g' <<<"$algos")
  for ((i = 1; i <= REPS; ++i)); do
    env_rpn=()
    [[ $rpn != 0 ]] && env_rpn=(env DTRAIN_RANKS_PER_NODE="$rpn")
    cut -d' ' -f1 /proc/loadavg >"$OUT/${name}_$i.load"
    "${env_rpn[@]}" "$MPIEXEC" -n "$np" "$BENCH" -b 4K -e "$max" -f 4 --algo "$algos" \
      -n "$iters" -w 1 -R "$ROUNDS" --stat median -c 0 --json "$OUT/${name}_$i.json" \
      >"$OUT/${name}_$i.txt" 2>&1 || {
      echo "auto_check.sh: run $name #$i failed, see $OUT/${name}_$i.txt" >&2
      exit 1
    }
  done
done
end=$(date -u +%H:%M)
load1=$(cut -d' ' -f1 /proc/loadavg)

python3 - "$OUT" "$REPS" "$ROUNDS" "$start" "$end" "$load0" "$load1" "$LAUNCHES" "$HEAP" <<'EOF'
import json, re, sys
out, reps, rounds, start, end, load0, load1, launches, heap = sys.argv[1:10]
heap = "; every buffer in the node-shared heap (NAME@heap)" if heap == "1" else ""
reps = int(reps)
configs = [(k, v) for k, v in (("p2", "2 ranks"), ("p4", "4 ranks"), ("2x2", "2x2 fake nodes"))
           if k in launches.split()]
def kib(b):
    return f"{b >> 20}M" if b >= 1 << 20 else f"{b >> 10}K"
print(f"Runs {start}-{end} UTC, load average {load0} at the start, {load1} at the end; "
      f"{reps} runs per launch, {rounds} rounds per cell (median)"
      f"{heap}.\n")
print("| launch | run | load | round trip, ns (start, end) | calibration | decision table | within 10% "
      "| within 10% or spread | misses (size: chosen vs best, ratio) | auto itself within 10% "
      "| changed while timed (size: first > last, changes) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
per_size = {}
passed = {}
for key, label in configs:
    passed[key] = [0, 0, 0]
    for i in range(1, reps + 1):
        txt = open(f"{out}/{key}_{i}.txt").read()
        doc = json.load(open(f"{out}/{key}_{i}.json"))
        load = open(f"{out}/{key}_{i}.load").read().strip()
        # The bench's core-to-core round trip (node ranks 0 and 1) at its start and end: where
        # the two cores sat, one L3 or two (benchmarks/RESULTS.md); "-" where not measured.
        trips = re.findall(r"core-to-core round trip at the (?:start|end) \(.*\): (\d+) ns", txt)
        trip = ", ".join(trips) if trips else "-"
        m = re.search(r"calibrated in (\d+) ms", txt)
        cal = f"{m.group(1)} ms" if m else "?"
        m = re.search(r"# automatic decisions \(from bytes per rank\):(.*)", txt)
        table = " ".join(
            f"{kib(int(b)) if int(b) else 0}:{a}"
            for b, a in (x.split(":") for x in m.group(1).split())) if m else "?"
        rows = doc["auto"]
        w = sum(r["within_10pct"] for r in rows)
        ws = sum(r["within_spread"] for r in rows)
        passed[key][0] += w == len(rows)
        passed[key][1] += ws == len(rows)
        # `auto` as it ran, adaptive windows included (its own cell against the best cell).
        wa = sum(r.get("auto_over_best", 9) <= 1.1 for r in rows)
        passed[key][2] += wa == len(rows)
        changed = "; ".join(f"{kib(r['bytes'])}: {r['first_choice']} > {r['chosen']}, {r['changes']}"
                            for r in rows if r.get("changes", 0))
        misses = "; ".join(
            f"{kib(r['bytes'])} {r['chosen']} vs {r['best']} {r['chosen_over_best']:.2f}"
            + ("" if not r["within_spread"] else " (spread)")
            for r in rows if not r["within_10pct"])
        for r in rows:
            s = per_size.setdefault((key, r["bytes"]), [0, 0, 0, []])
            s[0] += 1
            s[1] += r["within_10pct"]
            s[2] += r["within_spread"]
            s[3].append(r["chosen_over_best"])
        print(f"| {label} | {i} | {load} | {trip} | {cal} | {table} | {w} of {len(rows)} "
              f"| {ws} of {len(rows)} | {misses or '-'} | {wa} of {len(rows)} | {changed or '-'} |")
print()
print("| launch | size | within 10% (runs) | within 10% or spread (runs) | chosen / best: median, worst |")
print("|---|---|---|---|---|")
for (key, b), (n, w, ws, ratios) in sorted(per_size.items(), key=lambda kv: ([c for c, _ in configs].index(kv[0][0]), kv[0][1])):
    ratios.sort()
    med = ratios[len(ratios) // 2]
    label = dict(configs)[key]
    print(f"| {label} | {kib(b)} | {w} of {n} | {ws} of {n} | {med:.2f}, {ratios[-1]:.2f} |")
print()
for key, label in configs:
    print(f"- {label}: every size within 10% in {passed[key][0]} of {reps} runs; "
          f"within 10% or the spread in {passed[key][1]} of {reps} runs; `auto`'s own time "
          f"within 10% of the best at every size in {passed[key][2]} of {reps} runs.")
# The bench's own repeatability: each run times the chosen algorithm twice, once as `auto` and
# once under its own name, interleaved with the others. Where those two differ by more than 10%,
# "within 10% of the best" is below what the run itself can resolve.
print()
for key, label in configs:
    rep = []
    for i in range(1, reps + 1):
        for r in json.load(open(f"{out}/{key}_{i}.json"))["auto"]:
            a, c = r["auto_us"], r["measured_us"][r["chosen"]]
            rep.append(max(a, c) / min(a, c))
    rep.sort()
    over = sum(x > 1.1 for x in rep)
    print(f"- {label}, the chosen algorithm timed twice in the same run (as auto and by name): "
          f"median ratio {rep[len(rep) // 2]:.2f}, worst {rep[-1]:.2f}, "
          f"more than 10% apart in {over} of {len(rep)} cells.")
EOF

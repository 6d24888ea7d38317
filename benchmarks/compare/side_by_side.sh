#!/usr/bin/env bash
# dtrain's train_bench next to PyTorch DDP (ddp_bench.py) on the same machine in one run: the three
# configurations of benchmarks/RESULTS.md, each framework in turn, 2 ranks, one thread per rank.
#   benchmarks/compare/side_by_side.sh BUILD_DIR OUT_DIR [STEPS]
# Needs BUILD_DIR/benchmarks/train_bench and Debian's python3-torch. Writes one JSON per run into
# OUT_DIR and prints the table with the ratios dtrain / PyTorch.
set -euo pipefail
BUILD=${1:?build directory}
OUT=${2:?output directory}
STEPS=${3:-300}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
configs=("256 64 adamw" "1024 128 sgd" "1024 128 adamw")
for c in "${configs[@]}"; do
  read -r hidden batch opt <<<"$c"
  tag="h${hidden}-b${batch}-${opt}"
  echo "== $tag: dtrain train_bench"
  mpiexec.mpich -n 2 "$BUILD/benchmarks/train_bench" --hidden "$hidden" --batch "$batch" \
    --optimizer "$opt" --steps "$STEPS" --json "$OUT/dtrain-$tag.json"
  echo "== $tag: PyTorch DDP"
  /usr/bin/python3 "$HERE/ddp_bench.py" --hidden "$hidden" --batch "$batch" --optimizer "$opt" \
    --steps "$STEPS" --json "$OUT/torch-$tag.json"
done
/usr/bin/python3 - "$OUT" "${configs[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print("| model | optimizer | batch/rank | dtrain 1 rank | dtrain 2 ranks | dtrain eff. | "
      "PyTorch 1 rank | PyTorch 2 ranks | PyTorch eff. | 2-rank ratio | dtrain optimizer share |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for c in sys.argv[2:]:
    h, b, o = c.split()
    tag = f"h{h}-b{b}-{o}"
    d = json.load(open(f"{out}/dtrain-{tag}.json"))
    t = json.load(open(f"{out}/torch-{tag}.json"))
    print(f"| 784-{h}-{h}-10 | {o} | {b} | {d['samples_per_s_1']:.0f} | {d['samples_per_s_2']:.0f} | "
          f"{d['scaling_efficiency']:.3f} | {t['samples_per_s_1']:.0f} | {t['samples_per_s_2']:.0f} | "
          f"{t['scaling_efficiency']:.3f} | {d['samples_per_s_2'] / t['samples_per_s_2']:.2f}x | "
          f"{100 * d['phase_split_2']['optimizer']:.1f}% |")
PY

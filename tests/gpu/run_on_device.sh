#!/usr/bin/env bash
# Builds and runs every GPU test and the kernel benchmark on a machine with a GPU, in one short
# visit: gpu.hpp's host API (tests/gpu/gpu_host_api_test.cpp), the device kernels against their
# host references (tests/gpu/kernels_gpu_test.cpp), the GPU execution policy with a short training
# run compared step by step with the host run of the same seed (tests/gpu/gpu_exec_test.cpp), then
# kernels_bench with its device section (tiled GEMM vs the vendor BLAS, AdamW vs device memcpy).
#
# Needs nvcc (NVIDIA) or hipcc (AMD) and doctest's header; CMake is not needed. OpenBLAS is used
# when its header is found. Outputs go to $OUT (default: build-gpu-run/), logs included.
#   tests/gpu/run_on_device.sh            # everything
#   DTRAIN_GPU_BENCH_ITERS=50 tests/gpu/run_on_device.sh
#   DTRAIN_GPU_DIALECT=cuda tests/gpu/run_on_device.sh   # force a dialect (dry run without a GPU)
# Exit status: 0 when every test passed, 1 when one failed, 77 when no GPU is visible.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/build-gpu-run}"
BUILD="${DTRAIN_GPU_BUILD:-$OUT/bin}"
ITERS="${DTRAIN_GPU_BENCH_ITERS:-20}"
mkdir -p "$OUT" "$BUILD"
log() { echo "run_on_device: $*" | tee -a "$OUT/run.log"; }

NVCC="${NVCC:-$(command -v nvcc || true)}"
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
HIPCC="${HIPCC:-$(command -v hipcc || true)}"
has_nvidia() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
has_amd() { command -v rocminfo >/dev/null 2>&1 && rocminfo >/dev/null 2>&1; }
FORCE="${DTRAIN_GPU_DIALECT:-}"
if { [ "$FORCE" = cuda ] || { [ -z "$FORCE" ] && has_nvidia; }; } && [ -n "$NVCC" ]; then
  DIALECT=cuda
  ARCHS="80 90"
  if has_nvidia; then
    nvidia-smi > "$OUT/device.txt" 2>&1
    # The targets CI checks (sm_80, sm_90) plus this device's own, so the binary runs here.
    ARCHS="$ARCHS $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')"
  fi
  FLAGS=(-std=c++17 -x cu -O2 -DDTRAIN_HAVE_CUDA=1 -Xcompiler=-pthread)
  for a in $(echo "$ARCHS" | tr ' ' '\n' | sort -u); do FLAGS+=(--generate-code "arch=compute_$a,code=sm_$a"); done
  LIBS=()
  if [ -e "$(dirname "$(readlink -f "$NVCC")")/../include/cublas_v2.h" ] || ls /usr/include/cublas_v2.h >/dev/null 2>&1; then
    FLAGS+=(-DDTRAIN_HAVE_CUBLAS=1); LIBS+=(-lcublas)
  fi
  CC="$NVCC"
elif { [ "$FORCE" = hip ] || { [ -z "$FORCE" ] && has_amd; }; } && [ -n "$HIPCC" ]; then
  DIALECT=hip
  ARCHS="gfx90a"
  if has_amd; then
    rocminfo > "$OUT/device.txt" 2>&1
    ARCHS="$(rocminfo | grep -o 'gfx[0-9a-f]*' | sort -u | tr '\n' ' ')"
  fi
  FLAGS=(-std=c++17 -O2 -DDTRAIN_HAVE_HIP=1)
  for a in $ARCHS; do FLAGS+=(--offload-arch="$a"); done
  LIBS=(-lpthread)
  CC="$HIPCC"
else
  log "no GPU visible (nvidia-smi / rocminfo found nothing, or no nvcc / hipcc): nothing to run"
  exit 77
fi
log "dialect $DIALECT, targets: $ARCHS, compiler: $CC"

INC=(-I"$ROOT/include" -I"$ROOT/transports" -I"$ROOT/kernels" -I"$ROOT/tests")
[ -n "${DOCTEST_INCLUDE_DIR:-}" ] && INC+=(-I"$DOCTEST_INCLUDE_DIR")
BLAS=()
for d in /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include/aarch64-linux-gnu/openblas-pthread; do
  if [ -e "$d/cblas.h" ]; then BLAS=(-DDTRAIN_HAVE_CBLAS=1 -I"$d" -lopenblas); break; fi
done

status=0
# Build everything in parallel: device compiles dominate the visit.
TESTS=(gpu_kernels:kernels_gpu_test.cpp gpu_exec:gpu_exec_test.cpp)
pids=()
for t in "${TESTS[@]}"; do
  name=${t%%:*} src=${t#*:}
  "$CC" "${FLAGS[@]}" "${INC[@]}" "$ROOT/tests/gpu/$src" -o "$BUILD/${name}_$DIALECT" "${LIBS[@]}" \
    > "$OUT/build_$name.log" 2>&1 &
  pids+=("$!:$name")
done
# gpu.hpp's host-only path: a plain C++ compiler with the vendor runtime.
if [ "$DIALECT" = cuda ]; then
  CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
  HOSTAPI=(c++ -std=c++17 -O2 -DDTRAIN_HAVE_CUDA=1 -DDOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
           -I"$CUDA_HOME/include" "${INC[@]}" "$ROOT/tests/gpu/gpu_host_api_test.cpp"
           -o "$BUILD/gpu_host_api_$DIALECT" -L"$CUDA_HOME/lib64" -lcudart -pthread)
else
  HOSTAPI=("$HIPCC" -std=c++17 -O2 -DDTRAIN_HAVE_HIP=1 -DDOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
           "${INC[@]}" "$ROOT/tests/gpu/gpu_host_api_test.cpp" -o "$BUILD/gpu_host_api_$DIALECT"
           -lpthread)
fi
"${HOSTAPI[@]}" > "$OUT/build_gpu_host_api.log" 2>&1 &
pids+=("$!:gpu_host_api")
"$CC" "${FLAGS[@]}" "${INC[@]}" "$ROOT/benchmarks/kernels_bench.cpp" -o "$BUILD/kernels_bench_$DIALECT" "${BLAS[@]}" "${LIBS[@]}" \
  > "$OUT/build_bench.log" 2>&1 &
pids+=("$!:bench")
for pn in "${pids[@]}"; do
  if ! wait "${pn%%:*}"; then
    log "building ${pn#*:} failed:"; tail -30 "$OUT/build_${pn#*:}.log"; status=1
  fi
done

for name in gpu_host_api gpu_kernels gpu_exec; do
  exe="$BUILD/${name}_$DIALECT"
  [ -x "$exe" ] || continue
  log "running ${name}_$DIALECT"
  DTRAIN_TEST_WATCHDOG_S=240 "$exe" -d 2>&1 | tee "$OUT/${name}_$DIALECT.txt" | tail -25
  rc=${PIPESTATUS[0]}
  log "${name}_$DIALECT exit status $rc"
  if [ "$rc" -eq 77 ]; then
    [ "$status" -eq 0 ] && status=77
  elif [ "$rc" -ne 0 ]; then
    status=1
  fi
done
if [ -x "$BUILD/kernels_bench_$DIALECT" ]; then
  log "running kernels_bench_$DIALECT -n $ITERS"
  OPENBLAS_NUM_THREADS=1 "$BUILD/kernels_bench_$DIALECT" -n "$ITERS" 2>&1 | tee "$OUT/kernels_bench_$DIALECT.txt"
  [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
fi
log "done, status $status; outputs in $OUT"
exit $status

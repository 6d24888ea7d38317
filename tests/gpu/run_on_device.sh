#!/usr/bin/env bash
# Builds and runs every GPU test and the kernel benchmark on a machine with a GPU, in one short
# visit (about 8 minutes on one GPU): gpu.hpp's host API (tests/gpu/gpu_host_api_test.cpp), the
# device kernels against their host references (tests/gpu/kernels_gpu_test.cpp), the GPU execution
# policy with a short training run compared step by step with the host run of the same seed, the
# grid layers (convolution, pooling, upsampling, residual) against the host, device gradient
# clipping and checkpoint staging (tests/gpu/gpu_exec_test.cpp), example 03 (a user layer: the loss
# and every parameter gradient against the host), 2 and 4 MPI ranks sharing the GPU, data parallel
# and fully sharded in reproducible mode, and device IPC among them against the staged bits
# (tests/gpu/mpi_gpu_test.cpp), the C API's device arrays on 2 ranks (tests/gpu/c_api_device.c:
# bindings/c/dtrain_c.cpp built by the device compiler, a run fed device arrays against one fed
# host arrays, bit for bit), then kernels_bench with its
# device section (tiled GEMM vs the vendor BLAS, AdamW vs device memcpy) and conv_bench, then a
# short training run of example 10 on 1 GPU (--device cuda|hip) next to the CPU run of the same
# seed (--device cpu), checked: the GPU run's final loss within 5% of the CPU run's, test
# accuracies within 0.01, and >= 0.80. Lists the RDMA devices (ibv_devices) and, where one is
# present, runs tests/ib/run_on_rdma.sh too. Every step gets one line in $OUT/summary.txt
# (PASS / FAIL / NOT RUN, seconds, what it was).
#
# Needs nvcc (NVIDIA) or hipcc (AMD) and doctest's header; CMake is not needed. OpenBLAS is used
# when its header is found. Example 10 also needs an MPI C++ wrapper (mpicxx), parallel HDF5
# (h5pcc), CLI11 and zlib, and the Fashion-MNIST IDX files (DTRAIN_FASHION_IDX, default
# /usr/share/datasets/fashion-mnist) or a converted file (DTRAIN_FASHION_H5).
# Outputs go to $OUT (default: build-gpu-run/), logs included.
#   tests/gpu/run_on_device.sh            # everything
#   DTRAIN_GPU_BENCH_ITERS=50 tests/gpu/run_on_device.sh
#   DTRAIN_GPU_DIALECT=cuda tests/gpu/run_on_device.sh   # force a dialect (dry run without a GPU)
#   DTRAIN_GPU_TRAIN=0 tests/gpu/run_on_device.sh        # leave out the example 10 runs
#   DTRAIN_GPU_RDMA=0 tests/gpu/run_on_device.sh         # leave out run_on_rdma.sh
# Exit status: 0 when everything ran and passed, 1 when something failed or could not run (the
# log names it), 77 when no GPU is visible (nothing ran: that is not a pass).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/build-gpu-run}"
BUILD="${DTRAIN_GPU_BUILD:-$OUT/bin}"
ITERS="${DTRAIN_GPU_BENCH_ITERS:-20}"
mkdir -p "$OUT" "$BUILD"
log() { echo "run_on_device: $*" | tee -a "$OUT/run.log"; }
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
# record STEP RESULT SECONDS [DETAIL]: one line of the summary.
record() { printf '%-28s %-8s %6ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$SUMMARY"; }
# verdict EXIT_STATUS: PASS (0), SKIPPED (77), FAIL (anything else).
verdict() { case "$1" in 0) echo PASS ;; 77) echo SKIPPED ;; *) echo FAIL ;; esac; }
MPIEXEC="${MPIEXEC:-$(command -v mpiexec.mpich || command -v mpiexec || true)}"
# The MPI and parallel-HDF5 wrappers' flags without their compiler (MPICH: -show; Open MPI:
# --showme). nvcc does not take -Wl,... (hardening flags of the wrappers): they are left out.
wrapper_flags() {
  local f
  f="$("$1" -show 2>/dev/null || "$1" --showme 2>/dev/null)"
  echo "${f#* }" | tr ' ' '\n' | grep -v '^-Wl,' | tr '\n' ' '
}
MPIWRAP="" H5WRAP=""
for w in mpicxx.mpich mpicxx; do command -v "$w" >/dev/null 2>&1 && { MPIWRAP=$w; break; }; done
for w in h5pcc.mpich h5pcc; do command -v "$w" >/dev/null 2>&1 && { H5WRAP=$w; break; }; done
MPIFLAGS="" H5FLAGS=""
[ -n "$MPIWRAP" ] && MPIFLAGS="$(wrapper_flags "$MPIWRAP")"
[ -n "$H5WRAP" ] && H5FLAGS="$(wrapper_flags "$H5WRAP")"

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
  log "NOT RUN: no GPU visible (nvidia-smi -L / rocminfo found no device, or no nvcc / hipcc" \
      "for the device found); nothing was built or checked" >&2
  record gpu "NOT RUN" 0 "no GPU visible, or no compiler for it"
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
# Build everything in parallel: device compiles dominate the visit. Earlier binaries go first, so
# that a failed build is never mistaken for a built one.
rm -f "$BUILD"/*_"$DIALECT" "$BUILD/train_cpu" "$BUILD/convert"
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
"$CC" "${FLAGS[@]}" "${INC[@]}" "$ROOT/benchmarks/conv_bench.cpp" -o "$BUILD/conv_bench_$DIALECT" "${BLAS[@]}" "${LIBS[@]}" \
  > "$OUT/build_conv_bench.log" 2>&1 &
pids+=("$!:conv_bench")
# Example 03: a user layer's device kernels against its host ones (loss and every gradient).
"$CC" "${FLAGS[@]}" "${INC[@]}" "$ROOT/examples/03_custom_layer/custom_layer.cpp" \
  -o "$BUILD/custom_layer_$DIALECT" "${BLAS[@]}" "${LIBS[@]}" > "$OUT/build_custom_layer.log" 2>&1 &
pids+=("$!:custom_layer")
# Ranks sharing the GPU: the MPI test (the tests' MPI doctest main).
if [ -n "$MPIFLAGS" ]; then
  # shellcheck disable=SC2086
  "$CC" "${FLAGS[@]}" "${INC[@]}" "$ROOT/tests/gpu/mpi_gpu_test.cpp" \
    "$ROOT/tests/support/doctest_mpi_main.cpp" -o "$BUILD/mpi_gpu_$DIALECT" $MPIFLAGS "${LIBS[@]}" \
    > "$OUT/build_mpi_gpu.log" 2>&1 &
  pids+=("$!:mpi_gpu")
else
  record mpi_gpu "NOT RUN" 0 "no MPI C++ wrapper (mpicxx) for its flags"
  status=1
fi
# The C API on the GPU: dtrain_c.cpp by the device compiler, the C program by the MPI C wrapper
# (with the vendor runtime's C header), linked by the device compiler.
MPICC=""
for w in mpicc.mpich mpicc; do command -v "$w" >/dev/null 2>&1 && { MPICC=$w; break; }; done
if [ -n "$MPIFLAGS" ] && [ -n "$H5FLAGS" ] && [ -n "$MPICC" ]; then
  if [ "$DIALECT" = cuda ]; then
    RTFLAGS=(-DDTRAIN_HAVE_CUDA=1 -I"$(dirname "$(dirname "$(readlink -f "$NVCC")")")/include")
  else
    RTFLAGS=(-DDTRAIN_HAVE_HIP=1 -D__HIP_PLATFORM_AMD__ -I"$(dirname "$(readlink -f "$HIPCC")")/../include")
  fi
  # The wrappers' -I and -D flags compile; the rest (libraries, archives) only links.
  # shellcheck disable=SC2086
  CAPI_CFLAGS="$(printf '%s\n' $MPIFLAGS $H5FLAGS | grep -E '^-(I|D)' | tr '\n' ' ')"
  # shellcheck disable=SC2086
  {
    "$CC" "${FLAGS[@]}" "${INC[@]}" -I"$ROOT/bindings/c" -c "$ROOT/bindings/c/dtrain_c.cpp" \
      -o "$BUILD/dtrain_c_$DIALECT.o" $CAPI_CFLAGS &&
      "$MPICC" -std=c11 -O2 "${RTFLAGS[@]}" -I"$ROOT/bindings/c" -I"$ROOT/tests/c_api" \
        -c "$ROOT/tests/gpu/c_api_device.c" -o "$BUILD/c_api_device_main.o" &&
      "$CC" "$BUILD/c_api_device_main.o" "$BUILD/dtrain_c_$DIALECT.o" -o "$BUILD/c_api_device_$DIALECT" \
        $MPIFLAGS $H5FLAGS -lyaml-cpp "${LIBS[@]}"
  } > "$OUT/build_c_api_device.log" 2>&1 &
  pids+=("$!:c_api_device")
else
  record c_api_device "NOT RUN" 0 "needs mpicc, mpicxx and h5pcc (parallel HDF5) for the C API"
  status=1
fi
# Example 10's builds (the converter, the CPU and the GPU binary), ahead of its runs at the end.
EX10="$ROOT/examples/10_train_fashion_mnist/train_fashion_mnist.cpp"
if [ "${DTRAIN_GPU_TRAIN:-1}" != 0 ] && [ -n "$MPIWRAP" ] && [ -n "$H5WRAP" ]; then
  if [ -z "${DTRAIN_FASHION_H5:-}" ]; then
    # shellcheck disable=SC2086
    "$MPIWRAP" -std=c++17 -O2 "${INC[@]}" -I"$ROOT/examples" \
      "$ROOT/examples/01_convert_idx_to_hdf5/convert_idx_to_hdf5.cpp" -o "$BUILD/convert" $H5FLAGS -lz \
      > "$OUT/build_convert.log" 2>&1 &
    pids+=("$!:convert")
  fi
  # shellcheck disable=SC2086
  "$MPIWRAP" -std=c++17 -O2 "${INC[@]}" -I"$ROOT/examples" "$EX10" -o "$BUILD/train_cpu" \
    "${BLAS[@]}" $H5FLAGS > "$OUT/build_train_cpu.log" 2>&1 &
  pids+=("$!:train_cpu")
  # shellcheck disable=SC2086
  "$CC" "${FLAGS[@]}" "${INC[@]}" -I"$ROOT/examples" -DDTRAIN_EXAMPLE_GPU=1 "$EX10" \
    -o "$BUILD/train_$DIALECT" $MPIFLAGS $H5FLAGS "${LIBS[@]}" > "$OUT/build_train_gpu.log" 2>&1 &
  pids+=("$!:train_gpu")
fi
BUILD_START=$SECONDS
for pn in "${pids[@]}"; do
  if ! wait "${pn%%:*}"; then
    log "building ${pn#*:} failed:"; tail -30 "$OUT/build_${pn#*:}.log"; status=1
    record "build ${pn#*:}" FAIL $((SECONDS - BUILD_START)) "see build_${pn#*:}.log"
  fi
done
record build "done" $((SECONDS - BUILD_START)) "parallel builds (failures above)"

# run_step NAME LOG TIMEOUT_S COMMAND...: runs it, logs it, records its verdict.
run_step() {
  local name=$1 out=$2 limit=$3 t0=$SECONDS rc
  shift 3
  log "running $name"
  timeout "$limit" "$@" 2>&1 | tee "$out" | tail -25
  rc=${PIPESTATUS[0]}
  log "$name exit status $rc"
  record "$name" "$(verdict "$rc")" $((SECONDS - t0)) "$(basename "$out")"
  if [ "$rc" -eq 77 ]; then
    [ "$status" -eq 0 ] && status=77
  elif [ "$rc" -ne 0 ]; then
    status=1
  fi
}
missing() { record "$1" "NOT RUN" 0 "not built"; status=1; }

for name in gpu_host_api gpu_kernels gpu_exec custom_layer; do
  exe="$BUILD/${name}_$DIALECT"
  [ -x "$exe" ] || { missing "${name}_$DIALECT"; continue; }
  args=(-d)
  [ "$name" = custom_layer ] && args=()
  DTRAIN_TEST_WATCHDOG_S=240 run_step "${name}_$DIALECT" "$OUT/${name}_$DIALECT.txt" 250 "$exe" "${args[@]}"
done
if [ -x "$BUILD/mpi_gpu_$DIALECT" ] && [ -n "$MPIEXEC" ]; then
  for np in 2 4; do
    DTRAIN_TEST_WATCHDOG_S=110 run_step "mpi_gpu_${DIALECT}_np$np" "$OUT/mpi_gpu_${DIALECT}_np$np.txt" 120 \
      "$MPIEXEC" -n "$np" "$BUILD/mpi_gpu_$DIALECT" --test-case-exclude="*device IPC*"
  done
  # Device IPC among the ranks sharing the GPU (CUDA/HIP IPC handles), against the staged bits.
  for np in 2 4; do
    DTRAIN_TEST_WATCHDOG_S=110 run_step "mpi_gpu_ipc_${DIALECT}_np$np" "$OUT/mpi_gpu_ipc_${DIALECT}_np$np.txt" 120 \
      "$MPIEXEC" -n "$np" "$BUILD/mpi_gpu_$DIALECT" --test-case="*device IPC*"
  done
elif [ -n "$MPIFLAGS" ]; then
  missing "mpi_gpu_$DIALECT"
fi
if [ -x "$BUILD/c_api_device_$DIALECT" ] && [ -n "$MPIEXEC" ]; then
  # It runs in a work directory of its own (the configuration's checkpoints go to ./ckpt there).
  DTRAIN_EXEC_TIMEOUT_S=60 run_step "c_api_device_$DIALECT" "$OUT/c_api_device_$DIALECT.txt" 120 \
    bash "$ROOT/tests/c_api/run_in.sh" "$OUT/c_api_device" "$MPIEXEC" -n 2 \
    "$(cd "$BUILD" && pwd)/c_api_device_$DIALECT" "$ROOT/tests/c_api/mlp.yaml"
elif [ -n "$MPICC" ] && [ -n "$H5FLAGS" ]; then
  missing "c_api_device_$DIALECT"
fi
if [ -x "$BUILD/kernels_bench_$DIALECT" ]; then
  OPENBLAS_NUM_THREADS=1 run_step "kernels_bench_$DIALECT" "$OUT/kernels_bench_$DIALECT.txt" 180 \
    "$BUILD/kernels_bench_$DIALECT" -n "$ITERS"
else
  missing "kernels_bench_$DIALECT"
fi
if [ -x "$BUILD/conv_bench_$DIALECT" ]; then
  OPENBLAS_NUM_THREADS=1 run_step "conv_bench_$DIALECT" "$OUT/conv_bench_$DIALECT.txt" 120 \
    "$BUILD/conv_bench_$DIALECT"
else
  missing "conv_bench_$DIALECT"
fi

# ---- Example 10 on 1 GPU against the CPU run of the same seed ----
train_check() {
  if [ -z "$MPIWRAP" ] || [ -z "$H5WRAP" ]; then
    log "training check NOT RUN: needs mpicxx and h5pcc (parallel HDF5)"; return 1
  fi
  local data="${DTRAIN_FASHION_H5:-}"
  if [ -z "$data" ]; then
    local idx="${DTRAIN_FASHION_IDX:-/usr/share/datasets/fashion-mnist}"
    if [ ! -e "$idx/train-images-idx3-ubyte.gz" ] && [ ! -e "$idx/train-images-idx3-ubyte" ]; then
      log "training check NOT RUN: no Fashion-MNIST in $idx (set DTRAIN_FASHION_IDX or DTRAIN_FASHION_H5)"
      return 1
    fi
    [ -x "$BUILD/convert" ] || { log "building the converter failed (build_convert.log)"; return 1; }
    data="$OUT/fashion_mnist.h5"
    "$BUILD/convert" --src "$idx" --out "$data" > "$OUT/convert.log" 2>&1 ||
      { log "converting $idx failed (see convert.log)"; return 1; }
  fi
  [ -x "$BUILD/train_cpu" ] ||
    { log "building example 10 (cpu) failed"; tail -20 "$OUT/build_train_cpu.log"; return 1; }
  [ -x "$BUILD/train_$DIALECT" ] ||
    { log "building example 10 ($DIALECT) failed"; tail -20 "$OUT/build_train_gpu.log"; return 1; }
  local args=(--data "$data" --epochs 1 --seed 1 --batch 64 --target 0.80 --log-every 200 --no-plot)
  log "example 10, 1 rank, --device cpu"
  OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 1 "$BUILD/train_cpu" "${args[@]}" --device cpu \
    --json-summary "$OUT/train_cpu.json" 2>&1 | tee "$OUT/train_cpu.txt" | tail -4
  log "example 10, 1 rank, --device $DIALECT"
  "$MPIEXEC" -n 1 "$BUILD/train_$DIALECT" "${args[@]}" --device "$DIALECT" \
    --json-summary "$OUT/train_gpu.json" 2>&1 | tee "$OUT/train_gpu.txt" | tail -4
  python3 - "$OUT/train_cpu.json" "$OUT/train_gpu.json" <<'PY' 2>&1 | tee -a "$OUT/run.log"
import json, sys
c, g = (json.load(open(p)) for p in sys.argv[1:3])
dl = abs(g["train_loss"] - c["train_loss"]) / max(abs(c["train_loss"]), 1e-12)
da = abs(g["test_accuracy"] - c["test_accuracy"])
ok = dl <= 0.05 and da <= 0.01 and g["test_accuracy"] >= 0.80 and g["replicas_identical"]
print("train check: loss cpu %.5f gpu %.5f (rel diff %.4f, bound 0.05); test accuracy cpu %.4f "
      "gpu %.4f (diff %.4f, bound 0.01; target 0.80); samples/s cpu %.0f gpu %.0f: %s"
      % (c["train_loss"], g["train_loss"], dl, c["test_accuracy"], g["test_accuracy"], da,
         c["samples_per_s"], g["samples_per_s"], "PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
}
if [ "${DTRAIN_GPU_TRAIN:-1}" != 0 ]; then
  t0=$SECONDS
  if train_check; then
    record "example10_$DIALECT" PASS $((SECONDS - t0)) "1 GPU against the CPU run (run.log)"
  else
    record "example10_$DIALECT" FAIL $((SECONDS - t0)) "or not run: see run.log"
    status=1
  fi
fi

# ---- RDMA: list the devices; run the verbs tests where one is present ----
if command -v ibv_devices >/dev/null 2>&1; then
  ibv_devices > "$OUT/ibv_devices.txt" 2>&1 || true
  # ibv_devices prints a two-line header, then one line per device.
  ndev=$(tail -n +3 "$OUT/ibv_devices.txt" | grep -c '[^[:space:]]' || true)
  log "ibv_devices: $ndev RDMA device(s)"
  if [ "$ndev" -gt 0 ] && [ "${DTRAIN_GPU_RDMA:-1}" != 0 ]; then
    t0=$SECONDS
    OUT="$OUT/rdma" timeout 300 bash "$ROOT/tests/ib/run_on_rdma.sh" > "$OUT/rdma.txt" 2>&1
    rc=$?
    record rdma "$(verdict "$rc")" $((SECONDS - t0)) "tests/ib/run_on_rdma.sh (rdma.txt)"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && status=1
  else
    record rdma "NOT RUN" 0 "no RDMA device listed by ibv_devices"
  fi
else
  record rdma "NOT RUN" 0 "ibv_devices not installed"
fi

record total "$(verdict "$status")" "$SECONDS" "status $status"
log "done, status $status; outputs in $OUT (summary.txt)"
exit $status

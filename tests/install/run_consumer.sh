#!/usr/bin/env bash
# Installs dtrain from the build tree into a scratch prefix, builds tests/install/consumer against
# it with find_package(dtrain CONFIG REQUIRED COMPONENTS mpi hdf5), runs it on 2 ranks, and checks
# that asking for a component whose dependency is missing fails with the Debian package's name.
# When the build found CUDA and/or HIP (arguments 6 and 7 ON), tests/install/consumer_gpu is
# configured with find_package(dtrain COMPONENTS cuda|hip) and its kernel compiled with nvcc /
# hipcc through the installed dtrain_add_gpu_executable (compile only: no GPU here).
set -euo pipefail
build=$1 consumer=$2 work=$3 cmake=$4 mpiexec=$5 have_cuda=${6:-OFF} have_hip=${7:-OFF}
rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/dtrain/dtrain.hpp"
test -f "$work/prefix/include/dtrain/core/error.hpp"
# The configures (compiler, MPI and HDF5 probes: about 8 s of one core each) run side by side,
# then the builds; each step's log is printed when it fails.
run_logged() {  # <log> <command...>
  local log=$1; shift
  "$@" > "$log" 2>&1 || { echo "FAIL: $*"; cat "$log"; return 1; }
}
gpu_dialects=()
for dialect in cuda hip; do
  if [ "$dialect" = cuda ]; then on=$have_cuda; else on=$have_hip; fi
  case "$on" in ON|on|TRUE|true|1) gpu_dialects+=("$dialect") ;; esac
done
pids=()
run_logged "$work/configure.log" "$cmake" -S "$consumer" -B "$work/build" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release & pids+=($!)
# Negative case: the ibverbs component is required but its dependency is hidden from CMake.
"$cmake" -S "$consumer" -B "$work/build-neg" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCONSUMER_REQUIRE_IBVERBS=ON -DCMAKE_DISABLE_FIND_PACKAGE_ibverbs=TRUE > "$work/neg.log" 2>&1 &
neg_pid=$!
for dialect in "${gpu_dialects[@]}"; do
  run_logged "$work/gpu-$dialect-configure.log" "$cmake" -S "$consumer/../consumer_gpu" \
    -B "$work/build-gpu-$dialect" -DCMAKE_PREFIX_PATH="$work/prefix" -DCONSUMER_DIALECT=$dialect \
    -DCMAKE_BUILD_TYPE=Release & pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if wait "$neg_pid"; then
  echo "FAIL: configure succeeded although a required component is missing"; status=1
elif ! grep -q "libibverbs-dev" "$work/neg.log"; then
  echo "FAIL: the error does not name the Debian package:"; cat "$work/neg.log"; status=1
fi
[ $status = 0 ] || exit 1
pids=()
for dialect in "${gpu_dialects[@]}"; do
  run_logged "$work/gpu-$dialect-build.log" "$cmake" --build "$work/build-gpu-$dialect" & pids+=($!)
done
run_logged "$work/build.log" "$cmake" --build "$work/build" -j2
"$mpiexec" -n 2 "$work/build/consumer"
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
for dialect in "${gpu_dialects[@]}"; do test -x "$work/build-gpu-$dialect/gpu/consumer_gpu"; done
gpu_checked="${gpu_dialects[*]}"
echo "install consumer: OK (builds, runs on 2 ranks; missing REQUIRED component names libibverbs-dev;" \
  "GPU helper compiled a consumer kernel for: ${gpu_checked:-none (no CUDA/HIP found)})"

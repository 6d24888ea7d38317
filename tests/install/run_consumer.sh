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
"$cmake" -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 || {
  cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/build" -j2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$mpiexec" -n 2 "$work/build/consumer"

# Negative case: the ibverbs component is required but its dependency is hidden from CMake.
if "$cmake" -S "$consumer" -B "$work/build-neg" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCONSUMER_REQUIRE_IBVERBS=ON -DCMAKE_DISABLE_FIND_PACKAGE_ibverbs=TRUE > "$work/neg.log" 2>&1; then
  echo "FAIL: configure succeeded although a required component is missing"; exit 1
fi
if ! grep -q "libibverbs-dev" "$work/neg.log"; then
  echo "FAIL: the error does not name the Debian package:"; cat "$work/neg.log"; exit 1
fi
gpu_checked=""
for dialect in cuda hip; do
  if [ "$dialect" = cuda ]; then on=$have_cuda; else on=$have_hip; fi
  case "$on" in ON|on|TRUE|true|1) ;; *) continue ;; esac
  gdir="$work/build-gpu-$dialect"
  "$cmake" -S "$consumer/../consumer_gpu" -B "$gdir" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCONSUMER_DIALECT=$dialect -DCMAKE_BUILD_TYPE=Release > "$work/gpu-$dialect-configure.log" 2>&1 || {
    cat "$work/gpu-$dialect-configure.log"; exit 1; }
  "$cmake" --build "$gdir" > "$work/gpu-$dialect-build.log" 2>&1 || { cat "$work/gpu-$dialect-build.log"; exit 1; }
  test -x "$gdir/gpu/consumer_gpu"
  gpu_checked="$gpu_checked $dialect"
done
echo "install consumer: OK (builds, runs on 2 ranks; missing REQUIRED component names libibverbs-dev;" \
  "GPU helper compiled a consumer kernel for:${gpu_checked:- none (no CUDA/HIP found)})"

#!/usr/bin/env bash
# Installs dtrain from the build tree into a scratch prefix, builds tests/install/consumer against
# it with find_package(dtrain CONFIG REQUIRED COMPONENTS mpi hdf5), runs it on 2 ranks, and checks
# that asking for a component whose dependency is missing fails with the Debian package's name.
set -euo pipefail
build=$1 consumer=$2 work=$3 cmake=$4 mpiexec=$5
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
echo "install consumer: OK (builds, runs on 2 ranks; missing REQUIRED component names libibverbs-dev)"

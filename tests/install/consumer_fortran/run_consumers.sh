#!/usr/bin/env bash
# run_consumers.sh <build dir> <work dir> <cmake> <mpiexec>: installs dtrain from the build tree
# into a scratch prefix and builds the outside Fortran project (tests/install/consumer_fortran,
# find_package(dtrain COMPONENTS fortran)) and C project (tests/install/consumer_c, COMPONENTS c)
# against it, each compiling the bindings' sources itself (their C++ at -O0: this checks the
# package, not speed, and -O3 took most of the test's time), then runs both on 2 ranks.
set -euo pipefail
build=$1 work=$2 cmake=$3 mpiexec=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/share/dtrain/bindings/fortran/dtrain.f90"
test -f "$work/prefix/share/dtrain/bindings/c/dtrain.h"
run_logged() {  # <log> <command...>
  local log=$1; shift
  "$@" > "$log" 2>&1 || { echo "FAIL: $*"; cat "$log"; return 1; }
}
pids=()
for lang in fortran c; do
  run_logged "$work/$lang-configure.log" "$cmake" -S "$here/../consumer_$lang" -B "$work/$lang" \
    -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE=-O0 & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
pids=()
for lang in fortran c; do
  run_logged "$work/$lang-build.log" "$cmake" --build "$work/$lang" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$mpiexec" -n 2 "$work/fortran/consumer_fortran" "$here/run.yaml"
"$mpiexec" -n 2 "$work/c/consumer_c" "$here/run.yaml"
echo "install consumers: OK (Fortran and C projects built against the installed package, run on 2 ranks)"

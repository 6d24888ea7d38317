#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer + UndefinedBehaviorSanitizer) and
# runs each for a bounded time from its kept seed corpus (tests/fuzz/corpus/<target>). A crash
# fails the run and leaves the input as <build>/crash-*; add it to tests/fuzz/regressions/<target>/
# once fixed, so the replay unit test keeps checking it.
# usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out=${1:?build directory}
secs=${2:-30}
mkdir -p "$out"
out="$(cd "$out" && pwd)"  # absolute: the runs below start inside it
h5inc=/usr/include/hdf5/mpich
h5lib=/usr/lib/x86_64-linux-gnu/hdf5/mpich
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/transports" -I"$root/kernels" -I/usr/include/x86_64-linux-gnu/mpich -I"$h5inc")
libs=(-L"$h5lib" -Wl,-rpath,"$h5lib" -lhdf5 -L/usr/lib/x86_64-linux-gnu -lmpich -lz -lyaml-cpp)
# build_one TARGET: builds fuzz_TARGET when stale; fuzz_one TARGET WALL_SECONDS: fuzzes it.
build_one() {
  local t=$1 bin="$out/fuzz_$1"
  if [ ! -x "$bin" ] || [ "$here/fuzz_$t.cpp" -nt "$bin" ]; then
    echo "fuzz: building $bin"
    clang++ "${flags[@]}" "$here/fuzz_$t.cpp" -o "$bin" "${libs[@]}"
  fi
}
fuzz_one() {
  local t=$1 wall=$2
  local work="$out/corpus_$t"  # new inputs found in this run; the kept corpus is read-only input
  mkdir -p "$work"
  local dirs=("$work" "$here/corpus/$t")
  # Regressions exist only for targets that have crashed once (git keeps no empty folders).
  [ -d "$here/regressions/$t" ] && dirs+=("$here/regressions/$t")
  echo "fuzz: $t for ${wall} s"
  # LeakSanitizer off: HDF5 keeps library-lifetime allocations (third-party, see .ci/lsan.supp).
  (cd "$out" && ASAN_OPTIONS=detect_leaks=0 "$out/fuzz_$t" -max_total_time="$wall" -timeout=10 \
     -rss_limit_mb=1024 -max_len=4096 -print_final_stats=1 \
     "${dirs[@]}" 2>&1 | tail -n 12)
}
targets=(idx ckpt_manifest hdf5_open config)
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
# The builds, as many at once as there are cores.
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  (if build_one "$t" > "$out/fuzz_$t.log" 2>&1; then echo 0; else echo 1; fi) > "$out/fuzz_$t.status" &
  running=$((running + 1))
done
wait
# Every target fuzzes at once, each a single-threaded process: with more targets than cores they
# run for SECONDS x targets / cores, so each still gets SECONDS of a core (on 2 cores, 3 targets
# take 1.5 x SECONDS, where running them two at a time took 2 x SECONDS with a core idle).
wall=$secs
if [ "${#targets[@]}" -gt "$jobs" ]; then wall=$(( (secs * ${#targets[@]} + jobs - 1) / jobs )); fi
for t in "${targets[@]}"; do
  [ "$(cat "$out/fuzz_$t.status")" = 0 ] || continue
  (if fuzz_one "$t" "$wall" >> "$out/fuzz_$t.log" 2>&1; then echo 0; else echo 1; fi) > "$out/fuzz_$t.status" &
done
wait
status=0
for t in "${targets[@]}"; do
  cat "$out/fuzz_$t.log"
  if [ "$(cat "$out/fuzz_$t.status")" != 0 ]; then
    echo "fuzz: $t FAILED"
    status=1
  fi
done
exit $status

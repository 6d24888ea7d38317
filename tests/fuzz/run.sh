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
libs=(-L"$h5lib" -Wl,-rpath,"$h5lib" -lhdf5 -L/usr/lib/x86_64-linux-gnu -lmpich -lz)
status=0
for t in idx ckpt_manifest hdf5_open; do
  bin="$out/fuzz_$t"
  if [ ! -x "$bin" ] || [ "$here/fuzz_$t.cpp" -nt "$bin" ]; then
    echo "fuzz: building $bin"
    clang++ "${flags[@]}" "$here/fuzz_$t.cpp" -o "$bin" "${libs[@]}"
  fi
  work="$out/corpus_$t"  # new inputs found in this run; the kept corpus is read-only input
  mkdir -p "$work"
  dirs=("$work" "$here/corpus/$t")
  # Regressions exist only for targets that have crashed once (git keeps no empty folders).
  [ -d "$here/regressions/$t" ] && dirs+=("$here/regressions/$t")
  echo "fuzz: $t for ${secs} s"
  # LeakSanitizer off: HDF5 keeps library-lifetime allocations (third-party, see .ci/lsan.supp).
  if ! (cd "$out" && ASAN_OPTIONS=detect_leaks=0 "$bin" -max_total_time="$secs" -timeout=10 \
        -rss_limit_mb=1024 -max_len=4096 -print_final_stats=1 \
        "${dirs[@]}" 2>&1 | tail -n 12); then
    status=1
  fi
done
exit $status

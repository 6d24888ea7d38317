#!/usr/bin/env bash
# Builds tests/gpu/abi_visibility_lib.cu as a shared library with nvcc or hipcc and checks its
# symbols: dtrain::gpu's entities carry the versioned inline namespace (v<major>_<minor>_<dialect>)
# and none of them is exported from the library. Compile-and-inspect only: no GPU needed.
#   abi_visibility.sh cuda|hip COMPILER SOURCE_DIR WORK_DIR
set -euo pipefail
dialect=$1 cc=$2 src=$3 work=$4
mkdir -p "$work"
# hipcc (ROCm 5.2) leaves empty directories in TMPDIR per compilation: keep them in the work dir.
export TMPDIR="$work/tmp"
mkdir -p "$TMPDIR"
lib="$work/libabi_$dialect.so"
inc=(-I"$src/include" -I"$src/kernels")
if [ "$dialect" = cuda ]; then
  "$cc" -std=c++17 -x cu -O2 --generate-code arch=compute_80,code=sm_80 -DDTRAIN_HAVE_CUDA=1 \
    -Xcompiler=-fPIC -shared "${inc[@]}" "$src/tests/gpu/abi_visibility_lib.cu" -o "$lib"
else
  cp "$src/tests/gpu/abi_visibility_lib.cu" "$work/abi_visibility_lib.cpp"
  "$cc" -std=c++17 -O2 --offload-arch=gfx90a -DDTRAIN_HAVE_HIP=1 -fPIC -shared "${inc[@]}" \
    "$work/abi_visibility_lib.cpp" -o "$lib"
fi
all=$(nm -C "$lib")
dynamic=$(nm -C -D --defined-only "$lib")
tag="dtrain::gpu::v0_1_$dialect::"
if ! grep -qF "$tag" <<<"$all"; then
  echo "FAIL: no symbol in $tag (the versioned namespace is missing)"; exit 1
fi
# (Core types such as dtrain::Error keep default visibility: exceptions must be catchable across
# libraries.)
if grep -q "dtrain::gpu::" <<<"$dynamic"; then
  echo "FAIL: the library exports dtrain::gpu symbols:"; grep "dtrain::gpu::" <<<"$dynamic" | head
  exit 1
fi
if ! grep -q "abi_check_entry" <<<"$dynamic"; then
  echo "FAIL: the library's own entry point is not exported"; exit 1
fi
echo "abi visibility ($dialect): $(grep -cF "$tag" <<<"$all") symbols in $tag, none exported"

#!/usr/bin/env bash
# Runs ckpt_mpi_test's "run directory only rank 0 sees" case on 2 ranks, rank 1 in its own mount
# namespace with an empty tmpfs over the run directory: the directory is node-local to rank 0, as
# /tmp of rank 0's node is on a cluster. Exit 77 (skipped) with the reason when mount namespaces
# are not available here (they need root).
# usage: ckpt_private_dir.sh MPIEXEC TEST_BINARY
set -uo pipefail
mpiexec=${1:?mpiexec}
binary=${2:?ckpt_mpi_test binary}

source "$(dirname "${BASH_SOURCE[0]}")/private_mounts.sh"
require_private_mounts

dir=$(mktemp -d /tmp/dtrain-private-dir.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export DTRAIN_TEST_PRIVATE_DIR="$dir"
case_arg="--test-case=*only rank 0 sees*"
"$mpiexec" -n 1 "$binary" --no-skip "$case_arg" : \
  -n 1 unshare -m --propagation private sh -c \
  'mount -t tmpfs none "$DTRAIN_TEST_PRIVATE_DIR" && exec "$0" --no-skip "$1"' \
  "$binary" "$case_arg"

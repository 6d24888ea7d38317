#!/usr/bin/env bash
# Runs ckpt_mpi_levels' "one local_dir path" case on N ranks, each rank in a mount namespace of
# its own with an empty tmpfs over the node-local directory: one path, a different directory per
# rank, as /dev/shm or local NVMe is per node on a cluster. The run directory stays shared.
# Exit 77 (skipped) with the reason when mount namespaces are not available here (they need root).
# usage: ckpt_levels_private_dir.sh MPIEXEC TEST_BINARY NP
set -uo pipefail
mpiexec=${1:?mpiexec}
binary=${2:?test binary}
np=${3:-2}

source "$(dirname "${BASH_SOURCE[0]}")/private_mounts.sh"
require_private_mounts

dir=$(mktemp -d /tmp/dtrain-levels-private.XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/local" "$dir/shared"
export DTRAIN_TEST_PRIVATE_LOCAL_DIR="$dir/local"
export DTRAIN_TEST_SHARED_DIR="$dir/shared"
case_arg="--test-case=*one local_dir path*"
"$mpiexec" -n "$np" unshare -m --propagation private sh -c \
  'mount -t tmpfs none "$DTRAIN_TEST_PRIVATE_LOCAL_DIR" && exec "$0" --no-skip "$1"' \
  "$binary" "$case_arg"

#!/usr/bin/env bash
# run_in.sh <fresh work dir> <command...>: runs the command in an emptied work directory (the
# language tests write their checkpoints to ./ckpt there).
set -euo pipefail
dir=$1; shift
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
exec "$@"

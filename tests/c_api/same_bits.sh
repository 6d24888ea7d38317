#!/usr/bin/env bash
# same_bits.sh <work dir> <language...>: the programs of the languages (cpp first) trained the same
# run on the same batches in <work dir>/<language>; their parameters (params.bin, float32 from rank
# 0) and their checkpoints' contents (h5dump of every dataset and attribute, the file name aside)
# must be the same bits.
set -euo pipefail
work=$1; shift
ref=$1
status=0
dump() { h5dump "$1" | sed 1d; }
for lang in "$@"; do
  test -s "$work/$lang/params.bin" || { echo "FAIL: $lang wrote no parameters"; exit 1; }
  for step in 3 5; do
    f="$work/$lang/ckpt/ckpt-00000000000$step.h5"
    test -f "$f" || { echo "FAIL: $lang has no checkpoint of step $step"; exit 1; }
    dump "$f" > "$work/$lang-$step.dump"
    grep -q 'DATASET "exp_avg_sq"' "$work/$lang-$step.dump" ||
      { echo "FAIL: $f holds no optimizer state"; exit 1; }
  done
done
for lang in "$@"; do
  [ "$lang" = "$ref" ] && continue
  if ! cmp "$work/$ref/params.bin" "$work/$lang/params.bin"; then
    echo "FAIL: the parameters of $lang differ from $ref's"; status=1
  fi
  for step in 3 5; do
    if ! diff "$work/$ref-$step.dump" "$work/$lang-$step.dump" > "$work/$lang.diff"; then
      echo "FAIL: $lang's checkpoint of step $step differs from $ref's:"
      head -20 "$work/$lang.diff"; status=1
    fi
  done
done
[ $status = 0 ] && echo "same bits: $* (parameters and checkpoints of steps 3 and 5)"
exit $status

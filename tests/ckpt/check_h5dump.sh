#!/bin/sh
# h5dump (hdf5-tools) reads a dtrain checkpoint completely, and its header shows the documented
# schema. usage: check_h5dump.sh MAKE_SAMPLE_BINARY WORK_DIR
set -eu
bin=$1
work=$2
fail() { echo "h5dump check FAILED: $1"; exit 1; }
command -v h5dump > /dev/null ||
  fail "h5dump not found (Debian: hdf5-tools, a required package of scripts/lib.sh)"
rm -rf "$work"
file=$("$bin" "$work")
h5dump "$file" > "$work/full.txt" 2>&1 || fail "h5dump could not read $file"
h5dump -H "$file" > "$work/header.txt" || fail "h5dump -H"
h5dump -d /model/fc1/weight -H "$file" > "$work/w.txt" || fail "dataset /model/fc1/weight"
grep -q 'H5T_IEEE_F32LE' "$work/w.txt" || fail "weight is not H5T_IEEE_F32LE"
grep -q 'SIMPLE { ( 6, 4 ) / ( 6, 4 ) }' "$work/w.txt" || fail "weight shape"
grep -q 'ATTRIBUTE "crc32c"' "$work/w.txt" || fail "crc32c attribute"
grep -q 'ATTRIBUTE "dtype"' "$work/w.txt" || fail "dtype attribute"
h5dump -d /model/fc1/half_w -H "$file" | grep -q '16-bit little-endian floating-point' \
  || fail "f16 dataset type"
h5dump -a /format_version "$file" | grep -q '(0): 1' || fail "format_version"
h5dump -a /format "$file" | grep -q '"dtrain-checkpoint"' || fail "format"
h5dump -a /ranks/1/sampler/cursor "$file" | grep -q '(0): 3' || fail "per-rank scalar"
h5dump -d /config "$file" | grep -q 'lr' || fail "config"
run_id=$(cat "$(dirname "$file")/dtrain-run-id") || fail "the run directory's dtrain-run-id"
h5dump -a /run_id "$file" | grep -q "\"$run_id\"" || fail "run_id"
h5dump -a /shared_step "$file" | grep -q '(0): 3' || fail "shared_step"
for g in '/model' '/model/fc1' '/optimizer' '/dropout' '/schedule' '/ranks/0/sampler' '/ranks/1/sampler/rng'; do
  h5dump -g "$g" -H "$file" > /dev/null || fail "group $g"
done
rm -rf "$work"
echo "h5dump check passed"

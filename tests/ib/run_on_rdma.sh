#!/usr/bin/env bash
# Builds and runs the RDMA verbs tests and the all-reduce benchmark on machines with an RDMA NIC,
# in one go: configures a build (CMake, MPI, libibverbs-dev, doctest, CLI11), builds
# ib_transport_test and allreduce_bench, runs the ib tests (labelled `ib`) under mpiexec, then
# allreduce_bench over ibverbs against MPI_Allreduce and the mpi / mpi-rma transports.
#
#   tests/ib/run_on_rdma.sh                                # 2 ranks on this host
#   DTRAIN_RDMA_HOSTS=node1,node2 tests/ib/run_on_rdma.sh  # one rank per host (needs the NIC
#                                                          # between them, the real target)
#   DTRAIN_IB_DEVICE=mlx5_0 DTRAIN_IB_PORT=1 DTRAIN_IB_GID_INDEX=3 tests/ib/run_on_rdma.sh
#
# Target (see benchmarks/RESULTS.md): auto over ibverbs at >= 64 MiB reaches >= 90% of the NIC's
# line rate in nccl-tests busbw (e.g. >= 11.25 GB/s on 100 Gb/s, >= 22.5 GB/s on 200 Gb/s).
# Outputs and logs go to $OUT (default build-rdma-run/). Exit: 0 passed, 1 failed, 77 no device.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/build-rdma-run}"
BUILD="$OUT/build"
NP="${DTRAIN_RDMA_NP:-2}"
mkdir -p "$OUT"
log() { echo "run_on_rdma: $*" | tee -a "$OUT/run.log"; }

if command -v ibv_devinfo >/dev/null 2>&1; then ibv_devinfo -v > "$OUT/devinfo.txt" 2>&1 || true; fi
ulimit -l >> "$OUT/run.log" 2>&1 || true
MPIEXEC="${MPIEXEC:-$(command -v mpiexec.mpich || command -v mpiexec)}"
HOSTS=()
if [ -n "${DTRAIN_RDMA_HOSTS:-}" ]; then
  HOSTS=(-hosts "$DTRAIN_RDMA_HOSTS")
  NP=$(echo "$DTRAIN_RDMA_HOSTS" | tr ',' '\n' | wc -l)
fi

log "configure + build in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_ENABLE_IBVERBS=ON \
  -DMPIEXEC_EXECUTABLE="$MPIEXEC" > "$OUT/configure.log" 2>&1 || { log "configure failed (see configure.log)"; exit 1; }
cmake --build "$BUILD" --target ib_transport_test allreduce_bench -j "$(getconf _NPROCESSORS_ONLN)" > "$OUT/build.log" 2>&1 \
  || { log "build failed (see build.log)"; exit 1; }

log "ib tests on $NP ranks"
"$MPIEXEC" -n "$NP" "${HOSTS[@]}" "$BUILD/tests/ib_transport_test" > "$OUT/ib_test.log" 2>&1
rc=$?
tail -5 "$OUT/ib_test.log" | tee -a "$OUT/run.log"
if [ $rc -eq 77 ]; then log "skipped: no RDMA device"; exit 77; fi
[ $rc -ne 0 ] && log "ib tests FAILED (rc $rc)"

log "benchmark: ibverbs vs mpi-rma vs mpi, MPI_Allreduce as baseline, 4 KiB .. 1 GiB"
"$MPIEXEC" -n "$NP" "${HOSTS[@]}" "$BUILD/benchmarks/allreduce_bench" -b 4K -e 1G -f 4 -n 20 -w 5 -R 3 \
  --transport ibverbs,mpi-rma,mpi --algo ring,tree,rhd,auto,mpi --json "$OUT/allreduce.json" \
  > "$OUT/allreduce.txt" 2>&1
brc=$?
tee -a "$OUT/run.log" < "$OUT/allreduce.txt" | grep -E "^#|auto" | head -60
[ $brc -ne 0 ] && log "benchmark FAILED (rc $brc)"
[ $rc -ne 0 ] || [ $brc -ne 0 ] && exit 1
log "done: results in $OUT (compare auto over ibverbs at >= 64 MiB with the NIC line rate)"
exit 0

// SPDX-License-Identifier: BSD-3-Clause
// The frame of an MPI example's main() (not part of the library).
#pragma once

#include <mpi.h>

#include <cstdio>
#include <utility>

#include <dtrain/train/agreed.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/mpi_abort.hpp>

namespace dtrain_cli {

/// Runs `body(argc, argv)` (returning the exit code) inside MPI: MPI_Init_thread at
/// MPI_THREAD_MULTIPLE (dtrain's progress thread calls MPI), then fail fast
/// (dtrain::install_mpi_fail_fast: an error on one rank prints that rank's message and ends the
/// job with MPI_Abort, without unwinding the stack into collectives; README: "When a rank
/// fails"). A dtrain::AgreedError, which every rank throws alike, is printed on stderr by rank 0
/// and every rank returns 1. Any other exception finds no handler here, so std::terminate runs
/// without unwinding and the fail-fast handler prints it and aborts the job. MPI is finalised
/// unless this rank failed (MPI_Finalize would wait for the peers).
template <class Body>
int mpi_main(int argc, char** argv, Body&& body) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  dtrain::install_mpi_fail_fast(MPI_COMM_WORLD);
  int code = 0;
  try {
    code = std::forward<Body>(body)(argc, argv);
  } catch (const dtrain::AgreedError& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fprintf(stderr, "%s\n", e.what());
    code = 1;
  }
  dtrain::finalize_mpi();
  return code;
}

}  // namespace dtrain_cli

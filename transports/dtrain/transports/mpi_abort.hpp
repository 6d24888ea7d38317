// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the MPI side of the failure policy (<dtrain/core/failure.hpp>): ending the job with
// MPI_Abort on the communicator the application trains on. Needs dtrain::mpi.
#pragma once

#include <mpi.h>

#include <cstdlib>
#include <chrono>
#include <thread>

#include <dtrain/core/failure.hpp>

namespace dtrain {
namespace detail {

inline MPI_Comm& mpi_abort_comm() noexcept {
  static MPI_Comm comm = MPI_COMM_WORLD;
  return comm;
}

inline void mpi_abort_hook(int code) noexcept {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  if (up) MPI_Finalized(&down);
  // The error line was written to stderr just before; the process manager forwards it through
  // a pipe that MPI_Abort's tear-down may close undrained, so give it a moment to arrive first.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // MPI_Abort asks the process manager (mpiexec's hydra, srun) to kill every process of the
  // communicator's job; it does not wait for any peer.
  if (up && !down) MPI_Abort(mpi_abort_comm(), code);
  std::_Exit(code);
}

}  // namespace detail

/// Local, call once in main after MPI_Init (before training). Makes an error that ends this
/// rank's training end the whole job promptly: sets `policy` (abort_job unless the application
/// catches errors itself and passes propagate), installs MPI_Abort(comm) as the abort hook and a
/// terminate handler that prints an uncaught exception's message before aborting. `comm` must
/// stay valid until MPI_Finalize (MPI_COMM_WORLD, or the communicator the job trains on; MPI
/// implementations may abort every process of the job either way). Not thread-safe against
/// concurrent failures being reported while it runs.
inline void install_mpi_fail_fast(MPI_Comm comm = MPI_COMM_WORLD,
                                  FailurePolicy policy = FailurePolicy::abort_job) noexcept {
  detail::mpi_abort_comm() = comm;
  set_abort_hook(&detail::mpi_abort_hook);
  set_failure_policy(policy);
  install_terminate_handler();
}

}  // namespace dtrain

// dtrain::finalize_mpi under mpiexec -n 2, its own main (MPI_Finalize is the thing tested):
// - "healthy": every rank finalises (finalize_mpi returns true);
// - "failing": rank 1 is stopped and never comes back; rank 0 fails (job_failed) and must return
//   from finalize_mpi at once, without MPI_Finalize, which with MPICH waits for every rank and
//   would block for as long as rank 1 is stopped. The process manager then ends rank 1;
// - "unfinished": the same with an operation recorded as given up unfinished
//   (note_unfinished_operations) and no failure: finalize_mpi says why it skips MPI_Finalize.
// Exit code 0 when rank 0's checks hold; a hang is caught by the test's timeout.
#include <mpi.h>

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <dtrain/core/failure.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/mpi.hpp>

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "finalize_test: needs exactly 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const bool healthy = std::strcmp(mode, "healthy") == 0;
  if (!healthy && std::strcmp(mode, "failing") != 0 && std::strcmp(mode, "unfinished") != 0) {
    if (rank == 0) std::fprintf(stderr, "finalize_test: mode healthy|failing|unfinished\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (healthy) {
    const bool done = dtrain::finalize_mpi();
    if (!done) std::fprintf(stderr, "FAIL: rank %d: a healthy finalize_mpi returned false\n", rank);
    return done ? 0 : 1;
  }
  if (rank == 1) {
    raise(SIGSTOP);  // never resumed: the process manager kills it once rank 0 has exited
    return 0;
  }
  if (std::strcmp(mode, "failing") == 0)
    dtrain::job_failed(std::make_exception_ptr(std::runtime_error("error injected by the test")));
  else
    dtrain::note_unfinished_operations(1);
  const double t0 = dtrain::now_seconds();
  const bool finalized = dtrain::finalize_mpi();
  const double took = dtrain::now_seconds() - t0;
  if (finalized || took > 2) {
    std::fprintf(stderr, "FAIL: finalize_mpi returned %s after %.2f s\n",
                 finalized ? "true" : "false", took);
    return 1;
  }
  std::fprintf(stderr, "finalize_test: rank 0 skipped MPI_Finalize (%s) in %.3f s\n", mode, took);
  return 0;
}

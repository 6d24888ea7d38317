// doctest main for MPI tests: every rank runs every test case; the process exit code is the
// worst over all ranks; a watchdog aborts the whole job if a test hangs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/case_counter.hpp"
#include "support/watchdog.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int code = 0;
  {
    dtrain::test::Watchdog watchdog([rank](double s) {
      std::fprintf(stderr, "dtrain test watchdog: rank %d still running after %.0f s, aborting\n",
                   rank, s);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 124);
    });
    doctest::Context context(argc, argv);
    // Rank 0 reports fully; the others report failures only, prefixed by their rank.
    if (rank != 0) context.setOption("minimal", true);
    code = context.run();
    if (code == 0 && dtrain::test::no_case_selected()) {
      std::fprintf(stderr, "rank %d: no test case matches the filters given\n", rank);
      code = 1;
    }
    if (code != 0) std::fprintf(stderr, "rank %d of %d: %d test failure(s)\n", rank, size, code);
  }
  int worst = 0;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

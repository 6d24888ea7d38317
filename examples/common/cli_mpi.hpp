// Command-line parsing for MPI programs (examples and benchmarks only): every rank parses its own
// argv, then the ranks agree on the outcome before anyone continues, so that a bad option on one
// rank of an MPMD launch stops the whole job at once instead of leaving the others waiting in
// their first collective.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdio>

#include "common/cli.hpp"

namespace dtrain_cli {

/// Collective over `comm` (MPI_Allreduce, no deadline needed: every rank calls it right after
/// start-up). Returns -1 when every rank parsed its options, otherwise the exit code every rank
/// must return: 2 if any rank's options are wrong (the lowest such rank prints its error, prefixed
/// with its rank when the job has several), 0 after --help (rank 0 prints it).
inline int run_parser_mpi(CLI::App& app, int argc, char** argv, MPI_Comm comm = MPI_COMM_WORLD) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const ParseResult r = parse_quietly(app, argc, argv);
  int worst = r.code, first_bad = r.code == 2 ? rank : INT_MAX;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, comm);
  if (worst == 2) {
    if (rank == first_bad) {
      if (size > 1) std::fprintf(stderr, "rank %d: ", rank);
      std::fputs(r.err.c_str(), stderr);
      std::fflush(stderr);
    }
    return 2;
  }
  if (worst == 0 || r.code == 0) {
    if (rank == 0) std::fputs(r.out.c_str(), stdout);
    return 0;
  }
  return -1;
}

}  // namespace dtrain_cli

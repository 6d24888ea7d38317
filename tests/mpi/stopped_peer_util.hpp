// Helpers shared by the MPI tests that stop and resume ranks (abandon_test, rma_deadline_test):
// world size and rank, every rank's pid (all ranks run on this node under mpiexec -n N), the
// resumption of the stopped last rank once the others are done, and the message of the dtrain
// error a ring all-reduce raised.
#pragma once

#include <mpi.h>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <dtrain/comm/allreduce_algorithm.hpp>
#include <dtrain/comm/reduce_op.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

/// Every rank's pid, by world rank. Collective over MPI_COMM_WORLD.
inline std::vector<int> world_pids() {
  std::vector<int> pids(static_cast<std::size_t>(world_size()));
  int mine = static_cast<int>(getpid());
  MPI_Allgather(&mine, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return pids;
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Called by every rank but the last (which is stopped): once all of them got here, rank 0
/// resumes the last rank (SIGCONT to `pids`' last entry). `tag` keeps the handshakes of test
/// cases apart.
inline void resume_last_rank_after_others(const std::vector<int>& pids, int tag) {
  const int rank = world_rank(), last = world_size() - 1;
  int token = 0;
  if (rank != 0) MPI_Send(&token, 1, MPI_INT, 0, tag, MPI_COMM_WORLD);
  if (rank == 0) {
    for (int q = 1; q < last; ++q)
      MPI_Recv(&token, 1, MPI_INT, q, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    kill(pids[static_cast<std::size_t>(last)], SIGCONT);
  }
}

/// Runs a ring all-reduce (sum) of `x` and returns the message of the dtrain error it raised
/// ("" if none).
template <class Comm>
std::string ring_allreduce_error(Comm& comm, std::vector<float>& x) {
  try {
    comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dtrain::test

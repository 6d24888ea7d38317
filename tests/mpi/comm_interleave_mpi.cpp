// Back-to-back collectives of every all-reduce algorithm on real MPI, interleaved as
// allreduce_bench runs them: each algorithm's plan executed several times in a row, then the
// benchmark's one-element rd all-reduce, a barrier before the next algorithm. 4 KiB segments
// make many messages per step; with UCX's rendezvous from 1 KiB up (UCX_RNDV_THRESH, set by the
// CTest) each sender completes only once the receiver's MPI library answers: a rank that received
// everything of one collective and then waited on a node-shared counter without calling MPI (the
// next collective's fingerprint check, the shm algorithm) left its peer waiting for it while it
// waited for the peer. That hung allreduce_bench's rd runs with MPICH over UCX
// (docs/benchmark-notes.md). Every result is compared with MPI_Allreduce of the same inputs.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstddef>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_interleave_mpi {

using namespace dtrain;

TEST_CASE("back-to-back collectives of every algorithm, interleaved, match MPI_Allreduce") {
  MpiTransport t(MPI_COMM_WORLD);
  CommConfig c = CommConfig::from_env();
  c.timeout_s = 30;
  c.segment_bytes = 4096;
  c.cost_model.alpha = 2e-6;  // a given model: `automatic` chooses without measuring
  c.cost_model.beta = 1.0 / 4e9;
  c.cost_model.gamma = 1.0 / 8e9;
  Communicator comm(t, c);
  const int p = t.size(), r = t.rank();
  std::vector<AllreduceAlgorithm> algos{AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                                        AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd,
                                        AllreduceAlgorithm::automatic};
  if (t.shared_segments()) algos.push_back(AllreduceAlgorithm::shm);
  const std::size_t n = p == 2 ? 256 * 1024 : 64 * 1024;  // 1 MiB or 256 KiB of int
  const int rounds = p == 2 ? 4 : 2, repeats = 5;
  std::vector<int> in(n), out(n), want(n);
  std::vector<decltype(comm)::Plan> plans;
  for (AllreduceAlgorithm a : algos)
    plans.push_back(comm.plan_allreduce(BufferView(in.data(), n, DType::i32),
                                        BufferView(out.data(), n, DType::i32), ReduceOp::sum, a));
  int call = 0, wrong_calls = 0, checked = 0;
  for (int round = 0; round < rounds; ++round)
    for (std::size_t j = 0; j < algos.size(); ++j) {
      const std::size_t k = (j + static_cast<std::size_t>(round)) % algos.size();
      comm.barrier();
      for (int i = 0; i < repeats; ++i, ++call) {
        for (std::size_t e = 0; e < n; ++e)
          in[e] = static_cast<int>((e * 7 + static_cast<std::size_t>(r * 13 + call)) % 1000);
        plans[k].execute();
        // Back to back: no MPI call between the executions of one algorithm, so every rank
        // computes the others' inputs for its reference, and MPI_Allreduce checks the last one.
        for (std::size_t e = 0; e < n; ++e) {
          int sum = 0;
          for (int q = 0; q < p; ++q)
            sum += static_cast<int>((e * 7 + static_cast<std::size_t>(q * 13 + call)) % 1000);
          want[e] = sum;
        }
        if (i + 1 == repeats) {
          std::vector<int> mpi(n);
          MPI_Allreduce(in.data(), mpi.data(), static_cast<int>(n), MPI_INT, MPI_SUM,
                        MPI_COMM_WORLD);
          if (mpi != want) ++wrong_calls;
        }
        if (out != want) ++wrong_calls;
        ++checked;
      }
      double mine = r + round, most = -1;
      comm.allreduce(BufferView(&mine, 1, DType::f64), BufferView(&most, 1, DType::f64),
                     ReduceOp::max, AllreduceAlgorithm::rd);
      CHECK(most == p - 1 + round);
    }
  CHECK(wrong_calls == 0);
  CHECK(checked == rounds * static_cast<int>(algos.size()) * repeats);
}

}  // namespace dtrain_test_comm_interleave_mpi

// Plans of one communicator share one scratch block (its collectives run one at a time): the
// memory stays one plan's worth however many plans exist, and plans executed in any interleaving,
// with the block left dirty by the others, still match the reference exactly.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_scratch_test {

using namespace dtrain;

namespace {

// Integer-valued floats: every summation order gives the exact sum, so every algorithm must
// return exactly the reference.
float value(int rank, std::size_t plan, std::size_t i, int round) {
  return static_cast<float>(
      static_cast<int>((i * 7 + plan * 13 + static_cast<std::size_t>(rank) * 31 +
                        static_cast<std::size_t>(round) * 5) %
                       97) -
      48);
}

}  // namespace

TEST_CASE("plans of one communicator share one scratch block and stay exact in any order") {
  const AllreduceAlgorithm algos[] = {AllreduceAlgorithm::ring, AllreduceAlgorithm::rhd,
                                      AllreduceAlgorithm::tree, AllreduceAlgorithm::rd,
                                      AllreduceAlgorithm::ordered};
  for (int p : {2, 3, 4}) {
    for (AllreduceAlgorithm algo : algos) {
      CAPTURE(p);
      const std::string algo_name = name_of(algo);
      CAPTURE(algo_name);
      std::mutex m;
      std::vector<std::string> failures;
      std::size_t shared_bytes = 0, blocks = 0, bytes_one = 0, bytes_eight = 0;
      run_loopback(p, [&](LoopbackTransport& t) {
        CommConfig c;
        c.segment_bytes = 256;  // several segments per block: the pipelines use their scratch
        c.timeout_s = 60;
        Communicator comm(t, c);
        // Eight plans of one size (a gradient's buckets), then one larger and one smaller.
        std::vector<std::size_t> counts(8, 1000);
        counts.push_back(5003);
        counts.push_back(17);
        std::vector<std::vector<float>> bufs(counts.size());
        std::vector<CollectivePlan<LoopbackTransport>> plans;
        for (std::size_t k = 0; k < counts.size(); ++k) {
          bufs[k].resize(counts[k]);
          plans.push_back(comm.plan_allreduce(BufferView(bufs[k].data(), counts[k], DType::f32),
                                              BufferView(bufs[k].data(), counts[k], DType::f32),
                                              ReduceOp::sum, algo));
          if (t.rank() == 0 && k == 0) bytes_one = comm.scratch_bytes();
          if (t.rank() == 0 && k == 7) bytes_eight = comm.scratch_bytes();
        }
        // Rounds in different orders: each plan finds the block as the previous one left it.
        const std::vector<std::vector<std::size_t>> orders = {
            {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {9, 8, 0, 7, 1, 6, 2, 5, 3, 4}, {8, 3, 8, 9, 0, 8}};
        for (int round = 0; round < static_cast<int>(orders.size()); ++round) {
          for (std::size_t k : orders[static_cast<std::size_t>(round)]) {
            for (std::size_t i = 0; i < counts[k]; ++i) bufs[k][i] = value(t.rank(), k, i, round);
            plans[k].execute();
            for (std::size_t i = 0; i < counts[k]; ++i) {
              float want = 0;
              for (int r = 0; r < p; ++r) want += value(r, k, i, round);
              if (bufs[k][i] != want) {
                std::lock_guard<std::mutex> lock(m);
                failures.push_back(detail::concat("rank ", t.rank(), " plan ", k, " round ", round,
                                                  " element ", i, ": ", bufs[k][i], " != ", want));
                break;
              }
            }
          }
        }
        if (t.rank() == 0) {
          shared_bytes = comm.scratch_bytes();
          blocks = comm.scratch_blocks();
        }
      });
      for (const auto& f : failures) FAIL_CHECK(f);
      CHECK(failures.empty());
      // Eight equal plans hold what one holds alone; the larger plan may need one more block.
      CHECK(bytes_eight == bytes_one);
      CHECK(blocks <= 2);
      // The ring works in place through block-sized scratch: the check above is not vacuous.
      if (algo == AllreduceAlgorithm::ring) CHECK(bytes_one > 0);
      // The shared block is about one plan's scratch for the largest count, not the sum over
      // plans (the sum of the ten plans' counts is 13020 floats).
      CHECK(shared_bytes <= 3 * 5003 * sizeof(float) + 4096);
    }
  }
}

}  // namespace dtrain_test_comm_scratch_test

// Back-to-back collectives of every all-reduce algorithm, interleaved as allreduce_bench runs
// them (each algorithm's plan executed several times in a row, a one-element rd all-reduce and a
// barrier between algorithms), on a loopback world that models MPI's weak progress: a send
// completes only when its receiver calls into its transport again. A rank that has received
// everything of one collective and then waits on a node-shared counter (the fingerprint check of
// the next collective, the shm algorithm) must keep the transport's progress going there, or the
// peer whose last send it has not acknowledged waits for it while it waits for the peer: with
// MPICH over UCX this hung allreduce_bench's rd runs (docs/benchmark-notes.md). Also without
// weak progress, as the plain transport runs. Every result is checked against the exact sum.
#include <doctest/doctest.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_interleave_test {

using namespace dtrain;

namespace {

// Small integers, so that every order of summation gives the exact value.
float value(std::size_t i, int rank, int call) {
  return static_cast<float>(
      (i * 5 + static_cast<std::size_t>(rank) * 11 + static_cast<std::size_t>(call) * 3) % 97);
}

void run_case(int p, bool weak) {
  LoopbackWorld world(p, SharedSegmentConfig{});
  world.set_weak_progress(weak);
  const std::vector<AllreduceAlgorithm> algos{
      AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
      AllreduceAlgorithm::rd,   AllreduceAlgorithm::shm,  AllreduceAlgorithm::automatic};
  // 256-byte segments: 3000 floats are 47 messages per step, as a large vector is at 256 KiB.
  const std::size_t n = 3000;
  const int rounds = 3, repeats = 6;
  std::mutex m;
  std::vector<std::string> failures;
  int checked = 0;  // calls whose every element was compared, over all ranks
  run_loopback(world, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 20;
    c.segment_bytes = 256;
    c.cost_model.alpha = 2e-6;  // a given model: `automatic` chooses without measuring
    c.cost_model.beta = 1.0 / 4e9;
    c.cost_model.gamma = 1.0 / 8e9;
    Communicator comm(t, c);
    const int r = t.rank();
    std::vector<float> in(n), out(n);
    std::vector<decltype(comm)::Plan> plans;
    for (AllreduceAlgorithm a : algos)
      plans.push_back(comm.plan_allreduce(BufferView(in.data(), n, DType::f32),
                                          BufferView(out.data(), n, DType::f32), ReduceOp::sum, a));
    int call = 0;
    for (int round = 0; round < rounds; ++round)
      for (std::size_t j = 0; j < algos.size(); ++j) {
        const std::size_t k = (j + static_cast<std::size_t>(round)) % algos.size();
        comm.barrier();
        bool wrong = false;
        for (int i = 0; i < repeats; ++i, ++call) {
          for (std::size_t e = 0; e < n; ++e) in[e] = value(e, r, call);
          plans[k].execute();
          for (std::size_t e = 0; e < n && !wrong; ++e) {
            float want = 0;
            for (int q = 0; q < p; ++q) want += value(e, q, call);
            if (out[e] != want) {
              wrong = true;
              std::lock_guard<std::mutex> lock(m);
              failures.push_back(detail::concat("rank ", r, " ", name_of(algos[k]), " call ", call,
                                                " element ", e, ": ", out[e], " != ", want));
            }
          }
        }
        {
          std::lock_guard<std::mutex> lock(m);
          checked += repeats + 1;
        }
        // The benchmark's agreement on the cell's time: one element, rd.
        double mine = r + round, most = 0;
        comm.allreduce(BufferView(&mine, 1, DType::f64), BufferView(&most, 1, DType::f64),
                       ReduceOp::max, AllreduceAlgorithm::rd);
        if (most != p - 1 + round) {
          std::lock_guard<std::mutex> lock(m);
          failures.push_back(
              detail::concat("rank ", r, " max after ", name_of(algos[k]), ": ", most));
        }
      }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
  CHECK(checked == p * rounds * static_cast<int>(algos.size()) * (repeats + 1));
}

}  // namespace

TEST_CASE("back-to-back collectives of every algorithm, interleaved, under MPI's weak progress") {
  for (int p : {2, 3, 4}) {
    CAPTURE(p);
    run_case(p, true);
  }
}

TEST_CASE("back-to-back collectives of every algorithm, interleaved, on the plain transport") {
  for (int p : {2, 3, 4}) {
    CAPTURE(p);
    run_case(p, false);
  }
}

}  // namespace dtrain_test_comm_interleave_test

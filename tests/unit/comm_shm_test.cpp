// The shm all-reduce with slots large enough that a chunk's data sits at its output's offset
// within a page (algo/shm.hpp): exact sums when every rank's input and output lie at other
// offsets, in place and out of place, f32 and f64, over several chunks and slot reuses, and
// counts smaller than the ranks (a rank with an empty part still copies its partners' out). A
// reader that took its own offset for its partner's data, or a chunk that overran its slot, would
// give wrong elements here.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_shm_test {

using namespace dtrain;

namespace {

// Small integers, so that every order of summation gives the exact value.
template <class T>
T value(std::size_t i, int rank, int call) {
  return static_cast<T>(
      (i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(call)) % 101);
}

template <class T>
void run_case(int p, bool inplace, std::size_t n) {
  SharedSegmentConfig seg;
  seg.slot_bytes = 64 * 1024;  // the smallest slot whose chunks are placed by offset
  seg.slots = 2;
  LoopbackWorld world(p, seg);
  std::mutex m;
  std::vector<std::string> failures;
  const DType dt = sizeof(T) == 4 ? DType::f32 : DType::f64;
  run_loopback(world, [&](LoopbackTransport& t) {
    CommConfig c;
    c.timeout_s = 60;
    Communicator comm(t, c);
    const int r = t.rank();
    // Element offsets into oversized buffers: other ones on every rank and in every call, from
    // 0 to most of a page, input and output apart.
    std::vector<T> in_mem(n + 1024), out_mem(n + 1024);
    for (int call = 0; call < 4; ++call) {
      const std::size_t oi =
          (static_cast<std::size_t>(r) * 5 + static_cast<std::size_t>(call) * 3) %
          (4096 / sizeof(T));
      const std::size_t oo = inplace ? oi : (oi + 1 + static_cast<std::size_t>(r) * 11) % 64;
      T* x = (inplace ? out_mem.data() : in_mem.data()) + oi;
      T* y = out_mem.data() + oo;
      for (std::size_t i = 0; i < n; ++i) x[i] = value<T>(i, r, call);
      comm.allreduce(BufferView(x, n, dt), BufferView(y, n, dt), ReduceOp::sum,
                     AllreduceAlgorithm::shm);
      for (std::size_t i = 0; i < n; ++i) {
        T want = 0;
        for (int q = 0; q < p; ++q) want += value<T>(i, q, call);
        if (y[i] != want) {
          std::lock_guard<std::mutex> lock(m);
          failures.push_back("rank " + std::to_string(r) + " call " + std::to_string(call) +
                             " element " + std::to_string(i) + ": " + std::to_string(y[i]) +
                             " != " + std::to_string(want));
          break;  // the other calls still run, so no rank waits for this one
        }
      }
    }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

}  // namespace

TEST_CASE("shm with page-offset chunks: exact sums with every rank's buffers at other offsets") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    for (bool inplace : {false, true}) {
      CAPTURE(inplace);
      // Several chunks with every slot reused; and counts where some ranks' parts are empty.
      for (std::size_t n : {std::size_t{50000}, std::size_t{1}, std::size_t{2}, std::size_t{300}}) {
        CAPTURE(n);
        run_case<float>(p, inplace, n);
        run_case<double>(p, inplace, n);
      }
    }
  }
}

}  // namespace dtrain_test_comm_shm_test

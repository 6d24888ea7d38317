// reduce_scatter and allgather on one node from the node-shared heaps (algo/shm_parts.hpp):
// - exact results against sums computed here, with every rank's buffers in its heap (each call
//   then runs in one hand-off, counted by SharedSegments::part_calls) or only some ranks' (the
//   ring over the transport, after the hand-off), for 2-4 ranks, uneven splits and empty parts,
//   in-place allgather, sum and max, and on fake nodes (no segments for the group: ring alone);
// - a reduce_scatter average from the heaps is bit for bit part r of the shm all-reduce's on 2
//   ranks, and within rounding of the exact average on 3 and 4;
// - a rank returns only once the others have read its input: every rank overwrites its input the
//   moment its call returns, and no rank may see those values;
// - a partner that never arrives: TimeoutError naming the rank, the call and the peer.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/core/timer.hpp>
#include <dtrain/transports/loopback.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_shm_parts_test {

using namespace dtrain;

namespace {

SharedSegmentConfig heap_config(std::size_t heap_bytes) {
  SharedSegmentConfig c;
  c.slot_bytes = 64 * 1024;
  c.slots = 2;  // every slot reused within a few calls
  c.heap_bytes = heap_bytes;
  return c;
}

CommConfig patient() {
  CommConfig c;
  c.timeout_s = 60;
  return c;
}

// Small integers, so that every order of summation gives the exact value.
float small_value(std::size_t i, int rank, int call) {
  return static_cast<float>(
      (i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(call)) % 101);
}

std::size_t part_begin(std::size_t n, int p, int q) { return partition_begin(n, p, q); }

struct Failures {
  std::mutex m;
  std::vector<std::string> list;
  void add(int r, const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    list.push_back("rank " + std::to_string(r) + ": " + what);
  }
};

// On node_of's nodes: three reduce_scatter calls (sum, then max), three allgather calls out of
// place and three in place, every result checked element by element; rank r's buffers come from
// its heap where heap[r]. Returns each rank's count of calls run whole from the heaps.
std::vector<std::uint64_t> exact_parts(const std::vector<int>& node_of,
                                       const std::vector<bool>& heap, std::size_t n, Failures& f) {
  const int p = static_cast<int>(node_of.size());
  LoopbackWorld world(node_of, heap_config(4 << 20));
  std::vector<std::uint64_t> whole(static_cast<std::size_t>(p), 0);
  run_loopback(world, [&](LoopbackTransport& t) {
    Communicator comm(t, patient());
    const int r = t.rank();
    Allocator& a =
        heap[static_cast<std::size_t>(r)] ? comm.shared_allocator() : default_allocator();
    const SharedSegments* seg = node_segments_of(t);
    const std::uint64_t before = seg ? seg->part_calls : 0;
    const std::size_t b0 = part_begin(n, p, r), len = part_begin(n, p, r + 1) - b0;
    auto* full = static_cast<float*>(a.allocate(n * sizeof(float) + 64, 64));
    auto* mine = static_cast<float*>(a.allocate(len * sizeof(float) + 64, 64));
    for (int call = 0; call < 3; ++call) {
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        for (std::size_t i = 0; i < n; ++i) full[i] = small_value(i, r, call);
        std::fill(mine, mine + len, -7.0f);
        comm.reduce_scatter(BufferView(full, n, DType::f32), BufferView(mine, len, DType::f32), op);
        std::size_t bad = 0;
        for (std::size_t j = 0; j < len; ++j) {
          float want = op == ReduceOp::sum ? 0.0f : small_value(b0 + j, 0, call);
          for (int q = 0; q < p; ++q)
            want = op == ReduceOp::sum ? want + small_value(b0 + j, q, call)
                                       : std::max(want, small_value(b0 + j, q, call));
          bad += mine[j] != want;
        }
        if (bad)
          f.add(r, "reduce_scatter " + std::string(name_of(op)) + " call " + std::to_string(call) +
                       ": " + std::to_string(bad) + " wrong elements");
      }
      for (const bool inplace : {false, true}) {
        std::fill(full, full + n, -7.0f);
        float* src = inplace ? full + b0 : mine;
        for (std::size_t j = 0; j < len; ++j) src[j] = small_value(b0 + j, r, call) + 1000.0f;
        comm.allgather(BufferView(src, len, DType::f32), BufferView(full, n, DType::f32));
        std::size_t bad = 0;
        for (int q = 0; q < p; ++q)
          for (std::size_t i = part_begin(n, p, q); i < part_begin(n, p, q + 1); ++i)
            bad += full[i] != small_value(i, q, call) + 1000.0f;
        if (bad)
          f.add(r, std::string(inplace ? "in-place " : "") + "allgather call " +
                       std::to_string(call) + ": " + std::to_string(bad) + " wrong elements");
      }
    }
    a.deallocate(mine, len * sizeof(float) + 64);
    a.deallocate(full, n * sizeof(float) + 64);
    whole[static_cast<std::size_t>(r)] = (seg ? seg->part_calls : 0) - before;
  });
  return whole;
}

}  // namespace

TEST_CASE("reduce_scatter and allgather from the heaps: exact, every rank or some in its heap") {
  const std::vector<std::vector<bool>> layouts = {{true, true},
                                                  {true, false},
                                                  {true, true, true},
                                                  {false, true, true},
                                                  {true, true, true, true},
                                                  {true, true, false, true}};
  for (const auto& heap : layouts)
    for (const std::size_t n : {std::size_t{100003}, std::size_t{1000}, std::size_t{3}}) {
      const int p = static_cast<int>(heap.size());
      CAPTURE(p);
      CAPTURE(n);
      CAPTURE(heap[0]);
      CAPTURE(heap[1]);
      Failures f;
      const auto whole = exact_parts(std::vector<int>(heap.size(), 0), heap, n, f);
      for (const auto& s : f.list) FAIL_CHECK(s);
      // 6 reduce_scatter and 6 allgather calls; whole from the heaps only where every rank is.
      const bool all = std::count(heap.begin(), heap.end(), true) == p;
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(whole[static_cast<std::size_t>(r)] == (all ? 12u : 0u));
      }
    }
}

TEST_CASE("reduce_scatter and allgather on fake nodes: the ring, exact") {
  // Two nodes of two: no segments for the group, so the plans hold the ring alone.
  Failures f;
  const auto whole = exact_parts({0, 0, 1, 1}, {true, true, true, true}, 10001, f);
  for (const auto& s : f.list) FAIL_CHECK(s);
  for (const std::uint64_t w : whole) CHECK(w == 0u);
}

TEST_CASE("reduce_scatter from the heaps: the shm all-reduce's bits on 2 ranks, near on more") {
  for (int p : {2, 3, 4})
    for (const std::size_t n : {std::size_t{70001}, std::size_t{1000}}) {
      CAPTURE(p);
      CAPTURE(n);
      LoopbackWorld world(p, heap_config(4 << 20));
      std::vector<std::vector<float>> data(static_cast<std::size_t>(p));
      std::vector<std::vector<float>> parts(static_cast<std::size_t>(p)),
          averaged(static_cast<std::size_t>(p));
      run_loopback(world, [&](LoopbackTransport& t) {
        Communicator comm(t, patient());
        const int r = t.rank();
        // Values whose sums round: another order of the reduction would change bits.
        std::vector<float> v(n);
        std::uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r + 1);
        for (auto& x : v) {
          s ^= s << 13, s ^= s >> 7, s ^= s << 17;
          x = static_cast<float>(static_cast<double>(s % 1000003) / 977.0 - 500.0);
        }
        data[static_cast<std::size_t>(r)] = v;
        Allocator& h = comm.shared_allocator();
        const std::size_t b0 = part_begin(n, p, r), len = part_begin(n, p, r + 1) - b0;
        auto* x = static_cast<float*>(h.allocate(n * sizeof(float), 64));
        auto* y = static_cast<float*>(h.allocate(len * sizeof(float), 64));
        std::copy(v.begin(), v.end(), x);
        comm.reduce_scatter(BufferView(x, n, DType::f32), BufferView(y, len, DType::f32),
                            ReduceOp::avg);
        parts[static_cast<std::size_t>(r)].assign(y, y + len);
        comm.allreduce(BufferView(x, n, DType::f32), ReduceOp::avg, AllreduceAlgorithm::shm);
        averaged[static_cast<std::size_t>(r)].assign(x + b0, x + b0 + len);
        h.deallocate(y, len * sizeof(float));
        h.deallocate(x, n * sizeof(float));
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const auto& got = parts[static_cast<std::size_t>(r)];
        const std::size_t b0 = part_begin(n, p, r);
        if (p == 2) {
          REQUIRE(got.size() == averaged[static_cast<std::size_t>(r)].size());
          CHECK(std::memcmp(got.data(), averaged[static_cast<std::size_t>(r)].data(),
                            got.size() * sizeof(float)) == 0);
        }
        std::size_t far = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
          // Each of the p - 1 additions rounds by at most 2^-24 of the sum of magnitudes,
          // the division by p once more: 2^-23 of that sum bounds the error.
          double exact = 0, magnitude = 0;
          for (int q = 0; q < p; ++q) {
            exact += data[static_cast<std::size_t>(q)][b0 + j];
            magnitude += std::fabs(data[static_cast<std::size_t>(q)][b0 + j]);
          }
          exact /= p;
          far += std::fabs(got[j] - exact) > std::ldexp(magnitude, -23);
        }
        CHECK(far == 0u);
      }
    }
}

TEST_CASE(
    "reduce_scatter and allgather from the heaps: a rank returns only once its input is read") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    const std::size_t n = 40000;
    LoopbackWorld world(p, heap_config(2 << 20));
    Failures f;
    run_loopback(world, [&](LoopbackTransport& t) {
      Communicator comm(t, patient());
      const int r = t.rank();
      Allocator& h = comm.shared_allocator();
      const std::size_t b0 = part_begin(n, p, r), len = part_begin(n, p, r + 1) - b0;
      auto* full = static_cast<float*>(h.allocate(n * sizeof(float), 64));
      auto* mine = static_cast<float*>(h.allocate(len * sizeof(float), 64));
      for (int call = 0; call < 40; ++call) {
        for (std::size_t i = 0; i < n; ++i) full[i] = small_value(i, r, call);
        comm.reduce_scatter(BufferView(full, n, DType::f32), BufferView(mine, len, DType::f32),
                            ReduceOp::sum);
        std::fill(full, full + n, -1.0f);  // as the next backward pass would
        std::size_t bad = 0;
        for (std::size_t j = 0; j < len; ++j) {
          float want = 0;
          for (int q = 0; q < p; ++q) want += small_value(b0 + j, q, call);
          bad += mine[j] != want;
        }
        for (std::size_t j = 0; j < len; ++j) mine[j] = small_value(b0 + j, r, call);
        comm.allgather(BufferView(mine, len, DType::f32), BufferView(full, n, DType::f32));
        std::fill(mine, mine + len, -1.0f);
        for (int q = 0; q < p; ++q)
          for (std::size_t i = part_begin(n, p, q); i < part_begin(n, p, q + 1); ++i)
            bad += full[i] != small_value(i, q, call);
        if (bad) f.add(r, "call " + std::to_string(call) + ": " + std::to_string(bad) + " wrong");
        if ((call + r) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      h.deallocate(mine, len * sizeof(float));
      h.deallocate(full, n * sizeof(float));
    });
    for (const auto& s : f.list) FAIL_CHECK(s);
  }
}

TEST_CASE("reduce_scatter through the segments: a partner that never arrives is named") {
  for (const bool gather : {false, true}) {
    CAPTURE(gather);
    LoopbackWorld world(2, heap_config(1 << 20));
    std::mutex m;
    std::vector<std::string> messages;
    const double t0 = now_seconds();
    run_loopback(world, [&](LoopbackTransport& t) {
      if (t.rank() == 1) return;  // never calls
      CommConfig c;
      c.timeout_s = 0.3;
      c.check_fingerprints = false;  // straight into the algorithm's counter waits
      Communicator comm(t, c);
      Allocator& h = comm.shared_allocator();
      auto* x = static_cast<float*>(h.allocate(1000 * sizeof(float), 64));
      auto* y = static_cast<float*>(h.allocate(500 * sizeof(float), 64));
      try {
        if (gather)
          comm.allgather(BufferView(y, 500, DType::f32), BufferView(x, 1000, DType::f32));
        else
          comm.reduce_scatter(BufferView(x, 1000, DType::f32), BufferView(y, 500, DType::f32),
                              ReduceOp::sum);
      } catch (const TimeoutError& e) {
        std::lock_guard<std::mutex> lock(m);
        messages.push_back(e.what());
      }
      h.deallocate(y, 500 * sizeof(float));
      h.deallocate(x, 1000 * sizeof(float));
    });
    CHECK(now_seconds() - t0 < 10);
    REQUIRE(messages.size() == 1);
    CAPTURE(messages[0]);
    CHECK(messages[0].find("rank 0") != std::string::npos);
    CHECK(messages[0].find(gather ? "allgather #0" : "reduce_scatter #0") != std::string::npos);
    CHECK(messages[0].find("wait for rank 1 timed out") != std::string::npos);
  }
}

}  // namespace dtrain_test_comm_shm_parts_test

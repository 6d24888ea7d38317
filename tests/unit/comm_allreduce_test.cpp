// Collectives over the loopback transport: every algorithm, dtype and op against an independent
// wide-precision reference, on awkward world sizes and counts.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/loopback.hpp>

#include "comm_test_util.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_allreduce_test {

using namespace dtrain;

namespace {

const DType kDtypes[] = {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                         ReduceOp::prod};
const AllreduceAlgorithm kAlgos[] = {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                                     AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd,
                                     AllreduceAlgorithm::shm};

CommConfig small_segments(std::size_t bytes = 64) {
  CommConfig c;
  c.segment_bytes = bytes;  // many segments even for small counts: exercises the pipelines
  c.timeout_s = 60;
  return c;
}

// Runs one all-reduce on every rank, checks each rank's result against the reference and that
// all ranks hold the same bits. Returns the number of failures seen (reported through CHECK on
// the main thread by the caller).
struct Failure {
  std::string what;
};

void allreduce_matrix(int p, const std::vector<std::size_t>& counts,
                      const std::vector<AllreduceAlgorithm>& algos,
                      const std::vector<DType>& dtypes, const std::vector<ReduceOp>& ops,
                      std::size_t segment_bytes) {
  std::mutex m;
  std::vector<Failure> failures;
  std::vector<std::vector<std::uint64_t>> hashes(static_cast<std::size_t>(p));
  // Small shm slots too, so the shm algorithm cycles through its slots many times.
  const std::string slot = std::to_string(segment_bytes < 256 ? 256 : segment_bytes);
  ::setenv("DTRAIN_SHM_SLOT_BYTES", slot.c_str(), 1);
  run_loopback(p, [&](LoopbackTransport& t) {
    Communicator comm(t, small_segments(segment_bytes));
    std::uint64_t combo = 0;
    for (std::size_t count : counts)
      for (AllreduceAlgorithm algo : algos)
        for (DType dt : dtypes)
          for (ReduceOp op : ops) {
            ++combo;
            const std::size_t es = size_of(dt);
            // Every rank checks small results; for large ones rank 0 checks against the
            // reference and the others must match rank 0 bit for bit (the hashes below).
            const bool verify = count <= 10000 || t.rank() == 0;
            std::vector<std::vector<unsigned char>> inputs(static_cast<std::size_t>(p));
            for (int r = 0; r < p; ++r)
              if (verify || r == t.rank()) inputs[r] = test::make_input(dt, op, count, r, combo);
            std::vector<unsigned char> in = inputs[static_cast<std::size_t>(t.rank())];
            std::vector<unsigned char> out(count * es + 1, 0xAB);
            const bool inplace = combo % 2 == 1;
            if (inplace) {
              comm.allreduce(BufferView(in.data(), count, dt), op, algo);
              if (count) std::memcpy(out.data(), in.data(), count * es);
            } else {
              comm.allreduce(BufferView(in.data(), count, dt), BufferView(out.data(), count, dt),
                             op, algo);
              if (count && std::memcmp(in.data(), inputs[static_cast<std::size_t>(t.rank())].data(),
                                       count * es) != 0) {
                std::lock_guard<std::mutex> lock(m);
                failures.push_back({"input modified"});
              }
            }
            if (out[count * es] != 0xAB) {
              std::lock_guard<std::mutex> lock(m);
              failures.push_back({"wrote past the end"});
            }
            const long long bad =
                verify ? test::first_mismatch(dt, op, inputs, out.data(), count) : -1;
            if (bad >= 0) {
              std::lock_guard<std::mutex> lock(m);
              failures.push_back({detail::concat("p=", p, " rank ", t.rank(), " count ", count, " ",
                                                 name_of(algo), " ", name_of(dt), " ", name_of(op),
                                                 inplace ? " in-place" : " out-of-place",
                                                 ": element ", bad, " wrong")});
            }
            hashes[static_cast<std::size_t>(t.rank())].push_back(
                test::fnv1a(out.data(), count * es));
          }
  });
  ::unsetenv("DTRAIN_SHM_SLOT_BYTES");
  for (const auto& f : failures) FAIL_CHECK(f.what);
  for (int r = 1; r < p; ++r)
    CHECK_MESSAGE(hashes[r] == hashes[0], "rank " << r << " differs from rank 0");
  CHECK(failures.empty());
}

}  // namespace

TEST_CASE("allreduce: full matrix on small counts") {
  // World sizes 1..16 including non-powers of two; counts 0, 1, 7 (fewer elements than ranks)
  // and 1000 (non-divisible); every algorithm, dtype and op, alternating in-place and
  // out-of-place; 64-byte segments so the pipelined paths run many segments.
  for (int p : {1, 2, 3, 4, 5, 7, 8, 16}) {
    CAPTURE(p);
    allreduce_matrix(p, {0, 1, 7, 1000}, {std::begin(kAlgos), std::end(kAlgos)},
                     {std::begin(kDtypes), std::end(kDtypes)}, {std::begin(kOps), std::end(kOps)},
                     64);
  }
}

TEST_CASE("allreduce: large non-divisible count, representative subset") {
  // (1<<19)+3 elements over the full cross product would take minutes on two cores; every
  // algorithm runs it at p = 3 and 5 (non-powers of two, exercising the folds) for f32 sum,
  // bf16 avg and i64 prod, and ring/rhd at p = 16; 16 KiB segments (and shm slots: 16 of them
  // hold an eighth of the f32 vector) keep many pipeline stages, and 2 segments of 64 KiB per
  // rank's part at p = 16.
  const std::size_t big = (1u << 19) + 3;
  for (int p : {3, 5}) {
    CAPTURE(p);
    const std::pair<DType, ReduceOp> cases[] = {
        {DType::f32, ReduceOp::sum}, {DType::bf16, ReduceOp::avg}, {DType::i64, ReduceOp::prod}};
    for (auto [dt, op] : cases)
      allreduce_matrix(p, {big}, {std::begin(kAlgos), std::end(kAlgos)}, {dt}, {op}, 16 * 1024);
  }
  allreduce_matrix(16, {big}, {AllreduceAlgorithm::ring, AllreduceAlgorithm::rhd}, {DType::f32},
                   {ReduceOp::sum}, 64 * 1024);
}

TEST_CASE("reduce_scatter and allgather match the reference on uneven splits") {
  for (int p : {1, 2, 3, 5, 8}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      CAPTURE(p);
      CAPTURE(count);
      std::mutex m;
      std::vector<std::string> failures;
      run_loopback(p, [&](LoopbackTransport& t) {
        Communicator comm(t, small_segments());
        std::uint64_t combo = 100;
        for (DType dt : kDtypes)
          for (ReduceOp op : kOps) {
            ++combo;
            const std::size_t es = size_of(dt);
            std::vector<std::vector<unsigned char>> inputs;
            for (int r = 0; r < p; ++r) inputs.push_back(test::make_input(dt, op, count, r, combo));
            const std::size_t mine = partition_count(count, p, t.rank());
            const std::size_t b0 = partition_begin(count, p, t.rank());
            std::vector<unsigned char> part(mine * es + 1);
            comm.reduce_scatter(BufferView(inputs[t.rank()].data(), count, dt),
                                BufferView(part.data(), mine, dt), op);
            const long long bad = test::first_mismatch(dt, op, inputs, part.data(), mine, b0);
            // The parts put back together must equal the all-reduce.
            std::vector<unsigned char> full(count * es + 1);
            comm.allgather(BufferView(part.data(), mine, dt), BufferView(full.data(), count, dt));
            const long long bad_full = test::first_mismatch(dt, op, inputs, full.data(), count);
            // In-place all-gather: the rank's part already sits in the output.
            std::vector<unsigned char> again = full;
            comm.allgather(BufferView(again.data() + b0 * es, mine, dt),
                           BufferView(again.data(), count, dt));
            std::lock_guard<std::mutex> lock(m);
            if (bad >= 0)
              failures.push_back(detail::concat("reduce_scatter ", name_of(dt), " ", name_of(op),
                                                " rank ", t.rank(), " element ", bad));
            if (bad_full >= 0)
              failures.push_back(detail::concat("allgather ", name_of(dt), " ", name_of(op),
                                                " rank ", t.rank(), " element ", bad_full));
            if (again != full) failures.push_back("in-place allgather differs");
          }
      });
      for (auto& f : failures) FAIL_CHECK(f);
    }
  }
}

TEST_CASE("broadcast from every root, barrier") {
  for (int p : {1, 2, 3, 5, 8}) {
    CAPTURE(p);
    std::atomic<int> bad{0};
    std::atomic<int> arrived{0};
    run_loopback(p, [&](LoopbackTransport& t) {
      Communicator comm(t, small_segments());
      for (int root = 0; root < p; ++root)
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
          std::vector<std::int64_t> v(count, -1);
          if (t.rank() == root)
            for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int64_t>(i * 31 + root);
          comm.broadcast(BufferView(v.data(), count, DType::i64), root);
          for (std::size_t i = 0; i < count; ++i)
            if (v[i] != static_cast<std::int64_t>(i * 31 + root)) ++bad;
        }
      // Nobody leaves the barrier before everybody arrived.
      arrived.fetch_add(1);
      comm.barrier();
      if (arrived.load() != p) ++bad;
    });
    CHECK(bad.load() == 0);
  }
}

TEST_CASE("argument errors name the rank and the operation") {
  run_loopback(2, [&](LoopbackTransport& t) {
    Communicator comm(t, small_segments());
    std::vector<float> a(10), b(9);
    std::vector<double> d(10);
    CHECK_THROWS_WITH_AS(
        comm.allreduce(BufferView(span<float>(a)), BufferView(span<float>(b)), ReduceOp::sum),
        doctest::Contains("allreduce: input is 10 x f32 but output is 9 x f32"), InvalidArgument);
    const std::string prefix = "dtrain: rank " + std::to_string(t.rank()) + ": allreduce";
    CHECK_THROWS_WITH_AS(
        comm.allreduce(BufferView(span<float>(a)), BufferView(span<double>(d)), ReduceOp::sum),
        doctest::Contains(prefix.c_str()), InvalidArgument);
    CHECK_THROWS_AS(comm.broadcast(BufferView(span<float>(a)), 2), InvalidArgument);
    CHECK_THROWS_AS(
        comm.reduce_scatter(BufferView(span<float>(a)), BufferView(span<float>(b)), ReduceOp::sum),
        InvalidArgument);
    CHECK_THROWS_AS(comm.allreduce(BufferView(a.data() + 1, 5, DType::f32),
                                   BufferView(a.data(), 5, DType::f32), ReduceOp::sum),
                    InvalidArgument);
    CHECK_THROWS_AS(comm.allreduce(BufferView(a.data(), 5, DType::f32, Space::cuda), ReduceOp::sum),
                    InvalidArgument);
    // Argument errors are local and leave the communicator usable.
    comm.allreduce(BufferView(span<float>(a)), ReduceOp::sum);
  });
}

}  // namespace dtrain_test_comm_allreduce_test

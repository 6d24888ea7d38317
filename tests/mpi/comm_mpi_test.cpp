// Collectives over MPI (mpiexec -n 1..4): every algorithm against MPI's own collectives on the
// same inputs, on MPI_COMM_WORLD and on a sub-communicator; fingerprints and deadlines.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/optim/sgd.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/mpi_rma.hpp>

#include "../unit/comm_test_util.hpp"
#include "support/watchdog.hpp"

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_mpi_test {

using namespace dtrain;

namespace {

// With a progress thread whatever the machine's cores (the overlap tests need it).
CommConfig cfg(double timeout_s = 60, std::size_t seg = 1024) {
  CommConfig c;
  c.timeout_s = timeout_s;
  c.segment_bytes = seg;
  c.progress = CommProgress::thread;
  return c;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: return MPI_FLOAT;  // 16-bit floats are compared through f32
  }
}
MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::prod: return MPI_PROD;
    default: return MPI_SUM;  // avg = sum / p
  }
}

double as_double(const unsigned char* p, DType t) {
  switch (t) {
    case DType::i32: return test::load_int<std::int32_t>(p);
    case DType::i64: return static_cast<double>(test::load_int<std::int64_t>(p));
    default: return static_cast<double>(test::load_float(p, t));
  }
}

// MPI's result for the same inputs, as doubles, with the per-element tolerance between two
// correct implementations (each within (p-1)·u·Σ|x| of the exact value; 16-bit results also
// within one rounding each).
void mpi_reference(MPI_Comm comm, DType t, ReduceOp op, const std::vector<unsigned char>& in,
                   std::size_t n, std::vector<double>& want, std::vector<double>& tol) {
  int p = 1;
  MPI_Comm_size(comm, &p);
  const std::size_t es = size_of(t);
  want.assign(n, 0);
  tol.assign(n, 0);
  const bool narrow = t == DType::f16 || t == DType::bf16;
  if (n == 0) return;  // nothing to compare (and no MPI call to wait for)
  if (t == DType::i32 || t == DType::i64) {
    std::vector<unsigned char> out(n * es + 8);
    MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), mpi_type(t), mpi_op(op), comm);
    for (std::size_t i = 0; i < n; ++i) {
      double v = as_double(&out[i * es], t);
      if (op == ReduceOp::avg)
        v = t == DType::i32 ? static_cast<double>(test::load_int<std::int32_t>(&out[i * es]) / p)
                            : static_cast<double>(test::load_int<std::int64_t>(&out[i * es]) / p);
      want[i] = v;
    }
    return;
  }
  // min and max are exact (no tolerance, so no Σ|x|): the values alone, reduced in their own
  // precision. sum, avg and prod: each value and its magnitude side by side in one double
  // reduction (one MPI call; a double sum or product of these inputs is within far less than the
  // tolerance of the exact result, so it stands in for every precision).
  const bool exact = op == ReduceOp::min || op == ReduceOp::max;
  std::vector<double> s(n), as(n, 0.0);
  if (exact && (t == DType::f32 || narrow)) {
    std::vector<float> xf(n), sf(n);
    for (std::size_t i = 0; i < n; ++i) xf[i] = static_cast<float>(as_double(&in[i * es], t));
    MPI_Allreduce(xf.data(), sf.data(), static_cast<int>(n), MPI_FLOAT, mpi_op(op), comm);
    for (std::size_t i = 0; i < n; ++i) s[i] = sf[i];
  } else if (exact) {
    std::vector<double> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = as_double(&in[i * es], t);
    MPI_Allreduce(x.data(), s.data(), static_cast<int>(n), MPI_DOUBLE, mpi_op(op), comm);
  } else {
    std::vector<double> x(2 * n), sx(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      x[2 * i] = as_double(&in[i * es], t);
      x[2 * i + 1] = std::fabs(x[2 * i]);
    }
    MPI_Allreduce(x.data(), sx.data(), static_cast<int>(2 * n), MPI_DOUBLE, mpi_op(op), comm);
    for (std::size_t i = 0; i < n; ++i) {
      s[i] = sx[2 * i];
      as[i] = sx[2 * i + 1];
    }
  }
  const double u = t == DType::f64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < n; ++i) {
    double w = s[i];
    if (op == ReduceOp::avg) w /= p;
    double b = 0;
    if (op == ReduceOp::sum || op == ReduceOp::avg)
      b = 2.2 * (p - 1) * u * as[i] / (op == ReduceOp::avg ? p : 1) + 2.2 * u * std::fabs(w);
    if (op == ReduceOp::prod) b = 2.2 * (p - 1) * u * as[i];
    if (narrow && op != ReduceOp::min && op != ReduceOp::max)
      b += 2 * std::ldexp(1.0, t == DType::f16 ? -11 : -8) * (std::fabs(w) + b) +
           std::ldexp(1.0, -24);
    want[i] = w;
    tol[i] = b;
  }
}

void compare_all_algorithms(MPI_Comm mpi_comm) {
  MpiTransport transport(mpi_comm);
  Communicator comm(transport, cfg());
  const int p = comm.size(), r = comm.rank();
  std::uint64_t combo = 0;
  int failures = 0;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}})
    for (AllreduceAlgorithm algo :
         {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd,
          AllreduceAlgorithm::rd, AllreduceAlgorithm::shm, AllreduceAlgorithm::automatic})
      for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16})
        for (ReduceOp op :
             {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::prod}) {
          ++combo;
          if (n == 100003 && (t == DType::f64 || t == DType::i32 || op == ReduceOp::min))
            continue;  // keep the large count to a representative subset
          // No element is reduced at n = 0: every algorithm and type once (the op only names it).
          if (n == 0 && op != ReduceOp::sum) continue;
          // More ranks than the 2 cores here make every MPI wait busy-poll against the others:
          // beyond 2 ranks run a representative subset (every algorithm; a float, an integer
          // and a 16-bit type with sum and with avg, whose division by 3 is inexact; the float
          // also with max and prod). Every type and op meets every algorithm on 2 ranks.
          if (p > 2 && (t == DType::f64 || t == DType::i32 || t == DType::f16 ||
                        op == ReduceOp::min || (n == 100003 && op != ReduceOp::sum) ||
                        (t != DType::f32 && op != ReduceOp::sum && op != ReduceOp::avg)))
            continue;
          const std::size_t es = size_of(t);
          std::vector<unsigned char> in = test::make_input(t, op, n, r, combo);
          std::vector<unsigned char> out(n * es + 8);
          std::vector<double> want, tol;
          mpi_reference(mpi_comm, t, op, in, n, want, tol);
          if (combo % 2)
            comm.allreduce(BufferView(in.data(), n, t), BufferView(out.data(), n, t), op, algo);
          else {
            out = in;
            comm.allreduce(BufferView(out.data(), n, t), op, algo);
          }
          for (std::size_t i = 0; i < n; ++i) {
            const double got = as_double(&out[i * es], t);
            if (!(std::fabs(got - want[i]) <= tol[i])) {
              if (failures++ < 5)
                FAIL_CHECK("p=" << p << " n=" << n << " " << name_of(algo) << " " << name_of(t)
                                << " " << name_of(op) << " element " << i << ": got " << got
                                << " MPI " << want[i]);
              break;
            }
          }
        }
  CHECK(failures == 0);
}

}  // namespace

TEST_CASE("allreduce: every algorithm agrees with MPI_Allreduce on MPI_COMM_WORLD") {
  compare_all_algorithms(MPI_COMM_WORLD);
}

// MPI_COMM_WORLD with 8 MiB node-shared heaps (Communicator::shared_allocator).
struct HeapWorld {
  static SharedSegmentConfig segments() {
    SharedSegmentConfig seg = SharedSegmentConfig::from_env();
    seg.heap_bytes = 8u << 20;
    return seg;
  }
  MpiTransport transport{MPI_COMM_WORLD, segments()};
  Communicator<MpiTransport> comm{transport, cfg()};

  /// Whether the world has node-shared segments, checked against what it must have: none on one
  /// rank, with DTRAIN_SHM=0 or on (fake) nodes of one rank each, else present. False (said so)
  /// where the heap tests have nothing to run.
  bool has_segments() {
    const bool expected =
        transport.size() > 1 && segments().enabled && node_map_of(transport).nodes() == 1;
    const bool present = shared_segments_of(transport) != nullptr;
    CHECK(present == expected);
    if (!expected)
      MESSAGE(
          "no node-shared segments here (one rank, several nodes or DTRAIN_SHM=0): only "
          "their absence is checked");
    return present && expected;
  }
};

// The shm all-reduce and ordered_shm (the same protocol, summing in rank order) on buffers in the
// node-shared heap (read in place by the other ranks): every rank's buffers there, or only the
// even ranks' (each rank decides for itself), in place and out of place, against MPI_Allreduce;
// the ranks whose buffers lie there count the chunks they lent.
TEST_CASE("shm and ordered_shm on node-shared heap buffers agree with MPI_Allreduce") {
  HeapWorld world;
  Communicator<MpiTransport>& comm = world.comm;
  const int p = comm.size(), r = comm.rank();
  if (!world.has_segments()) return;
  const SharedSegments* w = shared_segments_of(world.transport);
  std::uint64_t combo = 1000;
  int failures = 0;
  for (AllreduceAlgorithm algo : {AllreduceAlgorithm::shm, AllreduceAlgorithm::ordered_shm})
    for (bool only_even : {false, true})
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{300007}})
        for (DType t : {DType::f32, DType::f64, DType::i32, DType::bf16})
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
            ++combo;
            if (p > 2 && (t == DType::f64 || t == DType::i32 || op == ReduceOp::max)) continue;
            if (algo == AllreduceAlgorithm::ordered_shm && (t == DType::i32 || op == ReduceOp::max))
              continue;
            Allocator& a = only_even && r % 2 ? default_allocator() : comm.shared_allocator();
            const std::size_t es = size_of(t);
            const std::vector<unsigned char> in = test::make_input(t, op, n, r, combo);
            std::vector<double> want, tol;
            mpi_reference(MPI_COMM_WORLD, t, op, in, n, want, tol);
            auto* x = static_cast<unsigned char*>(a.allocate(n * es, 64));
            auto* y = static_cast<unsigned char*>(a.allocate(n * es, 64));
            std::memcpy(x, in.data(), n * es);
            const std::uint64_t lent = w->direct_chunks;
            const bool inplace = combo % 2;
            unsigned char* got = inplace ? x : y;
            if (inplace)
              comm.allreduce(BufferView(x, n, t), op, algo);
            else
              comm.allreduce(BufferView(x, n, t), BufferView(y, n, t), op, algo);
            // 16-bit floats travel as f32 through the plan's own buffers, which lie elsewhere.
            const bool lends = !(only_even && r % 2) && t != DType::bf16;
            if (lends != (w->direct_chunks > lent) && failures++ < 5)
              FAIL_CHECK(name_of(algo) << " rank " << r << " n=" << n << " " << name_of(t)
                                       << ": chunks lent in place " << w->direct_chunks - lent
                                       << ", expected " << std::string(lends ? "some" : "none"));
            for (std::size_t i = 0; i < n; ++i) {
              const double v = as_double(got + i * es, t);
              if (!(std::fabs(v - want[i]) <= tol[i])) {
                if (failures++ < 5)
                  FAIL_CHECK(name_of(algo)
                             << " p=" << p << " n=" << n << " " << name_of(t) << " " << name_of(op)
                             << (only_even ? " (even ranks' buffers in the heap)" : "")
                             << " element " << i << ": got " << v << " MPI " << want[i]);
                break;
              }
            }
            a.deallocate(y, n * es);
            a.deallocate(x, n * es);
          }
  CHECK(failures == 0);
}

// reduce_scatter and allgather on node-shared heap buffers (one hand-off, read in place; algo/
// shm_parts.hpp) and with only the even ranks' buffers there (the ring after the hand-off), against
// MPI_Reduce_scatter and MPI_Allgatherv; the calls run from the heaps are counted.
TEST_CASE("reduce_scatter and allgather on node-shared heap buffers agree with MPI") {
  HeapWorld world;
  Communicator<MpiTransport>& comm = world.comm;
  const int p = comm.size(), r = comm.rank();
  if (!world.has_segments()) return;
  const SharedSegments* w = shared_segments_of(world.transport);
  for (bool only_even : {false, true})
    for (std::size_t n : {std::size_t{3}, std::size_t{1001}, std::size_t{300007}}) {
      CAPTURE(only_even);
      CAPTURE(n);
      std::vector<int> counts(p), displs(p);
      for (int q = 0; q < p; ++q) {
        counts[q] = static_cast<int>(partition_count(n, p, q));
        displs[q] = static_cast<int>(partition_begin(n, p, q));
      }
      Allocator& a = only_even && r % 2 ? default_allocator() : comm.shared_allocator();
      const std::size_t mine_n = static_cast<std::size_t>(counts[r]);
      auto* in = static_cast<std::int32_t*>(a.allocate(n * 4, 64));
      auto* mine = static_cast<std::int32_t*>(a.allocate(mine_n * 4 + 4, 64));
      auto* all = static_cast<std::int32_t*>(a.allocate(n * 4, 64));
      for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::int32_t>((i * 7 + r * 13) % 101);
      const std::uint64_t before = w->part_calls;
      comm.reduce_scatter(BufferView(in, n, DType::i32), BufferView(mine, mine_n, DType::i32),
                          ReduceOp::sum);
      std::vector<std::int32_t> ref(mine_n + 1), all_ref(n);
      MPI_Reduce_scatter(in, ref.data(), counts.data(), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
      CHECK(std::equal(mine, mine + mine_n, ref.begin()));
      comm.allgather(BufferView(mine, mine_n, DType::i32), BufferView(all, n, DType::i32));
      MPI_Allgatherv(mine, counts[r], MPI_INT32_T, all_ref.data(), counts.data(), displs.data(),
                     MPI_INT32_T, MPI_COMM_WORLD);
      CHECK(std::equal(all, all + n, all_ref.begin()));
      CHECK(w->part_calls - before == (only_even && p > 1 ? 0u : 2u));
      a.deallocate(all, n * 4);
      a.deallocate(mine, mine_n * 4 + 4);
      a.deallocate(in, n * 4);
    }
}

// Run by mpi_comm_np2..4 (one node) and, alone, with DTRAIN_RANKS_PER_NODE=1 and 2 (fake nodes;
// 3 ranks with 2 make nodes of 2 and 1), see tests/mpi/comm_hier.cmake.
TEST_CASE("hier and hier_leader agree with MPI_Allreduce on the node grouping") {
  MpiTransport transport(MPI_COMM_WORLD);
  Communicator comm(transport, cfg());
  const int p = comm.size(), r = comm.rank();
  const SharedSegmentConfig seg = SharedSegmentConfig::from_env();
  const int k =
      seg.ranks_per_node.every > 0 ? seg.ranks_per_node.every : p;  // all ranks share this node
  CHECK(transport.node_map().nodes() == (p + k - 1) / k);
  CHECK(comm.topology().max_ranks_per_node == std::min(k, p));
  CHECK((transport.shared_segments() != nullptr) == (seg.enabled && k >= p && p > 1));
  std::uint64_t combo = 1000;
  int failures = 0;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{100003}})
    for (AllreduceAlgorithm algo : {AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader})
      for (DType t : {DType::f32, DType::f64, DType::i32, DType::f16})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          ++combo;
          if (n == 100003 && (t != DType::f32 || op == ReduceOp::max)) continue;
          if (p > 2 && (t == DType::f64 || (t == DType::f16 && op != ReduceOp::sum))) continue;
          const std::size_t es = size_of(t);
          std::vector<unsigned char> in = test::make_input(t, op, n, r, combo);
          std::vector<unsigned char> out(n * es + 8);
          std::vector<double> want, tol;
          mpi_reference(MPI_COMM_WORLD, t, op, in, n, want, tol);
          if (combo % 2) {
            comm.allreduce(BufferView(in.data(), n, t), BufferView(out.data(), n, t), op, algo);
          } else {
            out = in;
            comm.allreduce(BufferView(out.data(), n, t), op, algo);
          }
          for (std::size_t i = 0; i < n; ++i) {
            const double got = as_double(&out[i * es], t);
            if (!(std::fabs(got - want[i]) <= tol[i])) {
              if (failures++ < 5)
                FAIL_CHECK("p=" << p << " nodes " << transport.node_map().describe() << " n=" << n
                                << " " << name_of(algo) << " " << name_of(t) << " " << name_of(op)
                                << " element " << i << ": got " << got << " MPI " << want[i]);
              break;
            }
          }
        }
  CHECK(failures == 0);
}

TEST_CASE("allreduce works on a sub-communicator (not only MPI_COMM_WORLD)") {
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, -wr, &sub);  // reversed rank order inside
  {
    MpiTransport t(sub);
    Communicator comm(t, cfg());
    int sr = 0, sp = 0;
    MPI_Comm_rank(sub, &sr);
    MPI_Comm_size(sub, &sp);
    CHECK(comm.rank() == sr);
    CHECK(comm.size() == sp);
    CHECK(comm.transport().mpi_comm() != sub);  // a duplicate
    std::vector<std::int64_t> x(333, wr + 1), y(333);
    comm.allreduce(BufferView(span<std::int64_t>(x)), BufferView(span<std::int64_t>(y)),
                   ReduceOp::sum);
    std::int64_t want = 0;
    MPI_Allreduce(&x[0], &want, 1, MPI_INT64_T, MPI_SUM, sub);
    CHECK(y[100] == want);
  }
  MPI_Comm_free(&sub);
}

TEST_CASE("reduce_scatter, allgather and broadcast agree with MPI") {
  MpiTransport t(MPI_COMM_WORLD);
  Communicator comm(t, cfg(60, 256));
  const int p = comm.size(), r = comm.rank();
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{1001}}) {
    CAPTURE(n);
    std::vector<int> counts(p), displs(p);
    for (int q = 0; q < p; ++q) {
      counts[q] = static_cast<int>(partition_count(n, p, q));
      displs[q] = static_cast<int>(partition_begin(n, p, q));
    }
    std::vector<std::int32_t> in(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::int32_t>((i * 7 + r * 13) % 101);
    std::vector<std::int32_t> mine(counts[r] + 1), ref(counts[r] + 1);
    comm.reduce_scatter(BufferView(in.data(), n, DType::i32),
                        BufferView(mine.data(), counts[r], DType::i32), ReduceOp::sum);
    MPI_Reduce_scatter(in.data(), ref.data(), counts.data(), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(std::equal(mine.begin(), mine.begin() + counts[r], ref.begin()));

    std::vector<std::int32_t> all(n + 1), all_ref(n + 1);
    comm.allgather(BufferView(mine.data(), counts[r], DType::i32),
                   BufferView(all.data(), n, DType::i32));
    MPI_Allgatherv(mine.data(), counts[r], MPI_INT32_T, all_ref.data(), counts.data(),
                   displs.data(), MPI_INT32_T, MPI_COMM_WORLD);
    CHECK(std::equal(all.begin(), all.begin() + n, all_ref.begin()));

    for (int root = 0; root < p; ++root) {
      std::vector<double> b(n, r == root ? 1.5 : 0.0), bref = b;
      comm.broadcast(BufferView(b.data(), n, DType::f64), root);
      MPI_Bcast(bref.data(), static_cast<int>(n), MPI_DOUBLE, root, MPI_COMM_WORLD);
      CHECK(b == bref);
    }
  }
}

TEST_CASE("GradientSync over MPI overlaps and equals MPI_Allreduce / p") {
  MpiTransport t(MPI_COMM_WORLD);
  Communicator comm(t, cfg());
  CHECK(comm.has_progress_thread());  // the test main asks for MPI_THREAD_MULTIPLE
  const int p = comm.size(), r = comm.rank();
  std::vector<float> g(50000), ref(50000);
  GradientSync sync(comm, BufferView(span<float>(g)), 16384);
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i % 17) * (r + 1) + step);
    MPI_Allreduce(g.data(), ref.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    for (auto& v : ref) v /= static_cast<float>(p);
    for (std::size_t end = g.size(); end > 0;) {
      const std::size_t len = std::min<std::size_t>(end, 7000);
      sync.ready(end - len, len);
      end -= len;
    }
    sync.wait();
    int bad = 0;
    for (std::size_t i = 0; i < g.size(); ++i) bad += g[i] != ref[i];
    CHECK(bad == 0);
  }
}

// Sharded steps over MPI processes (GradientSync::shard_updates), arenas in the node-shared heaps
// (each process maps the others' heaps at its own addresses) and in private memory: every rank's
// parameters after SGD steps with momentum equal an update computed here from MPI_Allreduce's
// average, to rounding (2 ranks: exactly), and the gathered momentum too.
TEST_CASE("GradientSync sharded steps over MPI equal SGD on MPI_Allreduce's average") {
  HeapWorld world;
  Communicator<MpiTransport>& comm = world.comm;
  const int p = comm.size(), r = comm.rank();
  for (const bool heap : {true, false}) {
    CAPTURE(heap);
    Allocator& a = heap ? comm.shared_allocator() : default_allocator();
    const std::size_t n = 50001;
    auto* w = static_cast<float*>(a.allocate(n * 4, 64));
    auto* g = static_cast<float*>(a.allocate(n * 4, 64));
    for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<float>(i % 13) * 0.25f;
    std::vector<float> ref_w(w, w + n), ref_m(n, 0.0f), avg(n);
    const BufferView pv(w, n, DType::f32), gv(g, n, DType::f32);
    GradientSync sync(comm, gv, 16384);
    sync.shard_updates(pv);
    SgdOptions so;
    so.momentum = 0.9;
    Sgd opt(pv, gv, Schedule::constant(0.1), so, a);
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 3 + step) % 29) / 29.0f;
      MPI_Allreduce(g, avg.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (std::size_t i = 0; i < n;
           ++i) {  // PyTorch's SGD: the first step's buffer is the gradient
        const float a_i = avg[i] / static_cast<float>(p);
        ref_m[i] = step == 0 ? a_i : 0.9f * ref_m[i] + a_i;
        ref_w[i] -= 0.1f * ref_m[i];
      }
      for (std::size_t end = n; end > 0;) {
        const std::size_t len = std::min<std::size_t>(end, 7000);
        sync.ready(end - len, len);
        end -= len;
      }
      sync.wait(opt);
    }
    sync.gather_state(opt);
    std::vector<float> m;
    opt.for_each_state_arena([&](BufferView s) {
      m.assign(static_cast<const float*>(s.data), static_cast<const float*>(s.data) + s.count);
    });
    const float tol = p == 2 ? 0.0f : 1e-5f;
    std::size_t far = 0;
    for (std::size_t i = 0; i < n; ++i)
      far += std::fabs(w[i] - ref_w[i]) > tol * (1 + std::fabs(ref_w[i])) ||
             std::fabs(m[i] - ref_m[i]) > tol * (1 + std::fabs(ref_m[i]));
    CHECK(far == 0u);
    // Every rank holds the same parameters.
    std::vector<float> first(w, w + n);
    MPI_Bcast(first.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(std::memcmp(first.data(), w, n * 4) == 0);
    a.deallocate(g, n * 4);
    a.deallocate(w, n * 4);
  }
}

TEST_CASE("MPI: mismatched calls raise RemoteError on every rank; a missing rank times out") {
  int p = 1, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (p < 2) return;
  {
    MpiTransport t(MPI_COMM_WORLD);
    Communicator comm(t, cfg(20));
    std::vector<float> x(10, 1.0f);
    std::string msg;
    try {
      if (r == 0)
        comm.barrier();
      else
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
    } catch (const RemoteError& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    CHECK(msg.find("rank " + std::to_string(r) + ": ") != std::string::npos);
    CHECK(msg.find("barrier #0") != std::string::npos);
    CHECK(msg.find("allreduce #0 (ring, sum, f32, 10 elements)") != std::string::npos);
    // Rank 0, the odd one, first; the others (the majority from 3 ranks on) last.
    const std::string others = p == 2   ? "rank 1"
                               : p == 3 ? "ranks 1, 2"
                                        : "ranks 1-" + std::to_string(p - 1);
    CHECK(msg.find(std::string("mismatched collective calls") + (p == 2 ? " (no majority)" : "") +
                   ": rank 0 called barrier #0; " + others +
                   " called allreduce #0 (ring, sum, f32, 10 elements)") != std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    MpiTransport t(MPI_COMM_WORLD);
    Communicator comm(t, cfg(0.5));
    std::vector<float> x(10, 1.0f);
    if (r != p - 1) {
      const double t0 = now_seconds();
      std::string msg;
      try {
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
      } catch (const TimeoutError& e) {
        msg = e.what();
      }
      CAPTURE(msg);
      CHECK(now_seconds() - t0 < 5);
      CHECK(msg.find("allreduce #0 (ring, 40 B)") != std::string::npos);
      CHECK(msg.find("timed out after 0.5 s") != std::string::npos);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// The two late-rank cases below run on 2 ranks only: a late rank sleeps through the others'
// deadlines, the same protocol on any number of ranks, and with more ranks than the cores here
// the waiting ranks' polling only stretches the sleeps (9.5 s per run on 3 and on 4 ranks).
TEST_CASE("MPI: a late rank that wakes after the others timed out and freed their buffers") {
  int r = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  if (p != 2) return;
  MPI_Comm comm_late;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_late);
  {
    MpiTransport t(comm_late);
    CommConfig c = cfg(0.3, 1 << 20);
    c.check_fingerprints = false;  // so that the early ranks' data transfers are in flight
    Communicator comm(t, c);
    const bool late = r == p - 1;
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    bool timed_out = false;
    {
      // 16 MiB, so that the messages go by rendezvous and the buffer's pages are returned to the
      // system when it is freed: a transfer still in flight would read freed memory.
      std::vector<float> x(4 << 20, 1.0f);
      try {
        comm.allreduce(BufferView(span<float>(x)), ReduceOp::sum, AllreduceAlgorithm::ring);
      } catch (const Error&) {
        timed_out = true;
      }
    }
    CHECK(timed_out);  // every rank fails: the early ones wait for the late one, then it waits
    // Let the late rank run into whatever the others left behind before anyone tears down.
    std::this_thread::sleep_for(std::chrono::milliseconds(late ? 200 : 1500));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&comm_late);
}

TEST_CASE("MPI: a rank late to the transports' construction: the others' setup deadline names it") {
  // The last rank comes 1 s late to the construction of an MpiTransport and of an
  // MpiRmaTransport; the others wait inside the setup's MPI collectives. With a 0.4 s deadline
  // each waiting rank's watchdog fires once per construction (the expiry hook records the message
  // instead of ending the job), and once the late rank arrives both transports work. Then it comes
  // late to a one-sided backend's address exchange, which runs after the backend's construction
  // (the protocol's bootstrap and open): the deadline fires there too, and the exchange completes.
  int r = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  if (p != 2) {
    MESSAGE("skipped: runs on 2 ranks");
    return;
  }
  const bool late = r == p - 1;
  test::ExpiryRecorder recorder;
  auto arrive = [&] {
    MPI_Barrier(MPI_COMM_WORLD);
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  };
  std::vector<float> x(1000), want(1000);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
  MPI_Allreduce(x.data(), want.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  {
    SharedSegmentConfig seg;
    seg.setup_timeout_s = 0.4;
    arrive();
    MpiTransport t(MPI_COMM_WORLD, seg);
    Communicator comm(t, cfg());
    std::vector<float> y = x;
    comm.allreduce(BufferView(span<float>(y)), ReduceOp::sum, AllreduceAlgorithm::ring);
    CHECK(y == want);
  }
  {
    arrive();
    MpiRmaTransport t(MPI_COMM_WORLD, 0.4);
    Communicator comm(t, cfg());
    std::vector<float> y = x;
    comm.allreduce(BufferView(span<float>(y)), ReduceOp::sum, AllreduceAlgorithm::ring);
    CHECK(y == want);
  }
  {
    MPI_Barrier(MPI_COMM_WORLD);
    detail::MpiRmaBackend b(MPI_COMM_WORLD, 0.4);
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const std::uint64_t mine = 10 * static_cast<std::uint64_t>(r) + 1;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(p));
    b.exchange(&mine, sizeof mine, all.data());
    for (int q = 0; q < p; ++q) CHECK(all[static_cast<std::size_t>(q)] == 10u * q + 1);
    b.close(false);
  }
  recorder.stop();
  const std::vector<std::string> fired = recorder.messages();
  if (late) {
    CHECK(fired.empty());
    return;
  }
  REQUIRE(fired.size() == 3);
  const std::string head = "dtrain: rank " + std::to_string(r) + ": ";
  CHECK(fired[0].rfind(head + "MpiTransport: the collective setup over the " + std::to_string(p) +
                           " ranks of its communicator did not finish within 0.4 s",
                       0) == 0);
  CHECK(fired[0].find("SharedSegmentConfig::setup_timeout_s") != std::string::npos);
  CHECK(fired[1].rfind(head + "MpiRmaTransport: the collective setup", 0) == 0);
  CHECK(fired[2].rfind(head + "MpiRmaTransport (address exchange): the collective setup over the " +
                           std::to_string(p) + " ranks",
                       0) == 0);
  CHECK(fired[2].find("the close_timeout_s of MpiRmaTransport") != std::string::npos);
}

}  // namespace dtrain_test_comm_mpi_test

// Reproducible mode on real MPI (mpiexec -n 2..4): every requested algorithm, over MPI two-sided
// with and without node-shared segments and over MPI-RMA, gives the bits of a rank-order
// reduction computed here from the inputs of every rank (MPI_Allgather).
// With 2 ranks every algorithm gives those bits anyway (x0 + x1 = x1 + x0); 3 and 4 ranks are
// where a non-reproducible order shows (ring, tree, rhd then differ in some elements).
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/transports/mpi.hpp>
#include <dtrain/transports/mpi_rma.hpp>

#include "../unit/comm_test_util.hpp"

using namespace dtrain;

namespace {

// Values spread over many binades with both signs: other summation orders round differently.
float spread_value(int rank, std::size_t i, std::uint64_t combo) {
  const std::uint64_t bits = test::splitmix64(combo * 7919 + rank * 1000003ull + i);
  const double mant = 1.0 + static_cast<double>(bits >> 11 & 0xFFFFF) * 0x1.0p-20;
  const int expo = static_cast<int>(bits % 24) - 12;
  return static_cast<float>(((bits >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(mant, expo));
}

std::vector<unsigned char> make(DType t, std::size_t n, int rank, std::uint64_t combo) {
  std::vector<unsigned char> out(n * size_of(t));
  for (std::size_t i = 0; i < n; ++i) {
    const float v = spread_value(rank, i, combo);
    if (t == DType::f32) {
      std::memcpy(&out[i * 4], &v, 4);
    } else if (t == DType::f64) {
      const double d = static_cast<double>(v) * (1.0 + 0x1.0p-40);  // uses f64's extra bits
      std::memcpy(&out[i * 8], &d, 8);
    } else {
      const bfloat16 h(v);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

// ((x0 + x1) + x2) + ... in the accumulator type (f64 for f64, else f32), avg divided once.
std::vector<unsigned char> reference(DType t, ReduceOp op, const std::vector<unsigned char>& all,
                                     std::size_t n, int p) {
  const std::size_t es = size_of(t);
  std::vector<unsigned char> out(n * es);
  for (std::size_t i = 0; i < n; ++i) {
    auto at = [&](int q) { return test::load_float(&all[(q * n + i) * es], t); };
    if (t == DType::f64) {
      double acc = static_cast<double>(at(0));
      for (int q = 1; q < p; ++q) acc = acc + static_cast<double>(at(q));
      if (op == ReduceOp::avg) acc = acc / p;
      std::memcpy(&out[i * es], &acc, es);
    } else {
      float acc = static_cast<float>(at(0));
      for (int q = 1; q < p; ++q) acc = acc + static_cast<float>(at(q));
      if (op == ReduceOp::avg) acc = acc / static_cast<float>(p);
      if (t == DType::f32) {
        std::memcpy(&out[i * es], &acc, es);
      } else {
        const bfloat16 h(acc);
        std::memcpy(&out[i * es], &h, es);
      }
    }
  }
  return out;
}

CommConfig reproducible_config() {
  CommConfig c;
  c.timeout_s = 60;
  c.segment_bytes = 512;  // several segments per block on the larger count
  c.reproducible = true;
  return c;
}

// Runs the matrix over `comm` and returns the number of results that differ from the reference.
template <class Transport>
int check_all(Communicator<Transport>& comm, const char* transport, bool with_shm) {
  const int p = comm.size(), r = comm.rank();
  int bad = 0;
  std::uint64_t combo = 0;
  // With more ranks than the 2 cores here MPICH busy-polls: 3-4 ranks run a subset (the other
  // requests map to the same ordered plans, which 2 ranks and the unit test cover).
  const bool full = p <= 2;
  std::vector<AllreduceAlgorithm> algos = {AllreduceAlgorithm::automatic, AllreduceAlgorithm::ring,
                                           AllreduceAlgorithm::hier_leader};
  if (full)
    for (AllreduceAlgorithm a :
         {AllreduceAlgorithm::tree, AllreduceAlgorithm::rhd, AllreduceAlgorithm::rd,
          AllreduceAlgorithm::ordered, AllreduceAlgorithm::hier})
      algos.push_back(a);
  if (with_shm) {
    algos.push_back(AllreduceAlgorithm::shm);
    algos.push_back(AllreduceAlgorithm::ordered_shm);
  }
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1001}})
    for (DType t : {DType::f32, DType::f64, DType::bf16})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        ++combo;
        if (!full && (n == 1 || t == DType::f64)) continue;
        const std::size_t es = size_of(t);
        const auto mine = make(t, n, r, combo);
        std::vector<unsigned char> all(static_cast<std::size_t>(p) * n * es);
        MPI_Allgather(mine.data(), static_cast<int>(n * es), MPI_BYTE, all.data(),
                      static_cast<int>(n * es), MPI_BYTE, MPI_COMM_WORLD);
        const auto want = reference(t, op, all, n, p);
        for (AllreduceAlgorithm a : algos) {
          std::vector<unsigned char> buf = mine;
          comm.allreduce(BufferView(buf.data(), n, t), op, a);
          if (buf != want) {
            ++bad;
            const std::string what = std::string("rank ") + std::to_string(r) + " " + transport +
                                     ": " + name_of(a) + " " + name_of(t) + " " + name_of(op) +
                                     " count " + std::to_string(n) + " differs";
            MESSAGE(what);
          }
        }
      }
  return bad;
}

}  // namespace

TEST_CASE("reproducible mode: the same bits over MPI, MPI with shared segments and MPI-RMA") {
  int bad = 0;
  {
    SharedSegmentConfig sc;
    sc.enabled = true;
    sc.slot_bytes = 1024;
    MpiTransport t(MPI_COMM_WORLD, sc);
    Communicator comm(t, reproducible_config());
    const bool shm = shared_segments_of(t) != nullptr;
    if (comm.size() > 1 && !shm) MESSAGE("MPI transport without node-shared segments here");
    bad += check_all(comm, "mpi+shm", shm);
  }
  {
    SharedSegmentConfig sc;
    sc.enabled = false;
    MpiTransport t(MPI_COMM_WORLD, sc);
    Communicator comm(t, reproducible_config());
    bad += check_all(comm, "mpi (DTRAIN_SHM=0)", false);
  }
  {
    OneSidedConfig oc;
    oc.slots = 4;
    oc.slot_bytes = 256;  // eager and zero-copy messages both
    MpiRmaTransport t(oc, MPI_COMM_WORLD);
    Communicator comm(t, reproducible_config());
    bad += check_all(comm, "mpi-rma", shared_segments_of(t) != nullptr);
  }
  int total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == 0);
}

// The node grouping over MPI with DTRAIN_RANKS_PER_NODE as a list of node sizes (uneven fake
// nodes such as 3,1), run by tests/mpi/comm_hier.cmake: the transport's node map is the listed
// one, hier and hier_leader, with each of ring, rhd, rd and tree between the nodes, agree
// exactly with MPI_Allreduce on it (integer-valued inputs, so
// every summation order gives the same bits), and a list that does not add up to the world size
// is refused on every rank with an error naming the variable; and the same agreement with the
// buffers in the node-shared heap (Communicator::shared_allocator), which the ranks of a node
// then read in place (the ranks of a node of several count the chunks they lent).
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/shared_heap.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/transports/mpi.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_comm_hier_mpi_test {

using namespace dtrain;

namespace {

CommConfig cfg() {
  CommConfig c;
  c.timeout_s = 60;
  c.segment_bytes = 1024;  // the inter-node steps run several segments
  return c;
}

// The listed sizes as NodeMap::describe() writes them.
std::string describe(const std::vector<int>& sizes) {
  bool even = true;
  for (int s : sizes) even = even && s == sizes.front();
  if (even) return std::to_string(sizes.size()) + "x" + std::to_string(sizes.front());
  std::string d;
  for (int s : sizes) d += (d.empty() ? "" : "+") + std::to_string(s);
  return d;
}

// hier and hier_leader on `comm` against MPI_Allreduce: f32 and i32, sum and max, counts from
// empty to several segments per node part, on buffers from `a`. Returns the number of
// mismatching results.
template <class Transport>
int compare_with_mpi(Communicator<Transport>& comm, const std::vector<AllreduceAlgorithm>& algos,
                     Allocator& a = default_allocator()) {
  const int r = comm.rank();
  int failures = 0;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000}, std::size_t{65537}})
    for (AllreduceAlgorithm algo : algos)
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        const Shape shape{static_cast<std::int64_t>(n)};
        Tensor xft(shape, DType::f32, a), yft(shape, DType::f32, a);
        Tensor xit(shape, DType::i32, a), yit(shape, DType::i32, a);
        float *xf = xft.as<float>().data(), *yf = yft.as<float>().data();
        std::int32_t *xi = xit.as<std::int32_t>().data(), *yi = yit.as<std::int32_t>().data();
        std::vector<float> wf(n);
        std::vector<std::int32_t> wi(n);
        for (std::size_t i = 0; i < n; ++i) {
          xi[i] =
              static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(r) * 13) % 1001) - 500;
          xf[i] = static_cast<float>(xi[i]);
        }
        const MPI_Op mop = op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
        MPI_Allreduce(xf, wf.data(), static_cast<int>(n), MPI_FLOAT, mop, MPI_COMM_WORLD);
        MPI_Allreduce(xi, wi.data(), static_cast<int>(n), MPI_INT32_T, mop, MPI_COMM_WORLD);
        comm.allreduce(BufferView(xf, n, DType::f32), BufferView(yf, n, DType::f32), op, algo);
        comm.allreduce(BufferView(xi, n, DType::i32), BufferView(yi, n, DType::i32), op, algo);
        if (!std::equal(wf.begin(), wf.end(), yf) || !std::equal(wi.begin(), wi.end(), yi)) {
          if (failures++ < 5)
            FAIL_CHECK("rank " << r << " " << name_of(algo) << " " << name_of(op) << " n=" << n
                               << ": differs from MPI_Allreduce");
        }
      }
  return failures;
}

}  // namespace

TEST_CASE("DTRAIN_RANKS_PER_NODE list: the listed nodes, hier and hier_leader against MPI") {
  const SharedSegmentConfig seg = SharedSegmentConfig::from_env();
  MpiTransport transport(MPI_COMM_WORLD);
  Communicator comm(transport, cfg());
  const int p = comm.size();
  if (!seg.ranks_per_node.sizes.empty()) {
    CHECK(transport.node_map().describe() == describe(seg.ranks_per_node.sizes));
    CHECK(comm.topology().nodes == static_cast<int>(seg.ranks_per_node.sizes.size()));
  }
  MESSAGE("p=" << p << " nodes " << transport.node_map().describe());
  // Each algorithm between the nodes (set alike on every rank before the plans are made).
  for (AllreduceAlgorithm inter : {AllreduceAlgorithm::ring, AllreduceAlgorithm::rhd,
                                   AllreduceAlgorithm::rd, AllreduceAlgorithm::tree}) {
    INFO("between nodes: " << name_of(inter));
    detail::hier_inter_algorithm() = inter;
    CHECK(compare_with_mpi(comm, {AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader}) == 0);
  }
  detail::hier_inter_algorithm() = AllreduceAlgorithm::automatic;
}

TEST_CASE("DTRAIN_RANKS_PER_NODE list: hier and hier_leader on node-shared heap buffers") {
  SharedSegmentConfig seg = SharedSegmentConfig::from_env();
  seg.heap_bytes = 4u << 20;
  seg.slot_bytes = 64 * 1024;  // chunks that leave room for the in-place descriptor
  MpiTransport transport(MPI_COMM_WORLD, seg);
  Communicator comm(transport, cfg());
  const int r = comm.rank();
  const NodeMap& nm = transport.node_map();
  const bool shares = nm.node_size(nm.node_of(r)) > 1;
  Allocator& heap = comm.shared_allocator();
  // A rank alone on its node has no heap (host memory); the others have their node's.
  CHECK((dynamic_cast<SharedHeapAllocator*>(&heap) != nullptr) == (shares && seg.enabled));
  const SharedSegments* w = transport.node_segments();
  const std::uint64_t lent = w ? w->direct_chunks : 0;
  CHECK(compare_with_mpi(comm, {AllreduceAlgorithm::hier, AllreduceAlgorithm::hier_leader}, heap) ==
        0);
  // 65537 floats or ints are 5 chunks of a 64 KiB slot: every rank of a node of several lends
  // some of them (hier: all of its input and output chunks).
  if (shares && seg.enabled) CHECK(w->direct_chunks > lent);
}

TEST_CASE("DTRAIN_RANKS_PER_NODE list that does not add up: refused on every rank") {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  SharedSegmentConfig seg;
  seg.ranks_per_node.sizes = {p, 1};  // one rank too many
  bool named = false;
  try {
    MpiTransport t(MPI_COMM_WORLD, seg);
  } catch (const InvalidArgument& e) {
    named = std::string(e.what()).find("DTRAIN_RANKS_PER_NODE") != std::string::npos;
  }
  CHECK(named);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank got here: none was left waiting in a collective
}

}  // namespace dtrain_test_comm_hier_mpi_test

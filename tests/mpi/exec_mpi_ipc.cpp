// GradientSync's device IPC between MPI processes (the emulated device with IPC on: its windows
// are memfds that the other processes of the node open through /proc/<pid>/fd and map as device
// memory the host cannot read): handles exchanged and opened once, reused every step, closed with
// the sync; the averages bit for bit the rank-order average of every rank's gradients (gathered
// with MPI_Allgather and summed on the host) and the staged path's. On 3 ranks also as fake
// nodes of 2 and 1 ranks (DTRAIN_RANKS_PER_NODE's subdivision), the running sums and averages
// between them staged through host memory (this machine's MPICH does not take device buffers).
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/emulated_device.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/transports/mpi.hpp>

// Its own namespace: test_mpi compiles its sources as one unity translation unit.
namespace dtrain_test_mpi_ipc {
using namespace dtrain;
using test::EmulatedDevice;

std::vector<float> grads_of(int r, int s, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h =
        (static_cast<std::uint64_t>(r) * 31337u + s * 65537u + i) * 0x9E3779B97F4A7C15ull;
    g[i] = (static_cast<float>((h >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f) *
           (i % 4 == 0 ? 3e3f : 7e-4f);
  }
  return g;
}

// Steps of a sync over `t` on a device made with `ipc`; each step's averaged bytes.
std::vector<std::vector<unsigned char>> run_steps(MpiTransport& t, bool ipc, bool want_ipc,
                                                  int steps, std::size_t n) {
  EmulatedDevice::Options o;
  o.ipc = ipc;
  EmulatedDevice dev(o);
  CommConfig c;
  c.timeout_s = 30;
  c.reproducible = true;
  Communicator comm(t, c);
  Tensor g({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
  std::vector<std::vector<unsigned char>> out;
  {
    BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 40);
    CHECK(sync.device_ipc() == want_ipc);
    const std::uint64_t opened = dev.ipc_opened();
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> h = grads_of(comm.rank(), s, n);
      dev.copy_h2d(dev.compute_stream(), g.view().data, h.data(), n * sizeof(float));
      sync.ready(n / 2, n - n / 2);
      sync.ready(0, n / 2);
      sync.wait();
      out.push_back(test::bytes_of(dev, g.view()));
    }
    if (want_ipc) {
      const NodeMap& nm = t.node_map();
      const int node = nm.node_of(comm.rank());
      // Opened at construction, once per other rank of the node; the steps opened none.
      CHECK(opened == static_cast<std::uint64_t>(nm.node_size(node) - 1));
      CHECK(dev.ipc_opened() == opened);
      CHECK(dev.ipc_mapped() == opened);
    }
  }
  CHECK(dev.ipc_mapped() == 0);  // closed with the sync
  return out;
}

TEST_CASE("device IPC between MPI processes: the rank-order average, handles opened once") {
  int p = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::size_t n = 53;
  const int steps = 3;
  // The reference: every rank's gradients gathered, summed in rank order in f32, divided by p.
  std::vector<std::vector<unsigned char>> want;
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> own = grads_of(rank, s, n);
    std::vector<float> all(n * static_cast<std::size_t>(p)), avg(n);
    MPI_Allgather(own.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n),
                  MPI_FLOAT, MPI_COMM_WORLD);
    for (std::size_t i = 0; i < n; ++i) {
      float acc = all[i];
      for (int q = 1; q < p; ++q) acc = acc + all[static_cast<std::size_t>(q) * n + i];
      avg[i] = acc / static_cast<float>(p);
    }
    want.emplace_back(n * sizeof(float));
    std::memcpy(want.back().data(), avg.data(), want.back().size());
  }
  // Device buffers never go to this MPI as they are (it would read them on the host).
  ::setenv("DTRAIN_MPI_GPU_AWARE", "0", 1);
  ::unsetenv("DTRAIN_DEVICE_IPC");
  SharedSegmentConfig seg = SharedSegmentConfig::from_env();
  seg.enabled = false;
  {
    MpiTransport t(MPI_COMM_WORLD, seg);  // the processes' own node: one here
    const bool one_node = t.node_map().nodes() == 1;
    const auto ipc = run_steps(t, true, one_node, steps, n);
    const auto staged = run_steps(t, false, false, steps, n);
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      CHECK(ipc[static_cast<std::size_t>(s)] == want[static_cast<std::size_t>(s)]);
      CHECK(staged[static_cast<std::size_t>(s)] == want[static_cast<std::size_t>(s)]);
    }
  }
  // Fake nodes of two ranks (and one): device IPC within each, node after node between them.
  seg.ranks_per_node = 2;
  {
    MpiTransport t(MPI_COMM_WORLD, seg);
    const auto ipc = run_steps(t, true, true, steps, n);
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      CHECK(ipc[static_cast<std::size_t>(s)] == want[static_cast<std::size_t>(s)]);
    }
  }
  // One rank per node: nothing for IPC to share (auto leaves it; 1 refuses, naming why).
  seg.ranks_per_node = 1;
  {
    MpiTransport t(MPI_COMM_WORLD, seg);
    run_steps(t, true, false, 1, n);
    ::setenv("DTRAIN_DEVICE_IPC", "1", 1);
    EmulatedDevice::Options o;
    o.ipc = true;
    EmulatedDevice dev(o);
    Communicator comm(t);
    Tensor g({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
    CHECK_THROWS_WITH_AS(BasicGradientSync<EmulatedDevice>(dev, comm, g.view(), 40),
                         doctest::Contains("no two ranks share a node"), InvalidArgument);
    ::unsetenv("DTRAIN_DEVICE_IPC");
  }
  ::unsetenv("DTRAIN_MPI_GPU_AWARE");
}

}  // namespace dtrain_test_mpi_ipc

// GradientSync over MpiTransport with device gradients (the emulated device): hand-over or
// staging as MpiTransport::device_buffers answers, that is by the MPI library's answer and
// DTRAIN_MPI_GPU_AWARE; the staged step against MPI_Allreduce. A handed-over step is not run
// here: MPICH on this machine is not GPU-aware and would read the device memory on the host.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/emulated_device.hpp"

#include <dtrain/comm/communicator.hpp>
#include <dtrain/comm/gradient_sync.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/transports/mpi.hpp>

// Its own namespace: test_mpi compiles its sources as one unity translation unit.
namespace dtrain_test_mpi_handover {
using namespace dtrain;
using test::EmulatedDevice;

TEST_CASE("MPI and device gradients: hand-over by the library's answer and DTRAIN_MPI_GPU_AWARE") {
  MpiTransport t(MPI_COMM_WORLD);
  CommConfig c;
  c.timeout_s = 30;
  Communicator comm(t, c);
  EmulatedDevice dev;
  const std::size_t n = 23;
  Tensor g({static_cast<std::int64_t>(n)}, DType::f32, dev.allocator());
  const bool library = mpi_gpu_support().cuda;
  struct Case {
    const char* value;  // null: unset
    bool handed_over;
  };
  for (const Case k :
       {Case{nullptr, library}, Case{"auto", library}, Case{"1", true}, Case{"0", false}}) {
    CAPTURE((k.value ? k.value : "(unset)"));
    if (k.value)
      ::setenv("DTRAIN_MPI_GPU_AWARE", k.value, 1);
    else
      ::unsetenv("DTRAIN_MPI_GPU_AWARE");
    BasicGradientSync<EmulatedDevice> sync(dev, comm, g.view(), 32);
    CHECK(sync.handed_over() == k.handed_over);
    CHECK(sync.staged() == !k.handed_over);
    if (sync.handed_over()) continue;
    // Staged: the bits of MPI_Allreduce's sum divided by p (exact order for two ranks).
    std::vector<float> h(n), want(n);
    for (std::size_t i = 0; i < n; ++i)
      h[i] = static_cast<float>(comm.rank() + 1) * 0.37f * static_cast<float>(i) - 1.5f;
    MPI_Allreduce(h.data(), want.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (float& w : want) w /= static_cast<float>(comm.size());
    dev.copy_h2d(dev.compute_stream(), g.view().data, h.data(), n * sizeof(float));
    sync.sync_all();
    const std::vector<unsigned char> got = test::bytes_of(dev, g.view());
    CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
  }
  ::unsetenv("DTRAIN_MPI_GPU_AWARE");
  ::setenv("DTRAIN_MPI_GPU_AWARE", "yes", 1);
  CHECK_THROWS_WITH_AS(BasicGradientSync<EmulatedDevice>(dev, comm, g.view(), 32),
                       doctest::Contains("DTRAIN_MPI_GPU_AWARE"), InvalidArgument);
  ::unsetenv("DTRAIN_MPI_GPU_AWARE");
}

}  // namespace dtrain_test_mpi_handover

// gpu.hpp from a plain C++ compiler (host runtime API only, via dtrain::cuda or dtrain::hip):
// device allocator, buffers and copies round-trip. Skipped (77) without a device.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <dtrain/core/tensor.hpp>
#include <dtrain/kernels/gpu.hpp>

#include "support/skip.hpp"

namespace gpu = dtrain::gpu;

TEST_CASE("device allocator, buffers and copies") {
  if (gpu::device_count() == 0)
    dtrain::test::skip_process((std::string("no ") + gpu::vendor + " device visible").c_str());
  gpu::DeviceAllocator alloc;
  CHECK(alloc.space() == gpu::space);
  dtrain::Tensor t({1000}, dtrain::DType::f32, alloc);
  CHECK(t.space() == gpu::space);
  std::vector<float> in(1000), out(1000, -1.0f);
  std::iota(in.begin(), in.end(), 0.0f);
  gpu::memcpy(t.raw(), in.data(), t.bytes(), gpu::CopyKind::host_to_device);
  gpu::DeviceBuffer<float> copy(1000);
  gpu::stream_t s = gpu::stream_create();
  gpu::memcpy_async(copy.data(), t.raw(), t.bytes(), gpu::CopyKind::device_to_device, s);
  gpu::stream_synchronize(s);
  gpu::stream_destroy(s);
  copy.download(out.data());
  CHECK(out == in);
  CHECK(gpu::device_warp_size() > 0);
  // A failing runtime call becomes a DeviceError naming the call and the vendor's message.
  CHECK_THROWS_AS(gpu::memcpy(nullptr, in.data(), 4, gpu::CopyKind::host_to_device),
                  dtrain::DeviceError);
}

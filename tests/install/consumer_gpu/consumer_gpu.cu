// A consumer's own kernel using dtrain's device vocabulary: DTRAIN_HOST_DEVICE conversions and the
// dropout mask inside the consumer's __global__ function, and dtrain's launchers on a stream.
#include <cstdint>
#include <cstdio>
#include <vector>

#include <dtrain/core/dtype.hpp>
#include <dtrain/kernels/convert.cuh>
#include <dtrain/kernels/dropout.cuh>
#include <dtrain/kernels/memory.cuh>

namespace gpu = dtrain::gpu;

__global__ void masked_to_half(const float* x, dtrain::half* y, int n, std::uint64_t seed) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n)
    y[i] = dtrain::host::dropout_keep(seed, 0, 0, static_cast<std::uint64_t>(i), 0.5f)
               ? dtrain::half(x[i])
               : dtrain::half(0.0f);
}

int main() {
  if (gpu::device_count() == 0) {
    std::printf("consumer_gpu: built; no %s device visible, nothing to run\n", gpu::vendor);
    return 0;
  }
  const int n = 1000;
  gpu::DeviceBuffer<float> x(n);
  gpu::DeviceBuffer<dtrain::half> y(n);
  gpu::fill(x.data(), 1.5f, n);
  masked_to_half<<<(n + 255) / 256, 256>>>(x.data(), y.data(), n, 7);
  gpu::check_launch("masked_to_half");
  std::vector<dtrain::half> h(n);
  y.download(h.data());
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    const float want = dtrain::host::dropout_keep(7, 0, 0, i, 0.5f) ? 1.5f : 0.0f;
    wrong += static_cast<float>(h[i]) != want;
  }
  std::printf("consumer_gpu: %s, %d of %d wrong\n", gpu::device_name().c_str(), wrong, n);
  return wrong == 0 ? 0 : 1;
}

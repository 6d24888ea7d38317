// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the device side of for_each_index (<dtrain/exec/launch.hpp>): a grid-stride kernel that
// builds the functor from its arguments and calls it for each index. nvcc / hipcc only.
#pragma once

#include <cstdint>

#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN
namespace kernels {
template <class F, class... A>
__global__ void for_each_index(std::int64_t n, A... args) {
  const F f{args...};
  const std::int64_t stride = static_cast<std::int64_t>(grid_threads());
  for (std::int64_t i = static_cast<std::int64_t>(global_thread()); i < n; i += stride) f(i);
}
}  // namespace kernels
DTRAIN_GPU_ABI_END
}  // namespace gpu

namespace detail {
template <class F, class S, class... A>
void device_for_each(S stream, std::int64_t n, A... args) {
  constexpr unsigned threads = 256;
  gpu::kernels::for_each_index<F, A...>
      <<<gpu::blocks_for(static_cast<std::size_t>(n), threads), threads, 0, stream>>>(n, args...);
  gpu::check_launch("for_each_index");
}
}  // namespace detail
}  // namespace dtrain

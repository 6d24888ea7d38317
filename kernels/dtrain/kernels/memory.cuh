// dtrain: device fill, copy and axpy. Host references: <dtrain/kernels/host/memory.hpp>.
#pragma once

#include <cstddef>

#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
template <class T>
__global__ void fill(T* __restrict__ x, T value, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] = value;
}
template <class T>
__global__ void axpy(T alpha, const T* __restrict__ x, T* __restrict__ y, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) y[i] = alpha * x[i] + y[i];
}
}  // namespace kernels

/// x[i] = value for i < n (any bit pattern, unlike memset). Local, asynchronous on `stream`.
template <class T>
void fill(T* x, T value, std::size_t n, stream_t stream = nullptr) {
  if (n == 0) return;
  kernels::fill<T><<<blocks_for(n, 256), 256, 0, stream>>>(x, value, n);
  check_launch("gpu::fill");
}

/// dst[i] = src[i] for i < n between device arrays (no overlap). Local, asynchronous on `stream`.
template <class T>
void copy(const T* src, T* dst, std::size_t n, stream_t stream = nullptr) {
  memcpy_async(dst, src, n * sizeof(T), CopyKind::device_to_device, stream);
}

/// y[i] = alpha * x[i] + y[i] for i < n. Local, asynchronous on `stream`.
template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n, stream_t stream = nullptr) {
  if (n == 0) return;
  kernels::axpy<T><<<blocks_for(n, 256), 256, 0, stream>>>(alpha, x, y, n);
  check_launch("gpu::axpy");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

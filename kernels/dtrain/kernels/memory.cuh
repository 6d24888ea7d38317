// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device fill, copy, axpy and a scaled sum into one double. Host references:
// <dtrain/kernels/host/memory.hpp>.
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
// One block sums x in double, each thread over a fixed stride and then in a fixed tree, so the
// result does not depend on timing (it may differ from the host's left-to-right order by rounding).
template <class T>
__global__ void sum_to(const T* __restrict__ x, std::size_t n, double scale, double* out) {
  __shared__ double scratch[max_warps_per_block];
  double s = 0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(x[i]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s * scale;
}
// Per-block partial sums of x[i]^2 in double over a grid-stride loop (fixed grid, fixed tree:
// the result does not depend on timing).
template <class T>
__global__ void sum_squares_partial(const T* __restrict__ x, std::size_t n,
                                    double* __restrict__ partial) {
  __shared__ double scratch[max_warps_per_block];
  double s = 0;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
template <class T>
__global__ void scale(T* x, std::size_t n, T factor) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) x[i] *= factor;
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

/// *out = scale * sum(x[0..n)) accumulated in double (out: one device double; n == 0 gives 0).
/// Deterministic. Local, asynchronous on `stream`. For loss values, not for large arrays (one
/// block).
template <class T>
void sum_to(const T* x, std::size_t n, double scale, double* out, stream_t stream = nullptr) {
  kernels::sum_to<T><<<1, 256, 0, stream>>>(x, n, scale, out);
  check_launch("gpu::sum_to");
}

/// Blocks sum_squares uses, and so the doubles of `partial` it needs.
inline unsigned sum_squares_blocks(std::size_t n) {
  const unsigned b = blocks_for(n, 256);
  return b < 1024u ? (b > 0 ? b : 1u) : 1024u;
}

/// *out = sum(x[i]^2) in double (out: one device double), through `partial` (device scratch of
/// sum_squares_blocks(n) doubles). Deterministic; the order differs from the host's
/// left-to-right one, so results agree to rounding. Local, asynchronous on `stream`.
template <class T>
void sum_squares(const T* x, std::size_t n, double* out, double* partial,
                 stream_t stream = nullptr) {
  const unsigned blocks = sum_squares_blocks(n);
  kernels::sum_squares_partial<T><<<blocks, 256, 0, stream>>>(x, n, partial);
  check_launch("gpu::sum_squares");
  sum_to(partial, blocks, 1.0, out, stream);
}

/// x[i] *= factor for i < n. Local, asynchronous on `stream`.
template <class T>
void scale(T* x, std::size_t n, T factor, stream_t stream = nullptr) {
  if (n == 0) return;
  kernels::scale<T><<<blocks_for(n, 256), 256, 0, stream>>>(x, n, factor);
  check_launch("gpu::scale");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

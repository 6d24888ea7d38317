// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device layer normalisation (one block per row), forward and backward. Host reference:
// <dtrain/kernels/host/layernorm.hpp>.
#pragma once

#include <cstdint>

#include <dtrain/kernels/device_math.cuh>
#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
template <class T>
__global__ void layernorm_forward(const T* __restrict__ x, const T* __restrict__ gamma,
                                  const T* __restrict__ beta, T* __restrict__ y,
                                  T* __restrict__ mean, T* __restrict__ rstd, std::int64_t cols,
                                  T eps) {
  __shared__ T scratch[max_warps_per_block];
  const std::int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  T s = T(0);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  const T mu = block_sum(s, scratch) / static_cast<T>(cols);
  T v = T(0);  // two passes, as on the host, so a large mean does not cancel the variance
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) v += (xr[c] - mu) * (xr[c] - mu);
  const T rs = T(1) / math::sqrt(block_sum(v, scratch) / static_cast<T>(cols) + eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    y[r * cols + c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <class T>
__global__ void layernorm_backward_dx(const T* __restrict__ x, const T* __restrict__ gamma,
                                      const T* __restrict__ mean, const T* __restrict__ rstd,
                                      const T* __restrict__ dy, T* __restrict__ dx,
                                      std::int64_t cols) {
  __shared__ T scratch[max_warps_per_block];
  const std::int64_t r = blockIdx.x;
  const T m = mean[r], rs = rstd[r];
  T a = T(0), b = T(0);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T g = dy[r * cols + c] * gamma[c];
    a += g;
    b += g * (x[r * cols + c] - m) * rs;
  }
  a = block_sum(a, scratch) / static_cast<T>(cols);
  b = block_sum(b, scratch) / static_cast<T>(cols);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T xh = (x[r * cols + c] - m) * rs;
    dx[r * cols + c] = rs * (dy[r * cols + c] * gamma[c] - a - xh * b);
  }
}

template <class T>
__global__ void layernorm_backward_params(const T* __restrict__ x, const T* __restrict__ mean,
                                          const T* __restrict__ rstd, const T* __restrict__ dy,
                                          T* __restrict__ dgamma, T* __restrict__ dbeta,
                                          std::int64_t rows, std::int64_t cols) {
  for (std::size_t c = global_thread(); c < static_cast<std::size_t>(cols); c += grid_threads()) {
    T sg = T(0), sb = T(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T d = dy[r * cols + c];
      sg += d * (x[r * cols + c] - mean[r]) * rstd[r];
      sb += d;
    }
    dgamma[c] += sg;
    dbeta[c] += sb;
  }
}
}  // namespace kernels

/// Forward over [rows, cols]; saves mean and rstd (rows each). Asynchronous on `stream`.
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       std::int64_t rows, std::int64_t cols, double eps,
                       stream_t stream = nullptr) {
  DTRAIN_REQUIRE(rows >= 0 && cols > 0 && rows < (1ll << 31), "gpu::layernorm_forward",
                 "bad extents rows=" << rows << " cols=" << cols);
  if (rows == 0) return;
  kernels::layernorm_forward<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
      x, gamma, beta, y, mean, rstd, cols, static_cast<T>(eps));
  check_launch("gpu::layernorm_forward");
}

/// Backward: overwrites dx, accumulates dgamma and dbeta. Asynchronous on `stream`.
template <class T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy,
                        T* dx, T* dgamma, T* dbeta, std::int64_t rows, std::int64_t cols,
                        stream_t stream = nullptr) {
  DTRAIN_REQUIRE(rows >= 0 && cols > 0 && rows < (1ll << 31), "gpu::layernorm_backward",
                 "bad extents rows=" << rows << " cols=" << cols);
  if (rows == 0) return;
  kernels::layernorm_backward_dx<T>
      <<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, gamma, mean, rstd, dy, dx, cols);
  check_launch("gpu::layernorm_backward");
  kernels::layernorm_backward_params<T>
      <<<blocks_for(static_cast<std::size_t>(cols), 128), 128, 0, stream>>>(
          x, mean, rstd, dy, dgamma, dbeta, rows, cols);
  check_launch("gpu::layernorm_backward (params)");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

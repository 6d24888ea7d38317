// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device bias and activation kernels for CUDA and HIP: unfused bias_add, bias_grad,
// activation_forward and activation_backward, one for one with the host layers, and fused
// bias_act_forward / bias_act_backward. Host references: <dtrain/kernels/host/activation.hpp>.
#pragma once

#include <cstdint>

#include <dtrain/kernels/device_math.cuh>
#include <dtrain/kernels/gpu.hpp>
#include <dtrain/kernels/host/activation.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
template <class T>
__device__ inline T act(host::Activation f, T x) {
  switch (f) {
    case host::Activation::identity: return x;
    case host::Activation::relu: return x > T(0) ? x : T(0);
    case host::Activation::gelu:
      return T(0.5) * x * (T(1) + math::erf(x * T(0.70710678118654752440)));
    case host::Activation::tanh: return math::tanh(x);
  }
  return x;
}
template <class T>
__device__ inline T act_grad(host::Activation f, T x, T y) {
  switch (f) {
    case host::Activation::identity: return T(1);
    case host::Activation::relu: return x > T(0) ? T(1) : T(0);
    case host::Activation::gelu: {
      const T cdf = T(0.5) * (T(1) + math::erf(x * T(0.70710678118654752440)));
      return cdf + x * T(0.39894228040143267794) * math::exp(T(-0.5) * x * x);
    }
    case host::Activation::tanh: return T(1) - y * y;
  }
  return T(1);
}

template <class T>
__global__ void bias_act_forward(host::Activation f, const T* __restrict__ z,
                                 const T* __restrict__ bias, T* __restrict__ pre, T* __restrict__ y,
                                 std::int64_t rows, std::int64_t cols) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const T v = bias ? z[i] + bias[i % cols] : z[i];
    if (pre) pre[i] = v;
    y[i] = act(f, v);
  }
}

// Four elements per thread and step, loads before stores, as map4 (gpu.hpp) does.
template <class T>
__global__ void bias_add(T* __restrict__ y, const T* __restrict__ bias, std::int64_t rows,
                         std::int64_t cols) {
  const std::size_t n = static_cast<std::size_t>(rows * cols), stride = grid_threads();
  for (std::size_t i = global_thread(); i < n; i += 4 * stride) {
    T v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k * stride < n) v[k] = y[i + k * stride] + bias[(i + k * stride) % cols];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k * stride < n) y[i + k * stride] = v[k];
  }
}

// The activation as map4's operation (x and y of activation_forward may alias).
template <class T>
struct ActForward {
  host::Activation f;
  __device__ T operator()(T v) const { return act(f, v); }
};

template <class T>
__global__ void act_backward_alias(host::Activation f, const T* x, const T* y, const T* dy, T* dx,
                                   std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = dy[i] * act_grad(f, x[i], y[i]);
}

template <class T>
__global__ void act_backward(host::Activation f, const T* __restrict__ pre, const T* __restrict__ y,
                             const T* __restrict__ dy, T* __restrict__ dpre, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    dpre[i] = dy[i] * act_grad(f, pre[i], y[i]);
}

// One thread per column walks the rows: coalesced across the warp and deterministic.
template <class T>
__global__ void column_sum_add(const T* __restrict__ x, T* __restrict__ out, std::int64_t rows,
                               std::int64_t cols) {
  for (std::size_t c = global_thread(); c < static_cast<std::size_t>(cols); c += grid_threads()) {
    T s = T(0);
    for (std::int64_t r = 0; r < rows; ++r) s += x[r * cols + c];
    out[c] += s;
  }
}
}  // namespace kernels

/// y[r, c] += bias[c] over [rows, cols]. Local, asynchronous on `stream`; device pointers.
template <class T>
void bias_add(T* y, const T* bias, std::int64_t rows, std::int64_t cols,
              stream_t stream = nullptr) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  kernels::bias_add<T><<<blocks_for((n + 3) / 4, 256), 256, 0, stream>>>(y, bias, rows, cols);
  check_launch("gpu::bias_add");
}

/// db[c] += sum_r dy[r, c] (accumulates, like the host). One thread per column walks the rows in
/// order, so the result is deterministic. Local, asynchronous on `stream`.
template <class T>
void bias_grad(const T* dy, T* db, std::int64_t rows, std::int64_t cols,
               stream_t stream = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  kernels::column_sum_add<T>
      <<<blocks_for(static_cast<std::size_t>(cols), 128), 128, 0, stream>>>(dy, db, rows, cols);
  check_launch("gpu::bias_grad");
}

/// y = f(x) elementwise; y may alias x. Local, asynchronous on `stream`.
template <class T>
void activation_forward(host::Activation f, const T* x, T* y, std::size_t n,
                        stream_t stream = nullptr) {
  if (n == 0) return;
  map4<<<blocks_for((n + 3) / 4, 256), 256, 0, stream>>>(x, y, n, kernels::ActForward<T>{f});
  check_launch("gpu::activation_forward");
}

/// dx = dy * f'(x) (tanh uses y = f(x)); dx may alias dy. Local, asynchronous on `stream`.
template <class T>
void activation_backward(host::Activation f, const T* x, const T* y, const T* dy, T* dx,
                         std::size_t n, stream_t stream = nullptr) {
  if (n == 0) return;
  kernels::act_backward_alias<T><<<blocks_for(n, 256), 256, 0, stream>>>(f, x, y, dy, dx, n);
  check_launch("gpu::activation_backward");
}

/// y = f(z + bias) over [rows, cols]; `pre` (optional) keeps z + bias for backward; `bias` may be
/// null. Device pointers, asynchronous on `stream`.
template <class T>
void bias_act_forward(host::Activation f, const T* z, const T* bias, T* pre, T* y,
                      std::int64_t rows, std::int64_t cols, stream_t stream = nullptr) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  kernels::bias_act_forward<T>
      <<<blocks_for(n, 256), 256, 0, stream>>>(f, z, bias, pre, y, rows, cols);
  check_launch("gpu::bias_act_forward");
}

/// dpre = dy * f'(pre) (y = f(pre) is used by tanh); when `dbias` is not null it accumulates the
/// column sums of dpre. dpre may alias dy. Device pointers, asynchronous on `stream`.
template <class T>
void bias_act_backward(host::Activation f, const T* pre, const T* y, const T* dy, T* dpre, T* dbias,
                       std::int64_t rows, std::int64_t cols, stream_t stream = nullptr) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  kernels::act_backward<T><<<blocks_for(n, 256), 256, 0, stream>>>(f, pre, y, dy, dpre, n);
  check_launch("gpu::bias_act_backward");
  if (dbias) {
    kernels::column_sum_add<T><<<blocks_for(static_cast<std::size_t>(cols), 128), 128, 0, stream>>>(
        dpre, dbias, rows, cols);
    check_launch("gpu::bias_act_backward (bias)");
  }
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

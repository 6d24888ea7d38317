// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device SGD and AdamW updates. Host references: <dtrain/kernels/host/optim.hpp>, whose
// parameter structs these launchers take.
#pragma once

#include <cmath>
#include <cstddef>

#include <dtrain/kernels/device_math.cuh>
#include <dtrain/kernels/gpu.hpp>
#include <dtrain/kernels/host/optim.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
template <class T>
__global__ void sgd_update(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf,
                           std::size_t n, T lr, T wd, T mu, T damp, bool nesterov, bool first) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const T d = g[i] + wd * p[i];
    if (buf) {
      const T b = first ? d : mu * buf[i] + damp * d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + mu * b : b);
    } else {
      p[i] -= lr * d;
    }
  }
}

template <class T>
__global__ void adamw_update(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m,
                             T* __restrict__ v, std::size_t n, T b1, T b2, T c1, T c2, T decay,
                             T step_size, T inv_bc2, T eps) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const T gi = g[i];
    const T mi = b1 * m[i] + c1 * gi;
    const T vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (math::sqrt(vi * inv_bc2) + eps);
  }
}
}  // namespace kernels

/// One SGD step on device arrays; buf may be null when momentum is 0. Asynchronous on `stream`.
template <class T>
void sgd_update(T* p, const T* g, T* buf, std::size_t n, const host::SgdParams& h,
                stream_t stream = nullptr) {
  if (n == 0) return;
  kernels::sgd_update<T><<<blocks_for(n, 256), 256, 0, stream>>>(
      p, g, h.momentum != 0.0 ? buf : nullptr, n, static_cast<T>(h.lr),
      static_cast<T>(h.weight_decay), static_cast<T>(h.momentum), static_cast<T>(1.0 - h.dampening),
      h.nesterov, h.first_step);
  check_launch("gpu::sgd_update");
}

/// One AdamW step on device arrays (h.step is the 1-based step). Asynchronous on `stream`.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, std::size_t n, const host::AdamWParams& h,
                  stream_t stream = nullptr) {
  if (n == 0) return;
  const auto k = host::detail::adamw_coeffs<T>(h);
  kernels::adamw_update<T><<<blocks_for(n, 256), 256, 0, stream>>>(
      p, g, m, v, n, k.b1, k.b2, k.c1, k.c2, k.decay, k.step_size, k.inv_bc2, k.eps);
  check_launch("gpu::adamw_update");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

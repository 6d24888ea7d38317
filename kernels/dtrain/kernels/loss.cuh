// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device losses: fused softmax cross-entropy (one block per row) and mean squared error.
// Host references: <dtrain/kernels/host/loss.hpp>.
#pragma once

#include <cstdint>

#include <dtrain/kernels/device_math.cuh>
#include <dtrain/kernels/gpu.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
template <class T>
__global__ void softmax_xent(const T* __restrict__ logits, const std::int32_t* __restrict__ labels,
                             std::int64_t classes, T* dlogits, T* __restrict__ row_loss, T g) {
  __shared__ T scratch[max_warps_per_block];
  const std::int64_t r = blockIdx.x;
  const T* z = logits + r * classes;
  T mx = z[0];
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) mx = z[c] > mx ? z[c] : mx;
  mx = block_max(mx, scratch);
  T s = T(0);
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) s += math::exp(z[c] - mx);
  s = block_sum(s, scratch);
  const std::int32_t label = labels[r];
  // Relative to the max, as on the host: adding log(s) onto a large max would round it away.
  const bool valid = label >= 0 && label < classes;
  if (threadIdx.x == 0) row_loss[r] = valid ? math::log(s) - (z[label] - mx) : T(NAN);
  if (dlogits) {
    __syncthreads();  // every thread has read z[label] before an aliased dlogits overwrites it
    const T inv = g / s;
    T* d = dlogits + r * classes;
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x)
      d[c] = math::exp(z[c] - mx) * inv - (c == label ? g : T(0));
  }
}
// Per-element squared error into sq (summed on the host or by the caller) and, when dpred is not
// null, g * (pred - target). dpred may alias pred.
template <class T>
__global__ void mse(const T* pred, const T* __restrict__ target, std::size_t n, T* dpred,
                    T* __restrict__ sq, T g) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const T d = pred[i] - target[i];
    sq[i] = d * d;
    if (dpred) dpred[i] = d * g;
  }
}
}  // namespace kernels

/// Per-row cross-entropy of softmax(logits) into row_loss[rows] and, when dlogits is not null,
/// scale * (softmax - onehot) / rows into dlogits (may alias logits). A label outside
/// [0, classes) gives a NaN row loss (device code does not throw). Asynchronous on `stream`.
template <class T>
void softmax_cross_entropy(const T* logits, const std::int32_t* labels, std::int64_t rows,
                           std::int64_t classes, T* dlogits, T* row_loss, double scale = 1.0,
                           stream_t stream = nullptr) {
  DTRAIN_REQUIRE(rows >= 0 && classes > 0 && rows < (1ll << 31), "gpu::softmax_cross_entropy",
                 "bad extents rows=" << rows << " classes=" << classes);
  if (rows == 0) return;
  const T g = static_cast<T>(scale / static_cast<double>(rows));
  kernels::softmax_xent<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(logits, labels, classes,
                                                                            dlogits, row_loss, g);
  check_launch("gpu::softmax_cross_entropy");
}

/// Mean squared error over rows*cols elements: per-element squared errors into `sq` (device, n
/// elements; their mean is the loss, left on the device until the caller asks for it) and, when
/// dpred is not null, scale * 2 (pred - target) / (rows*cols) into dpred (may alias pred). Local,
/// asynchronous on `stream`.
template <class T>
void mse(const T* pred, const T* target, std::int64_t rows, std::int64_t cols, T* dpred, T* sq,
         double scale = 1.0, stream_t stream = nullptr) {
  DTRAIN_REQUIRE(rows >= 0 && cols >= 0, "gpu::mse",
                 "bad extents rows=" << rows << " cols=" << cols);
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  const T g = static_cast<T>(2.0 * scale / static_cast<double>(n));
  kernels::mse<T><<<blocks_for(n, 256), 256, 0, stream>>>(pred, target, n, dpred, sq, g);
  check_launch("gpu::mse");
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

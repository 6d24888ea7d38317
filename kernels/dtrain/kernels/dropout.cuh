// SPDX-License-Identifier: BSD-3-Clause
// dtrain: device dropout with the host's counter-based masks. The keep decision is
// host::dropout_keep4 from <dtrain/kernels/host/dropout.hpp>, a DTRAIN_HOST_DEVICE function that
// host and device both call, so the same (seed, step, sample, element) keeps the same elements on
// either side. Host reference: host::dropout_forward / host::dropout_backward.
#pragma once

#include <cstdint>

#include <dtrain/core/error.hpp>
#include <dtrain/kernels/gpu.hpp>
#include <dtrain/kernels/host/dropout.hpp>

namespace dtrain {
namespace gpu {
DTRAIN_GPU_ABI_BEGIN

namespace kernels {
// One thread per group of four elements of a row: one Philox block serves the whole group.
template <class T>
__global__ void dropout(const T* x, T* y, std::int64_t rows, std::int64_t cols, float p, T scale,
                        std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                        const std::int64_t* __restrict__ sample_ids) {
  const std::int64_t groups = (cols + 3) / 4;
  const std::size_t n = static_cast<std::size_t>(rows * groups);
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t r = static_cast<std::int64_t>(i) / groups;
    const std::int64_t grp = static_cast<std::int64_t>(i) % groups;
    const std::uint64_t s =
        static_cast<std::uint64_t>(sample_ids ? sample_ids[r] : sample_offset + r);
    const unsigned keep = host::dropout_keep4(seed, step, s, static_cast<std::uint64_t>(grp), p);
    for (std::int64_t c = grp * 4; c < cols && c < grp * 4 + 4; ++c)
      y[r * cols + c] = (keep >> (c & 3)) & 1u ? x[r * cols + c] * scale : T(0);
  }
}
}  // namespace kernels

/// y = x * keep / (1 - p) for rows of `cols` elements; row r is global sample sample_ids[r] (a
/// device array) when sample_ids is not null, else sample_offset + r. y may alias x. The mask is
/// the host's for the same arguments. Local, asynchronous on `stream`; device pointers. Throws
/// InvalidArgument for p outside [0, 1).
template <class T>
void dropout_forward(const T* x, T* y, std::int64_t rows, std::int64_t cols, float p,
                     std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                     const std::int64_t* sample_ids = nullptr, stream_t stream = nullptr) {
  DTRAIN_REQUIRE(p >= 0.0f && p < 1.0f, "gpu::dropout",
                 "drop probability " << p << " outside [0, 1)");
  DTRAIN_REQUIRE(rows >= 0 && cols >= 0, "gpu::dropout",
                 "bad extents rows=" << rows << " cols=" << cols);
  const std::size_t n = static_cast<std::size_t>(rows * ((cols + 3) / 4));
  if (n == 0) return;
  const T scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(p)));
  kernels::dropout<T><<<blocks_for(n, 256), 256, 0, stream>>>(x, y, rows, cols, p, scale, seed,
                                                              step, sample_offset, sample_ids);
  check_launch("gpu::dropout_forward");
}

/// dx = dy * keep / (1 - p), the mask recomputed from the same arguments. Same contract as
/// dropout_forward.
template <class T>
void dropout_backward(const T* dy, T* dx, std::int64_t rows, std::int64_t cols, float p,
                      std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                      const std::int64_t* sample_ids = nullptr, stream_t stream = nullptr) {
  dropout_forward(dy, dx, rows, cols, p, seed, step, sample_offset, sample_ids, stream);
}

DTRAIN_GPU_ABI_END
}  // namespace gpu
}  // namespace dtrain

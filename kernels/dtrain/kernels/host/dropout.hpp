// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host dropout with counter-based masks. Whether element e of sample s is kept at step t
// is a pure function of (seed, t, s, e), so every rank count and every batch split draws the
// same mask for the same sample, and backward recomputes the mask instead of storing it.
#pragma once

#include <cstdint>

#include <dtrain/core/error.hpp>
#include <dtrain/core/host_device.hpp>
#include <dtrain/core/rng.hpp>

namespace dtrain {
namespace host {

/// Keep bits of elements 4*group .. 4*group+3 of global sample `sample` at step `step` under
/// `seed` with drop probability `p`: bit j is set when element 4*group+j survives. One Philox
/// block per group (counter hi = step, lo = sample * 2^32 + group), one 32-bit word per element.
/// Pure, thread-safe, DTRAIN_HOST_DEVICE: the host layers and the device kernel
/// (<dtrain/kernels/dropout.cuh>) call this one definition, so they draw identical masks.
DTRAIN_HOST_DEVICE inline unsigned dropout_keep4(std::uint64_t seed, std::uint64_t step,
                                                 std::uint64_t sample, std::uint64_t group,
                                                 float p) noexcept {
  const std::uint64_t lo = (sample << 32) + group;
  std::uint32_t c[4] = {static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(lo >> 32),
                        static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)};
  dtrain::detail::philox4x32_10(c, static_cast<std::uint32_t>(seed),
                                static_cast<std::uint32_t>(seed >> 32));
  unsigned bits = 0;
  for (unsigned j = 0; j < 4; ++j)
    if (u32_to_unit_float(c[j]) >= p) bits |= 1u << j;
  return bits;
}

/// True when element `element` of global sample `sample` survives dropout with drop probability
/// `p` at step `step` under `seed` (one bit of dropout_keep4). Pure, thread-safe, host and device.
DTRAIN_HOST_DEVICE inline bool dropout_keep(std::uint64_t seed, std::uint64_t step,
                                            std::uint64_t sample, std::uint64_t element,
                                            float p) noexcept {
  return (dropout_keep4(seed, step, sample, element >> 2, p) >> (element & 3u)) & 1u;
}

/// y = x * keep / (1 - p) for rows of `cols` elements; row r is global sample sample_ids[r] when
/// sample_ids is not null, else sample_offset + r. y may alias x. Local.
template <class T>
void dropout_forward(const T* x, T* y, std::int64_t rows, std::int64_t cols, float p,
                     std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                     const std::int64_t* sample_ids = nullptr) {
  DTRAIN_REQUIRE(p >= 0.0f && p < 1.0f, "dropout", "drop probability " << p << " outside [0, 1)");
  const T scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(p)));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t s =
        static_cast<std::uint64_t>(sample_ids ? sample_ids[r] : sample_offset + r);
    for (std::int64_t c0 = 0; c0 < cols; c0 += 4) {
      const unsigned keep = dropout_keep4(seed, step, s, static_cast<std::uint64_t>(c0) >> 2, p);
      for (std::int64_t c = c0; c < cols && c < c0 + 4; ++c)
        y[r * cols + c] = (keep >> (c & 3)) & 1u ? x[r * cols + c] * scale : T(0);
    }
  }
}

/// dx = dy * keep / (1 - p), with the mask recomputed from the same arguments. Local.
template <class T>
void dropout_backward(const T* dy, T* dx, std::int64_t rows, std::int64_t cols, float p,
                      std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                      const std::int64_t* sample_ids = nullptr) {
  dropout_forward(dy, dx, rows, cols, p, seed, step, sample_offset, sample_ids);
}

}  // namespace host
}  // namespace dtrain

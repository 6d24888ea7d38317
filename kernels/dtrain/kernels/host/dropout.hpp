// dtrain: host dropout with counter-based masks. Whether element e of sample s is kept at step t
// is a pure function of (seed, t, s, e), so every rank count and every batch split draws the
// same mask for the same sample, and backward recomputes the mask instead of storing it.
#pragma once

#include <cstdint>

#include <dtrain/core/error.hpp>
#include <dtrain/core/rng.hpp>

namespace dtrain {
namespace host {

/// True when element `element` of global sample `sample` survives dropout with drop probability
/// `p` at step `step` under `seed`. Pure, thread-safe. Counter layout: hi = step,
/// lo = sample * 2^32 + element / 4, one 32-bit word of the Philox block per element.
inline bool dropout_keep(std::uint64_t seed, std::uint64_t step, std::uint64_t sample,
                         std::uint64_t element, float p) noexcept {
  const Philox gen(seed);
  const auto block = gen(step, (sample << 32) + (element >> 2));
  return u32_to_unit_float(block[element & 3u]) >= p;
}

/// y = x * keep / (1 - p) for rows of `cols` elements; row r is global sample sample_ids[r] when
/// sample_ids is not null, else sample_offset + r. y may alias x. Local.
template <class T>
void dropout_forward(const T* x, T* y, std::int64_t rows, std::int64_t cols, float p,
                     std::uint64_t seed, std::uint64_t step, std::int64_t sample_offset,
                     const std::int64_t* sample_ids = nullptr) {
  DTRAIN_REQUIRE(p >= 0.0f && p < 1.0f, "dropout", "drop probability " << p << " outside [0, 1)");
  const Philox gen(seed);
  const T scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(p)));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t s =
        static_cast<std::uint64_t>(sample_ids ? sample_ids[r] : sample_offset + r);
    for (std::int64_t c0 = 0; c0 < cols; c0 += 4) {
      const auto block = gen(step, (s << 32) + (static_cast<std::uint64_t>(c0) >> 2));
      for (std::int64_t c = c0; c < cols && c < c0 + 4; ++c) {
        const bool keep = u32_to_unit_float(block[c & 3]) >= p;
        y[r * cols + c] = keep ? x[r * cols + c] * scale : T(0);
      }
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

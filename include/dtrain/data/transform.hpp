// SPDX-License-Identifier: BSD-3-Clause
// dtrain: per-element transforms applied while a batch is filled.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// Affine normalisation applied to every feature element while a batch is filled:
///     out = (raw * scale - mean) / stddev
/// evaluated as out = raw * a + b in float, with a = scale / stddev and b = -mean / stddev computed
/// in double and rounded once, so that every storage type (and the byte lookup table) gives
/// bit-identical results for equal inputs, and the float path vectorises. `scale` maps the stored
/// range to the one mean/stddev refer to (1/255 for 8-bit images whose statistics are quoted in
/// [0, 1]). The default is the identity. Plain value type; thread-safe to share read-only.
struct Normalize {
  float scale = 1.0f;
  float mean = 0.0f;
  float stddev = 1.0f;

  /// For 8-bit data whose statistics are given in [0, 1] (e.g. Fashion-MNIST: 0.2860, 0.3530).
  static Normalize from_unit_range(float mean, float stddev) noexcept {
    return Normalize{1.0f / 255.0f, mean, stddev};
  }

  /// Throws InvalidArgument unless stddev is finite and non-zero and scale/mean are finite.
  void validate(const char* operation) const {
    DTRAIN_REQUIRE(
        std::isfinite(scale) && std::isfinite(mean) && std::isfinite(stddev) && stddev != 0.0f,
        operation,
        "Normalize needs finite scale/mean and a finite non-zero stddev (got scale "
            << scale << ", mean " << mean << ", stddev " << stddev << ")");
  }

  /// The multiplier a = scale / stddev.
  float gain() const noexcept {
    return static_cast<float>(static_cast<double>(scale) / static_cast<double>(stddev));
  }
  /// The offset b = -mean / stddev.
  float offset() const noexcept {
    return static_cast<float>(-static_cast<double>(mean) / static_cast<double>(stddev));
  }

  /// Applies the transform to one value.
  float apply(float raw) const noexcept { return raw * gain() + offset(); }

  /// Converts `n` values of any arithmetic type into `out`.
  template <class T>
  void apply(const T* in, float* out, std::size_t n) const noexcept {
    const float a = gain(), b = offset();
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * a + b;
  }
};

namespace detail {

/// The 256 possible results of a Normalize on unsigned bytes: byte data is converted by table
/// lookup, with exactly the values Normalize::apply gives.
class ByteTable {
 public:
  explicit ByteTable(const Normalize& t) noexcept {
    for (int i = 0; i < 256; ++i)
      table_[static_cast<std::size_t>(i)] = t.apply(static_cast<float>(i));
  }
  void apply(const std::uint8_t* in, float* out, std::size_t n) const noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = table_[in[i]];
  }

 private:
  std::array<float, 256> table_{};
};

}  // namespace detail
}  // namespace dtrain

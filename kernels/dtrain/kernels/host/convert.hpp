// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host conversions between f32 and the 16-bit float types (round to nearest even).
#pragma once

#include <cstddef>

#include <dtrain/core/dtype.hpp>

namespace dtrain {
namespace host {

/// out[i] = half(in[i]), round to nearest even. Local.
inline void convert(const float* in, half* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = half(in[i]);
}
/// out[i] = bfloat16(in[i]), round to nearest even. Local.
inline void convert(const float* in, bfloat16* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16(in[i]);
}
/// Exact widening to f32. Local.
inline void convert(const half* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
/// Exact widening to f32. Local.
inline void convert(const bfloat16* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

}  // namespace host
}  // namespace dtrain

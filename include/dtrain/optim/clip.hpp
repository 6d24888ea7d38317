// dtrain: global-norm gradient clipping.
#pragma once

#include <cmath>
#include <cstddef>

#include <dtrain/core/error.hpp>
#include <dtrain/core/span.hpp>

namespace dtrain {

namespace detail {
template <class T>
double clip_norm_impl(T* g, std::size_t n, double max_norm) {
  double sq = 0;
  for (std::size_t i = 0; i < n; ++i) sq += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  const double norm = std::sqrt(sq);
  // PyTorch's convention (the small constant keeps the scale finite for a zero norm).
  if (std::isfinite(norm) && norm > max_norm) {
    const T scale = static_cast<T>(max_norm / (norm + 1e-6));
    for (std::size_t i = 0; i < n; ++i) g[i] *= scale;
  }
  return norm;
}
}  // namespace detail

/// Scales `grads` (host f32 or f64) in place so that their L2 norm is at most `max_norm`, and
/// returns the norm before clipping (sum of squares in double). Local, blocking. Call it after the
/// gradient all-reduce so every rank sees the same norm and clips identically. A non-finite norm
/// is returned unchanged and nothing is scaled.
inline double clip_grad_norm(BufferView grads, double max_norm) {
  DTRAIN_REQUIRE(max_norm > 0, "clip_grad_norm", "max_norm must be positive, got " << max_norm);
  DTRAIN_REQUIRE(grads.space == Space::host, "clip_grad_norm",
                 "host kernel given " << name_of(grads.space) << " memory");
  if (grads.dtype == DType::f32) {
    auto g = grads.as<float>("clip_grad_norm");
    return detail::clip_norm_impl(g.data(), g.size(), max_norm);
  }
  auto g = grads.as<double>("clip_grad_norm");
  return detail::clip_norm_impl(g.data(), g.size(), max_norm);
}

}  // namespace dtrain

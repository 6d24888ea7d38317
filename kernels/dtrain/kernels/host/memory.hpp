// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host fill and copy, the references for the device kernels in
// <dtrain/kernels/memory.cuh> (and what the host execution policy calls).
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include <dtrain/kernels/host/elementwise.hpp>

namespace dtrain {
namespace host {

/// x[i] = value for i < n. Local, blocking; the caller owns x.
template <class T>
void fill(T* x, T value, std::size_t n) noexcept {
  detail::elementwise<T>(n, [&](std::size_t i) { x[i] = value; });
}

/// dst[i] = src[i] for i < n; the ranges must not overlap. Local, blocking.
template <class T>
void copy(const T* src, T* dst, std::size_t n) noexcept {
  static_assert(std::is_trivially_copyable_v<T>, "copy needs a trivially copyable type");
  if (n) std::memcpy(dst, src, n * sizeof(T));
}

/// y[i] = alpha * x[i] + y[i] (gradient accumulation, loss scaling). Local, blocking.
template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n) noexcept {
  detail::elementwise<T>(n, [&](std::size_t i) { y[i] = alpha * x[i] + y[i]; });
}

/// sum(x[i]^2) accumulated in double, left to right (the global gradient norm's square). Local.
template <class T>
double sum_squares(const T* x, std::size_t n) noexcept {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

/// x[i] *= factor for i < n (gradient clipping). Local, blocking.
template <class T>
void scale(T* x, std::size_t n, T factor) noexcept {
  detail::elementwise<T>(n, [&](std::size_t i) { x[i] *= factor; });
}

/// scale * sum(x[0..n)) accumulated in double, left to right. Local.
template <class T>
double sum_to(const T* x, std::size_t n, double scale) noexcept {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  return s * scale;
}

}  // namespace host
}  // namespace dtrain

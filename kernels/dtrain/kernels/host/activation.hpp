// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host bias and activation kernels (forward and backward), with serial references.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <dtrain/core/error.hpp>
#include <dtrain/kernels/host/elementwise.hpp>

namespace dtrain {
namespace host {

/// Pointwise activations shared by layers and device kernels.
enum class Activation : unsigned char { identity, relu, gelu, tanh };

constexpr const char* name_of(Activation a) noexcept {
  switch (a) {
    case Activation::identity: return "identity";
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::tanh: return "tanh";
  }
  return "?";
}

namespace detail {
// Exact GELU, x * Phi(x), with Phi the standard normal CDF (not the tanh approximation), so that
// finite differences and the device kernels have one unambiguous target.
template <class A>
inline A gelu(A x) {
  return A(0.5) * x * (A(1) + std::erf(x * A(0.70710678118654752440084436210485)));
}
template <class A>
inline A gelu_grad(A x) {
  const A cdf = A(0.5) * (A(1) + std::erf(x * A(0.70710678118654752440084436210485)));
  const A pdf = A(0.39894228040143267793994605993438) * std::exp(A(-0.5) * x * x);
  return cdf + x * pdf;
}
template <class A>
inline A act(Activation f, A x) {
  switch (f) {
    case Activation::identity: return x;
    case Activation::relu: return x > A(0) ? x : A(0);
    case Activation::gelu: return gelu(x);
    case Activation::tanh: return std::tanh(x);
  }
  return x;
}
// Derivative from the input x and the output y (tanh uses y, the cheaper and more stable form).
template <class A>
inline A act_grad(Activation f, A x, A y) {
  switch (f) {
    case Activation::identity: return A(1);
    case Activation::relu: return x > A(0) ? A(1) : A(0);
    case Activation::gelu: return gelu_grad(x);
    case Activation::tanh: return A(1) - y * y;
  }
  return A(1);
}
}  // namespace detail

namespace ref {
/// y[r, c] += bias[c]. Serial reference. Local; caller owns buffers.
template <class T>
void bias_add(T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
}
/// db[c] += sum_r dy[r, c], summed in long double. Serial reference.
template <class T>
void bias_grad(const T* dy, T* db, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t c = 0; c < cols; ++c) {
    long double s = 0;
    for (std::int64_t r = 0; r < rows; ++r) s += dy[r * cols + c];
    db[c] = static_cast<T>(db[c] + s);
  }
}
/// y = f(x), evaluated in long double. Serial reference; y may alias x.
template <class T>
void activation_forward(Activation f, const T* x, T* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] = static_cast<T>(detail::act<long double>(f, static_cast<long double>(x[i])));
}
/// dx = dy * f'(x) (y = f(x) is passed for activations whose derivative is cheaper from it).
template <class T>
void activation_backward(Activation f, const T* x, const T* y, const T* dy, T* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    dx[i] = static_cast<T>(static_cast<long double>(dy[i]) *
                           detail::act_grad<long double>(f, x[i], y[i]));
}
}  // namespace ref

/// y[r, c] += bias[c]. Local, vectorisable; caller owns buffers.
template <class T>
void bias_add(T* __restrict y, const T* __restrict bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* __restrict row = y + r * cols;
    detail::elementwise<T>(static_cast<std::size_t>(cols),
                           [&](std::size_t c) { row[c] += bias[c]; });
  }
}

/// db[c] += sum_r dy[r, c] (accumulates, for gradient accumulation). Local, vectorisable.
template <class T>
void bias_grad(const T* __restrict dy, T* __restrict db, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict row = dy + r * cols;
    detail::elementwise<T>(static_cast<std::size_t>(cols), [&](std::size_t c) { db[c] += row[c]; });
  }
}

/// y = f(x) elementwise; y may alias x. Local.
template <class T>
void activation_forward(Activation f, const T* x, T* y, std::size_t n) {
  switch (f) {
    case Activation::identity:
      if (x != y) detail::elementwise<T>(n, [&](std::size_t i) { y[i] = x[i]; });
      return;
    case Activation::relu:
      detail::elementwise<T>(n, [&](std::size_t i) { y[i] = x[i] > T(0) ? x[i] : T(0); });
      return;
    case Activation::gelu:
      for (std::size_t i = 0; i < n; ++i) y[i] = detail::gelu<T>(x[i]);
      return;
    case Activation::tanh:
      for (std::size_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
      return;
  }
}

/// dx = dy * f'(x); dx may alias dy. Local.
template <class T>
void activation_backward(Activation f, const T* x, const T* y, const T* dy, T* dx, std::size_t n) {
  switch (f) {
    case Activation::identity:
      if (dx != dy) detail::elementwise<T>(n, [&](std::size_t i) { dx[i] = dy[i]; });
      return;
    case Activation::relu:
      // Both operands loaded before the select, so the compiler makes it a vector blend: a
      // branch on the sign of x is mispredicted about every other element.
      detail::elementwise<T>(n, [&](std::size_t i) {
        const T g = dy[i];
        dx[i] = x[i] > T(0) ? g : T(0);
      });
      return;
    case Activation::gelu:
      for (std::size_t i = 0; i < n; ++i) dx[i] = dy[i] * detail::gelu_grad<T>(x[i]);
      return;
    case Activation::tanh:
      detail::elementwise<T>(n, [&](std::size_t i) { dx[i] = dy[i] * (T(1) - y[i] * y[i]); });
      return;
  }
}

}  // namespace host
}  // namespace dtrain

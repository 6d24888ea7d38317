// dtrain: host optimizer update kernels (SGD with momentum/Nesterov, AdamW), with references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dtrain {
namespace host {

/// Hyper-parameters of one SGD update (PyTorch semantics: L2 weight decay added to the gradient,
/// the momentum buffer is set to the gradient on the first step).
struct SgdParams {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;
};

/// Hyper-parameters of one AdamW update (Loshchilov and Hutter: weight decay decoupled from the
/// adaptive step; step >= 1 is the 1-based count used for bias correction).
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  long long step = 1;
};

namespace detail {
// In-place square roots of a block. Under the default -fmath-errno a std::sqrt loop does not
// vectorise (each call may set errno), which made AdamW eight times slower than memory speed;
// SSE2's sqrt instructions have no such side effect and give the same correctly rounded results.
inline void sqrt_block(float* x, std::size_t n) noexcept {
  std::size_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}
inline void sqrt_block(double* x, std::size_t n) noexcept {
  std::size_t i = 0;
#if defined(__SSE2__)
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(x + i, _mm_sqrt_pd(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}
}  // namespace detail

namespace ref {
/// Serial reference SGD step in long double. buf may be null when momentum == 0.
template <class T>
void sgd_update(T* p, const T* g, T* buf, std::size_t n, const SgdParams& h) {
  for (std::size_t i = 0; i < n; ++i) {
    long double d =
        static_cast<long double>(g[i]) + h.weight_decay * static_cast<long double>(p[i]);
    if (h.momentum != 0.0) {
      long double b =
          h.first_step ? d
                       : h.momentum * static_cast<long double>(buf[i]) + (1.0L - h.dampening) * d;
      buf[i] = static_cast<T>(b);
      b = static_cast<T>(b);
      d = h.nesterov ? d + h.momentum * b : b;
    }
    p[i] = static_cast<T>(p[i] - h.lr * d);
  }
}
/// Serial reference AdamW step in long double, written as the published update equations.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, std::size_t n, const AdamWParams& h) {
  const long double t = static_cast<long double>(h.step);
  for (std::size_t i = 0; i < n; ++i) {
    long double theta = p[i];
    theta -= h.lr * h.weight_decay * theta;
    const long double mi = h.beta1 * static_cast<long double>(m[i]) + (1 - h.beta1) * g[i];
    const long double vi = h.beta2 * static_cast<long double>(v[i]) +
                           (1 - h.beta2) * static_cast<long double>(g[i]) * g[i];
    const long double mhat = mi / (1 - std::pow(static_cast<long double>(h.beta1), t));
    const long double vhat = vi / (1 - std::pow(static_cast<long double>(h.beta2), t));
    theta -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(theta);
  }
}
}  // namespace ref

/// SGD step over n elements; buf (the momentum buffer) may be null when momentum == 0. Local,
/// vectorisable; p, g, buf must not overlap.
template <class T>
void sgd_update(T* __restrict p, const T* __restrict g, T* __restrict buf, std::size_t n,
                const SgdParams& h) {
  const T lr = static_cast<T>(h.lr), wd = static_cast<T>(h.weight_decay);
  const T mu = static_cast<T>(h.momentum), damp = static_cast<T>(1.0 - h.dampening);
  if (h.momentum == 0.0) {
    for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const T d = g[i] + wd * p[i];
    const T b = h.first_step ? d : mu * buf[i] + damp * d;
    buf[i] = b;
    p[i] -= lr * (h.nesterov ? d + mu * b : b);
  }
}

/// AdamW step over n elements; m and v are the first and second moments. Local, vectorisable;
/// the buffers must not overlap.
template <class T>
void adamw_update(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
                  std::size_t n, const AdamWParams& h) {
  const double t = static_cast<double>(h.step);
  const T b1 = static_cast<T>(h.beta1), b2 = static_cast<T>(h.beta2);
  const T c1 = static_cast<T>(1.0 - h.beta1), c2 = static_cast<T>(1.0 - h.beta2);
  const T decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
  // lr / (1 - beta1^t) folded into one factor; sqrt(1 - beta2^t) applied to v inside the sqrt.
  const T step_size = static_cast<T>(h.lr / (1.0 - std::pow(h.beta1, t)));
  const T inv_bc2 = static_cast<T>(1.0 / (1.0 - std::pow(h.beta2, t)));
  const T eps = static_cast<T>(h.eps);
  constexpr std::size_t block = 512;
  T den[block];
  for (std::size_t i0 = 0; i0 < n; i0 += block) {
    const std::size_t nb = std::min(block, n - i0);
    T* __restrict pb = p + i0;
    const T* __restrict gb = g + i0;
    T* __restrict mb = m + i0;
    T* __restrict vb = v + i0;
    for (std::size_t j = 0; j < nb; ++j) {
      const T gi = gb[j];
      const T mi = b1 * mb[j] + c1 * gi;
      const T vi = b2 * vb[j] + c2 * gi * gi;
      mb[j] = mi;
      vb[j] = vi;
      den[j] = vi * inv_bc2;
    }
    detail::sqrt_block(den, nb);
    for (std::size_t j = 0; j < nb; ++j) pb[j] = pb[j] * decay - step_size * mb[j] / (den[j] + eps);
  }
}

}  // namespace host
}  // namespace dtrain

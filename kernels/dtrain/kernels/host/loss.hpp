// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host loss kernels: fused softmax cross-entropy and mean squared error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <dtrain/core/error.hpp>

namespace dtrain {
namespace host {

namespace detail {
inline void check_labels(const std::int32_t* labels, std::int64_t rows, std::int64_t classes,
                         const char* operation) {
  for (std::int64_t r = 0; r < rows; ++r)
    DTRAIN_REQUIRE(
        labels[r] >= 0 && labels[r] < classes, operation,
        "label " << labels[r] << " of sample " << r << " outside [0, " << classes << ")");
}
}  // namespace detail

namespace ref {
/// Mean over rows of -log softmax(logits[r])[labels[r]], computed in long double with the
/// log-sum-exp shift. When dlogits is not null it receives scale * d(mean loss)/d(logits).
/// Serial reference; throws InvalidArgument for a label outside [0, classes).
template <class T>
double softmax_cross_entropy(const T* logits, const std::int32_t* labels, std::int64_t rows,
                             std::int64_t classes, T* dlogits, double scale = 1.0) {
  dtrain::host::detail::check_labels(labels, rows, classes, "softmax_cross_entropy");
  long double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * classes;
    long double mx = z[0];
    for (std::int64_t c = 1; c < classes; ++c) mx = std::max<long double>(mx, z[c]);
    long double s = 0;
    for (std::int64_t c = 0; c < classes; ++c) s += std::exp(static_cast<long double>(z[c]) - mx);
    const long double lse = mx + std::log(s);
    total += lse - z[labels[r]];
    if (dlogits)
      for (std::int64_t c = 0; c < classes; ++c) {
        const long double p = std::exp(static_cast<long double>(z[c]) - lse);
        dlogits[r * classes + c] =
            static_cast<T>((p - (c == labels[r] ? 1 : 0)) * scale / static_cast<long double>(rows));
      }
  }
  return rows ? static_cast<double>(total / rows) : 0.0;
}

/// Mean over all elements of (pred - target)^2; dpred (optional) gets scale * its gradient.
template <class T>
double mse(const T* pred, const T* target, std::int64_t rows, std::int64_t cols, T* dpred,
           double scale = 1.0) {
  const long double n = static_cast<long double>(rows) * cols;
  long double total = 0;
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const long double d = static_cast<long double>(pred[i]) - target[i];
    total += d * d;
    if (dpred) dpred[i] = static_cast<T>(2 * d * scale / n);
  }
  return n > 0 ? static_cast<double>(total / n) : 0.0;
}
}  // namespace ref

/// Fused, numerically stable softmax cross-entropy: returns the mean loss over rows and, when
/// dlogits is not null, writes scale * (softmax - onehot) / rows into it (dlogits may alias
/// logits). The loss is accumulated in double. Local; throws InvalidArgument for a bad label.
template <class T>
double softmax_cross_entropy(const T* logits, const std::int32_t* labels, std::int64_t rows,
                             std::int64_t classes, T* dlogits, double scale = 1.0) {
  DTRAIN_REQUIRE(classes > 0, "softmax_cross_entropy", "needs at least one class");
  detail::check_labels(labels, rows, classes, "softmax_cross_entropy");
  double total = 0;
  const T g = static_cast<T>(scale / static_cast<double>(rows ? rows : 1));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * classes;
    T mx = z[0];
    for (std::int64_t c = 1; c < classes; ++c) mx = z[c] > mx ? z[c] : mx;
    T s = 0;
    for (std::int64_t c = 0; c < classes; ++c) s += std::exp(z[c] - mx);
    // Work relative to the max: adding log(s) back onto a large max would round it away.
    const T log_s = std::log(s);
    const std::int32_t label = labels[r];
    total += static_cast<double>(log_s - (z[label] - mx));
    if (dlogits) {
      T* d = dlogits + r * classes;
      const T inv = g / s;
      for (std::int64_t c = 0; c < classes; ++c) d[c] = std::exp(z[c] - mx) * inv;
      d[label] -= g;
    }
  }
  return rows ? total / static_cast<double>(rows) : 0.0;
}

/// Mean squared error over all rows*cols elements; dpred (optional, may alias pred) receives
/// scale * 2 (pred - target) / (rows*cols). Local.
template <class T>
double mse(const T* pred, const T* target, std::int64_t rows, std::int64_t cols, T* dpred,
           double scale = 1.0) {
  const std::int64_t n = rows * cols;
  double total = 0;
  const T g = static_cast<T>(2.0 * scale / static_cast<double>(n ? n : 1));
  for (std::int64_t i = 0; i < n; ++i) {
    const T d = pred[i] - target[i];
    total += static_cast<double>(d) * static_cast<double>(d);
    if (dpred) dpred[i] = d * g;
  }
  return n ? total / static_cast<double>(n) : 0.0;
}

}  // namespace host
}  // namespace dtrain

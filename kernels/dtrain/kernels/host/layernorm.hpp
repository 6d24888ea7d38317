// SPDX-License-Identifier: BSD-3-Clause
// dtrain: host layer normalisation over the last axis, forward and backward.
#pragma once

#include <cmath>
#include <cstdint>

namespace dtrain {
namespace host {

namespace ref {
/// y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd = 1/sqrt(var + eps) (var is
/// the biased variance) for backward. Serial reference in long double.
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       std::int64_t rows, std::int64_t cols, double eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    long double mu = 0, var = 0;
    for (std::int64_t c = 0; c < cols; ++c) mu += xr[c];
    mu /= cols;
    for (std::int64_t c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    var /= cols;
    const long double rs = 1.0L / std::sqrt(var + static_cast<long double>(eps));
    for (std::int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = static_cast<T>((xr[c] - mu) * rs * gamma[c] + beta[c]);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
  }
}
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma; dgamma += sum dy*xhat,
/// dbeta += sum dy. Serial reference in long double.
template <class T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy,
                        T* dx, T* dgamma, T* dbeta, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t c = 0; c < cols; ++c) {
    long double sg = 0, sb = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const long double xh = (static_cast<long double>(x[r * cols + c]) - mean[r]) * rstd[r];
      sg += dy[r * cols + c] * xh;
      sb += dy[r * cols + c];
    }
    dgamma[c] = static_cast<T>(dgamma[c] + sg);
    dbeta[c] = static_cast<T>(dbeta[c] + sb);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    long double mg = 0, mgx = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const long double xh = (static_cast<long double>(x[r * cols + c]) - mean[r]) * rstd[r];
      const long double g = static_cast<long double>(dy[r * cols + c]) * gamma[c];
      mg += g;
      mgx += g * xh;
    }
    mg /= cols;
    mgx /= cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const long double xh = (static_cast<long double>(x[r * cols + c]) - mean[r]) * rstd[r];
      const long double g = static_cast<long double>(dy[r * cols + c]) * gamma[c];
      dx[r * cols + c] = static_cast<T>(rstd[r] * (g - mg - xh * mgx));
    }
  }
}
}  // namespace ref

/// Layer normalisation forward over rows of `cols` elements; row statistics in double (two
/// passes, so large means do not cancel). mean and rstd (rows each) are saved for backward. Local.
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       std::int64_t rows, std::int64_t cols, double eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict xr = x + r * cols;
    T* __restrict yr = y + r * cols;
    double mu = 0;
    for (std::int64_t c = 0; c < cols; ++c) mu += xr[c];
    mu /= static_cast<double>(cols);
    double var = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double d = xr[c] - mu;
      var += d * d;
    }
    var /= static_cast<double>(cols);
    const T m = static_cast<T>(mu), rs = static_cast<T>(1.0 / std::sqrt(var + eps));
    for (std::int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

/// Layer normalisation backward; accumulates into dgamma and dbeta, overwrites dx. Local.
template <class T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy,
                        T* dx, T* dgamma, T* dbeta, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict xr = x + r * cols;
    const T* __restrict dyr = dy + r * cols;
    T* __restrict dxr = dx + r * cols;
    const T m = mean[r], rs = rstd[r];
    double mg = 0, mgx = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const T xh = (xr[c] - m) * rs;
      const T g = dyr[c] * gamma[c];
      mg += g;
      mgx += g * xh;
      dgamma[c] += dyr[c] * xh;
      dbeta[c] += dyr[c];
    }
    const T a = static_cast<T>(mg / static_cast<double>(cols));
    const T b = static_cast<T>(mgx / static_cast<double>(cols));
    for (std::int64_t c = 0; c < cols; ++c) {
      const T xh = (xr[c] - m) * rs;
      dxr[c] = rs * (dyr[c] * gamma[c] - a - xh * b);
    }
  }
}

}  // namespace host
}  // namespace dtrain

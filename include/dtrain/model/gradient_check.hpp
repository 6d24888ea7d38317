// SPDX-License-Identifier: BSD-3-Clause
// dtrain: a model's analytic gradient against central differences of its loss, in float64 on the
// host: the first test a new layer's backward should pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <dtrain/model/sequential.hpp>

namespace dtrain {

/// What check_gradients found: the norm-wise relative error ||g - d|| / max(||g||, ||d||) between
/// the analytic gradient g and the central differences d over the parameters checked, and ||g||.
struct GradientCheck {
  double relative_error = 0;
  double gradient_norm = 0;
  std::size_t checked = 0;
};

/// Compares the gradient of the mean loss of one batch (`x`, `target` and `loss` as for
/// forward_backward) with central differences (L(p + h) - L(p - h)) / 2h of every `stride`-th
/// parameter, each from two more passes over the same batch. The model must be float64 on a
/// host policy (its arenas are read in place). Parameters are restored; the gradient arena holds
/// the analytic gradient of the batch afterwards. A correct backward gives relative errors near
/// 1e-9 with the default h; inputs on a kink (ReLU at 0, ties in max pooling) give more.
/// Local; blocking.
template <class Exec, class Target>
GradientCheck check_gradients(BasicSequential<double, Exec>& model, const double* x,
                              const Target* target, std::int64_t rows, Loss loss = Loss::mse,
                              double h = 1e-5, std::size_t stride = 1) {
  DTRAIN_REQUIRE(h > 0 && stride > 0, "check_gradients", "step " << h << ", stride " << stride);
  model.zero_grad();
  model.forward_backward(x, target, rows, loss).get();
  const span<double> grad = model.gradient_span();
  const std::vector<double> g(grad.begin(), grad.end());
  const span<double> p = model.parameter_span();
  double diff = 0, gg = 0, dd = 0;
  GradientCheck out;
  for (std::size_t i = 0; i < p.size(); i += stride, ++out.checked) {
    const double keep = p[i];
    p[i] = keep + h;
    const double up = model.forward_backward(x, target, rows, loss).get();
    p[i] = keep - h;
    const double down = model.forward_backward(x, target, rows, loss).get();
    p[i] = keep;
    const double d = (up - down) / (2 * h);
    diff += (g[i] - d) * (g[i] - d);
    gg += g[i] * g[i];
    dd += d * d;
  }
  std::copy(g.begin(), g.end(), grad.begin());  // the extra passes accumulated into it
  out.gradient_norm = std::sqrt(gg);
  const double scale = std::max(std::sqrt(gg), std::sqrt(dd));
  out.relative_error = scale > 0 ? std::sqrt(diff) / scale : 0.0;
  return out;
}

}  // namespace dtrain

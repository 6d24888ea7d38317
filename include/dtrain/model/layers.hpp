// SPDX-License-Identifier: BSD-3-Clause
// dtrain: layer descriptions for Sequential. A description holds only hyper-parameters; the
// Sequential that receives it builds the layer in its own scalar type and binds it to the
// parameter arena, so one model description serves float training and float64 gradient checks.
#pragma once

#include <cstdint>
#include <variant>

#include <dtrain/core/error.hpp>

namespace dtrain {

/// Weight initialisation. Kaiming (He) scales by fan_in with the ReLU gain; Xavier (Glorot) by
/// fan_in + fan_out. Biases start at zero.
enum class Init : unsigned char { kaiming_uniform, kaiming_normal, xavier_uniform, xavier_normal };

/// Fully connected layer y = x W^T + b, W of shape [out_features, in_features], b of [out].
struct Linear {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  Init init = Init::kaiming_uniform;
  Linear(std::int64_t in, std::int64_t out, Init how = Init::kaiming_uniform)
      : in_features(in), out_features(out), init(how) {
    DTRAIN_REQUIRE(in > 0 && out > 0, "Linear",
                   "feature counts must be positive, got " << in << " -> " << out);
  }
};

/// max(x, 0).
struct Relu {};
/// Exact GELU, x * Phi(x).
struct Gelu {};
/// Hyperbolic tangent.
struct Tanh {};

/// Layer normalisation over the last axis with learned scale ("weight", starts at 1) and shift
/// ("bias", starts at 0).
struct LayerNorm {
  std::int64_t features = 0;
  double eps = 1e-5;
  explicit LayerNorm(std::int64_t n, double epsilon = 1e-5) : features(n), eps(epsilon) {
    DTRAIN_REQUIRE(n > 0, "LayerNorm", "feature count must be positive, got " << n);
    DTRAIN_REQUIRE(epsilon > 0, "LayerNorm", "eps must be positive, got " << epsilon);
  }
};

/// Inverted dropout with drop probability p in [0, 1): identity at evaluation. The mask is a pure
/// function of (model seed, layer, step, global sample index, element), see host::dropout_keep.
struct Dropout {
  float p = 0.5f;
  explicit Dropout(float prob) : p(prob) {
    DTRAIN_REQUIRE(prob >= 0.0f && prob < 1.0f, "Dropout",
                   "drop probability " << prob << " outside [0, 1)");
  }
};

/// Any layer description Sequential accepts.
using LayerSpec = std::variant<Linear, Relu, Gelu, Tanh, LayerNorm, Dropout>;

}  // namespace dtrain

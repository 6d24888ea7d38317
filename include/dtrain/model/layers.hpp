// SPDX-License-Identifier: BSD-3-Clause
// dtrain: descriptions of the built-in layers for Sequential. A description holds only
// hyper-parameters; the Sequential that receives it builds the layer in its own scalar type and
// binds it to the parameter arena, so one model description serves float training and float64
// gradient checks. A user's own layer is a Layer<T, Exec> (<dtrain/model/layer.hpp>) whose
// description has a `make<T, Exec>()`; see Sequential.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <variant>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/model/layer.hpp>

namespace dtrain {

/// The shape of one input sample (no batch axis), as the first entry of a layer list: needed
/// when the first layer does not fix it (a convolution knows its channels, not the grid), e.g.
/// Input{1, 64, 64} for one-channel 64 x 64 fields. Without it the first Linear or LayerNorm
/// fixes a flat input.
struct Input {
  Shape shape;
  Input(std::initializer_list<std::int64_t> dims) : shape(dims) { check(); }
  explicit Input(Shape dims) : shape(std::move(dims)) { check(); }

 private:
  void check() const {
    DTRAIN_REQUIRE(!shape.empty(), "Input", "needs at least one axis");
    for (auto d : shape)
      DTRAIN_REQUIRE(d > 0, "Input", "axes must be positive, got " << shape_string(shape));
  }
};

/// Fully connected layer y = x W^T + b, W of shape [out_features, in_features], b of [out]. An
/// input sample of any shape with in_features elements is read flat (so a Linear can follow a
/// convolution directly); the output is [out_features].
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

/// How a convolution fills the border: zeros, or the opposite edge of the grid (periodic domains).
enum class Padding : unsigned char { zeros, periodic };

/// How a convolution becomes GEMMs. `im2col`: each sample's windows copied into one matrix
/// [in_channels x kernel cells, output cells], one GEMM against the weights. `shifted` (stride 1
/// only): the sample copied once onto a padded grid, then one GEMM per kernel cell against a
/// shifted view of it, so no window matrix is written (host policies only). `direct` (stride 1,
/// dilation 1, host policies only): no GEMM, a register-blocked direct kernel compiled for AVX-512,
/// AVX2 and portable vectors, chosen at run time (<dtrain/kernels/host/conv_direct.hpp>).
/// `automatic` picks by the rule measured in benchmarks/conv_bench.cpp (see ConvLayer::lowering).
/// On a device policy the lowering is always im2col, of whole batches (see Conv::device_workspace).
enum class ConvLowering : unsigned char { automatic, im2col, shifted, direct };

/// N-dimensional convolution (N = 1, 2, 3) over channels-first samples [in_channels, *grid]: the
/// same kernel size, stride, padding and dilation on every axis. Weight [out_channels,
/// in_channels, k, ...], bias [out_channels]. Output extent per axis:
/// (n + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1. Periodic padding needs
/// padding <= the axis. Build with Conv1d / Conv2d / Conv3d, e.g.
/// Conv2d(1, 32, 3).pad(1) or Conv2d(32, 32, 3).periodic(1).with_stride(2).
struct Conv {
  int dims = 2;
  std::int64_t in_channels = 0;
  std::int64_t out_channels = 0;
  std::int64_t kernel = 1;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t dilation = 1;
  Padding padding_mode = Padding::zeros;
  Init weight_init = Init::kaiming_uniform;
  ConvLowering lowering = ConvLowering::automatic;
  /// Device policies: the most scratch (bytes) a convolution lowers at once; a batch larger than
  /// fits runs in chunks of as many whole samples as fit (at least one). Host policies ignore it.
  std::size_t device_workspace = std::size_t(64) << 20;
  Conv(int n, std::int64_t in, std::int64_t out, std::int64_t k)
      : dims(n), in_channels(in), out_channels(out), kernel(k) {
    DTRAIN_REQUIRE(n >= 1 && n <= 3, "Conv", "1, 2 or 3 spatial axes, got " << n);
    DTRAIN_REQUIRE(in > 0 && out > 0, "Conv",
                   "channel counts must be positive, got " << in << " -> " << out);
    DTRAIN_REQUIRE(k > 0, "Conv", "kernel size must be positive, got " << k);
  }
  Conv& with_stride(std::int64_t s) {
    DTRAIN_REQUIRE(s > 0, "Conv", "stride must be positive, got " << s);
    stride = s;
    return *this;
  }
  /// Zero padding of `p` cells on both sides of every axis.
  Conv& pad(std::int64_t p) {
    DTRAIN_REQUIRE(p >= 0, "Conv", "padding must be non-negative, got " << p);
    padding = p;
    return *this;
  }
  /// Periodic padding of `p` cells: the grid wraps around.
  Conv& periodic(std::int64_t p) {
    pad(p);
    padding_mode = Padding::periodic;
    return *this;
  }
  Conv& with_dilation(std::int64_t d) {
    DTRAIN_REQUIRE(d > 0, "Conv", "dilation must be positive, got " << d);
    dilation = d;
    return *this;
  }
  Conv& with_init(Init how) {
    weight_init = how;
    return *this;
  }
  Conv& with_lowering(ConvLowering how) {
    lowering = how;
    return *this;
  }
  Conv& with_device_workspace(std::size_t bytes) {
    DTRAIN_REQUIRE(bytes > 0, "Conv", "device workspace must be positive, got " << bytes);
    device_workspace = bytes;
    return *this;
  }
};
inline Conv Conv1d(std::int64_t in, std::int64_t out, std::int64_t kernel) {
  return Conv(1, in, out, kernel);
}
inline Conv Conv2d(std::int64_t in, std::int64_t out, std::int64_t kernel) {
  return Conv(2, in, out, kernel);
}
inline Conv Conv3d(std::int64_t in, std::int64_t out, std::int64_t kernel) {
  return Conv(3, in, out, kernel);
}

/// Max or average pooling over windows of `kernel` cells every `stride` cells (default: the
/// kernel) on each of the last `dims` axes of a channels-first sample; the extent must be at
/// least the kernel. Average pooling divides by the full window.
struct Pool {
  enum Kind : unsigned char { max, average };
  Kind kind = max;
  int dims = 2;
  std::int64_t kernel = 2;
  std::int64_t stride = 2;
  Pool(Kind k, int n, std::int64_t window, std::int64_t step = 0)
      : kind(k), dims(n), kernel(window), stride(step ? step : window) {
    DTRAIN_REQUIRE(n >= 1 && n <= 3, "Pool", "1, 2 or 3 spatial axes, got " << n);
    DTRAIN_REQUIRE(window > 0 && stride > 0, "Pool",
                   "kernel and stride must be positive, got " << window << ", " << stride);
  }
};
inline Pool MaxPool1d(std::int64_t k, std::int64_t s = 0) { return Pool(Pool::max, 1, k, s); }
inline Pool MaxPool2d(std::int64_t k, std::int64_t s = 0) { return Pool(Pool::max, 2, k, s); }
inline Pool MaxPool3d(std::int64_t k, std::int64_t s = 0) { return Pool(Pool::max, 3, k, s); }
inline Pool AvgPool1d(std::int64_t k, std::int64_t s = 0) { return Pool(Pool::average, 1, k, s); }
inline Pool AvgPool2d(std::int64_t k, std::int64_t s = 0) { return Pool(Pool::average, 2, k, s); }
inline Pool AvgPool3d(std::int64_t k, std::int64_t s = 0) { return Pool(Pool::average, 3, k, s); }

/// Nearest-neighbour upsampling by an integer `scale` on each of the last `dims` axes.
struct Upsample {
  int dims = 2;
  std::int64_t scale = 2;
  Upsample(int n, std::int64_t factor) : dims(n), scale(factor) {
    DTRAIN_REQUIRE(n >= 1 && n <= 3, "Upsample", "1, 2 or 3 spatial axes, got " << n);
    DTRAIN_REQUIRE(factor > 0, "Upsample", "scale must be positive, got " << factor);
  }
};
inline Upsample Upsample1d(std::int64_t scale) { return Upsample(1, scale); }
inline Upsample Upsample2d(std::int64_t scale) { return Upsample(2, scale); }
inline Upsample Upsample3d(std::int64_t scale) { return Upsample(3, scale); }

struct LayerSpec;

/// A skip connection: y = x + body(x). The body is a list of built-in layers whose output has
/// the input's shape; its parameters sit in the arenas as one unit ("layers/2_residual/0_conv/
/// weight"), reported ready together. For user layers inside a block, see ResidualLayer.
struct Residual {
  std::vector<LayerSpec> body;
  Residual(std::initializer_list<LayerSpec> layers);
  explicit Residual(std::vector<LayerSpec> layers);
};

/// Any built-in layer description Sequential accepts.
struct LayerSpec : std::variant<Input, Linear, Relu, Gelu, Tanh, LayerNorm, Dropout, Conv, Pool,
                                Upsample, Residual> {
  using variant::variant;
  const variant& base() const noexcept { return *this; }
};

inline Residual::Residual(std::initializer_list<LayerSpec> layers) : body(layers) {
  DTRAIN_REQUIRE(!body.empty(), "Residual", "needs at least one layer");
}
inline Residual::Residual(std::vector<LayerSpec> layers) : body(std::move(layers)) {
  DTRAIN_REQUIRE(!body.empty(), "Residual", "needs at least one layer");
}

}  // namespace dtrain

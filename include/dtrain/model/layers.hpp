// SPDX-License-Identifier: BSD-3-Clause
// dtrain: descriptions of the built-in layers for Sequential. A description holds only
// hyper-parameters; the Sequential that receives it builds the layer in its own scalar type and
// binds it to the parameter arena, so one model description serves float training and float64
// gradient checks. A user's own layer is a class template L<T, Exec> deriving from Layer<T, Exec>
// (<dtrain/model/layer.hpp>), named in a list as custom<L>(constructor arguments...).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <tuple>
#include <type_traits>
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
  /// Throws InvalidArgument naming the field that is out of range. The constructors and the
  /// model (again, since the fields are public) call it; so does every description below.
  void check() const {
    DTRAIN_REQUIRE(!shape.empty(), "Input", "shape needs at least one axis");
    for (auto d : shape)
      DTRAIN_REQUIRE(d > 0, "Input", "shape's axes must be positive, got " << shape_string(shape));
  }
};

namespace detail {
inline bool valid_init(Init how) noexcept { return how <= Init::xavier_normal; }
}  // namespace detail

/// Fully connected layer y = x W^T + b, W of shape [out_features, in_features], b of [out]. An
/// input sample of any shape with in_features elements is read flat (so a Linear can follow a
/// convolution directly); the output is [out_features].
struct Linear {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  Init init = Init::kaiming_uniform;
  Linear(std::int64_t in, std::int64_t out, Init how = Init::kaiming_uniform)
      : in_features(in), out_features(out), init(how) {
    check();
  }
  void check() const {
    DTRAIN_REQUIRE(in_features > 0 && out_features > 0, "Linear",
                   "in_features and out_features must be positive, got " << in_features << " -> "
                                                                         << out_features);
    DTRAIN_REQUIRE(detail::valid_init(init), "Linear",
                   "init is not an Init value (" << int(init) << ")");
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
  explicit LayerNorm(std::int64_t n, double epsilon = 1e-5) : features(n), eps(epsilon) { check(); }
  void check() const {
    DTRAIN_REQUIRE(features > 0, "LayerNorm", "features must be positive, got " << features);
    DTRAIN_REQUIRE(eps > 0 && std::isfinite(eps), "LayerNorm",
                   "eps must be positive and finite, got " << eps);
  }
};

/// Inverted dropout with drop probability p in [0, 1): identity at evaluation. The mask is a pure
/// function of (model seed, layer, step, global sample index, element), see host::dropout_keep.
struct Dropout {
  float p = 0.5f;
  explicit Dropout(float prob) : p(prob) { check(); }
  void check() const {
    DTRAIN_REQUIRE(p >= 0.0f && p < 1.0f, "Dropout",
                   "drop probability p = " << p << " outside [0, 1)");
  }
};

/// How a convolution fills the border: zeros, or the opposite edge of the grid (periodic domains).
enum class Padding : unsigned char { zeros, periodic };

/// How a convolution becomes GEMMs. `im2col`: each sample's windows copied into one matrix
/// [in_channels x kernel cells, output cells], one GEMM against the weights. `shifted` (stride 1
/// only): the sample copied once onto a padded grid, then one GEMM per kernel cell against a
/// shifted view of it, so no window matrix is written. `direct` (stride 1, dilation 1, host
/// policies only): no GEMM, a register-blocked direct kernel compiled for AVX-512, AVX2 and
/// portable vectors, chosen at run time (<dtrain/kernels/host/conv_direct.hpp>). `automatic` picks
/// by the rule measured in benchmarks/conv_bench.cpp (see ConvLayer::lowering).
enum class ConvLowering : unsigned char { automatic, im2col, shifted, direct };

/// N-dimensional convolution (N = 1, 2, 3) over channels-first samples [in_channels, *grid]: the
/// same kernel size, stride, padding and dilation on every axis. Weight [out_channels,
/// in_channels, k, ...], bias [out_channels]. Output extent per axis:
/// (n + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1. Periodic padding needs
/// padding <= the axis. Build with Conv1d / Conv2d / Conv3d, e.g.
/// Conv2d(1, 32, 3).with_padding(1) or
/// Conv2d(32, 32, 3).with_padding(1, Padding::periodic).with_stride(2). The model checks every
/// field again when it is built (check()), since the fields are public.
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
  Conv(int n, std::int64_t in, std::int64_t out, std::int64_t k)
      : dims(n), in_channels(in), out_channels(out), kernel(k) {
    check();
  }
  void check() const {
    DTRAIN_REQUIRE(dims >= 1 && dims <= 3, "Conv", "dims must be 1, 2 or 3, got " << dims);
    DTRAIN_REQUIRE(in_channels > 0 && out_channels > 0, "Conv",
                   "in_channels and out_channels must be positive, got " << in_channels << " -> "
                                                                         << out_channels);
    DTRAIN_REQUIRE(kernel > 0, "Conv", "kernel must be positive, got " << kernel);
    DTRAIN_REQUIRE(stride > 0, "Conv", "stride must be positive, got " << stride);
    DTRAIN_REQUIRE(padding >= 0, "Conv", "padding must be non-negative, got " << padding);
    DTRAIN_REQUIRE(dilation > 0, "Conv", "dilation must be positive, got " << dilation);
    DTRAIN_REQUIRE(padding_mode <= Padding::periodic, "Conv",
                   "padding_mode is not a Padding value (" << int(padding_mode) << ")");
    DTRAIN_REQUIRE(detail::valid_init(weight_init), "Conv",
                   "weight_init is not an Init value (" << int(weight_init) << ")");
    DTRAIN_REQUIRE(lowering <= ConvLowering::direct, "Conv",
                   "lowering is not a ConvLowering value (" << int(lowering) << ")");
  }
  Conv& with_stride(std::int64_t s) {
    DTRAIN_REQUIRE(s > 0, "Conv", "stride must be positive, got " << s);
    stride = s;
    return *this;
  }
  /// Padding of `p` cells on both sides of every axis: zeros, or periodic (the grid wraps
  /// around).
  Conv& with_padding(std::int64_t p, Padding mode = Padding::zeros) {
    DTRAIN_REQUIRE(p >= 0, "Conv", "padding must be non-negative, got " << p);
    padding = p;
    padding_mode = mode;
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
    check();
  }
  void check() const {
    DTRAIN_REQUIRE(kind == max || kind == average, "Pool",
                   "kind is not a Pool::Kind value (" << int(kind) << ")");
    DTRAIN_REQUIRE(dims >= 1 && dims <= 3, "Pool", "dims must be 1, 2 or 3, got " << dims);
    DTRAIN_REQUIRE(kernel > 0, "Pool", "kernel must be positive, got " << kernel);
    DTRAIN_REQUIRE(stride > 0, "Pool", "stride must be positive, got " << stride);
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
  Upsample(int n, std::int64_t factor) : dims(n), scale(factor) { check(); }
  void check() const {
    DTRAIN_REQUIRE(dims >= 1 && dims <= 3, "Upsample", "dims must be 1, 2 or 3, got " << dims);
    DTRAIN_REQUIRE(scale > 0, "Upsample", "scale must be positive, got " << scale);
  }
};
inline Upsample Upsample1d(std::int64_t scale) { return Upsample(1, scale); }
inline Upsample Upsample2d(std::int64_t scale) { return Upsample(2, scale); }
inline Upsample Upsample3d(std::int64_t scale) { return Upsample(3, scale); }

/// A layer of one's own: the class template L<T, Exec> (deriving from Layer<T, Exec>) built for
/// the model's scalar and policy from copies of `args`. Made by custom<L>(args...); a layer list
/// takes it beside the built-in descriptions, inside a Residual too.
template <template <class, class> class L, class... A>
struct Custom {
  std::tuple<A...> args;
  /// The layer for scalar T and policy Exec (what a layer list calls; see LayerEntry).
  template <class T, class Exec>
  std::unique_ptr<Layer<T, Exec>> make() const {
    static_assert(std::is_base_of_v<Layer<T, Exec>, L<T, Exec>>,
                  "custom<L>: L<T, Exec> must derive from dtrain::Layer<T, Exec>");
    return std::apply(
        [](const A&... a) -> std::unique_ptr<Layer<T, Exec>> {
          return std::make_unique<L<T, Exec>>(a...);
        },
        args);
  }
};
/// custom<MyLayer>(1.5, 3): the entry of a layer list for MyLayer<T, Exec>(1.5, 3).
template <template <class, class> class L, class... A>
Custom<L, std::decay_t<A>...> custom(A&&... args) {
  return Custom<L, std::decay_t<A>...>{std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
}

struct LayerSpec;

/// A skip connection: y = x + body(x). The body is a list of layers whose output has the input's
/// shape; its parameters sit in the arenas as one unit ("layers/2_residual/0_conv/weight"),
/// reported ready together. Residual{...} is a Residual<entry types...>, which a Sequential's
/// layer list takes whatever the entries (layers of one's own, custom<L>(...), included); one of
/// built-in descriptions only is also a LayerSpec (as the Residual<> it converts to).
template <class... Layers>
struct Residual {
  std::tuple<Layers...> body;
  Residual(Layers... layers)  // NOLINT: implicit, so that Residual{...} deduces its entries
      : body(std::move(layers)...) {}
};
/// A body of built-in descriptions, as a LayerSpec holds it.
template <>
struct Residual<> {
  std::vector<LayerSpec> body;
  Residual(std::initializer_list<LayerSpec> layers);
  explicit Residual(std::vector<LayerSpec> layers);
  template <class... L, std::enable_if_t<(sizeof...(L) > 0) &&
                                             (std::is_constructible_v<LayerSpec, const L&> && ...),
                                         int> = 0>
  Residual(const Residual<L...>& block);  // NOLINT: implicit, so that it is a LayerSpec
};
Residual(std::vector<LayerSpec>)->Residual<>;
/// Residual{Residual{...}} nests the inner block (deduction would otherwise take it as a copy).
template <class... L>
Residual(Residual<L...>) -> Residual<Residual<L...>>;

namespace detail {
// A Residual<entry types...> (not the LayerSpec's Residual<>).
template <class S>
struct is_residual : std::false_type {};
template <class L0, class... L>
struct is_residual<Residual<L0, L...>> : std::true_type {};
}  // namespace detail

/// Any built-in layer description Sequential accepts.
struct LayerSpec : std::variant<Input, Linear, Relu, Gelu, Tanh, LayerNorm, Dropout, Conv, Pool,
                                Upsample, Residual<>> {
  using variant::variant;
  const variant& base() const noexcept { return *this; }
};

inline Residual<>::Residual(std::initializer_list<LayerSpec> layers) : body(layers) {
  DTRAIN_REQUIRE(!body.empty(), "Residual", "needs at least one layer");
}
inline Residual<>::Residual(std::vector<LayerSpec> layers) : body(std::move(layers)) {
  DTRAIN_REQUIRE(!body.empty(), "Residual", "needs at least one layer");
}
template <class... L,
          std::enable_if_t<
              (sizeof...(L) > 0) && (std::is_constructible_v<LayerSpec, const L&> && ...), int>>
Residual<>::Residual(const Residual<L...>& block)
    : body(std::apply([](const L&... l) { return std::vector<LayerSpec>{LayerSpec(l)...}; },
                      block.body)) {}

}  // namespace dtrain

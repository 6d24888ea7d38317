// Grid layers (convolutions, pooling, upsampling, residual blocks): gradients against float64
// central finite differences (check_gradients, itself checked on a planted wrong backward), the
// convolution against a direct loop, the device functors against the host lowering, shape errors
// that name the layer and both shapes; a layer of one's own as one class (custom<L>) in a list
// and in residual blocks, its gradients against finite differences; descriptions whose public
// fields went past their constructors, and layers whose tensors overlap, leave their slice or
// repeat a name, refused at model build with the layer index and the field or tensors named.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/messages.hpp"

#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_model_layers_test {

using namespace dtrain;
using Entries = std::vector<LayerEntry<double, HostExec>>;

namespace {

std::vector<double> random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  RngStream rng(seed, 5);
  std::vector<double> v(n);
  for (auto& x : v) x = lo + (hi - lo) * rng.uniform_double();
  return v;
}

// Norm-wise relative error between the model's gradient of an MSE loss (or softmax cross-entropy
// with `classify`) and central differences, over every parameter.
double gradient_error(const Entries& layers, std::int64_t batch, std::uint64_t seed,
                      bool classify = false) {
  BasicSequential<double> m(layers);
  m.init(seed);
  auto p = m.parameter_span();
  auto noise = random_vec(p.size(), seed + 1, -0.2, 0.2);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];  // biases away from zero
  const std::int64_t outs = m.out_features();
  const auto x = random_vec(static_cast<std::size_t>(batch * m.in_features()), seed + 2, -2, 2);
  const auto targets = random_vec(static_cast<std::size_t>(batch * outs), seed + 3);
  std::vector<std::int32_t> labels;
  for (std::int64_t r = 0; r < batch; ++r) labels.push_back(static_cast<std::int32_t>(r % outs));
  const GradientCheck gc =
      classify ? check_gradients(m, x.data(), labels.data(), batch, Loss::softmax_cross_entropy)
               : check_gradients(m, x.data(), targets.data(), batch, Loss::mse);
  REQUIRE(gc.gradient_norm > 0);
  REQUIRE(gc.checked == p.size());
  return gc.relative_error;
}

// y = w * x elementwise with one weight, host policies; its backward reports `skew` times the
// true parameter gradient, so check_gradients must see a relative error near |skew - 1|.
template <class T, class Exec>
struct SkewedScale final : Layer<T, Exec> {
  using typename Layer<T, Exec>::stream_type;
  explicit SkewedScale(double skew) : skew_(skew) {}
  const char* kind() const noexcept override { return "skewed_scale"; }
  Shape configure(const Shape& in) override { return in; }
  std::vector<LayerParam> params() const override { return {{"w", {1}, 0}}; }
  void init(std::uint64_t, std::uint64_t, T* host) override { host[0] = T(1.5); }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    this->exec().host_kernel(
        s, "skewed forward",
        [](const T* w, const T* in, T* out, std::int64_t n) {
          for (std::int64_t i = 0; i < n; ++i) out[i] = w[0] * in[i];
        },
        this->parameters(), x, y, rows * this->input_size());
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    this->exec().host_kernel(
        s, "skewed backward",
        [](const T* w, const T* in, const T* d, T* din, T* g, std::int64_t n, T skew) {
          for (std::int64_t i = 0; i < n; ++i) {
            if (din) din[i] = w[0] * d[i];
            g[0] += skew * in[i] * d[i];
          }
        },
        this->parameters(), x, dy, dx, this->gradients(), rows * this->input_size(), T(skew_));
  }
  double skew_;
};

// Direct convolution of one sample (independent of the lowering): x [cin, d, h, w] padded to
// three axes, weights [cout, cin, kd, kh, kw].
std::vector<double> direct_conv(const ConvGeometry& g, const double* x, const double* w,
                                const double* b) {
  std::vector<double> y(static_cast<std::size_t>(g.out_channels * g.out_cells()));
  auto src = [&](int a, std::int64_t o, std::int64_t k, bool& inside) {
    std::int64_t i = o * g.stride[a] + k * g.dilation[a] - g.pad[a];
    if (g.periodic) i = ((i % g.in[a]) + g.in[a]) % g.in[a];
    inside = i >= 0 && i < g.in[a];
    return i;
  };
  for (std::int64_t co = 0; co < g.out_channels; ++co)
    for (std::int64_t od = 0; od < g.out[0]; ++od)
      for (std::int64_t oh = 0; oh < g.out[1]; ++oh)
        for (std::int64_t ow = 0; ow < g.out[2]; ++ow) {
          double sum = b[co];
          for (std::int64_t ci = 0; ci < g.in_channels; ++ci)
            for (std::int64_t kd = 0; kd < g.kernel[0]; ++kd)
              for (std::int64_t kh = 0; kh < g.kernel[1]; ++kh)
                for (std::int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                  bool a, bb, c;
                  const auto id = src(0, od, kd, a), ih = src(1, oh, kh, bb),
                             iw = src(2, ow, kw, c);
                  if (!(a && bb && c)) continue;
                  sum += w[(((co * g.in_channels + ci) * g.kernel[0] + kd) * g.kernel[1] + kh) *
                               g.kernel[2] +
                           kw] *
                         x[((ci * g.in[0] + id) * g.in[1] + ih) * g.in[2] + iw];
                }
          y[static_cast<std::size_t>(((co * g.out[0] + od) * g.out[1] + oh) * g.out[2] + ow)] = sum;
        }
  return y;
}

}  // namespace

TEST_CASE("grid layers: gradients match float64 finite differences") {
  struct Case {
    const char* name;
    Entries layers;
    bool classify = false;
  };
  // Every stride-1 convolution runs once through each lowering (im2col, shifted views, and the
  // direct kernel where the dilation is 1).
  for (ConvLowering lowering :
       {ConvLowering::im2col, ConvLowering::shifted, ConvLowering::direct}) {
    auto c = [lowering](Conv conv) {
      const bool fits =
          conv.stride == 1 && (lowering != ConvLowering::direct || conv.dilation == 1);
      return fits ? conv.with_lowering(lowering) : conv;
    };
    // A convolution before the layer under test turns its input gradient into parameter
    // gradients, so every backward's dx is checked as well as the parameters.
    const std::vector<Case> cases = {
        {"conv1d",
         {Input{2, 9}, c(Conv1d(2, 3, 3).with_padding(1)), Tanh{},
          c(Conv1d(3, 2, 2).with_stride(2))}},
        {"conv2d-dilation",
         {Input{2, 7, 6}, c(Conv2d(2, 3, 3).with_padding(2).with_dilation(2)), Gelu{},
          c(Conv2d(3, 2, 3).with_stride(2).with_padding(1))}},
        {"conv2d-periodic",
         {Input{1, 5, 6}, c(Conv2d(1, 3, 3).with_padding(1, Padding::periodic)), Tanh{},
          c(Conv2d(3, 2, 3).with_padding(2, Padding::periodic).with_stride(2)),
          c(Conv2d(2, 2, 3).with_padding(3, Padding::periodic))}},
        {"conv3d",
         {Input{2, 4, 5, 3}, c(Conv3d(2, 2, 3).with_padding(1)), Tanh{}, c(Conv3d(2, 1, 2)),
          c(Conv3d(1, 2, 2).with_padding(1, Padding::periodic).with_dilation(2))}},
        {"maxpool2d",
         {Input{1, 6, 6}, c(Conv2d(1, 2, 3).with_padding(1)), MaxPool2d(2), c(Conv2d(2, 1, 1))}},
        {"maxpool1d-overlap",
         {Input{2, 9}, c(Conv1d(2, 2, 1)), MaxPool1d(3, 2), c(Conv1d(2, 1, 1))}},
        {"avgpool3d", {Input{1, 4, 4, 6}, c(Conv3d(1, 2, 1)), AvgPool3d(2), c(Conv3d(2, 1, 1))}},
        {"avgpool1d-overlap",
         {Input{1, 8}, c(Conv1d(1, 2, 1)), AvgPool1d(3, 2), c(Conv1d(2, 1, 1))}},
        {"upsample2d",
         {Input{1, 3, 4}, c(Conv2d(1, 2, 1)), Upsample2d(2), c(Conv2d(2, 1, 3).with_padding(1))}},
        {"upsample3d", {Input{1, 2, 3, 2}, c(Conv3d(1, 2, 1)), Upsample3d(3), c(Conv3d(2, 1, 2))}},
        {"residual",
         {Input{2, 6, 6}, c(Conv2d(2, 3, 3).with_padding(1)),
          Residual{c(Conv2d(3, 3, 3).with_padding(1)), Tanh{},
                   c(Conv2d(3, 3, 3).with_padding(1, Padding::periodic))},
          Tanh{}, c(Conv2d(3, 1, 1))}},
        {"conv-linear-head", {Input{1, 4, 4}, c(Conv2d(1, 2, 3)), Relu{}, Linear(8, 3)}, true},
        {"residual-first", {Input{4}, Residual{Linear(4, 4), Tanh{}}, Linear(4, 2)}},
    };
    for (const auto& cs : cases)
      for (std::int64_t batch : {1, 3}) {
        INFO(cs.name << " batch=" << batch << " lowering=" << static_cast<int>(lowering));
        CHECK(gradient_error(cs.layers, batch, 17 + static_cast<std::uint64_t>(batch),
                             cs.classify) < 1e-6);
      }
  }
}

TEST_CASE("check_gradients finds a backward that is off by 1%") {
  for (const double skew : {1.0, 1.01}) {
    CAPTURE(skew);
    BasicSequential<double> m(Entries{Linear(3, 4), custom<SkewedScale>(skew), Linear(4, 2)});
    m.init(5);
    const auto x = random_vec(3 * 6, 7, -1, 1);
    const auto t = random_vec(2 * 6, 8);
    const GradientCheck gc = check_gradients(m, x.data(), t.data(), 6, Loss::mse);
    CHECK(gc.checked == m.parameter_count());
    if (skew == 1.0)
      CHECK(gc.relative_error < 1e-8);
    else
      CHECK(gc.relative_error > 1e-4);
    // The arena holds the batch's analytic gradient afterwards, not the extra passes' sums.
    std::vector<double> g(m.gradient_span().begin(), m.gradient_span().end());
    m.zero_grad();
    m.forward_backward(x.data(), t.data(), 6, Loss::mse);
    CHECK(std::equal(g.begin(), g.end(), m.gradient_span().begin()));
  }
}

TEST_CASE("convolution equals a direct loop, zero and periodic padding, any stride and dilation") {
  struct Case {
    Conv conv;
    Shape in;
  };
  const std::vector<Case> cases = {
      {Conv1d(2, 3, 3).with_padding(1), {2, 10}},
      {Conv1d(1, 2, 4).with_stride(3).with_padding(2, Padding::periodic), {1, 7}},
      {Conv2d(3, 4, 3).with_padding(1), {3, 8, 7}},
      {Conv2d(2, 2, 3).with_padding(1, Padding::periodic), {2, 5, 6}},
      {Conv2d(2, 3, 2).with_stride(2).with_dilation(2).with_padding(1), {2, 9, 8}},
      {Conv3d(2, 2, 3).with_padding(1, Padding::periodic).with_stride(2), {2, 5, 4, 6}},
  };
  for (const auto& base : cases)
    for (ConvLowering lowering :
         {ConvLowering::im2col, ConvLowering::shifted, ConvLowering::direct}) {
      if (lowering != ConvLowering::im2col && base.conv.stride != 1) continue;
      if (lowering == ConvLowering::direct && base.conv.dilation != 1) continue;
      Case c = base;
      c.conv.with_lowering(lowering);
      BasicSequential<double> m({Input(c.in), c.conv});
      m.init(5);
      const auto& layer = dynamic_cast<const ConvLayer<double, HostExec>&>(m.layer(0));
      const ConvGeometry& g = layer.geometry();
      const std::int64_t batch = 2;
      const auto x = random_vec(static_cast<std::size_t>(batch * m.in_features()), 9);
      auto p = m.parameter_span();
      const auto bias = random_vec(static_cast<std::size_t>(g.out_channels), 4);
      const std::size_t wcount = p.size() - bias.size();
      for (std::size_t i = 0; i < bias.size(); ++i) p[wcount + i] = bias[i];
      const double* y = m.forward(x.data(), batch);
      for (std::int64_t r = 0; r < batch; ++r) {
        const auto ref =
            direct_conv(g, x.data() + r * m.in_features(), p.data(), p.data() + wcount);
        double err = 0;
        for (std::size_t i = 0; i < ref.size(); ++i)
          err = std::max(err,
                         std::abs(ref[i] - y[r * m.out_features() + static_cast<std::int64_t>(i)]));
        INFO(shape_string(c.in) << " kernel " << c.conv.kernel << " row " << r << " lowering "
                                << static_cast<int>(lowering));
        CHECK(err < 1e-12);
      }
    }
}

TEST_CASE("the device lowering functors equal the host lowering") {
  // im2col / col2im as a GPU runs them (one element per index, col2im as a gather) against the
  // host functions, on geometries with borders, wrap-around, strides and dilations.
  struct Case {
    Conv conv;
    Shape in;
  };
  const std::vector<Case> cases = {
      {Conv1d(2, 1, 3).with_padding(1), {2, 11}},
      {Conv2d(2, 1, 3).with_padding(1, Padding::periodic), {2, 6, 5}},
      {Conv2d(1, 1, 3).with_padding(3, Padding::periodic).with_stride(2), {1, 4, 3}},
      {Conv2d(3, 1, 2).with_stride(3).with_dilation(2).with_padding(2), {3, 9, 10}},
      {Conv3d(2, 1, 3).with_padding(1).with_stride(2), {2, 5, 6, 4}},
      {Conv3d(1, 1, 2).with_padding(1, Padding::periodic).with_dilation(2), {1, 3, 4, 5}},
  };
  for (const auto& c : cases) {
    BasicSequential<double> m({Input(c.in), c.conv});
    const ConvGeometry g = dynamic_cast<const ConvLayer<double, HostExec>&>(m.layer(0)).geometry();
    INFO(shape_string(c.in) << " kernel " << c.conv.kernel);
    const auto x = random_vec(static_cast<std::size_t>(g.in_channels * g.in_cells()), 3);
    const std::size_t cells = static_cast<std::size_t>(g.lowered_rows() * g.out_cells());
    std::vector<double> host_col(cells), dev_col(cells);
    detail::im2col_host(g, x.data(), host_col.data());
    HostExec exec;
    for_each_index<detail::Im2col<double>>(exec, HostStream{}, "im2col",
                                           static_cast<std::int64_t>(cells), g, x.data(),
                                           dev_col.data());
    CHECK(host_col == dev_col);
    const auto col = random_vec(cells, 8);
    std::vector<double> host_dx(x.size()), dev_dx(x.size(), 99.0);
    detail::col2im_host(g, col.data(), host_dx.data());
    for_each_index<detail::Col2im<double>>(exec, HostStream{}, "col2im",
                                           static_cast<std::int64_t>(x.size()), g, col.data(),
                                           dev_dx.data());
    double err = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      err = std::max(err, std::abs(host_dx[i] - dev_dx[i]));
    CHECK(err < 1e-12);  // the gather sums in another order than the host's scatter
  }
}

TEST_CASE("shapes that do not fit name the layer and both shapes") {
  using test::invalid_argument_text;
  CHECK_THROWS_AS(BasicSequential<double>({Input{1, 8, 8}, Conv2d(3, 4, 3)}), InvalidArgument);
  const std::string conv = invalid_argument_text([] {
    BasicSequential<double>({Input{1, 8, 8}, Conv2d(3, 4, 3)});
  });
  CHECK(conv.find("layer 0 (conv2d)") != std::string::npos);
  CHECK(conv.find("[1, 8, 8]") != std::string::npos);
  CHECK(conv.find("3 channels") != std::string::npos);
  const std::string linear = invalid_argument_text([] {
    BasicSequential<double>({Input{2, 4, 4}, Conv2d(2, 3, 3), Linear(10, 1)});
  });
  CHECK(linear.find("layer 1 (linear)") != std::string::npos);
  CHECK(linear.find("[3, 2, 2]") != std::string::npos);
  CHECK(linear.find("10 features") != std::string::npos);
  const std::string skip = invalid_argument_text([] {
    BasicSequential<double>({Input{2, 6, 6}, Residual{Conv2d(2, 3, 3).with_padding(1)}});
  });
  CHECK(skip.find("layer 0 (residual)") != std::string::npos);
  CHECK(skip.find("[2, 6, 6] to [3, 6, 6]") != std::string::npos);
  const std::string pool = invalid_argument_text([] {
    BasicSequential<double>({Input{1, 3, 8}, MaxPool2d(4)});
  });
  CHECK(pool.find("maxpool2d") != std::string::npos);
  CHECK(pool.find("[1, 3, 8]") != std::string::npos);
  const std::string kernel = invalid_argument_text([] {
    BasicSequential<double>({Input{1, 2, 8}, Conv2d(1, 1, 5)});
  });
  CHECK(kernel.find("does not fit") != std::string::npos);
  const std::string first =
      invalid_argument_text([] { BasicSequential<double>({Conv2d(1, 1, 3)}); });
  CHECK(first.find("Input{") != std::string::npos);
  CHECK_THROWS_AS(Conv2d(1, 1, 3).with_stride(0), InvalidArgument);
  CHECK_THROWS_AS(MaxPool2d(0), InvalidArgument);
  CHECK_THROWS_AS(
      BasicSequential<double>({Input{1, 4}, Conv1d(1, 1, 3).with_padding(5, Padding::periodic)}),
      InvalidArgument);
  CHECK_THROWS_AS(
      BasicSequential<double>(
          {Input{1, 8}, Conv1d(1, 1, 3).with_stride(2).with_lowering(ConvLowering::shifted)}),
      InvalidArgument);
}

TEST_CASE("a residual block's parameters are named per body layer, in arena order") {
  Sequential m({Input{2, 4, 4}, Conv2d(2, 3, 3).with_padding(1),
                Residual{Conv2d(3, 3, 3).with_padding(1), Relu{}, Conv2d(3, 3, 1)},
                Conv2d(3, 1, 1)});
  std::vector<std::string> names;
  std::size_t next = 0;
  for (const auto& p : m.parameter_info()) {
    names.push_back(p.name);
    CHECK(p.offset == next);
    next += p.count;
  }
  CHECK(next == m.parameter_count());
  const std::vector<std::string> expect = {"layers/0_conv2d/weight",
                                           "layers/0_conv2d/bias",
                                           "layers/1_residual/0_conv2d/weight",
                                           "layers/1_residual/0_conv2d/bias",
                                           "layers/1_residual/2_conv2d/weight",
                                           "layers/1_residual/2_conv2d/bias",
                                           "layers/2_conv2d/weight",
                                           "layers/2_conv2d/bias"};
  CHECK(names == expect);
  CHECK(m.output_shape() == Shape{1, 4, 4});
  // The two convolutions of the body draw different initial weights.
  m.init(3);
  const auto p = m.parameter_span();
  const auto& info = m.parameter_info();
  CHECK(p[info[2].offset] != p[info[4].offset]);
}

}  // namespace dtrain_test_model_layers_test

namespace dtrain_test_model_layers_test {
namespace {
// y = x * w + x * w^2 per feature (two tensors of the layer's own), one class for any scalar and
// policy, its host code launched through the policy; starts at `w0`.
template <class T, class Exec>
class ScaleTwice final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  explicit ScaleTwice(double w0) : w0_(w0) {}
  const char* kind() const noexcept override { return "scale_twice"; }
  Shape configure(const Shape& in) override { return in; }
  std::vector<LayerParam> params() const override {
    const std::int64_t n = this->input_size();
    return {{"a", {n}, 0}, {"b", {n}, static_cast<std::size_t>(n)}};
  }
  void init(std::uint64_t, std::uint64_t, T* host) override {
    for (std::int64_t j = 0; j < 2 * this->input_size(); ++j) host[j] = T(w0_ + 0.1 * j);
  }
  void forward(stream_type s, const T* x, T* y, std::int64_t rows, const PassContext&) override {
    this->exec().host_kernel(s, "scale_twice forward", &fwd, x, this->parameters(), y, rows,
                             this->input_size());
  }
  void backward(stream_type s, const T* x, const T*, const T* dy, T* dx, std::int64_t rows,
                const PassContext&) override {
    this->exec().host_kernel(s, "scale_twice backward", &bwd, x, this->parameters(), dy, dx,
                             this->gradients(), rows, this->input_size());
  }

 private:
  static void fwd(const T* x, const T* w, T* y, std::int64_t rows, std::int64_t n) {
    for (std::int64_t i = 0; i < rows * n; ++i) {
      const T a = w[i % n], b = w[n + i % n];
      y[i] = x[i] * (a + b * b);
    }
  }
  static void bwd(const T* x, const T* w, const T* dy, T* dx, T* g, std::int64_t rows,
                  std::int64_t n) {
    for (std::int64_t i = 0; i < rows * n; ++i) {
      const T a = w[i % n], b = w[n + i % n];
      if (dx) dx[i] = dy[i] * (a + b * b);
      g[i % n] += dy[i] * x[i];
      g[n + i % n] += dy[i] * x[i] * 2 * b;
    }
  }
  double w0_;
};

// A layer that declares whatever tensors it is given, over `count` elements.
template <class T, class Exec>
class Declares final : public Layer<T, Exec> {
 public:
  using typename Layer<T, Exec>::stream_type;
  Declares(std::vector<LayerParam> params, std::size_t count)
      : params_(std::move(params)), count_(count) {}
  const char* kind() const noexcept override { return "declares"; }
  Shape configure(const Shape& in) override { return in; }
  std::vector<LayerParam> params() const override { return params_; }
  std::size_t param_count() const override { return count_; }
  void forward(stream_type, const T*, T*, std::int64_t, const PassContext&) override {}
  void backward(stream_type, const T*, const T*, const T*, T*, std::int64_t,
                const PassContext&) override {}

 private:
  std::vector<LayerParam> params_;
  std::size_t count_;
};
}  // namespace

TEST_CASE("a layer of one's own is one class: custom<L>(args) in a list and in a residual") {
  const Entries layers{Input{3},
                       Linear(3, 4),
                       custom<ScaleTwice>(0.7),
                       Tanh{},
                       Residual{custom<ScaleTwice>(-0.4), Linear(4, 4)},
                       Linear(4, 2)};
  for (std::int64_t batch : {1, 3}) {
    CAPTURE(batch);
    CHECK(gradient_error(layers, batch, 5) < 1e-6);
  }
  BasicSequential<double> m(layers);
  std::vector<std::string> names;
  for (const auto& p : m.parameter_info()) names.push_back(p.name);
  const std::vector<std::string> expect = {"layers/0_linear/weight",
                                           "layers/0_linear/bias",
                                           "layers/1_scale_twice/a",
                                           "layers/1_scale_twice/b",
                                           "layers/3_residual/0_scale_twice/a",
                                           "layers/3_residual/0_scale_twice/b",
                                           "layers/3_residual/1_linear/weight",
                                           "layers/3_residual/1_linear/bias",
                                           "layers/4_linear/weight",
                                           "layers/4_linear/bias"};
  CHECK(names == expect);
  // The constructor's argument reached each instance.
  m.init(1);
  CHECK(m.parameter_span()[m.parameter_info()[2].offset] == doctest::Approx(0.7));
  CHECK(m.parameter_span()[m.parameter_info()[4].offset] == doctest::Approx(-0.4));
  // A residual block of built-in layers is also a LayerSpec, for lists of those.
  const std::vector<LayerSpec> specs{Input{4}, Residual{Linear(4, 4), Tanh{}}, Linear(4, 2)};
  BasicSequential<double> from_specs(specs);
  CHECK(from_specs.parameter_info()[0].name == "layers/0_residual/0_linear/weight");
  CHECK(from_specs.parameter_count() == 20 + 10);
  // A block of one block nests it.
  BasicSequential<double> nested({Input{4}, Residual{Residual{Linear(4, 4), Tanh{}}}});
  CHECK(nested.parameter_info()[0].name == "layers/0_residual/0_residual/0_linear/weight");
  // The same list type serves float on the host too.
  Sequential f({Input{3}, custom<ScaleTwice>(1.0), Residual{Relu{}, custom<ScaleTwice>(0.5)}});
  CHECK(f.parameter_count() == 12);
}

TEST_CASE("a layer's tensors are checked at model build: inside its count, disjoint, named once") {
  using test::invalid_argument_text;
  using P = std::vector<LayerParam>;
  auto build = [](P params, std::size_t count, bool in_residual = false) {
    return invalid_argument_text([&] {
      if (in_residual)
        BasicSequential<double>({Input{4}, Residual{Relu{}, custom<Declares>(params, count)}});
      else
        BasicSequential<double>({Input{4}, Relu{}, custom<Declares>(params, count)});
    });
  };
  const std::string overlap = build({{"a", {4}, 0}, {"b", {2, 2}, 2}}, 8);
  CHECK(test::contains(overlap, "layer 1 (declares)"));
  CHECK(test::contains(overlap, "tensors 'a' at [0, 4) and 'b' at [2, 6) overlap"));
  const std::string past = build({{"a", {4}, 6}}, 8);
  CHECK(test::contains(past, "tensor 'a' at [6, 10) ends past the layer's param_count() of 8"));
  CHECK(test::contains(build({{"w", {2}, 0}, {"w", {2}, 2}}, 4), "'w' given twice"));
  CHECK(test::contains(build({{"", {2}, 0}}, 2), "is empty or has an empty path component"));
  CHECK(test::contains(build({{"w/", {2}, 0}}, 2), "empty path component"));
  CHECK(test::contains(build({{"w", {2, -1}, 0}}, 2), "negative extent"));
  const std::string nested = build({{"a", {4}, 0}, {"b", {4}, 3}}, 8, true);
  CHECK(test::contains(nested, "layer 0 (residual): Residual: body layer 1 (declares)"));
  CHECK(test::contains(nested, "overlap"));
  // A gap, tensors out of order and empty tensors are fine; names are the layer's.
  BasicSequential<double> ok(
      {Input{4}, custom<Declares>(P{{"b", {2}, 4}, {"a", {2}, 0}, {"e", {0}, 2}}, std::size_t(6))});
  CHECK(ok.parameter_count() == 6);
  CHECK(ok.parameter_info()[0].name == "layers/0_declares/b");
}

TEST_CASE("layer descriptions are checked again at model build, naming the layer and the field") {
  using test::contains;
  using test::invalid_argument_text;
  // Public fields set past the constructors' and builders' checks.
  Conv stride0 = Conv2d(1, 1, 3);
  stride0.stride = 0;  // divided by in the output extent
  const std::string conv = invalid_argument_text([&] {
    BasicSequential<double>({Input{1, 8, 8}, Relu{}, stride0});
  });
  CHECK(contains(conv, "Sequential: layer 1: Conv: stride must be positive, got 0"));
  CHECK(conv.find("dtrain: rank", 1) == std::string::npos);  // one prefix, not two
  Conv dil = Conv1d(1, 1, 3);
  dil.dilation = 0;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{1, 8}, dil});
                 }),
                 "dilation must be positive, got 0"));
  Conv pad = Conv1d(1, 1, 3);
  pad.padding = -2;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{1, 8}, pad});
                 }),
                 "padding must be non-negative, got -2"));
  Conv dims = Conv1d(1, 1, 3);
  dims.dims = 4;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{1, 8}, dims});
                 }),
                 "dims must be 1, 2 or 3, got 4"));
  const std::string body = invalid_argument_text([&] {
    BasicSequential<double>({Input{1, 8, 8}, Residual{Relu{}, stride0}});
  });
  CHECK(contains(body, "layer 0: Residual: body layer 1: Conv: stride must be positive"));
  Linear lin(3, 2);
  lin.out_features = 0;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{3}, lin});
                 }),
                 "Linear: in_features and out_features must be positive, got 3 -> 0"));
  Pool pool = MaxPool2d(2);
  pool.stride = 0;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{1, 4, 4}, pool});
                 }),
                 "Pool: stride must be positive, got 0"));
  Dropout drop(0.1f);
  drop.p = 1.5f;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{3}, drop});
                 }),
                 "drop probability p = 1.5 outside [0, 1)"));
  LayerNorm norm(3);
  norm.eps = 0;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{3}, norm});
                 }),
                 "eps must be positive"));
  Upsample up = Upsample1d(2);
  up.scale = 0;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({Input{1, 3}, up});
                 }),
                 "scale must be positive, got 0"));
  Input in{1, 4};
  in.shape[1] = 0;
  CHECK(contains(invalid_argument_text([&] {
                   BasicSequential<double>({in, Relu{}});
                 }),
                 "entry 0: Input: shape's axes must be positive, got [1, 0]"));
  // A description fixed after its check builds.
  stride0.stride = 2;
  BasicSequential<double> fixed({Input{1, 8, 8}, stride0});
  CHECK(fixed.output_shape() == Shape{1, 3, 3});
}

}  // namespace dtrain_test_model_layers_test

// The direct convolution kernel (ConvLowering::direct, <dtrain/kernels/host/conv_direct.hpp>):
// forward, input, weight and bias gradients in float against float64 loops written here, on odd
// shapes (widths 1 to 130, channel counts that no tile divides, kernels 1, 3, 5, zero and periodic
// padding, 1-, 2- and 3-D), and in float64 against central finite differences; once per
// instruction set this CPU runs (the test output says which ran and which the CPU lacks). Then
// the automatic choice (the same on every rank) and the errors of an impossible request.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "support/messages.hpp"

#include <dtrain/core/rng.hpp>
#include <dtrain/model/model.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_model_conv_direct_test {

using namespace dtrain;
using host::ConvIsa;

namespace {

std::vector<double> random_vec(std::size_t n, std::uint64_t seed) {
  RngStream rng(seed, 11);
  std::vector<double> v(n);
  for (auto& x : v) x = 2 * rng.uniform_double() - 1;
  return v;
}

// The instruction sets this CPU runs, each announced (and the missing ones too) once per process.
std::vector<ConvIsa> isas_to_test() {
  static bool said = false;
  std::vector<ConvIsa> run;
  for (ConvIsa isa : {ConvIsa::portable, ConvIsa::avx2, ConvIsa::avx512}) {
    const bool ok = host::conv_isa_supported(isa);
    if (ok) run.push_back(isa);
    // (A std::string: doctest would print a const char* as a pointer.)
    const std::string line =
        std::string("direct convolution, ") + host::conv_isa_name(isa) +
        " version: " + (ok ? "tested" : "not tested, this CPU or build lacks it");
    if (!said) MESSAGE(line);
  }
  said = true;
  return run;
}

// Forces one instruction set for the layers built in its scope.
struct ForcedIsa {
  ConvIsa previous;
  explicit ForcedIsa(ConvIsa isa) : previous(host::force_conv_isa(isa)) {}
  ~ForcedIsa() { host::force_conv_isa(previous); }
};

// Input coordinate read by output coordinate o at kernel offset k on axis a (stride and dilation
// 1), or -1 in zero padding.
std::int64_t source(const ConvGeometry& g, int a, std::int64_t o, std::int64_t k) {
  std::int64_t i = o + k - g.pad[a];
  if (g.periodic) return ((i % g.in[a]) + g.in[a]) % g.in[a];
  return i >= 0 && i < g.in[a] ? i : -1;
}

// Forward and the three gradients of one sample in float64, by the definition: every (output
// cell, input channel, kernel cell) product once.
struct Reference {
  std::vector<double> y, dx, dw, db;
};
Reference reference(const ConvGeometry& g, const double* x, const double* w, const double* b,
                    const double* dy) {
  const std::int64_t cin = g.in_channels, cout = g.out_channels, cells = g.kernel_cells();
  Reference r;
  r.y.assign(static_cast<std::size_t>(cout * g.out_cells()), 0.0);
  r.dx.assign(static_cast<std::size_t>(cin * g.in_cells()), 0.0);
  r.dw.assign(static_cast<std::size_t>(cout * cin * cells), 0.0);
  r.db.assign(static_cast<std::size_t>(cout), 0.0);
  for (std::int64_t co = 0; co < cout; ++co)
    for (std::int64_t od = 0; od < g.out[0]; ++od)
      for (std::int64_t oh = 0; oh < g.out[1]; ++oh)
        for (std::int64_t ow = 0; ow < g.out[2]; ++ow) {
          const std::int64_t o = ((co * g.out[0] + od) * g.out[1] + oh) * g.out[2] + ow;
          double sum = b[co];
          r.db[co] += dy[o];
          for (std::int64_t ci = 0; ci < cin; ++ci)
            for (std::int64_t k = 0; k < cells; ++k) {
              const std::int64_t kw = k % g.kernel[2], kh = (k / g.kernel[2]) % g.kernel[1],
                                 kd = k / (g.kernel[2] * g.kernel[1]);
              const std::int64_t id = source(g, 0, od, kd), ih = source(g, 1, oh, kh),
                                 iw = source(g, 2, ow, kw);
              if (id < 0 || ih < 0 || iw < 0) continue;
              const std::int64_t i = ((ci * g.in[0] + id) * g.in[1] + ih) * g.in[2] + iw;
              const std::int64_t wi = (co * cin + ci) * cells + k;
              sum += w[wi] * x[i];
              r.dw[wi] += dy[o] * x[i];
              r.dx[i] += w[wi] * dy[o];
            }
          r.y[o] = sum;
        }
  return r;
}

// max |a - ref| / max |ref| over a float result and its float64 reference.
double relative_error(const float* a, const std::vector<double>& ref) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// Norm-wise relative error of the model's gradient (MSE loss) against central differences.
double gradient_error(const std::vector<LayerEntry<double, HostExec>>& layers, std::uint64_t seed) {
  BasicSequential<double> m(layers);
  m.init(seed);
  const std::int64_t batch = 2;
  const auto x = random_vec(static_cast<std::size_t>(batch * m.in_features()), seed + 1);
  const auto t = random_vec(static_cast<std::size_t>(batch * m.out_features()), seed + 2);
  const GradientCheck gc = check_gradients(m, x.data(), t.data(), batch, Loss::mse);
  REQUIRE(gc.checked == m.parameter_count());
  return gc.relative_error;
}

}  // namespace

TEST_CASE("direct convolution: forward and gradients equal float64 loops, every instruction set") {
  struct Case {
    Conv conv;
    Shape in;
  };
  const std::vector<Case> cases = {
      {Conv2d(3, 5, 3).with_padding(1), {3, 9, 65}},
      {Conv2d(7, 33, 3).with_padding(1, Padding::periodic), {7, 6, 63}},
      {Conv2d(5, 7, 5).with_padding(2), {5, 7, 130}},
      {Conv2d(1, 7, 5).with_padding(2, Padding::periodic), {1, 5, 5}},
      {Conv2d(33, 1, 1), {33, 4, 5}},
      {Conv2d(2, 3, 3).with_padding(1), {2, 4, 1}},
      {Conv2d(2, 3, 3).with_padding(1, Padding::periodic), {2, 5, 1}},
      {Conv2d(4, 6, 3), {4, 7, 9}},
      {Conv2d(2, 2, 3).with_padding(3, Padding::periodic), {2, 5, 4}},
      {Conv2d(2, 2, 3).with_padding(3), {2, 4, 5}},
      {Conv1d(5, 7, 3).with_padding(1), {5, 130}},
      {Conv1d(1, 5, 5).with_padding(2, Padding::periodic), {1, 63}},
      {Conv1d(7, 1, 1), {7, 1}},
      {Conv1d(3, 4, 3).with_padding(1, Padding::periodic), {3, 5}},
      {Conv3d(2, 5, 3).with_padding(1), {2, 4, 5, 6}},
      {Conv3d(3, 2, 3).with_padding(1, Padding::periodic), {3, 3, 4, 65}},
      {Conv3d(1, 3, 5).with_padding(2), {1, 5, 3, 5}},
      // The models' channel counts: forward blocks 6 + 6 + 4 and 6 + 2, weight-gradient blocks
      // 3 + 3 + 3 + 3 + 2 + 2 and 3 + 3 + 2, one output channel; a last pixel tile of half width.
      {Conv2d(1, 16, 3).with_padding(1), {1, 6, 7}},
      {Conv2d(16, 8, 3).with_padding(1), {16, 4, 6}},
      {Conv2d(8, 1, 3).with_padding(1, Padding::periodic), {8, 7, 9}},
  };
  const std::int64_t batch = 2;
  for (ConvIsa isa : isas_to_test()) {
    ForcedIsa forced(isa);
    for (const Case& c : cases) {
      const std::string mode = c.conv.padding_mode == Padding::periodic ? " periodic" : "";
      INFO(std::string(host::conv_isa_name(isa))
           << " " << c.conv.dims << "-D kernel " << c.conv.kernel << " pad " << c.conv.padding
           << mode << " input " << shape_string(c.in) << " -> " << c.conv.out_channels
           << " channels");
      Conv spec = c.conv;
      ConvLayer<float, HostExec> layer(spec.with_lowering(ConvLowering::direct));
      layer.setup(c.in);
      REQUIRE(layer.lowering() == ConvLowering::direct);
      REQUIRE(layer.direct_isa() == isa);
      const ConvGeometry& g = layer.geometry();
      const std::size_t np = layer.param_count(),
                        nin = static_cast<std::size_t>(layer.input_size()),
                        nout = static_cast<std::size_t>(layer.output_size());
      const auto p64 = random_vec(np, 3), x64 = random_vec(batch * nin, 4),
                 dy64 = random_vec(batch * nout, 5);
      std::vector<float> p(p64.begin(), p64.end()), x(x64.begin(), x64.end()),
          dy(dy64.begin(), dy64.end()), grads(np, 0.0f), y(batch * nout), dx(batch * nin);
      HostExec exec;
      layer.bind(exec, p.data(), grads.data());
      layer.reserve(batch);
      const PassContext ctx;
      layer.forward(HostStream{}, x.data(), y.data(), batch, ctx);
      layer.backward(HostStream{}, x.data(), y.data(), dy.data(), dx.data(), batch, ctx);
      // The layer's float parameters and data, widened: the reference sees what the layer saw.
      const std::vector<double> pw(p.begin(), p.end()), xw(x.begin(), x.end()),
          dyw(dy.begin(), dy.end());
      const std::size_t nw = np - static_cast<std::size_t>(g.out_channels);
      std::vector<double> dw(nw, 0.0), db(static_cast<std::size_t>(g.out_channels), 0.0);
      for (std::int64_t r = 0; r < batch; ++r) {
        const Reference ref =
            reference(g, xw.data() + r * nin, pw.data(), pw.data() + nw, dyw.data() + r * nout);
        CHECK(relative_error(y.data() + r * nout, ref.y) < 1e-5);
        CHECK(relative_error(dx.data() + r * nin, ref.dx) < 1e-5);
        for (std::size_t i = 0; i < nw; ++i) dw[i] += ref.dw[i];
        for (std::size_t i = 0; i < db.size(); ++i) db[i] += ref.db[i];
      }
      CHECK(relative_error(grads.data(), dw) < 1e-5);
      CHECK(relative_error(grads.data() + nw, db) < 1e-5);
    }
  }
}

TEST_CASE("direct convolution: float64 gradients match finite differences, every instruction set") {
  using L = ConvLowering;
  for (ConvIsa isa : isas_to_test()) {
    ForcedIsa forced(isa);
    INFO(std::string(host::conv_isa_name(isa)));
    // A convolution before the one under test turns its input gradient into parameter gradients.
    CHECK(
        gradient_error({Input{2, 5, 7},
                        Conv2d(2, 3, 3).with_padding(1, Padding::periodic).with_lowering(L::direct),
                        Tanh{}, Conv2d(3, 2, 5).with_padding(2).with_lowering(L::direct)},
                       21) < 1e-6);
    CHECK(gradient_error({Input{1, 9}, Conv1d(1, 3, 3).with_padding(1).with_lowering(L::direct),
                          Tanh{}, Conv1d(3, 2, 1).with_lowering(L::direct)},
                         22) < 1e-6);
    CHECK(gradient_error(
              {Input{1, 3, 4, 5}, Conv3d(1, 2, 3).with_padding(1).with_lowering(L::direct), Tanh{},
               Conv3d(2, 1, 3).with_padding(1, Padding::periodic).with_lowering(L::direct)},
              23) < 1e-6);
  }
}

TEST_CASE("direct convolution: the automatic choice and impossible requests") {
  for (ConvIsa isa : isas_to_test()) {
    ForcedIsa forced(isa);
    INFO(std::string(host::conv_isa_name(isa)));
    auto lowering_of = [](Conv conv, Shape in, auto zero) {
      ConvLayer<decltype(zero), HostExec> layer(conv);
      layer.setup(in);
      return layer.lowering();
    };
    // float, stride 1, dilation 1, more than one kernel cell, AVX2 or AVX-512: direct.
    const ConvLowering fast =
        isa == ConvIsa::portable ? ConvLowering::im2col : ConvLowering::direct;
    CHECK(lowering_of(Conv2d(2, 4, 3).with_padding(1), {2, 8, 8}, 0.0f) == fast);
    CHECK(lowering_of(Conv1d(2, 4, 5).with_padding(2, Padding::periodic), {2, 8}, 0.0f) ==
          (fast == ConvLowering::direct ? fast : ConvLowering::shifted));
    CHECK(lowering_of(Conv2d(2, 4, 3).with_padding(1), {2, 8, 8}, 0.0) == ConvLowering::im2col);
    CHECK(lowering_of(Conv2d(2, 4, 1), {2, 8, 8}, 0.0f) == ConvLowering::im2col);
    CHECK(lowering_of(Conv2d(2, 4, 3).with_stride(2), {2, 8, 8}, 0.0f) == ConvLowering::im2col);
    CHECK(lowering_of(Conv2d(2, 4, 3).with_dilation(2), {2, 8, 8}, 0.0f) == ConvLowering::im2col);
  }
  CHECK_THROWS_AS(BasicSequential<float>({Input{1, 8}, Conv1d(1, 1, 3).with_stride(2).with_lowering(
                                                           ConvLowering::direct)}),
                  InvalidArgument);
  const std::string text = test::invalid_argument_text([] {
    BasicSequential<float>(
        {Input{1, 8, 8}, Conv2d(1, 1, 3).with_dilation(2).with_lowering(ConvLowering::direct)});
  });
  CHECK(text.find("dilation 2") != std::string::npos);
  for (ConvIsa isa : {ConvIsa::avx2, ConvIsa::avx512})
    if (!host::conv_isa_supported(isa)) CHECK_THROWS_AS(host::force_conv_isa(isa), InvalidArgument);
}

TEST_CASE("direct convolution: the automatic choice is the same on every rank") {
  // A rule of shapes, scalar type and instruction set, with no timing in it: ranks that build the
  // same model choose alike (a choice that differed would give them different bits). Four ranks
  // as threads build the classifier and surrogate CNNs of benchmarks/model_bench.cpp at once.
  auto choices = [] {
    std::vector<std::string> out;
    BasicSequential<float> cnn({Input{1, 28, 28}, Conv2d(1, 16, 3).with_padding(1), Relu{},
                                MaxPool2d(2), Conv2d(16, 32, 3).with_padding(1), Relu{},
                                MaxPool2d(2), Linear(32 * 7 * 7, 10)});
    BasicSequential<float> surrogate({Input{1, 40, 64},
                                      Conv2d(1, 8, 3).with_padding(1, dtrain::Padding::periodic),
                                      Conv2d(8, 8, 3).with_padding(1, dtrain::Padding::periodic),
                                      Conv2d(8, 1, 3).with_padding(1, dtrain::Padding::periodic)});
    for (const auto* m : {&cnn, &surrogate})
      for (std::size_t i = 0; i < m->layer_count(); ++i)
        if (const auto* c = dynamic_cast<const ConvLayer<float, HostExec>*>(&m->layer(i)))
          out.push_back(std::to_string(static_cast<int>(c->lowering())) + "/" +
                        host::conv_isa_name(c->direct_isa()));
    return out;
  };
  std::vector<std::vector<std::string>> seen(4);
  std::vector<std::thread> ranks;
  for (std::size_t r = 0; r < seen.size(); ++r) ranks.emplace_back([&, r] { seen[r] = choices(); });
  for (auto& t : ranks) t.join();
  REQUIRE(seen[0].size() == 5);
  for (const auto& s : seen) CHECK(s == seen[0]);
  // And the rule's answer: the direct kernel in the CPU's widest version where it has one.
  const ConvIsa isa = host::conv_isa();
  const std::string want =
      isa == ConvIsa::portable
          ? ""
          : std::to_string(static_cast<int>(ConvLowering::direct)) + "/" + host::conv_isa_name(isa);
  if (!want.empty())
    for (const auto& c : seen[0]) CHECK(c == want);
}

}  // namespace dtrain_test_model_conv_direct_test

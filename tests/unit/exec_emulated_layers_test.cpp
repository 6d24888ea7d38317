// Grid layers on the emulated device: with its host kernels (EmulatedDevice, HostExec's own, so
// equal bits check the generic code's copies and waits around them, not device arithmetic) a
// convolutional model gives HostExec's bits; through the functors a GPU runs (EmulatedGpu) its
// gradients match float64 finite differences, with device memory the host never touches.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/emulated_device.hpp"

#include <dtrain/core/rng.hpp>
#include <dtrain/exec/host_exec.hpp>
#include <dtrain/model/layers/conv.hpp>
#include <dtrain/model/layers/pool.hpp>
#include <dtrain/model/model.hpp>

// The file's own namespace: test files are compiled together in unity batches.
namespace dtrain_test_exec_emulated_layers_test {

using namespace dtrain;
using test::bytes_of;
using test::EmulatedDevice;
using test::EmulatedGpu;

namespace {

template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  RngStream rng(seed, 7);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(lo + (hi - lo) * rng.uniform_double());
  return v;
}

// A small surrogate-shaped model: every grid layer kind, periodic and zero padding, a skip.
template <class T, class Exec>
std::vector<LayerEntry<T, Exec>> cnn() {
  return {Input{2, 6, 6}, Conv2d(2, 3, 3).with_padding(1, Padding::periodic),
          Tanh{},         Residual{Conv2d(3, 3, 3).with_padding(1), Gelu{}, Conv2d(3, 3, 1)},
          MaxPool2d(2),   Conv2d(3, 2, 3).with_padding(1).with_stride(2),
          Upsample2d(2),  AvgPool2d(2, 1),
          Conv2d(2, 1, 1)};
}

// One grid layer run twice on the same data: through the GPU's functors on the emulated device
// and through HostExec. Records the device launches of each pass. The device outlives the layer.
struct LayerRun {
  std::vector<double> y, dx, grads;
  std::uint64_t forward_launches = 0, backward_launches = 0, backward_no_dx_launches = 0;
};

template <class DeviceLayer, class HostLayer>
void run_both(EmulatedGpu& dev, DeviceLayer& dl, HostLayer& hl, const Shape& in, std::int64_t rows,
              LayerRun& dev_run, LayerRun& host_run) {
  HostExec exec;
  dl.setup(in);
  hl.setup(in);
  const std::size_t np = dl.param_count(), nx = static_cast<std::size_t>(rows * dl.input_size()),
                    ny = static_cast<std::size_t>(rows * dl.output_size());
  const auto params = random_vec<double>(np, 11, -0.5, 0.5);
  const auto x = random_vec<double>(nx, 12), dy = random_vec<double>(ny, 13);
  Allocator& a = dev.allocator();
  auto tensor = [&](std::size_t n) {
    return Tensor({static_cast<std::int64_t>(n) + 1}, DType::f64, a);
  };
  Tensor param_t = tensor(np), grad_t = tensor(np), x_t = tensor(nx), y_t = tensor(ny),
         dy_t = tensor(ny), dx_t = tensor(nx);
  auto* p = static_cast<double*>(param_t.raw());
  auto* g = static_cast<double*>(grad_t.raw());
  const auto* xd = static_cast<const double*>(x_t.raw());
  auto* yd = static_cast<double*>(y_t.raw());
  const auto* dyd = static_cast<const double*>(dy_t.raw());
  auto* dxd = static_cast<double*>(dx_t.raw());
  const auto s = dev.compute_stream();
  if (np) dev.copy_h2d(s, p, params.data(), np * sizeof(double));
  if (np) dev.fill(s, g, np, 0.0);
  dev.copy_h2d(s, x_t.raw(), x.data(), nx * sizeof(double));
  dev.copy_h2d(s, dy_t.raw(), dy.data(), ny * sizeof(double));
  dl.bind(dev, np ? p : nullptr, np ? g : nullptr);
  dl.reserve(rows);
  const PassContext ctx;
  auto launches = [&](auto&& f) {
    const std::uint64_t before = dev.kernels_launched();
    f();
    return dev.kernels_launched() - before;
  };
  dev_run.forward_launches = launches([&] { dl.forward(s, xd, yd, rows, ctx); });
  dev_run.backward_launches = launches([&] { dl.backward(s, xd, yd, dyd, dxd, rows, ctx); });
  dev_run.y.resize(ny);
  dev_run.dx.resize(nx);
  dev_run.grads.resize(np);
  dev.copy_d2h(s, dev_run.y.data(), yd, ny * sizeof(double));
  dev.copy_d2h(s, dev_run.dx.data(), dxd, nx * sizeof(double));
  if (np) dev.copy_d2h(s, dev_run.grads.data(), g, np * sizeof(double));
  exec_synchronize(dev, s, 60, "test download");
  dev_run.backward_no_dx_launches =
      launches([&] { dl.backward(s, xd, yd, dyd, nullptr, rows, ctx); });
  exec_synchronize(dev, s, 60, "test");

  std::vector<double> hp = params, hg(np, 0.0);
  hl.bind(exec, np ? hp.data() : nullptr, np ? hg.data() : nullptr);
  hl.reserve(rows);
  host_run.y.resize(ny);
  host_run.dx.resize(nx);
  hl.forward(HostStream{}, x.data(), host_run.y.data(), rows, ctx);
  hl.backward(HostStream{}, x.data(), host_run.y.data(), dy.data(), host_run.dx.data(), rows, ctx);
  host_run.grads = hg;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_SUITE("emulated_launches") {
  TEST_CASE("a device convolution lowers whole batches: launches per layer, not per sample") {
    // 3 launches forward (im2col, GEMM, bias), 6 backward (im2col, dy, dW, db, dcol, col2im), 4
    // without dx, whatever the batch; a workspace of 4 samples splits 10 rows into 3 chunks.
    struct Case {
      Conv conv;
      Shape in;
    };
    const Case cases[] = {
        {Conv2d(3, 4, 3).with_padding(1), {3, 8, 8}},
        {Conv3d(2, 3, 3).with_padding(1, dtrain::Padding::periodic).with_stride(2), {2, 5, 4, 6}},
        {Conv1d(2, 2, 2).with_dilation(2).with_padding(1), {2, 9}}};
    for (const auto& c : cases) {
      for (std::int64_t rows : {1, 16}) {
        INFO(shape_string(c.in) << " rows " << rows);
        EmulatedGpu dev;
        ConvLayer<double, EmulatedGpu> dl(c.conv);
        ConvLayer<double, HostExec> hl(Conv(c.conv).with_lowering(ConvLowering::im2col));
        LayerRun d, h;
        run_both(dev, dl, hl, c.in, rows, d, h);
        CHECK(dl.lowering() == ConvLowering::im2col);
        CHECK(dl.device_chunk() == rows);
        CHECK(d.forward_launches == 3);
        CHECK(d.backward_launches == 6);
        CHECK(d.backward_no_dx_launches == 4);
        // Pinned to the host lowering, up to the order of the GEMMs' and col2im's sums.
        CHECK(max_diff(d.y, h.y) < 1e-12);
        CHECK(max_diff(d.dx, h.dx) < 1e-12);
        CHECK(max_diff(d.grads, h.grads) < 1e-11);
      }
      const ConvGeometry probe = [&] {
        ConvLayer<double, HostExec> l(c.conv);
        l.setup(c.in);
        return l.geometry();
      }();
      const std::size_t per_sample = static_cast<std::size_t>(
          (probe.lowered_rows() + probe.out_channels + 1) * probe.out_cells() * 8);
      EmulatedGpu dev;
      ConvLayer<double, EmulatedGpu> dl(Conv(c.conv).with_device_workspace(4 * per_sample + 7));
      ConvLayer<double, HostExec> hl(Conv(c.conv).with_lowering(ConvLowering::im2col));
      LayerRun d, h;
      run_both(dev, dl, hl, c.in, 10, d, h);
      CHECK(dl.device_chunk() == 4);
      CHECK(d.forward_launches == 3 * 3);
      CHECK(d.backward_launches == 3 * 6);
      CHECK(max_diff(d.y, h.y) < 1e-12);
      CHECK(max_diff(d.dx, h.dx) < 1e-12);
      CHECK(max_diff(d.grads, h.grads) < 1e-11);
    }
  }

  TEST_CASE("device pooling and upsampling: one launch per pass for the whole batch") {
    for (std::int64_t rows : {1, 16}) {
      EmulatedGpu dev;
      PoolLayer<double, EmulatedGpu> dmax(MaxPool2d(2)), davg(AvgPool2d(3, 2));
      PoolLayer<double, HostExec> hmax(MaxPool2d(2)), havg(AvgPool2d(3, 2));
      UpsampleLayer<double, EmulatedGpu> dup(Upsample2d(2));
      UpsampleLayer<double, HostExec> hup(Upsample2d(2));
      LayerRun d, h;
      run_both(dev, dmax, hmax, {3, 6, 8}, rows, d, h);
      CHECK((d.forward_launches == 1 && d.backward_launches == 1 && d.y == h.y && d.dx == h.dx));
      run_both(dev, davg, havg, {2, 7, 7}, rows, d, h);
      CHECK((d.forward_launches == 1 && d.backward_launches == 1 && d.y == h.y && d.dx == h.dx));
      run_both(dev, dup, hup, {2, 3, 4}, rows, d, h);
      CHECK((d.forward_launches == 1 && d.backward_launches == 1 && d.y == h.y && d.dx == h.dx));
    }
  }
}

TEST_SUITE("emulated_model") {
  TEST_CASE(
      "a convolutional model through device memory keeps HostExec's bits (the same kernels)") {
    EmulatedDevice dev;
    BasicSequential<float> host(cnn<float, HostExec>());
    BasicSequential<float, EmulatedDevice> model(cnn<float, EmulatedDevice>(), dev);
    host.init(4);
    model.init(4);
    const std::int64_t rows = 5;
    const auto x = random_vec<float>(static_cast<std::size_t>(rows * host.in_features()), 1);
    const auto t = random_vec<float>(static_cast<std::size_t>(rows * host.out_features()), 2);
    const double lh = host.forward_backward(x.data(), t.data(), rows, Loss::mse);
    const double ld = model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
    CHECK(lh == ld);
    CHECK(bytes_of(dev, model.gradients()) == bytes_of(host.gradients()));
  }

  TEST_CASE("through the GPU's functors, grid-layer gradients match float64 finite differences") {
    EmulatedGpu dev;
    BasicSequential<double, EmulatedGpu> model(cnn<double, EmulatedGpu>(), dev);
    BasicSequential<double> host(cnn<double, HostExec>());
    model.init(9);
    host.init(9);
    const std::int64_t rows = 2;
    const auto x = random_vec<double>(static_cast<std::size_t>(rows * model.in_features()), 3);
    const auto t = random_vec<double>(static_cast<std::size_t>(rows * model.out_features()), 4);
    auto params = random_vec<double>(model.parameter_count(), 5, -0.5, 0.5);
    auto upload = [&] {
      dev.copy_h2d(dev.compute_stream(), model.parameters().data, params.data(),
                   params.size() * sizeof(double));
    };
    upload();
    model.zero_grad();
    model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
    std::vector<double> g(params.size());
    dev.copy_d2h(dev.compute_stream(), g.data(), model.gradients().data, g.size() * sizeof(double));
    exec_synchronize(dev, dev.compute_stream(), 60, "test");
    // The same gradients as the host lowering, up to the order of col2im's sums.
    std::memcpy(host.parameter_span().data(), params.data(), params.size() * sizeof(double));
    host.zero_grad();
    host.forward_backward(x.data(), t.data(), rows, Loss::mse);
    double diff = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
      diff = std::max(diff, std::abs(g[i] - host.gradient_span()[i]));
    CHECK(diff < 1e-12);
    // Central differences through the device path, on every 3rd parameter (all kinds covered).
    double num = 0, den = 0;
    const double h = 1e-5;
    for (std::size_t i = 0; i < params.size(); i += 3) {
      const double keep = params[i];
      params[i] = keep + h;
      upload();
      const double lp = model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
      params[i] = keep - h;
      upload();
      const double lm = model.forward_backward(x.data(), t.data(), rows, Loss::mse).get();
      params[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      num += (g[i] - fd) * (g[i] - fd);
      den += fd * fd;
    }
    REQUIRE(den > 0);
    CHECK(std::sqrt(num / den) < 1e-6);
  }
}

}  // namespace dtrain_test_exec_emulated_layers_test
